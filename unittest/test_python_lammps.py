"""Tests of the Python tooling (python/mltorch) with LAMMPS runs: fix
torch/finetune's output and log parser, the LAMMPS reference-data
pipeline, compute torch/deviation against DeePMD-kit's formulas in numpy,
write_restart/atomic.

Run: python unittest/test_python_lammps.py -v   (ctest PythonTooling;
ML_TORCH_LMP names the lmp executable)
"""

import math
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import warnings

import numpy as np
import torch

from python_common import Good, finetune_script, root  # sets the path to mltorch

warnings.filterwarnings("ignore", category=FutureWarning)

from mltorch import lammps_data  # noqa: E402
from mltorch.export import export, read_metadata  # noqa: E402
from mltorch.graph import build_graph, edge_vectors, evaluate  # noqa: E402
from mltorch.models import LocalMBNet  # noqa: E402
from mltorch.train import batch_predict, errors, fit_energy_shift, prepare, scale_features, train  # noqa: E402


@unittest.skipUnless(os.environ.get("ML_TORCH_LMP"), "ML_TORCH_LMP (the lmp executable) not set")
class FinetuneOutput(unittest.TestCase):
    def test_saved_model_is_the_trained_model(self):
        """fix torch/finetune save: a loadable model with the in-memory parameters and provenance."""
        tmp = tempfile.mkdtemp()
        saved = os.path.join(tmp, "ft.pt")
        student = os.path.join(root, "examples", "finetune", "si_student.pt")
        script = finetune_script(student, saved, save_every=5, log_every=1, steps=20) + f"""
unfix ft
run 0 post no
variable trained equal pe
print "TRAINED $(v_trained:%.15g)"
pair_coeff * * {saved} Si
run 0 post no
print "RELOADED $(pe:%.15g)"
"""
        out = subprocess.run([os.environ["ML_TORCH_LMP"], "-log", "none", "-echo", "none"], input=script,
                             capture_output=True, text=True, cwd=tmp)
        self.assertEqual(out.returncode, 0, out.stdout[-2000:] + out.stderr[-2000:])
        trained = float(out.stdout.split("TRAINED ")[1].split()[0])
        reloaded = float(out.stdout.split("RELOADED ")[1].split()[0])
        self.assertAlmostEqual(trained, reloaded, delta=1e-12 * abs(trained))
        self.assertIn("saved model after 10 updates", out.stdout)
        self.assertEqual(sorted(os.listdir(tmp)), ["ft.pt"])    # no temporary file left behind
        meta = read_metadata(saved)
        self.assertEqual(meta["finetune"]["updates"], 10)
        self.assertEqual(meta["finetune"]["parent_model"], student)
        self.assertNotIn("content_hash", meta)    # the exporter's hash described the parent
        ref = torch.jit.load(student)
        new = torch.jit.load(saved)
        diff = max(float((a - b).abs().max()) for a, b in zip(ref.parameters(), new.parameters()))
        self.assertGreater(diff, 1e-6)

    def test_plot_script_reads_the_log(self):
        log = os.path.join(root, "examples", "finetune", "log.29Nov26.finetune.g++.2x1.0")
        sys.path.insert(0, os.path.join(root, "examples", "finetune"))
        import plot_log
        steps, loss, e_rmse, f_rmse = plot_log.read(log)
        # the parser (that the fix learns is tested on live runs: Learn.*,
        # ExampleOnTheFly; a committed log proves nothing about the code)
        self.assertGreaterEqual(len(steps), 20)
        self.assertEqual(steps, sorted(steps))
        self.assertEqual(len({len(steps), len(loss), len(e_rmse), len(f_rmse)}), 1)
        with open(log) as f:
            logged = sum(1 for line in f if "torch/finetune" in line and "loss" in line)
        self.assertEqual(len(steps), logged)
        for v in loss + e_rmse + f_rmse:
            self.assertTrue(math.isfinite(v) and v >= 0.0)


# LAMMPS's sw labels against sw_Si.pt on positions read back from a dump of
# 12 significant digits: measured 1.0e-12 (energy, relative), 1.2e-9 eV/A
# (forces), 8.7e-11 (virial, of its largest); checked at about 10x
TOL_ENERGY, TOL_FORCE, TOL_VIRIAL = 1e-11, 1e-8, 1e-9


