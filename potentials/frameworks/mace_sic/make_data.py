"""The training data of mace_sic.model: 48 rattled, strained small periodic Si/C
cells (8 and 16 atoms, some triclinic) labelled with energy, forces and stress
by SevenNet-0 (the sevenn wheel's checkpoint), 40 in train.xyz and 8 in
test.xyz. Run with the project's environment: .venv/bin/python make_data.py"""
import os
import numpy as np
from ase.build import bulk
from ase.io import write
from sevenn.calculator import SevenNetCalculator

rng = np.random.default_rng(0)
calc = SevenNetCalculator('7net-0', device='cpu')
frames = []
for n in range(48):
    kind = n % 4
    if kind == 0:    # diamond Si/C random alloy, 8 atoms cubic
        at = bulk('Si', 'diamond', a=5.43, cubic=True)
    elif kind == 1:  # zincblende SiC 8 atoms cubic
        at = bulk('SiC', 'zincblende', a=4.36, cubic=True)
    elif kind == 2:  # primitive 2-atom cell repeated 2x2x2 -> 16 atoms, triclinic (fcc primitive vectors)
        at = bulk('SiC', 'zincblende', a=4.36).repeat((2, 2, 2))
    else:            # 8-atom cubic cell sheared -> general triclinic
        at = bulk('SiC', 'zincblende', a=4.36, cubic=True)
    if kind in (0, 3):
        syms = rng.choice(['Si', 'C'], size=len(at), p=[0.6, 0.4])
        syms[0], syms[1] = 'Si', 'C'
        at.set_chemical_symbols(list(syms))
    # random strain (triclinic for kinds 2,3)
    eps = rng.normal(0, 0.03, (3, 3))
    if kind in (0, 1):
        eps = np.diag(np.diag(eps))
    eps = 0.5 * (eps + eps.T)
    at.set_cell(at.cell[:] @ (np.eye(3) + eps), scale_atoms=True)
    at.rattle(stdev=0.05 + 0.05 * rng.random(), seed=int(rng.integers(1 << 30)))
    at.calc = calc
    e = at.get_potential_energy(); f = at.get_forces(); s = at.get_stress()
    at.calc = None
    at.info['REF_energy'] = float(e)
    at.info['REF_stress'] = s            # Voigt 6, eV/A^3 (ASE sign)
    at.arrays['REF_forces'] = f
    at.info['config_type'] = f'kind{kind}'
    frames.append(at)
    print(n, at.get_chemical_formula(), round(e, 4), float(np.abs(f).max()))
idx = rng.permutation(len(frames))
write(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'train.xyz'), [frames[i] for i in idx[:40]], format='extxyz')
write(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'test.xyz'), [frames[i] for i in idx[40:]], format='extxyz')
