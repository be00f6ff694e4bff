#!/usr/bin/env python3
"""ML-TORCH benchmark suite: speed, scaling and memory, as ratios measured side by side.

    .venv/bin/python bench/run.py [--figures 1,2,...] [--reps 3] [--smoke]

Every figure that compares two things runs them alternately (A B A B ...,
whole LAMMPS runs, or calls in one process) and quotes the median of the
pairwise ratios: these machines are shared and noisy, absolute times are
not. Writes bench/RESULTS.md (the table of figures with their goals, date,
machine, commands) and PNG plots in bench/; --smoke runs tiny systems once
and writes nothing (ctest runs it so that the suite never rots).

Figures (numbers as in the issue that asked for them):
  1  where a pair_style torch step goes (LAMMPS's timing breakdown + the
     style's model / non-model split), local and message-passing models,
     TorchScript and compiled, float64 and float32
  2  torch-LJ (compiled) vs native lj/cut, 32,000 atoms
  3  cost per atom-step from 1k to 256k atoms, compiled si_local
  4  MPI 1 vs 2 ranks at 32k atoms; fine-tuning throughput 1 vs 2 replicas
  5  one fine-tuning update relative to one MD step, local and message-passing students
  6  peak resident memory per atom; RSS slope over 20k MD steps + 200 updates
  7  torch/kk vs torch on the same run (the KOKKOS lane, when built)
  8  model FLOPs per atom-step against the machine's dense matmul rate
  9  the same model driven from Python (its own neighbor search, velocity Verlet) vs LAMMPS
"""

import argparse
import datetime
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(here)
sys.path.insert(0, here)
sys.path.insert(0, os.path.join(root, "python"))
warnings.filterwarnings("ignore")

import compiled  # noqa: E402
from compiled import compare, lammps_run  # noqa: E402

POT = os.path.join(root, "potentials")
SI, LJ = os.path.join(here, "in.si"), os.path.join(here, "in.lj")
FINETUNE = os.path.join(root, "examples", "finetune")


def breakdown(lmp, variables):
    """LAMMPS's timing breakdown (% of the loop) and the style's model share."""
    r = lammps_run(lmp, SI, variables)
    text = r["stdout"][r["stdout"].rfind("Loop time"):]
    pct = {k: float(v) for k, v in re.findall(r"^(\w+)\s+\|.*\|\s*([0-9.]+)\s*$", text, re.M)}
    pair = pct.get("Pair", 0)
    return {"Pair: model": pair * r["model_share"], "Pair: graph, copies, scatter": pair * (1 - r["model_share"]),
            "Neigh": pct.get("Neigh", 0), "Comm": pct.get("Comm", 0),
            "other": sum(pct.get(k, 0) for k in ("Modify", "Output", "Other")), "ms": 1e3 * r["step"]}


def fig1(a, lmp, res):
    rows = []
    sizes = [(a.n4k, "4k")] + ([] if a.smoke else [(a.n32k, "32k")])
    for model in ("si_local", "si_mp2"):
        for n, label in sizes:
            if model == "si_mp2" and label == "32k":
                continue    # 32k message-passing TorchScript steps take minutes here
            for ext, kind in ((".pt", "TorchScript f64"), ("_f32.pt", "TorchScript f32"), (".pt2", "compiled f64")):
                path = f"{a.pt2_dir}/{model}{ext}" if ext == ".pt2" else f"{POT}/{model}{ext}"
                b = breakdown(lmp, {"model": path, "n": n, "nsteps": a.steps, "pargs": a.pair_args})
                rows.append((f"{model} {label} {kind}", b))
                print(f"fig1 {model} {label} {kind}: {b}", flush=True)
    res["fig1"] = rows
    worst = max(100 - r["Pair: model"] for _, r in rows if "compiled" in _)
    res["summary"].append(("1", "everything but the model, share of a step (compiled)", "<= 2%",
                           f"{worst:.1f}% at most (si_local, si_mp2; table below)"))


