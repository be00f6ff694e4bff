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
import importlib
import json
import math
import os
import sys
import tempfile
import warnings
import zipfile

import torch

from .export import DTYPES, OWN_PACKAGE, ExportError, read_metadata

COMPILED_NAME = "mltorch_compiled.json"    # under the archive's extra/ folder
TWIN_NAME = "mltorch/model.pt"              # the TorchScript twin (binary: not under extra/,
                                            # which torch's own loader decodes as text)
COMPILED_FORMAT = 1
STAGE_DIR = "mltorch/stages"                # compiled stages of a layered model (each a package)
GRAPH_PASSES = 1                            # version of the passes run on the traced graph before
                                            # Inductor (1: realize_gather_sources, unroll_small_bmm);
                                            # a package made with older passes is right but slower


def architecture_class(name, label="the model file"):
    """The class that a model file's metadata names (`architecture.class`), if it
    is one of ML-TORCH's own: a public torch.nn.Module subclass defined in a
    module under `mltorch.` (mltorch.models, mltorch.analytic, mltorch.layered,
    mltorch.importers.*). Anything else (os.system, subprocess.Popen, a class of
    another package) is refused with an ExportError (a ValueError) before its
    module is imported or anything is called: a model file is data, not code."""
    def refused(why):
        return ExportError(
            f"{label}: its metadata names the architecture class {name!r}, which {why}: a model "
            f"file may only name ML-TORCH's own classes (torch.nn.Module subclasses defined in the "
            f"{OWN_PACKAGE} package, such as {OWN_PACKAGE}.models.LocalMBNet); it was not called")
    if not isinstance(name, str):
        raise refused("is not a class path")
    module_name, _, cls_name = name.rpartition(".")
    parts = module_name.split(".")
    if parts[0] != OWN_PACKAGE or len(parts) < 2 or not all(q.isidentifier() for q in parts):
        raise refused(f"is not in a module of the {OWN_PACKAGE} package")
    if not cls_name.isidentifier() or cls_name.startswith("_"):
        raise refused("is not a public class name")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ExportError(f"{label}: cannot import the architecture {name}: {e}")
    cls = getattr(module, cls_name, None)
    if cls is None:
        raise ExportError(f"{label}: cannot import the architecture {name}: "
                          f"{module_name} has no {cls_name}")
    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        raise refused("is not a torch.nn.Module class")
    if not cls.__module__.startswith(OWN_PACKAGE + "."):
        raise refused(f"is defined in {cls.__module__}, not in the {OWN_PACKAGE} package")
    return cls


