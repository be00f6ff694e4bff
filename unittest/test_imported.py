"""Imported models (mltorch-import) through LAMMPS against their framework's own model.

SevenNet-0 (the checkpoint shipped in the `sevenn` wheel) imported with
`mltorch-import sevenn`, run by `pair_style torch` (per-layer halo exchange,
one cutoff of ghosts) on 1 and 3 ranks, on a periodic triclinic ternary
(Zn, S, Se) cell: energy, forces, virial and per-atom energies against
SevenNet's own graph and model (sevenn's `unlabeled_atoms_to_graph` and
AtomGraphSequential, which is what `SevenNetCalculator` runs) in float64 to
1e-10 relative, and in float32 against `SevenNetCalculator` itself.

Without LAMMPS: every checkpoint the sevenn wheel ships and every modality
of each (7net-mf-0: PBE, R2SCAN) against SevenNet's own model in float64
(`SevenNetCheckpoints`), and `mltorch-import sevenn` on a multi-fidelity
checkpoint named by a relative path: the absolute path recorded, the import
check over every element and per-atom energies (`SevenNetImportCommand`).

MACE foundation-model architectures with a ZBL pair repulsion (MP-0b3,
MPA-0/OMAT-0; built by MACE's own code, random weights) against
MACECalculator, without LAMMPS (`MACEPairRepulsion`) and through LAMMPS
(`MACEPairRepulsionThroughLammps`), both in .venv-mace; a NequIP model in
kcal/mol (real units) against NequIPCalculator and the units the importer
records (`NequIPUnits`, no LAMMPS), and through LAMMPS under `units real`,
refused under `units metal` (`NequIPRealUnitsThroughLammps`), both in .venv.

Run: python unittest/test_imported.py -v   (ctest does, with ML_TORCH_LMP and
ML_TORCH_MPIEXEC set); the classes without LAMMPS alone:
python unittest/test_imported.py -v SevenNetCheckpoints SevenNetImportCommand NequIPUnits
.venv-mace/bin/python unittest/test_imported.py -v MACEPairRepulsion
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
sys.path.insert(0, os.path.join(root, "potentials"))
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
               units="metal"):
    """Energy, forces [n,3], virial [6] (xx yy zz xy xz yz, energy units) and
    per-atom energies, under LAMMPS `units` (metal: eV; real: kcal/mol)."""
    work = tempfile.mkdtemp(prefix="imported-")
    write_data(os.path.join(work, "cell.data"), pos, cell, symbols, elements)
    script = f"""
units {units}
atom_style atomic
atom_modify map array
read_data cell.data
pair_style torch
pair_coeff * * {model} {' '.join(elements)}
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


@unittest.skipUnless(os.environ.get("ML_TORCH_LMP"), "ML_TORCH_LMP (the lmp executable) not set")
@unittest.skipUnless(has("sevenn"), "sevenn is not installed in this environment")
class SevenNetThroughLammps(ImportedThroughLammps):
    cell_of = staticmethod(ternary_cell)

    def test_float64_equals_sevenn_on_1_and_3_ranks(self):
        from mltorch.importers import sevenn as s7
        model = os.path.join(self.work, "7net-0_f64.pt")
        print(import_model(model, "float64"))
        ref = s7.reference(self.atoms, "7net-0", "float64")
        ref["virial"] = virial_of(ref["stress"], self.volume)
        for ranks in (1, 3):
            got = run_lammps(model, self.pos, self.cell, self.symbols, ranks)
            self.assertIn("halo exchange", got["log"])
            self.compare(got, ref, 1e-10, f"float64, {ranks} rank(s)")

    def test_float32_equals_sevenn_calculator_on_1_and_3_ranks(self):
        """float32 against SevenNetCalculator to its own float32 noise: the
        tolerance is 10x the calculator's own distance from float64 SevenNet."""
        from mltorch.importers import sevenn as s7
        from sevenn.calculator import SevenNetCalculator
        model = os.path.join(self.work, "7net-0_f32.pt")
        print(import_model(model, "float32"))
        atoms = self.atoms.copy()
        atoms.calc = SevenNetCalculator("7net-0", device="cpu")
        calc = {"energy": atoms.get_potential_energy(), "forces": atoms.get_forces(),
                "energies": atoms.calc.results["energies"],
                "virial": virial_of(atoms.get_stress(), self.volume)}
        exact = s7.reference(self.atoms, "7net-0", "float64")
        exact["virial"] = virial_of(exact["stress"], self.volume)
        noise = self.compare(calc, exact, 1e-4, "SevenNetCalculator (float32) vs float64 SevenNet")
        tol = 10 * max(noise.values())
        for ranks in (1, 3):
            got = run_lammps(model, self.pos, self.cell, self.symbols, ranks)
            self.compare(got, calc, tol, f"float32, {ranks} rank(s), vs SevenNetCalculator "
                                         f"(tolerance {tol:.2g})")


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


def shipped_sevenn_checkpoints():
    """(name, modality) for every checkpoint file of the installed sevenn
    wheel and every modality of each (None for single-fidelity), one name per
    file; fails if the wheel ships a checkpoint the importer does not name."""
    import glob
    import sevenn
    from sevenn.util import load_checkpoint
    from mltorch.importers import sevenn as s7
    folder = os.path.join(os.path.dirname(sevenn.__file__), "pretrained_potentials")
    files = sorted(os.path.relpath(f, folder) for f in glob.glob(os.path.join(folder, "*", "*.pth")))
    names = {}
    for name, rel in s7.PRETRAINED.items():
        names.setdefault(rel, name)      # the first name of each file (7net-0, not its alias)
    missing = [f for f in files if f not in names]
    if missing:
        raise AssertionError(f"the sevenn wheel ships {missing}, which mltorch-import's "
                             "PRETRAINED does not name")
    out = []
    for rel in files:
        config = load_checkpoint(os.path.join(folder, rel)).config
        modal_map = config.get("_modal_map") if config.get("use_modality") else None
        for modality in (sorted(modal_map, key=modal_map.get) if modal_map else [None]):
            out.append((names[rel], modality))
    return out