def fig2(a, lmp, res):
    r = compare(lmp, "LJ: compiled torch (A) vs native lj/cut (B)", LJ,
                {"pstyle": "torch", "model": f"{POT}/lj_Ar.pt2", "n": a.nlj},
                {"pstyle": "native", "n": a.nlj}, a.reps, a.steps)
    res["summary"].append(("2", f"torch-LJ (compiled) / native lj/cut, {r['atoms']} atoms, 1 core", "<= 5x",
                           f"{r['step_ratio']:.2f}x per step ({r['a_ms']:.1f} vs {r['b_ms']:.1f} ms)"))


def fig3(a, lmp, res):
    pts = []
    cells = (2, 3) if a.smoke else (5, 8, 12, 16, 24, 32)
    for n in cells:
        steps = max(2, a.steps // (1 if n <= 16 else 4))
        r = lammps_run(lmp, SI, {"model": f"{a.pt2_dir}/si_local.pt2", "n": n, "nsteps": steps,
                                 "pargs": a.pair_args})
        pts.append((r["atoms"], 1e6 * r["step"] / r["atoms"]))
        print(f"fig3 {r['atoms']} atoms: {pts[-1][1]:.2f} us per atom-step", flush=True)
    res["fig3"] = pts
    costs = [c for _, c in pts]
    res["summary"].append(("3", "cost per atom-step, compiled si_local, "
                           f"{pts[0][0]} to {pts[-1][0]} atoms", "flat within 15%",
                           f"{min(costs):.1f}-{max(costs):.1f} us (max/min {max(costs) / min(costs):.2f})"))


def fig4(a, lmp, res):
    n = a.n32k
    ra, rb = [], []
    for _ in range(a.reps):
        ra.append(lammps_run(lmp, SI, {"model": f"{POT}/si_local.pt2", "n": n, "nsteps": a.steps}, 1))
        rb.append(lammps_run(lmp, SI, {"model": f"{POT}/si_local.pt2", "n": n, "nsteps": a.steps}, 2))
    speedup = statistics.median(x["step"] / y["step"] for x, y in zip(ra, rb))
    res["summary"].append(("4a", f"MPI strong scaling, {ra[0]['atoms']} atoms, 2 ranks vs 1 (2 cores)", ">= 1.8x",
                           f"{speedup:.2f}x"))
    # replicas: each replica runs the same steps; throughput = replicas x steps / time
    t1, t2 = [], []
    steps = 20 if a.smoke else 200
    for _ in range(a.reps):
        t1.append(finetune_time(lmp, 1, steps))
        t2.append(finetune_time(lmp, 2, steps))
    ratio = statistics.median(2 * x / y for x, y in zip(t1, t2))
    res["summary"].append(("4b", "fine-tuning throughput, 2 replicas (-partition 2x1) vs 1", ">= 1.8x",
                           f"{ratio:.2f}x"))


def finetune_time(lmp, replicas, steps, timing=False):
    """Wall time of a fine-tuning run on 1 rank per replica; with `timing`, the fix's
    own seconds in its steps and in the cross-replica reduction, summed over replicas."""
    sw = os.path.join(root, "build", "lammps-potentials", "Si.sw")
    script = f"""
units metal
lattice diamond 5.431
region box block 0 3 0 3 0 3
create_box 1 box
create_atoms 1 box
mass 1 28.0855
velocity all create 900 4928 loop geom
pair_style torch
pair_coeff * * {FINETUNE}/si_student.pt Si
fix ft all torch/finetune 2 teacher sw "* * {sw} Si" log 0
fix md all nve
run {steps}
variable p world {" ".join(str(k) for k in range(replicas))}
print "$(f_ft[12]:%.9g) $(f_ft[13]:%.9g)" file timing_${{p}}.txt screen no
"""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "in.ft")
        with open(path, "w") as f:
            f.write(script)
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(replicas), lmp, "-in", path,
               "-log", "none", "-echo", "none", "-nocite"]
        if replicas > 1:
            cmd[6:6] = ["-partition", f"{replicas}x1", "-plog", "none", "-pscreen", "none"]
        t = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp, env=dict(os.environ, OMP_NUM_THREADS="1"))
        if out.returncode:
            raise RuntimeError(out.stdout[-2000:] + out.stderr[-2000:])
        wall = time.perf_counter() - t
        if not timing:
            return wall
        fix, reduce = 0.0, 0.0
        for k in range(replicas):
            with open(os.path.join(tmp, f"timing_{k}.txt")) as f:
                a, b = (float(x) for x in f.read().split())
            fix, reduce = fix + a, reduce + b
        return fix, reduce


