#!/usr/bin/env python3
"""Write the small, deliberately broken model files used by the error tests."""

import json
import os
import sys

import torch
from typing import Tuple

from torch import Tensor, nn

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "python"))
from mltorch.export import METADATA_NAME, export  # noqa: E402


class NonFinite(nn.Module):
    """Energy log(r - 100): NaN for every edge."""

    def forward(self, edge_vectors: Tensor, edge_index: Tensor, species: Tensor,
                n_local: int) -> Tensor:
        r = torch.linalg.norm(edge_vectors, dim=1)
        out = torch.zeros(species.size(0), dtype=edge_vectors.dtype)
        return out.index_add(0, edge_index[0], torch.log(r - 100.0))


class NanForce(nn.Module):
    """Finite energies (all zero) whose forces are not finite: sqrt(d - d)
    is 0, its derivative at 0 is infinite."""

    def forward(self, edge_vectors: Tensor, edge_index: Tensor, species: Tensor,
                n_local: int) -> Tensor:
        d2 = (edge_vectors * edge_vectors).sum(dim=1)
        out = torch.zeros(species.size(0), dtype=edge_vectors.dtype)
        return out.index_add(0, edge_index[0], torch.sqrt(d2 - d2.detach()))


class NanForSecondSpecies(nn.Module):
    """Lennard-Jones-like finite energies; around atoms of the second species
    the forces are not finite (sqrt(d - d), as NanForce). Put such atoms on
    one MPI rank only to make a failure that only that rank can see."""

    def forward(self, edge_vectors: Tensor, edge_index: Tensor, species: Tensor,
                n_local: int) -> Tensor:
        d2 = (edge_vectors * edge_vectors).sum(dim=1)
        s6 = (3.4 * 3.4 / d2) ** 3
        term = 2.0 * 0.0104 * (s6 * s6 - s6)
        bad = (species[edge_index[0]] == 1).to(edge_vectors.dtype)
        term = term + bad * torch.sqrt(d2 - d2.detach())
        out = torch.zeros(species.size(0), dtype=edge_vectors.dtype)
        return out.index_add(0, edge_index[0], term)


class FailsTrainingNearXe(nn.Module):
    """TrainableLJ for Ar and Xe whose forward() raises while it is being
    trained (its parameters require gradients, as in fix torch/finetune's
    passes, not in MD) on a graph with Xe centres: a failure inside the
    fix's collective sequence that only the ranks holding Xe see."""

    def __init__(self):
        super().__init__()
        self.eps = nn.Parameter(torch.tensor(0.0104, dtype=torch.float64))
        self.sigma = nn.Parameter(torch.tensor(3.40, dtype=torch.float64))

    def forward(self, edge_vectors: Tensor, edge_index: Tensor, species: Tensor,
                n_local: int) -> Tensor:
        if self.eps.requires_grad and bool((species[:n_local] == 1).any()):
            raise RuntimeError("training pass refused near Xe (test model)")
        d2 = (edge_vectors * edge_vectors).sum(dim=1)
        s6 = (self.sigma * self.sigma / d2) ** 3
        out = torch.zeros(species.size(0), dtype=edge_vectors.dtype)
        return out.index_add(0, edge_index[0], 2.0 * self.eps * (s6 * s6 - s6))


def fails_second_layer_near_xe():
    """A 3-layer layered MPNet for Ar and Xe whose second interaction stage
    raises in training passes (parameters require gradients, as in fix
    torch/finetune's passes, not in MD) on a rank that owns Xe atoms: a
    failure between two halo exchanges that only that rank sees."""
    from mltorch.models import MPNet

    class FailsSecondLayerNearXe(MPNet):
        @torch.jit.export
        def stage_interaction(self, k: int, h: Tensor, edge_vectors: Tensor, edge_index: Tensor,
                              species: Tensor, n_local: int) -> Tensor:
            # (12 or more Xe: the exporter's small test cell has fewer)
            if k == 1 and self.embed.weight.requires_grad and int((species[:n_local] == 1).sum()) >= 12:
                raise RuntimeError("training pass refused in layer 2 near Xe (test model)")
            basis = self.descriptor.rbf(torch.linalg.norm(edge_vectors, dim=1))
            out = h[:n_local]
            for i, (filt, val, upd) in enumerate(zip(self.filters, self.values, self.updates)):
                if i == k:
                    msg = filt(basis) * val(h)[edge_index[1]]
                    agg = torch.zeros_like(h).index_add(0, edge_index[0], msg)
                    out = h[:n_local] + upd(agg[:n_local])
            return out

    torch.manual_seed(77)
    return FailsSecondLayerNearXe(cutoff=6.0, n_species=2, num_layers=3).double()