def rebuild(path, source=None, label=None):
    """The eager module of a model file, from its recorded architecture and parameters.

    The class must be ML-TORCH's own (architecture_class). An importer's class
    (mltorch.importers.*) is rebuilt from the framework file the model was
    imported from, which the framework's loader unpickles (torch.load with
    weights_only=False): that file runs whatever code it holds. `source` (what
    the user names, mltorch-compile --source) replaces the path recorded in
    the metadata; without it the recorded path is used and a note on stderr
    says so before it is loaded. `label` names the file in messages."""
    label = label or path
    meta = read_metadata(path)
    arch = meta.get("architecture")
    if not isinstance(arch, dict) or "class" not in arch:
        raise ExportError(
            f"{label} does not record its architecture (metadata 'architecture'), so its eager "
            "module cannot be rebuilt: export it with mltorch.export(..., architecture=kwargs), or "
            "call mltorch.compiled.compile_model() with the eager module")
    cls = architecture_class(arch["class"], label)
    kwargs = arch.get("kwargs", {})
    if not isinstance(kwargs, dict):
        raise ExportError(f"{label}: its metadata's architecture.kwargs is not a JSON object")
    kwargs = dict(kwargs)
    key = getattr(cls, "SOURCE_ARGUMENT", None)    # the framework file an importer unpickles
    if source is not None:
        if key is None:
            raise ExportError(f"--source {source}: {label} ({arch['class']}) is not an imported "
                              "model, it is rebuilt from no framework file")
        kwargs[key] = os.path.abspath(source) if os.path.exists(source) else source
    elif key is not None and kwargs.get(key) is not None \
            and kwargs[key] not in getattr(cls, "INSTALLED_SOURCES", ()):
        print(f"mltorch: note: {label} was imported from {kwargs[key]!r} (recorded in its "
              f"metadata, architecture.kwargs.{key}); rebuilding {arch['class']} loads that file "
              "with the framework's own loader, which unpickles it (torch.load with "
              "weights_only=False) and so runs any code it holds. Compile only model files "
              "whose source you trust, or name the source yourself "
              "(mltorch-compile --source FILE).",
              file=sys.stderr, flush=True)
    # in the file's dtype before the parameters are loaded: load_state_dict
    # copies into the existing tensors, and float32 ones would round them
    module = cls(**kwargs).to(DTYPES[meta["dtype"]])
    scripted = torch.jit.load(path, map_location="cpu")
    try:
        module.load_state_dict(scripted.state_dict())
    except RuntimeError as e:
        raise ExportError(f"{label}: its parameters do not fit {arch['class']}"
                          f"({kwargs}): {str(e).splitlines()[0]}")
    return module.to(DTYPES[meta["dtype"]]).eval(), meta


def _example_graph(cutoff, n_species, dtype, forbidden, seed=7):
    """A random cluster of 41 nodes, 29 of them local, whose sizes collide with no
    other dimension (symbolic tracing would otherwise tie them together)."""
    gen = torch.Generator().manual_seed(seed)
    n, n_local = 41, 29
    pos = torch.rand(n, 3, generator=gen, dtype=torch.float64) * (1.6 * cutoff)
    species = torch.arange(n) % n_species
    ii, jj = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
    mask = ii != jj
    ii, jj = ii[mask], jj[mask]
    vec = pos[jj] - pos[ii]
    keep = (vec.norm(dim=1) < cutoff) & (vec.norm(dim=1) > 0.3 * cutoff)
    vec, index = vec[keep], torch.stack([ii[keep], jj[keep]])
    forbidden = set(forbidden) | {n, n_local}
    e = vec.shape[0]
    while e in forbidden or e < 3:
        e -= 1
    return vec[:e].to(dtype).contiguous(), index[:, :e].contiguous(), species, n_local


def energy_and_gradient(module, names):
    """f(edge_vectors, edge_index, species, local_species, *state) -> (node energies, dE/dr)."""

    def f(edge_vectors, edge_index, species, local_species, *state):
        n_local = local_species.shape[0]
        with torch.enable_grad():
            v = edge_vectors.detach().requires_grad_(True)
            e = torch.func.functional_call(module, dict(zip(names, state)),
                                           (v, edge_index, species, n_local))
            e = e[:n_local]
            (g,) = torch.autograd.grad(e.sum(), [v])
        return e.detach(), g

    return f