@unittest.skipUnless(os.environ.get("ML_TORCH_LMP"), "ML_TORCH_LMP (the lmp executable) not set")
class ReferenceData(unittest.TestCase):
    def test_labels_match_independent_evaluation(self):
        """LAMMPS sw labels == potentials/sw_Si.pt on the Python graph, incl. strained boxes."""
        script = """
units metal
atom_style atomic
atom_modify map array
lattice diamond 5.431
region box prism 0 2 0 2 0 2 0 0 0
create_box 1 box
create_atoms 1 box
mass 1 28.0855
pair_style sw
pair_coeff * * {pot}/Si.sw Si
velocity all create 1500 4928459 loop geom
{{sample}}
fix md all nvt temp 1500 1500 0.1
run 300
change_box all x scale 0.97 xy final 0.4 remap
run 300
""".format(pot=os.path.join(os.environ.get("LAMMPS_POTENTIALS", "")))
        work = tempfile.mkdtemp()
        frames = lammps_data.run(os.environ["ML_TORCH_LMP"], script, work, every=50)
        self.assertGreaterEqual(len(frames), 12)
        self.__class__.frames = frames
        model = torch.jit.load(os.path.join(root, "potentials", "sw_Si.pt"))
        # the dump carries positions and forces to 12 significant digits,
        # energy and virial to 14 (TOL_*: about 10x what that leaves)
        worst = [0.0, 0.0, 0.0]
        for f in frames:
            g = build_graph(f.pos, f.cell, np.zeros(len(f.types), dtype=np.int64), 1.8 * 2.0951, 1)
            e, forces, virial = evaluate(model, g, torch.tensor(f.pos), torch.tensor(f.cell))
            worst[0] = max(worst[0], abs(float(e) - f.energy) / abs(f.energy))
            worst[1] = max(worst[1], float(np.abs(forces.detach().numpy() - f.forces).max()))
            worst[2] = max(worst[2], float(np.abs(virial.detach().numpy() - f.virial).max())
                           / float(np.abs(f.virial).max()))
        print(f"[ labels ] {len(frames)} frames: energy {worst[0]:.2e} relative, forces {worst[1]:.2e} "
              f"eV/A, virial {worst[2]:.2e} of its largest", flush=True)
        self.assertLess(worst[0], TOL_ENERGY)
        self.assertLess(worst[1], TOL_FORCE)
        self.assertLess(worst[2], TOL_VIRIAL)


    def test_training_learns_forces(self):
        """A few epochs on SW frames cut the force error; batching equals one-by-one."""
        if not hasattr(self.__class__, "frames"):
            self.test_labels_match_independent_evaluation()
        samples = prepare(self.__class__.frames, {1: 0}, 3.8, 1)
        torch.manual_seed(0)
        model = LocalMBNet(3.8, 1, channels=4, hidden=16).double()
        fit_energy_shift(model, samples, 1)
        scale_features(model, samples)
        e, f, w = batch_predict(model, samples[:3], create_graph=False)
        for k in range(3):
            e1, f1, w1 = evaluate(model, samples[k].graph, samples[k].pos, samples[k].cell)
            self.assertAlmostEqual(float(e[k]), float(e1), delta=1e-10 * abs(float(e1)))
            self.assertLess(float((f[64 * k:64 * (k + 1)] - f1).abs().max()), 1e-10)
        before = errors(model, samples)["force_rmse_eV_per_A"]
        train(model, samples, samples, epochs=15, batch=4, log=lambda s: None)
        after = errors(model, samples)["force_rmse_eV_per_A"]
        print(f"\n  training: force RMSE {before:.3f} -> {after:.3f} eV/A", file=sys.stderr)
        self.assertLess(after, 0.7 * before, f"force RMSE {before:.3f} -> {after:.3f} eV/A")


