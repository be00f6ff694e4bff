#!/usr/bin/env python3
"""Reads the partition logs and force dumps of in.distill and prints, per
replica, the student's force error against SevenNet-0 over time (f_ft[3]:
the RMSE on the configurations each update learns from, measured before that
update, so on data the student has not seen), the force error of the
students as they started and as trained on the trajectory's frames, the
teacher calls made and saved, and the speed of the student and of the
teacher (their MD steps per second on the same atoms, from the last two
runs' "Loop time" lines); writes distill.png.

    ../../.venv/bin/python analyse.py [LOG]       (default log.distill: reads LOG.0, LOG.1)
"""

import os
import re
import sys


def thermo(path):
    """The first run's thermo rows (dicts by column name) and every run's
    (loop seconds, steps)."""
    rows, loops, header = [], [], None
    with open(path) as f:
        for line in f:
            words = line.split()
            if words[:3] == ["Step", "Temp", "PotEng"] and "c_dev[1]" in words:
                header = words
                continue
            if header and len(words) == len(header):
                try:
                    rows.append(dict(zip(header, map(float, words))))
                    continue
                except ValueError:
                    pass
            m = re.match(r"Loop time of ([0-9.eE+-]+) on \d+ procs for (\d+) steps", line)
            if m:
                header = None
                loops.append((float(m.group(1)), int(m.group(2))))
    return rows, loops


def forces(path):
    """Forces of every frame of a dump: {timestep: [n][3]}."""
    out, lines = {}, open(path).read().splitlines()
    k = 0
    while k < len(lines):
        step = int(lines[k + 1])
        n = int(lines[k + 3])
        out[step] = [[float(w) for w in line.split()[1:4]] for line in lines[k + 9:k + 9 + n]]
        k += 9 + n
    return out


def rmse(a, b):
    d = [(x - y) ** 2 for ra, rb in zip(a, b) for x, y in zip(ra, rb)]
    return (sum(d) / len(d)) ** 0.5


def before_after(folder, p, rows):
    """Per frame: step, temperature, RMSE of the starting and of the trained
    student against the teacher."""
    got = {name: forces(os.path.join(folder, f"forces.{name}.{p}.dump"))
           for name in ("teacher", "before", "after")}
    temp = {int(r["Step"]): r["Temp"] for r in rows}
    return [(step, temp.get(step, float("nan")), rmse(got["before"][step], f),
             rmse(got["after"][step], f)) for step, f in sorted(got["teacher"].items())]


def main(log="log.distill"):
    summary = []
    curves = {}
    for p in (0, 1):
        rows, loops = thermo(f"{log}.{p}")
        if len(loops) < 3 or not rows:
            sys.exit(f"{log}.{p}: not a complete in.distill log (runs: {len(loops)})")
        (t_s, n_s), (t_t, n_t) = loops[-2], loops[-1]
        student, teacher = n_s / t_s, n_t / t_t
        updates = [r for r in rows if r["f_ft[7]"] > 0]
        first = next((r["f_ft[3]"] for r in updates if r["f_ft[3]"] > 0), float("nan"))
        tail = [r["f_ft[3]"] for r in updates[-10:] if r["f_ft[3]"] > 0]
        last = rows[-1]
        summary.append(f"replica {p}: teacher calls {last['f_ft[14]']:.0f} made, {last['f_ft[15]']:.0f} "
                       f"saved; {last['f_ft[7]']:.0f} updates; student force RMSE vs SevenNet-0 "
                       f"{first:.3f} eV/A at the first update, {sum(tail) / max(1, len(tail)):.3f} "
                       f"eV/A over the last 10 thermo rows; student {student:.1f} steps/s, teacher "
                       f"{teacher:.2f} steps/s: {student / teacher:.0f}x")
        frames = before_after(os.path.dirname(os.path.abspath(log)), p, rows)
        for lo, hi in ((300, 700), (700, 1100), (1100, 1600)):
            sel = [f for f in frames if lo <= f[1] < hi]
            if sel:
                summary.append(f"  frames at {lo}-{hi} K ({len(sel)}): force RMSE vs SevenNet-0 "
                               f"{sum(f[2] for f in sel) / len(sel):.3f} eV/A as the students started, "
                               f"{sum(f[3] for f in sel) / len(sel):.3f} eV/A as trained")
        curves[p] = (rows, frames)
    print("\n".join(summary))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(4, 1, figsize=(7, 10), sharex=True)
    for p, (rows, frames) in curves.items():
        step = [r["Step"] for r in rows]
        ax[0].plot(step, [r["f_ft[3]"] if r["f_ft[7]"] > 0 else float("nan") for r in rows],
                   label=f"replica {p}")
        ax[1].plot(step, [r["c_dev[1]"] for r in rows], label=f"replica {p}")
        ax[2].plot(step, [r["f_ft[14]"] for r in rows], label=f"replica {p}: made")
        ax[2].plot(step, [r["f_ft[15]"] for r in rows], "--", label=f"replica {p}: saved")
        ax[3].plot([f[0] for f in frames], [f[2] for f in frames], "--",
                   label=f"replica {p}: students as they started")
        ax[3].plot([f[0] for f in frames], [f[3] for f in frames],
                   label=f"replica {p}: student as trained")
    ax[0].set_ylabel("student force RMSE\nvs SevenNet-0 (eV/Å)")
    ax[1].set_ylabel("committee max force\ndeviation (eV/Å)")
    ax[2].set_ylabel("teacher calls")
    ax[3].set_ylabel("force RMSE vs SevenNet-0\non the frames (eV/Å)")
    ax[3].set_xlabel("MD step (300 K → 1500 K)")
    for a in ax:
        a.legend(fontsize=8)
    fig.suptitle("Distilling SevenNet-0 into a local ZnS model, online (2 replicas)")
    fig.tight_layout()
    out = os.path.join(os.path.dirname(os.path.abspath(log)), "distill.png")
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(*sys.argv[1:])
