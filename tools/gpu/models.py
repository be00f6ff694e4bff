#!/usr/bin/env python3
"""ML-TORCH model files for a machine with another torch (the GPU check).

A TorchScript file written by one torch may not load in an older one, so the
GPU check exports its models there, with that machine's torch, from what
this script packs here:

  models.py pack DIR MODEL.pt...   per model: DIR/NAME.json (its metadata and
                                   the atomic energies of a test graph) and
                                   DIR/NAME.npz (its parameters)
  models.py unpack DIR OUT         each packed model rebuilt from its class
                                   (ML-TORCH's own, named in its metadata),
                                   exported to OUT/NAME.pt by this torch, and
                                   checked: the same atomic energies on the
                                   test graph (1e-12 relative)

Run with the repository's python/ on PYTHONPATH (gpu_check.sh does).
"""
import json
import os
import sys
import warnings

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
from mltorch.export import DTYPES, _test_graph, export, read_metadata  # noqa: E402
from mltorch.rebuild import architecture_class, rebuild  # noqa: E402

warnings.filterwarnings("ignore", category=FutureWarning)    # torch.jit's deprecation notes

# what export() writes itself (the rest of the metadata travels as `extra`)
OWN = {"format_version", "content_hash", "layered", "architecture", "cutoff", "elements", "units", "dtype",
       "num_interaction_layers", "model_type"}


def test_energies(module, meta):
    vec, edges, species, n = _test_graph(float(meta["cutoff"]), len(meta["elements"]), DTYPES[meta["dtype"]])
    with torch.no_grad():
        return module(vec, edges, species, n).double().numpy()


def pack(folder, paths):
    os.makedirs(folder, exist_ok=True)
    for path in paths:
        name = os.path.basename(path)[:-len(".pt")]
        module, meta = rebuild(path)
        np.savez(os.path.join(folder, name + ".npz"),
                 **{k: v.detach().cpu().numpy() for k, v in module.state_dict().items()})
        with open(os.path.join(folder, name + ".json"), "w") as f:
            json.dump({"metadata": meta, "test_energies": test_energies(module, meta).tolist()}, f)
        print(f"packed {path}: {meta['architecture']['class']}, {len(module.state_dict())} tensors")


def unpack(folder, out):
    os.makedirs(out, exist_ok=True)
    for name in sorted(f[:-len(".json")] for f in os.listdir(folder) if f.endswith(".json")):
        with open(os.path.join(folder, name + ".json")) as f:
            packed = json.load(f)
        meta = packed["metadata"]
        arch = meta["architecture"]
        module = architecture_class(arch["class"], name)(**arch["kwargs"]).to(DTYPES[meta["dtype"]])
        with np.load(os.path.join(folder, name + ".npz")) as params:
            module.load_state_dict({k: torch.from_numpy(params[k]) for k in params.files})
        module.eval()
        path = os.path.join(out, name + ".pt")
        export(module, path, cutoff=meta["cutoff"], elements=meta["elements"], units=meta["units"],
               dtype=meta["dtype"], num_interaction_layers=meta["num_interaction_layers"],
               model_type=meta.get("model_type", ""), architecture=arch["kwargs"],
               extra={k: v for k, v in meta.items() if k not in OWN})
        want = np.array(packed["test_energies"])
        got = test_energies(torch.jit.load(path, map_location="cpu"), read_metadata(path))
        dev = np.abs(got - want).max() / np.abs(want).max()
        print(f"exported {path} with torch {torch.__version__}: test-graph energies {dev:.1e} "
              "from the packed model's")
        if not dev <= 1e-12:
            sys.exit(f"ERROR: {path} does not reproduce the packed model's energies ({dev:.1e})")


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "pack":
        pack(sys.argv[2], sys.argv[3:])
    elif len(sys.argv) == 4 and sys.argv[1] == "unpack":
        unpack(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
