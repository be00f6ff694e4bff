"""What the importers share: their error, the description an adapter gives
of its model (Imported), the checksum of a source file, and the two contexts
they build and script the frameworks' modules in."""

import contextlib
import dataclasses
import hashlib
import warnings
from typing import Callable

import torch


class ImportFailed(ValueError):
    """The model cannot be imported as asked (the message says why)."""


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


def sha256(path):
    """The sha256 of a file, as recorded in the imported model's metadata."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@contextlib.contextmanager
def default_dtype(dtype):
    """torch's default dtype set to `dtype` (e3nn folds constants into the
    modules it builds or scripts in the dtype current at that time)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


@contextlib.contextmanager
def quiet():
    """The frameworks and e3nn warn on every build (deprecations, no accelerator)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
