"""Machine-learned potential architectures that satisfy the ML-TORCH contract.

LocalMBNet: a strictly local many-body network.  Per edge a radial basis
(Bessel functions times a smooth polynomial cutoff) mixed per neighbour
species into C channels R_c(r_ij); per atom the moments
    A0_c = sum_j R_c,  A1_c = sum_j R_c u_ij,  A2_c = sum_j R_c (u_ij u_ij^T - I/3)
give rotation-invariant descriptors (A0_c, A1_c . A1_c', A2_c : A2_c' for all channel
pairs), which carry three-body (angular) information, and a per-species MLP maps them to the
atomic energy.  Receptive field: one cutoff.

MPNet: the same descriptors start node states h_i; each of (L - 1)
interaction layers adds messages sum_j W(r_ij) * (h_j V) (continuous-filter
convolutions); an MLP reads the energy out.  Receptive field: L cutoffs, so
`num_interaction_layers = L` must be declared when exporting.
"""

import math
from typing import List

import torch
from torch import Tensor, nn


class RadialBasis(nn.Module):
    def __init__(self, cutoff: float, n_basis: int, p: int = 6):
        super().__init__()
        self.cutoff = float(cutoff)
        self.p = float(p)
        self.register_buffer("freq", torch.arange(1, n_basis + 1, dtype=torch.float64) * math.pi / cutoff)

    def forward(self, r: Tensor) -> Tensor:
        x = r / self.cutoff
        p = self.p
        # polynomial envelope (DimeNet): smooth to second order at the cutoff
        env = 1.0 - (p + 1.0) * (p + 2.0) / 2.0 * x ** p + p * (p + 2.0) * x ** (p + 1.0) \
            - p * (p + 1.0) / 2.0 * x ** (p + 2.0)
        env = torch.where(x < 1.0, env, torch.zeros_like(env))
        return torch.sin(self.freq * r[:, None]) / r[:, None] * env[:, None]


