#!/usr/bin/env python3
"""The atomic (centroid) virial of pair_style torch against a brute-force
reference, the quantity compute heat/flux is built on.

For every atom i the exact atomic virial of a model with atomic energies E_j
is  W_i = sum_j sum_{images n of i} (r_j - r_n) (x) dE_j/dr_n  (Fan et al.,
PRB 92, 094301 (2015)). The reference here computes the full Jacobian
dE_j/dr_n of every atomic energy by autograd, one backward pass per atom, on
the explicitly unfolded periodic system (the cell and its periodic images
as plain nodes: no cell shifts, no ghosts, no halo), with the model file's
own TorchScript forward. LAMMPS computes it with `compute
centroid/stress/atom NULL virial` (which reports -W in pressure x volume
units) on 1 to 4 MPI ranks, under each way the style can build the graph.

The system: a sheared (triclinic) Si or Ar slab, periodic in x and y and
with vacuum in z, small enough in x and y that a rank holds periodic images
of its own atoms; on 3 and 4 ranks (processors * * 1 is not forced) some
ranks hold no atom of the slab.

Run: python unittest/test_heatflux.py -v  (ctest does; ML_TORCH_LMP names
the lmp executable, ML_TORCH_MPIEXEC the MPI launcher).
"""

import ctypes
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np
import torch

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(root, "python"))
from mltorch.export import read_metadata  # noqa: E402

LMP = os.environ.get("ML_TORCH_LMP", os.path.join(root, "build", "lmp"))
MPIEXEC = os.environ.get("ML_TORCH_MPIEXEC", "mpirun")
NKTV2P = 1.6021765e6    # LAMMPS metal units: eV/A^3 to bar
POT = os.path.join(root, "potentials")
MODELS = os.path.join(root, "unittest", "models")

# the slab: (lattice, mass, element); 2 x 2 x 2 cells (or 2 x 2 x 1) in a box 2 x 2 x 6
# cells high, sheared by half a cell in x along y
SLAB = {"Si": ("diamond 5.431", 28.0855), "Ar": ("fcc 5.26", 39.948)}


def lammps_input(model, element, pair_extra, dump, cells=2):
    lattice, mass = SLAB[element]
    return f"""
units metal
boundary p p p
lattice {lattice}
region box prism 0 2 0 2 0 6 1 0 0
create_box 1 box
region slab block INF INF INF INF 2 {2 + cells}
create_atoms 1 region slab
mass 1 {mass}
displace_atoms all random 0.15 0.15 0.15 8791 units box
pair_style torch {pair_extra}
pair_coeff * * {model} {element}
compute cv all centroid/stress/atom NULL virial
compute sv all reduce sum c_cv[1] c_cv[2] c_cv[3] c_cv[4] c_cv[5] c_cv[6]
compute p all pressure NULL virial
variable vol equal vol
thermo_style custom step pe c_sv[1] c_sv[2] c_sv[3] c_sv[4] c_sv[5] c_sv[6] c_p[1] c_p[2] c_p[3] c_p[4] c_p[5] c_p[6] v_vol
thermo_modify format float %.17g
dump d all custom 1 {dump} id x y z c_cv[*]
dump_modify d sort id format float %.17g
run 0 post no
"""