def fig5(a, lmp, res):
    """examples/finetune/in.bench_update: plain MD and MD + an update every step, alternated."""
    with open(os.path.join(FINETUNE, "in.bench_update")) as f:
        text = f.read()
    n, steps = ("2", "5") if a.smoke else ("3", "30")
    for label, student in (("local si_student.pt", "si_student.pt"), ("message-passing si_mp2.pt", f"{POT}/si_mp2.pt")):
        with tempfile.NamedTemporaryFile("w", suffix=".in", dir=FINETUNE, delete=False) as f:
            f.write(text.replace("si_student.pt", student))
        try:
            out = subprocess.run([lmp, "-in", f.name, "-var", "n", n, "-var", "steps", steps, "-log", "none",
                                  "-echo", "none", "-nocite"], capture_output=True, text=True, cwd=FINETUNE,
                                 env=dict(os.environ, OMP_NUM_THREADS="1"))
        finally:
            os.unlink(f.name)
        if out.returncode:
            raise RuntimeError(out.stdout[-2000:] + out.stderr[-2000:])
        loops = [float(x) for x in re.findall(r"Loop time of ([0-9.eE+-]+)", out.stdout)][1:]
        cost = statistics.median(loops[k + 1] / loops[k] for k in range(0, len(loops) - 1, 2)) - 1
        res["summary"].append(("5", f"one update / one MD step, {label} student, {8 * int(n) ** 3} atoms, 1 rank",
                               "<= 4 MD steps", f"{cost:.2f} MD steps"))
    shares = []
    for _ in range(a.reps):
        fix, reduce = finetune_time(lmp, 2, 20 if a.smoke else 200, timing=True)
        shares.append(reduce / fix)
    res["summary"].append(("5", "share of the fine-tuning time in the cross-replica gradient reduction, "
                           "2 replicas x 1 rank, 216 atoms (fix output 13 / 12)", "<= 5% on 2 ranks",
                           f"{100 * statistics.median(shares):.1f}%"))


def peak_rss_kb(cmd, cwd):
    """Peak resident memory of one command: ru_maxrss of the children of a fresh
    intermediate process (this process's own children maximum never falls)."""
    probe = ("import resource, subprocess, sys; "
             "r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss if r.returncode == 0 else -1)")
    out = subprocess.run([sys.executable, "-c", probe] + cmd, capture_output=True, text=True, cwd=cwd,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    kb = int(out.stdout.strip() or -1)
    if kb < 0:
        raise RuntimeError(f"{' '.join(cmd)} failed")
    return kb


def fig6(a, lmp, res):
    pts = []
    for n in ((2, 3) if a.smoke else (8, 16, 24)):
        kb = peak_rss_kb([lmp, "-in", SI, "-var", "model", f"{POT}/si_local.pt2", "-var", "n", str(n), "-var",
                          "nsteps", "2", "-log", "none", "-echo", "none", "-nocite"], here)
        pts.append((8 * n ** 3, kb))
        print(f"fig6 {8 * n ** 3} atoms: peak RSS {kb / 1024:.0f} MB", flush=True)
    per_atom = (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])
    res["summary"].append(("6a", f"peak RSS per atom (slope {pts[0][0]} to {pts[-1][0]} atoms, compiled si_local)",
                           "-", f"{per_atom:.2f} KB per atom; {pts[-1][1] / 1024:.0f} MB at {pts[-1][0]} atoms"))
    if a.smoke:
        return
    out = subprocess.run([sys.executable, os.path.join(root, "tools", "soak.py"), "--steps", "20000", "--every", "100"],
                         capture_output=True, text=True)
    slopes = [float(s) for s in re.findall(r"slope ([+-][0-9.]+) KB per 1000 steps", out.stdout)]
    res["summary"].append(("6b", "RSS slope over 20k MD steps + 200 updates, 2 ranks (tools/soak.py)",
                           "< 1 KB / 1000 steps", ", ".join(f"{s:+.2f}" for s in slopes) + " KB / 1000 steps"))


