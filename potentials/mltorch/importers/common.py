"""What the importers share: their error and the checksum of a source file."""

import hashlib


class ImportFailed(ValueError):
    """The model cannot be imported as asked (the message says why)."""


def sha256(path):
    """The sha256 of a file, as recorded in the imported model's metadata."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
