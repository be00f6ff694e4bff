"""Tests of the Python tooling (potentials/mltorch): exporter checks, model
inspection, and the LAMMPS reference-data pipeline.

Run: python unittest/test_python.py -v   (ctest does; ML_TORCH_LMP
names the lmp executable for the data test).
"""

import contextlib
import io
import json
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
from torch import Tensor, nn

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(here)
sys.path.insert(0, os.path.join(root, "potentials"))
warnings.filterwarnings("ignore", category=FutureWarning)

from mltorch import lammps_data  # noqa: E402
from mltorch.compiled import compile_model, read_package, rebuild  # noqa: E402
from mltorch.export import METADATA_NAME, ExportError, export, read_metadata  # noqa: E402
from mltorch.graph import build_graph, edge_vectors, evaluate  # noqa: E402
from mltorch.models import LocalMBNet, MPNet  # noqa: E402
from mltorch.train import batch_predict, errors, fit_energy_shift, prepare, scale_features, train  # noqa: E402


def pair_energy(edge_vectors: Tensor, edge_index: Tensor, n: int) -> Tensor:
    r = torch.linalg.norm(edge_vectors, dim=1)
    out = torch.zeros(n, dtype=edge_vectors.dtype)
    return out.index_add(0, edge_index[0], torch.exp(-r))


class Good(nn.Module):
    def forward(self, edge_vectors: Tensor, edge_index: Tensor, species: Tensor, n_local: int) -> Tensor:
        return pair_energy(edge_vectors, edge_index, species.size(0))


class Detached(nn.Module):
    def forward(self, edge_vectors: Tensor, edge_index: Tensor, species: Tensor, n_local: int) -> Tensor:
        return pair_energy(edge_vectors.detach(), edge_index, species.size(0))


class NotInvariant(nn.Module):
    def forward(self, edge_vectors: Tensor, edge_index: Tensor, species: Tensor, n_local: int) -> Tensor:
        out = torch.zeros(species.size(0), dtype=edge_vectors.dtype)
        return out.index_add(0, edge_index[0], torch.exp(-edge_vectors[:, 0] ** 2))


class Scalar(nn.Module):
    def forward(self, edge_vectors: Tensor, edge_index: Tensor, species: Tensor, n_local: int) -> Tensor:
        return pair_energy(edge_vectors, edge_index, species.size(0)).sum()


def finetune_script(student, saved, save_every, log_every, steps):
    """A 64-atom Si run of fix torch/finetune (teacher: LAMMPS's sw) that saves the model."""
    sw = os.path.join(os.environ["LAMMPS_POTENTIALS"], "Si.sw")
    return f"""
units metal
lattice diamond 5.431
region box block 0 2 0 2 0 2
create_box 1 box
create_atoms 1 box
mass 1 28.0855
displace_atoms all random 0.1 0.1 0.1 5 units box
velocity all create 900 77 loop geom
pair_style torch
pair_coeff * * {student} Si
fix ft all torch/finetune 2 teacher sw "* * {sw} Si" save {save_every} {saved} log {log_every}
fix md all nve
run {steps}"""


