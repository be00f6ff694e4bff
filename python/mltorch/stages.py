"""The stages of a layered model (mltorch.layered) as functions of their
inputs and the model's state, each compiled into a package of its own:
embed_fwd, embed_vjp, inter_fwd_K, inter_vjp_K and readout."""

import torch

def model_state(module):
    names = [n for n, _ in module.named_parameters()] + [n for n, _ in module.named_buffers()]
    tensors = [t.detach() for t in module.parameters()] + [t.detach() for t in module.buffers()]
    return names, tensors


class _Stage(torch.nn.Module):
    """One stage method of a layered model as a module's forward (functional_call needs one)."""

    def __init__(self, module, method):
        super().__init__()
        self.m = module
        self.method = method

    def forward(self, *args):
        return getattr(self.m, self.method)(*args)


def stage_functions(module, names, num_interaction_layers):
    """The compiled stages of a layered model, by name: (function, kind). Every
    function takes the graph tensors, then *state; `fwd` functions return the
    stage's output, `vjp` ones the vector-Jacobian product of their `gout` input
    (recomputing the stage), `readout` the energies and their gradient by h."""
    def call(method, state, args):
        stage = _Stage(module, method)
        return torch.func.functional_call(stage, {"m." + n: t for n, t in zip(names, state)}, args)

    def embed_fwd(vec, index, species, local_species, *state):
        return call("stage_embed", state, (vec, index, species, local_species.shape[0]))

    def embed_vjp(vec, index, species, local_species, gout, *state):
        with torch.enable_grad():
            v = vec.detach().requires_grad_(True)
            h = call("stage_embed", state, (v, index, species, local_species.shape[0]))
            (gv,) = torch.autograd.grad(h, [v], gout)
        return gv

    def inter_fwd(k):
        def f(h_all, vec, index, species, local_species, *state):
            return call("stage_interaction", state, (k, h_all, vec, index, species, local_species.shape[0]))
        return f

    def inter_vjp(k):
        def f(h_all, vec, index, species, local_species, gout, *state):
            with torch.enable_grad():
                v = vec.detach().requires_grad_(True)
                h = h_all.detach().requires_grad_(True)
                out = call("stage_interaction", state, (k, h, v, index, species, local_species.shape[0]))
                gh, gv = torch.autograd.grad(out, [h, v], gout)
            return gh, gv
        return f

    def readout(h, local_species, *state):
        with torch.enable_grad():
            x = h.detach().requires_grad_(True)
            e = call("stage_readout", state, (x, local_species, local_species.shape[0]))
            (gh,) = torch.autograd.grad(e.sum(), [x])
        return e.detach(), gh

    out = {"embed_fwd": embed_fwd, "embed_vjp": embed_vjp}
    for k in range(num_interaction_layers - 1):
        out[f"inter_fwd_{k}"] = inter_fwd(k)
        out[f"inter_vjp_{k}"] = inter_vjp(k)
    out["readout"] = readout
    return out


def stage_args(name, vec, index, species, n_local, widths, dev):
    """Example inputs and dynamic shapes of a stage (edges, nodes, local atoms)."""
    from torch.export import Dim
    edges, nodes, local = Dim("edges", min=2), Dim("nodes", min=2), Dim("local", min=1)
    gen = torch.Generator().manual_seed(3)
    local_species = species[:n_local]
    graph = (vec.to(dev), index.to(dev), species.to(dev), local_species.to(dev))
    graph_dyn = ({0: edges}, {1: edges}, {0: nodes}, {0: local})

    def rand(rows, width):
        return torch.randn(rows, width, generator=gen, dtype=vec.dtype).to(dev)
    if name == "embed_fwd":
        return graph, graph_dyn
    if name == "embed_vjp":
        return graph + (rand(n_local, widths[0]),), graph_dyn + ({0: local},)
    if name == "readout":
        return (rand(n_local, widths[-1]), local_species.to(dev)), ({0: local}, {0: local})
    k = int(name.rsplit("_", 1)[1])
    h_all = (rand(species.shape[0], widths[k]),)
    if name.startswith("inter_fwd"):
        return h_all + graph, ({0: nodes},) + graph_dyn
    return h_all + graph + (rand(n_local, widths[k + 1]),), ({0: nodes},) + graph_dyn + ({0: local},)


# CPU vector width (bits) of the generated code. Inductor's own choice on an
# AVX-512 machine is 512, which these models' small inner dimensions (3
# vector components, 8 channels, 9 tensor components) fill poorly: 256 ran
# si_local 1.37x and si_mp2 1.50x faster here (4096 atoms, 1 thread).
