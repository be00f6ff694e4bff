#!/usr/bin/env python3
"""Generate reference data with LAMMPS and train the shipped ML models.

    python potentials/train_models.py --lmp build/lmp [--only si_local] [--minutes M]

For each model: run LAMMPS with a classical potential shipped with LAMMPS
(Stillinger-Weber Si.sw for silicon, Tersoff SiC.tersoff for SiC) over
crystal, strained crystal, liquid and amorphous (melt-quench) states,
sample frames (positions, forces, energies, virials), split them 80/20
into training and validation sets, train, export float64 and float32
model files, and write the model card with the measured errors.
"""

import argparse
import json
import os
import random
import sys
import time

import torch

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
from mltorch import lammps_data  # noqa: E402
from mltorch.export import export  # noqa: E402
from mltorch.models import LocalMBNet, MPNet  # noqa: E402
from mltorch.train import errors, fit_energy_shift, prepare, scale_features, train  # noqa: E402

# crystal at three temperatures, strained crystals, melt, quench, amorphous
SCRIPT = """
units           metal
atom_style      atomic
atom_modify     map array
boundary        p p p
lattice         {lattice} {a}
region          box prism 0 2 0 2 0 2 0 0 0
create_box      {ntypes} box
create_atoms    {basis_types}
{masses}
pair_style      {pair_style}
pair_coeff      * * {pair_file} {elements}
neighbor        1.0 bin
timestep        0.001
velocity        all create {t_low} {seed} loop geom
{sample}
fix             md all nvt temp {t_low} {t_low} 0.1
run             2000
fix             md all nvt temp {t_mid} {t_mid} 0.1
run             2000
fix             md all nvt temp {t_high} {t_high} 0.1
run             2000
fix             md all nvt temp {t_mid} {t_mid} 0.1
change_box      all x scale 0.97 y scale 0.97 z scale 0.97 remap
run             600
change_box      all x scale 1.06 y scale 1.06 z scale 1.06 remap
run             600
change_box      all x scale 0.9708737864 y scale 0.9708737864 z scale 0.9708737864 xy final {shear} remap
run             600
change_box      all xy final 0.0 yz final {shear} remap
run             600
change_box      all yz final 0.0 z scale 1.03 remap
run             600
change_box      all z scale 0.9708737864 remap
fix             md all nvt temp {t_melt} {t_melt} 0.1
run             5000
fix             md all nvt temp {t_melt} {t_amorph} 0.1
run             8000
fix             md all nvt temp {t_amorph} {t_amorph} 0.1
run             2000
fix             md all nvt temp {t_mid} {t_mid} 0.1
run             2000
"""

SYSTEMS = {
    "si": dict(lattice="diamond", a=5.431, ntypes=1, basis_types="1 box", masses="mass 1 28.0855",
               pair_style="sw", pair_file="Si.sw", elements="Si", element_list=["Si"],
               t_low=300, t_mid=900, t_high=1400, t_melt=3000, t_amorph=500, shear=0.3, seed=4928459,
               reference="LAMMPS pair_style sw with potentials/Si.sw (Stillinger & Weber, PRB 31, 5262 (1985))"),
    "sic": dict(lattice="diamond", a=4.3596, ntypes=2,
                basis_types="2 box basis 1 1 basis 2 1 basis 3 1 basis 4 1 basis 5 2 basis 6 2 basis 7 2 basis 8 2",
                masses="mass 1 28.0855\nmass 2 12.011", pair_style="tersoff", pair_file="SiC.tersoff",
                elements="Si C", element_list=["Si", "C"], t_low=300, t_mid=1200, t_high=2000,
                t_melt=4500, t_amorph=500, shear=0.25, seed=1234567,
                reference="LAMMPS pair_style tersoff with potentials/SiC.tersoff (Tersoff, PRB 39, 5566 (1989))"),
}

MODELS = {
    # name: (system, architecture, layers, cutoff, epochs, architecture options)
    "si_local": ("si", "local", 1, 4.0, 1000, {}),
    "si_mp2": ("si", "mp", 2, 4.0, 1000, {}),
    # Tersoff's switching regions are 0.3 A wide and end at 3.0 A: finer radial basis
    "sic_local": ("sic", "local", 1, 3.2, 1000, {"n_basis": 16}),
}


def generate(lmp, system, workdir):
    params = dict(SYSTEMS[system])
    # LAMMPS's potential files: the build links them at build/lammps-potentials
    potdir = os.path.join(os.path.dirname(os.path.abspath(lmp)), "lammps-potentials")
    params["pair_file"] = os.path.join(potdir, params["pair_file"])
    script = SCRIPT.format(**{k: v for k, v in params.items() if isinstance(v, (str, int, float))},
                           sample="{sample}")
    frames = lammps_data.run(lmp, script, os.path.join(workdir, system), every=100)
    return frames