@unittest.skipUnless(has("sevenn"), "sevenn is not installed in this environment")
class SevenNetCheckpoints(unittest.TestCase):
    """Every checkpoint the sevenn wheel ships, every modality (fidelity head)
    of each, imported (the wrapper, scripted as the file is) in float64 against
    SevenNet's own model with that modality (what SevenNetCalculator(modal=)
    runs, in float64) on an 8-atom periodic triclinic Hf/O/Si cell: energy,
    forces and per-atom energies to 1e-10 relative, through the stages with
    the exchange and through forward() on the folded graph. No LAMMPS."""

    ELEMENTS = ["Hf", "O", "Si"]
    SYMBOLS = ["Hf", "O", "Si", "O", "Si", "O", "Hf", "O"]

    def test_every_shipped_checkpoint_and_modality_float64(self):
        import torch
        from ase import Atoms
        from mltorch.importers import sevenn as s7
        pos, cell, symbols = small_cell(self.SYMBOLS)
        atoms = Atoms(symbols, positions=pos, cell=cell, pbc=True)
        species = [self.ELEMENTS.index(e) for e in symbols]
        heads = shipped_sevenn_checkpoints()
        print(f"\nshipped checkpoints and modalities: {heads}")
        self.assertIn(("7net-mf-0", "PBE"), heads)
        self.assertIn(("7net-mf-0", "R2SCAN"), heads)
        energies = {}
        for name, modality in heads:
            what = name + (f" --modality {modality}" if modality else "")
            with self.subTest(what):
                model = s7.SevenNetModel(name, elements=self.ELEMENTS, dtype="float64",
                                         modality=modality)
                model.script_blocks()
                scripted = torch.jit.script(model)
                ref = s7.reference(atoms, name, "float64", modality)
                energies[(name, modality)] = ref["energy"]
                got = evaluate_file(scripted, model.num_blocks, pos, cell, species, model.cutoff)
                for path, values in got.items():
                    d = relative_differences(values, ref)
                    print(f"{what}, {path}: relative differences "
                          + ", ".join(f"{k} {v:.2g}" for k, v in d.items()))
                    for key, value in d.items():
                        self.assertLess(value, 1e-10, f"{what}, {path}: {key}")
        # the heads are different models: a modality that is not reaching
        # the layers would give one head's numbers for both
        pbe, r2scan = energies[("7net-mf-0", "PBE")], energies[("7net-mf-0", "R2SCAN")]
        print(f"7net-mf-0 energies: PBE {pbe:.6f} eV, R2SCAN {r2scan:.6f} eV")
        self.assertGreater(abs(pbe - r2scan), 1e-3)

    def test_reference_modality_is_the_calculators(self):
        """s7.reference(..., modality) in float32 is SevenNetCalculator(modal=...)."""
        from ase import Atoms
        from mltorch.importers import sevenn as s7
        from sevenn.calculator import SevenNetCalculator
        pos, cell, symbols = small_cell(self.SYMBOLS)
        for modality in ("PBE", "R2SCAN"):
            atoms = Atoms(symbols, positions=pos, cell=cell, pbc=True)
            atoms.calc = SevenNetCalculator("7net-mf-0", modal=modality, device="cpu")
            calc = {"energy": atoms.get_potential_energy(), "forces": atoms.get_forces(),
                    "energies": atoms.calc.results["energies"]}
            ref = s7.reference(atoms, "7net-mf-0", "float32", modality)
            d = relative_differences(ref, calc)
            print(f"\n7net-mf-0 {modality}: reference (float32) vs SevenNetCalculator: "
                  + ", ".join(f"{k} {v:.2g}" for k, v in d.items()))
            for key, value in d.items():
                self.assertLess(value, 1e-6, f"{modality}: {key}")