@unittest.skipUnless(os.environ.get("ML_TORCH_LMP"), "ML_TORCH_LMP (the lmp executable) not set")
class CommitteeDeviation(unittest.TestCase):
    def test_deviation_equals_python_evaluation(self):
        """compute torch/deviation == DeePMD-kit's model deviation of the members in Python, 1 and 4 ranks."""
        files = [os.path.join(root, "potentials", f"si_crystal_c{m}.pt") for m in range(3)]
        script = f"""
units metal
atom_style atomic
atom_modify map array
lattice diamond 5.431
region box block 0 2 0 2 0 2
create_box 1 box
create_atoms 1 box
mass 1 28.0855
displace_atoms all random 0.2 0.2 0.2 991 units box
pair_style torch
pair_coeff * * {' '.join(files)} Si
compute dev all torch/deviation
compute rel all torch/deviation relative 1.0 relative_v 0.5
thermo_style custom step pe c_dev[*] c_rel[*]
thermo_modify format float %.17g
run 0 post no
write_dump all custom dev.dump id x y z c_dev[1] c_dev[2] modify sort id format float %.17g
print "DEV $(c_dev[1]:%.17g) $(c_dev[2]:%.17g) $(c_dev[3]:%.17g) $(c_dev[4]:%.17g) $(c_dev[5]:%.17g) $(c_dev[6]:%.17g) $(c_dev[7]:%.17g) $(c_dev[8]:%.17g) $(c_dev[9]:%.17g) $(c_dev[10]:%.17g)"
print "REL $(c_rel[1]:%.17g) $(c_rel[2]:%.17g) $(c_rel[3]:%.17g) $(c_rel[8]:%.17g) $(c_rel[9]:%.17g) $(c_rel[10]:%.17g)"
"""
        models = [torch.jit.load(f) for f in files]
        mpiexec = os.environ.get("ML_TORCH_MPIEXEC", "mpiexec")
        for np_ in (1, 4):
            tmp = tempfile.mkdtemp()
            with open(os.path.join(tmp, "in.dev"), "w") as f:
                f.write(script)
            out = subprocess.run([mpiexec, "--allow-run-as-root", "--oversubscribe", "-np", str(np_),
                                  os.environ["ML_TORCH_LMP"], "-log", "none", "-echo", "none",
                                  "-nocite", "-in", "in.dev"],
                                 capture_output=True, text=True, cwd=tmp)
            self.assertEqual(out.returncode, 0, out.stdout[-2000:] + out.stderr[-2000:])
            vec = np.array([float(w) for w in out.stdout.split("DEV ")[1].split()[:10]])
            with open(os.path.join(tmp, "dev.dump")) as f:
                lines = f.read().splitlines()
            box = lines[lines.index("ITEM: BOX BOUNDS pp pp pp") + 1:][:3]
            cell = np.diag([float(b.split()[1]) - float(b.split()[0]) for b in box])
            data = np.array([[float(w) for w in l.split()] for l in lines[9:]])
            pos, dev = data[:, 1:4], data[:, 4:6]
            n = len(pos)
            # each member on the Python graph: forces and atomic energies
            g = build_graph(pos, cell, np.zeros(n, dtype=np.int64), 4.0, 1)
            forces, energies, virials = [], [], []
            for model in models:
                virials.append(evaluate(model, g, pos, cell)[2].detach().numpy().reshape(9))
                p = torch.tensor(pos).requires_grad_(True)
                e_atom = model(edge_vectors(g, p, torch.tensor(cell)), g.edge_index, g.species, n)[:n]
                (grad,) = torch.autograd.grad(e_atom.sum(), p)
                forces.append(-grad.numpy())
                energies.append(e_atom.detach().numpy())
            forces, energies = np.array(forces), np.array(energies)
            devi_f = np.linalg.norm(np.std(forces, axis=0), axis=-1)    # as DeePMD-kit computes it
            devi_e = np.std(energies, axis=0)
            etot = energies.sum(axis=1)
            devi_v = np.std(np.array(virials), axis=0) / n    # DeePMD-kit's devi_v (9 components)
            ref = np.array([devi_f.max(), devi_f.min(), devi_f.mean(), devi_e.max(), devi_e.min(),
                            devi_e.mean(), np.std(etot) / n, devi_v.max(), devi_v.min(),
                            np.linalg.norm(devi_v) / 3])    # DeePMD-kit's avg_devi_v
            d_atom = max(np.abs(dev[:, 0] - devi_f).max() / devi_f.max(),
                         np.abs(dev[:, 1] - devi_e).max() / devi_e.max())
            d_vec = np.max(np.abs(vec - ref) / np.abs(ref))
            print(f"\n  {np_} rank(s): per-atom deviation vs Python {d_atom:.2g}, statistics {d_vec:.2g} "
                  f"(max devi_f {ref[0]:.4f} eV/A)", file=sys.stderr)
            self.assertGreater(ref[0], 0.01)
            # doc/compute_torch_deviation.rst; measured 1.4e-15 and 1.0e-13 (1 rank)
            self.assertLess(d_atom, 1e-14)
            self.assertLess(d_vec, 1e-12)
            # DeePMD-kit's relative forms (calc_model_devi_f/_v with relative=level):
            # devi_f / (|<F>| + level), devi_v / (|<virial / N>| + level)
            rel = np.array([float(w) for w in out.stdout.split("REL ")[1].split()[:6]])
            rf = devi_f / (np.linalg.norm(forces.mean(axis=0), axis=-1) + 1.0)
            rv = devi_v / (np.linalg.norm(np.array(virials).mean(axis=0) / n) + 0.5)
            ref_rel = np.array([rf.max(), rf.min(), rf.mean(), rv.max(), rv.min(), np.linalg.norm(rv) / 3])
            d_rel = np.max(np.abs(rel - ref_rel) / np.abs(ref_rel))
            print(f"  relative forms vs Python {d_rel:.2g}", file=sys.stderr)
            self.assertLess(d_rel, 5e-13)    # measured 5.1e-14
            if np_ != 1:
                continue
            # the doc's model_devi.out recipe, run as written (no integrator: the
            # configuration of step 10 is this one)
            with open(os.path.join(root, "doc", "compute_torch_deviation.rst")) as f:
                doc = f.read()
            recipe = [l.strip() for l in doc.splitlines()
                      if l.strip().startswith(("compute dev all torch/deviation relative",
                                               "fix devi all print"))]
            self.assertEqual(len(recipe), 2, recipe)
            head = script.split("compute dev all")[0]
            with open(os.path.join(tmp, "in.devi"), "w") as f:
                f.write(head + "\n".join(recipe) + "\nrun 10\n")
            out = subprocess.run([mpiexec, "--allow-run-as-root", "--oversubscribe", "-np", "1",
                                  os.environ["ML_TORCH_LMP"], "-log", "none", "-nocite", "-in", "in.devi"],
                                 capture_output=True, text=True, cwd=tmp)
            self.assertEqual(out.returncode, 0, out.stdout[-2000:] + out.stderr[-2000:])
            with open(os.path.join(tmp, "model_devi.out")) as f:
                rows = f.read().splitlines()
            self.assertTrue(rows[0].startswith("#       step         max_devi_v"), rows[0])
            last = np.array([float(w) for w in rows[-1].split()])
            self.assertEqual(last[0], 10)
            want = np.array([ref_rel[3], ref_rel[4], ref_rel[5], ref_rel[0], ref_rel[1], ref_rel[2]])
            self.assertLess(np.max(np.abs(last[1:] - want) / np.abs(want)), 1e-5)


