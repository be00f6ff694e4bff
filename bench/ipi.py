#!/usr/bin/env python3
"""Benchmarks of fix torch/finetune `teacher ipi` (bench/RESULTS.md, "i-PI teacher").

  .venv/bin/python bench/ipi.py [--part overhead|replicas|all] [--labels N]

overhead  the server side of a label (gather by atom ID, socket messages,
          checks, broadcast and scatter) against the client's own time, from
          the fix's end-of-run line, with LAMMPS's fix ipi (Stillinger-Weber)
          as the client at 64, 512 and 4096 atoms, and CP2K (8 Si atoms, PBE,
          SZV-MOLOPT, 120 Ry) as the client
replicas  labels per wall hour: 2 replicas (-partition 2x1) with 2 CP2K
          clients against 1 replica with 1, the same labels per replica, in
          turn (A B A B); the LAMMPS ranks wait for their clients without
          spinning, so the clients have the cores
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(here)
lmp = os.path.join(root, "build", "lmp")
python = os.path.join(root, ".venv", "bin", "python")
potentials = os.path.join(root, "build", "lammps-potentials")
student = os.path.join(root, "examples", "finetune", "si_student.pt")
env = dict(os.environ, OMP_NUM_THREADS="1", LAMMPS_POTENTIALS=potentials)


def server_input(n, name, labels, cp2k_data=None, replicas=False):
    """a fine-tuning run that labels every step, `labels` times"""
    lines = ["units metal", "atom_style atomic"]
    if replicas:
        lines += ["variable p world 0 1"]
    else:
        lines += ["variable p equal 0"]
    if cp2k_data:
        lines += [f"read_data {cp2k_data}"]
    else:
        lines += ["lattice diamond 5.431", f"region box block 0 {n} 0 {n} 0 {n}", "create_box 1 box",
                  "create_atoms 1 box", "mass 1 28.0855"]
    lines += ["velocity all create 900 ${p}4928 loop geom" if replicas else
              "velocity all create 900 4928 loop geom",
              "pair_style torch", f"pair_coeff * * {student} Si", "neighbor 1.0 bin",
              "fix md all nve",
              f'fix ft all torch/finetune 1 teacher ipi "{name} 0 unix" teacher_timeout 300 '
              "log 0 check 0 energy_shift none",
              "thermo 1000", f"run {labels}"]
    return "\n".join(lines) + "\n"


def wait_for(path, timeout=120):
    t0 = time.time()
    while not os.path.exists(path):
        if time.time() - t0 > timeout:
            raise RuntimeError(f"no socket {path}")
        time.sleep(0.05)


def lammps_client(work, name, n):
    inp = os.path.join(work, f"client.{name}.in")
    with open(inp, "w") as f:
        f.write("\n".join(["units metal", "atom_style atomic", "atom_modify map array",
                           "lattice diamond 5.431", f"region box block 0 {n} 0 {n} 0 {n}",
                           "create_box 1 box", "create_atoms 1 box", "mass 1 28.0855",
                           "pair_style sw", "pair_coeff * * Si.sw Si", "neighbor 1.0 bin",
                           "neigh_modify every 1 delay 0 check yes", "thermo 1000000",
                           f"fix c all ipi {name} 0 unix", "run 100000000"]) + "\n")
    return [lmp, "-log", "none", "-screen", "none", "-in", inp]


def cp2k_client(work, name, data):
    inp = os.path.join(work, f"cp2k.{name}.inp")
    subprocess.run([python, os.path.join(root, "tools", "cp2k_input.py"), data, "--elements", "Si",
                    "--driver", name, "--basis", "SZV-MOLOPT-SR-GTH", "--cutoff", "120",
                    "--rel-cutoff", "30", "--project", name, "-o", inp], check=True)
    return ["cp2k.psmp", "-i", inp, "-o", os.path.join(work, f"cp2k.{name}.out")]


def run_server(work, text, names, clients, np=1, partitions=False):
    """the server run and its clients (each started when its socket exists);
    returns (wall seconds, the server's log text)"""
    inp = os.path.join(work, "server.in")
    with open(inp, "w") as f:
        f.write(text)
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(np), lmp, "-in", inp,
           "-log", os.path.join(work, "log.server"), "-screen", "none"]
    if partitions:
        cmd[-4:-4] = ["-partition", f"{np}x1", "-plog", os.path.join(work, "log.server"),
                      "-pscreen", "none"]
    t0 = time.time()
    server = subprocess.Popen(cmd, cwd=work, env=env)
    procs = []
    for name, client in zip(names, clients):
        wait_for("/tmp/ipi_" + name)
        procs.append(subprocess.Popen(client, cwd=work, env=env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))
    rc = server.wait()
    wall = time.time() - t0
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
    if rc != 0:
        raise RuntimeError(f"server failed ({rc}), see {work}")
    logs = ""
    for fn in sorted(os.listdir(work)):
        if fn.startswith("log.server"):
            logs += open(os.path.join(work, fn)).read()
    return wall, logs


