"""Tests of the Python tooling (python/mltorch), the compiler
(`mltorch-compile`): packages against their TorchScript model, data-
dependent models, and the graph passes (e3nn contraction order, gather
sources, small products).

Run: python unittest/test_python_compiler.py -v   (ctest PythonTooling)
"""

import os
import subprocess
import tempfile
import unittest
import warnings

import torch
from torch import Tensor, nn

from python_common import Good, finetune_script, pair_energy, root  # sets the path to mltorch

warnings.filterwarnings("ignore", category=FutureWarning)

from mltorch.compiled import compile_model, read_package, rebuild  # noqa: E402
from mltorch.export import ExportError, export, read_metadata  # noqa: E402


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
        # a class of the script being run (a notebook's or a training script's)
        script_class = type("Good", (Good,), {"__module__": "__main__"})
        with self.assertRaises(ExportError) as ctx:
            export(script_class(), os.path.join(self.tmp, "m.pt"), cutoff=3.0, elements=["Si"],
                   units="metal", architecture={})
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

    def test_info_lists_parameter_names(self):
        """mltorch-info --parameters (doc/models.md, doc/fix_torch_finetune.rst's train/freeze)"""
        model = os.path.join(root, "potentials", "si_local.pt")
        out = subprocess.run([os.path.join(root, ".venv", "bin", "mltorch-info"), "--parameters", model],
                             capture_output=True, text=True)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("parameters (name, shape):", out.stdout)
        names = [n for n, _ in torch.jit.load(model).named_parameters()]
        self.assertGreater(len(names), 0)
        for n in names:
            self.assertIn(n, out.stdout)

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


if __name__ == "__main__":
    unittest.main()