def linear_messages_si():
    """A 3-layer layered MPNet for Si whose interaction updates are linear
    (no activation): the second derivatives of its messages in the features
    vanish, so the double backward of a training pass has fewer paths
    through the exchanges; with an empty rank (slab) every rank must still
    take part in every exchange in the same order (issue: suspected hang)."""
    from mltorch.models import MPNet

    torch.manual_seed(91)
    m = MPNet(cutoff=4.0, n_species=1, num_layers=3).double()
    m.updates = nn.ModuleList([nn.Linear(24, 24).double() for _ in range(2)])
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(0.3)
    return m


class WrongShape(nn.Module):
    """Per-atom energies as a [N, 2] tensor."""

    def forward(self, edge_vectors: Tensor, edge_index: Tensor, species: Tensor,
                n_local: int) -> Tensor:
        return torch.zeros(species.size(0), 2, dtype=edge_vectors.dtype) + edge_vectors.sum()


class IntegerEnergies(nn.Module):
    """Per-atom energies as integers (no gradient can flow)."""

    def forward(self, edge_vectors: Tensor, edge_index: Tensor, species: Tensor,
                n_local: int) -> Tensor:
        return torch.ones(species.size(0), dtype=torch.int64)


class Float32FromFloat64(nn.Module):
    """Declared float64 but computes and returns float32 energies."""

    def forward(self, edge_vectors: Tensor, edge_index: Tensor, species: Tensor,
                n_local: int) -> Tensor:
        r = torch.linalg.norm(edge_vectors.float(), dim=1)
        out = torch.zeros(species.size(0), dtype=torch.float32)
        return out.index_add(0, edge_index[0], torch.exp(-r))


class TupleOutput(nn.Module):
    """Returns (energies, something) instead of a tensor."""

    def forward(self, edge_vectors: Tensor, edge_index: Tensor, species: Tensor,
                n_local: int) -> Tuple[Tensor, Tensor]:
        e = torch.zeros(species.size(0), dtype=edge_vectors.dtype) + edge_vectors.sum()
        return e, e


class NanWeights(nn.Module):
    """A pair-energy network whose weights hold a NaN (a broken checkpoint)."""

    def __init__(self, value: float):
        super().__init__()
        self.w = nn.Parameter(torch.tensor([1.0, value], dtype=torch.float64))

    def forward(self, edge_vectors: Tensor, edge_index: Tensor, species: Tensor,
                n_local: int) -> Tensor:
        r = torch.linalg.norm(edge_vectors, dim=1)
        out = torch.zeros(species.size(0), dtype=edge_vectors.dtype)
        return out.index_add(0, edge_index[0], self.w[0] * torch.exp(-r) + self.w[1] * 0.0 * r)


class TrainableLJ(nn.Module):
    """Lennard-Jones as pair_style lj/cut (no shift), half of each pair energy
    to each atom, with eps and sigma as trainable parameters."""

    def __init__(self, eps: float, sigma: float):
        super().__init__()
        self.eps = nn.Parameter(torch.tensor(eps, dtype=torch.float64))
        self.sigma = nn.Parameter(torch.tensor(sigma, dtype=torch.float64))

    def forward(self, edge_vectors: Tensor, edge_index: Tensor, species: Tensor,
                n_local: int) -> Tensor:
        d2 = (edge_vectors * edge_vectors).sum(dim=1)
        s6 = (self.sigma * self.sigma / d2) ** 3
        out = torch.zeros(species.size(0), dtype=edge_vectors.dtype)
        return out.index_add(0, edge_index[0], 2.0 * self.eps * (s6 * s6 - s6))