def fig7(a, lmp, res):
    kk = os.path.join(root, "build", "kokkos-current", "lmp-run")
    if not os.path.exists(kk):
        res["summary"].append(("7", "torch/kk vs torch", "within 10%", "KOKKOS lane not built (tools/setup.sh --kokkos)"))
        return
    ra, rb = [], []
    for _ in range(a.reps):
        variables = {"model": f"{POT}/si_local.pt2", "n": a.n4k, "nsteps": a.steps}
        ra.append(lammps_run(lmp, SI, variables))
        rb.append(lammps_run(kk, SI, variables, args=["-k", "on", "t", "1", "-sf", "kk"]))
    ratio = statistics.median(y["step"] / x["step"] for x, y in zip(ra, rb))
    res["summary"].append(("7", f"torch/kk (LAMMPS 2026 + Kokkos 5.2 OpenMP, 1 thread) / torch, compiled si_local, "
                           f"{ra[0]['atoms']} atoms", "within 10%", f"{ratio:.3f} (time per step)"))


def si_graph(cells, cutoff, layers=1):
    import torch
    from mltorch.graph import build_graph, edge_vectors
    from torchscript_tuning import silicon
    pos, cell = silicon(cells)
    g = build_graph(pos, cell, torch.zeros(pos.shape[0], dtype=torch.int64), cutoff, layers)
    return pos, cell, g, edge_vectors(g, pos, cell).detach()


def fig8(a, lmp, res):
    r = lammps_run(lmp, SI, {"model": f"{POT}/si_local.pt2", "n": a.n4k, "nsteps": a.steps})
    atom_steps_per_s = r["atoms"] / r["step"]
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    from mltorch.compiled import rebuild
    torch.set_num_threads(1)
    module, meta = rebuild(os.path.join(POT, "si_local.pt"))
    for p in module.parameters():
        p.requires_grad_(False)
    _, _, g, vec = si_graph(2 if a.smoke else 8, meta["cutoff"])
    with FlopCounterMode(display=False) as counter:
        v = vec.clone().requires_grad_(True)
        e = module(v, g.edge_index, g.species, g.n_local).sum()
        e.backward()    # (torch.autograd.grad trips the counter's hooks)
    flops = counter.get_total_flops() / g.n_local
    n = 512 if a.smoke else 2048
    x = torch.randn(n, n, dtype=torch.float64)
    rates = []
    for _ in range(3):
        t = time.perf_counter()
        torch.mm(x, x)
        rates.append(2 * n ** 3 / (time.perf_counter() - t))
    peak = max(rates)
    achieved = flops * atom_steps_per_s
    res["summary"].append(("8", "model FLOPs per atom-step (torch's counter: matmuls only) x atom-steps/s "
                           "vs dense float64 matmul, 1 core", "-",
                           f"{flops / 1e3:.1f} kFLOP per atom-step; {achieved / 1e9:.2f} of {peak / 1e9:.1f} GFLOP/s "
                           f"({100 * achieved / peak:.1f}% of the matmul rate)"))