class Exporter(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp()
        self.path = os.path.join(self.tmp, "m.pt")
        self.meta = dict(cutoff=3.0, elements=["Si"], units="metal")

    def refused(self, module, text, **kw):
        meta = dict(self.meta, **kw)
        with self.assertRaises(ExportError) as ctx:
            export(module, self.path, **meta)
        self.assertIn(text, str(ctx.exception))
        self.assertFalse(os.path.exists(self.path))

    def test_accepts_and_records_metadata(self):
        meta = export(Good(), self.path, model_type="test", **self.meta)
        stored = read_metadata(self.path)
        self.assertEqual(stored, meta)
        self.assertEqual(stored["format_version"], 1)
        self.assertEqual(len(stored["content_hash"]), 64)
        self.assertEqual(stored["dtype"], "float64")

    def test_refuses_non_conservative_output(self):
        self.refused(Detached(), "does not depend on edge_vectors through autograd")

    def test_refuses_rotation_dependence(self):
        self.refused(NotInvariant(), "not rotation invariant")

    def test_refuses_wrong_output_shape(self):
        self.refused(Scalar(), "must return per-atom energies of shape")

    def test_refuses_bad_metadata(self):
        self.refused(Good(), "cutoff must be a positive number", cutoff=-1.0)
        self.refused(Good(), "distinct element names", elements=["Si", "Si"])
        self.refused(Good(), "units must be a LAMMPS unit style", units="eV")
        self.refused(Good(), "dtype must be one of", dtype="float16")
        self.refused(Good(), "num_interaction_layers must be >= 1", num_interaction_layers=0)

    def test_ml_models_export_in_both_precisions(self):
        for model, layers in ((LocalMBNet(4.0, 2), 1), (MPNet(4.0, 2, num_layers=3), 3)):
            for dtype in ("float64", "float32"):
                meta = export(model, self.path, cutoff=4.0, elements=["Si", "C"], units="metal",
                              dtype=dtype, num_interaction_layers=layers)
                self.assertEqual(meta["dtype"], dtype)

    def test_layered_model_records_its_feature_widths(self):
        # MPNet has the stages: stored in layered form, checked against forward()
        meta = export(MPNet(4.0, 2, num_layers=3), self.path, cutoff=4.0, elements=["Si", "C"],
                      units="metal", num_interaction_layers=3)
        self.assertEqual(meta["layered"], {"feature_widths": [24, 24]})
        self.assertEqual(read_metadata(self.path)["layered"], meta["layered"])
        # a strictly local model, or a module without the stages, is not layered
        meta = export(LocalMBNet(4.0, 2), self.path, cutoff=4.0, elements=["Si", "C"], units="metal")
        self.assertNotIn("layered", meta)

    def test_refuses_stages_that_differ_from_forward(self):
        class Wrong(MPNet):
            @torch.jit.export
            def stage_readout(self, h: torch.Tensor, species: torch.Tensor, n_local: int) -> torch.Tensor:
                return 1.01 * (self.energy_shift[species[:n_local]] + self.readout(h).squeeze(-1))
        self.refused(Wrong(4.0, 1, num_layers=2), "the layered stages do not reproduce forward()",
                     cutoff=4.0, num_interaction_layers=2)

    def test_info_command(self):
        export(Good(), self.path, model_type="test-model", **self.meta)
        out = subprocess.run([sys.executable, "-m", "mltorch.info", self.path], capture_output=True,
                             text=True, cwd=os.path.join(root, "potentials"))
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("model_type               test-model", out.stdout)
        self.assertIn("cutoff                   3.0", out.stdout)
        bad = subprocess.run([sys.executable, "-m", "mltorch.info",
                              os.path.join(here, "models", "no_metadata.pt")],
                             capture_output=True, text=True, cwd=os.path.join(root, "potentials"))
        self.assertEqual(bad.returncode, 1)
        self.assertIn("no ML-TORCH metadata", bad.stderr)


class DataDependent(nn.Module):
    """Python control flow on a tensor value: not exportable with dynamic shapes."""

    def forward(self, edge_vectors: Tensor, edge_index: Tensor, species: Tensor, n_local: int) -> Tensor:
        e = pair_energy(edge_vectors, edge_index, species.shape[0])
        if bool(e.sum() > 0):
            return e
        return -e


class Compiler(unittest.TestCase):
    """mltorch-compile: refusals, inspection, and a fine-tuned model compiled again."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp()

    def test_model_without_architecture_is_refused(self):
        path = os.path.join(self.tmp, "m.pt")
        export(Good(), path, cutoff=3.0, elements=["Si"], units="metal")
        with self.assertRaises(ExportError) as ctx:
            rebuild(path)
        self.assertIn("does not record its architecture", str(ctx.exception))
        out = subprocess.run([os.path.join(root, ".venv", "bin", "mltorch-compile"), path],
                             capture_output=True, text=True)
        self.assertEqual(out.returncode, 1)
        self.assertIn("mltorch-compile: ERROR:", out.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "m.pt2")))

    def test_main_module_class_is_refused(self):
        with self.assertRaises(ExportError) as ctx:
            export(Good(), os.path.join(self.tmp, "m.pt"), cutoff=3.0, elements=["Si"], units="metal",
                   architecture={})
        self.assertIn("must be importable", str(ctx.exception))

    def test_data_dependent_model_is_refused(self):
        path = os.path.join(self.tmp, "m.pt")
        export(DataDependent(), path, cutoff=3.0, elements=["Si"], units="metal")
        with self.assertRaises(ExportError) as ctx:
            compile_model(DataDependent(), path, os.path.join(self.tmp, "m.pt2"))
        self.assertIn("cannot be exported with dynamic edge and node counts", str(ctx.exception))
        self.assertEqual(os.listdir(self.tmp), ["m.pt"])    # nothing half-written

    def test_bad_device_and_threads(self):
        path = os.path.join(root, "potentials", "lj_Ar.pt")
        module, _ = rebuild(path)
        for kw, text in ((dict(device="tpu"), "device must be cpu or cuda"), (dict(threads=0), "threads must be")):
            with self.assertRaises(ExportError) as ctx:
                compile_model(module, path, os.path.join(self.tmp, "x.pt2"), **kw)
            self.assertIn(text, str(ctx.exception))
        if not torch.cuda.is_available():
            with self.assertRaises(ExportError) as ctx:
                compile_model(module, path, os.path.join(self.tmp, "x.pt2"), device="cuda")
            self.assertIn("needs a visible CUDA device", str(ctx.exception))

    def test_info_shows_a_package(self):
        pt2 = os.path.join(root, "potentials", "si_local.pt2")
        twin, info = read_package(pt2)
        self.assertEqual(info["device"], "cpu")
        self.assertEqual(info["torch_version"], torch.__version__)
        out = subprocess.run([os.path.join(root, ".venv", "bin", "mltorch-info"), pt2],
                             capture_output=True, text=True)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("AOTInductor package for cpu", out.stdout)
        self.assertIn("LocalMBNet", out.stdout)

    def test_finetuned_compiled_student_compiles_again(self):
        """A compiled student trained in LAMMPS saves TorchScript; that compiles again, same energy."""
        saved = os.path.join(self.tmp, "ft.pt")
        student = os.path.join(root, "potentials", "si_local.pt2")
        script = finetune_script(student, saved, save_every=10, log_every=0, steps=10) + f"""
unfix ft
pair_coeff * * {saved} Si
run 0 post no
print "SCRIPT $(pe:%.15g)"
"""
        lmp = os.environ["ML_TORCH_LMP"]
        out = subprocess.run([lmp, "-log", "none", "-echo", "none"], input=script, capture_output=True,
                             text=True, cwd=self.tmp)
        self.assertEqual(out.returncode, 0, out.stdout[-2000:] + out.stderr[-2000:])
        compiled = os.path.join(self.tmp, "ft.pt2")
        out2 = subprocess.run([os.path.join(root, ".venv", "bin", "mltorch-compile"), saved, "-o", compiled],
                              capture_output=True, text=True)
        self.assertEqual(out2.returncode, 0, out2.stderr[-2000:])
        again = script.replace(f"pair_coeff * * {saved} Si", f"pair_coeff * * {compiled} Si")
        out3 = subprocess.run([lmp, "-log", "none", "-echo", "none"], input=again, capture_output=True,
                              text=True, cwd=self.tmp)
        self.assertEqual(out3.returncode, 0, out3.stdout[-2000:] + out3.stderr[-2000:])
        self.assertIn("compiled AOTInductor package", out3.stdout)
        e_script = float(out.stdout.split("SCRIPT ")[1].split()[0])
        e_compiled = float(out3.stdout.split("SCRIPT ")[1].split()[0])
        self.assertAlmostEqual(e_script, e_compiled, delta=1e-10 * abs(e_script))
        self.assertGreater(read_metadata(saved)["finetune"]["updates"], 0)


class ModelFilesAreData(unittest.TestCase):
    """A model file names its architecture class; mltorch-compile rebuilds only
    ML-TORCH's own classes (mltorch.*), so a file naming any other callable is
    refused before it is imported or called (issue 33)."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp()
        self.marker = os.path.join(self.tmp, "marker")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def model_file(self, cls, kwargs, name="m.pt"):
        """A valid model file (Good, no parameters) whose metadata names `cls`."""
        path = os.path.join(self.tmp, name)
        export(Good(), path, cutoff=3.0, elements=["Si"], units="metal")
        meta = dict(read_metadata(path), architecture={"class": cls, "kwargs": kwargs})
        torch.jit.save(torch.jit.load(path), path,
                       _extra_files={METADATA_NAME: json.dumps(meta)})
        return path

    def assert_refused(self, path, cls, own=True):
        """rebuild(path) raises a ValueError naming the class and the file, and the
        marker was not made; `own`: the message is the allow-list's."""
        with self.assertRaises(ValueError) as ctx:
            rebuild(path)
        message = str(ctx.exception)
        if own:
            self.assertIn("a model file may only name ML-TORCH's own classes", message)
        self.assertIn(cls, message)
        self.assertIn(path, message)
        self.assertFalse(os.path.exists(self.marker), f"{cls} was run")
        return message

    def test_builtins_and_system_calls_are_refused(self):
        for cls, kwargs in (("os.system", {"command": f"touch {self.marker}"}),
                            ("posix.system", {"command": f"touch {self.marker}"}),
                            ("subprocess.Popen", {"args": ["touch", self.marker]}),
                            ("builtins.open", {"file": self.marker, "mode": "w"}),
                            ("builtins.eval", {})):
            with self.subTest(cls=cls):
                self.assert_refused(self.model_file(cls, kwargs), cls)
        out = subprocess.run([os.path.join(root, ".venv", "bin", "mltorch-compile"),
                              self.model_file("os.system", {"command": f"touch {self.marker}"})],
                             capture_output=True, text=True)
        self.assertEqual(out.returncode, 1, out.stdout + out.stderr)
        self.assertIn("mltorch-compile: ERROR:", out.stderr)
        self.assertIn("may only name ML-TORCH's own classes", out.stderr)
        self.assertFalse(os.path.exists(self.marker))
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "m.pt2")))

    def test_classes_of_other_modules_are_refused(self):
        # a module whose import, and a class whose construction, would leave the marker
        with open(os.path.join(self.tmp, "evil_architecture.py"), "w") as fh:
            fh.write("import torch\n"
                     f"open({self.marker!r}, 'w').close()\n"
                     "class Evil(torch.nn.Module):\n"
                     "    def __init__(self):\n"
                     "        super().__init__()\n"
                     f"        open({self.marker!r}, 'w').close()\n")
        sys.path.insert(0, self.tmp)
        try:
            for cls, kwargs in (("evil_architecture.Evil", {}),
                                ("torch.nn.Identity", {}),
                                ("mltorchx.Evil", {}),
                                ("mltorch", {})):
                with self.subTest(cls=cls):
                    self.assert_refused(self.model_file(cls, kwargs), cls)
            self.assertFalse("evil_architecture" in sys.modules, "its module was imported")
        finally:
            sys.path.remove(self.tmp)

    def test_export_records_only_mltorch_classes(self):
        with open(os.path.join(self.tmp, "user_architecture.py"), "w") as fh:
            fh.write("import torch\n"
                     "class UserModel(torch.nn.Module):\n"
                     "    def forward(self, edge_vectors: torch.Tensor, edge_index: torch.Tensor,\n"
                     "                species: torch.Tensor, n_local: int) -> torch.Tensor:\n"
                     "        r = torch.linalg.norm(edge_vectors, dim=1)\n"
                     "        out = torch.zeros(species.size(0), dtype=edge_vectors.dtype)\n"
                     "        return out.index_add(0, edge_index[0], torch.exp(-r))\n")
        sys.path.insert(0, self.tmp)
        try:
            from user_architecture import UserModel
            path = os.path.join(self.tmp, "user.pt")
            with self.assertRaises(ExportError) as ctx:
                export(UserModel(), path, cutoff=3.0, elements=["Si"], units="metal",
                       architecture={})
            self.assertIn("user_architecture.UserModel is not one of ML-TORCH's own classes",
                          str(ctx.exception))
            self.assertFalse(os.path.exists(path))
            export(UserModel(), path, cutoff=3.0, elements=["Si"], units="metal")   # without: fine
        finally:
            sys.path.remove(self.tmp)
            sys.modules.pop("user_architecture", None)

    def test_mltorch_names_that_are_not_its_own_classes_are_refused(self):
        import mltorch.models
        mltorch.models.Foreign = Good          # another module's class, reachable by name
        try:
            for cls, text in (("mltorch.models.Foreign", "is defined in"),
                              ("mltorch.models.Tensor", "is not a torch.nn.Module class"),
                              ("mltorch.compiled._Stage", "is not a public class name")):
                with self.subTest(cls=cls):
                    self.assertIn(text, self.assert_refused(self.model_file(cls, {}), cls))
            # a dotted path through a module's attributes is not followed
            cls = "mltorch.models.torch.nn.Identity"
            self.assertIn("cannot import", self.assert_refused(self.model_file(cls, {}), cls,
                                                               own=False))
        finally:
            del mltorch.models.Foreign

    def test_shipped_architectures_rebuild(self):
        for name, cls in (("lj_Ar", "LennardJones"), ("si_local", "LocalMBNet"),
                          ("si_mp2", "MPNet")):
            module, meta = rebuild(os.path.join(root, "potentials", name + ".pt"))
            self.assertEqual(type(module).__name__, cls)

    def test_an_imported_model_names_the_file_it_unpickles(self):
        # MACEModel's source is a pickled module: without --source the recorded
        # path is used and a note says so before it is loaded; --source replaces it
        recorded = os.path.join(self.tmp, "absent", "recorded.model")
        path = self.model_file("mltorch.importers.mace.MACEModel",
                               {"path": recorded, "dtype": "float64"})
        err = io.StringIO()
        with contextlib.redirect_stderr(err), self.assertRaises(ValueError) as ctx:
            rebuild(path)
        self.assertIn(recorded, str(ctx.exception))             # no such file: nothing loaded
        self.assertIn(f"was imported from {recorded!r}", err.getvalue())
        self.assertIn("unpickles it", err.getvalue())
        self.assertIn("--source", err.getvalue())
        given = os.path.join(self.tmp, "absent", "given.model")
        err = io.StringIO()
        with contextlib.redirect_stderr(err), self.assertRaises(ValueError) as ctx:
            rebuild(path, source=given)
        self.assertIn(given, str(ctx.exception))
        self.assertEqual(err.getvalue(), "")
        with self.assertRaises(ExportError) as ctx:                # not an imported model
            rebuild(os.path.join(root, "potentials", "lj_Ar.pt"), source=given)
        self.assertIn("is not an imported model", str(ctx.exception))