def main(out):
    os.makedirs(out, exist_ok=True)
    meta = dict(cutoff=5.0, elements=["Ar"], units="metal")
    export(NonFinite(), os.path.join(out, "nonfinite_Ar.pt"), model_type="always NaN", check=False, **meta)
    export(NanForce(), os.path.join(out, "nanforce_Ar.pt"), model_type="finite energy, NaN forces",
           check=False, **meta)
    for name, module in [("wrong_shape", WrongShape()), ("integer_energies", IntegerEnergies()),
                         ("float32_energies", Float32FromFloat64()), ("tuple_output", TupleOutput()),
                         ("nan_weights", NanWeights(float("nan"))), ("inf_weights", NanWeights(float("inf")))]:
        export(module, os.path.join(out, name + "_Ar.pt"), model_type=name, check=False, **meta)
    export(TrainableLJ(0.0104, 3.40), os.path.join(out, "lj_trainable_Ar.pt"),
           model_type="lennard-jones, trainable eps and sigma", check=False, cutoff=8.5,
           elements=["Ar"], units="metal")
    export(NanForSecondSpecies(), os.path.join(out, "nan_near_Xe.pt"),
           model_type="LJ, NaN forces around Xe", check=False, cutoff=8.5, elements=["Ar", "Xe"],
           units="metal")
    export(FailsTrainingNearXe(), os.path.join(out, "fails_training_near_Xe.pt"),
           model_type="trainable LJ that raises in training passes around Xe", check=False,
           cutoff=8.5, elements=["Ar", "Xe"], units="metal")

    export(fails_second_layer_near_xe(), os.path.join(out, "fails_layer2_near_Xe.pt"), cutoff=6.0,
           elements=["Ar", "Xe"], units="metal", num_interaction_layers=3, check=False,
           model_type="layered MPNet-3 that raises between two exchanges of a training pass near Xe")

    export(linear_messages_si(), os.path.join(out, "si_mp3_linear.pt"), cutoff=4.0, elements=["Si"],
           units="metal", num_interaction_layers=3, check=False,
           model_type="layered MPNet-3 with linear interaction updates (empty-rank exchange order tests)")

    # second members for committee tests: si_mp2 and si_local with every
    # parameter scaled by (1 + 0.05 N(0,1)), fixed seed
    from mltorch.compiled import rebuild  # noqa: E402
    for name in ["si_mp2", "si_local"]:
        module, meta = rebuild(os.path.join(here, "..", "potentials", name + ".pt"))
        gen = torch.Generator().manual_seed(2026)
        with torch.no_grad():
            for p in module.parameters():
                p.mul_(1.0 + 0.05 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
        export(module, os.path.join(out, name + "_perturbed.pt"), cutoff=meta["cutoff"],
               elements=meta["elements"], units=meta["units"], dtype=meta["dtype"],
               num_interaction_layers=meta["num_interaction_layers"],
               model_type=name + " with perturbed parameters (committee tests)",
               architecture=meta["architecture"]["kwargs"])

    # a 4-layer layered message-passing Si model (per-layer halo exchange
    # tests): si_mp2's trained descriptor, encoder, first layer and readout,
    # two more interaction layers with small random weights (fixed seed)
    from mltorch.models import MPNet  # noqa: E402
    mp2, meta2 = rebuild(os.path.join(here, "..", "potentials", "si_mp2.pt"))
    torch.manual_seed(44)
    mp4 = MPNet(cutoff=4.0, n_species=1, num_layers=4).double()
    with torch.no_grad():
        for name, p in mp4.named_parameters():
            if not name.startswith(("filters.", "values.", "updates.")) or ".0." in name[:11]:
                continue
            p.mul_(0.1)
    missing = mp4.load_state_dict(mp2.state_dict(), strict=False)
    assert not missing.unexpected_keys
    export(mp4, os.path.join(out, "si_mp4_layered.pt"), cutoff=4.0, elements=["Si"], units="metal",
           num_interaction_layers=4, model_type="MPNet-4 (si_mp2 + 2 small random layers), tests",
           architecture={"cutoff": 4.0, "n_species": 1, "num_layers": 4})

    # a trainable local Si model with a shorter cutoff than si_mp2's (3.5 vs
    # 4.0), for the teacher-cutoff error tests; random weights, fixed seed
    from mltorch.models import LocalMBNet  # noqa: E402
    torch.manual_seed(35)
    export(LocalMBNet(cutoff=3.5, n_species=1).double(), os.path.join(out, "si_short_cutoff.pt"),
           cutoff=3.5, elements=["Si"], units="metal", model_type="untrained LocalMBNet, cutoff 3.5",
           architecture={"cutoff": 3.5, "n_species": 1})

    scripted = torch.jit.script(NonFinite())
    torch.jit.save(scripted, os.path.join(out, "no_metadata.pt"))
    bad = {"format_version": 99, "cutoff": 5.0, "elements": ["Ar"],
           "num_interaction_layers": 1, "units": "metal", "dtype": "float64"}
    torch.jit.save(scripted, os.path.join(out, "bad_version.pt"),
                   _extra_files={METADATA_NAME: json.dumps(bad)})
    del bad["cutoff"]
    bad["format_version"] = 1
    torch.jit.save(scripted, os.path.join(out, "no_cutoff.pt"),
                   _extra_files={METADATA_NAME: json.dumps(bad)})


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "models"))
