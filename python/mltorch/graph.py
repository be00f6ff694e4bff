"""Graphs for periodic configurations outside LAMMPS (training, reference checks).

Periodic images are made explicit, as LAMMPS ghost atoms are: nodes are the
original atoms (first, they are the `n_local` whose energies count) followed
by every image within `layers * cutoff` of an original atom; edges connect
each node closer than `(layers - 1) * cutoff` to an original (the nodes whose
environment a message-passing model needs) to every node within the cutoff.
The neighbor search is brute force and independent of LAMMPS.
"""

import math
from dataclasses import dataclass

import torch


@dataclass
class Graph:
    n_local: int
    species: torch.Tensor      # [N] int64
    edge_index: torch.Tensor   # [2, E] int64
    owner: torch.Tensor        # [N] int64, original atom of each node
    shift: torch.Tensor        # [N, 3] float64 integer image shift of each node


def build_graph(pos, cell, species, cutoff, layers=1, pbc=(True, True, True)):
    """pos [n,3], cell [3,3] (rows a, b, c), species [n] -> Graph (no gradients)."""
    pos = torch.as_tensor(pos, dtype=torch.float64)
    cell = torch.as_tensor(cell, dtype=torch.float64)
    species = torch.as_tensor(species, dtype=torch.int64)
    n = pos.shape[0]
    reach = layers * cutoff
    volume = abs(float(torch.det(cell)))
    ranges = []
    for d in range(3):
        if not pbc[d]:
            ranges.append(range(0, 1))
            continue
        other = [cell[(d + 1) % 3], cell[(d + 2) % 3]]
        height = volume / float(torch.linalg.cross(other[0], other[1]).norm())
        m = int(math.ceil(reach / height))
        ranges.append(range(-m, m + 1))
    shifts = torch.tensor([[i, j, k] for i in ranges[0] for j in ranges[1] for k in ranges[2]
                           if (i, j, k) != (0, 0, 0)], dtype=torch.float64).reshape(-1, 3)
    shifts = torch.cat([torch.zeros(1, 3, dtype=torch.float64), shifts])
    x_all = (pos[None, :, :] + (shifts @ cell)[:, None, :]).reshape(-1, 3)
    owner_all = torch.arange(n).repeat(shifts.shape[0])
    shift_all = shifts.repeat_interleave(n, dim=0)
    # exact distances: cdist's matrix-product shortcut loses ~1e-7 A
    exact = "donot_use_mm_for_euclid_dist"
    dist = torch.cdist(x_all, pos, compute_mode=exact).min(dim=1).values
    dist[:n] = 0.0
    keep = dist <= reach + 1e-9
    keep[:n] = True
    x, owner, shift, dist = x_all[keep], owner_all[keep], shift_all[keep], dist[keep]
    centres = torch.nonzero(dist <= (layers - 1) * cutoff + 1e-9).flatten()
    d = torch.cdist(x[centres], x, compute_mode=exact)
    ci, nj = torch.nonzero(d < cutoff, as_tuple=True)
    ci = centres[ci]
    not_self = ci != nj
    edge_index = torch.stack([ci[not_self], nj[not_self]])
    return Graph(n_local=n, species=species[owner], edge_index=edge_index, owner=owner, shift=shift)


def edge_vectors(graph, pos, cell, strain=None):
    """Differentiable r_ij = x_j - x_i from atom positions (and an optional strain)."""
    x = pos[graph.owner] + graph.shift.to(pos.dtype) @ cell
    if strain is not None:
        x = x + x @ strain
    return x[graph.edge_index[1]] - x[graph.edge_index[0]]


def evaluate(model, graph, pos, cell, create_graph=False):
    """Energy, forces [n,3] and virial [3,3] (W = -dE/d strain) for one graph."""
    dtype = next((p.dtype for p in model.parameters()), None) or torch.float64
    pos = torch.as_tensor(pos, dtype=dtype).detach().requires_grad_(True)
    cell = torch.as_tensor(cell, dtype=dtype)
    strain = torch.zeros(3, 3, dtype=dtype, requires_grad=True)
    vec = edge_vectors(graph, pos, cell, strain)
    energy = model(vec, graph.edge_index, graph.species, graph.n_local)[: graph.n_local].sum()
    dpos, dstrain = torch.autograd.grad(energy, [pos, strain], create_graph=create_graph)
    return energy, -dpos, -dstrain
