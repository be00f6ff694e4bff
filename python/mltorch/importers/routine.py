"""The one import routine of mltorch-import: an adapter (the framework's
module: sevenn, nequip, mace) describes its model with `imported(args)`,
this writes it as an ML-TORCH model file; the check (mltorch.importers.check)
compares the file with the framework's own model."""

from ..export import export


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
