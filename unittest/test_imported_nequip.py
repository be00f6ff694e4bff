"""NequIP and Allegro imported with `mltorch-import nequip` against NequIP's own calculator.

NequIP (3 layers, ZBL) and Allegro models trained by nequip-train, through
LAMMPS (`NequIPThroughLammps`); a NequIP model in kcal/mol (real units)
against NequIPCalculator and the units the importer records (`NequIPUnits`,
no LAMMPS), and through LAMMPS under `units real`, refused under `units
metal` (`NequIPRealUnitsThroughLammps`).

Run: python unittest/test_imported_nequip.py -v   (ctest ImportedNequIP)
"""

import os
import subprocess
import tempfile
import unittest
import warnings

import numpy as np

from imported_common import (assert_file_matches, root, zincblende_cell, run_lammps, virial_of,
                             import_model, has, ImportedThroughLammps, small_cell, SIC, NEQUIP_DIR)


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
        assert_file_matches(self, scripted, model.num_layers, pos, cell,
                            [REAL_TYPES.index(s) for s in symbols], model.cutoff, ref, "real-units NequIP")

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


if __name__ == "__main__":
    unittest.main()
