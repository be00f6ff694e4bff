#!/usr/bin/env python3
"""Generate the analytic reference models shipped in potentials/.

They implement the ML-TORCH model contract with closed-form potentials, so
`pair_style torch` can be checked against LAMMPS's native styles:

  lj_Ar.pt       Lennard-Jones, as `pair_style lj/cut 8.5` (no shift)
  lj_Ar_shift.pt the same with `pair_modify shift yes`
  morse_Cu.pt    Morse, as `pair_style morse 6.0`
  sw_Si.pt       Stillinger-Weber with LAMMPS's Si.sw parameters, as `pair_style sw`
  toy_mp2_Si.pt  a smooth two-layer message-passing toy (test model, not physics)

each in float64, plus *_f32.pt float32 exports of LJ and SW.
Usage: python potentials/make_analytic_models.py [output_dir]
"""

import math
import os
import sys

import torch
from torch import Tensor, nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mltorch.export import export  # noqa: E402


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


def main(out):
    os.makedirs(out, exist_ok=True)
    ar = dict(eps=[[0.0104]], sigma=[[3.40]], cutoff=8.5)
    for name, shift in (("lj_Ar", False), ("lj_Ar_shift", True)):
        export(LennardJones(shift=shift, **ar), os.path.join(out, name + ".pt"), cutoff=8.5,
               elements=["Ar"], units="metal", model_type="lennard-jones")
    export(LennardJones(shift=False, **ar), os.path.join(out, "lj_Ar_f32.pt"), cutoff=8.5,
           elements=["Ar"], units="metal", dtype="float32", model_type="lennard-jones")

    export(Morse(d0=[[0.3429]], alpha=[[1.3588]], r0=[[2.866]]),
           os.path.join(out, "morse_Cu.pt"), cutoff=6.0, elements=["Cu"], units="metal",
           model_type="morse")

    # LAMMPS potentials/Si.sw (Stillinger and Weber, PRB 31, 5262 (1985))
    si = dict(epsilon=2.1683, sigma=2.0951, a=1.80, lam=21.0, gamma=1.20,
              costheta0=-0.333333333333, A=7.049556277, B=0.6022245584, p=4.0, q=0.0)
    cut = si["a"] * si["sigma"]
    for name, dtype in (("sw_Si", "float64"), ("sw_Si_f32", "float32")):
        export(StillingerWeber(**si), os.path.join(out, name + ".pt"), cutoff=cut,
               elements=["Si"], units="metal", dtype=dtype, model_type="stillinger-weber")

    export(ToyMessagePassing2(eps=0.05, sigma=2.2, cutoff=3.8),
           os.path.join(out, "toy_mp2_Si.pt"), cutoff=3.8, elements=["Si"], units="metal",
           num_interaction_layers=2, model_type="toy two-layer message passing (tests only)")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__)))
