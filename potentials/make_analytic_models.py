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

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
from mltorch.analytic import LennardJones, Morse, StillingerWeber, ToyMessagePassing2  # noqa: E402
from mltorch.export import export  # noqa: E402



def main(out):
    os.makedirs(out, exist_ok=True)
    ar = dict(eps=[[0.0104]], sigma=[[3.40]], cutoff=8.5)
    for name, shift in (("lj_Ar", False), ("lj_Ar_shift", True)):
        export(LennardJones(shift=shift, **ar), os.path.join(out, name + ".pt"), cutoff=8.5,
               elements=["Ar"], units="metal", model_type="lennard-jones",
               architecture=dict(shift=shift, **ar))
    export(LennardJones(shift=False, **ar), os.path.join(out, "lj_Ar_f32.pt"), cutoff=8.5,
           elements=["Ar"], units="metal", dtype="float32", model_type="lennard-jones",
           architecture=dict(shift=False, **ar))

    cu = dict(d0=[[0.3429]], alpha=[[1.3588]], r0=[[2.866]])
    export(Morse(**cu), os.path.join(out, "morse_Cu.pt"), cutoff=6.0, elements=["Cu"], units="metal",
           model_type="morse", architecture=cu)

    # LAMMPS potentials/Si.sw (Stillinger and Weber, PRB 31, 5262 (1985))
    si = dict(epsilon=2.1683, sigma=2.0951, a=1.80, lam=21.0, gamma=1.20,
              costheta0=-0.333333333333, A=7.049556277, B=0.6022245584, p=4.0, q=0.0)
    cut = si["a"] * si["sigma"]
    for name, dtype in (("sw_Si", "float64"), ("sw_Si_f32", "float32")):
        export(StillingerWeber(**si), os.path.join(out, name + ".pt"), cutoff=cut,
               elements=["Si"], units="metal", dtype=dtype, model_type="stillinger-weber",
               architecture=si)

    toy = dict(eps=0.05, sigma=2.2, cutoff=3.8)
    export(ToyMessagePassing2(**toy),
           os.path.join(out, "toy_mp2_Si.pt"), cutoff=3.8, elements=["Si"], units="metal",
           num_interaction_layers=2, model_type="toy two-layer message passing (tests only)",
           architecture=toy)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__)))
