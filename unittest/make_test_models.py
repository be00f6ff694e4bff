#!/usr/bin/env python3
"""Write the small, deliberately broken model files used by the error tests."""

import json
import os
import sys

import torch
from torch import Tensor, nn

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "potentials"))
from mltorch.export import METADATA_NAME, export  # noqa: E402


class NonFinite(nn.Module):
    """Energy log(r - 100): NaN for every edge."""

    def forward(self, edge_vectors: Tensor, edge_index: Tensor, species: Tensor,
                n_local: int) -> Tensor:
        r = torch.linalg.norm(edge_vectors, dim=1)
        out = torch.zeros(species.size(0), dtype=edge_vectors.dtype)
        return out.index_add(0, edge_index[0], torch.log(r - 100.0))


class NanForce(nn.Module):
    """Finite energies (all zero) whose forces are not finite: sqrt(d - d)
    is 0, its derivative at 0 is infinite."""

    def forward(self, edge_vectors: Tensor, edge_index: Tensor, species: Tensor,
                n_local: int) -> Tensor:
        d2 = (edge_vectors * edge_vectors).sum(dim=1)
        out = torch.zeros(species.size(0), dtype=edge_vectors.dtype)
        return out.index_add(0, edge_index[0], torch.sqrt(d2 - d2.detach()))


def main(out):
    os.makedirs(out, exist_ok=True)
    meta = dict(cutoff=5.0, elements=["Ar"], units="metal")
    export(NonFinite(), os.path.join(out, "nonfinite_Ar.pt"), model_type="always NaN", check=False, **meta)
    export(NanForce(), os.path.join(out, "nanforce_Ar.pt"), model_type="finite energy, NaN forces",
           check=False, **meta)

    scripted = torch.jit.script(NonFinite())
    torch.jit.save(scripted, os.path.join(out, "no_metadata.pt"))
    bad = {"format_version": 99, "cutoff": 5.0, "elements": ["Ar"],
           "num_interaction_layers": 1, "units": "metal", "dtype": "float64"}
    torch.jit.save(scripted, os.path.join(out, "bad_version.pt"),
                   _extra_files={METADATA_NAME: json.dumps(bad)})
    del bad["cutoff"]
    bad["format_version"] = 1
    torch.jit.save(scripted, os.path.join(out, "no_cutoff.pt"),
                   _extra_files={METADATA_NAME: json.dumps(bad)})


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "models"))
