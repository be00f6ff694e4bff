"""Write a torch.nn.Module as an ML-TORCH model file for `pair_style torch`.

The module must implement the model contract (see doc/pair_torch.rst):

    forward(edge_vectors: Tensor[E, 3],   # r_ij = x_j - x_i
            edge_index: Tensor[2, E],     # int64: centre i, neighbour j
            species: Tensor[N],           # int64 species index per node
            n_local: int) -> Tensor[N]    # per-node energies (or [n_local])

Only the energies of nodes [0, n_local) are summed; forces and virial come
from the gradient of that sum with respect to edge_vectors.
"""

import hashlib
import json
import os
import tempfile

import torch

FORMAT_VERSION = 1
METADATA_NAME = "mltorch_metadata.json"
DTYPES = {"float32": torch.float32, "float64": torch.float64}


def export(module, path, *, cutoff, elements, units, dtype="float64",
           num_interaction_layers=1, model_type="", extra=None):
    """Script `module`, cast it to `dtype` and save it atomically at `path`."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    if not cutoff > 0:
        raise ValueError("cutoff must be positive")
    if not elements or len(set(elements)) != len(elements):
        raise ValueError("elements must be a non-empty list of distinct names")
    if num_interaction_layers < 1:
        raise ValueError("num_interaction_layers must be >= 1")
    module = module.to(DTYPES[dtype]).eval()
    scripted = torch.jit.script(module)
    meta = {
        "format_version": FORMAT_VERSION,
        "cutoff": float(cutoff),
        "elements": list(elements),
        "num_interaction_layers": int(num_interaction_layers),
        "units": units,
        "dtype": dtype,
        "model_type": model_type,
    }
    if extra:
        meta.update(extra)
    text = json.dumps(meta, indent=1, sort_keys=True)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".pt", dir=directory)
    os.close(fd)
    try:
        torch.jit.save(scripted, tmp, _extra_files={METADATA_NAME: text})
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return meta


def read_metadata(path):
    """Return the metadata dict stored in a model file."""
    files = {METADATA_NAME: ""}
    torch.jit.load(path, map_location="cpu", _extra_files=files)
    return json.loads(files[METADATA_NAME])


def file_digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()
