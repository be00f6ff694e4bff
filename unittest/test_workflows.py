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
import tempfile
import unittest

import numpy as np

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(here)
LMP = os.environ.get("ML_TORCH_LMP")
POT = os.environ.get("LAMMPS_POTENTIALS", "")
MODEL = os.path.join(root, "potentials", "sw_Si.pt")
STUDENT = os.path.join(root, "examples", "finetune", "si_student.pt")
PAIRS = {"native": f"pair_style sw\npair_coeff * * {POT}/Si.sw Si",
         "torch": f"pair_style torch\npair_coeff * * {MODEL} Si"}


def run_lmp(script, work, ranks=1, partitions=None, name="in.workflow"):
    """Run `script` in `work` on `ranks` MPI ranks (one per partition when
    `partitions`); the screen output (universe screen with partitions)."""
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


def result(text):
    """The numbers of the last 'RESULT ...' line."""
    return np.array([float(w) for w in text.split("RESULT ")[-1].split("\n")[0].split()])


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


def silicon(nrep=2, a=5.431, vacancy=False, seed=12345, rattle=0.05):
    """A diamond Si crystal (atoms 1..8 nrep^3, atom 1 at the origin removed for
    a vacancy), rattled, as LAMMPS input lines."""
    lines = ["units metal", "atom_style atomic", "atom_modify map array sort 0 0.0", "boundary p p p",
             f"lattice diamond {a}", f"region box block 0 {nrep} 0 {nrep} 0 {nrep}", "create_box 1 box",
             "create_atoms 1 box", "mass 1 28.0855"]
    if vacancy:
        lines += ["group gone id 1", "delete_atoms group gone compress no"]
    if rattle:
        lines.append(f"displace_atoms all random {rattle} {rattle} {rattle} {seed} units box")
    return "\n".join(lines) + "\n"


def report(what, **devs):
    print(f"{what}: torch vs native, largest relative difference "
          + ", ".join(f"{k} {v:.2g}" for k, v in devs.items()))