@unittest.skipUnless(has("sevenn"), "sevenn is not installed in this environment")
class SevenNetImportCommand(unittest.TestCase):
    """`mltorch-import sevenn` as a user runs it on a multi-fidelity
    checkpoint named by a relative path (7net-mf-0, --modality R2SCAN,
    float32, 5 elements), and the import check it runs. No LAMMPS."""

    ELEMENTS = ["Hf", "O", "Si", "Zn", "S"]

    @classmethod
    def setUpClass(cls):
        import sevenn
        from mltorch.importers import sevenn as s7
        cls.work = tempfile.mkdtemp(prefix="sevenn-import-")
        cls.shipped = os.path.join(os.path.dirname(sevenn.__file__), "pretrained_potentials",
                                   s7.PRETRAINED["7net-mf-0"])
        os.symlink(cls.shipped, os.path.join(cls.work, "mf.pth"))
        cls.model = os.path.join(cls.work, "mf.pt")
        cls.out = subprocess.run([os.path.join(root, ".venv", "bin", "mltorch-import"), "sevenn",
                                  "mf.pth", "--modality", "R2SCAN", "-o", "mf.pt",
                                  "--elements", *cls.ELEMENTS], capture_output=True, text=True,
                                 cwd=cls.work)

    def imported(self):
        self.assertEqual(self.out.returncode, 0, self.out.stdout[-3000:] + self.out.stderr[-3000:])
        from mltorch.export import read_metadata
        return read_metadata(self.model)

    def test_multi_fidelity_imports_and_passes_its_check(self):
        meta = self.imported()
        print("\n" + self.out.stdout)
        self.assertIn("check against sevenn's own model", self.out.stdout)
        self.assertIn("every one of the 5 element(s)", self.out.stdout)
        self.assertEqual(meta["imported"]["modality"], "R2SCAN")
        self.assertEqual(meta["architecture"]["kwargs"]["modality"], "R2SCAN")
        self.assertEqual(meta["elements"], self.ELEMENTS)

    def test_checkpoint_path_is_absolute(self):
        """The checkpoint typed as a relative path is recorded absolute (what
        mltorch-compile rebuilds from, from any directory), as MACE's and
        NequIP's importers record theirs."""
        meta = self.imported()
        where = os.path.join(self.work, "mf.pth")
        self.assertTrue(os.path.isabs(meta["architecture"]["kwargs"]["checkpoint"]))
        self.assertEqual(meta["architecture"]["kwargs"]["checkpoint"], where)
        self.assertEqual(meta["imported"]["model"], where)
        from mltorch.importers.common import sha256
        self.assertEqual(meta["imported"]["checkpoint_sha256"], sha256(self.shipped))

    def main_with(self, corrupt):
        """mltorch-import's main() on the same arguments with SevenNet's own
        numbers passed through corrupt(atoms, ref) -> ref; its export is the
        file setUpClass wrote (the same model, without the minute export
        takes) -> (exit status, stdout, stderr)."""
        import contextlib
        import io
        import shutil
        from unittest import mock
        from mltorch import importers
        from mltorch.export import read_metadata
        from mltorch.importers import sevenn as s7
        self.imported()

        def export(module, path, **kwargs):
            shutil.copyfile(self.model, path)
            return read_metadata(path)
        patches = [mock.patch.object(importers, "export", export)]
        reference = s7.reference
        patches.append(mock.patch.object(
            s7, "reference", lambda atoms, *a, **k: corrupt(atoms, reference(atoms, *a, **k))))
        if hasattr(s7, "references"):
            references = s7.references
            patches.append(mock.patch.object(
                s7, "references", lambda atoms_list, *a, **k: [
                    corrupt(x, r) for x, r in zip(atoms_list, references(atoms_list, *a, **k))]))
        out, err = io.StringIO(), io.StringIO()
        with contextlib.ExitStack() as stack:
            for p in patches:
                stack.enter_context(p)
            stack.enter_context(contextlib.redirect_stdout(out))
            stack.enter_context(contextlib.redirect_stderr(err))
            rc = importers.main(["sevenn", os.path.join(self.work, "mf.pth"), "--modality",
                                 "R2SCAN", "-o", os.path.join(self.work, "again.pt"),
                                 "--elements", *self.ELEMENTS])
        print("\n" + out.getvalue() + err.getvalue())
        return rc, out.getvalue(), err.getvalue()

    def test_check_catches_permuted_per_atom_energies(self):
        """Per-atom energies permuted (the same total, the same forces) fail the check."""
        def permuted(atoms, ref):
            ref = dict(ref)
            order = np.argsort(ref["energies"])       # distinct values: a real permutation
            ref["energies"] = ref["energies"][np.roll(order, 1)]
            return ref
        rc, _, err = self.main_with(permuted)
        self.assertEqual(rc, 1)
        self.assertIn("(per-atom energies; tolerance", err)

    def test_check_covers_every_element(self):
        """An error on the atoms of the last element only (the fifth of five,
        0.05 eV per atom) fails the check; the check cells hold every element,
        also of a file of all SevenNet's 89."""
        last = self.ELEMENTS[-1]

        def last_wrong(atoms, ref):
            ref = dict(ref)
            wrong = np.array(atoms.get_chemical_symbols()) == last
            ref["energies"] = ref["energies"] + 0.05 * wrong
            ref["energy"] = ref["energy"] + 0.05 * wrong.sum()
            return ref
        rc, _, err = self.main_with(last_wrong)
        self.assertEqual(rc, 1)
        self.assertIn("per-atom energies", err)
        from ase.data import chemical_symbols
        from mltorch.importers import check_cells
        many = chemical_symbols[1:90]
        cells = check_cells(many, 5.0)
        self.assertEqual(sorted({int(x) for _, _, species in cells for x in species}),
                         list(range(len(many))))
        self.assertTrue(all(len(species) == 8 for _, _, species in cells))
        print(f"89 elements: {len(cells)} check cells of 8 atoms")


MACE_MODEL = os.path.join(root, "potentials", "frameworks", "mace_sic", "mace_sic.model")
SIC = ["Si", "C"]


@unittest.skipUnless(os.environ.get("ML_TORCH_LMP"), "ML_TORCH_LMP (the lmp executable) not set")
@unittest.skipUnless(has("mace"), "mace-torch is not installed in this environment (.venv-mace)")
class MACEThroughLammps(ImportedThroughLammps):
    """A MACE model trained by MACE's own CLI (potentials/frameworks/mace_sic)
    imported with `mltorch-import mace` (which runs in .venv-mace), through
    pair_style torch on 1 and 3 ranks, against MACECalculator on a 64-atom
    triclinic SiC cell with antisites."""

    def reference(self, dtype):
        from mltorch.importers import mace as mc
        ref = mc.reference(self.atoms, MACE_MODEL, dtype)
        ref["virial"] = virial_of(ref["stress"], self.volume)
        return ref

    def test_float64_equals_mace_on_1_and_3_ranks(self):
        self.through_lammps("mace", "mace", MACE_MODEL, "float64", 1e-10, self.reference("float64"),
                            SIC)

    def test_float32_equals_mace_calculator_on_1_and_3_ranks(self):
        """float32 against MACECalculator in float32 to its own float32 noise:
        the tolerance is 10x the calculator's distance from its float64 self."""
        calc = self.reference("float32")
        noise = self.compare(calc, self.reference("float64"), 1e-3,
                             "MACECalculator (float32) vs MACECalculator (float64)")
        self.through_lammps("mace", "mace", MACE_MODEL, "float32", 10 * max(noise.values()), calc,
                            SIC)


