"""NequIP and Allegro models (nequip 0.19, nequip-allegro 0.8) as ML-TORCH models.

`NequIPModel` wraps the framework's own modules (it re-implements none of its
layers) behind ML-TORCH's model contract. A NequIP model (message passing) is
written in the layered form, one stage per convolution layer, so that
`pair_style torch` exchanges node features between layers and needs one
cutoff of ghost atoms; Allegro is strictly local (one cutoff) and needs no
stages.

What nequip does that the wrapper relies on, each checked against nequip's
own ASE calculator (`reference()`):
- a trained model is a GraphModel whose ForceStressOutput wraps the energy
  model (a SequentialGraphNetwork); the wrapper runs the energy model's
  modules in order, without the final total-energy sum and without the
  autograd wrapper (ML-TORCH takes forces from dE/dr_ij itself);
- every edge module reads the edge vectors through one helper that takes
  data["edge_vectors"] when present, so ML-TORCH's r_ij = x_j - x_i are
  given directly; nequip's edge_index[0] is the centre, as ML-TORCH's;
- per-atom energies come out of the per-type scale and shift in float64
  (nequip keeps them there even in float32 models; those float64 tensors
  stay float64 when the model is cast, see `_apply`);
- a pair potential (ZBL) after the scale and shift is evaluated in the last
  stage that has edges and carried to the readout as one extra feature
  column (the readout stage has no edges);
- a .nequip.zip package brings its own copy of nequip's classes, so classes
  are matched by name;
- nequip keeps no units with a model: a model's energies and lengths are
  those of its training data. The one place it records them is a ZBL term,
  built with nequip's LAMMPS unit style (`ZBL(units="metal" | "real")`,
  its Coulomb constant in eV*A or kcal/mol*A): `model_units` takes the
  units from there, else from the importer's --units, else metal.
"""

import os
import pickle
import tempfile
from typing import Dict, List, Optional

import torch
from torch import Tensor, nn

from .common import ImportFailed, default_dtype, quiet, sha256  # noqa: F401 (re-exported)


# LAMMPS unit styles a nequip model can be imported in: its energies and lengths
UNITS = {"metal": "eV and Angstrom", "real": "kcal/mol and Angstrom"}
# nequip's ZBL keeps e^2/(4 pi eps0) of its `units` (halved: half the energy on
# each of ij, ji) in the buffer _qqr2exesquare (nequip.nn.pair_potential.ZBL)
ZBL_COULOMB = {"metal": 14.399645, "real": 332.06371}


def recorded_units(graph_model):
    """The units nequip recorded in `graph_model` (a GraphModel, also of a
    package): those of its ZBL term(s), from their Coulomb constant; None for
    a model without one (nequip records no units then)."""
    found = set()
    for name, mod in graph_model.named_modules():
        if type(mod).__name__ != "ZBL":
            continue
        c = getattr(mod, "_qqr2exesquare", None)
        if c is None:
            raise ImportFailed(f"nequip's ZBL term {name} has no Coulomb constant "
                               "(_qqr2exesquare): not a ZBL of nequip 0.19")
        value = 2.0 * float(c)
        units = [u for u, k in ZBL_COULOMB.items() if abs(value - k) <= 1e-6 * k]
        if not units:
            raise ImportFailed(f"nequip's ZBL term {name} has the Coulomb constant {value:.8g}, "
                               f"that of none of the unit styles {', '.join(ZBL_COULOMB)} "
                               f"({', '.join(f'{k:g}' for k in ZBL_COULOMB.values())})")
        found.add(units[0])
    if len(found) > 1:
        raise ImportFailed(f"the model's ZBL terms are in different units ({', '.join(sorted(found))})")
    return found.pop() if found else None


