"""SevenNet models (the `sevenn` package) as ML-TORCH models.

`SevenNetModel` wraps SevenNet's own modules (it re-implements none of its
layers) behind ML-TORCH's model contract, in the layered form: the stages run
one interaction block each, so that `pair_style torch` exchanges the node
features between blocks and needs one cutoff of ghost atoms instead of five.

SevenNet's data flow (sevenn/model_build.py): an edge embedding (radial basis
x cutoff, spherical harmonics of r_ij), a one-hot species embedding and a
linear map to the first node features, then per interaction block
self_connection_intro, self_interaction_1, convolution (messages from the
neighbour, edge_index[1], gathered on the centre, edge_index[0]: ML-TORCH's
convention), self_interaction_2, self_connection_outro and equivariant_gate,
then a readout to per-atom energies and a per-species scale and shift.
Only the convolution looks at other atoms, and the first block's input is a
function of the species alone, so the embed stage runs the first block too
and a model of B blocks has B - 1 exchanges.

A multi-fidelity checkpoint (7net-mf-0) inserts after the species one-hot
a one-hot of the modality (`one_hot_modality`: the scalar `modal_type` ->
`modal_attr`), which its modal linear layers (self_interaction_1/2 of every
block, reduce_input_to_hidden of the readout, onehot_to_feature_x where
use_modal_node_embedding) append to their input features, and a
per-modality shift (ModalWiseRescale, indexed by `modal_type`). The file is
one head: the wrapper makes `modal_type` and `modal_attr` of the chosen
modality with the species of every stage (`_nodes`), so that each stage
sees them, as SevenNet's one-hot would give them.

What the wrapper changes, each checked against SevenNet's own model
(`reference()`):
- the one-hot embedding is made in the model's dtype (SevenNet's
  OnehotEmbedding hard-codes float32);
- in float64 the Clebsch-Gordan (w3j) buffers are recomputed by e3nn in
  float64 with the checkpoint's sign (the checkpoint stores them in float32,
  some with the opposite sign to e3nn 0.6's): float32 models keep the
  checkpoint's values bitwise;
- the model is built with float64 as torch's default dtype, because e3nn
  folds constants into the scripted code in the dtype current at scripting
  time;
- the convolutions contract the spherical harmonics with the Clebsch-Gordan
  tensor before the neighbour features (e3nn_paths.contract_small_first: the
  same sums in a cheaper order, 1.15x-1.3x faster here).
"""

import os

import torch
from torch import Tensor, nn

from .common import ImportFailed, default_dtype, quiet, sha256  # noqa: F401 (re-exported)
from .e3nn_paths import contract_small_first

PRETRAINED = {
    "7net-0": "SevenNet_0__11Jul2024/checkpoint_sevennet_0.pth",
    "7net-0_11Jul2024": "SevenNet_0__11Jul2024/checkpoint_sevennet_0.pth",
    "7net-0_22May2024": "SevenNet_0__22May2024/checkpoint_sevennet_0.pth",
    "7net-l3i5": "SevenNet_l3i5/checkpoint_l3i5.pth",
    "7net-mf-0": "SevenNet_MF_0/checkpoint_sevennet_mf_0.pth",
}
BLOCK = ("self_connection_intro", "self_interaction_1", "convolution", "self_interaction_2",
         "self_connection_outro", "equivariant_gate")
SKIPPED = ("reduce_total_enegy", "force_output")   # SevenNet's own sum and autograd


def checkpoint_path(name):
    """A shipped model name (PRETRAINED) or a checkpoint file -> its absolute path."""
    if name in PRETRAINED:
        import sevenn
        return os.path.join(os.path.dirname(sevenn.__file__), "pretrained_potentials",
                            PRETRAINED[name])
    if os.path.isfile(name):
        return os.path.abspath(name)
    raise ImportFailed(f"{name!r} is neither a shipped SevenNet model ({', '.join(PRETRAINED)}) "
                       "nor a checkpoint file")