class Graph(unittest.TestCase):
    def test_message_passing_graph_is_complete(self):
        # a 2-layer model needs image nodes out to 2 cutoffs and their edges
        pos = torch.rand(20, 3, dtype=torch.float64) * 6.0
        cell = torch.eye(3, dtype=torch.float64) * 6.0
        g1 = build_graph(pos, cell, torch.zeros(20, dtype=torch.int64), 3.0, 1)
        g2 = build_graph(pos, cell, torch.zeros(20, dtype=torch.int64), 3.0, 2)
        self.assertGreater(g2.species.shape[0], g1.species.shape[0])
        model = MPNet(3.0, 1, num_layers=2).double()
        e_small, _, _ = evaluate(model, build_graph(pos, cell, torch.zeros(20, dtype=torch.int64), 3.0, 2), pos, cell)
        e_big, _, _ = evaluate(model, build_graph(pos, cell, torch.zeros(20, dtype=torch.int64), 3.0, 3), pos, cell)
        self.assertAlmostEqual(float(e_small), float(e_big), delta=1e-10 * abs(float(e_big)))


class E3nnContractionOrder(unittest.TestCase):
    """mltorch.importers.e3nn_paths: e3nn's tensor products with the Clebsch-Gordan
    contraction reordered give e3nn's values and gradients, also when scripted."""

    def products(self):
        from e3nn import o3
        features, sh = o3.Irreps("16x0e+8x1o+6x1e+4x2e"), o3.Irreps.spherical_harmonics(3)
        # a convolution as SevenNet and NequIP build it: every allowed path, 'uvu'
        out, instr = [], []
        for i1, (mul, ir1) in enumerate(features):
            for i2, (_, ir2) in enumerate(sh):
                for ir in ir1 * ir2:
                    instr.append((i1, i2, len(out), "uvu", True))
                    out.append((mul, ir))
        conv = o3.TensorProduct(features, sh, o3.Irreps(out), instr, shared_weights=False,
                                internal_weights=False)
        full = o3.FullyConnectedTensorProduct("4x0e+3x1o+2x2e", "2x0e+2x1o+1x2e", "5x0e+4x1o+3x2e")
        return [(conv, features.dim, sh.dim), (full, full.irreps_in1.dim, full.irreps_in2.dim)]

    def test_values_and_gradients_unchanged(self):
        import copy
        from e3nn.util.jit import script
        from mltorch.importers.e3nn_paths import contract_small_first
        torch.manual_seed(5)
        torch.set_default_dtype(torch.float64)    # e3nn folds constants in the default dtype
        try:
            products = self.products()
        finally:
            torch.set_default_dtype(torch.float32)
        rewritten_total = 0
        for tp, d1, d2 in products:
            tp = tp.double()
            mine = copy.deepcopy(tp)
            n = contract_small_first(mine)
            rewritten_total += n
            code = mine._compiled_main_left_right.code
            if n:
                self.assertLess(code.count("tensordot"), tp._compiled_main_left_right.code.count("tensordot"))
            x1 = torch.randn(7, d1, dtype=torch.float64, requires_grad=True)
            x2 = torch.randn(7, d2, dtype=torch.float64, requires_grad=True)
            w = torch.randn(7 if not tp.shared_weights else 1, tp.weight_numel, dtype=torch.float64,
                            requires_grad=True) if not tp.internal_weights else None
            for a, b in ((tp, mine), (script(tp), script(mine))):
                args = (x1, x2) if w is None else (x1, x2, w)
                want, got = a(*args), b(*args)
                self.assertLess(float((want - got).abs().max()), 1e-13 * float(want.abs().max()))
                gw = torch.autograd.grad((want ** 2).sum(), [t for t in args])
                gg = torch.autograd.grad((got ** 2).sum(), [t for t in args])
                for u, v in zip(gw, gg):
                    self.assertLess(float((u - v).abs().max()), 1e-12 * float(u.abs().max()))
        # the convolution has paths with l1, l2 > 0 (16 of them here): all reordered
        self.assertGreaterEqual(rewritten_total, 16)


