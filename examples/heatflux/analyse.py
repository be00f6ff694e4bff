#!/usr/bin/env python3
"""The heat-flux autocorrelation of in.heatflux and its running
Green-Kubo integral, plotted (heatflux.png), from J0Jt.dat (the last block
of fix ave/correlate, running average) and the log (the conductivity and
the scale in.heatflux prints).

  analyse.py [J0Jt.dat] [--log log.lammps] [-o heatflux.png]
"""

import argparse
import re

import numpy as np


def last_block(path):
    blocks, cur = [], []
    for line in open(path):
        if line.startswith("#"):
            continue
        w = line.split()
        if len(w) == 2:    # "Timestep Number-of-time-windows"
            if cur:
                blocks.append(cur)
            cur = []
        elif w:
            cur.append([float(v) for v in w])
    if cur:
        blocks.append(cur)
    return np.array(blocks[-1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("data", nargs="?", default="J0Jt.dat")
    p.add_argument("--log", default="log.lammps")
    p.add_argument("-o", "--output", default="heatflux.png")
    a = p.parse_args()
    b = last_block(a.data)
    # columns: index, time delta (steps), samples, <Jx Jx>, <Jy Jy>, <Jz Jz>
    steps = b[:, 1]
    acf = b[:, 3:6]
    text = open(a.log).read()
    m = re.findall(r"Green-Kubo scale: ([0-9.eE+-]+)", text)
    scale = float(m[-1]) if m else None
    kappa = None
    # the running integral by the trapezoid rule, as trap() in the input
    run = np.vstack([np.zeros(3), np.cumsum(0.5 * (acf[1:] + acf[:-1]), axis=0)])
    m = re.findall(r"Green-Kubo conductivity after (\d+) steps: ([0-9.eE+-]+)", text)
    if m:
        kappa = float(m[-1][1])
    dt_ps = 0.001
    t = steps * dt_ps
    norm = acf / acf[0]
    print(f"{len(t)} lags up to {t[-1]:.2f} ps; <J(0)J(0)> = {acf[0].mean():.4g} (eV A/ps)^2; "
          f"normalised autocorrelation at the last lag {norm[-1].mean():+.3f}")
    if kappa is not None:
        print(f"Green-Kubo conductivity (trap over the window, mean of xx yy zz): {kappa:.2f} W/(m K)")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    for k, lab in enumerate("xyz"):
        ax[0].plot(t, norm[:, k], label=f"J{lab}")
        if scale is not None:
            ax[1].plot(t, run[:, k] * scale, label=f"k{lab}{lab}")
        else:
            ax[1].plot(t, run[:, k] / max(abs(run[-1]).max(), 1e-300), label=f"k{lab}{lab}")
    ax[0].set_xlabel("t (ps)")
    ax[0].set_ylabel("<J(0)J(t)> / <J(0)J(0)>")
    ax[0].axhline(0, color="k", lw=0.5)
    ax[0].legend()
    ax[1].set_xlabel("t (ps)")
    ax[1].set_ylabel("running Green-Kubo integral (W/(m K))" if scale is not None
                     else "running integral (normalised)")
    ax[1].legend()
    ax[1].axhline(0, color="k", lw=0.5)
    title = "si_mp2, crystalline Si: heat-flux autocorrelation"
    if kappa is not None:
        title += f" (kappa {kappa:.1f} W/m/K)"
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(a.output, dpi=100)
    print(f"wrote {a.output}")


if __name__ == "__main__":
    main()
