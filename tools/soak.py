#!/usr/bin/env python3
"""Soak run: long MD with online fine-tuning on 2 MPI ranks, resident memory
sampled from /proc while it runs, and the growth per 1000 steps fitted.

    .venv/bin/python tools/soak.py [--steps 100000] [--every 100] [--np 2]

Runs build/lmp on 64 Si atoms (si_student.pt, teacher Si.sw, one update
every --every steps: 1,000 updates in 100,000 steps), samples VmRSS of every
rank once a second, maps samples to MD steps through the thermo output, and
prints the RSS slope (least squares over the run after its first 10%) in
KB per 1000 steps for each rank. Goal: below 1 KB per 1000 steps.

--heap also preloads tools/heap_probe.c (built here with cc) into the ranks
and fits glibc's view of the heap the same way: the bytes in use (a leak
grows them) and the heap's size (its high-water mark, which the resident
size follows).
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np

here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

INPUT = """
units           metal
atom_modify     map array
lattice         diamond 5.431
region          box block 0 2 0 2 0 2
create_box      1 box
create_atoms    1 box
mass            1 28.0855
velocity        all create 900.0 4928 loop geom
pair_style      torch
pair_coeff      * * {student} Si
{fix}
fix             md all nvt temp 900.0 900.0 0.1
thermo_style    custom step temp pe {columns}
thermo          {thermo}
thermo_modify   flush yes
run             {steps}
"""


def rss_kb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def rank_pids(root_pid, exe):
    """pids of the lmp processes below mpirun"""
    out = subprocess.run(["ps", "-eo", "pid,ppid,comm"], capture_output=True, text=True).stdout
    children = {}
    for line in out.splitlines()[1:]:
        pid, ppid, comm = line.split(None, 2)
        children.setdefault(int(ppid), []).append((int(pid), comm.strip()))
    found, stack = [], [root_pid]
    while stack:
        p = stack.pop()
        for c, comm in children.get(p, []):
            if comm == os.path.basename(exe)[:15]:
                found.append(c)
            stack.append(c)
    return sorted(found)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100000)
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--lmp", default=os.path.join(here, "build", "lmp"))
    ap.add_argument("--md-only", action="store_true", help="no fix torch/finetune (the MD part alone)")
    ap.add_argument("--heap", action="store_true", help="also sample glibc's heap (tools/heap_probe.c)")
    args = ap.parse_args()
    lammps_pot = os.path.realpath(os.path.join(here, "build", "lammps-potentials"))
    work = tempfile.mkdtemp(prefix="mltorch-soak-")
    thermo = max(args.steps // 200 // args.every * args.every, args.every)
    fix, columns = "", "c_thermo_temp c_thermo_temp"
    if not args.md_only:
        fix = (f'fix             ft all torch/finetune {args.every} teacher sw "* * {lammps_pot}/Si.sw Si" &\n'
               f'                weights 1.0 10.0 0.1 lr 1e-4 replay 20 2 log 0 check 50')
        columns = "f_ft[3] f_ft[7]"
    with open(os.path.join(work, "in.soak"), "w") as f:
        f.write(INPUT.format(student=os.path.join(here, "examples", "finetune", "si_student.pt"),
                             fix=fix, columns=columns, thermo=thermo, steps=args.steps))
    log = os.path.join(work, "log.lammps")
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(args.np), args.lmp,
           "-in", "in.soak", "-log", log, "-screen", "none"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if args.heap:
        probe = os.path.join(work, "heap_probe.so")
        subprocess.run(["cc", "-O2", "-shared", "-fPIC", os.path.join(here, "tools", "heap_probe.c"), "-o", probe,
                        "-lpthread"], check=True)
        env.update(LD_PRELOAD=probe, MLTORCH_HEAP_PROBE=work)
    t0 = time.time()
    proc = subprocess.Popen(cmd, cwd=work, env=env)
    samples = []    # (step, [rss per rank])
    times = []      # when each was taken
    pids = []
    step_re = re.compile(r"^\s*(\d+)\s+[-\d.eE+]+\s+[-\d.eE+]+")
    last_step = 0
    finished = False
    while proc.poll() is None:
        time.sleep(1.0)
        if not pids:
            pids = rank_pids(proc.pid, args.lmp)
            continue
        try:
            with open(log) as f:    # all of it: the summary at the end is longer than any tail
                lines = f.readlines()
        except OSError:
            continue
        for line in lines:
            m = step_re.match(line)
            if m:
                last_step = int(m.group(1))
            finished = finished or line.startswith("Loop time of")
        if finished or last_step >= args.steps:
            # the run is over: what follows (timing summary, teardown of
            # LAMMPS, LibTorch and MPI) belongs to no MD step, and a sample
            # of it would be fitted as the last step's memory. The log is
            # buffered, so the last thermo line is the first sign of the end.
            continue
        rss = [rss_kb(p) for p in pids]
        if all(r is not None for r in rss):
            samples.append((last_step, rss))
            times.append(time.time())
    wall = time.time() - t0
    if proc.returncode != 0:
        sys.exit(f"soak run failed (exit {proc.returncode}); log: {log}")
    updates = 0
    with open(log) as f:
        for line in f:
            m = step_re.match(line)
            if m and len(line.split()) >= 5 and not args.md_only:
                updates = int(float(line.split()[4]))
    steps = np.array([s for s, _ in samples], dtype=float)
    rss = np.array([r for _, r in samples], dtype=float)
    keep = steps >= 0.1 * args.steps
    print(f"soak: {args.steps} MD steps, {updates} updates, {args.np} ranks, {wall:.0f} s, "
          f"{len(samples)} RSS samples ({keep.sum()} after the first 10% of steps)")
    for r in range(rss.shape[1]):
        slope = np.polyfit(steps[keep], rss[keep, r], 1)[0] * 1000.0 if keep.sum() > 2 else float("nan")
        print(f"rank {r}: RSS {rss[0, r] / 1024:.1f} MB at the first sample, {rss[keep, r].min() / 1024:.1f}"
              f"-{rss[keep, r].max() / 1024:.1f} MB after warm-up, slope {slope:+.3f} KB per 1000 steps "
              f"(goal: below 1)")
    if args.heap:
        # the probe's samples mapped to steps through the times of ours
        t = np.array(times)
        for r, pid in enumerate(pids):
            try:
                h = np.loadtxt(os.path.join(work, f"heap.{pid}"), ndmin=2)
            except OSError:
                continue
            inside = (h[:, 0] >= t[keep][0]) & (h[:, 0] <= t[-1])
            if inside.sum() < 3:
                continue
            hs = np.interp(h[inside, 0], t, steps)
            size, used = h[inside, 2] / 1024.0, h[inside, 3] / 1024.0
            # what stays allocated: the least in use in each of 9 windows (a
            # sample inside a step also holds that step's temporaries)
            parts = np.array_split(np.arange(len(hs)), 9)
            floor = np.array([used[p].min() for p in parts])
            floor_slope = np.polyfit([hs[p].mean() for p in parts], floor, 1)[0] * 1000.0
            print(f"rank {r}: heap in use {used.min() / 1024:.1f}-{used.max() / 1024:.1f} MB, slope "
                  f"{np.polyfit(hs, used, 1)[0] * 1000.0:+.3f} KB per 1000 steps; its floor (least in use "
                  f"per ninth) {floor[0] / 1024:.2f} -> {floor[-1] / 1024:.2f} MB, slope {floor_slope:+.3f}; "
                  f"heap size {size.min() / 1024:.2f}-{size.max() / 1024:.2f} MB, slope "
                  f"{np.polyfit(hs, size, 1)[0] * 1000.0:+.3f} KB per 1000 steps")
    print(f"log: {log}")


if __name__ == "__main__":
    main()