@unittest.skipUnless(LMP and POT, "ML_TORCH_LMP and LAMMPS_POTENTIALS must be set")
class Workflows(unittest.TestCase):
    def both(self, make, **kw):
        """Run the script make(pair) for native sw and the torch model."""
        out = {}
        for kind, pair in PAIRS.items():
            work = tempfile.mkdtemp(prefix=f"workflow-{kind}-")
            out[kind] = (run_lmp(make(pair), work, **kw), work)
        return out

    def test_minimize_and_box_relax(self):
        def script(pair):
            return silicon(3, a=5.38, vacancy=True) + pair + """
thermo_style custom step pe press lx ly lz
thermo_modify format float %.15g
minimize 0.0 1.0e-10 1000 10000
print "RESULT $(pe:%.17g) $(step)"
fix relax all box/relax aniso 0.0 vmax 0.001
minimize 0.0 1.0e-10 2000 20000
print "RESULT $(pe:%.17g) $(lx:%.17g) $(ly:%.17g) $(lz:%.17g) $(press:%.17g)"
write_dump all custom final.dump id x y z modify sort id format float %.17g
"""
        out = self.both(script)
        fixed = [result(o.split("fix relax")[0]) for o, _ in (out["native"], out["torch"])]
        got, ref = (result(out[k][0]) for k in ("torch", "native"))
        x = [sorted_dump(os.path.join(out[k][1], "final.dump")) for k in ("torch", "native")]
        report("minimize, then fix box/relax aniso 0 (215 atoms, vacancy)", fixed_box_pe=rel(fixed[1][0], fixed[0][0]),
               relaxed_pe=rel(got[0], ref[0]), box=rel(got[1:4], ref[1:4]), positions=np.abs(x[0] - x[1]).max())
        print(f"native: energy {fixed[0][0]:.6f} eV (fixed box), {ref[0]:.6f} eV relaxed, box "
              f"{ref[1]:.6f} x {ref[2]:.6f} x {ref[3]:.6f} A, pressure {ref[4]:.3g} bar")
        self.assertLess(rel(fixed[1][0], fixed[0][0]), 1e-12)
        self.assertLess(rel(got[0], ref[0]), 1e-10)
        self.assertLess(rel(got[1:4], ref[1:4]), 1e-9)
        self.assertLess(np.abs(x[0] - x[1]).max(), 1e-7)
        self.assertGreater(ref[1] - 3 * 5.38, 0.03)      # the box did relax (5.38 -> ~5.43 A)

    @staticmethod
    def neb_work(prefix):
        """A folder with LAMMPS's own NEB example of a vacancy hop in Si
        (examples/fire: 511 atoms, the hopping atom's final position)."""
        work = tempfile.mkdtemp(prefix=prefix)
        example = os.path.join(os.path.dirname(os.path.realpath(POT)), "examples", "fire")
        for name in ("initial.sivac", "final.sivac"):
            shutil.copy(os.path.join(example, name), work)
        return work

    def neb_script(self, pair, extra=""):
        # LAMMPS's examples/fire/in.neb.sivac.fire with 4 images and our pair style
        return """units metal
atom_style atomic
atom_modify map array sort 0 0.0
boundary p p p
read_data initial.sivac
group del id 300
delete_atoms group del compress no
""" + pair + "\n" + extra + """
variable u uloop 4
# the vacancy's neighbours pushed off their symmetric sites: sw's relaxed
# vacancy is the distorted one (-2213.3374 eV as in LAMMPS's example log; from
# the symmetric start the minimizer stays in a state 1.67 eV above)
group vacneigh id 174 175 301 304 306 331 337
displace_atoms vacneigh random 0.5 0.5 0.5 123456 units box
minimize 0.0 1.0e-8 5000 50000
reset_timestep 0
fix neb all neb 1.0
thermo 100
timestep 0.01
min_style fire
neb 0.0 0.01 100 100 10 final final.sivac
"""

    def neb_barrier(self, text):
        """Energy barrier and the images' reaction coordinates and energies of
        the last step NEB printed (universe screen)."""
        rows = [l.split() for l in text.splitlines() if re.match(r"^\s*\d+\s+[-0-9.eE+]+\s", l)]
        last = [float(w) for w in rows[-1]]
        # Step MaxReplicaForce MaxAtomForce GradV0 GradV1 GradVc EBF EBR RDT RD1 PE1 ... RD4 PE4
        return last[6], np.array(last[9:])

    def test_neb_vacancy_migration(self):
        out = {}
        for kind, pair in PAIRS.items():
            out[kind] = run_lmp(self.neb_script(pair), self.neb_work(f"neb-{kind}-"), ranks=4, partitions=4)
        (eb_t, path_t), (eb_n, path_n) = self.neb_barrier(out["torch"]), self.neb_barrier(out["native"])
        report("NEB, Si vacancy hop (LAMMPS's examples/fire), 4 images on 4 partitions", barrier=rel(eb_t, eb_n),
               path=rel(path_t, path_n))
        print(f"native barrier {eb_n:.6f} eV; images (reaction coordinate, energy): {path_n}")
        self.assertTrue(0.4 < eb_n < 0.6, eb_n)     # LAMMPS's example log: 0.51 eV
        self.assertLess(rel(eb_t, eb_n), 1e-8)
        self.assertLess(rel(path_t, path_n), 1e-8)

    def test_pimd_langevin_4_beads(self):
        def script(pair):
            return silicon(2) + pair + """
variable ibead uloop 4 pad
velocity all create 300.0 4928459 loop geom
fix pimd all pimd/langevin method nmpimd ensemble nvt integrator obabo thermostat PILE_L 1234 tau 1.0 temp 300.0 fixcom no
timestep 0.0005
thermo_style custom step pe f_pimd[*]
thermo 50
run 200
print "RESULT $(pe:%.17g)"
write_dump all custom bead${ibead}.dump id x y z vx vy vz modify sort id format float %.17g
"""
        out = self.both(script, ranks=4, partitions=4)
        devs, pes = [], []
        for b in range(1, 5):
            d = [sorted_dump(os.path.join(out[k][1], f"bead{b}.dump")) for k in ("torch", "native")]
            devs.append(np.abs(d[0] - d[1]).max())
            logs = [read(os.path.join(out[k][1], f"log.lammps.{b - 1}")) for k in ("torch", "native")]
            pes.append(rel(result(logs[0]), result(logs[1])))
        report("fix pimd/langevin, 4 beads on 4 partitions, 200 steps", positions_velocities=max(devs),
               bead_pe=max(pes))
        self.assertLess(max(devs), 1e-8)
        self.assertLess(max(pes), 1e-10)

    def temper_script(self, pair, extra="", printed="$(pe:%.17g)"):
        return silicon(2) + pair + """
variable t world 300.0 330.0 360.0 390.0
velocity all create $t 4928459 loop geom
""" + extra + """
fix md all nvt temp $t $t 0.05
timestep 0.001
thermo 100
temper 1000 50 $t md 3847 58382
print "RESULT """ + printed + '"\n'

    def swaps(self, text):
        """The temper lines of the universe screen: step and the temperature of each replica."""
        return [l.split() for l in text.splitlines() if re.match(r"^\d+(\s+\d+){4}$", l.strip())]

    def test_temper_swaps(self):
        out = self.both(lambda pair: self.temper_script(pair), ranks=4, partitions=4)
        s_t, s_n = self.swaps(out["torch"][0]), self.swaps(out["native"][0])
        changes = sum(1 for a, b in zip(s_n, s_n[1:]) if a[1:] != b[1:])
        print(f"temper, 4 replicas at 300-390 K, 1000 steps, swaps tried every 50: {len(s_n)} lines, "
              f"{changes} with a swap; torch's the same: {s_t == s_n}")
        self.assertEqual(len(s_n), 21)
        self.assertGreater(changes, 0)
        self.assertEqual(s_t, s_n)

    def test_dynamical_matrix_and_phonons(self):
        def script(pair):
            return silicon(2, rattle=0.0) + pair + """
dynamical_matrix all regular 1.0e-4 file dynmat.bin binary yes
"""
        out = self.both(script)
        n = 3 * 64
        mats = [np.fromfile(os.path.join(out[k][1], "dynmat.bin"), dtype=np.float64).reshape(n, n)
                for k in ("torch", "native")]
        # the mass-weighted dynamical matrix of the supercell (eV/A^2/amu): its
        # eigenvalues are the squared angular frequencies of the supercell's phonons
        w2 = [np.linalg.eigvalsh(0.5 * (m + m.T)) for m in mats]
        thz = np.sqrt(np.clip(w2[1], 0, None)) * 15.633302     # sqrt(eV/A^2/amu) / 2 pi in THz
        report("dynamical_matrix, 64-atom Si", matrix=rel(mats[0], mats[1]), squared_frequencies=rel(w2[0], w2[1]))
        print(f"native: highest supercell frequency {thz.max():.4f} THz (Si's optical phonon at "
              f"Gamma: 15.5 THz measured, higher with sw)")
        self.assertLess(rel(mats[0], mats[1]), 1e-8)
        self.assertLess(rel(w2[0], w2[1]), 1e-8)
        self.assertTrue(16.0 < thz.max() < 19.0, thz.max())     # 17.83 THz with sw

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
        script = silicon(2) + f"pair_style torch\npair_coeff * * {STUDENT} Si\n" + """
variable ibead uloop 2 pad
velocity all create 300.0 4928459 loop geom
""" + self.finetune_line(work) + """
fix pimd all pimd/langevin method nmpimd ensemble nvt integrator obabo thermostat PILE_L 1234 tau 1.0 temp 300.0 fixcom no
timestep 0.0005
thermo 50
run 100
print "RESULT $(f_ft[7]) $(f_ft[3]:%.17g)"
"""
        run_lmp(script, work, ranks=2, partitions=2)
        n = self.replicas_trained_alike(work, 2, 20)
        print(f"fix torch/finetune under fix pimd/langevin, 2 beads: {n:.0f} updates, the beads' "
              f"parameters equal after each (check 1)")

    def test_finetune_temperatures_are_replicas(self):
        """Under temper each temperature's partition is a replica."""
        work = tempfile.mkdtemp(prefix="temper-finetune-")
        pair = f"pair_style torch\npair_coeff * * {STUDENT} Si\n"
        run_lmp(self.temper_script(pair, self.finetune_line(work), "$(f_ft[7])"), work, ranks=4, partitions=4)
        n = self.replicas_trained_alike(work, 4, 200)
        print(f"fix torch/finetune under temper, 4 replicas: {n:.0f} updates, the replicas' "
              f"parameters equal after each (check 1)")

    def test_finetune_idle_under_neb(self):
        """NEB minimizes: fix torch/finetune is idle there (a WARNING says so),
        and the path is that of the model as it is."""
        out = {}
        for with_fix in (False, True):
            work = self.neb_work("neb-finetune-")
            extra = self.finetune_line(work) if with_fix else ""
            run_lmp(self.neb_script(f"pair_style torch\npair_coeff * * {STUDENT} Si\n", extra), work,
                    ranks=4, partitions=4)
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