def realize_gather_sources(gm):
    """Make every row gather (a node tensor read onto edges) read a contiguous buffer.

    Inductor fuses the producer of a gathered tensor into the gather, and so
    recomputes it once per edge instead of once per node. Where the producer is
    a transposition, as for the node gradients of e3nn's linear layers (their
    component-major [N, i, u] layout read back as [N, u, i]), the fused gather
    becomes a strided, scalar load per element: at 64 Si atoms (1,792 edges)
    SevenNet-0's backward spent about a third of its time there. Inductor's own
    stride constraint (prims.inductor_force_stride_order, what it puts on the
    inputs of extern kernels) makes it write the source once, contiguous, at
    node level; the gather then copies whole rows. Values are unchanged (the
    constraint is a copy at most). Returns the number of gathers constrained.
    """
    try:    # the module that registers Inductor's prims (not imported by torch itself)
        from torch._inductor.inductor_prims import force_stride_order
        from torch._prims_common import make_contiguous_strides_for
    except (ImportError, AttributeError):    # another torch: leave the graph to Inductor
        return 0
    aten = torch.ops.aten
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        if node.target in (aten.gather.default, aten.index_select.default):
            if node.args[1] != 0:
                continue
        elif node.target is aten.index.Tensor:
            if len(node.args[1]) != 1 or node.args[1][0] is None:
                continue
        else:
            continue
        src = node.args[0]
        val = src.meta.get("val") if isinstance(src, torch.fx.Node) else None
        if val is None or val.dim() < 2 or not all(isinstance(d, int) for d in val.shape[1:]):
            continue
        stride = list(make_contiguous_strides_for(val.shape))    # ints: all sizes but the first are
        with gm.graph.inserting_before(node):
            forced = gm.graph.call_function(force_stride_order, (src, stride))
        forced.meta["val"] = val
        node.replace_input_with(src, forced)
        count += 1
    if count:
        gm.graph.lint()
        gm.recompile()
    return count


def unroll_small_bmm(gm, max_inner=8):
    """Write batched matrix products with a small inner dimension as sums of products.

    A bmm [B, M, K] x [B, K, N] with K <= max_inner (the contractions of e3nn's
    tensor products per edge: K = 2l+1 components, 3x3 and 3x5 matrices) is
    an extern MKL call that runs such matrices at well under 1 GFLOP/s; as
    sum_k a[:, :, k] b[:, k, :] it is a pointwise expression that Inductor
    vectorizes and fuses with its neighbours. SevenNet-0 at 64 Si atoms: 88
    products, 1.2x faster per call. The sums run in the order k = 0 .. K-1.
    Returns the number of products rewritten.
    """
    aten = torch.ops.aten
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.bmm.default:
            continue
        a, b = node.args
        inner = a.meta["val"].shape[2] if isinstance(a, torch.fx.Node) and "val" in a.meta else None
        if not isinstance(inner, int) or inner > max_inner:
            continue
        with gm.graph.inserting_before(node):
            total = None
            for k in range(inner):
                ak = gm.graph.call_function(aten.slice.Tensor, (a, 2, k, k + 1))
                bk = gm.graph.call_function(aten.slice.Tensor, (b, 1, k, k + 1))
                term = gm.graph.call_function(aten.mul.Tensor, (ak, bk))
                total = term if total is None else gm.graph.call_function(aten.add.Tensor, (total, term))
        node.replace_all_uses_with(total)
        gm.graph.erase_node(node)
        count += 1
    if count:
        gm.graph.lint()
        gm.recompile()
    return count


def _state(module):
    names = [n for n, _ in module.named_parameters()] + [n for n, _ in module.named_buffers()]
    tensors = [t.detach() for t in module.parameters()] + [t.detach() for t in module.buffers()]
    return names, tensors


class _Stage(torch.nn.Module):
    """One stage method of a layered model as a module's forward (functional_call needs one)."""

    def __init__(self, module, method):
        super().__init__()
        self.m = module
        self.method = method

    def forward(self, *args):
        return getattr(self.m, self.method)(*args)


