"""Imported models (mltorch-import) through LAMMPS against their framework's own model:
what the test files share (cells, LAMMPS runs, imports, the comparison).

The tests, by framework: test_imported_sevennet.py, test_imported_nequip.py,
test_imported_mace.py (in .venv-mace), test_imported_kokkos.py (torch/kk).
Run: python unittest/test_imported_sevennet.py -v   (ctest does, with
ML_TORCH_LMP and ML_TORCH_MPIEXEC set).
"""

import os
import subprocess
import sys
import tempfile
import unittest
import warnings

import numpy as np

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(here)
sys.path.insert(0, os.path.join(root, "python"))
warnings.filterwarnings("ignore")

NKTV2P = 1.6021765e6           # LAMMPS metal: bar * A^3 -> eV
NKTV2P_OF = {"metal": NKTV2P, "real": 68568.415}    # real: atm * A^3 -> kcal/mol
ELEMENTS = ["Zn", "S", "Se"]


def zincblende_cell(a, pick, shear, rattle, seed):
    """64 atoms on a zincblende 2x2x2 cell of side 2a, sheared (xy, xz, yz) into
    a triclinic cell in LAMMPS's orientation and rattled by `rattle` A;
    pick(rng) gives the (cation, anion) symbols of each site pair."""
    rng = np.random.default_rng(seed)
    fcc = np.array([[0, 0, 0], [0, .5, .5], [.5, 0, .5], [.5, .5, 0]])
    frac, symbols = [], []
    for i in range(2):
        for j in range(2):
            for k in range(2):
                for b in fcc:
                    cation, anion = pick(rng)
                    frac.append((b + [i, j, k]) / 2)
                    symbols.append(cation)
                    frac.append((b + 0.25 + [i, j, k]) / 2)
                    symbols.append(anion)
    xy, xz, yz = shear
    cell = 2 * a * np.array([[1.0, 0.0, 0.0], [xy, 1.0, 0.0], [xz, yz, 1.0]])
    pos = np.array(frac) @ cell + rng.normal(0, rattle, (len(frac), 3))
    return pos, cell, symbols


def ternary_cell(seed=5):
    """ZnS with a quarter of S replaced by Se."""
    return zincblende_cell(5.55, lambda rng: ("Zn", "Se" if rng.random() < 0.25 else "S"),
                           (0.10, -0.07, 0.12), 0.08, seed)


def binary_cell(seed=9):
    """SiC with an eighth of the site pairs swapped (antisites)."""
    return zincblende_cell(4.36, lambda rng: ("C", "Si") if rng.random() < 0.125 else ("Si", "C"),
                           (0.08, -0.05, 0.1), 0.06, seed)


def write_data(path, pos, cell, symbols, elements=ELEMENTS):
    from ase.data import atomic_masses, atomic_numbers
    types = [elements.index(s) + 1 for s in symbols]
    with open(path, "w") as f:
        f.write(f"test cell\n\n{len(pos)} atoms\n{len(elements)} atom types\n\n")
        f.write(f"0 {cell[0, 0]:.17g} xlo xhi\n0 {cell[1, 1]:.17g} ylo yhi\n0 {cell[2, 2]:.17g} zlo zhi\n")
        f.write(f"{cell[1, 0]:.17g} {cell[2, 0]:.17g} {cell[2, 1]:.17g} xy xz yz\n\n")
        f.write("Masses\n\n" + "".join(f"{t + 1} {atomic_masses[atomic_numbers[e]]:.6f}\n"
                                        for t, e in enumerate(elements)))
        f.write("\nAtoms # atomic\n\n")
        for i, (p, t) in enumerate(zip(pos, types)):
            f.write(f"{i + 1} {t} {p[0]:.17g} {p[1]:.17g} {p[2]:.17g}\n")