def model_units(graph_model, given=None):
    """The LAMMPS unit style of the imported file and where it comes from:
    the model's ZBL term (nequip's `units`), else `given` (--units), else
    "metal" (eV, Angstrom: nequip's ASE calculator's default), with a note.
    -> (units, source, note or None). A `given` other than metal or real, or
    one that contradicts the ZBL term, is refused."""
    if given is not None and given not in UNITS:
        raise ImportFailed(f"--units {given}: a nequip model is imported in LAMMPS units metal "
                           f"(its energies in eV, lengths in Angstrom) or real (kcal/mol, "
                           f"Angstrom); a model trained in other units is not supported")
    recorded = recorded_units(graph_model)
    if recorded is not None:
        if given is not None and given != recorded:
            raise ImportFailed(
                f"--units {given}: the model's ZBL term was built with units {recorded!r} "
                f"(its energies in {UNITS[recorded].replace(' and ', ', lengths in ')}), so the "
                f"model is a {recorded} model: import it with --units {recorded} or without --units")
        return recorded, f"the model's ZBL term (units {recorded!r})", None
    if given is not None:
        return given, "--units", None
    return "metal", "assumed", (
        "nequip records no units with a model that has no ZBL term: its energies and lengths "
        "are those of its training data; taken as metal (eV, Angstrom), as nequip's ASE "
        "calculator takes them. A model trained on kcal/mol and Angstrom needs --units real")


def model_dtype_of(path):
    """The dtype name a checkpoint or package was trained in."""
    return {torch.float32: "float32", torch.float64: "float64"}[load_nequip(path).model_dtype]


def load_nequip(path, dtype=None):
    """nequip's own loader (a .ckpt checkpoint, rebuilt from its config, or a
    .nequip.zip package) -> the eager GraphModel. `dtype` ("float32" or
    "float64") rebuilds a checkpoint's model in that dtype (nequip's own
    model_dtype setting, its weights converted on loading); a package keeps
    the dtype it was built in."""
    if not os.path.isfile(path):
        raise ImportFailed(f"{path}: no such nequip checkpoint or package")
    from nequip.utils.global_state import set_global_state
    from nequip.model.saved_models.load_utils import load_saved_model
    set_global_state()    # nequip builds no model before it
    with quiet():
        if dtype is None:
            model = load_saved_model(path)
        else:
            if path.endswith(".nequip.zip"):
                own = model_dtype_of(path)
                if own != dtype:
                    raise ImportFailed(f"{path} is a {own} package; --dtype {dtype} needs the "
                                       "checkpoint (.ckpt) it was built from")
                return load_nequip(path)
            try:    # nequip-train's checkpoints hold tensors and plain containers only
                ck = torch.load(path, map_location="cpu", weights_only=True)
            except pickle.UnpicklingError:
                # other objects: unpickled as nequip's own loader does with this same
                # file without --dtype (the path the user named, or the source that
                # mltorch.compiled.rebuild names in its note)
                ck = torch.load(path, map_location="cpu", weights_only=False)
            try:
                ck["hyper_parameters"]["model"]["model_dtype"] = dtype
                ck["hyper_parameters"]["info_dict"]["training_module"]["model"]["model_dtype"] = dtype
            except (KeyError, TypeError):
                raise ImportFailed(f"{path} is not a checkpoint of nequip-train (no model config)")
            fd, tmp = tempfile.mkstemp(suffix=".ckpt")
            os.close(fd)
            try:
                torch.save(ck, tmp)
                model = load_saved_model(tmp)
            finally:
                os.remove(tmp)
    return model.eval()


