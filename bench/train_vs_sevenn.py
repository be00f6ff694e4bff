#!/usr/bin/env python3
"""Offline fine-tuning throughput of SevenNet-0: torch/train against the
installed SevenNet's own trainer (`sevenn train`, its fine_tune preset), the
same extended XYZ, batch, optimizer, learning rate and loss weights, 1 core
(bench/RESULTS.md, "Labels kept and reused").

  .venv/bin/python bench/train_vs_sevenn.py [--frames N] [--atoms-per-side K] [--rounds R]

The data: N configurations of hot Si (8 K^3 atoms) labelled by Stillinger-
Weber (fix torch/finetune labels). Each trainer runs 1 and 3 epochs; the
difference over 2 is one epoch's time without start-up, model loading and
graph building, and configurations per second follow. Not the same loss:
SevenNet's preset uses a Huber loss, torch/train the fix's squared errors
(the cost is the passes, not the loss's form).
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(here)
lmp = os.path.join(root, "build", "lmp")
venv = os.path.join(root, ".venv", "bin")
potentials = os.path.join(root, "build", "lammps-potentials")
student = os.path.join(root, "examples", "finetune", "si_student.pt")
env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", LAMMPS_POTENTIALS=potentials)


def sh(cmd, cwd, stdin=None):
    t0 = time.perf_counter()
    out = subprocess.run(cmd, cwd=cwd, env=env, input=stdin, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return out.stdout, time.perf_counter() - t0


def make_data(tmp, frames, k):
    path = os.path.join(tmp, "train.extxyz")
    sw = os.path.join(potentials, "Si.sw")
    text = (f"units metal\natom_modify map array\nlattice diamond 5.431\nregion box block 0 {k} 0 {k} 0 {k}\n"
            "create_box 1 box\ncreate_atoms 1 box\nmass 1 28.0855\nvelocity all create 1200 4928 loop geom\n"
            f"pair_style torch\npair_coeff * * {student} Si\nfix md all nve\n"
            f'fix ft all torch/finetune 1 teacher sw "* * {sw} Si" lr 1e-9 log 0 check 0 labels {path}\n'
            f"run {frames}\n")
    sh([lmp, "-log", "none", "-screen", "none"], tmp, text)
    return path


def sevenn_input(data, epochs):
    return f"""model:
    chemical_species: 'Auto'
    cutoff: 5.0
    channel: 128
    is_parity: False
    lmax: 2
    num_convolution_layer: 5
    irreps_manual:
        - "128x0e"
        - "128x0e+64x1e+32x2e"
        - "128x0e+64x1e+32x2e"
        - "128x0e+64x1e+32x2e"
        - "128x0e+64x1e+32x2e"
        - "128x0e"
    weight_nn_hidden_neurons: [64, 64]
    radial_basis:
        radial_basis_name: 'bessel'
        bessel_basis_num: 8
    cutoff_function:
        cutoff_function_name: 'XPLOR'
        cutoff_on: 4.5
    self_connection_type: 'linear'
    train_shift_scale: False
    train_denominator: False
train:
    random_seed: 1
    is_train_stress: True
    epoch: {epochs}
    loss: 'Huber'
    loss_param:
        delta: 0.01
    optimizer: 'adam'
    optim_param:
        lr: 0.004
    scheduler: 'exponentiallr'
    scheduler_param:
        gamma: 0.99
    force_loss_weight: 1.0
    stress_loss_weight: 0.01
    per_epoch: 1000
    error_record:
        - ['Energy', 'RMSE']
        - ['Force', 'RMSE']
        - ['TotalLoss', 'None']
    continue:
        reset_optimizer: True
        reset_scheduler: True
        reset_epoch: True
        checkpoint: 'SevenNet-0_11July2024'
data:
    batch_size: 4
    data_divide_ratio: 0.0
    data_format_args:
        index: ':'
    load_trainset_path: ['{data}']
"""


def time_sevenn(tmp, data, epochs):
    d = tempfile.mkdtemp(dir=tmp)
    with open(os.path.join(d, "input.yaml"), "w") as f:
        f.write(sevenn_input(data, epochs))
    _, wall = sh([os.path.join(venv, "sevenn"), "train", "input.yaml", "-s"], d)
    return wall


def time_torch_train(tmp, data, epochs, model):
    text = (f"units metal\nregion box block 0 1 0 1 0 1\ncreate_box 1 box\nmass 1 28.0855\n"
            f"pair_style torch\npair_coeff * * {model} Si\n"
            f"torch/train {data} epochs {epochs} batch 4 lr 0.004 weights 1 1 0.01 log 0\n")
    out, wall = sh([lmp, "-log", "none", "-nocite"], tmp, text)
    return wall


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--frames", type=int, default=16)
    p.add_argument("--atoms-per-side", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--model", default=os.path.join(root, "examples", "dft", "7net-0_Si.pt"),
                   help="SevenNet-0 imported for Si (examples/dft/run.sh makes it)")
    a = p.parse_args()
    if not os.path.exists(a.model):
        sys.exit(f"no {a.model}: {venv}/mltorch-import sevenn 7net-0 --elements Si -o {a.model}")
    tmp = tempfile.mkdtemp()
    data = make_data(tmp, a.frames, a.atoms_per_side)
    per = {"sevenn train": [], "torch/train": []}
    for _ in range(a.rounds):
        for name, f in (("sevenn train", lambda e: time_sevenn(tmp, data, e)),
                        ("torch/train", lambda e: time_torch_train(tmp, data, e, a.model))):
            one, three = f(1), f(3)
            per[name].append((three - one) / 2)
    n = a.frames
    natoms = 8 * a.atoms_per_side ** 3
    print(f"\n## SevenNet-0 offline fine-tuning, {n} configurations of {natoms} Si atoms, batch 4, "
          f"Adam lr 0.004, 1 core ({a.rounds} rounds of 1 and 3 epochs each)\n")
    print("| trainer | s per epoch (median) | configurations/s |")
    print("| --- | --- | --- |")
    for name, v in per.items():
        m = statistics.median(v)
        print(f"| {name} | {m:.2f} ({', '.join(f'{x:.2f}' for x in v)}) | {n / m:.3f} |")
    r = statistics.median(per["sevenn train"]) / statistics.median(per["torch/train"])
    print(f"\ntorch/train / sevenn train throughput: {r:.2f}x")


if __name__ == "__main__":
    main()
