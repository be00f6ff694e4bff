"""mltorch-import: models of other frameworks as ML-TORCH model files.

    mltorch-import sevenn NAME|CHECKPOINT -o FILE [--elements El ...]
                   [--dtype float32|float64] [--modality M]
    mltorch-import nequip CHECKPOINT|PACKAGE -o FILE [--elements El ...]
                   [--dtype float32|float64] [--units metal|real]
    mltorch-import mace MODEL -o FILE [--elements El ...]
                   [--dtype float32|float64] [--head H]

The adapters wrap the framework's own modules (mltorch.importers.<framework>)
and write an ordinary ML-TORCH model file (TorchScript + metadata) that
pair_style torch, torch/kk, committees, compute torch/deviation,
mltorch-compile and fix torch/finetune use unchanged. Deep models are written
in the layered form, so pair_style torch runs them with one cutoff of ghost
atoms and the per-layer halo exchange. After writing, the file is evaluated
on periodic triclinic cells that hold every element of the file against the
framework's own model (energy, per-atom energies, forces) and the import
fails if they disagree.
"""

import argparse
import os
import sys

import numpy as np
import torch

from ..export import ExportError, export
from .. import layered

CHECK_CELL_ATOMS = 8


def _check_cell(elements, cutoff, seed=11):
    """A periodic triclinic cell of 8 atoms of the given elements (at most 8,
    each at least once) on a rattled, sheared diamond lattice (neighbours
    about 2.4 A apart), smaller than the cutoff in every direction, so that
    every atom sees images of itself."""
    gen = np.random.default_rng(seed)
    a = 5.5
    cell = a * np.array([[1.0, 0.0, 0.0], [0.12, 1.0, 0.0], [-0.08, 0.15, 1.0]])
    base = np.array([[0, 0, 0], [0, .5, .5], [.5, 0, .5], [.5, .5, 0]], dtype=float)
    frac = np.concatenate([base, base + 0.25])
    pos = frac @ cell + gen.normal(0, 0.06, (len(frac), 3))
    species = np.arange(len(frac)) % len(elements)
    return pos, cell, species