# --- MACE foundation models with a ZBL pair repulsion (issue 33 item 4) -------
# MACE-MP-0b3, MPA-0 and OMAT-0 are built with `pair_repulsion` (MACE's
# ZBLBasis) and the Agnesi distance transform; MP-0b3 with MACE's residual
# interaction blocks, MPA-0 and OMAT-0 with its density-normalised ones (as
# their published training commands and other codes' ports of them say; the
# model files themselves are not downloaded here). They are rebuilt here by MACE's own code (its CLI's argument parser, check_args
# and configure_model, as `mace_run_train --model MACE` builds them) with
# those hyperparameters, scaled down for speed (8 channels instead of 128,
# max_L 1, max_ell 3, correlation 3, r_max 6 A, 10 Bessel functions, radial
# MLP [16, 16, 16]), random weights, float64.
MACE_ZBL_ELEMENTS = ["C", "O", "Si", "Hf"]
MACE_ZBL_VARIANTS = {
    "mp-0b3": ("RealAgnosticInteractionBlock", "RealAgnosticResidualInteractionBlock"),
    "mpa-0": ("RealAgnosticDensityInteractionBlock", "RealAgnosticDensityResidualInteractionBlock"),
}


def build_mace_zbl(variant, path, elements=MACE_ZBL_ELEMENTS, seed=7):
    """A ScaleShiftMACE with pair repulsion built by MACE's own code (see
    above) with random weights, random E0s, scale 0.7, saved as
    mace_run_train saves a model (torch.save of the module)."""
    import contextlib
    import io
    import logging
    import torch
    from ase.data import atomic_numbers
    from mace import tools
    from mace.tools.arg_parser_tools import check_args
    from mace.tools.model_script_utils import configure_model
    first, interaction = MACE_ZBL_VARIANTS[variant]
    argv = ["--name", variant, "--train_file", "unused.xyz", "--model", "MACE",
            "--interaction_first", first, "--interaction", interaction,
            "--num_interactions", "2", "--correlation", "3", "--max_ell", "3", "--r_max", "6.0",
            "--max_L", "1", "--num_channels", "8", "--num_radial_basis", "10",
            "--MLP_irreps", "4x0e", "--radial_MLP", "[16,16,16]", "--pair_repulsion",
            "--distance_transform", "Agnesi", "--default_dtype", "float64", "--seed", str(seed)]
    logging.disable(logging.WARNING)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        args, _ = check_args(tools.build_default_arg_parser().parse_args(argv))
        # what run_train sets from the data: outputs, statistics
        args.compute_energy, args.compute_dipole, args.compute_polarizability = True, False, False
        args.mean, args.std, args.avg_num_neighbors = 0.0, 0.7, 40.0
        tools.set_seeds(seed)
        e0 = np.random.default_rng(seed).uniform(-9.0, -1.0, len(elements))
        z_table = tools.AtomicNumberTable([atomic_numbers[e] for e in elements])
        with contextlib.redirect_stdout(io.StringIO()):
            model, _ = configure_model(args, None, e0, heads=["Default"], z_table=z_table)
    finally:
        torch.set_default_dtype(old)
    assert hasattr(model, "pair_repulsion") and type(model).__name__ == "ScaleShiftMACE"
    torch.save(model.double(), path)
    return path


def without_pair_repulsion(path, out):
    """The same model with MACE's pair repulsion switched off (MACE's forward
    runs it where the model has the flag `pair_repulsion`)."""
    import torch
    model = torch.load(path, weights_only=False, map_location="cpu")
    del model.pair_repulsion
    torch.save(model, out)
    return out


def compressed_cell(seed=4):
    """64 atoms of C, O, Si and Hf on a triclinic zincblende cell compressed
    until nearest neighbours are about 1.7 A apart, well inside the ZBL range
    (the sum of the covalent radii) of most pairs."""
    def pick(rng):
        return tuple(str(e) for e in rng.choice(MACE_ZBL_ELEMENTS, 2))
    return zincblende_cell(3.9, pick, (0.07, -0.05, 0.09), 0.08, seed)


@unittest.skipUnless(has("mace"), "mace-torch is not installed in this environment (.venv-mace)")
class MACEPairRepulsion(unittest.TestCase):
    """MACE models with a ZBL pair repulsion and the Agnesi transform (the
    MP-0b3 and the MPA-0/OMAT-0 architecture, built by MACE's own code, random
    weights), imported (the wrapper, scripted as the file is) in float64
    against MACECalculator on an 8-atom periodic triclinic C/O/Si/Hf cell
    compressed into the ZBL range: energy, forces and per-atom energies to
    1e-10 relative, through the stages with the exchange and through
    forward() on the folded graph; the pair repulsion moves each of them by
    more than 1e-4 relative (the same model without it). No LAMMPS."""

    SYMBOLS = ["Hf", "O", "Si", "C", "C", "Si", "O", "Hf"]

    @classmethod
    def setUpClass(cls):
        cls.work = tempfile.mkdtemp(prefix="mace-zbl-")

    def test_zbl_models_equal_mace_float64(self):
        import torch
        from ase import Atoms
        from mltorch.importers import mace as mc
        pos, cell, symbols = small_cell(self.SYMBOLS, a=3.9)
        atoms = Atoms(symbols, positions=pos, cell=cell, pbc=True)
        species = [MACE_ZBL_ELEMENTS.index(e) for e in symbols]
        for variant in MACE_ZBL_VARIANTS:
            with self.subTest(variant):
                path = build_mace_zbl(variant, os.path.join(self.work, f"{variant}.model"))
                ref = mc.reference(atoms, path, "float64")
                bare = mc.reference(atoms, without_pair_repulsion(
                    path, os.path.join(self.work, f"{variant}-no-zbl.model")), "float64")
                share = relative_differences(bare, ref)
                print(f"\n{variant}: the pair repulsion changes energy {share['energy']:.2g}, "
                      f"per-atom energies {share['energies']:.2g}, forces {share['forces']:.2g} "
                      f"(relative; energy {ref['energy']:.6g} eV, {bare['energy']:.6g} without)")
                # a wrapper without the term (or with it off by its scale) would miss
                # by a million times the tolerance or more
                for key, value in share.items():
                    self.assertGreater(value, 1e-4, f"{variant}: the ZBL term hardly counts ({key})")
                model = mc.MACEModel(path, elements=MACE_ZBL_ELEMENTS, dtype="float64")
                self.assertTrue(model.has_pair_repulsion)
                model.script_blocks()
                scripted = torch.jit.script(model)
                got = evaluate_file(scripted, model.num_layers, pos, cell, species, model.cutoff)
                for how, values in got.items():
                    d = relative_differences(values, ref)
                    print(f"{variant}, {how}: relative differences "
                          + ", ".join(f"{k} {v:.2g}" for k, v in d.items()))
                    for key, value in d.items():
                        self.assertLess(value, 1e-10, f"{variant}, {how}: {key}")


