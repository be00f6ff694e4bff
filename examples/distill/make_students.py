#!/usr/bin/env python3
"""The two students of the distillation example: small local ZnS models that
have seen only 24 near-crystal configurations.

    ../../.venv/bin/python make_students.py

SevenNet-0 (the sevenn wheel's checkpoint, through SevenNetCalculator) labels
24 zincblende ZnS cells of 64 atoms, rattled by 0.03-0.12 A and strained by
up to 2% (about 30 s). Two LocalMBNet members (cutoff 4.5 A, 3,794
parameters each, float64) differ by their seed and by a bootstrap resample of
those frames; each trains for 60 epochs (about a minute each) and is
written as student_c0.pt / student_c1.pt. The students then meet the hot
crystal only online, in in.distill.
"""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import sys  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "python"))
warnings.filterwarnings("ignore")

from mltorch.export import export  # noqa: E402
from mltorch.lammps_data import Frame  # noqa: E402
from mltorch.models import LocalMBNet  # noqa: E402
from mltorch.train import errors, fit_energy_shift, prepare, scale_features, train  # noqa: E402

ELEMENTS = ["Zn", "S"]
CUTOFF = 4.5
KWARGS = dict(cutoff=CUTOFF, n_species=2, n_basis=8, channels=6, hidden=24)


def frames(count=24, seed=3):
    from ase.build import bulk
    from sevenn.calculator import SevenNetCalculator
    rng = np.random.default_rng(seed)
    calc = SevenNetCalculator("7net-0", device="cpu")
    out = []
    for k in range(count):
        atoms = bulk("ZnS", "zincblende", a=5.41, cubic=True).repeat((2, 2, 2))
        eps = rng.normal(0, 0.01, (3, 3))
        eps = 0.5 * (eps + eps.T)
        atoms.set_cell(atoms.cell[:] @ (np.eye(3) + eps), scale_atoms=True)
        atoms.rattle(stdev=0.03 + 0.09 * k / count, seed=int(rng.integers(1 << 30)))
        atoms.calc = calc
        energy = atoms.get_potential_energy()
        stress = atoms.get_stress(voigt=False)
        out.append(Frame(step=k, pos=atoms.get_positions(), cell=atoms.cell[:],
                         types=np.array([ELEMENTS.index(s) + 1
                                         for s in atoms.get_chemical_symbols()]),
                         energy=float(energy), forces=atoms.get_forces(),
                         virial=-stress * atoms.get_volume(), tag="crystal"))
    return out


def main():
    data = frames()
    print(f"{len(data)} configurations labelled by SevenNet-0")
    samples = prepare(data, {1: 0, 2: 1}, CUTOFF, 1)
    for m in range(2):
        torch.manual_seed(100 + m)
        rng = np.random.default_rng(200 + m)
        boot = [samples[i] for i in rng.integers(0, len(samples), len(samples))]
        model = LocalMBNet(**KWARGS).double()
        fit_energy_shift(model, boot, 2)
        scale_features(model, boot)
        train(model, boot, samples, epochs=60, batch=4, lr=1e-2, lr_final=5e-4, seed=m)
        print(f"student c{m}: {sum(p.numel() for p in model.parameters())} parameters, "
              f"errors on all 24 frames {errors(model, samples)}")
        export(model, os.path.join(here, f"student_c{m}.pt"), cutoff=CUTOFF, elements=ELEMENTS,
               units="metal", dtype="float64", model_type="local ZnS student (distillation example)",
               architecture=KWARGS)


if __name__ == "__main__":
    main()