class NequIPModel(nn.Module):
    """ML-TORCH contract around a nequip-framework GraphModel (NequIP GNN or Allegro).

    forward(edge_vectors, edge_index, species, n_local) -> per-node energies [N]
    For NequIP (message passing) also stage_embed / stage_interaction / stage_readout:
    the embed stage runs the type/edge embeddings and conv layer 0 (whose input is the
    type embedding, known for ghosts too), each interaction stage one further conv layer,
    the readout the per-atom MLP + per-type scale/shift; a pair potential (ZBL) is
    evaluated in the last stage that has edges and carried as one extra feature column.

    The energy model's modules are held once, in `mods` (same order as nequip's
    SequentialGraphNetwork, without the final total-energy sum); the pieces are index
    ranges: [0, c0) embeddings, [c0, c0+L) conv layers, [c0+L, s+1) readout + scale/shift,
    [s+1, end) pair potential.

    Built from nequip's GraphModel (`NequIPModel(graph_model, elements)`, as the
    importer does) or from the checkpoint or package it was loaded from
    (`NequIPModel(path=..., dtype=..., elements=...)`, by `load_nequip`): the
    importer records the latter as the file's architecture, so that
    mltorch-compile rebuilds the eager module from the file.
    """

    # the argument naming the file it loads (nequip's own loader unpickles a
    # checkpoint and builds what its config names; a package holds Python
    # code); mltorch.compiled.rebuild says so
    SOURCE_ARGUMENT = "path"

    def __init__(self, graph_model=None, elements: Optional[List[str]] = None,
                 path: Optional[str] = None, dtype: Optional[str] = None):
        super().__init__()
        if graph_model is None:
            if path is None:
                raise ImportFailed("NequIPModel needs a nequip GraphModel or the path of its "
                                   "checkpoint or package")
            graph_model = load_nequip(path, dtype)
        # classes are matched by name: a .nequip.zip package brings its own copy of the
        # nequip code (torch.package, module '<torch_package_0>.nequip...'), so isinstance
        # against the installed nequip fails for packaged models
        def cls(m) -> str:
            return type(m).__name__
        ef = graph_model.model           # ForceStressOutput
        func = getattr(ef, "func", ef)   # SequentialGraphNetwork (energy model)
        type_names = list(graph_model.type_names)
        if elements is None:
            elements = type_names
        missing = [e for e in elements if e not in type_names]
        if missing:
            raise ImportFailed(f"the model knows the types {' '.join(type_names)}, not {' '.join(missing)}")
        self.elements = list(elements)
        self.type_names = type_names
        self.cutoff = float(graph_model.metadata["r_max"])
        self.model_dtype = graph_model.model_dtype
        self.register_buffer("type_index", torch.tensor(
            [type_names.index(e) for e in elements], dtype=torch.int64))

        names = list(func._modules)
        mods = dict(func._modules)
        if names[-1] != "total_energy_sum" or cls(mods[names[-1]]) != "AtomwiseReduce":
            raise ImportFailed(f"unsupported nequip energy model layout {names} (expected nequip's "
                               "SequentialGraphNetwork ending in total_energy_sum)")
        names = names[:-1]
        self.module_names = names
        self.mods = nn.ModuleList([mods[n] for n in names])
        conv = [i for i, n in enumerate(names) if cls(mods[n]) == "ConvNetLayer"]
        ss = [i for i, n in enumerate(names) if cls(mods[n]) == "PerTypeScaleShift"]
        self.is_gnn = len(conv) > 0
        self.n_mods = len(names)
        if self.is_gnn:
            if conv != list(range(conv[0], conv[-1] + 1)) or len(ss) != 1 or ss[0] < conv[-1]:
                raise ImportFailed(f"unsupported NequIP layout {names} (expected consecutive ConvNetLayers "
                                   "and one PerTypeScaleShift after them)")
            self.c0 = conv[0]
            self.num_layers = len(conv)
            self.s_end = ss[0] + 1
            self.has_pair = self.s_end < self.n_mods
            # stage widths: output of conv layer k, + 1 column for the pair energy on the last
            dims = [int(mods[names[i]].irreps_out["node_features"].dim) for i in conv]
            if self.has_pair:
                dims[-1] += 1
            self.feature_dims = dims
        else:
            self.c0 = 0
            self.num_layers = 0
            self.s_end = self.n_mods
            self.has_pair = False
            self.feature_dims = []

    def _apply(self, fn, recurse=True):
        """module.to(dtype) (mltorch's export casts the module to the file's dtype) must not
        cast the tensors nequip keeps in float64 on purpose even in float32 models
        (1/r_max, Bessel roots, per-type scales/shifts, ZBL constant): they are saved before
        and put back (moved to the new device) after."""
        keep = {n: t.detach().clone() for n, t in
                list(self.named_buffers()) + list(self.named_parameters())
                if t.dtype == torch.float64 and self.model_dtype == torch.float32}
        super()._apply(fn, recurse)
        for name, t in keep.items():
            *path, attr = name.split(".")
            mod = self
            for p in path:
                mod = getattr(mod, p)
            cur = getattr(mod, attr)
            if cur.dtype != torch.float64:
                with torch.no_grad():
                    if isinstance(cur, nn.Parameter):
                        mod._parameters[attr] = nn.Parameter(t.to(cur.device), cur.requires_grad)
                    elif attr in mod._buffers:
                        mod._buffers[attr] = t.to(cur.device)
                    else:                      # a scripted submodule
                        setattr(mod, attr, t.to(cur.device))
        return self

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """As nn.Module's, and also takes the non-persistent buffers (nequip's
        ScalarLinearLayer.alpha, MakeWeightedChannels._rtoi, AvgNumNeighborsNorm.norm_const)
        that a TorchScript module's state_dict() holds but an eager one's does not:
        mltorch-compile rebuilds the eager module and loads the scripted file's state
        into it. They are copied (the same constants: nequip computes them from the
        config)."""
        persistent = self.state_dict(keep_vars=True)
        loose = {n: b for n, b in self.named_buffers() if n not in persistent}
        rest = {}
        with torch.no_grad():
            for key, value in state_dict.items():
                if key in loose:
                    loose[key].copy_(value)
                else:
                    rest[key] = value
        return super().load_state_dict(rest, strict=strict, assign=assign)

    def script_blocks(self):
        """Compile every nequip module with e3nn's script (which traces the modules e3nn
        marks for tracing, e.g. e3nn.nn.Gate), so that torch.jit.script(wrapper) succeeds.
        Plain torch.jit.script fails on e3nn's Gate (NequIP), works for Allegro."""
        from e3nn.util.jit import script as e3nn_script
        with default_dtype(self.model_dtype):
            self.mods = nn.ModuleList([e3nn_script(m) for m in self.mods])
        return self

    # ---- helpers -----------------------------------------------------------
    def _data(self, edge_vectors: Tensor, edge_index: Tensor, species: Tensor) -> Dict[str, Tensor]:
        data: Dict[str, Tensor] = {
            "edge_vectors": edge_vectors.to(self.model_dtype),
            "edge_index": edge_index,
            "atom_types": self.type_index[species],
        }
        return data

    def _run(self, data: Dict[str, Tensor], lo: int, hi: int) -> Dict[str, Tensor]:
        """nequip modules [lo, hi) in order (TorchScript unrolls the ModuleList loop)."""
        for i, m in enumerate(self.mods):
            if i >= lo and i < hi:
                data = m(data)
        return data

    def _pair_column(self, data: Dict[str, Tensor], n_local: int) -> Tensor:
        """The pair potential's per-atom energy of nodes [0, n_local) (edges centred there)."""
        d: Dict[str, Tensor] = {}
        for key, v in data.items():
            if key != "atomic_energy":
                d[key] = v
        n_nodes = data["atom_types"].size(0)
        d["atomic_energy"] = torch.zeros(n_nodes, 1, dtype=torch.float64,
                                         device=data["edge_vectors"].device)
        d = self._run(d, self.s_end, self.n_mods)
        return d["atomic_energy"][:n_local]

    # ---- contract ------------------------------------------------------------
    def forward(self, edge_vectors: Tensor, edge_index: Tensor, species: Tensor,
                n_local: int) -> Tensor:
        data = self._run(self._data(edge_vectors, edge_index, species), 0, self.n_mods)
        return data["atomic_energy"].view(-1).to(edge_vectors.dtype)

    @torch.jit.export
    def stage_embed(self, edge_vectors: Tensor, edge_index: Tensor, species: Tensor,
                    n_local: int) -> Tensor:
        data = self._run(self._data(edge_vectors, edge_index, species), 0, self.c0 + 1)
        h = data["node_features"][:n_local]
        if self.has_pair and self.num_layers == 1:
            h = torch.cat([h, self._pair_column(data, n_local).to(h.dtype)], dim=1)
        return h.to(edge_vectors.dtype)

    @torch.jit.export
    def stage_interaction(self, k: int, h: Tensor, edge_vectors: Tensor, edge_index: Tensor,
                          species: Tensor, n_local: int) -> Tensor:
        data = self._run(self._data(edge_vectors, edge_index, species), 0, self.c0)
        data["node_features"] = h.to(self.model_dtype)     # all N rows (ghosts exchanged)
        data = self._run(data, self.c0 + k + 1, self.c0 + k + 2)
        out = data["node_features"][:n_local]
        if self.has_pair and k + 2 == self.num_layers:
            out = torch.cat([out, self._pair_column(data, n_local).to(out.dtype)], dim=1)
        return out.to(edge_vectors.dtype)

    @torch.jit.export
    def stage_readout(self, h: Tensor, species: Tensor, n_local: int) -> Tensor:
        in_dtype = h.dtype
        h = h.to(self.model_dtype)
        data: Dict[str, Tensor] = {"atom_types": self.type_index[species[:n_local]]}
        if self.has_pair:
            data["node_features"] = h[:, :-1]
        else:
            data["node_features"] = h
        data = self._run(data, self.c0 + self.num_layers, self.s_end)
        e = data["atomic_energy"]
        if self.has_pair:
            e = h[:, -1:].to(e.dtype) + e        # as ZBL: atomic_eng(zbl) + atomic_energy
        return e.view(-1).to(in_dtype)