def run_lammps(model, pos, cell, symbols, ranks, elements=ELEMENTS, launcher=None,
               units="metal", pair=None):
    """Energy, forces [n,3], virial [6] (xx yy zz xy xz yz, energy units) and
    per-atom energies, under LAMMPS `units` (metal: eV; real: kcal/mol).
    `pair`: other pair_style and pair_coeff lines than the model's alone."""
    pair = pair or f"pair_style torch\npair_coeff * * {model} {' '.join(elements)}"
    work = tempfile.mkdtemp(prefix="imported-")
    write_data(os.path.join(work, "cell.data"), pos, cell, symbols, elements)
    script = f"""
units {units}
atom_style atomic
atom_modify map array
read_data cell.data
{pair}
compute pea all pe/atom
compute vir all pressure NULL virial
thermo_style custom step pe
run 0 post no
write_dump all custom forces.dump id fx fy fz c_pea modify sort id format float %.17g
print "RESULT $(pe:%.17g) $(c_vir[1]:%.17g) $(c_vir[2]:%.17g) $(c_vir[3]:%.17g) \
$(c_vir[4]:%.17g) $(c_vir[5]:%.17g) $(c_vir[6]:%.17g) $(vol:%.17g)"
"""
    with open(os.path.join(work, "in.imported"), "w") as f:
        f.write(script)
    # `launcher`: the start of another command line than mpiexec + ML_TORCH_LMP
    mpiexec = os.environ.get("ML_TORCH_MPIEXEC", "mpiexec")
    launcher = launcher or [mpiexec, "--allow-run-as-root", "--oversubscribe", "-np", str(ranks),
                            os.environ["ML_TORCH_LMP"]]
    out = subprocess.run([*launcher, "-log", "none", "-echo", "none", "-nocite", "-in",
                          "in.imported"], capture_output=True, text=True, cwd=work,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    if out.returncode != 0:
        raise AssertionError(out.stdout[-3000:] + out.stderr[-3000:])
    v = [float(w) for w in out.stdout.split("RESULT ")[1].split()[:8]]
    with open(os.path.join(work, "forces.dump")) as f:
        lines = f.read().splitlines()
    data = np.array([[float(w) for w in line.split()] for line in lines[9:]])
    return {"energy": v[0], "virial": np.array(v[1:7]) * v[7] / NKTV2P_OF[units],
            "forces": data[:, 1:4], "energies": data[:, 4], "log": out.stdout}


def virial_of(stress, volume):
    """ASE stress (xx yy zz yz xz xy, eV/A^3) -> LAMMPS virial order xx yy zz xy xz yz (eV)."""
    xx, yy, zz, yz, xz, xy = stress
    return -np.array([xx, yy, zz, xy, xz, yz]) * volume


def import_model(path, dtype, framework="sevenn", source="7net-0", elements=ELEMENTS):
    """mltorch-import as a user runs it (the project environment's command)."""
    out = subprocess.run([os.path.join(root, ".venv", "bin", "mltorch-import"), framework, source,
                          "-o", path, "--elements", *elements, "--dtype", dtype],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise AssertionError(out.stdout + out.stderr)
    return out.stdout


def has(module):
    """Whether `module` imports here (sevenn refuses MACE's e3nn 0.4 with a ValueError)."""
    try:
        __import__(module)
    except (ImportError, ValueError):
        return False
    return True


class ImportedThroughLammps(unittest.TestCase):
    """What the importer tests share: a periodic triclinic cell (`cell_of`),
    the comparison and one import run through LAMMPS on 1 and 3 ranks."""
    cell_of = staticmethod(binary_cell)

    @classmethod
    def setUpClass(cls):
        from ase import Atoms
        cls.work = tempfile.mkdtemp(prefix="imported-")
        cls.pos, cls.cell, cls.symbols = cls.cell_of()
        cls.atoms = Atoms(cls.symbols, positions=cls.pos, cell=cls.cell, pbc=True)
        cls.volume = abs(np.linalg.det(cls.cell))

    def compare(self, got, ref, tol_rel, what):
        scale_f = np.abs(ref["forces"]).max()
        d = {"energy": abs(got["energy"] - ref["energy"]) / abs(ref["energy"]),
             "forces": np.abs(got["forces"] - ref["forces"]).max() / scale_f,
             "virial": np.abs(got["virial"] - ref["virial"]).max() / np.abs(ref["virial"]).max(),
             "energies": np.abs(got["energies"] - ref["energies"]).max() / np.abs(ref["energies"]).max()}
        print(f"\n{what}: relative differences " + ", ".join(f"{k} {v:.2g}" for k, v in d.items()))
        for key, value in d.items():
            self.assertLess(value, tol_rel, f"{what}: {key}")
        return d

    def through_lammps(self, framework, name, source, dtype, tol, ref, elements, layered=True):
        """Import `source` as a user does, run it on 1 and 3 ranks, compare with `ref`."""
        model = os.path.join(self.work, f"{name}_{dtype}.pt")
        print(import_model(model, dtype, framework, source, elements))
        for ranks in (1, 3):
            got = run_lammps(model, self.pos, self.cell, self.symbols, ranks, elements)
            if layered:
                self.assertIn("halo exchange", got["log"])
            self.compare(got, ref, tol, f"{name} {dtype}, {ranks} rank(s) (tolerance {tol:.2g})")


def small_cell(symbols, a=5.45, seed=3):
    """8 atoms (`symbols`) on a rattled, sheared diamond cell of side `a`:
    periodic, triclinic, every atom sees images of itself within 5 A."""
    rng = np.random.default_rng(seed)
    fcc = np.array([[0, 0, 0], [0, .5, .5], [.5, 0, .5], [.5, .5, 0]])
    frac = np.concatenate([fcc, fcc + 0.25])
    cell = a * np.array([[1.0, 0.0, 0.0], [0.09, 1.0, 0.0], [-0.06, 0.11, 1.0]])
    return frac @ cell + rng.normal(0, 0.07, (8, 3)), cell, list(symbols)


def evaluate_file(module, num_layers, pos, cell, species, cutoff):
    """Per-atom energies and forces of an ML-TORCH model as pair_style torch
    runs it: the stages with the exchange (ghosts one cutoff deep, several
    ranks) and forward() on the folded graph (one rank: periodic edges
    between the owned atoms, `fold`); numpy float64."""
    import torch
    from mltorch import graph as graphs
    from mltorch import layered
    e_l, f_l, _ = layered.evaluate(module, num_layers, torch.tensor(pos), torch.tensor(cell),
                                   torch.tensor(species), cutoff, layered=True)
    g = graphs.build_graph(torch.tensor(pos), torch.tensor(cell), torch.tensor(species), cutoff)
    x = torch.tensor(pos, requires_grad=True)
    vec = graphs.edge_vectors(g, x, torch.tensor(cell))
    n = g.n_local
    e_f = module(vec, g.owner[g.edge_index], g.species[:n], n)[:n]
    (dx,) = torch.autograd.grad(e_f.sum(), [x])
    out = {}
    for name, e, f in (("stages", e_l, f_l), ("folded forward", e_f, -dx)):
        e = e.detach().double().numpy()
        out[name] = {"energy": float(e.sum()), "energies": e, "forces": f.detach().double().numpy()}
    return out


def relative_differences(got, ref):
    """energy, per-atom energies and forces: max |difference| / max |reference|."""
    return {"energy": abs(got["energy"] - ref["energy"]) / abs(ref["energy"]),
            "energies": float(np.abs(got["energies"] - ref["energies"]).max()
                              / np.abs(ref["energies"]).max()),
            "forces": float(np.abs(got["forces"] - ref["forces"]).max()
                            / np.abs(ref["forces"]).max())}


def assert_file_matches(test, module, num_layers, pos, cell, species, cutoff, ref, what, tol=1e-10):
    """evaluate_file() on both paths against `ref` (the framework's own numbers):
    every relative difference below `tol`, each printed."""
    for how, values in evaluate_file(module, num_layers, pos, cell, species, cutoff).items():
        d = relative_differences(values, ref)
        print(f"{what}, {how}: relative differences " + ", ".join(f"{k} {v:.2g}" for k, v in d.items()))
        for key, value in d.items():
            test.assertLess(value, tol, f"{what}, {how}: {key}")


MACE_MODEL = os.path.join(root, "potentials", "frameworks", "mace_sic", "mace_sic.model")
SIC = ["Si", "C"]

NEQUIP_DIR = os.path.join(root, "potentials", "frameworks", "nequip_sic")