def check_cells(elements, cutoff):
    """The cells of the import check: every element of the file at least once,
    in chunks of at most 8 elements per 8-atom cell (a model of 89 elements:
    12 cells). Each is (pos, cell, indices into `elements`)."""
    n = len(elements)
    chunks = -(-n // CHECK_CELL_ATOMS)
    cells = []
    for c in range(chunks):
        members = list(range(c * n // chunks, (c + 1) * n // chunks))
        pos, cell, species = _check_cell([elements[i] for i in members], cutoff, seed=11 + c)
        cells.append((pos, cell, np.array(members)[species]))
    return cells


def agreement(scripted, meta, references, elements):
    """Largest differences of the file's energies, per-atom energies and forces
    (stages with the exchange) from the framework's own on the check cells.

    references(list of ase.Atoms) -> list of dicts (energy, energies, forces).
    energy: |dE| / max(1, |E|) per cell; energies: max |de_i| eV and that over
    max(1, max |e_i|) ("energies_rel"); forces: max |dF| eV/A."""
    from ase import Atoms
    cells = check_cells(elements, meta["cutoff"])
    atoms = [Atoms([elements[s] for s in species], positions=pos, cell=cell, pbc=True)
             for pos, cell, species in cells]
    refs = references(atoms)
    layers = meta["num_interaction_layers"]
    d = {"energy": 0.0, "energies": 0.0, "energies_rel": 0.0, "forces": 0.0,
         "atoms": sum(len(a) for a in atoms), "cells": len(cells)}
    for (pos, cell, species), ref in zip(cells, refs):
        e, f, _ = layered.evaluate(scripted, layers, torch.tensor(pos), torch.tensor(cell),
                                   torch.tensor(species), meta["cutoff"],
                                   layered="layered" in meta)
        e = e.detach().double().numpy()
        f = f.detach().double().numpy()
        ref_e = np.asarray(ref["energies"], dtype=np.float64).reshape(-1)
        de = float(np.abs(e - ref_e).max())
        d["energy"] = max(d["energy"], abs(float(e.sum()) - ref["energy"])
                          / max(1.0, abs(ref["energy"])))
        d["energies"] = max(d["energies"], de)
        d["energies_rel"] = max(d["energies_rel"], de / max(1.0, float(np.abs(ref_e).max())))
        d["forces"] = max(d["forces"], float(np.abs(f - ref["forces"]).max()))
    return d


CHECK_TOLERANCE = {"float64": 1e-10, "float32": 5e-4}
ENERGY_UNIT = {"metal": "eV", "real": "kcal/mol"}


def check_import(scripted, meta, references, elements):
    """The import check: agreement() on every element, judged against the
    tolerance of the file's dtype -> (differences, what failed, tolerance).
    Energy and per-atom energies relative (to max(1, |value|)), forces in
    eV/A over 10."""
    d = agreement(scripted, meta, references, elements)
    tol = CHECK_TOLERANCE[meta["dtype"]]
    failed = [what for what, value in (("energy", d["energy"]),
                                       ("per-atom energies", d["energies_rel"]),
                                       ("forces", d["forces"] / 10.0)) if not value <= tol]
    return d, failed, tol


def import_sevenn(args):
    from . import sevenn as s7
    import sevenn
    path = s7.checkpoint_path(args.source)     # absolute
    # a shipped name stays a name (a file of the installed sevenn package);
    # a checkpoint file is recorded by its absolute path, as typed paths are
    # relative to a directory mltorch-compile need not run in
    source = args.source if args.source in s7.PRETRAINED else path
    model = s7.SevenNetModel(source, elements=args.elements, dtype=args.dtype,
                             modality=args.modality)
    model.script_blocks()
    extra = {"imported": {"framework": "sevenn", "framework_version": sevenn.__version__,
                          "model": source, "checkpoint_sha256": s7.sha256(path),
                          "modality": args.modality}}
    meta = export(
        model, args.output, cutoff=model.cutoff, elements=model.elements, units="metal",
        dtype=args.dtype, num_interaction_layers=model.num_blocks, model_type="sevenn",
        extra=extra, architecture={"checkpoint": source, "elements": model.elements,
                                   "dtype": args.dtype, "modality": args.modality})

    def references(atoms):
        return s7.references(atoms, source, args.dtype, args.modality)
    return meta, references, model.elements


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

    def references(atoms):
        return mc.references(atoms, args.source, args.dtype, args.head)
    return meta, references, model.elements


def import_nequip(args):
    from . import nequip as nq
    import nequip
    graph_model = nq.load_nequip(args.source, args.dtype)
    dtype = {torch.float32: "float32", torch.float64: "float64"}[graph_model.model_dtype]
    args.dtype = dtype
    units, units_from, note = nq.model_units(graph_model, args.units)
    if note:
        print(f"mltorch-import: note: {note}", file=sys.stderr)
    model = nq.NequIPModel(graph_model, elements=args.elements).eval()
    model.script_blocks()
    framework = "nequip" if model.is_gnn else "nequip-allegro"
    version = nequip.__version__
    if not model.is_gnn:
        from importlib.metadata import version as installed
        version += f", nequip-allegro {installed('nequip-allegro')}"
    extra = {"imported": {"framework": framework, "framework_version": version,
                          "model": os.path.basename(args.source),
                          "checkpoint_sha256": nq.sha256(args.source), "units_from": units_from}}
    meta = export(
        model, args.output, cutoff=model.cutoff, elements=model.elements, units=units,
        dtype=dtype, num_interaction_layers=max(model.num_layers, 1),
        model_type="nequip" if model.is_gnn else "allegro", extra=extra,
        architecture={"path": os.path.abspath(args.source), "dtype": dtype,
                      "elements": model.elements})

    def references(atoms):
        return nq.references(atoms, args.source, dtype)
    return meta, references, model.elements


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
    n.add_argument("--units", default=None,
                   help="the LAMMPS units of the model's energies and lengths: metal (eV, "
                        "Angstrom) or real (kcal/mol, Angstrom); default: those of the model's "
                        "ZBL term, else metal (nequip records no other units)")
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
        meta, references, elements = {"sevenn": import_sevenn, "nequip": import_nequip,
                                    "mace": import_mace}[args.framework](args)
    except (ExportError, ValueError) as e:
        print(f"mltorch-import: {e}", file=sys.stderr)
        return 1
    print(f"wrote {args.output}: {args.framework} {meta['imported']['model']}, "
          f"{len(meta['elements'])} elements, units {meta['units']}, cutoff {meta['cutoff']:g} A, "
          f"{meta['num_interaction_layers']} layers"
          + (f" (layered, exchanging {meta['layered']['feature_widths']} features)"
             if "layered" in meta else "") + f", {meta['dtype']}")
    if not args.no_check:
        d, failed, tol = check_import(torch.jit.load(args.output), meta, references, elements)
        energy = ENERGY_UNIT.get(meta["units"], meta["units"] + " energy units")
        print(f"check against {args.framework}'s own model ({d['cells']} periodic triclinic "
              f"cell(s), {d['atoms']} atoms, every one of the {len(elements)} element(s)): "
              f"energy {d['energy']:.2g} relative, per-atom energies {d['energies']:.2g} {energy} "
              f"({d['energies_rel']:.2g} relative), forces {d['forces']:.2g} {energy}/A")
        if failed:
            print(f"mltorch-import: {args.output} does not reproduce {args.framework}'s own model "
                  f"({', '.join(failed)}; tolerance {tol:g})", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
