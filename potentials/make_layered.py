#!/usr/bin/env python3
"""Write the shipped message-passing models in layered form.

    .venv/bin/python potentials/make_layered.py

si_mp2.pt and si_mp2_f32.pt are rebuilt from their own files (architecture
and parameters unchanged: the same numbers as before) and exported again by
mltorch.export, which finds the stages of mltorch.models.MPNet, checks them
against forward() on a periodic cell and stores the feature widths. The
metadata the training wrote (validation errors, reference) is kept.
"""

import os
import sys

import torch

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(here), "python"))
from mltorch.compiled import rebuild  # noqa: E402
from mltorch.export import export  # noqa: E402

KEYS = ("cutoff", "elements", "units", "dtype", "num_interaction_layers", "model_type")


def relayer(path):
    module, meta = rebuild(path)
    before = {k: v.clone() for k, v in module.state_dict().items()}
    extra = {k: v for k, v in meta.items()
             if k not in KEYS + ("architecture", "content_hash", "format_version", "layered")}
    out = export(module, path, architecture=meta["architecture"]["kwargs"], extra=extra,
                 **{k: meta[k] for k in KEYS})
    after = torch.jit.load(path).state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before), "parameters changed"
    print(f"{os.path.basename(path)}: layered, feature widths {out['layered']['feature_widths']}")


if __name__ == "__main__":
    for name in ("si_mp2.pt", "si_mp2_f32.pt"):
        relayer(os.path.join(here, name))
