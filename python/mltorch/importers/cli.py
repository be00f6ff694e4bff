"""The command line of mltorch-import (the usage is mltorch.importers' docstring)."""

import argparse
import os
import sys

import torch

from ..export import ExportError
from .check import ENERGY_UNIT, check_import
from .routine import import_model

DESCRIPTION = "mltorch-import: models of other frameworks as ML-TORCH model files."

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
    p = argparse.ArgumentParser(prog="mltorch-import", description=DESCRIPTION)
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
        meta, references, elements = import_model(args.framework, args)
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