def lmp(script, np_=1):
    """lmp on `script` on np_ MPI ranks (one OpenMP thread each): its output"""
    cmd = [LMP, "-log", "none", "-echo", "none", "-nocite"]
    if np_ > 1:
        cmd = MPIEXEC.split() + ["--allow-run-as-root", "--oversubscribe", "-np", str(np_)] + cmd
    out = subprocess.run(cmd, input=script, capture_output=True, text=True,
                         env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=600)
    if out.returncode != 0:
        raise AssertionError(f"lmp failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return out.stdout


def thermo_rows(output, n):
    """the first n thermo rows of the first run (after its "Step PotEng" header)"""
    text = output.splitlines()
    k = next(i for i, l in enumerate(text) if l.split()[:2] == ["Step", "PotEng"])
    return np.array([[float(v) for v in l.split()] for l in text[k + 1:k + 1 + n]])


def run_lammps(model, element, np_, pair_extra="", cells=2):
    with tempfile.TemporaryDirectory() as tmp:
        dump = os.path.join(tmp, "cv.dump")
        output = lmp(lammps_input(model, element, pair_extra, dump, cells), np_)
        lines = open(dump).read().splitlines()
    thermo = list(thermo_rows(output, 1)[0])
    box = [[float(v) for v in lines[5 + d].split()] for d in range(3)]
    n = int(lines[3])
    data = np.array([[float(v) for v in l.split()] for l in lines[9:9 + n]])
    return box, data, thermo, output


def cell_vectors(box):
    """LAMMPS's triclinic dump bounds to the cell vectors and origin"""
    box = [list(b) + [0.0] * (3 - len(b)) for b in box]    # an orthogonal box has no tilts
    (xlob, xhib, xy), (ylob, yhib, xz), (zlo, zhi, yz) = box
    xlo = xlob - min(0.0, xy, xz, xy + xz)
    xhi = xhib - max(0.0, xy, xz, xy + xz)
    ylo = ylob - min(0.0, yz)
    yhi = yhib - max(0.0, yz)
    a = np.array([xhi - xlo, 0.0, 0.0])
    b = np.array([xy, yhi - ylo, 0.0])
    c = np.array([xz, yz, zhi - zlo])
    return a, b, c


def unfolded(box, pos, reach):
    """the cell's atoms and their periodic images in x and y out to `reach`:
    positions, and the atom of the cell each node is an image of (the cell's
    own atoms first)"""
    a, b, _ = cell_vectors(box)
    width = min(np.linalg.norm(np.cross(a, b)) / np.linalg.norm(b), np.linalg.norm(np.cross(a, b)) / np.linalg.norm(a))
    nrep = int(np.ceil(reach / width)) + 1
    shifts = [(0, 0)] + [(i, j) for i in range(-nrep, nrep + 1) for j in range(-nrep, nrep + 1) if (i, j) != (0, 0)]
    x = np.concatenate([pos + i * a + j * b for i, j in shifts])
    return x, np.tile(np.arange(len(pos)), len(shifts))


def energies_on(model, x, rc):
    """the model's atomic energies of the nodes x (a plain graph: every pair
    closer than rc, no cell): the energies, the positions and the edges"""
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    with torch.no_grad():
        # exact differences (the matrix-product form leaves 1e-7 on the diagonal)
        d = torch.cdist(xt, xt, compute_mode="donot_use_mm_for_euclid_dist")
        d.fill_diagonal_(float("inf"))
        centre, nbr = torch.nonzero(d < rc, as_tuple=True)
    edge_vec = xt[nbr] - xt[centre]
    species = torch.zeros(len(x), dtype=torch.int64)
    return model(edge_vec, torch.stack([centre, nbr]), species, len(x)), xt, centre, edge_vec


def keep_large_allocations():
    """what the style does for its own process (src/core/runtime.cpp): glibc
    keeps freed blocks up to 1 GiB instead of handing them back to the
    system. The reference's per-atom graphs allocate and free hundreds of MB
    for every atom; handed back, they are faulted in again each time
    (SevenNet-0's reference: 6.4 s an atom, 40% of it in the kernel; kept,
    4.4 s)"""
    if "MALLOC_MMAP_THRESHOLD_" not in os.environ:
        libc = ctypes.CDLL(None)
        M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3    # glibc's malloc.h
        if libc.mallopt(M_MMAP_THRESHOLD, 1 << 30) == 1 and "MALLOC_TRIM_THRESHOLD_" not in os.environ:
            libc.mallopt(M_TRIM_THRESHOLD, 1 << 30)


def reference(model_path, box, pos, reach, ball=None):
    """W_i (3x3, [a][b] = position component a, gradient component b) of
    every atom of the cell, by the full Jacobian on the unfolded system;
    `reach` is the distance beyond which no atom can change an atomic
    energy of the cell (layers x cutoff) plus one cutoff of edges.

    With `ball` (at least layers x cutoff), each atomic energy E_j is
    evaluated on its own graph: the nodes within `ball` of atom j. That is
    exact (a node farther than layers x cutoff reaches E_j by no chain of
    layers; a node inside whose neighbours are cut off is itself at least one
    layer too far for its changed features to arrive), and for a deep model
    much cheaper than one graph of the whole unfolded slab."""
    keep_large_allocations()
    meta = read_metadata(model_path)
    model = torch.jit.load(model_path, map_location="cpu")
    rc = float(meta["cutoff"])
    n = len(pos)
    x, owner = unfolded(box, pos, reach)
    W, W_centre, energy = np.zeros((n, 3, 3)), np.zeros((n, 3, 3)), 0.0

    def add_row(E, xt, centre, edge_vec, nodes, j):
        """row j of the Jacobian into W, and what a per-atom split of the
        edge gradients gives instead (the edges of the cell's atoms,
        -r_ij (x) dE/dr_ij on the centre i, summed over the rows) into
        W_centre: the attribution this test must tell from the right one for
        many-body models. One reverse pass gives both."""
        g, ge = torch.autograd.grad(E, [xt, edge_vec], retain_graph=True)
        rel = x[j] - x[nodes]    # r_j - r_n for every node n
        np.add.at(W, owner[nodes], rel[:, :, None] * g.numpy()[:, None, :])
        ge, r, c = ge.numpy(), edge_vec.detach().numpy(), nodes[centre.numpy()]
        mine = c < n
        np.add.at(W_centre, c[mine], -r[mine][:, :, None] * ge[mine][:, None, :])

    if ball is None:
        nodes = np.arange(len(x))
        energies, xt, centre, edge_vec = energies_on(model, x, rc)
        for j in range(n):
            add_row(energies[j], xt, centre, edge_vec, nodes, j)
        energy = float(energies[:n].sum().detach())
    else:
        torch.set_num_threads(2)    # ctest gives this entry 2 cores
        for j in range(n):
            nodes = np.flatnonzero(np.linalg.norm(x - x[j], axis=1) < ball)
            energies, xt, centre, edge_vec = energies_on(model, x[nodes], rc)
            E = energies[np.searchsorted(nodes, j)]    # nodes is sorted and holds j
            add_row(E, xt, centre, edge_vec, nodes, j)
            energy += float(E.detach())
    return W, energy, W_centre


# LAMMPS's order of the 9 components: xx yy zz xy xz yz yx zx zy
ORDER = [(0, 0), (1, 1), (2, 2), (0, 1), (0, 2), (1, 2), (1, 0), (2, 0), (2, 1)]


class CentroidVirial(unittest.TestCase):
    cache = {}

    def ref(self, models, element, box, pos, reach, ball):
        # a committee's mean: the mean of its members' (W is linear in E)
        key = (tuple(models), element, len(pos))
        if key not in self.cache:
            refs = [reference(m, box, pos, reach, ball) for m in models]
            self.cache[key] = tuple(sum(r[k] for r in refs) / len(refs) for k in range(3))
        return self.cache[key]

    def check(self, models, element, layers, modes, nps=(1, 2, 3, 4), tol=1e-10, twin=None, per_atom_graphs=False,
              cells=2):
        """`twin`: the TorchScript files the reference runs (a compiled
        package's); `per_atom_graphs`: the reference evaluates each atomic
        energy on the nodes within its reach only (for deep models);
        `cells`: the slab's thickness in lattice cells"""
        meta = read_metadata(models[0]) if models[0].endswith(".pt") else read_metadata(twin[0])
        reach = (layers + 1) * float(meta["cutoff"]) + 1.0
        ball = layers * float(meta["cutoff"]) + 0.5 if per_atom_graphs else None
        worst = 0.0
        for np_ in nps:
            for mode in modes:
                box, data, thermo, log = run_lammps(" ".join(models), element, np_, mode, cells)
                pos = data[:, 1:4]
                W, e_ref, W_centre = self.ref(twin or models, element, box, pos, reach, ball)
                want = np.array([[-NKTV2P * W[i][a][b] for a, b in ORDER] for i in range(len(pos))])
                got = data[:, 4:13]
                scale = np.abs(want).max()
                dev = np.abs(got - want).max() / scale
                worst = max(worst, dev)
                # the sum over atoms is the global virial: compute pressure
                # reports W / V (x nktv2p), the reduce -W (x nktv2p)
                vol = thermo[14]
                sums = np.array(thermo[2:8])
                press = np.array(thermo[8:14])
                dsum = np.abs(sums + press * vol).max() / np.abs(press * vol).max()
                de = abs(thermo[1] - e_ref) / abs(e_ref)
                print(f"[ centroid ] {' '.join(os.path.basename(m) for m in models)} {mode or 'default'} on {np_} rank(s): "
                      f"W_i {dev:.2e} of the largest component ({scale:.4g} bar A^3), "
                      f"sum vs global virial {dsum:.2e}, energy {de:.2e}", flush=True)
                self.assertLessEqual(de, 1e-12)
                self.assertLessEqual(dev, tol, f"{mode} on {np_} ranks")
                self.assertLessEqual(dsum, 1e-12, f"{mode} on {np_} ranks")
        # the centre attribution: exact for pairwise models only
        other = np.abs(W_centre - W).max() / np.abs(W).max()
        print(f"[ centroid ] {' '.join(os.path.basename(m) for m in models)}: the edge terms on "
              f"their centres instead would be {other:.2e} of the largest component off", flush=True)
        return worst, other

    def test_pairwise_model(self):
        _, other = self.check([os.path.join(POT, "lj_Ar.pt")], "Ar", 1, [""], tol=1e-13)
        self.assertLessEqual(other, 1e-13)    # pairwise: both attributions agree

    def test_local_many_body_models(self):
        for m in ("si_local.pt", "sw_Si.pt"):
            _, other = self.check([os.path.join(POT, m)], "Si", 1, [""])
            self.assertGreater(other, 1e-2)    # the reference tells the two apart

    def test_compiled_package_runs_its_twin(self):
        self.check([os.path.join(POT, "si_mp2.pt2")], "Si", 2, ["", "halo thick"], nps=(1, 2),
                   twin=[os.path.join(POT, "si_mp2.pt")])

    def test_message_passing_every_halo_mode(self):
        # 1 rank: folded by default (unfolded for these steps), 'fold no'
        # runs the exchange; more ranks: the exchange; thick ghosts
        self.check([os.path.join(POT, "si_mp2.pt")], "Si", 2, ["", "fold no", "halo thick"])

    def test_four_layers(self):
        self.check([os.path.join(MODELS, "si_mp4_layered.pt")], "Si", 4, ["", "halo thick"], nps=(1, 3))

    def import_si(self, framework, source, model):
        """mltorch-import of `source` for Si in float64 into `model`, as a user runs it"""
        out = subprocess.run([os.path.join(root, ".venv", "bin", "mltorch-import"), framework, source,
                              "--elements", "Si", "--dtype", "float64", "-o", model],
                             capture_output=True, text=True, timeout=900)
        self.assertEqual(out.returncode, 0, out.stdout[-2000:] + out.stderr[-2000:])

    def test_reference_per_atom_graphs(self):
        """the reference's per-atom graphs (what the deep SevenNet-0 takes)
        give what one graph of the whole unfolded slab gives, for si_mp2"""
        box, data, _, _ = run_lammps(os.path.join(POT, "si_mp2.pt"), "Si", 1)
        pos = data[:, 1:4]
        path = os.path.join(POT, "si_mp2.pt")
        rc = float(read_metadata(path)["cutoff"])
        whole = reference(path, box, pos, 3 * rc + 1.0)
        per_atom = reference(path, box, pos, 3 * rc + 1.0, ball=2 * rc + 0.5)
        dev = [np.abs(p - w).max() / np.abs(w).max() for p, w in ((per_atom[0], whole[0]), (per_atom[2], whole[2]))]
        de = abs(per_atom[1] - whole[1]) / abs(whole[1])
        print(f"[ centroid ] reference on per-atom graphs vs one graph: W_i {dev[0]:.2e}, centre split {dev[1]:.2e}, "
              f"energy {de:.2e}", flush=True)
        self.assertLessEqual(max(dev), 1e-13)
        self.assertLessEqual(de, 1e-14)

    def test_imported_sevennet(self):
        """SevenNet-0 (5 layers, 5 A), imported in float64 for Si, on a slab
        one cell thick (32 atoms): its reach (25 A) makes the unfolded slab
        thousands of nodes, so the reference evaluates each atomic energy on
        the nodes within 25.5 A of it (about 600)"""
        try:
            import sevenn  # noqa: F401
        except ImportError:
            self.fail("sevenn does not import: the imported-model heat-flux test needs it (tools/setup.sh)")
        with tempfile.TemporaryDirectory() as tmp:
            model = os.path.join(tmp, "7net-0_Si_f64.pt")
            self.import_si("sevenn", "7net-0", model)
            # (thick ghosts, 25 A deep around a 10.9 A wide slab, would
            # hold 30 images of each atom: more memory than this machine
            # has in float64; they are checked with the other models)
            self.check([model], "Si", 5, ["", "fold no"], nps=(1,), per_atom_graphs=True, cells=1)
            self.check([model], "Si", 5, [""], nps=(2, 3, 4), per_atom_graphs=True, cells=1)

    def test_imported_nequip_allegro_mace(self):
        """NequIP (3 layers) and Allegro (strictly local, many-body) trained by
        nequip-train, and MACE (2 layers) trained by MACE's CLI
        (potentials/frameworks), imported for Si in float64 as a user does"""
        frameworks = os.path.join(POT, "frameworks")
        sources = [("nequip", os.path.join(frameworks, "nequip_sic", "nequip_sic.ckpt")),
                   ("nequip", os.path.join(frameworks, "nequip_sic", "allegro_sic.ckpt")),
                   ("mace", os.path.join(frameworks, "mace_sic", "mace_sic.model"))]
        with tempfile.TemporaryDirectory() as tmp:
            for framework, source in sources:
                model = os.path.join(tmp, os.path.basename(source).split(".")[0] + "_Si_f64.pt")
                self.import_si(framework, source, model)
                layers = int(read_metadata(model)["num_interaction_layers"])
                modes = ["", "halo thick"] if layers > 1 else [""]
                self.check([model], "Si", layers, modes, nps=(1, 3))

    def test_committee_mean(self):
        self.check([os.path.join(POT, "si_mp2.pt"), os.path.join(MODELS, "si_mp2_perturbed.pt")], "Si", 2,
                   ["committee mean", "committee mean halo thick"], nps=(1, 2))


class HeatFlux(unittest.TestCase):
    """compute heat/flux on the atomic virial along 10 NVE steps: the same on
    1 and 3 ranks and in every halo mode"""

    def flux(self, np_, mode):
        script = f"""
units metal
boundary p p p
lattice diamond 5.431
region box prism 0 2 0 2 0 6 1 0 0
create_box 1 box
region slab block INF INF INF INF 2 4
create_atoms 1 region slab
mass 1 28.0855
displace_atoms all random 0.15 0.15 0.15 8791 units box
velocity all create 1500 4928 loop geom
pair_style torch {mode}
pair_coeff * * {POT}/si_mp2.pt Si
compute ke all ke/atom
compute pe all pe/atom
compute cv all centroid/stress/atom NULL virial
compute flux all heat/flux ke pe cv
fix md all nve
thermo_style custom step pe c_flux[1] c_flux[2] c_flux[3] c_flux[4] c_flux[5] c_flux[6]
thermo_modify format float %.17g
thermo 1
run 10 post no
"""
        return thermo_rows(lmp(script, np_), 11)

    def test_equal_on_ranks_and_halo_modes(self):
        ref = self.flux(1, "halo thick")
        scale = np.abs(ref[:, 2:]).max()
        self.assertGreater(scale, 1.0)
        for np_, mode in ((1, ""), (3, ""), (3, "halo thick")):
            got = self.flux(np_, mode)
            dev = np.abs(got[:, 2:] - ref[:, 2:]).max() / scale
            print(f"[ heat flux ] si_mp2 {mode or 'default'} on {np_} rank(s) vs halo thick on 1: "
                  f"J over 10 NVE steps {dev:.2e} of the largest", flush=True)
            self.assertLessEqual(dev, 1e-10)


class WithFinetune(unittest.TestCase):
    """fix torch/finetune training si_mp2 (sw as the teacher) while the heat
    flux is computed on every step: its training passes leave the atomic
    virial alone, and after updates it is that of the updated model"""

    def setup(self, fix, tmp):
        sw = os.path.join(os.environ.get("LAMMPS_POTENTIALS", os.path.join(root, "build", "lammps-potentials")),
                          "Si.sw")
        lines = ["units metal", "lattice diamond 5.431", "region box block 0 2 0 2 0 2", "create_box 1 box",
                 "create_atoms 1 box", "mass 1 28.0855", "displace_atoms all random 0.1 0.1 0.1 871 units box",
                 "velocity all create 1500 4928 loop geom", "pair_style torch",
                 f"pair_coeff * * {POT}/si_mp2.pt Si", "compute ke all ke/atom", "compute pe all pe/atom",
                 "compute cv all centroid/stress/atom NULL virial", "compute flux all heat/flux ke pe cv",
                 "fix md all nve"]
        if fix:
            lines.append(f'fix ft all torch/finetune 2 teacher sw "* * {sw} Si" {fix} log 0')
        lines += ["thermo_style custom step pe c_flux[1] c_flux[2] c_flux[3] c_flux[4] c_flux[5] c_flux[6]",
                  "thermo_modify format float %.17g", "thermo 1",
                  f"dump d all custom 11 {tmp}/a.dump id c_cv[*]", "dump_modify d sort id format float %.17g",
                  "run 11 post no"]
        return lines

    @staticmethod
    def last_frame(path):
        lines = open(path).read().splitlines()
        n = int(lines[3])
        start = len(lines) - n
        return np.array([[float(v) for v in l.split()] for l in lines[start:]])

    def test_training_passes_change_nothing(self):
        for np_ in (1, 2):
            with tempfile.TemporaryDirectory() as tmp:
                plain = thermo_rows(lmp("\n".join(self.setup("", tmp)) + "\n", np_), 12)
                # SGD steps of 1e-300 x gradient leave every parameter bitwise
                trained = thermo_rows(lmp("\n".join(self.setup("lr 1e-300 optimizer sgd", tmp)) + "\n", np_), 12)
            dev = np.abs(trained[:, 1:] - plain[:, 1:]).max() / np.abs(plain[:, 2:]).max()
            print(f"[ heat flux ] fix torch/finetune with lr 1e-300 on {np_} rank(s): pe and J over 11 steps "
                  f"{dev:.2e} of the largest J from the run without it", flush=True)
            self.assertLessEqual(dev, 1e-13)

    def test_after_updates_it_is_the_updated_models(self):
        for np_ in (1, 2):
            with tempfile.TemporaryDirectory() as tmp:
                lines = self.setup("lr 1e-3", tmp)
                # step 11 follows the update of step 10: its atomic virial
                # is the updated model's, as a fresh force call gives it
                lines += ["variable n equal f_ft[7]", 'print "updates: ${n}"', "unfix ft", "undump d", f"dump e all custom 1 {tmp}/b.dump id c_cv[*]",
                          "dump_modify e sort id format float %.17g", "run 0 post no"]
                log = lmp("\n".join(lines) + "\n", np_)
                a, b = self.last_frame(f"{tmp}/a.dump"), self.last_frame(f"{tmp}/b.dump")
            dev = np.abs(a[:, 1:] - b[:, 1:]).max() / np.abs(b[:, 1:]).max()
            print(f"[ heat flux ] after 5 updates on {np_} rank(s): atomic virial of the last step vs a "
                  f"fresh force call of the updated model {dev:.2e}", flush=True)
            self.assertIn("updates: 5", log)
            self.assertLessEqual(dev, 1e-13)


if __name__ == "__main__":
    unittest.main()