@unittest.skipUnless(os.environ.get("ML_TORCH_LMP"), "ML_TORCH_LMP (the lmp executable) not set")
@unittest.skipUnless(has("mace"), "mace-torch is not installed in this environment (.venv-mace)")
class MACEPairRepulsionThroughLammps(ImportedThroughLammps):
    """The MP-0b3 and the MPA-0/OMAT-0 architecture with the ZBL pair
    repulsion (built as in MACEPairRepulsion) imported with `mltorch-import mace` as a user does,
    through pair_style torch on 1 and 3 ranks, against MACECalculator on a
    64-atom triclinic C/O/Si/Hf cell compressed into the ZBL range (float64,
    1e-10 relative)."""
    cell_of = staticmethod(compressed_cell)

    def test_float64_equals_mace_on_1_and_3_ranks(self):
        from mltorch.importers import mace as mc
        self.assertEqual(sorted(set(self.symbols)), sorted(MACE_ZBL_ELEMENTS))
        for variant in MACE_ZBL_VARIANTS:
            path = build_mace_zbl(variant, os.path.join(self.work, f"{variant}.model"))
            ref = mc.reference(self.atoms, path, "float64")
            ref["virial"] = virial_of(ref["stress"], self.volume)
            bare = mc.reference(self.atoms, without_pair_repulsion(
                path, os.path.join(self.work, f"{variant}-no-zbl.model")), "float64")
            share = relative_differences(bare, ref)
            print(f"\n{variant}: the pair repulsion changes " + ", ".join(
                f"{k} {v:.2g}" for k, v in share.items()) + " (relative)")
            self.assertGreater(min(share.values()), 1e-4)
            self.through_lammps("mace", f"{variant}-zbl", path, "float64", 1e-10, ref,
                                MACE_ZBL_ELEMENTS)


NEQUIP_DIR = os.path.join(root, "potentials", "frameworks", "nequip_sic")


@unittest.skipUnless(os.environ.get("ML_TORCH_LMP"), "ML_TORCH_LMP (the lmp executable) not set")
@unittest.skipUnless(has("nequip"), "nequip is not installed in this environment")
class NequIPThroughLammps(ImportedThroughLammps):
    """A NequIP (3 layers, ZBL) and an Allegro model trained by nequip-train
    (potentials/frameworks/nequip_sic) imported with `mltorch-import nequip`,
    through pair_style torch on 1 and 3 ranks, against nequip's own ASE
    calculator (NequIPCalculator) on a 64-atom triclinic SiC cell with antisites."""

    def reference(self, source, dtype):
        from mltorch.importers import nequip as nq
        ref = nq.reference(self.atoms, source, dtype)
        ref["virial"] = virial_of(ref["stress"], self.volume)
        return ref

    def test_float64_equals_nequip_on_1_and_3_ranks(self):
        for name, layered in (("nequip", True), ("allegro", False)):
            source = os.path.join(NEQUIP_DIR, f"{name}_sic.ckpt")
            self.through_lammps("nequip", name, source, "float64", 1e-10,
                                self.reference(source, "float64"), SIC, layered)

    def test_float32_equals_nequip_calculator_on_1_and_3_ranks(self):
        """float32 (nequip's own model_dtype) against NequIPCalculator on the
        float32 model, to 10x that calculator's distance from float64."""
        for name, layered in (("nequip", True), ("allegro", False)):
            source = os.path.join(NEQUIP_DIR, f"{name}_sic.ckpt")
            calc = self.reference(source, "float32")
            noise = self.compare(calc, self.reference(source, "float64"), 1e-3,
                                 f"NequIPCalculator ({name}, float32) vs float64")
            self.through_lammps("nequip", name, source, "float32", 10 * max(noise.values()), calc,
                                SIC, layered)

    def test_compiled_allegro_equals_nequip(self):
        """mltorch-compile of an imported Allegro model (under a minute here;
        NequIP's and MACE's stages take 5-7 minutes, not run here): the
        package through pair_style torch gives nequip's own numbers."""
        source = os.path.join(NEQUIP_DIR, "allegro_sic.ckpt")
        model = os.path.join(self.work, "allegro_compiled.pt")
        print(import_model(model, "float64", "nequip", source, SIC))
        package = os.path.join(self.work, "allegro_compiled.pt2")
        out = subprocess.run([os.path.join(root, ".venv", "bin", "mltorch-compile"), model, "-o",
                              package], capture_output=True, text=True)
        self.assertEqual(out.returncode, 0, out.stdout[-2000:] + out.stderr[-2000:])
        ref = self.reference(source, "float64")
        for ranks in (1, 3):
            got = run_lammps(package, self.pos, self.cell, self.symbols, ranks, SIC)
            self.assertIn("AOTInductor", got["log"])
            self.compare(got, ref, 1e-10, f"allegro compiled, {ranks} rank(s)")

    def test_package_equals_its_checkpoint(self):
        """A package of nequip-package imports to the same numbers as its checkpoint."""
        source = os.path.join(NEQUIP_DIR, "nequip_sic.ckpt")
        # nequip-package reads the training data the checkpoint names, an
        # absolute path of the machine where train.sh ran: a copy of the
        # checkpoint names the file in the repository instead
        import torch
        ckpt = torch.load(source, map_location="cpu", weights_only=False)
        ckpt["hyper_parameters"]["info_dict"]["data"]["split_dataset"]["file_path"] = \
            os.path.join(NEQUIP_DIR, "sic.xyz")
        local = os.path.join(self.work, "nequip_sic.ckpt")
        torch.save(ckpt, local)
        package = os.path.join(self.work, "nequip_sic.nequip.zip")
        out = subprocess.run([os.path.join(root, ".venv", "bin", "nequip-package"), "build", local,
                              package], capture_output=True, text=True, cwd=self.work)
        self.assertEqual(out.returncode, 0, out.stdout[-2000:] + out.stderr[-2000:])
        self.through_lammps("nequip", "nequip-package", package, "float64", 1e-10,
                            self.reference(source, "float64"), SIC)