SUMMARY = re.compile(r"teacher ipi on (\S+): (\d+) labels, (\S+) s in the client, (\S+) s on the "
                     r"server side \(gather, socket, checks, scatter: (\S+)% of the client's time, "
                     r"(\S+) ms per label\)")


def write_si8(path, seed=1):
    import random
    a = 5.431
    base = [(0, 0, 0), (0, .5, .5), (.5, 0, .5), (.5, .5, 0), (.25, .25, .25), (.25, .75, .75),
            (.75, .25, .75), (.75, .75, .25)]
    random.seed(seed)
    lines = ["8 Si atoms", "", "8 atoms", "1 atom types", "", f"0 {a} xlo xhi", f"0 {a} ylo yhi",
             f"0 {a} zlo zhi", "", "Masses", "", "1 28.0855", "", "Atoms # atomic", ""]
    for i, (x, y, z) in enumerate(base):
        lines.append(f"{i + 1} 1 {x * a + random.uniform(-.1, .1)} {y * a + random.uniform(-.1, .1)} "
                     f"{z * a + random.uniform(-.1, .1)}")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def overhead(labels):
    rows = []
    for n in (2, 4, 8):
        work = tempfile.mkdtemp(prefix="mlt-ipi-")
        name = f"mltb{os.getpid()}o{n}"
        wall, log = run_server(work, server_input(n, name, labels), [name],
                               [lammps_client(work, name, n)])
        m = SUMMARY.search(log)
        rows.append((f"LAMMPS fix ipi + sw, {8 * n ** 3} atoms", m.group(2), float(m.group(3)),
                     float(m.group(4)), float(m.group(5)), float(m.group(6))))
        shutil.rmtree(work)
    work = tempfile.mkdtemp(prefix="mlt-ipi-")
    data = os.path.join(work, "si8.data")
    write_si8(data)
    name = f"mltb{os.getpid()}cp"
    wall, log = run_server(work, server_input(1, name, max(2, labels // 10), cp2k_data=data), [name],
                           [cp2k_client(work, name, data)])
    m = SUMMARY.search(log)
    rows.append(("CP2K (PBE, SZV, 120 Ry), 8 atoms", m.group(2), float(m.group(3)),
                 float(m.group(4)), float(m.group(5)), float(m.group(6))))
    shutil.rmtree(work)
    print("\n| client | labels | client s | server side s | server side / client | ms per label |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]:.4g} | {r[3]:.4g} | {r[4]:.3g}% | {r[5]:.3g} |")
    return rows


def replicas(labels, pairs):
    ratios = []
    for k in range(pairs):
        walls = {}
        for nrep in (1, 2):
            work = tempfile.mkdtemp(prefix="mlt-ipi-")
            data = os.path.join(work, "si8.data")
            write_si8(data)
            base = f"mltb{os.getpid()}r{k}{nrep}"
            if nrep == 1:
                names = [base]
                text = server_input(1, base, labels, cp2k_data=data)
            else:
                names = [base + "_0", base + "_1"]
                text = server_input(1, base, labels, cp2k_data=data, replicas=True)
            clients = [cp2k_client(work, nm, data) for nm in names]
            walls[nrep], _ = run_server(work, text, names, clients, np=nrep, partitions=nrep > 1)
            shutil.rmtree(work)
        # labels per wall hour: 2 replicas label 2 x labels in walls[2]
        ratio = (2 * labels / walls[2]) / (labels / walls[1])
        ratios.append(ratio)
        print(f"pair {k + 1}: 1 replica {walls[1]:.1f} s, 2 replicas {walls[2]:.1f} s for {labels} "
              f"labels each: {ratio:.2f}x labels per hour")
    ratios.sort()
    print(f"2 replicas / 1 replica, labels per wall hour: median {ratios[len(ratios) // 2]:.2f}x "
          f"(min {ratios[0]:.2f}, max {ratios[-1]:.2f}, {pairs} pairs)")
    return ratios


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--part", default="all", choices=["overhead", "replicas", "all"])
    p.add_argument("--labels", type=int, default=40)
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--replica-labels", type=int, default=4)
    a = p.parse_args()
    if shutil.which("cp2k.psmp") is None:
        sys.exit("bench/ipi.py needs CP2K (tools/setup.sh installs Debian's cp2k)")
    print(f"{time.strftime('%Y-%m-%d')}; {os.cpu_count()} cores; {a.labels} labels per LAMMPS-client run")
    if a.part in ("overhead", "all"):
        overhead(a.labels)
    if a.part in ("replicas", "all"):
        replicas(a.replica_labels, a.pairs)


if __name__ == "__main__":
    main()
