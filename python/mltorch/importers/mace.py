"""MACE models (the `mace-torch` package, 0.3.x) as ML-TORCH models.

`MACEModel` wraps MACE's own modules (it re-implements none of its layers)
behind ML-TORCH's model contract, in the layered form: each stage runs one
interaction, its product basis and its readout, so that `pair_style torch`
exchanges the node features between layers and needs one cutoff of ghost
atoms instead of one per layer.

MACE's data flow (mace.modules.models.ScaleShiftMACE.forward): a linear node
embedding of the one-hot species, spherical harmonics and a radial basis of
the edges, then per layer an interaction (messages from senders gathered on
receivers, a residual self-connection), a product basis and a readout to
per-atom energies; the energy of atom i is E0[z_i] + scale * sum_k
readout_k(i) + shift.

Conventions, each checked against MACE's own calculator (`reference()`):
- MACE's edge_index[0] is the sender and edge_index[1] the receiver, and its
  edge vectors point from sender to receiver; ML-TORCH's row 0 is the centre
  (the receiver) and r_ij = x_j - x_i. The wrapper flips the index and negates
  the vectors (the sign matters: harmonics of odd l are odd).
- MACE sums the readouts of every layer, so the features exchanged between
  stages carry the running per-atom energy as one extra column.
- float32 and float64 are MACE's own conversions (model.float() /
  model.double(), as MACECalculator does).
- a pair repulsion (`pair_repulsion=True`: MACE's ZBLBasis, in MP-0b3,
  MPA-0, OMAT-0) is MACE's own module on the edges of the first stage: half
  of each edge's screened Coulomb energy (its polynomial envelope ends at
  the sum of the two atoms' covalent radii) goes to the receiver, the centre;
  MACE sums it with the readouts before the scale and shift, and so does the
  wrapper, in the running energy column.

MACE pins e3nn 0.4.4, which SevenNet's e3nn 0.6 excludes: tools/setup.sh
installs it in a second environment, .venv-mace, that shares the project's
torch, and `mltorch-import mace` runs there (mltorch.importers.main).
"""

import os

import torch
from torch import Tensor, nn

from .common import ImportFailed, default_dtype, quiet, sha256  # noqa: F401 (re-exported)
from typing import List, Optional


# the modules of the MACE and ScaleShiftMACE models this wrapper runs
LAYOUT = ("node_embedding", "radial_embedding", "spherical_harmonics", "atomic_energies_fn",
          "interactions", "products", "readouts", "scale_shift", "pair_repulsion_fn")


def load_mace(path, dtype):
    """MACE's own model object from a `*.model` file (as written by
    mace_run_train), in `dtype` ("float32" or "float64") the way
    MACECalculator converts it."""
    if not os.path.isfile(path):
        raise ImportFailed(f"{path}: no such MACE model file")
    with quiet():
        try:
            # a pickled module (as MACECalculator loads it): weights_only=True cannot
            # load it, so the file runs whatever code it holds; `path` is the one the
            # user named, or the source that mltorch.compiled.rebuild names in its note
            model = torch.load(path, weights_only=False, map_location="cpu")
        except Exception as e:
            raise ImportFailed(f"{path} is not a MACE model file that mace-torch can load: {e}")
    if isinstance(model, torch.jit.ScriptModule) or not hasattr(model, "interactions"):
        raise ImportFailed(f"{path}: give the model file mace_run_train writes (NAME.model), "
                           "not its compiled TorchScript (NAME_compiled.model) or a checkpoint")
    model = model.double() if dtype == "float64" else model.float()
    return model.eval()