def fig9(a, lmp, res):
    """A plain Python MD loop: neighbor search with torch (cell-free, chunked cdist over the
    periodic images), the TorchScript model, velocity Verlet; vs LAMMPS + pair_style torch."""
    import torch
    from mltorch.graph import build_graph, edge_vectors
    from torchscript_tuning import silicon
    torch.set_num_threads(1)
    cells = 2 if a.smoke else 8
    model = torch.jit.load(os.path.join(POT, "si_local.pt"))
    for p in model.parameters():
        p.requires_grad_(False)
    pos, cell = silicon(cells)
    species = torch.zeros(pos.shape[0], dtype=torch.int64)
    mass = 28.0855 * 1.0364269e-4    # eV ps^2 / A^2
    vel = torch.zeros_like(pos)
    dt = 0.001

    def forces(p):
        g = build_graph(p, cell, species, 4.0, 1)
        x = p.clone().requires_grad_(True)
        e = model(edge_vectors(g, x, cell), g.edge_index, g.species, g.n_local)[:g.n_local].sum()
        (dx,) = torch.autograd.grad(e, [x])
        return -dx
    f = forces(pos)
    steps = 2 if a.smoke else 5
    times = []
    for _ in range(a.reps):
        t = time.perf_counter()
        for _ in range(steps):
            vel += 0.5 * dt * f / mass
            pos = pos + dt * vel
            f = forces(pos)
            vel += 0.5 * dt * f / mass
        times.append((time.perf_counter() - t) / steps)
    py = statistics.median(times)
    r = lammps_run(lmp, SI, {"model": f"{POT}/si_local.pt", "n": cells, "nsteps": a.steps})
    res["summary"].append(("9", f"Python MD loop (torch neighbor search + the same TorchScript model) / LAMMPS + "
                           f"pair_style torch, {r['atoms']} atoms, per step", ">= 5x",
                           f"{py / r['step']:.1f}x ({1e3 * py:.0f} vs {1e3 * r['step']:.0f} ms)"))


