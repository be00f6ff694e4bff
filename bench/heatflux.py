#!/usr/bin/env python3
"""Cost of the exact atomic virial (bench/RESULTS.md, "Heat flux").

  .venv/bin/python bench/heatflux.py [--atoms-per-side 8] [--steps 20] [--rounds 3] [--ranks 1 2]

For a model on 8^3 x 8 = 4096 Si atoms (diamond, 1200 K), three runs of the
same NVE steps, in turn (A B C A B C ...; these machines are noisy):
  plain     no per-atom output
  idle      compute heat/flux (centroid/stress/atom) defined and not used;
            thermo output only at the end of the run (LAMMPS asks every
            per-atom compute on thermo steps): the extra must be that one
            step
  flux      the heat flux printed on every step: every step computes the
            atomic virial (four backward passes instead of one)
and prints the median loop times and the ratios flux/plain and idle/plain,
per model (si_mp2: 2 message-passing layers; si_local: local) and rank count.
"""

import argparse
import os
import re
import statistics
import subprocess

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(here)
lmp = os.path.join(root, "build", "lmp")
potentials = os.path.join(root, "potentials")


def script(model, n, steps, kind):
    lines = ["units metal", "lattice diamond 5.431", f"region box block 0 {n} 0 {n} 0 {n}",
             "create_box 1 box", "create_atoms 1 box", "mass 1 28.0855",
             "velocity all create 1200 4928 loop geom", "pair_style torch",
             f"pair_coeff * * {model if os.path.isabs(model) else os.path.join(potentials, model)} Si", "neighbor 1.0 bin", "fix md all nve"]
    if kind != "plain":
        lines += ["compute ke all ke/atom", "compute pe all pe/atom",
                  "compute cv all centroid/stress/atom NULL virial", "compute flux all heat/flux ke pe cv"]
    if kind == "flux":
        lines += ["thermo_style custom step pe c_flux[1] c_flux[2] c_flux[3]", "thermo 1"]
    else:
        # LAMMPS asks every per-atom compute on thermo steps: output at the
        # end of the run only (one such step in the loop)
        lines += ["thermo 1000000"]
    lines += ["run 1 post no", f"run {steps} post no"]
    return "\n".join(lines) + "\n"


def loop_time(model, n, steps, kind, ranks):
    cmd = [lmp, "-log", "none", "-echo", "none", "-nocite"]
    if ranks > 1:
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(ranks)] + cmd
    out = subprocess.run(cmd, input=script(model, n, steps, kind), capture_output=True, text=True,
                         env=dict(os.environ, OMP_NUM_THREADS="1"), check=True)
    times = re.findall(r"Loop time of ([0-9.eE+-]+)", out.stdout)
    return float(times[-1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--atoms-per-side", type=int, default=8)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    p.add_argument("--models", nargs="+", default=["si_mp2.pt", "si_local.pt"],
                   help="model files (in potentials/, or paths)")
    a = p.parse_args()
    n = a.atoms_per_side
    print(f"{8 * n ** 3} atoms, {a.steps} steps a run, {a.rounds} rounds (A B C in turn); "
          "median loop times")
    print("| model | atoms | ranks | plain s | idle s | flux s | idle/plain | flux/plain | idle extra in flux steps |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for model in a.models:
        for ranks in a.ranks:
            t = {"plain": [], "idle": [], "flux": []}
            for _ in range(a.rounds):
                for kind in t:
                    t[kind].append(loop_time(model, n, a.steps, kind, ranks))
            m = {k: statistics.median(v) for k, v in t.items()}
            # the idle run's extra time in units of one atomic-virial step's
            # extra cost: 1.0 = the last step's thermo output alone
            per = (m["flux"] - m["plain"]) / (a.steps + 0.0)
            extra = (m["idle"] - m["plain"]) / per if per > 0 else float("nan")
            print(f"| {os.path.basename(model)} | {8 * n ** 3} | {ranks} | {m['plain']:.3f} | {m['idle']:.3f} | {m['flux']:.3f} | "
                  f"{m['idle'] / m['plain']:.3f} | {m['flux'] / m['plain']:.3f} | {extra:.2f} |", flush=True)


if __name__ == "__main__":
    main()
