"""A cheaper contraction order for e3nn's tensor products (the convolutions of
SevenNet, NequIP and MACE), applied to the code e3nn generates for them.

e3nn writes each TensorProduct as an fx graph (o3._tensor_product._codegen):
for a path (l1, l2 -> l3) it forms the outer product of the two inputs,
xx[z,u,v,i,j] = x1[z,u,i] x2[z,v,j] (shared by the paths of the same input
pair), and contracts it with the Clebsch-Gordan tensor C[i,j,k] by
tensordot. opt_einsum_fx cannot reorder that: xx is a separate einsum with
several users. For a convolution, x2 is the edge's spherical harmonics with
one channel (v = 1) and x1 the neighbour's features with u = 32..128
channels, so the outer product costs u (2 l1 + 1)(2 l2 + 1) per edge and the
contraction (2 l3 + 1) times that, and both run again in the backward pass.

`contract_small_first` rewrites every such tensordot(einsum(outer product of
P and Q), C) as einsum(Q, einsum(P, C)): the smaller input (the spherical
harmonics) is contracted with C first, then the result with the features,
which costs u (2 l1 + 1)(2 l3 + 1) per edge and never forms xx. It is the
same sum in another order (results equal to rounding); the module's layers,
parameters and the rest of e3nn's graph are untouched. It is applied only
where it lowers the operation count, and only to graphs of exactly this form.
"""

import torch
from torch import fx

_EINSUM = (torch.functional.einsum, torch.einsum)
_TENSORDOT = (torch.functional.tensordot, torch.tensordot)
_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _outer_product(node):
    """(subscripts of the two inputs, output subscripts, inputs) of an einsum node
    that is a batched outer product (no index summed, none repeated), else None."""
    if not (isinstance(node, fx.Node) and node.op == "call_function" and node.target in _EINSUM):
        return None
    eq, ops = node.args[0], node.args[1:]
    if not isinstance(eq, str) or "->" not in eq or len(ops) != 2 or node.kwargs:
        return None
    ins, out = eq.replace(" ", "").split("->")
    subs = ins.split(",")
    if len(subs) != 2 or len(set(out)) != len(out) or set(subs[0]) | set(subs[1]) != set(out):
        return None
    if any(len(set(s)) != len(s) for s in subs):
        return None
    return subs, out, ops


def _numel(node):
    meta = node.meta.get("tensor_meta") if isinstance(node, fx.Node) else None
    return None if meta is None else meta.shape.numel()


def _rewrite(graph, node):
    """Rewrite one tensordot node if it has the form above and gains; True if done."""
    found = _outer_product(node.args[0])
    cg = node.args[1]
    dims = node.kwargs.get("dims", node.args[2] if len(node.args) > 2 else None)
    if found is None or not isinstance(cg, fx.Node) or "tensor_meta" not in cg.meta:
        return False
    if not (isinstance(dims, (tuple, list)) and len(dims) == 2
            and all(isinstance(d, (tuple, list)) for d in dims)):
        return False
    if node.kwargs.get("out") is not None:
        return False
    (s0, s1), out, ops = found
    contracted = [out[d] for d in dims[0]]
    shared = set(s0) & set(s1)
    # one contracted index in each input, none of them a batch index
    if shared & set(contracted) or not (set(contracted) & set(s0) and set(contracted) & set(s1)):
        return False
    cg_shape = list(cg.meta["tensor_meta"].shape)
    fresh = iter(c for c in _LETTERS if c not in out)
    cg_sub = [None] * len(cg_shape)
    for da, dc in zip(dims[0], dims[1]):
        cg_sub[dc] = out[da]
    free = []
    for k in range(len(cg_sub)):
        if cg_sub[k] is None:
            cg_sub[k] = next(fresh)
            free.append(cg_sub[k])
    cg_sub = "".join(cg_sub)
    n0, n1 = _numel(ops[0]), _numel(ops[1])
    if n0 is None or n1 is None:
        return False
    p, q = (0, 1) if n0 <= n1 else (1, 0)      # the smaller input meets C first
    sp, sq = (s0, s1) if p == 0 else (s1, s0)
    m_sub = "".join(c for c in sp if c not in contracted) + "".join(c for c in cg_sub if c not in sp)
    final = "".join(c for c in out if c not in contracted) + "".join(free)
    # operation counts per batch entry, from the traced shapes
    size = {}
    for sub, op in ((s0, ops[0]), (s1, ops[1])):
        for c, n in zip(sub, op.meta["tensor_meta"].shape):
            size[c] = int(n)
    for c, n in zip(cg_sub, cg_shape):
        size[c] = int(n)

    def prod(letters):
        r = 1
        for c in set(letters):
            r *= size[c]
        return r
    before = prod(out) * (1 + prod(free))                 # xx, then xx . C
    after = prod(sp + cg_sub) + prod(sq + m_sub)          # P . C, then Q . (P . C)
    if after >= before:
        return False
    with graph.inserting_before(node):
        m = graph.call_function(torch.functional.einsum, (f"{sp},{cg_sub}->{m_sub}", ops[p], cg))
        t = graph.call_function(torch.functional.einsum, (f"{sq},{m_sub}->{final}", ops[q], m))
    node.replace_all_uses_with(t)
    graph.erase_node(node)
    return True


def rewrite_graph(graphmod, example_inputs):
    """Rewrite the tensordots of one e3nn tensor-product graph; the count rewritten."""
    from torch.fx.passes.shape_prop import ShapeProp
    ShapeProp(graphmod).propagate(*example_inputs)
    done = sum(_rewrite(graphmod.graph, node) for node in list(graphmod.graph.nodes)
               if node.op == "call_function" and node.target in _TENSORDOT)
    if done:
        graphmod.graph.eliminate_dead_code()
        graphmod.graph.lint()
        graphmod.recompile()
    return done


def contract_small_first(module):
    """Rewrite every e3nn TensorProduct in `module` (before scripting); the number
    of contractions rewritten."""
    from e3nn import o3
    done = 0
    for tp in module.modules():
        graphmod = getattr(tp, "_compiled_main_left_right", None)
        if not isinstance(tp, o3.TensorProduct) or not isinstance(graphmod, fx.GraphModule):
            continue
        dtype = next((b.dtype for b in graphmod.buffers() if b.is_floating_point()), None)
        if dtype is None:         # no Clebsch-Gordan tensor in the graph: nothing to reorder
            continue
        batch = 4
        weights = (1 if tp.shared_weights else batch, tp.weight_numel)
        example = (torch.zeros(batch, tp.irreps_in1.dim, dtype=dtype),
                   torch.zeros(batch, tp.irreps_in2.dim, dtype=dtype),
                   torch.zeros(weights, dtype=dtype))
        done += rewrite_graph(graphmod, example)
    return done
