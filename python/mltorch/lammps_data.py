"""Reference data from LAMMPS: run an input with a classical potential, read
back positions, forces, energies and virials of every sampled frame."""

import os
import subprocess
from dataclasses import dataclass

import numpy as np

NKTV2P = {"metal": 1.6021765e6}   # pressure * volume -> energy, LAMMPS's force->nktv2p


@dataclass
class Frame:
    step: int
    pos: np.ndarray      # [n, 3]
    cell: np.ndarray     # [3, 3] rows a, b, c
    types: np.ndarray    # [n] LAMMPS types (1-based)
    energy: float        # eV
    forces: np.ndarray   # [n, 3] eV/A
    virial: np.ndarray   # [3, 3] eV (W = sum r f, symmetric)
    tag: str = ""


SAMPLE = """
compute         vir all pressure NULL virial
dump            frames all custom {every} frames.dump id type x y z fx fy fz
dump_modify     frames sort id format float %.12g
fix             energies all print {every} "$(step) $(pe:%.14g) $(c_vir[1]:%.14g) $(c_vir[2]:%.14g) \
$(c_vir[3]:%.14g) $(c_vir[4]:%.14g) $(c_vir[5]:%.14g) $(c_vir[6]:%.14g) $(vol:%.14g)" \
file energies.txt screen no
"""


def run(lmp, script, workdir, every):
    """Run `script` (which must contain {sample} where sampling starts) in workdir."""
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "in.data"), "w") as f:
        f.write(script.replace("{sample}", SAMPLE.format(every=every)))
    subprocess.run([os.path.abspath(lmp), "-in", "in.data", "-log", "log.data", "-screen", "none", "-nocite"],
                   cwd=workdir, check=True)
    return read(workdir)


def read(workdir, units="metal"):
    energies = {}
    with open(os.path.join(workdir, "energies.txt")) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            v = line.split()
            # after change_box a step is printed again for the new box, but the
            # dump holds the frame from before the change: keep the first line
            energies.setdefault(int(v[0]), [float(x) for x in v[1:]])
    frames = []
    seen = set()
    with open(os.path.join(workdir, "frames.dump")) as f:
        lines = f.read().splitlines()
    i = 0
    while i < len(lines):
        assert lines[i].startswith("ITEM: TIMESTEP")
        step = int(lines[i + 1])
        n = int(lines[i + 3])
        b = [list(map(float, lines[i + 5 + k].split())) for k in range(3)]
        xy, xz, yz = (b[0][2], b[1][2], b[2][2]) if len(b[0]) == 3 else (0.0, 0.0, 0.0)
        xlo = b[0][0] - min(0.0, xy, xz, xy + xz)
        xhi = b[0][1] - max(0.0, xy, xz, xy + xz)
        ylo = b[1][0] - min(0.0, yz)
        yhi = b[1][1] - max(0.0, yz)
        cell = np.array([[xhi - xlo, 0, 0], [xy, yhi - ylo, 0], [xz, yz, b[2][1] - b[2][0]]])
        data = np.array([list(map(float, l.split())) for l in lines[i + 9: i + 9 + n]])
        i += 9 + n
        if step not in energies or step in seen:
            continue
        seen.add(step)
        e = energies[step]
        p = e[1:7]   # pxx pyy pzz pxy pxz pyz (virial only)
        vol = e[7]
        w = np.array([[p[0], p[3], p[4]], [p[3], p[1], p[5]], [p[4], p[5], p[2]]]) * vol / NKTV2P[units]
        frames.append(Frame(step=step, pos=data[:, 2:5], cell=cell, types=data[:, 1].astype(int),
                            energy=e[0], forces=data[:, 5:8], virial=w))
    return frames
