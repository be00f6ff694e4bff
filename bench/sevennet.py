#!/usr/bin/env python3
"""SevenNet-0 through SevenNet's own LAMMPS style and through ML-TORCH, side by side.

    .venv/bin/python bench/sevennet.py [--lmp build/lmp] [--cells 2 4 8] [--ranks 1 2]
                                     [--steps 3] [--pairs 1] [--smoke]

SevenNet's serial `pair_style e3gnn` is built at run time from the sources in
the installed `sevenn` wheel (sevenn/pair_e3gnn/) as a LAMMPS plugin, in a
cache folder outside the repository (~/.cache/ml-torch/e3gnn, or
$ML_TORCH_CACHE/e3gnn), and runs the TorchScript that `sevenn get_model 7net-0`
writes. ML-TORCH runs `mltorch-import sevenn 7net-0 --elements Si` (float32,
layered: one cutoff of ghosts, the features exchanged between the five
interaction blocks). Si diamond crystals of 8 n^3 atoms, rattled, NVE; each
pair of runs is e3gnn then torch on the same input. Prints per run the loop
time per step and atom-steps per second, and the torch/e3gnn speed ratio;
the forces of the first configuration are compared (largest difference, eV/A).

pair_e3gnn folds every ghost atom onto its owner by tag and keeps only edges
between owned atoms, which is exact on one MPI rank only (nothing in it checks
the rank count); on more ranks it is run once to report what it does.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np

import peer

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
VENV = os.path.join(ROOT, ".venv", "bin")


INPUT = """units metal
lattice diamond 5.431
region box block 0 {n} 0 {n} 0 {n}
create_box 1 box
create_atoms 1 box
mass 1 28.0855
displace_atoms all random 0.1 0.1 0.1 4928 units box
velocity all create 900 4928 loop geom
{load}
pair_style {style}
pair_coeff * * {model} Si
neighbor 1.0 bin
fix md all nve
thermo_style custom step pe
thermo_modify format float %.10g
run 0 post no
write_dump all custom forces.dump id fx fy fz modify sort id format float %.10g
run {steps}
"""


def build_e3gnn(build):
    """The e3gnn plugin from the wheel's sources (cached by the wheel's version)."""
    import sevenn
    import torch
    src = os.path.join(os.path.dirname(sevenn.__file__), "pair_e3gnn")
    return peer.build_plugin(
        os.path.join(peer.cache_dir("e3gnn"), f"sevenn-{sevenn.__version__}-torch-{torch.__version__}"),
        build, [os.path.join(src, "pair_e3gnn.cpp"), os.path.join(src, "pair_e3gnn_oeq_autograd.cpp")],
        src, {"name": "e3gnn", "cls": "PairE3GNN", "header": "pair_e3gnn.h",
              "info": "SevenNet pair_e3gnn, built from the installed sevenn wheel",
              "author": "SevenNet developers"})


def models(tmp):
    deployed = os.path.join(tmp, "7net-0_e3gnn.pt")
    subprocess.run([os.path.join(VENV, "sevenn"), "get_model", "7net-0", "-o", deployed],
                   check=True, capture_output=True, cwd=tmp)
    ours = os.path.join(tmp, "7net-0_Si.pt")
    subprocess.run([os.path.join(VENV, "mltorch-import"), "sevenn", "7net-0", "--elements", "Si",
                    "--dtype", "float32", "-o", ours], check=True, capture_output=True)
    return deployed, ours


def run_once(lmp, style, model, load, cells, ranks, steps, tmp):
    rc, out, log, work = peer.run_input(
        lmp, INPUT.format(n=cells, style=style, model=model, load=load, steps=steps), ranks, tmp)
    if rc != 0:
        tail = (out + log).strip().splitlines()[-4:]
        return {"failed": " | ".join(tail)}
    return peer.results(work, log)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lmp", default=os.path.join(ROOT, "build", "lmp"))
    ap.add_argument("--cells", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--pairs", type=int, default=1)
    ap.add_argument("--smoke", action="store_true", help="64 atoms, 1 step, 1 and 2 ranks")
    ap.add_argument("--compiled", default=None,
                    help="also run this compiled package of the imported model (mltorch-compile "
                         "7net-0_Si.pt, about 12 minutes on 2 cores)")
    args = ap.parse_args()
    if args.smoke:
        args.cells, args.ranks, args.steps, args.pairs = [2], [1, 2], 1, 1
    lmp = os.path.abspath(args.lmp)
    build = os.path.dirname(lmp)
    print("building pair_style e3gnn from the sevenn wheel (cached):", flush=True)
    plugin = build_e3gnn(build)
    tmp = tempfile.mkdtemp(prefix="bench-sevenn-")
    deployed, ours = models(tmp)
    load = f"plugin load {plugin}"
    print(f"{'atoms':>6} {'ranks':>5} {'e3gnn s/step':>13} {'torch s/step':>13} "
          f"{'torch atom-steps/s':>18} {'torch/e3gnn':>11} {'max |dF| eV/A':>13}  e3gnn")
    variants = [("torch", ours)] + ([("compiled", os.path.abspath(args.compiled))] if args.compiled else [])
    failures = 0
    for cells in args.cells:
        atoms = 8 * cells ** 3
        for ranks in args.ranks:
            if ranks > 1 and atoms < 512 and not args.smoke:
                continue
            ratios, te, tt, note, df = [], [], [], "", float("nan")
            for _ in range(args.pairs):
                # e3gnn on several ranks is not exact (see above): run it once to show what it does
                e = run_once(lmp, "e3gnn", deployed, load, cells, ranks, args.steps, tmp)
                t = run_once(lmp, "torch", ours, "", cells, ranks, args.steps, tmp)
                for label, path in variants[1:]:
                    c = run_once(lmp, "torch", path, "", cells, ranks, args.steps, tmp)
                    if "failed" in c:
                        print(f"{label} failed: {c['failed']}")
                        failures += 1
                    else:
                        print(f"  {label}: {c['step']:.3f} s/step, {atoms / c['step']:.1f} atom-steps/s"
                              + (f", e3gnn/{label} {e['step'] / c['step']:.2f}" if "step" in e else "")
                              + (f", max |dF| vs e3gnn {float(np.abs(e['forces'] - c['forces']).max()):.2g}"
                                 if "forces" in e else ""), flush=True)
                if "failed" in t:
                    print(f"torch failed: {t['failed']}")
                    failures += 1
                    break
                tt.append(t["step"])
                if "failed" in e:
                    note = "failed: " + e["failed"][:120]
                    break
                te.append(e["step"])
                ratios.append(e["step"] / t["step"])
                df = float(np.abs(e["forces"] - t["forces"]).max())
                if ranks > 1:
                    note = f"pe {e['pe']:.6g} vs {t['pe']:.6g} eV (torch)"
            e_col = f"{statistics.median(te):13.3f}" if te else f"{'-':>13}"
            r_col = f"{statistics.median(ratios):11.2f}" if ratios else f"{'-':>11}"
            if tt:
                print(f"{atoms:6d} {ranks:5d} {e_col} {statistics.median(tt):13.3f} "
                      f"{atoms / statistics.median(tt):18.1f} {r_col} {df:13.2g}  {note}", flush=True)
            if ranks == 1 and te and not df < 1e-4:
                print(f"  forces differ by {df:.3g} eV/A on 1 rank")
                failures += 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
