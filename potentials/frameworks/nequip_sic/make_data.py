"""The training data of nequip_sic.ckpt and allegro_sic.ckpt: 48 small periodic
Si/C cells (8-16 atoms: 3C-SiC, Si with C substitutions, triclinic fcc-primitive
SiC, wurtzite), strained and rattled, labelled with energy, forces and stress
by SevenNet-0 (the sevenn wheel's checkpoint), written to sic.xyz.
Run with the project's environment: .venv/bin/python make_data.py"""
import os

import numpy as np
from ase import Atoms
from ase.build import bulk
from ase.io import write
from ase.calculators.singlepoint import SinglePointCalculator
from sevenn.calculator import SevenNetCalculator

rng = np.random.default_rng(7)
calc = SevenNetCalculator('7net-0', device='cpu')
frames = []

def label(atoms):
    atoms.calc = calc
    e = atoms.get_potential_energy(); f = atoms.get_forces(); s = atoms.get_stress()
    a = atoms.copy()
    a.calc = SinglePointCalculator(a, energy=e, forces=f, stress=s)
    return a

for k in range(48):
    kind = k % 4
    if kind == 0:      # 3C-SiC conventional cell (8 atoms), strained
        a = bulk('SiC', 'zincblende', a=4.36, cubic=True)
    elif kind == 1:    # diamond Si 8 atoms with C substitutions
        a = bulk('Si', 'diamond', a=5.43, cubic=True)
        idx = rng.choice(len(a), size=rng.integers(1, 4), replace=False)
        syms = a.get_chemical_symbols()
        for i in idx: syms[i] = 'C'
        a.set_chemical_symbols(syms)
        a.set_cell(a.cell * 0.95, scale_atoms=True)
    elif kind == 2:    # primitive (triclinic-ish fcc) SiC repeated -> 8 atoms, random C/Si
        a = bulk('SiC', 'zincblende', a=4.36).repeat((2, 2, 1))
    else:              # hexagonal/triclinic 2H-SiC-like: wurtzite 4 atoms x 2 -> 8..16
        a = bulk('SiC', 'wurtzite', a=3.08, c=5.04).repeat((2, 1, 2 if k % 8 == 3 else 1))
    # random (triclinic) strain and rattle
    eps = rng.normal(0, 0.03, (3, 3))
    eps = 0.5 * (eps + eps.T)
    a.set_cell(a.cell @ (np.eye(3) + eps), scale_atoms=True)
    a.rattle(0.08, seed=int(rng.integers(1 << 30)))
    frames.append(label(a))
    print(k, a.get_chemical_formula(), len(a), frames[-1].get_potential_energy())
write(os.path.join(os.path.dirname(os.path.abspath(__file__)), "sic.xyz"), frames, format='extxyz')
