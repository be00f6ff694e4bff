"""The import check of mltorch-import: the written file evaluated on periodic
triclinic cells that hold every element of the file, against the
framework's own model (energy, per-atom energies, forces), judged against
the tolerance of the file's dtype."""

import numpy as np
import torch

from .. import layered

CHECK_CELL_ATOMS = 8


def _check_cell(elements, cutoff, seed=11):
    """A periodic triclinic cell of 8 atoms of the given elements (at most 8,
    each at least once) on a rattled, sheared diamond lattice (neighbours
    about 2.4 A apart), smaller than the cutoff in every direction, so that
    every atom sees images of itself."""
    gen = np.random.default_rng(seed)
    a = 5.5
    cell = a * np.array([[1.0, 0.0, 0.0], [0.12, 1.0, 0.0], [-0.08, 0.15, 1.0]])
    base = np.array([[0, 0, 0], [0, .5, .5], [.5, 0, .5], [.5, .5, 0]], dtype=float)
    frac = np.concatenate([base, base + 0.25])
    pos = frac @ cell + gen.normal(0, 0.06, (len(frac), 3))
    species = np.arange(len(frac)) % len(elements)
    return pos, cell, species


def check_cells(elements, cutoff):
    """The cells of the import check: every element of the file at least once,
    in chunks of at most 8 elements per 8-atom cell (a model of 89 elements:
    12 cells). Each is (pos, cell, indices into `elements`)."""
    n = len(elements)
    chunks = -(-n // CHECK_CELL_ATOMS)
    cells = []
    for c in range(chunks):
        members = list(range(c * n // chunks, (c + 1) * n // chunks))
        pos, cell, species = _check_cell([elements[i] for i in members], cutoff, seed=11 + c)
        cells.append((pos, cell, np.array(members)[species]))
    return cells


def agreement(scripted, meta, references, elements):
    """Largest differences of the file's energies, per-atom energies and forces
    (stages with the exchange) from the framework's own on the check cells.

    references(list of ase.Atoms) -> list of dicts (energy, energies, forces).
    energy: |dE| / max(1, |E|) per cell; energies: max |de_i| eV and that over
    max(1, max |e_i|) ("energies_rel"); forces: max |dF| eV/A."""
    from ase import Atoms
    cells = check_cells(elements, meta["cutoff"])
    atoms = [Atoms([elements[s] for s in species], positions=pos, cell=cell, pbc=True)
             for pos, cell, species in cells]
    refs = references(atoms)
    layers = meta["num_interaction_layers"]
    d = {"energy": 0.0, "energies": 0.0, "energies_rel": 0.0, "forces": 0.0,
         "atoms": sum(len(a) for a in atoms), "cells": len(cells)}
    for (pos, cell, species), ref in zip(cells, refs):
        e, f, _ = layered.evaluate(scripted, layers, torch.tensor(pos), torch.tensor(cell),
                                   torch.tensor(species), meta["cutoff"],
                                   layered="layered" in meta)
        e = e.detach().double().numpy()
        f = f.detach().double().numpy()
        ref_e = np.asarray(ref["energies"], dtype=np.float64).reshape(-1)
        de = float(np.abs(e - ref_e).max())
        d["energy"] = max(d["energy"], abs(float(e.sum()) - ref["energy"])
                          / max(1.0, abs(ref["energy"])))
        d["energies"] = max(d["energies"], de)
        d["energies_rel"] = max(d["energies_rel"], de / max(1.0, float(np.abs(ref_e).max())))
        d["forces"] = max(d["forces"], float(np.abs(f - ref["forces"]).max()))
    return d


CHECK_TOLERANCE = {"float64": 1e-10, "float32": 5e-4}
ENERGY_UNIT = {"metal": "eV", "real": "kcal/mol"}


def check_import(scripted, meta, references, elements):
    """The import check: agreement() on every element, judged against the
    tolerance of the file's dtype -> (differences, what failed, tolerance).
    Energy and per-atom energies relative (to max(1, |value|)), forces in
    eV/A over 10."""
    d = agreement(scripted, meta, references, elements)
    tol = CHECK_TOLERANCE[meta["dtype"]]
    failed = [what for what, value in (("energy", d["energy"]),
                                       ("per-atom energies", d["energies_rel"]),
                                       ("forces", d["forces"] / 10.0)) if not value <= tol]
    return d, failed, tol
