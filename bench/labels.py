#!/usr/bin/env python3
"""Benchmarks of the labels as data (bench/RESULTS.md, "Labels kept and reused").

  .venv/bin/python bench/labels.py [--part write|scaling|all] [--rounds R] [--smoke]

write    the cost of writing a label (fix torch/finetune labels: gather by
         atom ID, text, one write, fdatasync) per frame, from the fix's
         end-of-run line, against the teacher call it records: LAMMPS's
         own pair time of the teacher style on the same 512 atoms, for sw
         and for a torch teacher (the 2-layer si_mp2 model)
scaling  torch/train's configurations per second on 1 rank, 2 ranks and 2
         partitions (-partition 2x1), the same dataset and batch, in turn
         (A B C A B C ...), with the ratios of the medians
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(here)
lmp = os.path.join(root, "build", "lmp")
potentials = os.path.join(root, "build", "lammps-potentials")
student = os.path.join(root, "examples", "finetune", "si_student.pt")
si_mp2 = os.path.join(root, "potentials", "si_mp2.pt")
env = dict(os.environ, OMP_NUM_THREADS="1", LAMMPS_POTENTIALS=potentials)
mpirun = ["mpirun", "--allow-run-as-root", "--oversubscribe"]


def run(cmd, cwd, text):
    path = os.path.join(cwd, "in.bench")
    with open(path, "w") as f:
        f.write(text)
    t0 = time.perf_counter()
    out = subprocess.run(cmd + ["-in", path, "-log", "none", "-nocite"], cwd=cwd, env=env,
                         capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        sys.exit(f"bench/labels.py: {' '.join(cmd)} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return out.stdout, wall


def box(n):
    return (f"units metal\natom_modify map array\nlattice diamond 5.431\n"
            f"region box block 0 {n} 0 {n} 0 {n}\ncreate_box 1 box\ncreate_atoms 1 box\n"
            "mass 1 28.0855\nvelocity all create 900 4928 loop geom\n")


def teachers():
    sw = os.path.join(potentials, "Si.sw")
    return {"sw": ("sw", f"* * {sw} Si"), "torch si_mp2": ("torch", f"* * {si_mp2} Si")}


def part_write(rounds, labels, n):
    tmp = tempfile.mkdtemp()
    print(f"\n## writing a label ({8 * n ** 3} atoms, {labels} labels a run, {rounds} runs)\n")
    print("| teacher | teacher call ms (its pair time per call) | writing a frame ms | writing / teacher call |")
    print("| --- | --- | --- | --- |")
    for name, (style, coeff) in teachers().items():
        calls, writes = [], []
        for r in range(rounds):
            # the teacher's own cost: LAMMPS's pair time of that style alone
            out, _ = run([lmp], tmp, box(n) + f"pair_style {style}\npair_coeff {coeff}\n"
                         f"fix md all nve\nrun {labels}\n")
            m = re.search(r"Pair\s*\|\s*(\S+)", out)
            calls.append(1e3 * float(m.group(1)) / (labels + 1))
            labels_file = os.path.join(tmp, f"l{r}.xyz")
            out, _ = run([lmp], tmp, box(n) + f"pair_style torch\npair_coeff * * {student} Si\n"
                         "fix md all nve\n"
                         f'fix ft all torch/finetune 1 teacher {style} "{coeff}" lr 1e-4 log 0 '
                         f"check 0 labels {labels_file}\nrun {labels}\n")
            m = re.search(r"labels: \d+ frames written .* ([0-9.eE+-]+) ms per frame", out)
            writes.append(float(m.group(1)))
            os.remove(labels_file)
        c, w = statistics.median(calls), statistics.median(writes)
        print(f"| {name} | {c:.3f} (min {min(calls):.3f}) | {w:.3f} (min {min(writes):.3f}) | {100 * w / c:.1f}% |")


def dataset(tmp, frames):
    path = os.path.join(tmp, "set.xyz")
    sw = os.path.join(potentials, "Si.sw")
    run([lmp], tmp, box(2) + f"pair_style torch\npair_coeff * * {student} Si\nfix md all nve\n"
        f'fix ft all torch/finetune 1 teacher sw "* * {sw} Si" lr 1e-9 log 0 check 0 labels {path}\n'
        f"run {frames}\n")
    return path


def part_scaling(rounds, frames, epochs, batch):
    tmp = tempfile.mkdtemp()
    data = dataset(tmp, frames)
    text = (box(1) + f"pair_style torch\npair_coeff * * {student} Si\n"
            f"torch/train {data} epochs {epochs} batch {batch} lr 1e-3\n")
    kinds = {"1 rank": mpirun + ["-np", "1", lmp], "2 ranks": mpirun + ["-np", "2", lmp],
             "2 partitions": mpirun + ["-np", "2", lmp, "-partition", "2x1", "-pscreen", "screen.p"]}
    walls = {k: [] for k in kinds}
    for _ in range(rounds):
        for k, cmd in kinds.items():
            out, _ = run(cmd, tmp, text)
            if "-partition" in cmd:    # a partition's screen: its file
                with open(os.path.join(tmp, "screen.p.0")) as f:
                    out = f.read()
            # the command's own training time (no start-up, no dataset reading)
            m = re.search(r"configurations in ([0-9.]+) s", out)
            walls[k].append(float(m.group(1)))
    print(f"\n## torch/train scaling ({frames} configurations of 64 Si atoms, {epochs} epochs, "
          f"batch {batch}, si_student; {rounds} runs each, in turn)\n")
    print("| workers | training s (median, min-max) | configurations/s | speed-up over 1 rank |")
    print("| --- | --- | --- | --- |")
    base = statistics.median(walls["1 rank"])
    for k, w in walls.items():
        med = statistics.median(w)
        print(f"| {k} | {med:.2f} ({min(w):.2f}-{max(w):.2f}) | {frames * epochs / med:.1f} | {base / med:.2f}x |")
    print("\n(torch/train's own training time: its last log line; start-up and reading the dataset not included)")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--part", default="all", choices=["write", "scaling", "all"])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--smoke", action="store_true", help="tiny sizes: that it runs (ctest)")
    a = p.parse_args()
    if a.part in ("write", "all"):
        part_write(1 if a.smoke else a.rounds, 4 if a.smoke else 50, 2 if a.smoke else 4)
    if a.part in ("scaling", "all"):
        for batch in ([4] if a.smoke else [4, 16]):
            part_scaling(1 if a.smoke else a.rounds, 8 if a.smoke else 64, 1 if a.smoke else 10, batch)


if __name__ == "__main__":
    main()
