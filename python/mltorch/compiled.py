"""mltorch-compile: compile an ML-TORCH model file into an AOTInductor package (.pt2).

    mltorch-compile model.pt [-o model.pt2] [--device cpu|cuda] [--threads N] [--source FILE]

The package holds three things:
  - the compiled energy-and-gradient function: inputs (edge_vectors [E, 3],
    edge_index [2, E], species [N], local_species [n_local], *state), outputs
    (node energies [n_local], dE/dr_ij [E, 3]).  The backward pass is part of
    the compiled graph (traced with make_fx, rewritten by two passes that
    change how Inductor lays out and computes it, not what it computes:
    realize_gather_sources, unroll_small_bmm; exported with dynamic E, N and
    n_local, compiled by AOTInductor).  The parameters and buffers (`state`)
    are inputs, not constants, so the package holds no weights: a model that
    fix torch/finetune updates reaches the compiled code on the next step
    without a reload or a recompile.
  - mltorch/model.pt, the TorchScript model file it was made from (the "twin"): its parameters,
    metadata and autograd graph serve training, restart and model saves.
  - extra/mltorch_compiled.json: device, threads, state order, torch version.
  - for a layered model (mltorch.layered), mltorch/stages/NAME.pt2: every
    stage compiled on its own, each an AOTInductor package: embed_fwd,
    embed_vjp, inter_fwd_K, inter_vjp_K (K = 0 .. L-2) and readout. A `_fwd`
    stage returns its output, a `_vjp` stage the vector-Jacobian product of
    its last graph input `gout` (by h and by the edge vectors, recomputing the
    stage), readout the energies and their gradient by h. pair_style torch
    chains them with the halo exchange between them.

`pair_style torch` recognises a package by its content, whatever the file
is called.  The compiled code is specific to the machine's instruction set
(-march=native) and to the LibTorch version: compile where you run.
"""

import argparse
import math
import os
import sys
import tempfile
import warnings

import torch

from .export import DTYPES, ExportError, read_metadata
from .graph_passes import energy_and_gradient, example_graph
from .packaging import COMPILED_FORMAT, write_package
from .rebuild import rebuild
from .stages import model_state, stage_args, stage_functions
# what other modules and tools import from here (mltorch-compile's module)
from .graph_passes import realize_gather_sources, unroll_small_bmm  # noqa: F401,E402
from .packaging import (COMPILED_NAME, GRAPH_PASSES, STAGE_DIR, TWIN_NAME, read_package,  # noqa: F401,E402
                        try_read_package)
from .rebuild import architecture_class  # noqa: F401,E402

__all__ = ["compile_model", "compile_file", "main", "DEFAULT_SIMDLEN", "realize_gather_sources",
           "unroll_small_bmm", "COMPILED_NAME", "GRAPH_PASSES", "STAGE_DIR", "TWIN_NAME", "read_package",
           "try_read_package", "architecture_class", "rebuild"]


DEFAULT_SIMDLEN = 256


