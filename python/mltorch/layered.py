"""Layered models: the per-layer halo exchange outside LAMMPS.

A layered model (doc/models.md, "Layered models") has, beside its
single-call forward(), the stages

    stage_embed(edge_vectors, edge_index, species, n_local) -> h [n_local, F_0]
    stage_interaction(k, h_all [n_nodes, F_k], edge_vectors, edge_index,
                      species, n_local) -> h [n_local, F_k+1]     (k = 0 .. L-2)
    stage_readout(h [n_local, F], species, n_local) -> energies [n_local]

on a graph whose edges are centred on the owned nodes [0, n_local) only and
whose ghost nodes lie one cutoff deep. Between stages the ghost rows of h
are set from their owners: here `h[owner]` (owner[n] = owned node of node
n), whose autograd adjoint sums ghost rows into their owners, the reverse
exchange LAMMPS does with reverse communication.
"""

import torch

from . import graph as graphs

STAGES = ("stage_embed", "stage_interaction", "stage_readout")


def is_layered(module):
    return all(hasattr(module, name) for name in STAGES)


def energies(module, num_interaction_layers, edge_vectors, edge_index, species, n_local, owner,
             widths=None):
    """Per-atom energies of the owned nodes by the stages, exchanging with `owner`.

    `widths` (a list) receives the feature width before each interaction layer."""
    h = module.stage_embed(edge_vectors, edge_index, species, n_local)
    for k in range(num_interaction_layers - 1):
        if widths is not None:
            widths.append(int(h.shape[1]))
        h = module.stage_interaction(k, h[owner], edge_vectors, edge_index, species, n_local)
    return module.stage_readout(h, species, n_local)


def evaluate(module, num_interaction_layers, pos, cell, species, cutoff, layered=True,
             create_graph=False):
    """Per-atom energies [n] and forces [n, 3] of a periodic configuration.

    layered: the stages on a graph one cutoff deep with the exchange; otherwise
    forward() on thick ghosts (num_interaction_layers cutoffs deep)."""
    dtype = next((p.dtype for p in module.parameters()), None) or torch.float64
    pos = torch.as_tensor(pos, dtype=dtype).detach().requires_grad_(True)
    cell = torch.as_tensor(cell, dtype=dtype)
    g = graphs.build_graph(pos.detach().double(), cell.double(), species, cutoff,
                           layers=1 if layered else num_interaction_layers)
    vec = graphs.edge_vectors(g, pos, cell)
    widths = []
    if layered:
        e = energies(module, num_interaction_layers, vec, g.edge_index, g.species, g.n_local, g.owner,
                     widths)
    else:
        e = module(vec, g.edge_index, g.species, g.n_local)[: g.n_local]
    (dpos,) = torch.autograd.grad(e.sum(), [pos], create_graph=create_graph)
    return e, -dpos, widths