def stage_functions(module, names, num_interaction_layers):
    """The compiled stages of a layered model, by name: (function, kind). Every
    function takes the graph tensors, then *state; `fwd` functions return the
    stage's output, `vjp` ones the vector-Jacobian product of their `gout` input
    (recomputing the stage), `readout` the energies and their gradient by h."""
    def call(method, state, args):
        stage = _Stage(module, method)
        return torch.func.functional_call(stage, {"m." + n: t for n, t in zip(names, state)}, args)

    def embed_fwd(vec, index, species, local_species, *state):
        return call("stage_embed", state, (vec, index, species, local_species.shape[0]))

    def embed_vjp(vec, index, species, local_species, gout, *state):
        with torch.enable_grad():
            v = vec.detach().requires_grad_(True)
            h = call("stage_embed", state, (v, index, species, local_species.shape[0]))
            (gv,) = torch.autograd.grad(h, [v], gout)
        return gv

    def inter_fwd(k):
        def f(h_all, vec, index, species, local_species, *state):
            return call("stage_interaction", state, (k, h_all, vec, index, species, local_species.shape[0]))
        return f

    def inter_vjp(k):
        def f(h_all, vec, index, species, local_species, gout, *state):
            with torch.enable_grad():
                v = vec.detach().requires_grad_(True)
                h = h_all.detach().requires_grad_(True)
                out = call("stage_interaction", state, (k, h, v, index, species, local_species.shape[0]))
                gh, gv = torch.autograd.grad(out, [h, v], gout)
            return gh, gv
        return f

    def readout(h, local_species, *state):
        with torch.enable_grad():
            x = h.detach().requires_grad_(True)
            e = call("stage_readout", state, (x, local_species, local_species.shape[0]))
            (gh,) = torch.autograd.grad(e.sum(), [x])
        return e.detach(), gh

    out = {"embed_fwd": embed_fwd, "embed_vjp": embed_vjp}
    for k in range(num_interaction_layers - 1):
        out[f"inter_fwd_{k}"] = inter_fwd(k)
        out[f"inter_vjp_{k}"] = inter_vjp(k)
    out["readout"] = readout
    return out


def _stage_args(name, vec, index, species, n_local, widths, dev):
    """Example inputs and dynamic shapes of a stage (edges, nodes, local atoms)."""
    from torch.export import Dim
    edges, nodes, local = Dim("edges", min=2), Dim("nodes", min=2), Dim("local", min=1)
    gen = torch.Generator().manual_seed(3)
    local_species = species[:n_local]
    graph = (vec.to(dev), index.to(dev), species.to(dev), local_species.to(dev))
    graph_dyn = ({0: edges}, {1: edges}, {0: nodes}, {0: local})

    def rand(rows, width):
        return torch.randn(rows, width, generator=gen, dtype=vec.dtype).to(dev)
    if name == "embed_fwd":
        return graph, graph_dyn
    if name == "embed_vjp":
        return graph + (rand(n_local, widths[0]),), graph_dyn + ({0: local},)
    if name == "readout":
        return (rand(n_local, widths[-1]), local_species.to(dev)), ({0: local}, {0: local})
    k = int(name.rsplit("_", 1)[1])
    h_all = (rand(species.shape[0], widths[k]),)
    if name.startswith("inter_fwd"):
        return h_all + graph, ({0: nodes},) + graph_dyn
    return h_all + graph + (rand(n_local, widths[k + 1]),), ({0: nodes},) + graph_dyn + ({0: local},)


