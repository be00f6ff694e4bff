"""fix torch/finetune `labels FILE` as ASE sees it: ase.io.read(FILE, ":")
reads every frame (energy, forces, stress, provenance), also after the job
was killed with SIGKILL while it was labelling, and a second run appends to
the frames the killed one left."""

import os
import signal
import subprocess
import tempfile
import time
import unittest

import numpy as np

from python_common import root

try:
    import ase.io
except ImportError:    # the set-up installs ase (sevenn's dependency)
    ase = None


def script(labels, steps):
    sw = os.path.join(os.environ["LAMMPS_POTENTIALS"], "Si.sw")
    student = os.path.join(root, "examples", "finetune", "si_student.pt")
    return f"""
units metal
lattice diamond 5.431
region box prism 0 3 0 3 0 3 0.5 0.2 0.1
create_box 1 box
create_atoms 1 box
mass 1 28.0855
displace_atoms all random 0.1 0.1 0.1 5 units box
velocity all create 900 77 loop geom
pair_style torch
pair_coeff * * {student} Si
fix ft all torch/finetune 1 teacher sw "* * {sw} Si" labels {labels} log 0 check 0
fix md all nve
run {steps}"""


@unittest.skipIf(ase is None, "needs ase")
class LabelsInAse(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp()
        self.lmp = os.environ["ML_TORCH_LMP"]

    def run_lmp(self, text, name):
        path = os.path.join(self.tmp, name)
        with open(path, "w") as f:
            f.write(text)
        return subprocess.Popen([self.lmp, "-in", path, "-log", "none", "-screen", "none"],
                                cwd=self.tmp, env=dict(os.environ, OMP_NUM_THREADS="1"))

    def test_ase_reads_the_frames(self):
        labels = os.path.join(self.tmp, "labels.xyz")
        self.assertEqual(self.run_lmp(script(labels, 6), "in.six").wait(), 0)
        frames = ase.io.read(labels, ":")
        self.assertEqual(len(frames), 6)    # steps 1 to 6
        for k, a in enumerate(frames, start=1):
            self.assertEqual(len(a), 216)
            self.assertEqual(a.info["step"], k)
            self.assertEqual(a.info["replica"], 0)
            self.assertTrue(a.info["teacher"].startswith("sw * * "))
            self.assertTrue(all(a.pbc))
            self.assertEqual(set(a.get_chemical_symbols()), {"Si"})
            # every atom inside its cell, and the cell the run's triclinic box
            s = a.get_scaled_positions(wrap=False)
            self.assertTrue(np.all(s >= -1e-12) and np.all(s < 1 + 1e-12))
            self.assertAlmostEqual(a.cell[1][0], 0.5 * 5.431, places=12)
            e, f, st = a.get_potential_energy(), a.get_forces(), a.get_stress(voigt=False)
            self.assertEqual(f.shape, (216, 3))
            self.assertTrue(np.isfinite(e) and np.all(np.isfinite(f)))
            # the forces of a periodic cell sum to zero; the stress is symmetric
            self.assertLess(np.abs(f.sum(axis=0)).max(), 1e-10)
            self.assertLess(np.abs(st - st.T).max(), 1e-15)
        print(f"[ labels ase ] {len(frames)} frames read by ase {ase.__version__}; step 6: energy "
              f"{frames[-1].get_potential_energy():.6f} eV, stress xx {frames[-1].get_stress()[0]:.6g} eV/A^3")

    def test_killed_job_leaves_readable_frames_and_the_next_run_appends(self):
        labels = os.path.join(self.tmp, "killed.xyz")
        job = self.run_lmp(script(labels, 100000), "in.long")
        deadline = time.time() + 120
        while time.time() < deadline:
            if os.path.exists(labels):
                with open(labels) as f:
                    if f.read().count("Lattice=") >= 4:
                        break
            time.sleep(0.05)
        job.send_signal(signal.SIGKILL)
        job.wait()
        frames = ase.io.read(labels, ":")
        n = len(frames)
        self.assertGreaterEqual(n, 4)
        self.assertEqual([a.info["step"] for a in frames], list(range(1, n + 1)))
        # the next run appends its frames to the killed one's
        self.assertEqual(self.run_lmp(script(labels, 2), "in.more").wait(), 0)
        frames = ase.io.read(labels, ":")
        self.assertEqual(len(frames), n + 2)
        self.assertEqual([a.info["step"] for a in frames[n:]], [1, 2])
        print(f"[ labels killed ] SIGKILL after {n} frames: all {n} read; the next run appended 2")


if __name__ == "__main__":
    unittest.main()
