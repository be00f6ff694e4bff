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

from .check import (CHECK_CELL_ATOMS, CHECK_TOLERANCE, ENERGY_UNIT, agreement,  # noqa: F401
                    check_cells, check_import)
from .cli import main  # noqa: F401
from .common import Imported  # noqa: F401
from .routine import import_model  # noqa: F401

__all__ = ["CHECK_CELL_ATOMS", "CHECK_TOLERANCE", "ENERGY_UNIT", "agreement", "check_cells",
           "check_import", "main", "Imported", "import_model"]