def compile_model(module, twin_path, out_path, *, device="cpu", threads=1, check=True,
                  simdlen=DEFAULT_SIMDLEN):
    """Compile `module` (eager, the same parameters as the TorchScript file `twin_path`)."""
    meta = read_metadata(twin_path)
    dtype = DTYPES[meta["dtype"]]
    if device not in ("cpu", "cuda"):
        raise ExportError(f"device must be cpu or cuda, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ExportError("compiling for CUDA needs a visible CUDA device and a CUDA build of torch; "
                          "run mltorch-compile on the GPU node")
    if int(threads) < 1:
        raise ExportError("threads must be >= 1")
    if simdlen not in (0, 128, 256, 512):
        raise ExportError(f"simdlen must be 0 (no vectors), 128, 256 or 512 bits, got {simdlen!r}")
    dev = torch.device(device)
    module = module.to(dev, dtype).eval()
    # a wrapper of another framework's modules may need to make them exportable
    # (e.g. mltorch.importers.sevenn); it says so with prepare_export()
    if hasattr(module, "prepare_export"):
        module.prepare_export()
    for p in module.parameters():
        p.requires_grad_(False)
    names, state = model_state(module)
    forbidden = {2, 3} | {d for t in state for d in t.shape}
    vec, index, species, n_local = example_graph(float(meta["cutoff"]), len(meta["elements"]), dtype,
                                                  forbidden)
    args = (vec.to(dev), index.to(dev), species.to(dev), species[:n_local].to(dev), *state)
    f = energy_and_gradient(module, names)

    from torch.export import Dim
    from torch.fx.experimental.proxy_tensor import make_fx

    configs = {"cpp.simdlen": simdlen} if device == "cpu" else {}

    def compile_one(fn, example, dynamic, path):
        try:
            gm = make_fx(fn, tracing_mode="symbolic")(*example)
            realize_gather_sources(gm)
            unroll_small_bmm(gm)    # after: it leaves its new nodes without shape metadata
            program = torch.export.export(gm, example, dynamic_shapes=dynamic + tuple(None for _ in state),
                                          strict=False)
        except Exception as e:
            raise ExportError(
                "the model cannot be exported with dynamic edge and node counts (torch.export): "
                f"{str(e).splitlines()[0]}. Avoid Python control flow on tensor values and "
                "shapes that depend on data other than the graph sizes (see doc/models.md)")
        return torch._inductor.aoti_compile_and_package(program, package_path=path,
                                                        inductor_configs=configs)

    layers = int(meta["num_interaction_layers"])
    widths = meta.get("layered", {}).get("feature_widths")
    stages = stage_functions(module, names, layers) if widths else {}
    old_threads = torch.get_num_threads()
    torch.set_num_threads(int(threads))    # the generated CPU code runs this many OpenMP threads
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with tempfile.TemporaryDirectory() as tmp:
                edges, nodes, local = Dim("edges", min=2), Dim("nodes", min=2), Dim("local", min=1)
                raw = compile_one(f, args, ({0: edges}, {1: edges}, {0: nodes}, {0: local}),
                                  os.path.join(tmp, "model.pt2"))
                if check:
                    _check(raw, f, state, dtype, dev, forbidden, meta)
                # a layered model: each stage compiled on its own (forward, and
                # vector-Jacobian product), chained by pair_style torch with the
                # halo exchange between them
                stage_files = {}
                all_widths = list(widths or [])
                if stages:
                    h0 = stages["embed_fwd"](*(t.to(dev) for t in (vec, index, species, species[:n_local])), *state)
                    all_widths = list(widths)
                    h = h0
                    for k in range(layers - 1):
                        h_all = torch.zeros(species.shape[0], widths[k], dtype=dtype, device=dev)
                        h = stages[f"inter_fwd_{k}"](h_all, vec.to(dev), index.to(dev), species.to(dev),
                                                     species[:n_local].to(dev), *state)
                    all_widths.append(int(h.shape[1]))
                    forbidden = forbidden | set(all_widths)
                    vec, index, species, n_local = example_graph(float(meta["cutoff"]), len(meta["elements"]),
                                                                  dtype, forbidden)
                for name, fn in stages.items():
                    example, dynamic = stage_args(name, vec, index, species, n_local, all_widths, dev)
                    path = compile_one(fn, example + tuple(state), dynamic, os.path.join(tmp, name + ".pt2"))
                    if check:
                        _check_stage(path, fn, name, state, dtype, dev, forbidden, meta, all_widths)
                    stage_files[name] = path
                info = {"compiled_format": COMPILED_FORMAT, "device": device, "threads": int(threads),
                        "simdlen": simdlen if device == "cpu" else None,
                        "torch_version": torch.__version__, "state_names": names,
                        "graph_passes": GRAPH_PASSES,
                        "dtype": meta["dtype"], "twin_content_hash": meta.get("content_hash", "")}
                if stages:
                    info["stages"] = list(stages)
                with open(twin_path, "rb") as fh:
                    twin = fh.read()
                write_package(raw, out_path, twin, info, stage_files)
    finally:
        torch.set_num_threads(old_threads)
    return info


