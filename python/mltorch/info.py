"""mltorch-info: print the metadata of ML-TORCH model files (no LAMMPS needed).

    mltorch-info model.pt [model2.pt2 ...] [--json] [--parameters]

A compiled package (.pt2 from mltorch-compile) shows the metadata of the
TorchScript model it holds and how it was compiled.
"""

import argparse
import io
import json
import sys

import warnings


def main(argv=None):
    parser = argparse.ArgumentParser(prog="mltorch-info", description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="model files")
    parser.add_argument("--json", action="store_true", help="print the raw metadata as JSON")
    parser.add_argument("--parameters", action="store_true",
                        help="list the parameter names and shapes (for fix torch/finetune train/freeze)")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", category=FutureWarning)
    import torch
    from .export import METADATA_NAME

    from .compiled import try_read_package

    status = 0
    for path in args.models:
        files = {METADATA_NAME: ""}
        try:
            twin, compiled = try_read_package(path)
            source = path if twin is None else io.BytesIO(twin)
            module = torch.jit.load(source, map_location="cpu", _extra_files=files)
        except Exception as e:
            print(f"{path}: ERROR: cannot load as a TorchScript model: {str(e).splitlines()[0]}",
                  file=sys.stderr)
            status = 1
            continue
        if not files[METADATA_NAME]:
            print(f"{path}: ERROR: no ML-TORCH metadata ({METADATA_NAME})", file=sys.stderr)
            status = 1
            continue
        meta = json.loads(files[METADATA_NAME])
        if compiled is not None:
            meta = dict(meta, compiled=compiled)
        if args.json:
            print(json.dumps(meta, indent=1, sort_keys=True))
            continue
        nparams = sum(p.numel() for p in module.parameters())
        print(f"{path}")
        for key in ("model_type", "format_version", "elements", "cutoff", "num_interaction_layers",
                    "units", "dtype", "content_hash"):
            if key in meta:
                value = " ".join(meta[key]) if key == "elements" else meta[key]
                print(f"  {key:24s} {value}")
        print(f"  {'trainable parameters':24s} {nparams}")
        if compiled is not None:
            print(f"  {'compiled':24s} AOTInductor package for {compiled['device']}, "
                  f"{compiled['threads']} OpenMP thread(s), torch {compiled['torch_version']}")
        for key in sorted(set(meta) - {"model_type", "format_version", "elements", "cutoff",
                                        "num_interaction_layers", "units", "dtype", "content_hash",
                                        "compiled"}):
            print(f"  {key:24s} {meta[key]}")
        if args.parameters:
            print("  parameters (name, shape):")
            for name, p in module.named_parameters():
                print(f"    {name:30s} {list(p.shape)}")
    return status


if __name__ == "__main__":
    sys.exit(main())