RESTART_SYSTEM = """
units metal
lattice diamond 5.431
region box block 0 20 0 20 0 10
create_box 1 box
create_atoms 1 box
mass 1 28.0855
velocity all create 900 77 loop geom
pair_style torch
pair_coeff * * {student} Si
fix ft all torch/finetune 2 teacher sw "* * {sw} Si"
"""


@unittest.skipUnless(os.environ.get("ML_TORCH_LMP"), "ML_TORCH_LMP (the lmp executable) not set")
class CommitteeUnits(unittest.TestCase):
    def test_members_in_other_units_are_refused(self):
        """A committee needs its members in one unit style (doc/pair_torch.rst,
        "Committees"): a Si model in real units beside si_local (metal) is
        refused with the pair style's ERROR, naming both."""
        tmp = tempfile.mkdtemp()
        real = os.path.join(tmp, "si_real.pt")
        export(Good(), real, cutoff=3.0, elements=["Si"], units="real")
        local = os.path.join(root, "potentials", "si_local.pt")
        script = f"""units metal
lattice diamond 5.431
region box block 0 1 0 1 0 1
create_box 1 box
create_atoms 1 box
mass 1 28.0855
pair_style torch
pair_coeff * * {local} {real} Si
"""
        out = subprocess.run([os.environ["ML_TORCH_LMP"], "-log", "none", "-echo", "none"], input=script,
                             capture_output=True, text=True, cwd=tmp)
        shutil.rmtree(tmp)
        text = out.stdout + out.stderr
        self.assertNotEqual(out.returncode, 0, text[-2000:])
        self.assertIn(f"committee member 2 ({real}) does not match member 1 ({local}): units metal vs "
                      "real; a committee needs models of the same elements, units, cutoff and depth", text)