class MACEModel(nn.Module):
    """A MACE model behind the ML-TORCH model contract (layered).

    path: a `*.model` file of mace_run_train; elements: the elements this file
    maps (the LAMMPS pair_coeff names), by default every element of the
    model in its own order; dtype: "float32" or "float64"; head: the head of
    a multi-head model (by name or index; default its first)."""

    # the argument naming the file it unpickles (torch.load, weights_only=False:
    # a MACE model file is a pickled module); mltorch.compiled.rebuild says so
    SOURCE_ARGUMENT = "path"

    def __init__(self, path, elements=None, dtype="float64", head=None):
        super().__init__()
        from ase.data import atomic_numbers, chemical_symbols
        m = load_mace(path, dtype)
        extra = [name for name in m._modules if name not in LAYOUT]
        if extra:
            raise ImportFailed(f"{path}: MACE models with {', '.join(extra)} are not supported "
                               f"(supported: the modules {', '.join(LAYOUT)})")
        z_list = [int(z) for z in m.atomic_numbers.tolist()]
        known = [chemical_symbols[z] for z in z_list]
        self.elements = list(elements) if elements is not None else known
        unknown = [e for e in self.elements if atomic_numbers.get(e) not in z_list]
        if unknown:
            raise ImportFailed(f"{path} does not know the element(s) {', '.join(unknown)} "
                               f"(it knows {' '.join(known)})")
        heads = list(getattr(m, "heads", None) or ["Default"])
        if head is None:
            self.head = 0
        elif str(head) in heads:
            self.head = heads.index(str(head))
        else:
            raise ImportFailed(f"--head {head}: {path} has the heads {', '.join(heads)}")
        self.head_name = heads[self.head]
        self.register_buffer("mace_index", torch.tensor(
            [z_list.index(atomic_numbers[e]) for e in self.elements], dtype=torch.int64))
        self.register_buffer("atomic_numbers", m.atomic_numbers.clone())
        self.num_elements = len(z_list)
        self.cutoff = float(m.r_max)
        # MACE's own modules
        self.node_embedding = m.node_embedding
        self.spherical_harmonics = m.spherical_harmonics
        self.radial_embedding = m.radial_embedding
        self.atomic_energies_fn = m.atomic_energies_fn
        self.interactions = m.interactions
        self.products = m.products
        self.readouts = m.readouts
        # the ZBL pair repulsion: MACE's forward runs it where the model has the
        # flag `pair_repulsion` (set with the module by pair_repulsion=True)
        self.has_pair_repulsion = hasattr(m, "pair_repulsion_fn")
        if self.has_pair_repulsion != hasattr(m, "pair_repulsion"):
            raise ImportFailed(f"{path}: pair_repulsion_fn without the pair_repulsion flag "
                               "(or the flag without the module): not a model MACE builds")
        if self.has_pair_repulsion:
            self.pair_repulsion_fn = m.pair_repulsion_fn
        if getattr(m, "scale_shift", None) is not None:
            self.scale_shift = m.scale_shift
        else:    # plain MACE: no scale and shift
            from mace.modules.blocks import ScaleShiftBlock
            self.scale_shift = ScaleShiftBlock(scale=1.0, shift=0.0).to(
                torch.float64 if dtype == "float64" else torch.float32)
        self.num_layers = len(m.interactions)
        if len(m.readouts) != self.num_layers:
            raise ImportFailed(f"{path}: {len(m.readouts)} readouts for {self.num_layers} "
                               "interactions (one readout per layer expected)")
        # exchanged between stages: the product output and the running energy
        self.feature_dims = [int(p.linear.irreps_out.dim) + 1 for p in m.products]

    def script_blocks(self):
        """Compile MACE's and e3nn's modules by their declared compile modes (as
        MACE's own deployment does), in the model's dtype, so that
        torch.jit.script of this wrapper succeeds."""
        from e3nn.util import jit
        with quiet(), default_dtype(self._param_dtype()):
            jit.compile(self)
        return self

    def _param_dtype(self):
        return next(p.dtype for p in self.parameters() if p.is_floating_point())

    def prepare_export(self):
        """For mltorch-compile: e3nn 0.4.4 (MACE's) runs TorchScript where
        torch.export's symbolic tracing needs Python, and TorchScript code makes
        the tracer fix the edge and node counts to those of the example graph.
        Two places, both given back as the Python they were scripted from:
        - the code e3nn generates for its Linear and TensorProduct modules
          (`_compiled_main`, `_compiled_main_left_right`): the model file holds
          it as TorchScript only, so it is generated again by e3nn's own
          codegen from the module's irreps and instructions (what e3nn does
          with jit_script_fx off), in the model's dtype, and takes the
          scripted module's buffers (the Wigner 3j tensors), so their names
          and values are the file's;
        - e3nn.o3's `_spherical_harmonics`, a scripted function, is replaced in
          its module by the Python function it was scripted from.
        The same operations on the same numbers (mace_sic in float64: the
        compiled package and its stages equal the TorchScript file to 1e-15
        relative; mltorch-compile itself checks them against this module)."""
        from e3nn import o3
        import e3nn.o3._spherical_harmonics as sh
        from e3nn.o3._linear import _codegen_linear
        from e3nn.o3._tensor_product._codegen import codegen_tensor_product_left_right
        python_sh = getattr(sh._spherical_harmonics, "_torchdynamo_inline", None)
        if python_sh is not None:
            sh._spherical_harmonics = python_sh
        with default_dtype(self._param_dtype()):
            for name, mod in list(self.named_modules()):
                if isinstance(mod, o3.Linear) and isinstance(getattr(mod, "_compiled_main", None),
                                                             torch.jit.ScriptModule):
                    w = mod.weight
                    f_in, f_out = (int(w.shape[0]), int(w.shape[1])) if w.dim() == 3 else (None, None)
                    graphmod, _, _ = _codegen_linear(mod.irreps_in, mod.irreps_out, mod.instructions,
                                                     f_in, f_out, shared_weights=mod.shared_weights,
                                                     optimize_einsums=mod._optimize_einsums)
                    _swap_codegen(mod, f"{name}._compiled_main", "_compiled_main", graphmod)
                elif isinstance(mod, o3.TensorProduct) and isinstance(
                        getattr(mod, "_compiled_main_left_right", None), torch.jit.ScriptModule):
                    graphmod = codegen_tensor_product_left_right(
                        mod.irreps_in1, mod.irreps_in2, mod.irreps_out, mod.instructions,
                        mod.shared_weights, mod._specialized_code, mod._optimize_einsums)
                    _swap_codegen(mod, f"{name}._compiled_main_left_right",
                                  "_compiled_main_left_right", graphmod)

    # --- the pieces ----------------------------------------------------------

    def _attrs(self, species: Tensor, dtype: torch.dtype) -> Tensor:
        return torch.nn.functional.one_hot(self.mace_index[species], self.num_elements).to(dtype)

    def _heads(self, n: int, device: torch.device) -> Tensor:
        return torch.full((n,), self.head, dtype=torch.int64, device=device)

    def _edges(self, edge_vectors: Tensor, edge_index: Tensor, node_attrs: Tensor):
        vectors = -edge_vectors                     # MACE: x_receiver - x_sender
        mace_edge_index = edge_index.flip(0)        # [sender j, receiver i]
        lengths = torch.linalg.norm(vectors, dim=-1, keepdim=True)
        edge_attrs = self.spherical_harmonics(vectors)
        edge_feats, cutoff = self.radial_embedding(lengths, node_attrs, mace_edge_index,
                                                   self.atomic_numbers)
        return mace_edge_index, edge_attrs, edge_feats, cutoff, lengths

    def _pair_energy(self, lengths: Tensor, node_attrs: Tensor, mace_edge_index: Tensor,
                     n_out: int) -> Tensor:
        """MACE's pair repulsion (ZBL) of nodes [0, n_out), zero without one: half of
        every edge's energy on its receiver, as MACE's forward adds it to the readouts."""
        e = torch.zeros(n_out, dtype=lengths.dtype, device=lengths.device)
        if hasattr(self, "pair_repulsion_fn"):
            e = self.pair_repulsion_fn(lengths, node_attrs, mace_edge_index,
                                       self.atomic_numbers)[:n_out].to(lengths.dtype)
        return e

    def _finish(self, e_inter: Tensor, node_attrs: Tensor) -> Tensor:
        e_inter = self.scale_shift(e_inter, self._heads(e_inter.size(0), e_inter.device))
        return self.atomic_energies_fn(node_attrs)[:, self.head].to(e_inter.dtype) + e_inter

    def _layer(self, k: int, node_feats: Tensor, node_attrs: Tensor, edge_attrs: Tensor,
               edge_feats: Tensor, mace_edge_index: Tensor, cutoff: Optional[Tensor],
               n_out: int):
        """Interaction k on every node's features, then product k and readout k
        for nodes [0, n_out): their features and their energy of this layer."""
        h = node_feats
        for i, (interaction, product) in enumerate(zip(self.interactions, self.products)):
            if i == k:
                msg, sc = interaction(node_attrs=node_attrs, node_feats=node_feats,
                                      edge_attrs=edge_attrs, edge_feats=edge_feats,
                                      edge_index=mace_edge_index, cutoff=cutoff,
                                      first_layer=(i == 0))
                if sc is not None:
                    sc = sc[:n_out]
                h = product(node_feats=msg[:n_out], sc=sc, node_attrs=node_attrs[:n_out])
        e = torch.zeros(h.size(0), dtype=h.dtype, device=h.device)
        for i, readout in enumerate(self.readouts):
            if i == k:
                e = readout(h, self._heads(h.size(0), h.device))[:, self.head]
        return h, e

    # --- the model contract --------------------------------------------------

    def forward(self, edge_vectors: Tensor, edge_index: Tensor, species: Tensor,
                n_local: int) -> Tensor:
        n = species.size(0)
        node_attrs = self._attrs(species, edge_vectors.dtype)
        mei, ea, ef, cut, lengths = self._edges(edge_vectors, edge_index, node_attrs)
        h = self.node_embedding(node_attrs)
        e_acc = self._pair_energy(lengths, node_attrs, mei, n)
        for k in range(self.num_layers):
            h, e = self._layer(k, h, node_attrs, ea, ef, mei, cut, n)
            e_acc = e_acc + e
        return self._finish(e_acc, node_attrs)

    @torch.jit.export
    def stage_embed(self, edge_vectors: Tensor, edge_index: Tensor, species: Tensor,
                    n_local: int) -> Tensor:
        node_attrs = self._attrs(species, edge_vectors.dtype)
        mei, ea, ef, cut, lengths = self._edges(edge_vectors, edge_index, node_attrs)
        h, e = self._layer(0, self.node_embedding(node_attrs), node_attrs, ea, ef, mei, cut,
                           n_local)
        # the first stage has the edges of every owned atom: the pair repulsion goes
        # into the running energy here (MACE: summed with the readouts, then scaled)
        e = e + self._pair_energy(lengths, node_attrs, mei, n_local)
        return torch.cat([h, e.unsqueeze(-1)], dim=-1)

    @torch.jit.export
    def stage_interaction(self, k: int, h: Tensor, edge_vectors: Tensor, edge_index: Tensor,
                          species: Tensor, n_local: int) -> Tensor:
        node_attrs = self._attrs(species, h.dtype)
        mei, ea, ef, cut, _ = self._edges(edge_vectors, edge_index, node_attrs)
        h_new, e = self._layer(k + 1, h[:, :-1], node_attrs, ea, ef, mei, cut, n_local)
        return torch.cat([h_new, (h[:n_local, -1] + e).unsqueeze(-1)], dim=-1)

    @torch.jit.export
    def stage_readout(self, h: Tensor, species: Tensor, n_local: int) -> Tensor:
        return self._finish(h[:, -1], self._attrs(species[:n_local], h.dtype))