class GatherSources(unittest.TestCase):
    """mltorch.compiled.realize_gather_sources: row gathers of node tensors read a
    contiguous buffer in the compiled code; values are unchanged."""

    @staticmethod
    def f(h, idx, cols):
        # a node tensor in the component-major layout of e3nn's linear-layer
        # gradients ([N, i, u] read as [N, u, i]), scaled, then read onto edges
        n = h.shape[0]
        t = h.view(n, 3, 5).transpose(1, 2).reshape(n, 15) / 3.0
        rows = idx.unsqueeze(1).expand(-1, 15)
        return (torch.gather(t, 0, rows), torch.index_select(t, 0, idx), t[idx],
                torch.gather(t, 1, cols),            # along the row: not a node read
                torch.sigmoid(t[:, 0])[idx])         # a 1-D source: nothing to lay out

    def test_constrains_row_gathers_only_and_keeps_values(self):
        from torch.fx.experimental.proxy_tensor import make_fx
        from mltorch.compiled import realize_gather_sources
        torch.manual_seed(3)
        h = torch.randn(6, 15, dtype=torch.float64)
        idx = torch.randint(0, 6, (40,))
        cols = torch.randint(0, 15, (6, 4))
        gm = make_fx(self.f, tracing_mode="symbolic")(h, idx, cols)
        self.assertEqual(realize_gather_sources(gm), 3)
        forced = [n for n in gm.graph.nodes
                  if n.op == "call_function" and "inductor_force_stride_order" in str(n.target)]
        self.assertEqual(len(forced), 3)
        for n in forced:
            self.assertEqual(list(n.args[1]), [15, 1])    # contiguous rows of the [N, 15] source
            self.assertEqual(n.args[0].meta["val"].shape[1], 15)
        want = self.f(h, idx, cols)
        torch._dynamo.reset()
        got = torch.compile(gm, dynamic=True)(h, idx, cols)
        for a, b in zip(want, got):
            self.assertEqual(a.shape, b.shape)
            self.assertLessEqual(float((a - b).abs().max()), 1e-15 * float(a.abs().max()))
        # the constraint is layout only: the traced graph itself gives the same
        for a, b in zip(want, gm(h, idx, cols)):
            self.assertTrue(torch.equal(a, b))


