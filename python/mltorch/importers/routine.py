"""The one import routine of mltorch-import: an adapter (the framework's
module: sevenn, nequip, mace) describes its model with `imported(args)`,
this writes it as an ML-TORCH model file; the check (mltorch.importers.check)
compares the file with the framework's own model."""

import dataclasses
from typing import Callable

from ..export import export


@dataclasses.dataclass
class Imported:
    """What an adapter gives of the model it wraps."""
    model: object                 # the wrapper module (cutoff, elements, script_blocks())
    units: str                    # the LAMMPS units of its energies and lengths
    dtype: str                    # float32 or float64
    num_interaction_layers: int
    model_type: str
    imported: dict                # the metadata's "imported" record (framework, version, source)
    architecture: dict            # what rebuilds the module (mltorch-compile)
    references: Callable          # list of ase.Atoms -> the framework's own results


def adapter(framework):
    """The adapter module of `framework` (imported when asked: each pulls in its framework)."""
    if framework == "sevenn":
        from . import sevenn as module
    elif framework == "nequip":
        from . import nequip as module
    elif framework == "mace":
        from . import mace as module
    else:
        raise ValueError(f"unknown framework '{framework}' (sevenn, nequip or mace)")
    return module


def import_model(framework, args):
    """Write args.output from args.source -> (metadata, references, elements)."""
    spec = adapter(framework).imported(args)
    spec.model.script_blocks()
    meta = export(
        spec.model, args.output, cutoff=spec.model.cutoff, elements=spec.model.elements,
        units=spec.units, dtype=spec.dtype, num_interaction_layers=spec.num_interaction_layers,
        model_type=spec.model_type, extra={"imported": spec.imported},
        architecture=spec.architecture)
    return meta, spec.references, spec.model.elements
