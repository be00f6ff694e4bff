#!/usr/bin/env python3
"""Write si_student.pt: potentials/si_local.pt with every parameter perturbed.

The fine-tuning example and tests distil the Stillinger-Weber teacher into
this deliberately spoilt student: its forces are several times worse than
the trained model's, so the learning curve of fix torch/finetune is visible.

    python make_student.py            # writes si_student.pt next to this file
"""

import json
import os
import sys

import torch

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "potentials"))
from mltorch.export import METADATA_NAME, content_hash  # noqa: E402


def main(scale=0.5, seed=7):
    files = {METADATA_NAME: ""}
    model = torch.jit.load(os.path.join(here, "..", "..", "potentials", "si_local.pt"),
                           map_location="cpu", _extra_files=files)
    meta = json.loads(files[METADATA_NAME])
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("nets"):    # the per-species readout networks
                    p.mul_(1.0 + scale * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    meta["model_type"] = meta.get("model_type", "") + " (perturbed student for fine-tuning)"
    meta["content_hash"] = content_hash(model)
    out = os.path.join(here, "si_student.pt")
    tmp = out + ".tmp"
    torch.jit.save(model, tmp, _extra_files={METADATA_NAME: json.dumps(meta, indent=1, sort_keys=True)})
    os.replace(tmp, out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(*[float(a) for a in sys.argv[1:2]])