def _fix_w3j(model, dtype):
    """Recompute every stored Clebsch-Gordan buffer in `dtype`, keeping the checkpoint's sign."""
    from e3nn import o3
    for name, buf in list(model.named_buffers()):
        leaf = name.rsplit(".", 1)[-1]
        if not leaf.startswith("_w3j_"):
            continue
        l1, l2, l3 = (int(x) for x in leaf[len("_w3j_"):].split("_"))
        exact = o3.wigner_3j(l1, l2, l3, dtype=torch.float64)
        sign = torch.sign((exact * buf.double()).sum())
        err = float((sign * exact - buf.double()).abs().max())
        if sign == 0 or err > 1e-6:
            raise ImportFailed(f"the checkpoint's Clebsch-Gordan buffer {name} is not +-e3nn's "
                               f"wigner_3j({l1},{l2},{l3}) (differs by {err:.3g}): unknown e3nn "
                               "convention")
        buf.copy_((sign * exact).to(dtype))


class _OnehotInDtype(nn.Module):
    """SevenNet's OnehotEmbedding, its float32 outputs cast to the model's dtype."""

    def __init__(self, onehot, dtype):
        super().__init__()
        self.onehot = onehot
        self.dtype = dtype
        self.keys = [k for k in (onehot.key_output, onehot.key_additional_output) if k]

    def forward(self, data):
        data = self.onehot(data)
        for key in self.keys:
            data[key] = data[key].to(self.dtype)
        return data


def load_sevenn(checkpoint, dtype, modality=None):
    """SevenNet's own model (AtomGraphSequential) from `checkpoint` in `dtype`,
    with its config; `modality` selects a fidelity head of a multi-fidelity model."""
    from sevenn.util import load_checkpoint
    with quiet():
        cp = load_checkpoint(checkpoint_path(checkpoint))
        model = cp.build_model()      # float32, the checkpoint's parameters (patched by SevenNet)
        if dtype != torch.float32:
            from sevenn.model_build import build_E3_equivariant_model
            state = model.state_dict()
            with default_dtype(dtype):
                model = build_E3_equivariant_model(cp.config)
            model.load_state_dict(state, strict=True)
    modal_map = getattr(model, "modal_map", None)
    if modality is not None:
        if not modal_map:
            raise ImportFailed(f"--modality {modality}: {checkpoint} is a single-fidelity model "
                               "(it has no modality heads)")
        if modality not in modal_map:
            raise ImportFailed(f"--modality {modality}: {checkpoint} has the modalities "
                               f"{', '.join(modal_map)}")
    elif modal_map:
        raise ImportFailed(f"{checkpoint} is a multi-fidelity model: choose a head with "
                           f"--modality ({', '.join(modal_map)})")
    model = model.to(dtype)
    if dtype == torch.float64:
        _fix_w3j(model, dtype)
        model._modules["onehot_idx_to_onehot"] = _OnehotInDtype(
            model._modules["onehot_idx_to_onehot"], dtype)
    model.set_is_batch_data(False)
    return model.eval(), cp.config


def _message_gather(node_features: Tensor, edge_dst: Tensor, message: Tensor) -> Tensor:
    """sevenn.nn.convolution.message_gather with the node count from .size(0)."""
    from sevenn.nn.util import broadcast
    index = broadcast(edge_dst, message, 0)
    out = torch.zeros([node_features.size(0)] + list(message.shape[1:]), dtype=node_features.dtype,
                      device=node_features.device)
    return out.scatter_reduce_(0, index, message, reduce="sum")


def _patch_modal_to_data(self, data: dict[str, Tensor]) -> dict[str, Tensor]:
    """sevenn.nn.linear.IrrepsLinear._patch_modal_to_data (not batched, as the
    wrapper runs it) with the node count from .size(0)."""
    x = data[self.key_input]
    modality_onehot = data[self.key_modal_attr].expand(x.size(0), -1).type(x.dtype)
    data[self.key_input] = torch.cat([x, modality_onehot], dim=1)
    return data


