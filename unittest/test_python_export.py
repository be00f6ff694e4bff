"""Tests of the Python tooling (python/mltorch), the exporter: what
`mltorch.export` accepts and refuses, model files as data (the allow-list
of classes a file may name), the reference graph builder.

Run: python unittest/test_python_export.py -v   (ctest PythonTooling runs
every unittest/test_python_*.py)
"""

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
import warnings

import torch

from python_common import Detached, Good, NotInvariant, Scalar, here, root  # sets the path to mltorch

warnings.filterwarnings("ignore", category=FutureWarning)

from mltorch.compiled import rebuild  # noqa: E402
from mltorch.export import METADATA_NAME, ExportError, export, read_metadata  # noqa: E402
from mltorch.graph import build_graph, evaluate  # noqa: E402
from mltorch.models import LocalMBNet, MPNet  # noqa: E402


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
                             text=True, cwd=os.path.join(root, "python"))
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("model_type               test-model", out.stdout)
        self.assertIn("cutoff                   3.0", out.stdout)
        bad = subprocess.run([sys.executable, "-m", "mltorch.info",
                              os.path.join(here, "models", "no_metadata.pt")],
                             capture_output=True, text=True, cwd=os.path.join(root, "python"))
        self.assertEqual(bad.returncode, 1)
        self.assertIn("no ML-TORCH metadata", bad.stderr)


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


if __name__ == "__main__":
    unittest.main()