def mlp(sizes: List[int]) -> nn.Sequential:
    layers: List[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(nn.SiLU())
    return nn.Sequential(*layers)


class Descriptor(nn.Module):
    """Per-atom rotation-invariant moments of species-mixed radial channels."""

    def __init__(self, cutoff: float, n_species: int, n_basis: int = 8, channels: int = 8):
        super().__init__()
        self.rbf = RadialBasis(cutoff, n_basis)
        self.channels = channels
        self.n_species = n_species
        # one radial mixing per (centre species, neighbour species) pair
        self.mix = nn.Parameter(torch.randn(n_species * n_species, n_basis, channels) / math.sqrt(n_basis))
        self.n_features = channels + channels * (channels + 1)

    def forward(self, edge_vectors: Tensor, edge_index: Tensor, species: Tensor, n_nodes: int,
                n_out: int):
        """Descriptors of nodes [0, n_out) (the moments sum over all edges of each centre)."""
        r = torch.linalg.norm(edge_vectors, dim=1)
        u = edge_vectors / r[:, None]
        basis = self.rbf(r)
        pair = species[edge_index[0]] * self.n_species + species[edge_index[1]]
        radial = torch.bmm(basis[:, None, :], self.mix[pair]).squeeze(1)        # [E, C]
        centre = edge_index[0]
        c = self.channels
        a0 = torch.zeros(n_nodes, c, dtype=r.dtype, device=r.device).index_add(0, centre, radial)
        a1 = torch.zeros(n_nodes, c * 3, dtype=r.dtype, device=r.device).index_add(
            0, centre, (radial[:, :, None] * u[:, None, :]).reshape(-1, c * 3)).reshape(n_nodes, c, 3)
        uu = u[:, :, None] * u[:, None, :] - torch.eye(3, dtype=r.dtype, device=r.device) / 3.0
        a2 = torch.zeros(n_nodes, c * 9, dtype=r.dtype, device=r.device).index_add(
            0, centre, (radial[:, :, None, None] * uu[:, None, :, :]).reshape(-1, c * 9)).reshape(n_nodes, c, 9)
        # the invariants (the costly part) only for the nodes whose energy is asked for
        a0, a1, a2 = a0[:n_out], a1[:n_out], a2[:n_out]
        # all channel pairs (c <= c'): A1_c . A1_c' and A2_c : A2_c'
        iu = torch.triu_indices(c, c, device=r.device)
        g1 = torch.bmm(a1, a1.transpose(1, 2))[:, iu[0], iu[1]]
        g2 = torch.bmm(a2, a2.transpose(1, 2))[:, iu[0], iu[1]]
        return torch.cat([a0, g1, g2], dim=1), r


class LocalMBNet(nn.Module):
    def __init__(self, cutoff: float, n_species: int, n_basis: int = 8, channels: int = 8,
                 hidden: int = 32):
        super().__init__()
        self.descriptor = Descriptor(cutoff, n_species, n_basis, channels)
        self.nets = nn.ModuleList([mlp([self.descriptor.n_features, hidden, hidden, 1])
                                   for _ in range(n_species)])
        self.register_buffer("energy_shift", torch.zeros(n_species, dtype=torch.float64))
        self.register_buffer("feature_scale", torch.ones(self.descriptor.n_features, dtype=torch.float64))

    def forward(self, edge_vectors: Tensor, edge_index: Tensor, species: Tensor, n_local: int) -> Tensor:
        # strictly local: only the n_local energies that count are computed (ghost
        # nodes only lend their positions and species to the edges)
        n_nodes = species.size(0)
        feats, r = self.descriptor(edge_vectors, edge_index, species, n_nodes, n_local)
        feats = feats * self.feature_scale
        local_species = species[:n_local]
        energy = self.energy_shift[local_species].clone()
        for s, net in enumerate(self.nets):
            idx = torch.nonzero(local_species == s).flatten()
            energy = energy.index_add(0, idx, net(feats[idx]).squeeze(-1))
        return energy


class MPNet(nn.Module):
    def __init__(self, cutoff: float, n_species: int, num_layers: int = 2, n_basis: int = 8,
                 channels: int = 8, features: int = 24, hidden: int = 32):
        super().__init__()
        self.descriptor = Descriptor(cutoff, n_species, n_basis, channels)
        self.embed = nn.Embedding(n_species, features)
        self.encode = mlp([self.descriptor.n_features + features, hidden, features])
        # no bias: filters must vanish with the radial basis at the cutoff
        self.filters = nn.ModuleList([nn.Linear(n_basis, features, bias=False) for _ in range(num_layers - 1)])
        self.values = nn.ModuleList([nn.Linear(features, features, bias=False) for _ in range(num_layers - 1)])
        self.updates = nn.ModuleList([mlp([features, hidden, features]) for _ in range(num_layers - 1)])
        self.readout = mlp([features, hidden, 1])
        self.register_buffer("energy_shift", torch.zeros(n_species, dtype=torch.float64))
        self.register_buffer("feature_scale", torch.ones(self.descriptor.n_features, dtype=torch.float64))

    def forward(self, edge_vectors: Tensor, edge_index: Tensor, species: Tensor, n_local: int) -> Tensor:
        n_nodes = species.size(0)
        feats, r = self.descriptor(edge_vectors, edge_index, species, n_nodes, n_nodes)
        h = self.encode(torch.cat([feats * self.feature_scale, self.embed(species).to(feats.dtype)], dim=1))
        basis = self.descriptor.rbf(r)
        last = len(self.filters) - 1
        for k, (filt, val, upd) in enumerate(zip(self.filters, self.values, self.updates)):
            msg = filt(basis) * val(h)[edge_index[1]]
            agg = torch.zeros_like(h).index_add(0, edge_index[0], msg)
            if k == last:
                # the last update and the readout only for the n_local energies that count
                h = h[:n_local] + upd(agg[:n_local])
            else:
                h = h + upd(agg)
        h = h[:n_local]
        return self.energy_shift[species[:n_local]] + self.readout(h).squeeze(-1)

    # --- the layered form (per-layer halo exchange, doc/models.md) ---------
    # The same model in stages: stage_embed() gives the features of the owned atoms
    # [0, n_local) from their edges; before each interaction layer the
    # caller fills the ghost nodes' rows from their owners; stage_readout() gives
    # the owned atoms' energies. forward() above is the single-call form on a
    # graph with ghosts num_interaction_layers cutoffs deep.

    @torch.jit.export
    def stage_embed(self, edge_vectors: Tensor, edge_index: Tensor, species: Tensor,
                    n_local: int) -> Tensor:
        n_nodes = species.size(0)
        feats, r = self.descriptor(edge_vectors, edge_index, species, n_nodes, n_local)
        return self.encode(torch.cat([feats * self.feature_scale,
                                      self.embed(species[:n_local]).to(feats.dtype)], dim=1))

    @torch.jit.export
    def stage_interaction(self, k: int, h: Tensor, edge_vectors: Tensor, edge_index: Tensor,
                          species: Tensor, n_local: int) -> Tensor:
        basis = self.descriptor.rbf(torch.linalg.norm(edge_vectors, dim=1))
        out = h[:n_local]
        for i, (filt, val, upd) in enumerate(zip(self.filters, self.values, self.updates)):
            if i == k:
                msg = filt(basis) * val(h)[edge_index[1]]
                agg = torch.zeros_like(h).index_add(0, edge_index[0], msg)
                out = h[:n_local] + upd(agg[:n_local])
        return out

    @torch.jit.export
    def stage_readout(self, h: Tensor, species: Tensor, n_local: int) -> Tensor:
        return self.energy_shift[species[:n_local]] + self.readout(h).squeeze(-1)
