"""Write a torch.nn.Module as an ML-TORCH model file for `pair_style torch`.

The module must implement the model contract (doc/pair_torch.rst):

    forward(edge_vectors: Tensor[E, 3],   # r_ij = x_j - x_i
            edge_index: Tensor[2, E],     # int64: centre i, neighbour j
            species: Tensor[N],           # int64 species index per node
            n_local: int) -> Tensor[N]    # per-node energies (or [n_local])

Only the energies of nodes [0, n_local) are summed; forces and virial come
from the gradient of that sum with respect to edge_vectors, so the energy
must be a differentiable function of the edge vectors (and invariant under
rotations of them).  `export` checks this on a test graph and refuses a
model that fails, with an ExportError saying what is wrong.
"""

import hashlib
import json
import math
import os
import tempfile

import torch

from . import layered

FORMAT_VERSION = 1
METADATA_NAME = "mltorch_metadata.json"
DTYPES = {"float32": torch.float32, "float64": torch.float64}
LAMMPS_UNITS = ("lj", "real", "metal", "si", "cgs", "electron", "micro", "nano")
OWN_PACKAGE = "mltorch"    # a model file's architecture may name classes of this package only


class ExportError(ValueError):
    """The module or its metadata cannot satisfy the model contract."""


def _test_graph(cutoff, n_species, dtype, seed=1234):
    """A small random cluster with all pairs closer than the cutoff as edges."""
    gen = torch.Generator().manual_seed(seed)
    n = 10
    pos = torch.rand(n, 3, generator=gen, dtype=torch.float64) * (1.2 * cutoff)
    # keep atoms apart so no model sees unphysical overlaps
    for i in range(n):
        pos[i] += 0.35 * cutoff * i / n
    species = torch.randint(0, n_species, (n,), generator=gen)
    ii, jj = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
    mask = ii != jj
    ii, jj = ii[mask], jj[mask]
    vec = pos[jj] - pos[ii]
    keep = vec.norm(dim=1) < cutoff
    return vec[keep].to(dtype), torch.stack([ii[keep], jj[keep]]), species, n


def _random_rotation(seed=99):
    gen = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(3, 3, generator=gen, dtype=torch.float64))
    return q * torch.sign(torch.det(q))


def check_contract(scripted, cutoff, n_species, dtype):
    """Evaluate the scripted model on a test graph; raise ExportError on failure."""
    vec, index, species, n = _test_graph(cutoff, n_species, DTYPES[dtype])
    if vec.shape[0] == 0:
        raise ExportError("internal: the test graph has no edges")
    x = vec.clone().requires_grad_(True)
    try:
        out = scripted(x, index, species, n)
    except Exception as e:  # the model's own error, reported with context
        raise ExportError(f"forward() failed on a test graph ({n} atoms, {vec.shape[0]} edges): {e}")
    if not isinstance(out, torch.Tensor) or out.dim() != 1 or out.shape[0] not in (n, species.shape[0]):
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ExportError(f"forward() must return per-atom energies of shape [{n}], got {shape}")
    if out.dtype != DTYPES[dtype]:
        raise ExportError(f"forward() returned {out.dtype} for a {dtype} model")
    energy = out[:n].sum()
    e_value = float(energy.detach())
    if not math.isfinite(e_value):
        raise ExportError("forward() returned a non-finite energy on a test graph")
    if not energy.requires_grad:
        raise ExportError("the energy does not depend on edge_vectors through autograd (detached or "
                          "non-differentiable output): pair_style torch needs forces as -dE/dr")
    (grad,) = torch.autograd.grad(energy, [x], allow_unused=True)
    if grad is None or not torch.isfinite(grad).all():
        raise ExportError("the gradient of the energy with respect to edge_vectors is missing or "
                          "non-finite: the model is not conservative in the form pair_style torch needs")
    rot = _random_rotation().to(DTYPES[dtype])
    e_rot = scripted(vec @ rot.T, index, species, n)[:n].sum().detach()
    tol = 1e-4 if dtype == "float32" else 1e-9
    if abs(float(e_rot) - e_value) > tol * max(1.0, abs(e_value)):
        raise ExportError(f"the energy is not rotation invariant ({e_value:.10g} vs "
                          f"{float(e_rot):.10g} after a rotation)")


def _test_cell(cutoff, n_species, seed=4321):
    """A small triclinic periodic cell (8 atoms, side 1.4 cutoffs): every atom
    sees periodic images of itself and of the others within the cutoff."""
    gen = torch.Generator().manual_seed(seed)
    side = 1.4 * cutoff
    cell = side * torch.tensor([[1.0, 0.0, 0.0], [0.15, 1.0, 0.0], [-0.1, 0.2, 1.0]],
                               dtype=torch.float64)
    grid = torch.tensor([[i, j, k] for i in range(2) for j in range(2) for k in range(2)],
                        dtype=torch.float64)
    frac = (grid + 0.5 + 0.15 * (torch.rand(8, 3, generator=gen, dtype=torch.float64) - 0.5)) / 2.0
    species = torch.randint(0, n_species, (8,), generator=gen)
    return frac @ cell, cell, species


