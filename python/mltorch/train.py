"""Training on energies, forces and virials of periodic configurations.

Loss (per batch, averaged over frames / atoms / components):
    L = w_E * mean_frames((E - E_ref)^2 / n^2)          (energy per atom)
      + w_F * mean_atoms,xyz((F - F_ref)^2)
      + w_W * mean_frames,ab((W - W_ref)^2 / n^2)       (virial per atom)
"""

import math
import time
from dataclasses import dataclass

import numpy as np
import torch

from .graph import build_graph, edge_vectors


@dataclass
class Sample:
    graph: object
    pos: torch.Tensor
    cell: torch.Tensor
    energy: float
    forces: torch.Tensor
    virial: torch.Tensor
    n: int


def prepare(frames, type2species, cutoff, layers):
    out = []
    for fr in frames:
        species = torch.tensor([type2species[t] for t in fr.types], dtype=torch.int64)
        pos = torch.tensor(fr.pos, dtype=torch.float64)
        cell = torch.tensor(fr.cell, dtype=torch.float64)
        g = build_graph(pos, cell, species, cutoff, layers)
        out.append(Sample(g, pos, cell, fr.energy, torch.tensor(fr.forces, dtype=torch.float64), torch.tensor(fr.virial, dtype=torch.float64),
                          pos.shape[0]))
    return out


def batch_predict(model, samples, create_graph):
    """Energies [B], forces [sum n, 3], virials [B, 3, 3] for a batch of samples."""
    pos = torch.cat([s.pos for s in samples]).requires_grad_(True)
    strain = torch.zeros(len(samples), 3, 3, dtype=torch.float64, requires_grad=True)
    vecs, index, species, frame_of_local = [], [], [], []
    atom_off = node_off = 0
    local_nodes = []
    for b, s in enumerate(samples):
        g = s.graph
        vecs.append(edge_vectors(g, pos[atom_off:atom_off + s.n], s.cell, strain[b]))
        index.append(g.edge_index + node_off)
        species.append(g.species)
        local_nodes.append(torch.arange(g.n_local) + node_off)
        frame_of_local.append(torch.full((g.n_local,), b, dtype=torch.int64))
        atom_off += s.n
        node_off += g.species.shape[0]
    ev = torch.cat(vecs)
    all_species = torch.cat(species)
    # every node's energy (n_local = all nodes); the local ones are picked below
    node_e = model(ev, torch.cat(index, 1), all_species, all_species.shape[0])
    local = torch.cat(local_nodes)
    energies = torch.zeros(len(samples), dtype=node_e.dtype).index_add(0, torch.cat(frame_of_local), node_e[local])
    dpos, dstrain = torch.autograd.grad(energies.sum(), [pos, strain], create_graph=create_graph)
    return energies, -dpos, -dstrain


def errors(model, samples, batch=16):
    """RMSEs: energy per atom (eV/atom), force components (eV/A), virial per atom (eV/atom)."""
    de, df, dw = [], [], []
    for i in range(0, len(samples), batch):
        chunk = samples[i:i + batch]
        e, f, w = batch_predict(model, chunk, create_graph=False)
        n = torch.tensor([s.n for s in chunk], dtype=torch.float64)
        de.append(((e.detach() - torch.tensor([s.energy for s in chunk], dtype=torch.float64)) / n))
        df.append((f.detach() - torch.cat([s.forces for s in chunk])).flatten())
        dw.append(((w.detach() - torch.stack([s.virial for s in chunk])) / n[:, None, None]).flatten())
    rms = lambda x: float(torch.sqrt((torch.cat(x) ** 2).mean()))
    return {"energy_rmse_eV_per_atom": rms(de), "force_rmse_eV_per_A": rms(df),
            "virial_rmse_eV_per_atom": rms(dw)}


def fit_energy_shift(model, samples, n_species):
    """Per-species energy offsets from a least-squares fit of E to the composition."""
    comp = torch.stack([torch.bincount(s.graph.species[: s.n], minlength=n_species).double() for s in samples])
    e = torch.tensor([s.energy for s in samples], dtype=torch.float64)
    shift = torch.linalg.lstsq(comp, e[:, None]).solution.flatten()
    model.energy_shift.copy_(shift)


def scale_features(model, samples):
    with torch.no_grad():
        feats = []
        for s in samples[: min(len(samples), 32)]:
            g = s.graph
            f, _ = model.descriptor(edge_vectors(g, s.pos, s.cell), g.edge_index, g.species,
                                    g.species.shape[0], s.n)
            feats.append(f[: s.n])
        std = torch.cat(feats).std(dim=0)
        model.feature_scale.copy_(1.0 / torch.clamp(std, min=1e-6))


def train(model, train_set, val_set, *, epochs, batch=4, lr=1e-2, lr_final=3e-4,
          weights=(10.0, 1.0, 0.1), seed=0, log=print, max_minutes=None):
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    # the learning rate decays exponentially from lr to lr_final over the
    # run: over the epochs, or over the time budget when one is given
    budget = 60.0 * max_minutes if max_minutes else None
    w_e, w_f, w_w = weights
    start = time.time()
    current_lr = lr
    for epoch in range(epochs):
        progress = (time.time() - start) / budget if budget else epoch / max(1, epochs)
        current_lr = lr * (lr_final / lr) ** min(1.0, progress)
        for group in opt.param_groups:
            group["lr"] = current_lr
        perm = torch.randperm(len(train_set), generator=gen).tolist()
        total = 0.0
        for i in range(0, len(perm), batch):
            chunk = [train_set[k] for k in perm[i:i + batch]]
            e, f, w = batch_predict(model, chunk, create_graph=True)
            n = torch.tensor([s.n for s in chunk], dtype=torch.float64)
            le = (((e - torch.tensor([s.energy for s in chunk], dtype=torch.float64)) / n) ** 2).mean()
            lf = ((f - torch.cat([s.forces for s in chunk])) ** 2).mean()
            lw = (((w - torch.stack([s.virial for s in chunk])) / n[:, None, None]) ** 2).mean()
            loss = w_e * le + w_f * lf + w_w * lw
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(chunk)
        if epoch % 10 == 0 or epoch == epochs - 1:
            val = errors(model, val_set)
            log(f"epoch {epoch:4d}  loss {total / len(train_set):.4e}  val E {val['energy_rmse_eV_per_atom']:.4f} "
                f"F {val['force_rmse_eV_per_A']:.4f} W {val['virial_rmse_eV_per_atom']:.4f}  "
                f"lr {current_lr:.2e}  {time.time() - start:.0f} s")
        if budget and time.time() - start > budget:
            log(f"stopping after {epoch + 1} epochs: time budget of {max_minutes} min reached")
            break
    return model