# --- NequIP models in kcal/mol (LAMMPS units real) (issue 33 item 4) -----------
KCAL_PER_EV = 23.060548
REAL_TYPES = ["H", "C", "O"]


def build_nequip_units(path, units="real", types=REAL_TYPES, seed=789):
    """A NequIP model (2 layers, l_max 1, 8 features, r_max 4 A, ZBL, float64)
    built by nequip's own code from the config of nequip_sic.ckpt (its training
    module, as nequip-train builds it, random weights from `seed`) with the
    types `types`, per-type scales and shifts of kcal/mol size and nequip's
    ZBL in `units`, saved as a checkpoint of nequip-train (the config and the
    fresh state) that nequip's own loader reads."""
    import copy
    import hydra
    import torch
    from nequip.utils.global_state import set_global_state
    set_global_state()
    ck = torch.load(os.path.join(NEQUIP_DIR, "nequip_sic.ckpt"), map_location="cpu",
                    weights_only=False)
    hp = copy.deepcopy(ck["hyper_parameters"])
    scale = KCAL_PER_EV if units == "real" else 1.0
    model = hp["model"]
    model.update(seed=seed, type_names=list(types), num_layers=2, model_dtype="float64",
                 per_type_energy_scales={t: scale * s for t, s in zip(types, (0.9, 2.1, 1.6))},
                 per_type_energy_shifts={t: scale * s for t, s in zip(types, (-3.4, -6.7, -4.9))},
                 pair_potential={"_target_": "nequip.nn.pair_potential.ZBL", "units": units,
                                 "chemical_species": list(types)})
    hp["info_dict"]["training_module"]["model"] = copy.deepcopy(model)
    training_module = hydra.utils.get_class(hp["info_dict"]["training_module"]["_target_"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module = training_module(**hp)
    saved = {k: v for k, v in ck.items()
             if k not in ("optimizer_states", "lr_schedulers", "loops", "callbacks", "ASEDataModule")}
    saved["hyper_parameters"] = hp
    saved["state_dict"] = module.state_dict()
    torch.save(saved, path)
    return path


def organic_cell(seed=6):
    """64 atoms of H, C and O on a triclinic zincblende cell (neighbours about
    1.9 A apart), periodic."""
    def pick(rng):
        return str(rng.choice(["C", "O"])), str(rng.choice(REAL_TYPES))
    return zincblende_cell(4.36, pick, (0.08, -0.05, 0.1), 0.07, seed)


@unittest.skipUnless(has("nequip"), "nequip is not installed in this environment")
class NequIPUnits(unittest.TestCase):
    """The units of an imported nequip model: those its ZBL term was built in
    (nequip's only record of them), else --units, else metal with a note. A
    NequIP model in kcal/mol (real units; built by nequip's own code, random
    weights) against NequIPCalculator in float64 (1e-10, stages and folded
    forward), and `mltorch-import nequip` records 'real' and refuses units
    that contradict the model's. No LAMMPS."""

    @classmethod
    def setUpClass(cls):
        cls.work = tempfile.mkdtemp(prefix="nequip-units-")
        cls.real = build_nequip_units(os.path.join(cls.work, "real.ckpt"))

    def test_real_model_equals_nequip_float64(self):
        import torch
        from ase import Atoms
        from mltorch.importers import nequip as nq
        symbols = ["C", "H", "O", "H", "O", "C", "H", "C"]
        pos, cell, symbols = small_cell(symbols, a=5.0)
        atoms = Atoms(symbols, positions=pos, cell=cell, pbc=True)
        graph_model = nq.load_nequip(self.real)
        self.assertEqual(nq.model_units(graph_model)[0], "real")
        model = nq.NequIPModel(graph_model, elements=REAL_TYPES).eval()
        model.script_blocks()
        scripted = torch.jit.script(model)
        ref = nq.reference(atoms, self.real)       # kcal/mol, kcal/mol/A
        print(f"\nreal-units NequIP: energy {ref['energy']:.6g} kcal/mol, largest force "
              f"{np.abs(ref['forces']).max():.4g} kcal/mol/A")
        got = evaluate_file(scripted, model.num_layers, pos, cell,
                            [REAL_TYPES.index(s) for s in symbols], model.cutoff)
        for how, values in got.items():
            d = relative_differences(values, ref)
            print(f"real-units NequIP, {how}: relative differences "
                  + ", ".join(f"{k} {v:.2g}" for k, v in d.items()))
            for key, value in d.items():
                self.assertLess(value, 1e-10, f"{how}: {key}")

    def test_units_come_from_the_zbl_term_else_the_option(self):
        from mltorch.importers import nequip as nq
        from mltorch.importers.common import ImportFailed
        real = nq.load_nequip(self.real)
        metal = nq.load_nequip(os.path.join(NEQUIP_DIR, "nequip_sic.ckpt"))
        bare = nq.load_nequip(os.path.join(NEQUIP_DIR, "allegro_sic.ckpt"))     # no ZBL
        self.assertEqual(nq.recorded_units(real), "real")
        self.assertEqual(nq.recorded_units(metal), "metal")
        self.assertIsNone(nq.recorded_units(bare))
        self.assertEqual(nq.model_units(real)[:2], ("real", "the model's ZBL term (units 'real')"))
        self.assertEqual(nq.model_units(real, "real")[0], "real")
        self.assertEqual(nq.model_units(metal)[0], "metal")
        units, source, note = nq.model_units(bare)
        self.assertEqual((units, source), ("metal", "assumed"))
        self.assertIn("--units real", note)
        self.assertEqual(nq.model_units(bare, "real"), ("real", "--units", None))
        for model, given, says in ((real, "metal", "import it with --units real"),
                                   (metal, "real", "import it with --units metal"),
                                   (bare, "lj", "metal (its energies in eV")):
            with self.assertRaises(ImportFailed) as caught:
                nq.model_units(model, given)
            print(f"\n{caught.exception}")
            self.assertIn(says, str(caught.exception))

    def test_import_command_records_real_units(self):
        from mltorch.export import read_metadata
        out = subprocess.run([os.path.join(root, ".venv", "bin", "mltorch-import"), "nequip",
                              self.real, "-o", os.path.join(self.work, "real.pt")],
                             capture_output=True, text=True)
        print("\n" + out.stdout[-1500:])
        self.assertEqual(out.returncode, 0, out.stdout[-3000:] + out.stderr[-3000:])
        self.assertIn("units real", out.stdout)
        self.assertIn("kcal/mol", out.stdout)
        meta = read_metadata(os.path.join(self.work, "real.pt"))
        self.assertEqual(meta["units"], "real")
        self.assertEqual(meta["imported"]["units_from"], "the model's ZBL term (units 'real')")
        wrong = subprocess.run([os.path.join(root, ".venv", "bin", "mltorch-import"), "nequip",
                                self.real, "-o", os.path.join(self.work, "wrong.pt"), "--units",
                                "metal"], capture_output=True, text=True)
        print(wrong.stderr[-600:])
        self.assertEqual(wrong.returncode, 1)
        self.assertIn("the model's ZBL term was built with units 'real'", wrong.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.work, "wrong.pt")))


