#!/usr/bin/env python3
"""TorchScript vs compiled (AOTInductor) models, and torch-LJ vs native lj/cut, inside LAMMPS.

    .venv/bin/python bench/compiled.py [--lmp build/lmp] [--reps 3] [--steps 20] [--smoke]

Each case is a pair of whole LAMMPS runs on the same input, A and B, run
alternately (A B A B ...) so that a drift of the machine's speed hits both;
the figure is the median over the pairs of B's time per step / A's (and the
same for the pair style's share of the step).  Times come from LAMMPS's own
timing breakdown of the measured run (after a 2-step warm-up run in the same
process).  Writes a Markdown table to bench/compiled.md (--out).
--smoke runs tiny systems once (ctest uses it so that the script never rots).
"""

import argparse
import datetime
import os
import platform
import re
import statistics
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(here)


# extra LAMMPS command-line arguments for every run (bench/run.py --lmp-args,
# e.g. "-k on g 1 -sf kk -pk kokkos newton on neigh half" on a GPU)
EXTRA_ARGS = []


def lammps_run(lmp, script, variables, np=1, env=None, args=()):
    """One LAMMPS run (extra environment `env`, extra arguments `args`): the time per
    step and the pair style's share of its last run, and the screen output."""
    cmd = [lmp, "-log", "none", "-echo", "none", "-nocite", "-in", script] + EXTRA_ARGS + list(args)
    for k, v in variables.items():
        cmd += ["-var", k, str(v)]
    if np > 1:
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(np)] + cmd
    env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=here, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    # the last run's breakdown: "Loop time of T on P procs for N steps with A atoms"
    loops = re.findall(r"Loop time of ([0-9.eE+-]+) on \d+ procs for (\d+) steps with (\d+) atoms", out.stdout)
    pairs = re.findall(r"^Pair\s+\|\s*([0-9.eE+-]+)\s*\|\s*([0-9.eE+-]+)", out.stdout, re.M)
    loop, steps, atoms = loops[-1]
    steps = int(steps)
    model = re.findall(r"model evaluation ([0-9.]+)% of the pair time", out.stdout)
    return {"step": float(loop) / steps, "pair": float(pairs[-1][1]) / steps, "atoms": int(atoms),
            "model_share": float(model[-1]) / 100 if model else float("nan"),
            "compiled": "compiled AOTInductor package" in out.stdout, "stdout": out.stdout}