def _swap_codegen(owner, qualname, attr, graphmod):
    """Put the regenerated fx module `graphmod` in place of the TorchScript
    module owner.<attr>, with the scripted module's buffers (same names)."""
    scripted = getattr(owner, attr)
    want = dict(scripted.named_buffers())
    have = dict(graphmod.named_buffers())
    if set(want) != set(have) or any(want[k].shape != have[k].shape for k in want):
        raise ImportFailed(f"{qualname}: e3nn's regenerated code does not match the model's "
                           f"(buffers {sorted(have)} vs {sorted(want)})")
    for key, t in want.items():
        *path, leaf = key.split(".")
        mod = graphmod
        for q in path:
            mod = getattr(mod, q)
        mod._buffers[leaf] = t.detach().clone()
    setattr(owner, attr, graphmod)


def reference(atoms, path, dtype="float64", head=None):
    """MACE's own energy, forces, stress (eV/A^3, ASE's sign and Voigt order)
    and per-atom energies (E0 included) for ASE `atoms`, by MACECalculator."""
    return references([atoms], path, dtype, head)[0]


def references(atoms_list, path, dtype="float64", head=None):
    """reference() of each ASE Atoms of `atoms_list`, the calculator made once."""
    import logging
    from mace.calculators import MACECalculator
    logging.disable(logging.WARNING)
    with quiet():
        kwargs = {"head": head} if head is not None else {}
        calc = MACECalculator(model_paths=path, device="cpu", default_dtype=dtype, **kwargs)
        results = []
        for atoms in atoms_list:
            a = atoms.copy()
            a.calc = calc
            energy = a.get_potential_energy()
            results.append({"energy": float(energy), "forces": a.get_forces(),
                            "stress": a.get_stress(),
                            "energies": calc.results["energies"].copy()})
        return results


def imported(args):
    """mltorch-import mace: the wrapper of args.source and what the file records
    (mltorch.importers.routine writes it)."""
    import mace
    from .common import Imported
    model = MACEModel(args.source, elements=args.elements, dtype=args.dtype, head=args.head)
    return Imported(
        model=model, units="metal", dtype=args.dtype, num_interaction_layers=model.num_layers,
        model_type="mace",
        imported={"framework": "mace-torch", "framework_version": mace.__version__,
                  "model": os.path.basename(args.source), "checkpoint_sha256": sha256(args.source),
                  "head": model.head_name},
        architecture={"path": os.path.abspath(args.source), "elements": model.elements,
                      "dtype": args.dtype, "head": model.head_name},
        references=lambda atoms: references(atoms, args.source, args.dtype, args.head))