class SevenNetModel(nn.Module):
    """A SevenNet checkpoint behind the ML-TORCH model contract (layered).

    checkpoint: a shipped model name (PRETRAINED) or a checkpoint path;
    elements: the elements this file maps (the LAMMPS pair_coeff names), by
    default every element the checkpoint knows, in its own order; dtype:
    "float32" (SevenNet's training precision) or "float64"; modality: the
    fidelity head of a multi-fidelity model."""

    # the argument naming the checkpoint it unpickles (SevenNet's own loader,
    # torch.load with weights_only=False); mltorch.compiled.rebuild says so,
    # except for the shipped names, files of the installed sevenn package
    SOURCE_ARGUMENT = "checkpoint"
    INSTALLED_SOURCES = tuple(PRETRAINED)

    def __init__(self, checkpoint="7net-0", elements=None, dtype="float32", modality=None):
        super().__init__()
        from ase.data import atomic_numbers, chemical_symbols
        tdtype = {"float32": torch.float32, "float64": torch.float64}[dtype]
        sevenn_model, config = load_sevenn(checkpoint, tdtype, modality)
        type_map = config["_type_map"]            # atomic number -> SevenNet type index
        known = [chemical_symbols[z] for z in sorted(type_map, key=type_map.get)]
        if elements is None:
            elements = known
        unknown = [e for e in elements if atomic_numbers.get(e) not in type_map]
        if unknown:
            raise ImportFailed(f"{checkpoint} does not know the element(s) {', '.join(unknown)}")
        self.elements = list(elements)
        self.cutoff = float(config["cutoff"])
        self.num_types = len(type_map)
        self.register_buffer("type_index", torch.tensor(
            [type_map[atomic_numbers[e]] for e in elements], dtype=torch.int64))
        mods = dict(sevenn_model._modules)
        modal_map = getattr(sevenn_model, "modal_map", None)
        self.modal_index = int(modal_map[modality]) if modality is not None else -1
        names = list(mods)
        first = next(i for i, n in enumerate(names) if n[0].isdigit())
        last = max(i for i, n in enumerate(names) if n[0].isdigit())
        if names[0] != "edge_embedding" or "onehot_idx_to_onehot" not in names[:first]:
            raise ImportFailed(f"{checkpoint}: unsupported SevenNet layout {names[:first]}")
        self.edge_embedding = mods["edge_embedding"]
        # the modality one-hot of a multi-fidelity model: made by _nodes for every stage
        self.num_modalities = 0
        if "one_hot_modality" in names[:first]:
            onehot = mods["one_hot_modality"]
            onehot = getattr(onehot, "onehot", onehot)      # under _OnehotInDtype
            if (onehot.key_x, onehot.key_output) != ("modal_type", "modal_attr"):
                raise ImportFailed(f"{checkpoint}: unsupported SevenNet modality embedding "
                                   f"({onehot.key_x} -> {onehot.key_output})")
            self.num_modalities = int(onehot.num_classes)
            if not 0 <= self.modal_index < self.num_modalities:
                raise ImportFailed(f"{checkpoint}: modality {modality} has index "
                                   f"{self.modal_index}, not below {self.num_modalities}")
        elif modality is not None:
            raise ImportFailed(f"{checkpoint}: a modal_map but no modality one-hot "
                               "(one_hot_modality): unsupported SevenNet layout")
        # node-wise modules between the one-hot embeddings and the first block
        # (the linear map to features)
        self.pre = nn.ModuleList([mods[n] for n in names[1:first]
                                  if n not in ("onehot_idx_to_onehot", "one_hot_modality")])
        n_blocks = (last - first + 1) // len(BLOCK)
        blocks = []
        for b in range(n_blocks):
            want = [f"{b}_{part}" for part in BLOCK]
            got = names[first + b * len(BLOCK): first + (b + 1) * len(BLOCK)]
            if got != want:
                raise ImportFailed(f"{checkpoint}: unsupported SevenNet block layout {got}")
            blocks.append(nn.ModuleList([mods[n] for n in want]))
        self.blocks = nn.ModuleList(blocks)
        post = names[last + 1:]
        if post[-len(SKIPPED):] != list(SKIPPED):
            raise ImportFailed(f"{checkpoint}: unsupported SevenNet readout {post}")
        self.post = nn.ModuleList([mods[n] for n in post[:-len(SKIPPED)]])
        self.num_blocks = n_blocks
        self.feature_dims = [int(b[2]._comm_size) for b in blocks]
        # the convolutions' Clebsch-Gordan contractions in a cheaper order (e3nn_paths)
        contract_small_first(self)

    def script_blocks(self):
        """Compile every SevenNet module as SevenNet's own deployment does (e3nn's
        scripting, which traces the modules e3nn marks for tracing), so that
        torch.jit.script of this wrapper succeeds."""
        from e3nn.util.jit import script
        dtype = next(p.dtype for p in self.parameters() if p.is_floating_point())
        with quiet(), default_dtype(dtype):
            self.edge_embedding = script(self.edge_embedding)
            self.pre = nn.ModuleList([script(m) for m in self.pre])
            self.blocks = nn.ModuleList([nn.ModuleList([script(m) for m in b]) for b in self.blocks])
            self.post = nn.ModuleList([script(m) for m in self.post])
        return self

    def prepare_export(self):
        """For mltorch-compile: SevenNet's message_gather sizes its output with
        len(node_features), and its modal linear layers (multi-fidelity) expand
        the modality one-hot with len(features), which torch.export cannot keep
        symbolic; the same code with .size(0) is put in their place in
        sevenn.nn.convolution and sevenn.nn.linear.IrrepsLinear (the only
        changes, numerically identical; checked by mltorch-compile against
        the TorchScript file)."""
        import sevenn.nn.convolution as conv
        from sevenn.nn.linear import IrrepsLinear
        conv.message_gather = _message_gather
        IrrepsLinear._patch_modal_to_data = _patch_modal_to_data

    # --- the pieces ----------------------------------------------------------

    def _nodes(self, species: Tensor, dtype: torch.dtype) -> dict[str, Tensor]:
        types = self.type_index[species]
        onehot = torch.nn.functional.one_hot(types, self.num_types).to(dtype)
        data: dict[str, Tensor] = {"x": onehot, "node_attr": onehot, "atom_type": types}
        if self.modal_index >= 0:
            # SevenNet's one_hot_modality on the scalar modal_type (not batched)
            modal = torch.tensor(self.modal_index, dtype=torch.int64, device=species.device)
            data["modal_type"] = modal
            data["modal_attr"] = torch.nn.functional.one_hot(modal, self.num_modalities).to(dtype)
        return data

    def _edges(self, data: dict[str, Tensor], edge_vectors: Tensor,
               edge_index: Tensor) -> dict[str, Tensor]:
        data["edge_vec"] = edge_vectors
        data["edge_index"] = edge_index
        return self.edge_embedding(data)

    def _pre(self, data: dict[str, Tensor]) -> dict[str, Tensor]:
        for m in self.pre:
            data = m(data)
        return data

    def _block(self, b: int, data: dict[str, Tensor], n_out: int) -> dict[str, Tensor]:
        """Interaction block b on every node's features; the result for nodes [0, n_out)."""
        for i, block in enumerate(self.blocks):
            if i == b:
                x = data["x"]
                attr = data["node_attr"]
                # the self-connection of the nodes whose output counts
                sc = block[0]({"x": x[:n_out], "node_attr": attr[:n_out]})["self_cont_tmp"]
                data = block[1](data)
                data = block[2](data)
                out: dict[str, Tensor] = {}
                for key, value in data.items():
                    if key in ("x", "node_attr", "atom_type"):
                        out[key] = value[:n_out]
                    else:
                        out[key] = value
                out["self_cont_tmp"] = sc
                out = block[3](out)
                out = block[4](out)
                data = block[5](out)
        return data

    def _readout(self, data: dict[str, Tensor]) -> Tensor:
        for m in self.post:
            data = m(data)
        return data["atomic_energy"].squeeze(-1)

    # --- the model contract --------------------------------------------------

    def forward(self, edge_vectors: Tensor, edge_index: Tensor, species: Tensor,
                n_local: int) -> Tensor:
        n_nodes = species.size(0)
        data = self._edges(self._nodes(species, edge_vectors.dtype), edge_vectors, edge_index)
        data = self._pre(data)
        for b in range(self.num_blocks):
            data = self._block(b, data, n_nodes)
        return self._readout(data)

    @torch.jit.export
    def stage_embed(self, edge_vectors: Tensor, edge_index: Tensor, species: Tensor,
                    n_local: int) -> Tensor:
        data = self._edges(self._nodes(species, edge_vectors.dtype), edge_vectors, edge_index)
        return self._block(0, self._pre(data), n_local)["x"]

    @torch.jit.export
    def stage_interaction(self, k: int, h: Tensor, edge_vectors: Tensor, edge_index: Tensor,
                          species: Tensor, n_local: int) -> Tensor:
        data = self._edges(self._nodes(species, h.dtype), edge_vectors, edge_index)
        data["x"] = h
        return self._block(k + 1, data, n_local)["x"]

    @torch.jit.export
    def stage_readout(self, h: Tensor, species: Tensor, n_local: int) -> Tensor:
        data = self._nodes(species[:n_local], h.dtype)
        data["x"] = h
        return self._readout(data)


