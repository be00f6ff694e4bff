#!/usr/bin/env python3
"""A NequIP model through NequIP's own LAMMPS style and through ML-TORCH, side by side.

    .venv/bin/python bench/nequip.py [--peer-src DIR] [--lmp build/lmp] [--cells 2 4 8]
                                   [--ranks 1 2] [--steps 3] [--pairs 1]
                                   [--peer-model auto|pt2|pth] [--ckpt CKPT] [--smoke]
                                   [--compiled PKG]

The peer is `pair_style nequip` of mir-group/pair_nequip_allegro, which is not
on PyPI: --peer-src DIR names a checkout of https://github.com/mir-group/pair_nequip_allegro
(only pair_nequip_allegro.cpp/.h are used; nothing of it is copied into this
repository). Without --peer-src only ML-TORCH runs, and the script says so.
The style is built at run time as a LAMMPS plugin (with a small entry file
written next to it that registers `nequip`), in a cache folder outside the
repository (~/.cache/ml-torch/pair_nequip, or $ML_TORCH_CACHE/pair_nequip),
against this build's LAMMPS sources and the torch of .venv, with
-DNEQUIP_AOT_COMPILE. It runs what `nequip-compile` makes of the checkpoint
(also cached there): the AOTInductor package (`--mode aotinductor --target
pair_nequip --device cpu`, about 2 minutes on 2 cores) first; if that fails to
run, the TorchScript file (`--mode torchscript`, which nequip 0.19 refuses on
torch >= 2.10 unless its version guard is switched off, as done here).
`pair_style nequip` runs on one MPI rank only (it refuses more) with
`newton off`.

ML-TORCH runs `mltorch-import nequip CKPT --dtype float64` (layered: one
cutoff of ghosts, features exchanged between the three convolution layers)
with `newton on`. The checkpoint is potentials/frameworks/nequip_sic (NequIP,
3 layers, ZBL, r_max 4 A, float64). SiC zincblende (a = 4.36 A), n^3
conventional cells of 8 atoms, rattled, NVE; each pair of runs is nequip then
torch on the same input. Prints per run the loop time per step and
atom-steps per second, and the nequip/torch speed ratio; the forces of the
first configuration are compared (largest difference, eV/A). 2-rank rows are
run at the largest size only, their ratio and forces against nequip's 1-rank
run of the same input (the input does not depend on the rank count).
"""

import argparse
import hashlib
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import peer

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
VENV = os.path.join(ROOT, ".venv", "bin")
CKPT = os.path.join(ROOT, "potentials", "frameworks", "nequip_sic", "nequip_sic.ckpt")
PEER_FILES = ("pair_nequip_allegro.cpp", "pair_nequip_allegro.h")

# nequip-compile --mode torchscript with nequip's torch >= 2.10 guard switched off
TORCHSCRIPT = """import sys, nequip.scripts.compile as c
c._TORCH_GE_2_10 = False
c.main(["--mode", "torchscript", "--device", "cpu", sys.argv[1], sys.argv[2]])
"""

# type 1 Si on the fcc sites of the diamond basis, type 2 C on the others
INPUT = """units metal
newton {newton}
lattice diamond 4.36
region box block 0 {n} 0 {n} 0 {n}
create_box 2 box
create_atoms 1 box basis 5 2 basis 6 2 basis 7 2 basis 8 2
mass 1 28.0855
mass 2 12.011
displace_atoms all random 0.05 0.05 0.05 4928 units box
velocity all create 600 4928 loop geom
{load}
pair_style {style}
pair_coeff * * {model} Si C
neighbor 1.0 bin
fix md all nve
thermo_style custom step pe
thermo_modify format float %.15g
run 0 post no
write_dump all custom forces.dump id fx fy fz modify sort id format float %.17g
run {steps}
"""


def cache_dir():
    return peer.cache_dir("pair_nequip")


