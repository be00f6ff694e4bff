#!/usr/bin/env python3
"""Compare the uncertainty-gated run with the every-10-steps run of in.onthefly.

Reads the partition logs (log.gated.0/1, log.every10.0/1) and the frames and
model snapshots in out/, evaluates the MD model (the committee's first
member) of every 250-step chunk against the teacher (si_mp2.pt) on that
chunk's final configurations of both replicas, and writes onthefly.png
(deviation, force error against the teacher, cumulative teacher calls over
time) and a table of teacher calls and final errors (also to
onthefly_table.md).

    python analyse.py [--runs gated gated50 every10 every20 every40]
"""

import argparse
import os
import sys

import numpy as np
import torch

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.join(here, "..", "..")
sys.path.insert(0, os.path.join(root, "python"))
from mltorch.graph import build_graph, evaluate  # noqa: E402


def thermo(log):
    """{column: np.array} of all thermo blocks of a LAMMPS log (repeated steps dropped)."""
    cols, rows, block = None, {}, False
    with open(log) as f:
        for line in f:
            words = line.split()
            if words[:1] == ["Step"]:
                cols, block = words, True
                continue
            if block:
                if words[:2] == ["Loop", "time"]:
                    block = False
                    continue
                try:    # (log lines of fixes may come between thermo lines)
                    values = [float(w) for w in words]
                except ValueError:
                    continue
                if len(values) == len(cols):
                    rows[int(values[0])] = values
    steps = sorted(rows)
    return {c: np.array([rows[s][k] for s in steps]) for k, c in enumerate(cols)}


def read_frame(path):
    """positions [n,3], cell [3,3] of a write_dump custom file (orthogonal box)."""
    with open(path) as f:
        lines = f.read().splitlines()
    n = int(lines[lines.index("ITEM: NUMBER OF ATOMS") + 1])
    b = lines.index(next(l for l in lines if l.startswith("ITEM: BOX BOUNDS")))
    lo_hi = [list(map(float, lines[b + 1 + d].split()[:2])) for d in range(3)]
    a = lines.index(next(l for l in lines if l.startswith("ITEM: ATOMS")))
    data = np.array([list(map(float, l.split())) for l in lines[a + 1:a + 1 + n]])
    pos = data[:, 2:5]
    cell = np.diag([hi - lo for lo, hi in lo_hi])
    return pos, cell


def forces(model, pos, cell, cutoff, layers):
    g = build_graph(pos, cell, np.zeros(len(pos), dtype=np.int64), cutoff, layers)
    _, f, _ = evaluate(model, g, torch.tensor(pos), torch.tensor(cell))
    return f.detach().numpy()


