#!/usr/bin/env python3
"""What each tuning of the TorchScript path is worth, one change at a time, in one process.

    .venv/bin/python bench/torchscript_tuning.py [--model si_local] [--cells 8] [--reps 7] [--smoke]

The graph is what pair_style torch builds for a perturbed diamond Si crystal
(8 n^3 atoms; n = 8: 4,096) on one rank: the owned atoms, their periodic
images as ghost nodes, edges from every node within the model's reach of an
owned atom.  Each variant computes the energy of the owned atoms and its
gradient with respect to the edge vectors, the work of one MD step; the
variants run in turn (round robin) and the table gives the median time of
each and its speed-up over the previous line and over the first:

  1. as before this tuning: the model's parameters require gradients (autograd
     keeps what a weight gradient would need), the model computes energies for
     every node (n_local = N), all node energies go to the host and are summed there
  2. + energies for the owned atoms only (n_local)
  3. + no parameter gradients during MD (what pair_style torch now does)
  4. + torch.jit.freeze of the module (parameters folded into the graph)
  5. + a dynamic fusion strategy (torch.jit.set_fusion_strategy DYNAMIC)
  6. the compiled package (potentials/<model>.pt2)
  7. and 8. lines 3 and 6 with glibc keeping large freed blocks (mallopt),
     as pair_style torch sets it: no mmap/munmap and page faults per call

pair_style torch adopts 2, 3 and the on-device energy sum; 4 and 5 are
measured and not adopted when they gain nothing (see bench/tuning.md).
"""

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
import warnings

import torch

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(here)
sys.path.insert(0, os.path.join(root, "python"))
warnings.filterwarnings("ignore")

from mltorch.graph import build_graph, edge_vectors  # noqa: E402


def silicon(cells, seed=4242):
    a = 5.431
    basis = torch.tensor([[0, 0, 0], [0, .5, .5], [.5, 0, .5], [.5, .5, 0], [.25, .25, .25], [.25, .75, .75],
                          [.75, .25, .75], [.75, .75, .25]], dtype=torch.float64)
    grid = torch.stack(torch.meshgrid(*[torch.arange(cells)] * 3, indexing="ij"), -1).reshape(-1, 3).double()
    pos = ((grid[:, None, :] + basis[None]) * a).reshape(-1, 3)
    gen = torch.Generator().manual_seed(seed)
    pos = pos + 0.05 * torch.randn(pos.shape, generator=gen, dtype=torch.float64)
    cell = torch.eye(3, dtype=torch.float64) * a * cells
    return pos, cell


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="si_local")
    ap.add_argument("--cells", type=int, default=8)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", default=os.path.join(here, "tuning.md"))
    args = ap.parse_args()
    cells, reps = (2, 1) if args.smoke else (args.cells, args.reps)
    torch.set_num_threads(1)
    path = os.path.join(root, "potentials", args.model + ".pt")
    from mltorch.export import read_metadata
    meta = read_metadata(path)
    layers = meta["num_interaction_layers"]
    pos, cell = silicon(cells)
    g = build_graph(pos, cell, torch.zeros(pos.shape[0], dtype=torch.int64), meta["cutoff"], layers)
    vec = edge_vectors(g, pos, cell).detach()
    index, species, n_local, n_nodes = g.edge_index, g.species, g.n_local, g.species.shape[0]

    def load(grad):
        m = torch.jit.load(path)
        for p in m.parameters():
            p.requires_grad_(grad)
        return m.eval()

    def run(module, count_all, host_sum):
        def step():
            v = vec.clone().requires_grad_(True)
            e = module(v, index, species, n_nodes if count_all else n_local)[:n_local]
            (grad,) = torch.autograd.grad(e.sum(), [v])
            if host_sum:
                return float(sum(e.detach().tolist()))
            return float(e.detach().sum())
        return step

    variants = [("1. before: parameters require grad, all nodes, host sum", run(load(True), True, True)),
                ("2. + energies of owned atoms only", run(load(True), False, True)),
                ("3. + no parameter gradients, energy summed on the device", run(load(False), False, False)),
                ("4. + torch.jit.freeze", run(torch.jit.freeze(load(False)), False, False))]
    pt2 = os.path.join(root, "potentials", args.model + ".pt2")
    if os.path.exists(pt2):
        runner = torch._inductor.aoti_load_package(pt2)
        module = load(False)
        state = [t.detach() for t in list(module.parameters()) + list(module.buffers())]

        def compiled():
            e, grad = runner(vec, index, species, species[:n_local], *state)
            return float(e.sum())
        variants.append(("6. compiled package (.pt2)", compiled))
    times = {name: [] for name, _ in variants}
    energies = {}
    for name, f in variants:    # warm-up (the profiling executor specialises on its first calls)
        for _ in range(3):
            energies[name] = f()
    for _ in range(reps):
        for name, f in variants:
            t = time.perf_counter()
            f()
            times[name].append(time.perf_counter() - t)
    # the fusion strategy is process-wide: measured last, on a fresh module
    torch.jit.set_fusion_strategy([("DYNAMIC", 2)])
    fused = run(load(False), False, False)
    for _ in range(3):
        fused()
    name5 = "5. + dynamic fusion strategy (no freeze)"
    times[name5] = []
    plain = variants[2][1]
    check = []
    for _ in range(reps):
        t = time.perf_counter()
        fused()
        times[name5].append(time.perf_counter() - t)
        t = time.perf_counter()
        plain()
        check.append(time.perf_counter() - t)
    # glibc keeping large freed blocks (what pair_style torch sets, process-wide): last
    import ctypes
    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(-3, ctypes.c_int(1 << 30))    # M_MMAP_THRESHOLD
    libc.mallopt(-1, ctypes.c_int(1 << 30))    # M_TRIM_THRESHOLD
    name7 = "7. line 3 + glibc keeps large freed blocks (pair_style torch sets it)"
    name8 = "8. line 6 + glibc keeps large freed blocks"
    kept = [(name7, variants[2][1])] + ([(name8, variants[4][1])] if len(variants) > 4 else [])
    for name, f in kept:
        times[name] = []
        for _ in range(3):
            f()
    for _ in range(reps):
        for name, f in kept:
            t = time.perf_counter()
            f()
            times[name].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    first = med[variants[0][0]]
    spread = max(abs(e - energies[variants[0][0]]) for e in energies.values())
    lines = [f"# TorchScript tuning, one change at a time (bench/torchscript_tuning.py)\n",
             f"{datetime.date.today()}, {platform.node()}, torch {torch.__version__}, 1 thread; model "
             f"{args.model}, {n_local} atoms, {n_nodes} nodes, {index.shape[1]} edges; energy + gradient "
             f"per call, median of {reps} round-robin calls (energies agree to {spread:.1e} eV)\n",
             "| variant | ms | vs line 1 |", "| --- | --- | --- |"]
    names = [name for name, _ in variants]
    for name in names[:4] + [name5] + names[4:] + [name for name, _ in kept]:
        lines.append(f"| {name} | {1e3 * med[name]:.1f} | {first / med[name]:.2f} |")
    lines.append(f"\nLine 5 was measured after the others with the fusion strategy set for the process; "
                 f"line 3 measured alongside it then: {1e3 * statistics.median(check):.1f} ms.")
    lines.append(f"\nCommand: `.venv/bin/python bench/torchscript_tuning.py --model {args.model} "
                 f"--cells {cells} --reps {reps}`")
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.smoke:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
