#!/usr/bin/env python3
"""Write si_student.pt: potentials/si_local.pt with its readout networks spoilt.

Every weight and bias of the per-species networks ("nets") is multiplied by
1 + scale * N(0, 1) (seeded). The fine-tuning example and tests distil the
Stillinger-Weber teacher into this student: its force error against SW is
about 0.2-0.6 eV/A instead of the trained model's 0.03, so the learning curve
of fix torch/finetune is visible.

    python make_student.py [scale]    # default 0.5; writes si_student.pt here
"""

import json
import os
import sys

import torch

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "python"))
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
