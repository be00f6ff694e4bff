"""mltorch-import: models of other frameworks as ML-TORCH model files.

    mltorch-import sevenn NAME|CHECKPOINT -o FILE [--elements El ...]
                   [--dtype float32|float64] [--modality M]
    mltorch-import nequip CHECKPOINT|PACKAGE -o FILE [--elements El ...]
                   [--dtype float32|float64]
    mltorch-import mace MODEL -o FILE [--elements El ...]
                   [--dtype float32|float64] [--head H]

The adapters wrap the framework's own modules (mltorch.importers.<framework>)
and write an ordinary ML-TORCH model file (TorchScript + metadata) that
pair_style torch, torch/kk, committees, compute torch/deviation,
mltorch-compile and fix torch/finetune use unchanged. Deep models are written
in the layered form, so pair_style torch runs them with one cutoff of ghost
atoms and the per-layer halo exchange. After writing, the file is evaluated
on a periodic multi-element triclinic cell against the framework's own model
and the import fails if they disagree.
"""

import argparse
import os
import sys

import numpy as np
import torch

from ..export import ExportError, export
from .. import layered

def _check_cell(elements, cutoff, seed=11):
    """A periodic triclinic cell of 8 atoms of the given elements on a rattled,
    sheared diamond lattice (neighbours about 2.4 A apart), smaller than the
    cutoff in every direction, so that every atom sees images of itself."""
    gen = np.random.default_rng(seed)
    a = 5.5
    cell = a * np.array([[1.0, 0.0, 0.0], [0.12, 1.0, 0.0], [-0.08, 0.15, 1.0]])
    base = np.array([[0, 0, 0], [0, .5, .5], [.5, 0, .5], [.5, .5, 0]], dtype=float)
    frac = np.concatenate([base, base + 0.25])
    pos = frac @ cell + gen.normal(0, 0.06, (len(frac), 3))
    species = np.arange(len(frac)) % len(elements)
    return pos, cell, species


def agreement(scripted, meta, reference, elements):
    """Largest differences of the file's energies and forces (stages with the
    exchange) from the framework's own on a periodic cell."""
    from ase import Atoms
    pos, cell, species = _check_cell(elements, meta["cutoff"])
    atoms = Atoms([elements[s] for s in species], positions=pos, cell=cell, pbc=True)
    ref = reference(atoms)
    layers = meta["num_interaction_layers"]
    e, f, _ = layered.evaluate(scripted, layers, torch.tensor(pos), torch.tensor(cell),
                               torch.tensor(species), meta["cutoff"],
                               layered="layered" in meta)
    e = e.detach().double().numpy()
    f = f.detach().double().numpy()
    return {"energy": abs(float(e.sum()) - ref["energy"]) / max(1.0, abs(ref["energy"])),
            "energies": float(np.abs(e - ref["energies"]).max()),
            "forces": float(np.abs(f - ref["forces"]).max()),
            "atoms": len(atoms)}


def import_sevenn(args):
    from . import sevenn as s7
    import sevenn
    path = s7.checkpoint_path(args.source)
    model = s7.SevenNetModel(args.source, elements=args.elements, dtype=args.dtype,
                             modality=args.modality)
    model.script_blocks()
    name = args.source if args.source in s7.PRETRAINED else None
    extra = {"imported": {"framework": "sevenn", "framework_version": sevenn.__version__,
                          "model": name or path, "checkpoint_sha256": s7.sha256(path),
                          "modality": args.modality}}
    meta = export(
        model, args.output, cutoff=model.cutoff, elements=model.elements, units="metal",
        dtype=args.dtype, num_interaction_layers=model.num_blocks, model_type="sevenn",
        extra=extra, architecture={"checkpoint": args.source, "elements": model.elements,
                                   "dtype": args.dtype, "modality": args.modality})

    def reference(atoms):
        return s7.reference(atoms, args.source, args.dtype, args.modality)
    return meta, reference, model.elements


def import_mace(args):
    from . import mace as mc
    import mace
    model = mc.MACEModel(args.source, elements=args.elements, dtype=args.dtype, head=args.head)
    model.script_blocks()
    extra = {"imported": {"framework": "mace-torch", "framework_version": mace.__version__,
                          "model": os.path.basename(args.source),
                          "checkpoint_sha256": mc.sha256(args.source), "head": model.head_name}}
    meta = export(
        model, args.output, cutoff=model.cutoff, elements=model.elements, units="metal",
        dtype=args.dtype, num_interaction_layers=model.num_layers, model_type="mace", extra=extra,
        architecture={"path": os.path.abspath(args.source), "elements": model.elements,
                      "dtype": args.dtype, "head": model.head_name})

    def reference(atoms):
        return mc.reference(atoms, args.source, args.dtype, args.head)
    return meta, reference, model.elements