class SmallProducts(unittest.TestCase):
    """mltorch.compiled.unroll_small_bmm: batched products with an inner dimension of
    at most 8 become sums of products (values and gradients kept); larger ones stay."""

    @staticmethod
    def f(x):
        # per-edge contractions as e3nn's reordered tensor products make them
        # (small sizes fixed by the code, the edge count free), and one with a
        # 12-wide inner dimension
        y = torch.bmm(x[:, 0:12].view(-1, 4, 3), x[:, 12:27].view(-1, 3, 5))    # inner 3
        z = torch.bmm(y.transpose(1, 2), x[:, 27:35].view(-1, 4, 2))            # inner 4
        big = x[:, 0:36].view(-1, 3, 12)
        return y, z, torch.bmm(big, big.transpose(1, 2))                       # inner 12

    def test_small_inner_dimensions_only(self):
        from torch.fx.experimental.proxy_tensor import make_fx
        from mltorch.compiled import unroll_small_bmm
        torch.manual_seed(4)
        x = torch.randn(9, 40, dtype=torch.float64)

        def value_and_grad(x):    # forward and backward in one graph, as mltorch-compile traces
            with torch.enable_grad():
                v = x.detach().requires_grad_(True)
                outs = self.f(v)
                (g,) = torch.autograd.grad(sum((o ** 2).sum() for o in outs), [v])
            return (*[o.detach() for o in outs], g)

        gm = make_fx(value_and_grad, tracing_mode="symbolic")(x)
        products = lambda: [m for m in gm.graph.nodes if m.target is torch.ops.aten.bmm.default]
        inner = lambda m: m.args[0].meta["val"].shape[2]
        before = products()
        self.assertEqual(sorted(inner(m) for m in before if inner(m) > 8), [12])
        n = unroll_small_bmm(gm)
        self.assertEqual(n, len(before) - 1)
        self.assertGreaterEqual(n, 6)    # the forward's two, the backward's of y and z and big
        self.assertEqual([inner(m) for m in products()], [12])
        want, got = value_and_grad(x), gm(x)
        for u, v in zip(want, got):
            self.assertEqual(u.shape, v.shape)
            self.assertLess(float((u - v).abs().max()), 1e-13 * float(u.abs().max()))


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