@unittest.skipUnless(os.environ.get("ML_TORCH_LMP"), "ML_TORCH_LMP (the lmp executable) not set")
class AtomicRestart(unittest.TestCase):
    """write_restart/atomic: a writer killed at any moment, or one that runs out of space, leaves the
    previous restart file whole (byte for byte) and readable; write_restart's own file is torn."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="mltorch-restart-")
        cls.lmp = os.environ["ML_TORCH_LMP"]
        cls.system = RESTART_SYSTEM.format(
            student=os.path.join(root, "examples", "finetune", "si_student.pt"),
            sw=os.path.join(os.environ["LAMMPS_POTENTIALS"], "Si.sw"))
        cls.run_lmp(cls.system + "write_restart ref.restart\n", "ref")
        with open(os.path.join(cls.tmp, "ref.restart"), "rb") as f:
            cls.ref = f.read()

    @classmethod
    def run_lmp(cls, script, name, check=True):
        with open(os.path.join(cls.tmp, "in." + name), "w") as f:
            f.write(script)
        out = subprocess.run([cls.lmp, "-log", "none", "-nocite", "-in", "in." + name], cwd=cls.tmp,
                             capture_output=True, text=True)
        if check:
            assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
        return out

    def readable(self, path):
        out = self.run_lmp(f"read_restart {path}\nprint \"NATOMS $(atoms)\"\n", "check", check=False)
        return out.returncode == 0 and "NATOMS 32000" in out.stdout, out.stdout[-500:] + out.stderr[-500:]

    def kill_while_writing(self, command, target, condition, random_delay=None):
        """start a loop of `command target`, SIGKILL it as soon as condition() holds (or
        random_delay seconds after the first rename over the target); True if the condition was
        seen (or the rename happened) before the kill"""
        shutil.copy(os.path.join(self.tmp, "ref.restart"), os.path.join(self.tmp, target))
        script = self.system + (f"variable i loop 1000\nlabel again\n{command} {target}\nnext i\n"
                                f"jump SELF again\n")
        with open(os.path.join(self.tmp, "in.loop"), "w") as f:
            f.write(script)
        proc = subprocess.Popen([self.lmp, "-log", "none", "-nocite", "-screen", "none", "-in", "in.loop"],
                                cwd=self.tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        seen, t0, started = False, time.time(), None
        first = os.stat(os.path.join(self.tmp, target)).st_ino
        try:
            while time.time() - t0 < 120 and proc.poll() is None:
                if random_delay is not None:
                    if started is None and os.stat(os.path.join(self.tmp, target)).st_ino != first:
                        started = time.time()
                    if started is not None and time.time() - started >= random_delay:
                        seen = True
                        break
                elif condition():
                    seen = True
                    break
        finally:
            proc.kill()
            proc.wait()
        for name in os.listdir(self.tmp):    # the killed writer's temporary file
            if name.startswith(target + ".tmp."):
                os.remove(os.path.join(self.tmp, name))
        with open(os.path.join(self.tmp, target), "rb") as f:
            return seen, f.read()

    def test_killed_writer_leaves_the_previous_file(self):
        target = os.path.join(self.tmp, "atomic.restart")

        def writing():
            return any(n.startswith("atomic.restart.tmp.") for n in os.listdir(self.tmp))

        for trial in range(4):    # killed while LAMMPS fills the temporary file
            seen, data = self.kill_while_writing("write_restart/atomic", "atomic.restart", writing)
            self.assertTrue(seen, "the writer never started")
            self.assertEqual(len(data), len(self.ref), f"trial {trial}: a torn file")
            if data != self.ref:    # a loaded machine let a write finish before the poll saw it
                ok, why = self.readable(target)
                self.assertTrue(ok, f"trial {trial}: " + why)
        rng = random.Random(7)
        replaced = 0
        for trial in range(4):    # killed at any moment of the loop after its first rename
            seen, data = self.kill_while_writing("write_restart/atomic", "atomic.restart", None,
                                                 random_delay=rng.uniform(0.0, 0.5))
            self.assertTrue(seen, f"random trial {trial}: the writer never replaced the file")
            self.assertEqual(len(data), len(self.ref), f"random trial {trial}: a torn file")
            # a file the killed process wrote: the same state, but not always the same bytes
            # (LibTorch's optimizer record keys the state by parameter memory addresses)
            ok, why = self.readable(target)
            self.assertTrue(ok, f"random trial {trial}: " + why)
            replaced += 1
        print(f"\n[ restart ] write_restart/atomic killed 8 times (4 while filling the temporary file, "
              f"{replaced} at random moments after a rename): the file was "
              f"always whole and readable", file=sys.stderr)
        ok, why = self.readable(target)
        self.assertTrue(ok, why)

    def test_write_restart_is_torn_by_the_same_kill(self):
        """the test above can fail: LAMMPS's own write_restart, killed while it writes, tears the file"""
        target = os.path.join(self.tmp, "plain.restart")

        def writing():
            try:
                return 0 <= os.path.getsize(target) < len(self.ref)
            except OSError:
                return False

        for attempt in range(5):
            seen, data = self.kill_while_writing("write_restart", "plain.restart", writing)
            if seen and len(data) < len(self.ref):
                break
        self.assertLess(len(data), len(self.ref), "5 kills while write_restart wrote never tore the file")
        ok, why = self.readable(target)
        self.assertFalse(ok, "a torn restart file was read")
        print(f"\n[ restart ] write_restart killed while writing: {len(data)} of {len(self.ref)} bytes left, "
              f"read_restart: {[l for l in why.splitlines() if 'ERROR' in l][:1]}", file=sys.stderr)

    def test_full_disk_keeps_the_previous_file(self):
        """RLIMIT_FSIZE stands in for a full disk: with SIGXFSZ ignored a write past it fails with
        EFBIG, as one past the disk's end does with ENOSPC. It is set once LAMMPS has started (MPI's
        own start-up writes files larger than the limit)."""
        shutil.copy(os.path.join(self.tmp, "ref.restart"), os.path.join(self.tmp, "full.restart"))
        for name in ("ready", "go"):
            if os.path.exists(os.path.join(self.tmp, name)):
                os.remove(os.path.join(self.tmp, name))
        with open(os.path.join(self.tmp, "in.full"), "w") as f:
            f.write(self.system + "shell touch ready\nlabel wait\nshell sleep 0.05\n"
                    "if \"$(is_file(go))\" then \"jump SELF done\"\njump SELF wait\nlabel done\n"
                    "write_restart/atomic full.restart\n")
        proc = subprocess.Popen([self.lmp, "-log", "none", "-nocite", "-in", "in.full"], cwd=self.tmp,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGXFSZ, signal.SIG_IGN))
        t0 = time.time()
        while not os.path.exists(os.path.join(self.tmp, "ready")) and time.time() - t0 < 60:
            time.sleep(0.01)
        limit = len(self.ref) // 2
        resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (limit, limit))
        open(os.path.join(self.tmp, "go"), "w").close()
        output = proc.communicate(timeout=120)[0]
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("I/O error while writing restart", output)
        with open(os.path.join(self.tmp, "full.restart"), "rb") as f:
            self.assertTrue(f.read() == self.ref, "the previous file changed")
        self.assertEqual([n for n in os.listdir(self.tmp) if n.startswith("full.restart.tmp")], [])

    def test_two_ranks_and_refusals(self):
        mpiexec = os.environ.get("ML_TORCH_MPIEXEC", "mpiexec")
        with open(os.path.join(self.tmp, "in.np2"), "w") as f:
            f.write(self.system + "write_restart/atomic np2.*.restart\nclear\nread_restart np2.0.restart\n"
                    "print \"NATOMS $(atoms)\"\nwrite_restart/atomic np2.%.restart\n")
        out = subprocess.run([mpiexec, "--allow-run-as-root", "--oversubscribe", "-np", "2", self.lmp,
                              "-log", "none", "-nocite", "-in", "in.np2"], cwd=self.tmp, capture_output=True,
                             text=True, timeout=120)
        self.assertIn("NATOMS 32000", out.stdout, out.stdout[-2000:] + out.stderr[-2000:])
        self.assertIn("write_restart/atomic writes one file, but np2.%.restart asks for one file per process",
                      out.stdout + out.stderr)
        self.assertNotEqual(out.returncode, 0)
        self.assertEqual([n for n in os.listdir(self.tmp) if n.startswith("np2.") and ".tmp." in n], [])


if __name__ == "__main__":
    unittest.main()
