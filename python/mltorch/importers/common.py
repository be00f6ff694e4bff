"""What the importers share: their error, the checksum of a source file, and
the two contexts they build and script the frameworks' modules in."""

import contextlib
import hashlib
import warnings

import torch


class ImportFailed(ValueError):
    """The model cannot be imported as asked (the message says why)."""


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
