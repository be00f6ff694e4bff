"""ML-TORCH Python tooling: export, inspect and train models for `pair_style torch`."""

from .export import FORMAT_VERSION, METADATA_NAME, ExportError, export, read_metadata

__all__ = ["FORMAT_VERSION", "METADATA_NAME", "ExportError", "export", "read_metadata"]
