"""What the Python tooling's tests share (unittest/test_python_*.py): small
models the exporter accepts or refuses, and a fix torch/finetune input."""

import os
import sys

import torch
from torch import Tensor, nn

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(here)
sys.path.insert(0, os.path.join(root, "python"))


def pair_energy(edge_vectors: Tensor, edge_index: Tensor, n: int) -> Tensor:
    r = torch.linalg.norm(edge_vectors, dim=1)
    out = torch.zeros(n, dtype=edge_vectors.dtype)
    return out.index_add(0, edge_index[0], torch.exp(-r))


class Good(nn.Module):
    def forward(self, edge_vectors: Tensor, edge_index: Tensor, species: Tensor, n_local: int) -> Tensor:
        return pair_energy(edge_vectors, edge_index, species.size(0))


class Detached(nn.Module):
    def forward(self, edge_vectors: Tensor, edge_index: Tensor, species: Tensor, n_local: int) -> Tensor:
        return pair_energy(edge_vectors.detach(), edge_index, species.size(0))


class NotInvariant(nn.Module):
    def forward(self, edge_vectors: Tensor, edge_index: Tensor, species: Tensor, n_local: int) -> Tensor:
        out = torch.zeros(species.size(0), dtype=edge_vectors.dtype)
        return out.index_add(0, edge_index[0], torch.exp(-edge_vectors[:, 0] ** 2))


class Scalar(nn.Module):
    def forward(self, edge_vectors: Tensor, edge_index: Tensor, species: Tensor, n_local: int) -> Tensor:
        return pair_energy(edge_vectors, edge_index, species.size(0)).sum()


def finetune_script(student, saved, save_every, log_every, steps):
    """A 64-atom Si run of fix torch/finetune (teacher: LAMMPS's sw) that saves the model."""
    sw = os.path.join(os.environ["LAMMPS_POTENTIALS"], "Si.sw")
    return f"""
units metal
lattice diamond 5.431
region box block 0 2 0 2 0 2
create_box 1 box
create_atoms 1 box
mass 1 28.0855
displace_atoms all random 0.1 0.1 0.1 5 units box
velocity all create 900 77 loop geom
pair_style torch
pair_coeff * * {student} Si
fix ft all torch/finetune 2 teacher sw "* * {sw} Si" save {save_every} {saved} log {log_every}
fix md all nve
run {steps}"""