def reference(atoms, path, dtype=None):
    """nequip's own energy, forces, stress (ASE's sign and Voigt order) and
    per-atom energies for ASE `atoms`, by NequIPCalculator on the model
    loaded as the importer loads it (in `dtype`, or the model's own). In the
    model's own units (the calculator's conversion factors are left at 1):
    eV and eV/A^3 for a metal model, kcal/mol and kcal/mol/A^3 for a real one."""
    return references([atoms], path, dtype)[0]


def references(atoms_list, path, dtype=None):
    """reference() of each ASE Atoms of `atoms_list`, the model loaded once."""
    from nequip.integrations.ase import NequIPCalculator
    from nequip.integrations.utils import basic_transforms
    with quiet():
        m = load_nequip(path, dtype)
        types = list(m.type_names)
        calc = NequIPCalculator(model=m, device="cpu", transforms=basic_transforms(
            m.metadata, float(m.metadata["r_max"]), types, {t: t for t in types}))
        results = []
        for atoms in atoms_list:
            a = atoms.copy()
            a.calc = calc
            results.append({"energy": float(a.get_potential_energy()), "forces": a.get_forces(),
                            "stress": a.get_stress(), "energies": a.get_potential_energies()})
        return results


def imported(args):
    """mltorch-import nequip: the wrapper of args.source (a NequIP or Allegro
    model, in the model's own dtype unless --dtype, in the units its ZBL term
    was built in unless --units) and what the file records
    (mltorch.importers.routine writes it)."""
    import sys
    import nequip
    from .common import Imported
    graph_model = load_nequip(args.source, args.dtype)
    dtype = {torch.float32: "float32", torch.float64: "float64"}[graph_model.model_dtype]
    args.dtype = dtype
    units, units_from, note = model_units(graph_model, args.units)
    if note:
        print(f"mltorch-import: note: {note}", file=sys.stderr)
    model = NequIPModel(graph_model, elements=args.elements).eval()
    framework = "nequip" if model.is_gnn else "nequip-allegro"
    version = nequip.__version__
    if not model.is_gnn:
        from importlib.metadata import version as installed
        version += f", nequip-allegro {installed('nequip-allegro')}"
    return Imported(
        model=model, units=units, dtype=dtype, num_interaction_layers=max(model.num_layers, 1),
        model_type="nequip" if model.is_gnn else "allegro",
        imported={"framework": framework, "framework_version": version,
                  "model": os.path.basename(args.source), "checkpoint_sha256": sha256(args.source),
                  "units_from": units_from},
        architecture={"path": os.path.abspath(args.source), "dtype": dtype, "elements": model.elements},
        references=lambda atoms: references(atoms, args.source, dtype))