def _check_stage(raw, fn, name, state, dtype, dev, forbidden, meta, widths):
    """A compiled stage equals its eager function on a graph of other sizes."""
    runner = torch._inductor.aoti_load_package(raw)
    vec, index, species, n_local = example_graph(float(meta["cutoff"]), len(meta["elements"]), dtype,
                                                  forbidden, seed=11)
    example, _ = stage_args(name, vec, index, species, n_local, widths, dev)
    want = fn(*example, *state)
    got = runner(*example, *state)
    want = want if isinstance(want, (tuple, list)) else (want,)
    got = got if isinstance(got, (tuple, list)) else (got,)
    tol = 1e-4 if dtype == torch.float32 else 1e-10
    for a, b in zip(want, got):
        scale = max(1.0, float(a.abs().max()))
        err = float((a - b).abs().max())
        if not math.isfinite(err) or err > tol * scale:
            raise ExportError(f"the compiled stage {name} differs from the eager model by {err:.3g} "
                              f"(tolerance {tol * scale:.3g})")


def _check(raw, f, state, dtype, dev, forbidden, meta):
    """The compiled function must equal the eager one on a graph of other sizes."""
    runner = torch._inductor.aoti_load_package(raw)
    vec, index, species, n_local = example_graph(float(meta["cutoff"]), len(meta["elements"]), dtype,
                                                  forbidden, seed=11)
    args = (vec.to(dev), index.to(dev), species.to(dev), species[:n_local].to(dev), *state)
    e0, g0 = f(*args)
    e1, g1 = runner(*args)
    tol = 1e-4 if dtype == torch.float32 else 1e-10
    for what, a, b in (("node energies", e0, e1), ("gradients", g0, g1)):
        scale = max(1.0, float(a.abs().max()))
        err = float((a - b).abs().max())
        if not math.isfinite(err) or err > tol * scale:
            raise ExportError(f"the compiled {what} differ from the eager model's by {err:.3g} "
                              f"(tolerance {tol * scale:.3g})")




def compile_file(path, out_path, *, device="cpu", threads=1, simdlen=DEFAULT_SIMDLEN, source=None):
    """Compile a model file (TorchScript .pt, or a package to recompile) into `out_path`.
    `source`: the framework file an imported model is rebuilt from (rebuild())."""
    twin, _ = try_read_package(path)
    if twin is not None:    # a package: recompile its twin (e.g. for another device)
        with tempfile.TemporaryDirectory() as tmp:
            pt = os.path.join(tmp, "twin.pt")
            with open(pt, "wb") as fh:
                fh.write(twin)
            module, _ = rebuild(pt, source, label=f"{path} ({TWIN_NAME})")
            return compile_model(module, pt, out_path, device=device, threads=threads, simdlen=simdlen)
    module, _ = rebuild(path, source)
    return compile_model(module, path, out_path, device=device, threads=threads, simdlen=simdlen)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="mltorch-compile", description=__doc__.splitlines()[0])
    parser.add_argument("model", help="model file (.pt from mltorch.export or fix torch/finetune)")
    parser.add_argument("-o", "--output", help="package to write (default: the model name with .pt2)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--threads", type=int, default=1,
                        help="OpenMP threads of the generated CPU code (default 1: one MPI rank per core)")
    parser.add_argument("--simdlen", type=int, default=DEFAULT_SIMDLEN, choices=(0, 128, 256, 512),
                        help=f"vector width in bits of the generated CPU code (default {DEFAULT_SIMDLEN})")
    parser.add_argument("--source", default=None,
                        help="for an imported model (mltorch-import): the framework file it was "
                             "imported from, used instead of the path its metadata records (the "
                             "framework's loader unpickles it, which runs code: name one you "
                             "trust)")
    args = parser.parse_args(argv)
    out = args.output or os.path.splitext(args.model)[0] + ".pt2"
    try:
        info = compile_file(args.model, out, device=args.device, threads=args.threads,
                            simdlen=args.simdlen, source=args.source)
    except (ValueError, OSError) as e:    # ExportError, an importer's ImportFailed
        print(f"mltorch-compile: ERROR: {e}", file=sys.stderr)
        return 1
    print(f"{out}: compiled for {info['device']} ({info['threads']} thread(s)), "
          f"{len(info['state_names'])} state tensors, torch {info['torch_version']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
