#!/usr/bin/env python3
"""Write a Quantum ESPRESSO (pw.x) input from a LAMMPS data file, atoms in
atom-ID order, so that pw.x as an i-PI client of fix torch/finetune
(`teacher ipi`) describes the run's atoms in the order the server sends
them (doc/dft_teacher.md).

    tools/qe_input.py system.data --elements Si [-o pw.in] [--pseudo Si=Si.pbe-rrkj.UPF]
    pw.x --ipi NAME:UNIX -in pw.in          # the client of teacher ipi "NAME 0 unix"
    pw.x -in pw.in                          # the same configuration on its own

--elements gives the element of each LAMMPS atom type (1, 2, ...). The same
input serves both runs: pw.x is a client when it is started with --ipi.
The cell is the box (ibrav = 0, CELL_PARAMETERS in Angstrom, the rows a, b,
c of LAMMPS's box), the positions relative to the box's lower corner, as
the server sends them; tprnfor and tstress make pw.x compute forces and
stress (the virial the server receives). Pseudopotentials default to the
ones Debian's quantum-espresso-data ships in /usr/share/espresso/pseudo
(--pseudo-dir; --pseudo EL=FILE for each element it lacks a default for).
Settings: --ecutwfc (Ry), --kpoints N N N (Monkhorst-Pack, unshifted),
--degauss (Ry, Marzari-Vanderbilt smearing; 0 for fixed occupations),
--conv-thr (Ry). --outdir names pw.x's scratch folder: give runs that share
a folder their own.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cp2k_input import read_data, write_output    # noqa: E402  (one reader of LAMMPS data files)

# pseudopotentials of Debian's quantum-espresso-data (PBE where it has one)
DEBIAN_PSEUDO = {"H": "H.pbe-kjpaw.UPF", "C": "C.pbe-rrkjus.UPF", "N": "N.pbe-kjpaw.UPF",
                 "O": "O.pbe-rrkjus.UPF", "Al": "Al.pz-vbc.UPF", "Si": "Si.pbe-rrkj.UPF",
                 "Ni": "Ni.pbe-nd-rrkjus.UPF", "Cu": "Cu.pbe-kjpaw.UPF", "Fe": "Fe.pbe-nd-rrkjus.UPF",
                 "Ge": "Ge.pbe-kjpaw.UPF"}
MASSES = {"H": 1.008, "C": 12.011, "N": 14.007, "O": 15.999, "Al": 26.982, "Si": 28.0855,
          "Fe": 55.845, "Ni": 58.693, "Cu": 63.546, "Ge": 72.630}


def qe_input(data, elements, pseudo, pseudo_dir, ecutwfc=20.0, kpoints=(2, 2, 2), degauss=0.01,
             conv_thr=1e-10, outdir="./qe-out"):
    lo, hi, (xy, xz, yz), atoms = read_data(data)
    lx, ly, lz = (hi[d] - lo[d] for d in range(3))
    kinds = sorted({elements[t - 1] for _, t, *_ in atoms})
    occupations = (f"  occupations = 'smearing', smearing = 'mv', degauss = {degauss}\n"
                   if degauss > 0 else "  occupations = 'fixed'\n")
    out = ["&CONTROL", "  calculation = 'scf'", "  tprnfor = .true.", "  tstress = .true.",
           f"  pseudo_dir = '{pseudo_dir}'", f"  outdir = '{outdir}'", "/",
           "&SYSTEM", f"  ibrav = 0, nat = {len(atoms)}, ntyp = {len(kinds)}, ecutwfc = {ecutwfc}",
           occupations.rstrip("\n"), "/", "&ELECTRONS", f"  conv_thr = {conv_thr}", "/",
           "ATOMIC_SPECIES"]
    for el in kinds:
        if el not in pseudo:
            sys.exit(f"qe_input.py: no pseudopotential for {el}: give --pseudo {el}=FILE")
        if el not in MASSES:
            sys.exit(f"qe_input.py: no mass known for {el}; add it to MASSES")
        out.append(f"{el} {MASSES[el]} {pseudo[el]}")
    out += ["CELL_PARAMETERS angstrom", f"{lx:.12f} 0.0 0.0", f"{xy:.12f} {ly:.12f} 0.0",
            f"{xz:.12f} {yz:.12f} {lz:.12f}", "ATOMIC_POSITIONS angstrom"]
    for _, t, x, y, z in atoms:
        out.append(f"{elements[t - 1]} {x - lo[0]:.12f} {y - lo[1]:.12f} {z - lo[2]:.12f}")
    out += ["K_POINTS automatic", " ".join(str(k) for k in kpoints) + " 0 0 0"]
    return "\n".join(out) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("data")
    p.add_argument("--elements", nargs="+", required=True)
    p.add_argument("--pseudo", nargs="*", default=[], help="EL=FILE (in --pseudo-dir)")
    p.add_argument("--pseudo-dir", default="/usr/share/espresso/pseudo")
    p.add_argument("--ecutwfc", type=float, default=20.0)
    p.add_argument("--kpoints", type=int, nargs=3, default=[2, 2, 2])
    p.add_argument("--degauss", type=float, default=0.01)
    p.add_argument("--conv-thr", type=float, default=1e-10)
    p.add_argument("--outdir", default="./qe-out")
    p.add_argument("-o", "--output", default="-")
    a = p.parse_args()
    pseudo = dict(DEBIAN_PSEUDO)
    for kv in a.pseudo:
        el, _, f = kv.partition("=")
        if not f:
            sys.exit(f"qe_input.py: --pseudo takes EL=FILE, got {kv}")
        pseudo[el] = f
    write_output(qe_input(a.data, a.elements, pseudo, a.pseudo_dir, a.ecutwfc, a.kpoints,
                          a.degauss, a.conv_thr, a.outdir), a.output)


if __name__ == "__main__":
    main()
