#!/usr/bin/env python3
"""Plot the learning curve of fix torch/finetune from a LAMMPS log.

    python plot_log.py log.lammps.0 [-o learning_curve.png]

Reads the fix's update lines ("fix torch/finetune: step S update U loss L
E_rmse ... F_rmse ...") and draws the loss and the force RMSE against the
teacher over the MD steps. Each value is measured on a fresh configuration
before the update that learns from it, so the curve shows how well the
current model predicts the data it has not seen yet.
"""

import argparse
import re
import sys

PATTERN = re.compile(r"^fix torch/finetune: step (\d+) update (\d+) loss (\S+) E_rmse (\S+) "
                     r"F_rmse (\S+) W_rmse (\S+)")


def read(path):
    steps, loss, e_rmse, f_rmse = [], [], [], []
    with open(path) as fh:
        for line in fh:
            m = PATTERN.match(line)
            if m:
                steps.append(int(m.group(1)))
                loss.append(float(m.group(3)))
                e_rmse.append(float(m.group(4)))
                f_rmse.append(float(m.group(5)))
    return steps, loss, e_rmse, f_rmse


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log")
    ap.add_argument("-o", "--output", default="learning_curve.png")
    args = ap.parse_args()
    steps, loss, e_rmse, f_rmse = read(args.log)
    if not steps:
        sys.exit(f"{args.log}: no 'fix torch/finetune: step ... update' lines (use the fix's log keyword)")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.6), constrained_layout=True)
    ax1.semilogy(steps, loss, "o-", ms=3)
    ax1.set_xlabel("MD step")
    ax1.set_ylabel("loss (replica average)")
    ax2.semilogy(steps, f_rmse, "o-", ms=3, color="C1", label="forces (eV/Å)")
    ax2.semilogy(steps, e_rmse, "s-", ms=3, color="C2", label="energy (eV/atom)")
    ax2.set_xlabel("MD step")
    ax2.set_ylabel("RMSE vs teacher")
    ax2.legend()
    fig.suptitle("fix torch/finetune: distilling Si.sw into a perturbed student")
    fig.savefig(args.output, dpi=120)
    print(f"{args.output}: {len(steps)} points, force RMSE {f_rmse[0]:.4f} -> {f_rmse[-1]:.4f} eV/A, "
          f"loss {loss[0]:.4g} -> {loss[-1]:.4g}")


if __name__ == "__main__":
    main()