def digest(*paths):
    h = hashlib.sha256()
    for p in paths:
        with open(p, "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:12]


def build_nequip(build, src):
    """The nequip plugin from the checkout's sources (cached by their contents and torch)."""
    import torch
    out = os.path.join(cache_dir(), f"plugin-{digest(*[os.path.join(src, f) for f in PEER_FILES])}"
                                    f"-torch-{torch.__version__}")
    return peer.build_plugin(
        out, build, [os.path.join(src, "pair_nequip_allegro.cpp")], src,
        {"name": "nequip", "cls": "PairNequIPAllegro<true>", "header": "pair_nequip_allegro.h",
         "info": "pair_nequip_allegro (NequIP mode), built from a checkout given to bench/nequip.py",
         "author": "NequIP developers"}, defines=["-DNEQUIP_AOT_COMPILE"])


def peer_model(ckpt, kind):
    """nequip-compile's output for pair_nequip (cached by checkpoint, nequip and torch)."""
    import torch
    from importlib.metadata import version
    out = os.path.join(cache_dir(), f"model-{digest(ckpt)}-nequip-{version('nequip')}"
                                    f"-torch-{torch.__version__}")
    name = os.path.splitext(os.path.basename(ckpt))[0]
    path = os.path.join(out, f"{name}.nequip.{kind}")
    if os.path.exists(path):
        print(f"  cached: {path}", flush=True)
        return path
    os.makedirs(out, exist_ok=True)
    tmp = path.replace(".nequip.", ".tmp.nequip.")  # pair_nequip goes by the extension
    env = dict(os.environ, OMP_NUM_THREADS="1", TORCHINDUCTOR_COMPILE_THREADS="1",
               TORCHINDUCTOR_CACHE_DIR=os.path.join(out, "inductor"))
    if kind == "pt2":
        cmd = [os.path.join(VENV, "nequip-compile"), "--mode", "aotinductor", "--target",
               "pair_nequip", "--device", "cpu", ckpt, tmp]
    else:
        cmd = [os.path.join(VENV, "python"), "-c", TORCHSCRIPT, ckpt, tmp]
    t = time.time()
    p = subprocess.run(cmd, cwd=out, env=env, capture_output=True, text=True)
    if p.returncode != 0 or not os.path.exists(tmp):
        print(f"  nequip-compile ({kind}) failed:\n" + (p.stdout + p.stderr)[-3000:], flush=True)
        return None
    os.replace(tmp, path)
    print(f"  nequip-compile ({kind}) in {time.time() - t:.0f} s: {path}", flush=True)
    return path


def ours(ckpt, tmp):
    path = os.path.join(tmp, "nequip_sic_f64.pt")
    t = time.time()
    p = subprocess.run([os.path.join(VENV, "mltorch-import"), "nequip", ckpt, "--dtype", "float64",
                        "-o", path], capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit("bench/nequip.py: mltorch-import nequip failed:\n" + (p.stdout + p.stderr)[-3000:])
    print(f"  mltorch-import nequip in {time.time() - t:.0f} s: {path}", flush=True)
    return path


def run_once(lmp, style, model, load, cells, ranks, steps, tmp):
    newton = "off" if style == "nequip" else "on"
    rc, out, log, work = peer.run_input(
        lmp, INPUT.format(n=cells, style=style, model=model, load=load, steps=steps, newton=newton),
        ranks, tmp)
    loops = re.findall(r"Loop time of ([0-9.e+-]+) on \d+ procs for (\d+) steps", log)
    if rc != 0 or len(loops) < 2:
        text = (out + log).strip().splitlines()
        errors = [line for line in text if line.startswith(("ERROR", "Exception"))
                  or "what()" in line]
        errors = list(dict.fromkeys(re.sub(r" \(\S+:\d+\)$", "", line)  # drop (file:line)
                                    for line in errors))
        return {"failed": " | ".join((errors or text)[-4:])}
    return peer.results(work, log)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peer-src", default=None,
                    help="a checkout of github.com/mir-group/pair_nequip_allegro (not on PyPI); "
                         "without it only pair_style torch runs")
    ap.add_argument("--lmp", default=os.path.join(ROOT, "build", "lmp"))
    ap.add_argument("--ckpt", default=CKPT, help="a nequip-train checkpoint (default: nequip_sic)")
    ap.add_argument("--cells", type=int, nargs="+", default=[2, 4, 8],
                    help="conventional cells per side (8 n^3 atoms)")
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2],
                    help="torch rank counts; more than 1 only at the largest size")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--pairs", type=int, default=1)
    ap.add_argument("--peer-model", choices=["auto", "pt2", "pth"], default="auto",
                    help="nequip-compile output for pair_nequip: AOTInductor package, TorchScript, "
                         "or the package with TorchScript if it fails to run (default)")
    ap.add_argument("--smoke", action="store_true", help="64 atoms, 1 step, 1 and 2 ranks")
    ap.add_argument("--compiled", default=None,
                    help="also run this compiled package of the imported model (mltorch-compile of "
                         "`mltorch-import nequip CKPT --dtype float64`, about 6 minutes on 2 cores), "
                         "against pair_nequip's own compiled model")
    args = ap.parse_args()
    if args.smoke:
        args.cells, args.ranks, args.steps, args.pairs = [2], [1, 2], 1, 1
    lmp = os.path.abspath(args.lmp)
    ckpt = os.path.abspath(args.ckpt)
    build = os.path.dirname(lmp)
    failures = 0
    plugin = deployed = None
    if args.peer_src:
        src = os.path.abspath(args.peer_src)
        missing = [f for f in PEER_FILES if not os.path.exists(os.path.join(src, f))]
        if missing:
            raise SystemExit(f"bench/nequip.py: --peer-src {src} has no {' '.join(missing)} "
                             "(expected a checkout of mir-group/pair_nequip_allegro)")
        print(f"building pair_style nequip from {src} (cached):", flush=True)
        plugin = build_nequip(build, src)
        print("nequip-compile of the checkpoint for pair_nequip (cached):", flush=True)
        kind = "pth" if args.peer_model == "pth" else "pt2"
        deployed = peer_model(ckpt, kind)
        if deployed is None and args.peer_model == "auto":
            kind, deployed = "pth", peer_model(ckpt, "pth")
        if deployed is None:
            failures += 1
    else:
        print("peer not given (--peer-src, a checkout of mir-group/pair_nequip_allegro): "
              "running pair_style torch only", flush=True)
    tmp = tempfile.mkdtemp(prefix="bench-nequip-")
    model = ours(ckpt, tmp)
    load = f"plugin load {plugin}" if plugin else ""
    print(f"{'atoms':>6} {'ranks':>5} {'nequip s/step':>13} {'torch s/step':>13} "
          f"{'torch atom-steps/s':>18} {'nequip/torch':>12} {'max |dF| eV/A':>13}  nequip", flush=True)
    largest = max(args.cells)
    for cells in args.cells:
        atoms = 8 * cells ** 3
        peer1 = None  # nequip on 1 rank at this size (forces, median step): for the 2-rank rows
        for ranks in args.ranks:
            if ranks > 1 and cells != largest and not args.smoke:
                continue
            ratios, te, tt, note, df = [], [], [], "", float("nan")
            for _ in range(args.pairs):
                e = {"failed": "not run"}
                if deployed:
                    e = run_once(lmp, "nequip", deployed, load, cells, ranks, args.steps, tmp)
                    if "failed" in e and ranks == 1 and deployed.endswith(".pt2") \
                            and args.peer_model == "auto":
                        print(f"  nequip with the AOTInductor package failed: {e['failed']}\n"
                              "  falling back to TorchScript", flush=True)
                        deployed = peer_model(ckpt, "pth")
                        e = run_once(lmp, "nequip", deployed, load, cells, ranks, args.steps, tmp) \
                            if deployed else {"failed": "no TorchScript file"}
                t = run_once(lmp, "torch", model, "", cells, ranks, args.steps, tmp)
                if "failed" in t:
                    print(f"torch failed: {t['failed']}")
                    failures += 1
                    break
                tt.append(t["step"])
                if ranks == 1 and "step" in e:
                    peer1 = dict(e)
                ref = e if "step" in e else peer1
                if args.compiled:
                    c = run_once(lmp, "torch", os.path.abspath(args.compiled), "", cells, ranks,
                                 args.steps, tmp)
                    if "failed" in c:
                        print(f"compiled failed: {c['failed']}")
                        failures += 1
                    else:
                        print(f"  compiled: {c['step']:.3f} s/step, {atoms / c['step']:.1f} atom-steps/s"
                              + (f", nequip/compiled {ref['step'] / c['step']:.2f}" if ref else "")
                              + (f", max |dF| vs nequip {float(np.abs(ref['forces'] - c['forces']).max()):.2g}"
                                 if ref else ""), flush=True)
                if "failed" in e:
                    if not deployed:
                        note = "peer not given" if not args.peer_src else "no nequip model"
                    else:
                        note = "failed: " + e["failed"][:120]
                        if ranks == 1:
                            failures += 1
                if ref is None:
                    continue
                if ref is not e:
                    note += "; ratio, dF vs nequip on 1 rank"
                te.append(ref["step"])
                ratios.append(ref["step"] / t["step"])
                df = float(np.abs(ref["forces"] - t["forces"]).max())
                if abs(ref["pe"] - t["pe"]) > 1e-8 * max(1.0, abs(ref["pe"])) and " pe " not in note:
                    note += f" pe {ref['pe']:.12g} vs {t['pe']:.12g} eV (torch)"
            if ranks == 1 and peer1 and te:
                peer1["step"] = statistics.median(te)
            e_col = f"{statistics.median(te):13.3f}" if te else f"{'-':>13}"
            r_col = f"{statistics.median(ratios):12.2f}" if ratios else f"{'-':>12}"
            if tt:
                print(f"{atoms:6d} {ranks:5d} {e_col} {statistics.median(tt):13.3f} "
                      f"{atoms / statistics.median(tt):18.1f} {r_col} {df:13.2g}  {note.strip()}",
                      flush=True)
            if te and not df < 1e-8:
                print(f"  forces differ by {df:.3g} eV/A (float64 on both sides)")
                failures += 1
    if deployed:
        print(f"nequip ran {os.path.basename(deployed)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