def import_nequip(args):
    from . import nequip as nq
    import nequip
    graph_model = nq.load_nequip(args.source, args.dtype)
    dtype = {torch.float32: "float32", torch.float64: "float64"}[graph_model.model_dtype]
    args.dtype = dtype
    model = nq.NequIPModel(graph_model, elements=args.elements).eval()
    model.script_blocks()
    framework = "nequip" if model.is_gnn else "nequip-allegro"
    version = nequip.__version__
    if not model.is_gnn:
        from importlib.metadata import version as installed
        version += f", nequip-allegro {installed('nequip-allegro')}"
    extra = {"imported": {"framework": framework, "framework_version": version,
                          "model": os.path.basename(args.source),
                          "checkpoint_sha256": nq.sha256(args.source)}}
    meta = export(
        model, args.output, cutoff=model.cutoff, elements=model.elements, units="metal",
        dtype=dtype, num_interaction_layers=max(model.num_layers, 1),
        model_type="nequip" if model.is_gnn else "allegro", extra=extra,
        architecture={"path": os.path.abspath(args.source), "dtype": dtype,
                      "elements": model.elements})

    def reference(atoms):
        return nq.reference(atoms, args.source, dtype)
    return meta, reference, model.elements


# MACE pins e3nn 0.4.4 and SevenNet needs e3nn >= 0.5, so MACE lives in an
# environment of its own that shares the project's torch (tools/setup.sh)
MACE_PYTHON_ENV = "ML_TORCH_MACE_PYTHON"


def _mace_python():
    """The Python of the MACE environment: $ML_TORCH_MACE_PYTHON, or the
    checkout's .venv-mace (made by tools/setup.sh)."""
    given = os.environ.get(MACE_PYTHON_ENV)
    if given:
        return given
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))
    return os.path.join(root, ".venv-mace", "bin", "python")


def _has_mace():
    try:
        import e3nn
        import mace  # noqa: F401
    except ImportError:
        return False
    return e3nn.__version__.startswith("0.4.")


def main(argv=None):
    p = argparse.ArgumentParser(prog="mltorch-import", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="framework", required=True)
    s = sub.add_parser("sevenn", help="a SevenNet checkpoint (sevenn package)")
    s.add_argument("source", help="a shipped model (7net-0, 7net-0_22May2024, 7net-l3i5, "
                                  "7net-mf-0) or a checkpoint file")
    s.add_argument("--modality", default=None,
                   help="the fidelity head of a multi-fidelity model (7net-mf-0: PBE, R2SCAN)")
    n = sub.add_parser("nequip", help="a NequIP or Allegro model (nequip 0.19, nequip-allegro 0.8)")
    n.add_argument("source", help="a checkpoint of nequip-train (.ckpt) or a package of "
                                  "nequip-package (.nequip.zip)")
    m = sub.add_parser("mace", help="a MACE model (mace-torch 0.3; runs in .venv-mace)")
    m.add_argument("source", help="the model file mace_run_train writes (NAME.model)")
    m.add_argument("--head", default=None,
                   help="the head of a multi-head model (default: its first)")
    for q in (s, n, m):
        q.add_argument("-o", "--output", required=True, help="the ML-TORCH model file to write")
        q.add_argument("--elements", nargs="+", default=None,
                       help="the elements of the run (default: every element the model knows)")
        q.add_argument("--dtype", choices=("float32", "float64"),
                       default=None if q is n else "float32",
                       help="the file's precision (sevenn, mace: float32 by default; nequip: "
                            "the model's own by default)")
        q.add_argument("--no-check", action="store_true",
                       help="skip the comparison with the framework's own model after writing")
    args = p.parse_args(argv)
    if args.framework == "mace" and not _has_mace():
        python = _mace_python()
        if not os.path.exists(python):
            print(f"mltorch-import: MACE's environment {python} is missing: run tools/setup.sh "
                  f"(or set {MACE_PYTHON_ENV} to a Python with mace-torch 0.3)", file=sys.stderr)
            return 1
        argv = sys.argv[1:] if argv is None else list(argv)
        os.execv(python, [python, "-m", "mltorch.importers", *argv])
    try:
        meta, reference, elements = {"sevenn": import_sevenn, "nequip": import_nequip,
                                    "mace": import_mace}[args.framework](args)
    except (ExportError, ValueError) as e:
        print(f"mltorch-import: {e}", file=sys.stderr)
        return 1
    print(f"wrote {args.output}: {args.framework} {meta['imported']['model']}, "
          f"{len(meta['elements'])} elements, cutoff {meta['cutoff']:g} A, "
          f"{meta['num_interaction_layers']} layers"
          + (f" (layered, exchanging {meta['layered']['feature_widths']} features)"
             if "layered" in meta else "") + f", {meta['dtype']}")
    if not args.no_check:
        scripted = torch.jit.load(args.output)
        check_elements = elements if len(elements) <= 4 else elements[:3]
        d = agreement(scripted, meta, reference, check_elements)
        tol = {"float64": 1e-10, "float32": 5e-4}[meta["dtype"]]
        print(f"check against {args.framework}'s own model ({d['atoms']} atoms of "
              f"{' '.join(check_elements)}, periodic triclinic): energy {d['energy']:.2g} relative, "
              f"per-atom energies {d['energies']:.2g} eV, forces {d['forces']:.2g} eV/A")
        if max(d["energy"], d["forces"] / 10.0) > tol:
            print(f"mltorch-import: {args.output} does not reproduce {args.framework}'s own model "
                  f"(tolerance {tol:g})", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