@unittest.skipUnless(os.environ.get("ML_TORCH_LMP"), "ML_TORCH_LMP (the lmp executable) not set")
@unittest.skipUnless(has("nequip"), "nequip is not installed in this environment")
class NequIPRealUnitsThroughLammps(ImportedThroughLammps):
    """A NequIP model in kcal/mol (built as in NequIPUnits) imported with
    `mltorch-import nequip` as a user does: through pair_style torch under
    `units real` on 1 and 3 ranks its energy (kcal/mol), forces (kcal/mol/A),
    virial and per-atom energies equal NequIPCalculator's in float64 (1e-10
    relative) on a 64-atom triclinic H/C/O cell; under `units metal` LAMMPS
    stops with pair_style torch's units error."""
    cell_of = staticmethod(organic_cell)

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.source = build_nequip_units(os.path.join(cls.work, "real.ckpt"))
        cls.model = os.path.join(cls.work, "real.pt")
        print(import_model(cls.model, "float64", "nequip", cls.source, REAL_TYPES))

    def test_units_real_equals_nequip_on_1_and_3_ranks(self):
        from mltorch.importers import nequip as nq
        ref = nq.reference(self.atoms, self.source, "float64")
        ref["virial"] = virial_of(ref["stress"], self.volume)
        for ranks in (1, 3):
            got = run_lammps(self.model, self.pos, self.cell, self.symbols, ranks, REAL_TYPES,
                             units="real")
            self.assertIn("halo exchange", got["log"])
            self.compare(got, ref, 1e-10, f"real-units NequIP under units real, {ranks} rank(s)")

    def test_units_metal_is_refused(self):
        with self.assertRaises(AssertionError) as caught:
            run_lammps(self.model, self.pos, self.cell, self.symbols, 1, REAL_TYPES, units="metal")
        message = str(caught.exception)
        print("\n" + [line for line in message.splitlines() if "ERROR" in line][0])
        self.assertIn("uses 'real' units but this run uses 'units metal'", message)


@unittest.skipUnless(os.environ.get("ML_TORCH_LMP") and os.environ.get("ML_TORCH_KK_LMP_RUN"),
                     "ML_TORCH_LMP and ML_TORCH_KK_LMP_RUN (the KOKKOS lane's lmp-run) not set")
@unittest.skipUnless(has("nequip"), "nequip is not installed in this environment")
class ImportedThroughKokkos(ImportedThroughLammps):
    """The imported NequIP, Allegro and MACE files through pair_style torch/kk
    (the KOKKOS lane, 2 ranks, GPU-style package options) against pair_style
    torch on 1 rank: the same model files, unchanged."""

    def test_kokkos_equals_torch(self):
        kk = [os.environ["ML_TORCH_KK_LMP_RUN"], "-np", "2", "-k", "on", "t", "1", "-sf", "kk",
              "-pk", "kokkos", "newton", "on", "neigh", "half"]
        for framework, name, source in (
                ("nequip", "nequip", os.path.join(NEQUIP_DIR, "nequip_sic.ckpt")),
                ("nequip", "allegro", os.path.join(NEQUIP_DIR, "allegro_sic.ckpt")),
                ("mace", "mace", MACE_MODEL)):
            model = os.path.join(self.work, f"{name}_kk.pt")
            print(import_model(model, "float64", framework, source, SIC))
            ref = run_lammps(model, self.pos, self.cell, self.symbols, 1, SIC)
            got = run_lammps(model, self.pos, self.cell, self.symbols, 2, SIC, launcher=kk)
            self.assertIn("torch/kk", got["log"])
            self.compare(got, ref, 1e-12, f"{name} through torch/kk (2 ranks) vs torch (1 rank)")


