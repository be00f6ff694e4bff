#!/usr/bin/env python3
"""examples/dft: the numbers of README.md and dft.png from the logs.

Labels the held-out frames (heldout.P.dump, written by in.heldout with the
original model) with CP2K's own ENERGY_FORCE runs (the same settings as the
fine-tuning's driver runs, two at a time, cached in heldout_labels.json),
evaluates the original and the fine-tuned model on them (lmp rerun,
in.rerun), and prints the force RMSE against CP2K before and after, the DFT
calls made, and the wall time of a DFT call against an MD step.

  analyse.py [--lmp LMP] [--train-wall S] [cp2k_input.py options: --elements Si --basis ...]
"""

import argparse
import concurrent.futures as cf
import hashlib
import json
import os
import re
import subprocess
import sys

import numpy as np

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(os.path.dirname(here))
sys.path.insert(0, os.path.join(root, "tools"))
import cp2k_input  # noqa: E402

HARTREE_EV, BOHR_A = 27.211386245988, 0.529177210903
TEMPS = {0: 900, 1: 1500}


def frames(path):
    """[(box lo, box hi, [(id, type, x, y, z)])] of a LAMMPS text dump"""
    out, lines = [], open(path).read().splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("ITEM: NUMBER OF ATOMS"):
            n = int(lines[i + 1])
            lo, hi = [], []
            for k in range(3):
                a, b = lines[i + 3 + k].split()[:2]
                lo.append(float(a))
                hi.append(float(b))
            atoms = []
            for line in lines[i + 7:i + 7 + n]:
                w = line.split()
                atoms.append((int(w[0]), int(w[1]), float(w[2]), float(w[3]), float(w[4])))
            out.append((lo, hi, sorted(atoms)))
            i += 7 + n
        else:
            i += 1
    return out


def write_data(path, lo, hi, atoms):
    with open(path, "w") as f:
        f.write(f"held-out frame\n\n{len(atoms)} atoms\n1 atom types\n\n")
        for d, w in enumerate("xyz"):
            f.write(f"{lo[d]!r} {hi[d]!r} {w}lo {w}hi\n")
        f.write("\nMasses\n\n1 28.0855\n\nAtoms # atomic\n\n")
        for a in atoms:
            f.write(f"{a[0]} {a[1]} {a[2]!r} {a[3]!r} {a[4]!r}\n")


def cp2k_forces(out):
    f, take = [], False
    for line in open(out):
        if "ATOMIC FORCES in [a.u.]" in line:
            f, take = [], True
            continue
        if take:
            w = line.split()
            if len(w) == 6 and w[0].isdigit():
                f.append([float(v) for v in w[3:6]])
            elif "SUM OF ATOMIC FORCES" in line:
                take = False
    return np.array(f) * HARTREE_EV / BOHR_A


def label(job):
    data, inp, out, kw = job
    # two at a time: each frame is its own CP2K project (frame.R.I-RESTART.wfn);
    # two runs of one project in one folder rotate the same files and one can abort
    with open(inp, "w") as f:
        f.write(cp2k_input.cp2k_input(data, project=cp2k_input.project_of(inp), **kw))
    subprocess.run(["cp2k.psmp", "-i", os.path.basename(inp), "-o", os.path.basename(out)],
                   check=True, cwd=os.path.dirname(inp), env=dict(os.environ, OMP_NUM_THREADS="1"))
    return cp2k_forces(out)


def frames_forces(path):
    out, lines = [], open(path).read().splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("ITEM: NUMBER OF ATOMS"):
            n = int(lines[i + 1])
            rows = sorted((int(w[0]), [float(v) for v in w[1:4]])
                          for w in (line.split() for line in lines[i + 7:i + 7 + n]))
            out.append((None, None, np.array([r[1] for r in rows])))
            i += 7 + n
        else:
            i += 1
    return out


def rmse(a, b):
    return float(np.sqrt(np.mean((np.concatenate(a) - np.concatenate(b)) ** 2)))


