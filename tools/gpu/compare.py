#!/usr/bin/env python3
"""Comparisons of the GPU check (tools/gpu/gpu_check.sh, kk_items.sh).

  compare.py atoms A B    forces, per-atom energy and per-atom virial of two
                          write_dump files of examples/gpu/in.gpu_kk (sorted
                          by id): the largest differences, relative to the
                          largest value of each
  compare.py forces A B   the forces of two write_dump files of
                          examples/gpu/in.gpu_check (id fx fy fz)
  compare.py thermo A B   the thermo rows of the last run of two LAMMPS logs:
                          the largest difference relative to each column's
                          largest value
  compare.py speed A [B]  atom-steps/s of the last run of a LAMMPS log, or
                          of two and B's over A's
atoms and thermo exit with status 1 when a difference is over the
tolerance in ML_TORCH_GPU_TOL (default 1e-10), after printing it.
"""
import os
import sys

import numpy as np


def dump(path):
    lines = open(path).read().splitlines()
    n = int(lines[3])
    a = np.array([[float(v) for v in l.split()] for l in lines[9:9 + n]])
    return a[np.argsort(a[:, 0])]


def thermo(path):
    text = open(path).read().splitlines()
    starts = [i for i, l in enumerate(text) if l.split()[:1] == ["Step"]]
    rows = []
    for l in text[starts[-1] + 1:]:
        w = l.split()
        if not w or not w[0].isdigit():
            break
        rows.append([float(v) for v in w])
    return np.array(rows)


def rate(path):
    w = [l.split() for l in open(path) if l.startswith("Loop time")][-1]
    return float(w[-2]) * int(w[-5]) / float(w[3])    # "Loop time of T on P procs for S steps with N atoms"


def rel(a, b):
    scale = np.abs(a).max(axis=0)
    scale[scale == 0] = 1.0
    return (np.abs(a - b) / scale).max(axis=0)


TOL = float(os.environ.get("ML_TORCH_GPU_TOL", "1e-10"))

if __name__ == "__main__":
    what = sys.argv[1]
    if what == "atoms":
        a, b = dump(sys.argv[2]), dump(sys.argv[3])
        assert a.shape == b.shape and (a[:, 0] == b[:, 0]).all(), "the two dumps hold different atoms"
        d = rel(a[:, 1:], b[:, 1:])
        print(f"forces {d[0:3].max():.2e}, per-atom energy {d[3]:.2e}, per-atom virial {d[4:10].max():.2e} "
              f"(largest difference over the largest value), {len(a)} atoms")
        sys.exit(int(d.max() > TOL))
    elif what == "forces":
        a, b = dump(sys.argv[2]), dump(sys.argv[3])
        assert a.shape == b.shape and (a[:, 0] == b[:, 0]).all(), "the two dumps hold different atoms"
        scale = np.abs(a[:, 1:4]).max()
        print(f"{np.abs(a[:, 1:4] - b[:, 1:4]).max() / scale:.2e} (max |F| {scale:.4g} eV/A, {len(a)} atoms)")
    elif what == "thermo":
        a, b = thermo(sys.argv[2]), thermo(sys.argv[3])
        assert a.shape == b.shape, "the two runs printed different thermo rows"
        d = rel(a[:, 1:], b[:, 1:])
        print("thermo columns 2.. " + " ".join(f"{v:.2e}" for v in d) + f" over {len(a)} rows")
        sys.exit(int(d.max() > TOL))
    elif what == "speed" and len(sys.argv) == 3:
        print(f"atom-steps/s {rate(sys.argv[2]):.4g}")
    elif what == "speed":
        ra, rb = rate(sys.argv[2]), rate(sys.argv[3])
        print(f"atom-steps/s {ra:.4g} and {rb:.4g} ({rb / ra:.2f}x)")
    else:
        sys.exit(__doc__)