FINETUNE = """
units metal
atom_style atomic
atom_modify map array
read_data cell.data
pair_style torch
pair_coeff * * {model} Zn S Se
fix ft all torch/finetune 1 teacher "lj/cut 5.0" "* * 0.01 2.4" optimizer sgd lr 1.0 \
    weights 1.0 10.0 0.0 save 1 saved.pt log 1{extra}
run 1
"""
TEACHER = """
units metal
atom_style atomic
atom_modify map array
read_data cell.data
pair_style lj/cut 5.0
pair_coeff * * 0.01 2.4
run 0 post no
write_dump all custom labels.dump id fx fy fz modify sort id format float %.17g
print "LABEL $(pe:%.17g)"
"""


def lammps(script, work, ranks, partition=None):
    with open(os.path.join(work, "in.run"), "w") as f:
        f.write(script)
    mpiexec = os.environ.get("ML_TORCH_MPIEXEC", "mpiexec")
    args = [mpiexec, "--allow-run-as-root", "--oversubscribe", "-np", str(ranks),
            os.environ["ML_TORCH_LMP"], "-log", "none", "-echo", "none", "-nocite", "-in", "in.run"]
    if partition:
        args += ["-partition", partition]
    out = subprocess.run(args, capture_output=True, text=True, cwd=work,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    if out.returncode != 0:
        raise AssertionError(out.stdout[-3000:] + out.stderr[-3000:])
    return out.stdout


@unittest.skipUnless(os.environ.get("ML_TORCH_LMP"), "ML_TORCH_LMP (the lmp executable) not set")
class SevenNetFinetune(unittest.TestCase):
    """fix torch/finetune on imported SevenNet-0 (float64): one SGD step with lr 1
    gives theta - theta' = the loss gradient, which must equal autograd of the
    loss on the same model and labels in Python, on 1 and 2 ranks and on 2
    replicas (-partition 2x1, identical configurations: the replica mean is the
    same gradient), for all parameters and for a subset (train post)."""

    @classmethod
    def setUpClass(cls):
        import torch
        cls.work = tempfile.mkdtemp(prefix="sevenn-ft-")
        cls.pos, cls.cell, cls.symbols = ternary_cell(seed=9)
        write_data(os.path.join(cls.work, "cell.data"), cls.pos, cls.cell, cls.symbols)
        cls.model = os.path.join(cls.work, "7net-0_f64.pt")
        import_model(cls.model, "float64")
        out = lammps(TEACHER, cls.work, 1)
        e_ref = float(out.split("LABEL ")[1].split()[0])
        with open(os.path.join(cls.work, "labels.dump")) as f:
            f_ref = np.array([[float(w) for w in line.split()[1:4]] for line in f.read().splitlines()[9:]])
        # the loss gradient in Python: autograd on the same model and labels
        from mltorch import layered
        from mltorch.export import read_metadata
        meta = read_metadata(cls.model)
        scripted = torch.jit.load(cls.model)
        species = torch.tensor([ELEMENTS.index(s) for s in cls.symbols])
        e, f, _ = layered.evaluate(scripted, meta["num_interaction_layers"], torch.tensor(cls.pos),
                                   torch.tensor(cls.cell), species, meta["cutoff"], layered=True,
                                   create_graph=True)
        n = len(cls.pos)
        loss = ((e.sum() - e_ref) / n) ** 2 + 10.0 / (3 * n) * ((f - torch.tensor(f_ref)) ** 2).sum()
        names, params = zip(*[(k, p) for k, p in scripted.named_parameters() if p.requires_grad])
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        cls.grad = {k: (g if g is not None else torch.zeros_like(p)).detach()
                    for k, p, g in zip(names, params, grads)}
        cls.theta = {k: p.detach().clone() for k, p in scripted.named_parameters()}
        cls.loss = float(loss)

    def step(self, ranks, partition=None, extra=""):
        import torch
        work = tempfile.mkdtemp(prefix="sevenn-ft-run-")
        os.symlink(os.path.join(self.work, "cell.data"), os.path.join(work, "cell.data"))
        out = lammps(FINETUNE.format(model=self.model, extra=extra), work, ranks, partition)
        saved = os.path.join(work, "saved.pt")
        if partition:   # every replica keeps the same model: replica 0 saves it
            self.assertTrue(os.path.exists(saved), os.listdir(work))
        return {k: p.detach() for k, p in torch.jit.load(saved).named_parameters()}, out

    def check(self, theta_new, trained, what):
        import torch
        worst, scale, where = 0.0, max(float(g.abs().max()) for g in self.grad.values()), ""
        for k, old in self.theta.items():
            got = old - theta_new[k]
            want = self.grad[k] if (k in self.grad and trained(k)) else torch.zeros_like(old)
            d = float((got - want).abs().max())
            if d > worst:
                worst, where = d, f" in {k}: {float(got.abs().max()):.3g} vs {float(want.abs().max()):.3g}"
        print(f"\n{what}: loss {self.loss:.6g}, largest gradient {scale:.3g}, "
              f"largest difference {worst:.2g} ({worst / scale:.2g} relative){where}")
        # doc/fix_torch_finetune.rst and doc/models.md: 1e-13 (measured 1.1e-14)
        self.assertLess(worst / scale, 1e-13, what)

    def test_gradient_equals_python_on_1_and_2_ranks(self):
        for ranks in (1, 2):
            theta, _ = self.step(ranks)
            self.check(theta, lambda k: True, f"all {len(self.theta)} parameter tensors, {ranks} rank(s)")

    def test_gradient_on_2_replicas(self):
        theta, _ = self.step(2, partition="2x1")
        self.check(theta, lambda k: True, "2 replicas")

    def test_subset(self):
        theta, _ = self.step(1, extra=" train post")
        self.check(theta, lambda k: k.startswith("post"), "train post")


if __name__ == "__main__":
    unittest.main()