def card(name, meta, system, arch, layers, n_train, n_val, metrics, train_metrics, minutes, seconds,
         volume_per_atom, force_rms):
    s = SYSTEMS[system]
    return f"""# Model card: {name}.pt

| | |
| --- | --- |
| architecture | {"LocalMBNet (strictly local many-body network)" if arch == "local" else f"MPNet ({layers}-layer message passing)"} |
| elements | {" ".join(meta["elements"])} |
| cutoff | {meta["cutoff"]} A ({layers} interaction layer(s): ghost cutoff {layers} x {meta["cutoff"]} A + skin) |
| units / dtype | {meta["units"]} / {meta["dtype"]} (`{name}_f32.pt`: float32 export of the same parameters) |
| trainable parameters | {meta["n_parameters"]} |
| content hash | `{meta["content_hash"]}` |

## Data
Reference: {s["reference"]}. Generated by LAMMPS from `potentials/train_models.py`
(64-atom periodic cells, frames every 100 steps of NVT MD, 1 fs): crystal at
{s["t_low"]}, {s["t_mid"]} and {s["t_high"]} K; crystal at {s["t_mid"]} K under
isotropic strain of -3 % and +3 % and shear (tilt {s["shear"]} lattice units); liquid at
{s["t_melt"]} K; a quench {s["t_melt"]} -> {s["t_amorph"]} K over 8 ps and the amorphous
solid at {s["t_amorph"]} and {s["t_mid"]} K. Split: {n_train} training and {n_val} validation frames
(random, seed 0).

## Errors on the held-out validation frames (against the reference)
| quantity | RMSE |
| --- | --- |
| energy | {metrics["energy_rmse_eV_per_atom"] * 1000:.2f} meV/atom |
| force components (reference RMS force: {force_rms:.2f} eV/A) | {metrics["force_rmse_eV_per_A"]:.4f} eV/A |
| virial (stress x volume / atoms) | {metrics["virial_rmse_eV_per_atom"] * 1000:.2f} meV/atom (stress: {metrics["virial_rmse_eV_per_atom"] / volume_per_atom * 160.21766:.3f} GPa at {volume_per_atom:.1f} A^3/atom) |

Training set: energy {train_metrics["energy_rmse_eV_per_atom"] * 1000:.2f} meV/atom, forces
{train_metrics["force_rmse_eV_per_A"]:.4f} eV/A, virial {train_metrics["virial_rmse_eV_per_atom"] * 1000:.2f} meV/atom.
Trained in {seconds / 60:.1f} min on 2 CPU cores (budget {minutes} min).

## Meant for
Temperatures {s["t_amorph"] if s["t_amorph"] < s["t_low"] else s["t_low"]} - {s["t_melt"]} K at densities within
about +-3 % of the crystal (pressures of a few GPa). The reference is a classical
potential: the model inherits its physics, including its melting point, and is meant for
demonstrations and tests of ML-TORCH, not for predictions about real {" ".join(meta["elements"])}.

## Reproduce
    .venv/bin/python potentials/train_models.py --lmp build/lmp --only {name}
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lmp", required=True, help="LAMMPS executable (build/lmp)")
    ap.add_argument("--only", nargs="*", default=list(MODELS), help="models to train")
    ap.add_argument("--minutes", type=float, default=6.0, help="training time budget per model")
    ap.add_argument("--workdir", default=os.path.join(here, "..", "build", "training"))
    ap.add_argument("--out", default=here)
    args = ap.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    lmp = os.path.abspath(args.lmp)
    frames_of = {}
    for name in args.only:
        system, arch, layers, cutoff, epochs, options = MODELS[name]
        if system not in frames_of:
            frames_of[system] = generate(lmp, system, os.path.abspath(args.workdir))
        frames = frames_of[system]
        elements = SYSTEMS[system]["element_list"]
        type2species = {t + 1: t for t in range(len(elements))}
        samples = prepare(frames, type2species, cutoff, layers)
        idx = list(range(len(samples)))
        random.Random(0).shuffle(idx)
        n_val = len(idx) // 5
        val = [samples[i] for i in idx[:n_val]]
        trn = [samples[i] for i in idx[n_val:]]
        torch.manual_seed(0)
        if arch == "local":
            architecture = dict(cutoff=cutoff, n_species=len(elements), **options)
            model = LocalMBNet(**architecture).double()
        else:
            architecture = dict(cutoff=cutoff, n_species=len(elements), num_layers=layers, **options)
            model = MPNet(**architecture).double()
        fit_energy_shift(model, trn, len(elements))
        scale_features(model, trn)
        print(f"== {name}: {len(frames)} frames ({len(trn)} train, {len(val)} validation), "
              f"{sum(p.numel() for p in model.parameters())} parameters", flush=True)
        t0 = time.time()
        train(model, trn, val, epochs=epochs, max_minutes=args.minutes,
              log=lambda s: print(s, flush=True))
        seconds = time.time() - t0
        force_rms = float(torch.sqrt(torch.cat([v.forces for v in val]).pow(2).mean()))
        volume_per_atom = sum(abs(float(torch.det(v.cell))) / v.n for v in val) / len(val)
        metrics = errors(model, val)
        train_metrics = errors(model, trn)
        extra = {"n_parameters": sum(p.numel() for p in model.parameters()),
                 "validation": metrics, "reference": SYSTEMS[system]["reference"]}
        kw = dict(cutoff=cutoff, elements=elements, units="metal", num_interaction_layers=layers,
                  model_type=("LocalMBNet" if arch == "local" else f"MPNet-{layers}"), extra=extra,
                  architecture=architecture)
        meta = export(model, os.path.join(args.out, name + ".pt"), dtype="float64", **kw)
        export(model, os.path.join(args.out, name + "_f32.pt"), dtype="float32", **kw)
        model.double()
        with open(os.path.join(args.out, name + ".md"), "w") as f:
            f.write(card(name, meta, system, arch, layers, len(trn), len(val), metrics, train_metrics,
                         args.minutes, seconds, volume_per_atom, force_rms))
        print(json.dumps({name: metrics}), flush=True)


if __name__ == "__main__":
    main()
