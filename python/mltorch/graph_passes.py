"""The traced energy-and-gradient graph of a model and the passes that change
how Inductor lays it out and computes it, not what it computes
(realize_gather_sources, unroll_small_bmm; their version is GRAPH_PASSES
in mltorch.packaging)."""

import torch

def example_graph(cutoff, n_species, dtype, forbidden, seed=7):
    """A random cluster of 41 nodes, 29 of them local, whose sizes collide with no
    other dimension (symbolic tracing would otherwise tie them together)."""
    gen = torch.Generator().manual_seed(seed)
    n, n_local = 41, 29
    pos = torch.rand(n, 3, generator=gen, dtype=torch.float64) * (1.6 * cutoff)
    species = torch.arange(n) % n_species
    ii, jj = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
    mask = ii != jj
    ii, jj = ii[mask], jj[mask]
    vec = pos[jj] - pos[ii]
    keep = (vec.norm(dim=1) < cutoff) & (vec.norm(dim=1) > 0.3 * cutoff)
    vec, index = vec[keep], torch.stack([ii[keep], jj[keep]])
    forbidden = set(forbidden) | {n, n_local}
    e = vec.shape[0]
    while e in forbidden or e < 3:
        e -= 1
    return vec[:e].to(dtype).contiguous(), index[:, :e].contiguous(), species, n_local


def energy_and_gradient(module, names):
    """f(edge_vectors, edge_index, species, local_species, *state) -> (node energies, dE/dr)."""

    def f(edge_vectors, edge_index, species, local_species, *state):
        n_local = local_species.shape[0]
        with torch.enable_grad():
            v = edge_vectors.detach().requires_grad_(True)
            e = torch.func.functional_call(module, dict(zip(names, state)),
                                           (v, edge_index, species, n_local))
            e = e[:n_local]
            (g,) = torch.autograd.grad(e.sum(), [v])
        return e.detach(), g

    return f


def realize_gather_sources(gm):
    """Make every row gather (a node tensor read onto edges) read a contiguous buffer.

    Inductor fuses the producer of a gathered tensor into the gather, and so
    recomputes it once per edge instead of once per node. Where the producer is
    a transposition, as for the node gradients of e3nn's linear layers (their
    component-major [N, i, u] layout read back as [N, u, i]), the fused gather
    becomes a strided, scalar load per element: at 64 Si atoms (1,792 edges)
    SevenNet-0's backward spent about a third of its time there. Inductor's own
    stride constraint (prims.inductor_force_stride_order, what it puts on the
    inputs of extern kernels) makes it write the source once, contiguous, at
    node level; the gather then copies whole rows. Values are unchanged (the
    constraint is a copy at most). Returns the number of gathers constrained.
    """
    try:    # the module that registers Inductor's prims (not imported by torch itself)
        from torch._inductor.inductor_prims import force_stride_order
        from torch._prims_common import make_contiguous_strides_for
    except (ImportError, AttributeError):    # another torch: leave the graph to Inductor
        return 0
    aten = torch.ops.aten
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        if node.target in (aten.gather.default, aten.index_select.default):
            if node.args[1] != 0:
                continue
        elif node.target is aten.index.Tensor:
            if len(node.args[1]) != 1 or node.args[1][0] is None:
                continue
        else:
            continue
        src = node.args[0]
        val = src.meta.get("val") if isinstance(src, torch.fx.Node) else None
        if val is None or val.dim() < 2 or not all(isinstance(d, int) for d in val.shape[1:]):
            continue
        stride = list(make_contiguous_strides_for(val.shape))    # ints: all sizes but the first are
        with gm.graph.inserting_before(node):
            forced = gm.graph.call_function(force_stride_order, (src, stride))
        forced.meta["val"] = val
        node.replace_input_with(src, forced)
        count += 1
    if count:
        gm.graph.lint()
        gm.recompile()
    return count


def unroll_small_bmm(gm, max_inner=8):
    """Write batched matrix products with a small inner dimension as sums of products.

    A bmm [B, M, K] x [B, K, N] with K <= max_inner (the contractions of e3nn's
    tensor products per edge: K = 2l+1 components, 3x3 and 3x5 matrices) is
    an extern MKL call that runs such matrices at well under 1 GFLOP/s; as
    sum_k a[:, :, k] b[:, k, :] it is a pointwise expression that Inductor
    vectorizes and fuses with its neighbours. SevenNet-0 at 64 Si atoms: 88
    products, 1.2x faster per call. The sums run in the order k = 0 .. K-1.
    Returns the number of products rewritten.
    """
    aten = torch.ops.aten
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.bmm.default:
            continue
        a, b = node.args
        inner = a.meta["val"].shape[2] if isinstance(a, torch.fx.Node) and "val" in a.meta else None
        if not isinstance(inner, int) or inner > max_inner:
            continue
        with gm.graph.inserting_before(node):
            total = None
            for k in range(inner):
                ak = gm.graph.call_function(aten.slice.Tensor, (a, 2, k, k + 1))
                bk = gm.graph.call_function(aten.slice.Tensor, (b, 1, k, k + 1))
                term = gm.graph.call_function(aten.mul.Tensor, (ak, bk))
                total = term if total is None else gm.graph.call_function(aten.add.Tensor, (total, term))
        node.replace_all_uses_with(total)
        gm.graph.erase_node(node)
        count += 1
    if count:
        gm.graph.lint()
        gm.recompile()
    return count
