"""The workflows users run with a machine-learned potential, through
pair_style torch, against the same workflow on the native style the model
reproduces (potentials/sw_Si.pt against LAMMPS's sw): minimization with fix
box/relax, NEB (REPLICA), path-integral MD (fix pimd/langevin, REPLICA),
replica exchange (temper, REPLICA), the dynamical matrix and its phonon
frequencies (dynamical_matrix, PHONON); and fix torch/finetune under the
multi-partition commands (beads and temperatures as replicas; idle under
NEB, with a WARNING).

Run: ML_TORCH_LMP=build/lmp LAMMPS_POTENTIALS=build/lammps-potentials \\
     .venv/bin/python unittest/test_workflows.py -v      (ctest Workflows)
"""

import filecmp
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples",
                                "workflows"))
import phonons  # noqa: E402  (its THz factor)

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(here)
LMP = os.environ.get("ML_TORCH_LMP")
POT = os.environ.get("LAMMPS_POTENTIALS", "")
MODEL = os.path.join(root, "potentials", "sw_Si.pt")
STUDENT = os.path.join(root, "examples", "finetune", "si_student.pt")
EXAMPLES = os.path.join(root, "examples", "workflows")
# the model's lines in the examples, and LAMMPS's own sw in their place
TORCH_PAIR = "pair_style      torch\npair_coeff      * * ../../potentials/sw_Si.pt Si"
PAIRS = {"native": f"pair_style sw\npair_coeff * * {POT}/Si.sw Si", "torch": TORCH_PAIR}


def example(name, kind="torch", extra="", model=None):
    """examples/workflows/`name` as the test runs it elsewhere: with the
    model (`model` for sw_Si.pt) or native sw, `extra` lines after the pair
    style, the example's relative paths made absolute."""
    with open(os.path.join(EXAMPLES, name)) as f:
        text = f.read()
    # in.d3 runs its own model: only its paths change
    assert TORCH_PAIR in text or (kind == "torch" and not extra and not model), name
    pair = PAIRS[kind] if not model else TORCH_PAIR.replace("../../potentials/sw_Si.pt", model)
    text = text.replace(TORCH_PAIR, pair + ("\n" + extra if extra else ""))
    return text.replace("../../build/lammps-potentials", POT).replace("../../", root + "/")


def run_lmp(script, work, ranks=1, partitions=None, name="in.workflow"):
    """Run `script` in `work` on `ranks` MPI ranks (one per partition when
    `partitions`); the screen output (universe screen with partitions).
    Without `script` the input file `name` in `work` runs as it is."""
    if script is not None:
        with open(os.path.join(work, name), "w") as f:
            f.write(script)
    cmd = [os.environ.get("ML_TORCH_MPIEXEC", "mpiexec"), "--allow-run-as-root", "--oversubscribe",
           "-np", str(ranks), LMP, "-nocite", "-in", name]
    if partitions:
        cmd += ["-partition", f"{partitions}x{ranks // partitions}"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=work,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    if out.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} in {work}:\n{out.stdout[-3000:]}{out.stderr[-3000:]}")
    return out.stdout


def results(text):
    """The numbers of each line that starts with 'RESULT ' (not the echoed
    print commands of a log), in order."""
    return [np.array([float(w) for w in line.split()]) for line in re.findall(r"^RESULT (.*)$", text, re.M)]


def result(text):
    """The numbers of the last 'RESULT ...' line."""
    return results(text)[-1]


def sorted_dump(path):
    """id-sorted columns after the id of a 'write_dump ... modify sort id' file."""
    with open(path) as f:
        lines = f.read().splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith("ITEM: ATOMS")) + 1
    return np.array([[float(w) for w in l.split()[1:]] for l in lines[start:]])


def read(path):
    with open(path) as f:
        return f.read()


def rel(a, b):
    a, b = np.asarray(a, float), np.asarray(b, float)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300))


def report(what, **devs):
    print(f"{what}: torch vs native, largest relative difference "
          + ", ".join(f"{k} {v:.2g}" for k, v in devs.items()))


