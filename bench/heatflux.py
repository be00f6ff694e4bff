#!/usr/bin/env python3
"""Cost of the exact atomic virial (bench/RESULTS.md, "Heat flux").

  .venv/bin/python bench/heatflux.py [--atoms-per-side 8] [--steps 20] [--rounds 3] [--ranks 1 2]
                                     [--kinds plain idle flux] [--split]

For a model on 8^3 x 8 = 4096 Si atoms (diamond, 1200 K), three runs of the
same NVE steps, in turn (A B C A B C ...; these machines are noisy):
  plain     no per-atom output
  idle      compute heat/flux (centroid/stress/atom) defined and not used;
            thermo output only at the end of the run (LAMMPS asks every
            per-atom compute on thermo steps): the extra must be that one
            step
  flux      the heat flux printed on every step: every step computes the
            atomic virial (four backward passes instead of one)
and prints the median loop times and the ratios flux/plain and idle/plain,
per model (si_mp2: 2 message-passing layers; si_local: local) and rank count.

--split: instead, the model's own forward and backward times in Python (one
thread, the same block of atoms as a cluster, median of --rounds), and what
they set as the least an atomic-virial step can cost against a plain one
with four reverse passes instead of one: (F + 4 B) / (F + B); then the four
reverse passes one by one and batched as one (vmap, is_grads_batched), and
what the batched one would make a step cost.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import time

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(here)
lmp = os.path.join(root, "build", "lmp")
potentials = os.path.join(root, "potentials")


def script(model, n, steps, kind):
    lines = ["units metal", "lattice diamond 5.431", f"region box block 0 {n} 0 {n} 0 {n}",
             "create_box 1 box", "create_atoms 1 box", "mass 1 28.0855",
             "velocity all create 1200 4928 loop geom", "pair_style torch",
             f"pair_coeff * * {model if os.path.isabs(model) else os.path.join(potentials, model)} Si", "neighbor 1.0 bin", "fix md all nve"]
    if kind != "plain":
        lines += ["compute ke all ke/atom", "compute pe all pe/atom",
                  "compute cv all centroid/stress/atom NULL virial", "compute flux all heat/flux ke pe cv"]
    if kind == "flux":
        lines += ["thermo_style custom step pe c_flux[1] c_flux[2] c_flux[3]", "thermo 1"]
    else:
        # LAMMPS asks every per-atom compute on thermo steps: output at the
        # end of the run only (one such step in the loop)
        lines += ["thermo 1000000"]
    lines += ["run 1 post no", f"run {steps} post no"]
    return "\n".join(lines) + "\n"


def loop_time(model, n, steps, kind, ranks):
    cmd = [lmp, "-log", "none", "-echo", "none", "-nocite"]
    if ranks > 1:
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(ranks)] + cmd
    out = subprocess.run(cmd, input=script(model, n, steps, kind), capture_output=True, text=True,
                         env=dict(os.environ, OMP_NUM_THREADS="1"), check=True)
    times = re.findall(r"Loop time of ([0-9.eE+-]+)", out.stdout)
    return float(times[-1])


def split(model, n, rounds):
    """forward F and backward B of the model on the block of 8 n^3 atoms"""
    import torch
    from torchscript_tuning import silicon    # the same perturbed diamond block (puts python/ on the path)
    from mltorch.graph import build_graph, edge_vectors
    torch.set_num_threads(1)
    path = model if os.path.isabs(model) else os.path.join(potentials, model)
    files = {"mltorch_metadata.json": ""}
    net = torch.jit.load(path, map_location="cpu", _extra_files=files)
    meta = json.loads(files["mltorch_metadata.json"])
    pos, cell = silicon(n)
    graph = build_graph(pos, cell, torch.zeros(len(pos), dtype=torch.int64), float(meta["cutoff"]),
                        pbc=(False, False, False))
    dtype = getattr(torch, meta.get("dtype", "float64"))
    x = pos.to(dtype).requires_grad_(True)
    # the four cotangents of an atomic-virial step: E's and the moments X_a's
    w = torch.stack([torch.ones(len(pos), dtype=dtype)] + [x.detach()[:, a] for a in range(3)])
    f, b, four, batched = [], [], [], []
    for _ in range(rounds + 1):   # the first round warms up
        t0 = time.perf_counter()
        e = net(edge_vectors(graph, x, cell.to(dtype)), graph.edge_index, graph.species, graph.n_local)
        t1 = time.perf_counter()
        torch.autograd.grad(e.sum(), x, retain_graph=True)
        t2 = time.perf_counter()
        one_by_one = [torch.autograd.grad(e, x, w[k], retain_graph=True)[0] for k in range(4)]
        t3 = time.perf_counter()
        # the same four as one batched reverse pass (PyTorch's vmap over
        # the vector-Jacobian product; LibTorch's C++ API has no such call)
        at_once = torch.autograd.grad(e, x, w, is_grads_batched=True)[0]
        t4 = time.perf_counter()
        for k in range(4):
            assert torch.allclose(at_once[k], one_by_one[k], rtol=1e-5, atol=1e-6 * float(one_by_one[k].abs().max()))
        f.append(t1 - t0)
        b.append(t2 - t1)
        four.append(t3 - t2)
        batched.append(t4 - t3)
        del e, one_by_one, at_once    # free the retained graph outside the timed forward pass
    F, B = statistics.median(f[1:]), statistics.median(b[1:])
    B4, Bv = statistics.median(four[1:]), statistics.median(batched[1:])
    print(f"| {os.path.basename(model)} | {8 * n ** 3} | {F:.3f} | {B:.3f} | {B / F:.2f} | {(F + 4 * B) / (F + B):.2f} "
          f"| {B4:.3f} | {Bv:.3f} | {(F + Bv) / (F + B):.2f} |", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--atoms-per-side", type=int, default=8)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    p.add_argument("--models", nargs="+", default=["si_mp2.pt", "si_local.pt"],
                   help="model files (in potentials/, or paths)")
    p.add_argument("--kinds", nargs="+", default=["plain", "idle", "flux"], choices=["plain", "idle", "flux"])
    p.add_argument("--split", action="store_true", help="the models' forward and backward times instead")
    a = p.parse_args()
    n = a.atoms_per_side
    if a.split:
        print("| model | atoms | forward F s | backward B s | B/F | least (F + 4B)/(F + B) "
              "| 4 backward s | 4 batched s | (F + batched)/(F + B) |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for model in a.models:
            split(os.path.abspath(model) if os.path.exists(model) else model, n, a.rounds)
        return
    print(f"{8 * n ** 3} atoms, {a.steps} steps a run, {a.rounds} rounds (A B C in turn); "
          "median loop times")
    print("| model | atoms | ranks | plain s | idle s | flux s | idle/plain | flux/plain | idle extra in flux steps |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for model in a.models:
        for ranks in a.ranks:
            t = {k: [] for k in a.kinds}
            for _ in range(a.rounds):
                for kind in t:
                    t[kind].append(loop_time(model, n, a.steps, kind, ranks))
            m = {k: statistics.median(t[k]) if k in t else float("nan") for k in ("plain", "idle", "flux")}
            # the idle run's extra time in units of one atomic-virial step's
            # extra cost: 1.0 = the last step's thermo output alone
            per = (m["flux"] - m["plain"]) / (a.steps + 0.0)
            extra = (m["idle"] - m["plain"]) / per if per > 0 else float("nan")
            print(f"| {os.path.basename(model)} | {8 * n ** 3} | {ranks} | {m['plain']:.3f} | {m['idle']:.3f} | {m['flux']:.3f} | "
                  f"{m['idle'] / m['plain']:.3f} | {m['flux'] / m['plain']:.3f} | {extra:.2f} |", flush=True)


if __name__ == "__main__":
    main()
