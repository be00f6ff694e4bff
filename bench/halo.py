#!/usr/bin/env python3
"""Per-layer halo exchange vs thick ghosts, side by side.

    .venv/bin/python bench/halo.py [--lmp build/lmp] [--atoms 4096 32768] [--ranks 1 2 4]
                                   [--steps 3] [--pairs 2] [--smoke]

For si_mp2 (2 layers) and the 4-layer test model: Si diamond crystals of the
given sizes, NVE, on N MPI ranks, with `pair_style torch` (exchange) and
`pair_style torch halo thick` run in turn (A B A B ...). Prints per run the
ghost atoms and graph nodes per rank (from the pair style's log line), the
loop time per step, the exchange's share of it (the pair style's own timer
around its forward and reverse exchanges, waits included, times the Pair
share of the step), the peak resident size of the largest rank,
and the thick/exchange ratio of the step time pair by pair (median).
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MODELS = {"si_mp2 (2 layers)": os.path.join(ROOT, "potentials", "si_mp2.pt"),
          "si_mp2 compiled (.pt2)": os.path.join(ROOT, "potentials", "si_mp2.pt2"),
          "si_mp4 (4 layers)": os.path.join(ROOT, "unittest", "models", "si_mp4_layered.pt")}

INPUT = """units metal
lattice diamond 5.431
region box block 0 {n} 0 {n} 0 {n}
create_box 1 box
create_atoms 1 box
mass 1 28.0855
displace_atoms all random 0.1 0.1 0.1 4928 units box
velocity all create 900 4928 loop geom
pair_style {style}
pair_coeff * * {model} Si
neighbor 1.0 bin
fix md all nve
thermo {steps}
run {steps}
"""


def run_once(lmp, model, cells, ranks, steps, thick, tmp):
    inp = os.path.join(tmp, "in.halo")
    with open(inp, "w") as f:
        f.write(INPUT.format(n=cells, model=model, steps=steps,
                             style="torch halo thick" if thick else "torch"))
    log = os.path.join(tmp, "log.halo")
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(ranks), lmp, "-in", inp,
           "-log", log, "-screen", "none"]
    # peak resident size of the largest rank (LAMMPS's own memory figure
    # leaves out LibTorch's tensors): the maximum over the reaped descendants
    probe = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True); "
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", probe] + cmd, check=True, capture_output=True, text=True,
                         env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=3600)
    peak_mb = int(out.stdout.split()[-1]) / 1024.0
    text = open(log).read()
    loop = float(re.search(r"Loop time of (\S+) on", text).group(1))
    g = re.search(r"ghost atoms per rank (\S+) to (\S+) \(mean (\S+)\), graph nodes per rank (\S+) to "
                  r"(\S+) for (\S+) owned atoms", text)
    halo = re.search(r"the halo exchange \(inside the model evaluation, waits included\) (\S+)%", text)
    pair = re.search(r"^Pair\s+\|[^|]+\|[^|]+\|[^|]+\|[^|]+\|\s*(\S+)", text, re.M)
    return {"step": loop / steps, "ghosts_max": float(g.group(2)), "nodes_max": float(g.group(5)),
            "natoms": float(g.group(6)), "halo": float(halo.group(1)) * float(pair.group(1)) / 100.0 if halo else float("nan"),
            "mem": peak_mb}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lmp", default=os.path.join(ROOT, "build", "lmp"))
    ap.add_argument("--atoms", type=int, nargs="+", default=[4096, 32768])
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--smoke", action="store_true", help="512 atoms, 1 and 2 ranks, 1 step, 1 pair")
    args = ap.parse_args()
    if args.smoke:
        args.atoms, args.ranks, args.steps, args.pairs = [512], [1, 2], 1, 1
    print("| model | atoms | ranks | ghosts/rank (max) exchange / thick | nodes per owned atom "
          "exchange / thick | s/step exchange | s/step thick | thick / exchange | exchange % of step | "
          "peak MB/rank exchange / thick |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as tmp:
        for name, model in MODELS.items():
            if not os.path.exists(model):    # potentials/*.pt2: made by tools/setup.sh
                print(f"| {name} | (missing: {model}) |")
                continue
            for natoms in args.atoms:
                cells = round((natoms / 8) ** (1 / 3))
                for ranks in args.ranks:
                    ex, th, ratios = [], [], []
                    for _ in range(args.pairs):
                        a = run_once(args.lmp, model, cells, ranks, args.steps, False, tmp)
                        b = run_once(args.lmp, model, cells, ranks, args.steps, True, tmp)
                        ex.append(a)
                        th.append(b)
                        ratios.append(b["step"] / a["step"])
                    a, b = ex[-1], th[-1]
                    per = a["natoms"] / ranks
                    print(f"| {name} | {8 * cells ** 3} | {ranks} | {a['ghosts_max']:.0f} / {b['ghosts_max']:.0f} | "
                          f"{a['nodes_max'] / per:.2f} / {b['nodes_max'] / per:.2f} | "
                          f"{statistics.median(x['step'] for x in ex):.3g} | "
                          f"{statistics.median(x['step'] for x in th):.3g} | "
                          f"{statistics.median(ratios):.2f} | {a['halo']:.1f} | "
                          f"{a['mem']:.0f} / {b['mem']:.0f} |", flush=True)
                    if args.smoke and not ratios[0] > 0:
                        sys.exit("FAIL: no timing")


if __name__ == "__main__":
    main()