@unittest.skipUnless(LMP and POT, "ML_TORCH_LMP and LAMMPS_POTENTIALS must be set")
class Workflows(unittest.TestCase):
    def both(self, name, **kw):
        """Run example `name` with native sw (in a scratch folder) and as it
        is, with the torch model, in examples/workflows."""
        work = tempfile.mkdtemp(prefix="workflow-native-")
        return {"native": (run_lmp(example(name, "native"), work, **kw), work),
                "torch": (run_lmp(None, EXAMPLES, name=name, **kw), EXAMPLES)}

    def test_minimize_and_box_relax(self):
        out = self.both("in.relax")
        # RESULT lines: after the fixed-box minimization, after box/relax
        fixed = [results(o)[0] for o, _ in (out["native"], out["torch"])]
        got, ref = (result(out[k][0]) for k in ("torch", "native"))
        x = [sorted_dump(os.path.join(out[k][1], "final.dump")) for k in ("torch", "native")]
        report("minimize, then fix box/relax aniso 0 (215 atoms, vacancy)", fixed_box_pe=rel(fixed[1][0], fixed[0][0]),
               relaxed_pe=rel(got[0], ref[0]), box=rel(got[1:4], ref[1:4]), positions=np.abs(x[0] - x[1]).max())
        print(f"native: energy {fixed[0][0]:.6f} eV (fixed box), {ref[0]:.6f} eV relaxed, box "
              f"{ref[1]:.6f} x {ref[2]:.6f} x {ref[3]:.6f} A, pressure {ref[4]:.3g} bar")
        self.assertLess(rel(fixed[1][0], fixed[0][0]), 1e-12)
        self.assertEqual(len(results(out["torch"][0])), 2)
        self.assertLess(rel(got[0], ref[0]), 1e-12)
        self.assertLess(rel(got[1:4], ref[1:4]), 1e-11)
        self.assertLess(np.abs(x[0] - x[1]).max(), 1e-9)
        self.assertGreater(ref[1] - 3 * 5.38, 0.03)      # the box did relax (5.38 -> ~5.43 A)

    def neb_barrier(self, text):
        """Energy barrier and the images' reaction coordinates and energies of
        the last step NEB printed (universe screen)."""
        rows = [l.split() for l in text.splitlines() if re.match(r"^\s*\d+\s+[-0-9.eE+]+\s", l)]
        last = [float(w) for w in rows[-1]]
        # Step MaxReplicaForce MaxAtomForce GradV0 GradV1 GradVc EBF EBR RDT RD1 PE1 ... RD4 PE4
        return last[6], np.array(last[9:])

    def test_neb_vacancy_migration(self):
        out = {k: v[0] for k, v in self.both("in.neb", ranks=4, partitions=4).items()}
        (eb_t, path_t), (eb_n, path_n) = self.neb_barrier(out["torch"]), self.neb_barrier(out["native"])
        report("NEB, Si vacancy hop (LAMMPS's examples/fire), 4 images on 4 partitions", barrier=rel(eb_t, eb_n),
               path=rel(path_t, path_n))
        print(f"native barrier {eb_n:.6f} eV; images (reaction coordinate, energy): {path_n}")
        self.assertTrue(0.4 < eb_n < 0.6, eb_n)     # LAMMPS's example log: 0.51 eV
        self.assertLess(rel(eb_t, eb_n), 1e-8)
        self.assertLess(rel(path_t, path_n), 1e-8)

    def test_pimd_langevin_4_beads(self):
        out = self.both("in.pimd", ranks=4, partitions=4)
        devs, pes = [], []
        for b in range(1, 5):
            d = [sorted_dump(os.path.join(out[k][1], f"bead{b}.dump")) for k in ("torch", "native")]
            devs.append(np.abs(d[0] - d[1]).max())
            logs = [read(os.path.join(out[k][1], f"log.lammps.{b - 1}")) for k in ("torch", "native")]
            pes.append(rel(result(logs[0]), result(logs[1])))
        report("fix pimd/langevin, 4 beads on 4 partitions, 200 steps", positions_velocities=max(devs),
               bead_pe=max(pes))
        self.assertLess(max(devs), 1e-10)
        self.assertLess(max(pes), 1e-13)

    def swaps(self, text):
        """The temper lines of the universe screen: step and the temperature of each replica."""
        return [l.split() for l in text.splitlines() if re.match(r"^\d+(\s+\d+){4}$", l.strip())]

    def test_temper_swaps(self):
        out = self.both("in.temper", ranks=4, partitions=4)
        s_t, s_n = self.swaps(out["torch"][0]), self.swaps(out["native"][0])
        changes = sum(1 for a, b in zip(s_n, s_n[1:]) if a[1:] != b[1:])
        # each replica's energy at the end (its partition's log)
        pes = [[result(read(os.path.join(out[k][1], f"log.lammps.{p}")))[0] for p in range(4)]
               for k in ("torch", "native")]
        print(f"temper, 4 replicas at 300-390 K, 1000 steps, swaps tried every 50: step 0 and "
              f"{len(s_n) - 1} attempts, {changes} with a swap; torch's the same: {s_t == s_n}; "
              f"final energies {rel(pes[0], pes[1]):.2g} relative")
        self.assertEqual(len(s_n), 21)
        self.assertLess(rel(pes[0], pes[1]), 1e-10)
        self.assertGreater(changes, 0)
        self.assertEqual(s_t, s_n)

    def test_dynamical_matrix_and_phonons(self):
        out = self.both("in.phonons")
        n = 3 * 64
        mats = [np.fromfile(os.path.join(out[k][1], "dynmat.bin"), dtype=np.float64).reshape(n, n)
                for k in ("torch", "native")]
        # the mass-weighted dynamical matrix of the supercell (eV/A^2/amu): its
        # eigenvalues are the squared angular frequencies of the supercell's phonons
        w2 = [np.linalg.eigvalsh(0.5 * (m + m.T)) for m in mats]
        thz = np.sqrt(np.clip(w2[1], 0, None)) * phonons.THZ
        report("dynamical_matrix, 64-atom Si", matrix=rel(mats[0], mats[1]), squared_frequencies=rel(w2[0], w2[1]))
        print(f"native: highest supercell frequency {thz.max():.4f} THz (Si's optical phonon at "
              f"Gamma: 15.5 THz measured, higher with sw)")
        self.assertLess(rel(mats[0], mats[1]), 1e-10)
        self.assertLess(rel(w2[0], w2[1]), 1e-10)
        self.assertTrue(16.0 < thz.max() < 19.0, thz.max())     # 17.83 THz with sw
        # the example's own script prints the same
        printed = subprocess.run([sys.executable, "phonons.py"], cwd=EXAMPLES,
                                 capture_output=True, text=True, check=True).stdout
        self.assertIn(f"highest frequency {thz.max():.4f} THz", printed)

    def test_d3_example_is_model_plus_d3(self):
        """in.d3 (2 ranks): the overlay's energy at the start equals the
        message-passing model's alone plus dispersion/d3's alone."""
        work = tempfile.mkdtemp(prefix="d3-")
        # thermo with all digits
        text = example("in.d3").replace("thermo          10", "thermo          10\nthermo_modify   format float %.17g")
        screen = run_lmp(text, work, ranks=2)
        rows = [l.split() for l in screen.splitlines() if re.match(r"^\s+0(\s+[-0-9.e+]+){5}\s*$", l)]
        overlay, model, d3 = (float(w) for w in rows[0][2:5])
        alone = {}
        for style, coeff in (("torch", f"* * {root}/potentials/si_mp2.pt Si"), ("dispersion/d3 bj pbe 12.0 8.0", "* * Si")):
            lines = text.split("\npair_style      hybrid")[0] + f"\npair_style {style}\npair_coeff {coeff}\nrun 0\nprint \"RESULT $(pe:%.17g)\"\n"
            alone[style.split()[0]] = result(run_lmp(lines, tempfile.mkdtemp(prefix="d3-alone-"), ranks=2))[0]
        print(f"in.d3 at step 0: overlay {overlay} eV = model {model} + D3 {d3}; the styles alone: "
              f"sum {rel(alone['torch'] + alone['dispersion/d3'], overlay):.2g}, model "
              f"{rel(alone['torch'], model):.2g}, D3 {rel(alone['dispersion/d3'], d3):.2g} relative")
        self.assertLess(rel(alone["torch"] + alone["dispersion/d3"], overlay), 1e-13)
        self.assertLess(rel(alone["torch"], model), 1e-13)
        self.assertLess(rel(alone["dispersion/d3"], d3), 1e-13)
        self.assertLess(d3, -60.0)

    # --- fix torch/finetune under the multi-partition commands -------------

    def finetune_line(self, work):
        # check 1: after every update the replicas compare their parameters
        # (an ERROR if they differ); partition 1 saves the replicas' model
        return (f'fix ft all torch/finetune 5 teacher sw "* * {POT}/Si.sw Si" lr 1e-3 '
                f"save 10 {work}/model.pt log 50 check 1\n")

    def replicas_trained_alike(self, work, n, updates):
        logs = [read(os.path.join(work, f"log.lammps.{p}")) for p in range(n)]
        counts = [result(log)[0] for log in logs]
        self.assertEqual(counts, [float(updates)] * n)
        for log in logs[1:]:
            self.assertIn(f"model after {updates} updates saved by partition 1", log)
        self.assertIn(f"saved model after {updates} updates to {work}/model.pt", logs[0])
        self.assertFalse(filecmp.cmp(f"{work}/model.pt", STUDENT, shallow=False))
        return counts[0]

    def test_finetune_beads_are_replicas(self):
        """Under fix pimd/langevin each bead's partition is a replica: the
        fix trains one model on the beads' configurations (the gradient
        averaged over them), identical in every bead."""
        work = tempfile.mkdtemp(prefix="pimd-finetune-")
        # in.pimd on 2 beads, the fix's result printed besides the energy
        script = example("in.pimd", extra=self.finetune_line(work), model=STUDENT).replace(
            "uloop 4", "uloop 2").replace('print           "RESULT ', 'print           "RESULT $(f_ft[7]) ')
        run_lmp(script, work, ranks=2, partitions=2)
        n = self.replicas_trained_alike(work, 2, 40)
        print(f"fix torch/finetune under fix pimd/langevin, 2 beads: {n:.0f} updates, the beads' "
              f"parameters equal after each (check 1)")

    def test_finetune_after_pimd_is_refused(self):
        """The fix acts on Cartesian forces: after fix pimd/langevin (normal-mode
        forces) it would be wrong, and the run stops with an ERROR."""
        work = tempfile.mkdtemp(prefix="pimd-order-")
        script = example("in.pimd", model=STUDENT).replace("uloop 4", "uloop 2").replace(
            "timestep        0.0005", "timestep        0.0005\n" + self.finetune_line(work))
        with self.assertRaises(AssertionError):
            run_lmp(script, work, ranks=2, partitions=2)
        # an ERROR in a partition ends the universe; its text is in the partitions' logs
        for p in range(2):
            self.assertIn("ERROR: Fix torch/finetune must be defined before fix pimd (pimd/langevin), "
                          "which transforms the forces in its post_force",
                          read(os.path.join(work, f"log.lammps.{p}")))

    def test_finetune_temperatures_are_replicas(self):
        """Under temper each temperature's partition is a replica."""
        work = tempfile.mkdtemp(prefix="temper-finetune-")
        script = example("in.temper", extra=self.finetune_line(work), model=STUDENT).replace(
            'print           "RESULT ', 'print           "RESULT $(f_ft[7]) ')
        run_lmp(script, work, ranks=4, partitions=4)
        n = self.replicas_trained_alike(work, 4, 200)
        print(f"fix torch/finetune under temper, 4 replicas: {n:.0f} updates, the replicas' "
              f"parameters equal after each (check 1)")

    def test_finetune_idle_under_neb(self):
        """NEB minimizes: fix torch/finetune is idle there (a WARNING says so),
        and the path is that of the model as it is."""
        out = {}
        for with_fix in (False, True):
            work = tempfile.mkdtemp(prefix="neb-finetune-")
            extra = self.finetune_line(work) if with_fix else ""
            run_lmp(example("in.neb", extra=extra, model=STUDENT), work, ranks=4, partitions=4)
            out[with_fix] = work
        logs = [read(os.path.join(out[True], f"log.lammps.{p}")) for p in range(4)]
        for log in logs:
            self.assertIn("WARNING: Fix torch/finetune trains during MD only: it is idle during", log)
        screens = [read(os.path.join(out[w], "log.lammps")) for w in (False, True)]
        (eb0, p0), (eb1, p1) = self.neb_barrier(screens[0]), self.neb_barrier(screens[1])
        print(f"NEB with fix torch/finetune defined: barrier {eb1:.6f} eV, without {eb0:.6f} eV")
        self.assertEqual(eb0, eb1)
        self.assertTrue(np.array_equal(p0, p1))


if __name__ == "__main__":
    unittest.main()