# CPU vector width (bits) of the generated code. Inductor's own choice on an
# AVX-512 machine is 512, which these models' small inner dimensions (3
# vector components, 8 channels, 9 tensor components) fill poorly: 256 ran
# si_local 1.37x and si_mp2 1.50x faster here (4096 atoms, 1 thread).
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
    names, state = _state(module)
    forbidden = {2, 3} | {d for t in state for d in t.shape}
    vec, index, species, n_local = _example_graph(float(meta["cutoff"]), len(meta["elements"]), dtype,
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
                    vec, index, species, n_local = _example_graph(float(meta["cutoff"]), len(meta["elements"]),
                                                                  dtype, forbidden)
                for name, fn in stages.items():
                    example, dynamic = _stage_args(name, vec, index, species, n_local, all_widths, dev)
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
                _write_package(raw, out_path, twin, info, stage_files)
    finally:
        torch.set_num_threads(old_threads)
    return info


def _check_stage(raw, fn, name, state, dtype, dev, forbidden, meta, widths):
    """A compiled stage equals its eager function on a graph of other sizes."""
    runner = torch._inductor.aoti_load_package(raw)
    vec, index, species, n_local = _example_graph(float(meta["cutoff"]), len(meta["elements"]), dtype,
                                                  forbidden, seed=11)
    example, _ = _stage_args(name, vec, index, species, n_local, widths, dev)
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
    vec, index, species, n_local = _example_graph(float(meta["cutoff"]), len(meta["elements"]), dtype,
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


def _clear_exec_stack(elf):
    """The shared library with its PT_GNU_STACK segment not executable.

    AOTInductor assembles the model's constants without a .note.GNU-stack
    section, so the linker marks the library as needing an executable stack;
    glibc >= 2.41 (Debian 13) then refuses to dlopen it ("cannot enable
    executable stack").  Nothing in the library runs code on the stack: this
    clears the flag, as `patchelf --clear-execstack` would."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:    # 64-bit little-endian only
        return elf
    out = bytearray(elf)
    phoff = int.from_bytes(elf[0x20:0x28], "little")
    phentsize = int.from_bytes(elf[0x36:0x38], "little")
    phnum = int.from_bytes(elf[0x38:0x3a], "little")
    for k in range(phnum):
        at = phoff + k * phentsize
        if int.from_bytes(elf[at:at + 4], "little") == 0x6474E551:    # PT_GNU_STACK
            flags = int.from_bytes(elf[at + 4:at + 8], "little") & ~0x1    # no PF_X
            out[at + 4:at + 8] = flags.to_bytes(4, "little")
    return bytes(out)


def _write_package(raw, out_path, twin, info, stage_files=None):
    """Copy the AOTInductor archive and add the twin, the stage packages of a
    layered model (each an AOTInductor package of its own, stored whole) and
    the info, atomically."""
    directory = os.path.dirname(os.path.abspath(out_path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".pt2", dir=directory)
    os.close(fd)
    try:
        with zipfile.ZipFile(raw) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as dst:
            names = src.namelist()
            root = names[0].split("/", 1)[0]
            for name in names:
                with src.open(name) as fh:
                    data = fh.read()
                if name.endswith(".so"):
                    data = _clear_exec_stack(data)
                dst.writestr(src.getinfo(name), data)
            dst.writestr(f"{root}/{TWIN_NAME}", twin)
            for name, path in (stage_files or {}).items():
                with zipfile.ZipFile(path) as stage_zip, tempfile.TemporaryDirectory() as sd:
                    # the stage's shared library gets the same stack fix
                    fixed = os.path.join(sd, "stage.pt2")
                    with zipfile.ZipFile(fixed, "w", zipfile.ZIP_STORED) as out:
                        for item in stage_zip.namelist():
                            data = stage_zip.read(item)
                            if item.endswith(".so"):
                                data = _clear_exec_stack(data)
                            out.writestr(stage_zip.getinfo(item), data)
                    with open(fixed, "rb") as fh:
                        dst.writestr(f"{root}/{STAGE_DIR}/{name}.pt2", fh.read())
            dst.writestr(f"{root}/extra/{COMPILED_NAME}", json.dumps(info, indent=1, sort_keys=True))
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, out_path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def read_package(path):
    """(twin TorchScript bytes, compiled info dict) of a package; ExportError if it is none."""
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
            root = names[0].split("/", 1)[0] if names else ""
            return (z.read(f"{root}/{TWIN_NAME}"),
                    json.loads(z.read(f"{root}/extra/{COMPILED_NAME}")))
    except (zipfile.BadZipFile, KeyError, IndexError) as e:
        raise ExportError(f"{path} is not an ML-TORCH compiled package: {e}")


def try_read_package(path):
    """read_package() for a compiled package; (None, None) for any other file (a
    TorchScript archive is a zip file too)."""
    if not zipfile.is_zipfile(path):
        return None, None
    try:
        return read_package(path)
    except ExportError:
        return None, None


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