def compare(lmp, name, script, a, b, reps, steps, np=1, env_a=None):
    """Alternate runs of variable sets a and b (A with the extra environment
    env_a); medians of the per-pair ratios."""
    ra, rb = [], []
    for _ in range(reps):
        ra.append(lammps_run(lmp, script, dict(a, nsteps=steps), np, env_a))
        rb.append(lammps_run(lmp, script, dict(b, nsteps=steps), np))
    step_ratio = statistics.median(x["step"] / y["step"] for x, y in zip(ra, rb))
    pair_ratio = statistics.median(x["pair"] / y["pair"] for x, y in zip(ra, rb))
    row = {"case": name, "atoms": ra[0]["atoms"],
           "a_ms": 1e3 * statistics.median(x["step"] for x in ra),
           "b_ms": 1e3 * statistics.median(x["step"] for x in rb),
           "step_ratio": step_ratio, "pair_ratio": pair_ratio,
           "b_nonpair": statistics.median(1 - x["pair"] / x["step"] for x in rb),
           "b_nonmodel": statistics.median(1 - x["model_share"] for x in rb)}
    print(f"{name:48s} {row['atoms']:7d} atoms  A {row['a_ms']:9.2f} ms/step  B {row['b_ms']:9.2f} ms/step  "
          f"A/B step {step_ratio:5.2f}  pair {pair_ratio:5.2f}", flush=True)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lmp", default=os.path.join(root, "build", "lmp"))
    ap.add_argument("--reps", type=int, default=3, help="A/B pairs per case")
    ap.add_argument("--steps", type=int, default=20, help="measured MD steps per run")
    ap.add_argument("--smoke", action="store_true", help="tiny systems, one pair, 2 steps")
    ap.add_argument("--out", default=os.path.join(here, "compiled.md"))
    args = ap.parse_args()
    lmp = os.path.abspath(args.lmp)
    pot = os.path.join(root, "potentials")
    reps, steps = (1, 2) if args.smoke else (args.reps, args.steps)
    # Si: 8 n^3 atoms (4,096 and 32,768); LJ: 4 n^3 atoms (4,000 and 32,000)
    n4k, n32k, nlj4k, nlj = (2, 2, 3, 4) if args.smoke else (8, 16, 10, 20)
    si, lj = os.path.join(here, "in.si"), os.path.join(here, "in.lj")
    for m in ("si_local", "si_mp2", "lj_Ar"):
        if not os.path.exists(os.path.join(pot, m + ".pt2")):
            sys.exit(f"{pot}/{m}.pt2 is missing: run tools/compile_models.sh")
    rows = []
    # glibc's own steady state (dynamic mmap threshold at its 32 MiB ceiling,
    # trim at twice that) against the 1 GiB pair_style torch sets
    glibc = {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "67108864"}
    for model, ext in (("si_local", ".pt"), ("si_local", ".pt2"), ("lj_Ar", ".pt2")):
        script, n = (si, n4k) if model == "si_local" else (lj, nlj)
        extra = {} if model == "si_local" else {"pstyle": "torch"}
        kind = "TorchScript" if ext == ".pt" else "compiled"
        rows.append(compare(lmp, f"{model} {kind}: glibc's thresholds (A) vs kept blocks (B)", script,
                            dict(extra, model=f"{pot}/{model}{ext}", n=n),
                            dict(extra, model=f"{pot}/{model}{ext}", n=n), reps, steps, env_a=glibc))
    for model, n in (("si_local", n4k), ("si_mp2", n4k), ("si_local", n32k), ("si_mp2", n32k)):
        rows.append(compare(lmp, f"{model}: TorchScript (A) vs compiled (B)", si,
                            {"model": f"{pot}/{model}.pt", "n": n}, {"model": f"{pot}/{model}.pt2", "n": n},
                            reps, steps))
    for n in (nlj4k, nlj):
        rows.append(compare(lmp, "LJ: TorchScript (A) vs compiled (B)", lj,
                            {"pstyle": "torch", "model": f"{pot}/lj_Ar.pt", "n": n},
                            {"pstyle": "torch", "model": f"{pot}/lj_Ar.pt2", "n": n}, reps, steps))
    rows.append(compare(lmp, "LJ: compiled torch (A) vs native lj/cut (B)", lj,
                        {"pstyle": "torch", "model": f"{pot}/lj_Ar.pt2", "n": nlj},
                        {"pstyle": "native", "n": nlj}, reps, steps))
    if args.smoke:
        return 0
    with open(args.out, "w") as f:
        f.write("# TorchScript vs compiled models in LAMMPS (bench/compiled.py)\n\n")
        f.write(f"{datetime.date.today()}, {platform.node()}, {os.cpu_count()} cores, 1 MPI rank, "
                f"1 thread; {reps} alternated A/B pairs of whole runs, {steps} measured steps each; "
                "ratios are medians of the pairwise ratios (A time / B time: > 1 means B is faster).\n\n")
        f.write("| case | atoms | A ms/step | B ms/step | A/B per step | A/B pair time | "
                "B: non-pair share of the step | B: non-model share of the pair time |\n")
        f.write("| --- | --- | --- | --- | --- | --- | --- | --- |\n")
        for r in rows:
            nonmodel = "-" if r["b_nonmodel"] != r["b_nonmodel"] else f"{100 * r['b_nonmodel']:.1f}%"
            f.write(f"| {r['case']} | {r['atoms']} | {r['a_ms']:.2f} | {r['b_ms']:.2f} | {r['step_ratio']:.2f} | "
                    f"{r['pair_ratio']:.2f} | {100 * r['b_nonpair']:.1f}% | {nonmodel} |\n")
        f.write("\nNon-model share: the part of pair_style torch's time outside the model evaluation "
                "(graph build, copies, force scatter), from the style's own end-of-run line.\n")
        f.write(f"\nCommand: `.venv/bin/python bench/compiled.py --reps {reps} --steps {steps}`\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