def rmse(a, b):
    return float(np.sqrt(np.mean((a - b) ** 2)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", nargs="+", default=["gated", "gated50", "every10", "every20", "every40"],
                    help="runs (log.RUN.0/1, out/RUN.*); the every* runs are the baseline")
    ap.add_argument("--chunks", type=int, default=20)
    ap.add_argument("--heating", type=int, default=8, help="chunks of the 600 -> 3000 K ramp")
    ap.add_argument("--low", type=float, nargs="*", default=[0.3, 0.5],
                    help="gate thresholds to mark in the deviation plot (eV/A)")
    args = ap.parse_args()
    pot = os.path.join(root, "potentials")
    teacher = torch.jit.load(os.path.join(pot, "si_mp2.pt"))
    initial = torch.jit.load(os.path.join(pot, "si_crystal_c0.pt"))

    # frames of both runs and replicas, with the teacher's forces
    frames = {}
    for run in args.runs:
        for p in (0, 1):
            for i in range(1, args.chunks + 1):
                path = os.path.join(here, "out", f"{run}.frame.{p}.{i}")
                if os.path.exists(path):
                    pos, cell = read_frame(path)
                    frames[(run, p, i)] = (pos, cell, forces(teacher, pos, cell, 4.0, 2))

    curves, table = {}, []
    for run in args.runs:
        logs = [thermo(os.path.join(here, f"log.{run}.{p}")) for p in (0, 1)]
        calls = sum(l["f_ft[14]"] for l in logs)
        err, err_initial, snap = [], [], initial
        for i in range(1, args.chunks + 1):
            path = os.path.join(here, "out", f"{run}.model.{i}.pt")
            if os.path.exists(path):    # (no file: no update yet in that chunk)
                snap = torch.jit.load(path)
            e = [rmse(forces(snap, *frames[(run, p, i)][:2], 4.0, 1), frames[(run, p, i)][2])
                 for p in (0, 1) if (run, p, i) in frames]
            e0 = [rmse(forces(initial, *frames[(run, p, i)][:2], 4.0, 1), frames[(run, p, i)][2])
                  for p in (0, 1) if (run, p, i) in frames]
            err.append(np.mean(e))
            err_initial.append(np.mean(e0))
        curves[run] = dict(step=logs[0]["Step"], devi=[l["c_dev[1]"] for l in logs],
                           calls=calls, err=np.array(err), err0=np.array(err_initial),
                           chunk_step=250 * np.arange(1, args.chunks + 1))
        # the final models (the snapshots of the last 4 chunks: one online
        # update moves a single snapshot's error noticeably) on the frames of
        # every run: the first half of the heating (600-1800 K, the crystal)
        # and the liquid held at 3000 K
        finals = [torch.jit.load(os.path.join(here, "out", f"{run}.model.{i}.pt"))
                  for i in range(args.chunks - 3, args.chunks + 1)]
        cryst = [rmse(forces(m, pos, cell, 4.0, 1), f) for m in finals
                 for (r, p, i), (pos, cell, f) in frames.items() if i <= args.heating // 2]
        liquid = [rmse(forces(m, pos, cell, 4.0, 1), f) for m in finals
                  for (r, p, i), (pos, cell, f) in frames.items() if i > args.heating]
        saved = sum(l["f_ft[15]"][-1] for l in logs)
        table.append((run, int(calls[-1]), int(saved), float(np.mean(cryst)), float(np.mean(liquid))))

    lines = ["| run | teacher calls (both replicas) | calls saved by the gate | "
             "final model's force RMSE vs teacher, 600-1800 K frames (eV/A) | "
             "the same, liquid at 3000 K (eV/A) |",
             "| --- | --- | --- | --- | --- |"]
    for run, calls, saved, c, l in table:
        lines.append(f"| {run} | {calls} | {saved} | {c:.4f} | {l:.4f} |")
    # labelling every N steps: teacher calls needed for a final liquid error,
    # interpolated in log(calls) between the every-N runs
    base = sorted((calls, l) for run, calls, saved, c, l in table if run.startswith("every"))
    for run, calls, saved, c, l in table:
        if run.startswith("every") or len(base) < 2:
            continue
        errs = [b[1] for b in base]
        if not (min(errs) <= l <= max(errs)):
            lines.append(f"\n{run}: final liquid error {l:.4f} eV/A lies outside the every-N runs' "
                         f"range ({min(errs):.4f}-{max(errs):.4f}); no interpolation")
            continue
        # errors fall as calls rise: interpolate log(calls) linearly in the error
        for (c0, e0), (c1, e1) in zip(base, base[1:]):
            if min(e0, e1) <= l <= max(e0, e1) and e0 != e1:
                t = (l - e0) / (e1 - e0)
                need = float(np.exp(np.log(c0) + t * (np.log(c1) - np.log(c0))))
                lines.append(f"\n{run}: {calls} teacher calls for a final liquid error of {l:.4f} "
                             f"eV/A; labelling every N steps needs about {need:.0f} for the same "
                             f"error: the gate saves {100 * (1 - calls / need):.0f}% of the calls")
                break
    text = "\n".join(lines) + "\n"
    print(text)
    with open(os.path.join(here, "onthefly_table.md"), "w") as f:
        f.write(text)

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(3, 1, figsize=(7, 9), sharex=True)
    palette = ["tab:red", "tab:orange", "tab:green", "tab:purple", "tab:blue", "tab:cyan"]
    colours = {run: palette[k % len(palette)] for k, run in enumerate(args.runs)}
    for run, c in curves.items():
        # replica 0; step 0 is the perfect lattice (deviation ~1e-14)
        ax[0].plot(c["step"][1:], c["devi"][0][1:], color=colours[run], lw=1, label=run)
        ax[1].plot(c["chunk_step"], c["err"], "o-", color=colours[run], label=f"{run}: MD model")
        ax[2].plot(c["step"], c["calls"], color=colours[run], label=run)
    first = curves[args.runs[0]]
    ax[1].plot(first["chunk_step"], first["err0"], "k--", label="untrained first member")
    for low in args.low:
        ax[0].axhline(low, color="k", ls=":", lw=1)
    ax[0].set_ylabel("max force deviation, replica 0 (eV/A)")
    ax[0].set_yscale("log")
    ax[0].set_ylim(3e-3, 20)
    ax[1].set_ylabel("force RMSE vs teacher (eV/A)")
    ax[2].set_ylabel("teacher calls (both replicas)")
    ax[2].set_xlabel("step (600 K -> 3000 K over 2000 steps, then 3000 K)")
    for a in ax:
        a.legend(fontsize=8)
        a.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(here, "onthefly.png"), dpi=110)
    print("wrote onthefly.png and onthefly_table.md")


if __name__ == "__main__":
    main()