def log_numbers(path):
    """the fix's update lines (update, F_rmse over both replicas' labels, the
    fitted energy shift) and the teacher's end-of-run line"""
    rows, summary = [], None
    for line in open(path):
        m = re.match(r"fix torch/finetune: step (\d+) update (\d+) .* F_rmse (\S+) .*energy shift Si (\S+)", line)
        if m:
            rows.append((int(m.group(2)), float(m.group(3)), float(m.group(4))))
        m = re.search(r"teacher ipi on \S+: (\d+) labels, (\S+) s in the client, (\S+) s on the server", line)
        if m:
            summary = (int(m.group(1)), float(m.group(2)), float(m.group(3)))
    return rows, summary


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--lmp", default=os.path.join(root, "build", "lmp"))
    p.add_argument("--train-wall", type=float, default=0.0)
    p.add_argument("--elements", nargs="+", default=["Si"])
    p.add_argument("--basis", default="SZV-MOLOPT-SR-GTH")
    p.add_argument("--cutoff", type=float, default=120.0)
    p.add_argument("--rel-cutoff", type=float, default=30.0)
    p.add_argument("--eps-scf", type=float, default=1e-7)
    a = p.parse_args()
    os.chdir(here)
    kw = dict(elements=a.elements, basis=a.basis, cutoff=a.cutoff, rel_cutoff=a.rel_cutoff,
              eps_scf=a.eps_scf)

    # held-out labels (cached by frame content and settings)
    cache_file = "heldout_labels.json"
    cache = json.load(open(cache_file)) if os.path.exists(cache_file) else {}
    os.makedirs("heldout", exist_ok=True)
    jobs, keys, per_rep = [], [], {}
    for rep in (0, 1):
        per_rep[rep] = []
        for i, (lo, hi, atoms) in enumerate(frames(f"heldout.{rep}.dump")):
            data = f"heldout/frame.{rep}.{i}.data"
            write_data(data, lo, hi, atoms)
            key = hashlib.sha1((open(data).read() + json.dumps(kw, sort_keys=True)).encode()).hexdigest()
            per_rep[rep].append(key)
            if key not in cache:
                jobs.append((data, f"heldout/frame.{rep}.{i}.inp", f"heldout/frame.{rep}.{i}.out", kw))
                keys.append(key)
    if jobs:
        print(f"labelling {len(jobs)} held-out frames with CP2K, two at a time ...", flush=True)
        with cf.ThreadPoolExecutor(2) as pool:
            for key, f in zip(keys, pool.map(label, jobs)):
                cache[key] = f.tolist()
        json.dump(cache, open(cache_file, "w"))

    have_tuned = os.path.exists("7net-0_Si_dft.pt")
    have_offline = os.path.exists("7net-0_Si_offline.pt")
    result = {}
    for rep in (0, 1):
        ref = [np.array(cache[k]) for k in per_rep[rep]]
        before = [f for _, _, f in frames_forces_of(a.lmp, "7net-0_Si.pt", rep)]
        after = [f for _, _, f in frames_forces_of(a.lmp, "7net-0_Si_dft.pt", rep)] if have_tuned else None
        offline = ([f for _, _, f in frames_forces_of(a.lmp, "7net-0_Si_offline.pt", rep)]
                   if have_offline else None)
        result[rep] = (len(ref), rmse(before, ref), rmse(after, ref) if after else float("nan"),
                       float(np.sqrt(np.mean(np.concatenate(ref) ** 2))),
                       rmse(offline, ref) if offline else float("nan"))

    # the fine-tuning logs
    logs = {rep: log_numbers(f"log.dft.{rep}") for rep in (0, 1)}
    loop = None
    for line in open("log.heldout.0"):
        m = re.match(r"Loop time of (\S+) on \d+ procs for (\d+) steps", line)
        if m and loop is None:
            loop = float(m.group(1)) / int(m.group(2))

    print("\n| replica | held-out frames | |F| RMS (CP2K) | force RMSE before | after (online) | offline, same labels | labels (DFT calls) | s per DFT call |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for rep in (0, 1):
        n, b, af, fr, off = result[rep]
        s = logs[rep][1]
        calls = s[0] if s else 0
        per = s[1] / s[0] if s and s[0] else float("nan")
        print(f"| {TEMPS[rep]} K | {n} | {fr:.3f} eV/A | {b:.4f} eV/A | {af:.4f} eV/A | {off:.4f} eV/A | {calls} | {per:.2f} |")
    if logs[0][0]:
        first, last = logs[0][0][0], logs[0][0][-1]
        print(f"\nforce RMSE on the labels before each update: {first[1]:.3f} eV/A at update {first[0]}, "
              f"{last[1]:.3f} at update {last[0]}; fitted energy shift {last[2]:.4f} eV per Si atom "
              "(CP2K's energy zero against SevenNet-0's)")
    if loop:
        s = logs[0][1]
        per = s[1] / s[0] if s and s[0] else float("nan")
        print(f"\nMD step of SevenNet-0 (8 atoms, 1 rank): {1e3 * loop:.1f} ms; a DFT call "
              f"{per:.1f} s = {per / loop:.0f} MD steps; fine-tuning run {a.train_wall:.0f} s wall")

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
        rows = logs[0][0]
        upd = np.array([r[0] for r in rows])
        err = np.array([r[1] for r in rows])
        ax1.plot(upd, err, ".", alpha=0.5, label="each update (both replicas' labels, before it)")
        k = min(10, len(err))
        if k > 1:
            ax1.plot(upd[k - 1:], np.convolve(err, np.ones(k) / k, mode="valid"), "-",
                     label=f"mean of the last {k}")
        ax1.set_xlabel("updates")
        ax1.set_ylabel("force RMSE vs CP2K (eV/A)")
        ax1.set_title("fine-tuning SevenNet-0 on CP2K labels")
        ax1.legend()
        x = np.arange(2)
        ax2.bar(x - 0.2, [result[r][1] for r in (0, 1)], 0.4, label="SevenNet-0")
        ax2.bar(x + 0.2, [result[r][2] for r in (0, 1)], 0.4, label="fine-tuned")
        ax2.set_xticks(x, [f"{TEMPS[r]} K" for r in (0, 1)])
        ax2.set_ylabel("force RMSE vs CP2K, held-out (eV/A)")
        ax2.set_title("held-out configurations")
        ax2.legend()
        fig.tight_layout()
        fig.savefig("dft.png", dpi=100)
        print("wrote dft.png")
    except ImportError:
        pass


def frames_forces_of(lmp, model, rep):
    out = f"heldout/forces.{os.path.splitext(model)[0]}.{rep}.dump"
    subprocess.run([lmp, "-log", "none", "-screen", "none", "-nocite", "-in", "in.rerun", "-var",
                    "model", model, "-var", "dump", f"heldout.{rep}.dump", "-var", "out", out],
                   check=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    return frames_forces(out)


if __name__ == "__main__":
    main()