def plots(res):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    if "fig3" in res:
        atoms, cost = zip(*res["fig3"])
        plt.figure(figsize=(5, 3.5))
        plt.semilogx(atoms, cost, "o-")
        plt.xlabel("atoms")
        plt.ylabel("us per atom-step")
        plt.title("compiled si_local, 1 core")
        plt.ylim(0, max(cost) * 1.2)
        plt.tight_layout()
        plt.savefig(os.path.join(here, "cost_per_atom_step.png"), dpi=100)
    if "fig1" in res:
        labels = [name for name, _ in res["fig1"]]
        keys = ["Pair: model", "Pair: graph, copies, scatter", "Neigh", "Comm", "other"]
        plt.figure(figsize=(8, 4))
        left = [0.0] * len(labels)
        for k in keys:
            vals = [r[k] for _, r in res["fig1"]]
            plt.barh(labels, vals, left=left, label=k)
            left = [x + y for x, y in zip(left, vals)]
        plt.xlabel("% of the MD step")
        plt.legend(fontsize=7, loc="lower left")
        plt.tight_layout()
        plt.savefig(os.path.join(here, "step_breakdown.png"), dpi=100)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lmp", default=os.path.join(root, "build", "lmp"))
    ap.add_argument("--figures", default="1,2,3,4,5,6,7,8,9")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--lmp-args", default="", help="extra LAMMPS arguments, e.g. on a GPU: "
                    "'-k on g 1 -sf kk -pk kokkos newton on neigh half' (figures 1 and 3)")
    ap.add_argument("--pair-args", default="", help="pair_style torch keywords, e.g. 'device cuda'")
    ap.add_argument("--pt2-dir", default=POT, help="folder of the compiled packages (e.g. made with "
                    "mltorch-compile --device cuda on the GPU machine)")
    a = ap.parse_args()
    compiled.EXTRA_ARGS = shlex.split(a.lmp_args)
    lmp = os.path.abspath(a.lmp)
    if a.smoke:
        a.reps, a.steps, a.n4k, a.n32k, a.nlj = 1, 2, 2, 3, 4
    else:
        a.n4k, a.n32k, a.nlj = 8, 16, 20
    figs = {int(x) for x in a.figures.split(",")}
    res = {"summary": []}
    t0 = time.time()
    for number, figure in enumerate((fig1, fig2, fig3, fig4, fig5, fig6, fig7, fig8, fig9), start=1):
        if number in figs:
            figure(a, lmp, res)
    for row in res["summary"]:
        print(" | ".join(row), flush=True)
    if a.smoke:
        return 0
    plots(res)
    import torch
    results = os.path.join(here, "RESULTS.md")
    if figs != set(range(1, 10)) and os.path.exists(results):
        # some figures again: replace their rows in the table, keep the rest of the file
        with open(results) as f:
            lines = f.read().split("\n")
        fresh = {}
        for row in res["summary"]:
            fresh.setdefault(row[0], []).append("| " + " | ".join(row) + " |")
        out, done = [], set()
        for line in lines:
            m = re.match(r"\| (\d+[ab]?) \|", line)
            if m and int(re.match(r"\d+", m.group(1)).group(0)) in figs:
                if m.group(1) in fresh and m.group(1) not in done:
                    out.extend(fresh[m.group(1)])
                    done.add(m.group(1))
                continue
            out.append(line)
        with open(results, "w") as f:
            f.write("\n".join(out))
        print(f"updated figures {sorted(figs)} in {results}")
        return 0
    with open(results, "w") as f:
        f.write("# ML-TORCH benchmarks (bench/run.py)\n\n")
        f.write(f"{datetime.date.today()}; {platform.node()}, {os.cpu_count()} cores "
                f"({platform.processor() or platform.machine()}), no GPU; torch {torch.__version__}; "
                f"{a.reps} alternated pairs per ratio, {a.steps} measured MD steps per run, 1 thread per rank; "
                f"{time.time() - t0:.0f} s in all.\n\n")
        f.write("Command: `.venv/bin/python bench/run.py` (figures 1-9; `--figures 2,3` for some).\n\n")
        f.write("| figure | what | goal | measured |\n| --- | --- | --- | --- |\n")
        for row in sorted(res["summary"], key=lambda r: r[0]):
            f.write("| " + " | ".join(row) + " |\n")
        if "fig1" in res:
            f.write("\n## Figure 1: where a step goes (% of the MD step)\n\n")
            f.write("| run | ms/step | Pair: model | Pair: graph, copies, scatter | Neigh | Comm | other |\n")
            f.write("| --- | --- | --- | --- | --- | --- | --- |\n")
            for name, r in res["fig1"]:
                f.write(f"| {name} | {r['ms']:.1f} | {r['Pair: model']:.1f} | {r['Pair: graph, copies, scatter']:.1f} "
                        f"| {r['Neigh']:.2f} | {r['Comm']:.2f} | {r['other']:.2f} |\n")
            f.write("\nThe compiled package runs forward and backward as one graph, so they are not split; "
                    "plot: `step_breakdown.png`.\n")
        if "fig3" in res:
            f.write("\n## Figure 3: cost per atom-step (compiled si_local, 1 core)\n\n| atoms | us per atom-step |\n"
                    "| --- | --- |\n")
            for n, c in res["fig3"]:
                f.write(f"| {n} | {c:.2f} |\n")
            f.write("\nplot: `cost_per_atom_step.png`\n")
        f.write("\n## GPU\n\nNo GPU was available to this run: figures 1 and 3 have not been measured on "
                "a GPU. On a machine with one, after a CUDA build (tools/gpu) and `mltorch-compile --device cuda` "
                "of si_local and si_mp2 into DIR:\n\n    .venv/bin/python bench/run.py --figures 1,3 --lmp "
                "build-gpu/lmp --lmp-args '-k on g 1 -sf kk -pk kokkos newton on neigh half' "
                "--pair-args 'device cuda' --pt2-dir DIR\n")
    print(f"wrote {os.path.join(here, 'RESULTS.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
