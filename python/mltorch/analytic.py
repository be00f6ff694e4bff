"""Closed-form potentials in the ML-TORCH model contract (the analytic reference models).

Each equals a native LAMMPS style (lj/cut, morse, sw) or is a test model, so
`pair_style torch` can be checked against LAMMPS itself.  They live in the
package (not in the script that exports them) so that `mltorch-compile` can
rebuild them from a model file's recorded architecture.
"""

import math

import torch
from torch import Tensor, nn


def node_sum(values: Tensor, index: Tensor, n_nodes: int) -> Tensor:
    out = torch.zeros(n_nodes, dtype=values.dtype, device=values.device)
    return out.index_add(0, index, values)


class LennardJones(nn.Module):
    """E = 4 eps [(s/r)^12 - (s/r)^6] - shift, per species pair; half to each atom."""

    def __init__(self, eps, sigma, cutoff, shift):
        super().__init__()
        self.register_buffer("eps", torch.tensor(eps, dtype=torch.float64))
        self.register_buffer("sigma", torch.tensor(sigma, dtype=torch.float64))
        self.cutoff = float(cutoff)
        self.shift = bool(shift)

    def forward(self, edge_vectors: Tensor, edge_index: Tensor, species: Tensor,
                n_local: int) -> Tensor:
        r = torch.linalg.norm(edge_vectors, dim=1)
        si = species[edge_index[0]]
        sj = species[edge_index[1]]
        eps = self.eps[si, sj]
        sig = self.sigma[si, sj]
        sr6 = (sig / r) ** 6
        phi = 4.0 * eps * (sr6 * sr6 - sr6)
        if self.shift:
            sc6 = (sig / self.cutoff) ** 6
            phi = phi - 4.0 * eps * (sc6 * sc6 - sc6)
        return node_sum(0.5 * phi, edge_index[0], species.size(0))


class Morse(nn.Module):
    """E = D0 [exp(-2 a (r - r0)) - 2 exp(-a (r - r0))], half to each atom."""

    def __init__(self, d0, alpha, r0):
        super().__init__()
        self.register_buffer("d0", torch.tensor(d0, dtype=torch.float64))
        self.register_buffer("alpha", torch.tensor(alpha, dtype=torch.float64))
        self.register_buffer("r0", torch.tensor(r0, dtype=torch.float64))

    def forward(self, edge_vectors: Tensor, edge_index: Tensor, species: Tensor,
                n_local: int) -> Tensor:
        r = torch.linalg.norm(edge_vectors, dim=1)
        si = species[edge_index[0]]
        sj = species[edge_index[1]]
        dexp = torch.exp(-self.alpha[si, sj] * (r - self.r0[si, sj]))
        phi = self.d0[si, sj] * (dexp * dexp - 2.0 * dexp)
        return node_sum(0.5 * phi, edge_index[0], species.size(0))


def edge_pairs(edge_index: Tensor, n_nodes: int):
    """All ordered pairs (e1, e2), e1 != e2, of edges sharing their centre atom."""
    centre = edge_index[0]
    n_edges = centre.size(0)
    order = torch.argsort(centre, stable=True)
    c_sorted = centre[order]
    counts = torch.bincount(c_sorted, minlength=n_nodes)
    starts = torch.cumsum(counts, 0) - counts
    n_per = counts[c_sorted]
    first = torch.repeat_interleave(torch.arange(n_edges, device=centre.device), n_per)
    group = torch.repeat_interleave(torch.cumsum(n_per, 0) - n_per, n_per)
    second = starts[c_sorted[first]] + torch.arange(first.size(0), device=centre.device) - group
    keep = first != second
    return order[first[keep]], order[second[keep]]


class StillingerWeber(nn.Module):
    """LAMMPS pair_style sw for one parameter set (all species share it).

    E = sum_i sum_{j>i} phi2(r_ij) + sum_i sum_{j<k} phi3(r_ij, r_ik, theta_jik)
    Atom i gets half of each phi2 with its neighbours and its own phi3 terms.
    """

    def __init__(self, epsilon, sigma, a, lam, gamma, costheta0, A, B, p, q):
        super().__init__()
        for name, value in dict(epsilon=epsilon, sigma=sigma, a=a, lam=lam, gamma=gamma,
                                costheta0=costheta0, A=A, B=B, p=p, q=q).items():
            self.register_buffer(name, torch.tensor(value, dtype=torch.float64))

    def forward(self, edge_vectors: Tensor, edge_index: Tensor, species: Tensor,
                n_local: int) -> Tensor:
        n_nodes = species.size(0)
        r = torch.linalg.norm(edge_vectors, dim=1)
        rc = self.a * self.sigma
        sr = self.sigma / r
        phi2 = self.A * self.epsilon * (self.B * sr ** self.p - sr ** self.q) * \
            torch.exp(self.sigma / (r - rc))
        energy = node_sum(0.5 * phi2, edge_index[0], n_nodes)

        e1, e2 = edge_pairs(edge_index, n_nodes)
        r1 = r[e1]
        r2 = r[e2]
        cos = (edge_vectors[e1] * edge_vectors[e2]).sum(1) / (r1 * r2)
        gs = self.gamma * self.sigma
        phi3 = self.lam * self.epsilon * (cos - self.costheta0) ** 2 * \
            torch.exp(gs / (r1 - rc)) * torch.exp(gs / (r2 - rc))
        # ordered pairs count each (j, k) twice
        return energy.index_add(0, edge_index[0][e1], 0.5 * phi3)


class ToyMessagePassing2(nn.Module):
    """Two-layer toy: e_i = sum_j eps f(r_ij) [ (s/r_ij)^4 - sqrt(1 + c_j) ],
    c_j = sum_k f(r_jk), f(r) = (1 + cos(pi r / rc)) / 2.  Atom i's energy
    depends on its neighbours' neighbours, so it needs 2 x rc of ghosts."""

    def __init__(self, eps, sigma, cutoff):
        super().__init__()
        self.register_buffer("eps", torch.tensor(eps, dtype=torch.float64))
        self.register_buffer("sigma", torch.tensor(sigma, dtype=torch.float64))
        self.cutoff = float(cutoff)

    def forward(self, edge_vectors: Tensor, edge_index: Tensor, species: Tensor,
                n_local: int) -> Tensor:
        n_nodes = species.size(0)
        r = torch.linalg.norm(edge_vectors, dim=1)
        fc = 0.5 * (1.0 + torch.cos(math.pi * r / self.cutoff))
        coord = node_sum(fc, edge_index[0], n_nodes)
        term = (self.sigma / r) ** 4 - torch.sqrt(1.0 + coord[edge_index[1]])
        return node_sum(self.eps * fc * term, edge_index[0], n_nodes)
