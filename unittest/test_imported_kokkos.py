"""Imported NequIP, Allegro and MACE files through pair_style torch/kk (the
KOKKOS lane) against pair_style torch: ctest ImportedKokkos.
"""

import unittest
import os

from imported_common import (has, run_lammps, import_model, ImportedThroughLammps, MACE_MODEL, SIC,
                             NEQUIP_DIR)


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


if __name__ == "__main__":
    unittest.main()