def check_layered(scripted, cutoff, n_species, dtype, num_interaction_layers):
    """The stages with the halo exchange against forward() on thick ghosts, on a
    periodic cell; returns the feature widths exchanged between the layers."""
    pos, cell, species = _test_cell(cutoff, n_species)
    try:
        e_l, f_l, widths = layered.evaluate(scripted, num_interaction_layers, pos, cell, species,
                                            cutoff, layered=True)
    except Exception as e:
        raise ExportError(f"the layered stages failed on a periodic test cell: {e}")
    e_t, f_t, _ = layered.evaluate(scripted, num_interaction_layers, pos, cell, species, cutoff,
                                   layered=False)
    tol = 1e-4 if dtype == "float32" else 1e-12
    e_t, f_t, e_l, f_l = e_t.detach(), f_t.detach(), e_l.detach(), f_l.detach()
    scale_e = max(1.0, float(e_t.abs().max()))
    scale_f = max(1.0, float(f_t.abs().max()))
    de = float((e_l - e_t).abs().max())
    df = float((f_l - f_t).abs().max())
    if de > tol * scale_e or df > tol * scale_f:
        raise ExportError(f"the layered stages do not reproduce forward(): per-atom energies differ "
                          f"by {de:.3g} eV and forces by {df:.3g} eV/A on a periodic test cell "
                          f"(tolerance {tol:g} relative)")
    return widths


def content_hash(scripted):
    """sha256 over the TorchScript code and every parameter and buffer."""
    h = hashlib.sha256(scripted.code.encode())
    for name, t in list(scripted.named_parameters()) + list(scripted.named_buffers()):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def export(module, path, *, cutoff, elements, units, dtype="float64",
           num_interaction_layers=1, model_type="", extra=None, check=True, architecture=None):
    """Script `module`, cast it to `dtype`, check the contract and save it atomically.

    `architecture`: the keyword arguments that rebuild `module` from its class
    (one of ML-TORCH's own, in a module under `mltorch.`).  They are stored in
    the metadata so that `mltorch-compile` can rebuild the eager module from
    the file alone.
    """
    if dtype not in DTYPES:
        raise ExportError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    if not (isinstance(cutoff, (int, float)) and math.isfinite(cutoff) and cutoff > 0):
        raise ExportError(f"cutoff must be a positive number, got {cutoff!r}")
    if not elements or len(set(elements)) != len(elements) or not all(
            isinstance(e, str) and e for e in elements):
        raise ExportError("elements must be a non-empty list of distinct element names")
    if units not in LAMMPS_UNITS:
        raise ExportError(f"units must be a LAMMPS unit style {LAMMPS_UNITS}, got {units!r}")
    if int(num_interaction_layers) < 1:
        raise ExportError("num_interaction_layers must be >= 1")
    module = module.to(DTYPES[dtype]).eval()
    try:
        scripted = torch.jit.script(module)
    except Exception as e:
        raise ExportError(f"the module cannot be compiled to TorchScript: {e}")
    if check:
        check_contract(scripted, float(cutoff), len(elements), dtype)
    # a module with the stages (mltorch.layered) is stored in layered form:
    # pair_style torch then runs it with the per-layer halo exchange
    widths = None
    if layered.is_layered(module) and int(num_interaction_layers) > 1:
        widths = check_layered(scripted, float(cutoff), len(elements), dtype,
                               int(num_interaction_layers))
    meta = {
        "format_version": FORMAT_VERSION,
        "cutoff": float(cutoff),
        "elements": list(elements),
        "num_interaction_layers": int(num_interaction_layers),
        "units": units,
        "dtype": dtype,
        "model_type": model_type,
        "content_hash": content_hash(scripted),
    }
    if widths is not None:
        meta["layered"] = {"feature_widths": widths}
    if architecture is not None:
        cls = type(module)
        if cls.__module__ == "__main__":
            raise ExportError("architecture: the module's class must be importable (defined in a "
                              "package, not in the script being run) to be rebuilt for compiling")
        if not cls.__module__.startswith(OWN_PACKAGE + "."):
            raise ExportError(f"architecture: {cls.__module__}.{cls.__qualname__} is not one of "
                              "ML-TORCH's own classes; mltorch-compile rebuilds only those (a "
                              "model file may only name classes of the mltorch package): export "
                              "it without architecture, or put the class in a module of mltorch")
        try:
            json.dumps(architecture)
        except TypeError as e:
            raise ExportError(f"architecture keyword arguments must be JSON values: {e}")
        meta["architecture"] = {"class": f"{cls.__module__}.{cls.__qualname__}",
                                "kwargs": architecture}
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
    """Return the metadata dict stored in a model file (ExportError if it has none)."""
    files = {METADATA_NAME: ""}
    torch.jit.load(path, map_location="cpu", _extra_files=files)
    if not files[METADATA_NAME]:
        raise ExportError(f"{path} has no ML-TORCH metadata ({METADATA_NAME})")
    return json.loads(files[METADATA_NAME])