def reference(atoms, checkpoint="7net-0", dtype="float64", modality=None):
    """SevenNet's own energy, forces, stress (eV/A^3, ASE's sign and Voigt order)
    and per-atom energies for ASE `atoms`, by SevenNet's own graph and model in
    `dtype` (float32 is exactly what SevenNetCalculator computes; `modality`
    as SevenNetCalculator's `modal`)."""
    return references([atoms], checkpoint, dtype, modality)[0]


def references(atoms_list, checkpoint="7net-0", dtype="float64", modality=None):
    """reference() of each ASE Atoms of `atoms_list`, the model loaded once."""
    import numpy as np
    from sevenn.atom_graph_data import AtomGraphData
    from sevenn.train.dataload import unlabeled_atoms_to_graph
    tdtype = {"float32": torch.float32, "float64": torch.float64}[dtype]
    model, config = load_sevenn(checkpoint, tdtype, modality)
    results = []
    for atoms in atoms_list:
        graph = unlabeled_atoms_to_graph(atoms, float(config["cutoff"]), with_shift=False)
        exact = {k: v for k, v in graph.items()
                 if isinstance(v, np.ndarray) and v.dtype == np.float64}
        # SevenNet's from_numpy_dict makes every float array float32: put back the
        # float64 values (positions, edge vectors, volume) for a float64 model
        data = AtomGraphData.from_numpy_dict(graph)
        for key, value in exact.items():
            data[key] = torch.from_numpy(value.copy()).to(tdtype)
        if modality is not None:
            # what SevenNetCalculator(modal=...) does: the model maps the name
            data["data_modality"] = modality
            model.eval_modal_map = True
        out = model(data)
        # SevenNet's stress: xx yy zz xy yz zx
        xx, yy, zz, xy, yz, zx = out["inferred_stress"].detach().double().numpy().reshape(-1)
        results.append({"energy": float(out["inferred_total_energy"].detach()),
                        "forces": out["inferred_force"].detach().double().numpy(),
                        # ASE: -virial/V, Voigt order
                        "stress": -np.array([xx, yy, zz, yz, zx, xy]),
                        "energies": out["atomic_energy"].detach().double().numpy().reshape(-1)})
    return results


def imported(args):
    """mltorch-import sevenn: the wrapper of args.source and what the file records
    (mltorch.importers.routine writes it)."""
    import sevenn
    from .common import Imported
    path = checkpoint_path(args.source)     # absolute
    # a shipped name stays a name (a file of the installed sevenn package);
    # a checkpoint file is recorded by its absolute path, as typed paths are
    # relative to a directory mltorch-compile need not run in
    source = args.source if args.source in PRETRAINED else path
    model = SevenNetModel(source, elements=args.elements, dtype=args.dtype, modality=args.modality)
    return Imported(
        model=model, units="metal", dtype=args.dtype, num_interaction_layers=model.num_blocks,
        model_type="sevenn",
        imported={"framework": "sevenn", "framework_version": sevenn.__version__, "model": source,
                  "checkpoint_sha256": sha256(path), "modality": args.modality},
        architecture={"checkpoint": source, "elements": model.elements, "dtype": args.dtype,
                      "modality": args.modality},
        references=lambda atoms: references(atoms, source, args.dtype, args.modality))
