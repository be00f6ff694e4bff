#!/usr/bin/env python3
"""Does online fine-tuning spend its labels well, does the foundation model
forget, and what guards it? (bench/RESULTS.md, "Online against offline,
forgetting and the anchor")

SevenNet-0 for Si (examples/dft/7net-0_Si.pt, imported if missing) is
fine-tuned online against LAMMPS's tersoff, a stand-in for DFT of the same
shape as examples/dft (8 Si atoms, 2 replicas at 900 K and 1500 K, a label
every 5 steps on each, both replicas' labels in every update, Adam, lr 2e-4,
clip 10, weights 1 10 0, energy_shift fit), keeping its labels. Then:

online    the model after every 20 labels (one run in chunks of 50 steps)
offline   torch/train (DDP over 2 ranks) on the first n labels of the same
          run, from the same start, the same loss and energy reference,
          batch 4, to convergence (EPOCHS epochs, and twice as many for the
          last point: the error must not move)
guards    the online run again with anchor lambda (L2-SP), and with only the
          readout trained (train post)
errors    on held-out configurations of the run's phases (the original
          model's MD at 900 and 1500 K, other seeds) and on configurations
          the run never visits (foreign: a crystal strained by -4 % and +4 %,
          a (100) slab with its surfaces, a vacancy, the liquid at 3000 K;
          64 atoms, from tersoff's own MD), all labelled by tersoff: force
          RMSE and energy RMSE per atom (each model's mean offset removed:
          the teacher's zero is not the model's)

  .venv/bin/python bench/finetune_bound.py [--epochs E] [--anchors 1,10,100] [--offline-every 20] [--smoke] [--out DIR]

It prints the tables of bench/RESULTS.md and draws bench/finetune_bound.png.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(here)
lmp = os.path.join(root, "build", "lmp")
tersoff = os.path.join(root, "build", "lammps-potentials", "Si.tersoff")
# SevenNet-0 for Si: examples/dft's import, or the benchmark's own
original = os.path.join(root, "examples", "dft", "7net-0_Si.pt")
if not os.path.exists(original):
    original = os.path.join(root, "build", "bench-models", "7net-0_Si.pt")
env = dict(os.environ, OMP_NUM_THREADS="1")
mpirun = ["mpirun", "--allow-run-as-root", "--oversubscribe"]
TEACHER = f'teacher tersoff "* * {tersoff} Si"'
TRAINING = "weights 1 10 0 lr 2e-4 clip 10.0 energy_shift fit"


def lammps(text, cwd, ranks=1, partitions=None, name="in.bench"):
    with open(os.path.join(cwd, name), "w") as f:
        f.write(text)
    cmd = mpirun + ["-np", str(ranks), lmp, "-nocite", "-in", name]
    cmd += ["-partition", f"{partitions}x1"] if partitions else ["-log", "none"]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        logs = "".join(open(os.path.join(cwd, f)).read()[-2000:] for f in sorted(os.listdir(cwd))
                       if f.startswith("log.lammps."))
        sys.exit(f"finetune_bound.py: {' '.join(cmd)} in {cwd} failed:\n{out.stdout[-3000:]}\n"
                 f"{out.stderr[-2000:]}\n{logs}")
    return out.stdout, time.perf_counter() - t0


HEADER = """units metal
atom_style atomic
atom_modify map array
"""

# --- configurations -----------------------------------------------------------


def replicas(seeds):
    """8 Si atoms on 2 replicas (partition p at T = 900 and 1500 K) under
    NVT with the original model"""
    return HEADER + f"""variable p world 0 1
variable T world 900 1500
variable seed world {seeds}
lattice diamond 5.431
region box block 0 1 0 1 0 1
create_box 1 box
create_atoms 1 box
mass 1 28.0855
velocity all create $T ${{seed}} loop geom
pair_style torch
pair_coeff * * {original} Si
neighbor 1.0 bin
fix md all nvt temp $T $T 0.05
"""


def own_frames(work, steps):
    """The run's phases, held out: the original model's MD at 900 and 1500 K
    (other seeds than the fine-tuning's), a frame every 40 steps after 100."""
    text = replicas("7719 2305") + f"""timestep 0.002
run 100
dump frames all custom 40 own.${{p}}.dump id type x y z
dump_modify frames sort id format float %.12g
run {steps}
"""
    lammps(text, work, ranks=2, partitions=2, name="in.own")
    return [os.path.join(work, f"own.{p}.dump") for p in (0, 1)]


def foreign_frames(work, frames):
    """Configurations the run never visits, from tersoff's MD (64 atoms)."""
    sets = {
        "compressed 4%": ("lattice diamond 5.214\nregion box block 0 2 0 2 0 2", 300),
        "stretched 4%": ("lattice diamond 5.648\nregion box block 0 2 0 2 0 2", 300),
        "(100) slab": ("lattice diamond 5.431\nregion box block 0 2 0 2 -1 3\n"
                       "region slab block 0 2 0 2 0 2", 600),
        "vacancy": ("lattice diamond 5.431\nregion box block 0 2 0 2 0 2", 900),
        "liquid 3000 K": ("lattice diamond 5.431\nregion box block 0 2 0 2 0 2", 3000),
    }
    out = {}
    for k, (name, (geometry, temp)) in enumerate(sets.items()):
        slab = "slab" in name
        steps = 2000 if "liquid" in name else 400
        text = HEADER + f"""{geometry}
create_box 1 box
create_atoms 1 {"region slab" if slab else "box"}
mass 1 28.0855
{"group gone id 1" if name == "vacancy" else ""}
{"delete_atoms group gone" if name == "vacancy" else ""}
velocity all create {temp} {4242 + k} loop geom
pair_style tersoff
pair_coeff * * {tersoff} Si
fix md all nvt temp {temp} {temp} 0.05
timestep 0.001
run {steps}
dump frames all custom {steps // frames} foreign.{k}.dump id type x y z
dump_modify frames sort id format float %.12g
run {steps}
"""
        lammps(text, work, name=f"in.foreign.{k}")
        out[name] = os.path.join(work, f"foreign.{k}.dump")
    return out


# --- evaluation ---------------------------------------------------------------


def evaluate(work, pair, coeff, dumps, tag):
    """Per set of `dumps` (name: file), per frame: the total energy, the
    forces (atom-ID order) and the atom count of `pair`, one process for
    all sets (the model loads once)."""
    text = HEADER + f"""region box block 0 1 0 1 0 1
create_box 1 box
mass 1 28.0855
pair_style {pair}
pair_coeff {coeff}
neighbor 1.0 bin
compute pea all pe/atom
"""
    outs = {}
    for k, (name, dump) in enumerate(dumps.items()):
        outs[name] = os.path.join(work, f"eval.{tag}.{k}.dump")
        text += f"""dump f{k} all custom 1 {outs[name]} id fx fy fz c_pea
dump_modify f{k} sort id format float %.12g
rerun {dump} dump x y z box yes add yes
undump f{k}
delete_atoms group all
"""
    lammps(text, work, name=f"in.eval.{tag}")
    result = {}
    for name, out in outs.items():
        frames, lines, i = [], open(out).read().splitlines(), 0
        while i < len(lines):
            if lines[i].startswith("ITEM: NUMBER OF ATOMS"):
                n = int(lines[i + 1])
                a = np.array([[float(w) for w in l.split()] for l in lines[i + 7:i + 7 + n]])
                frames.append((a[:, 4].sum(), a[:, 1:4], n))
                i += 7 + n
            else:
                i += 1
        os.remove(out)
        result[name] = frames
    return result


def errors(model_frames, ref_frames):
    """force RMSE (eV/A) and energy RMSE per atom (eV/atom, mean offset removed)"""
    df = np.concatenate([(m[1] - r[1]).ravel() for m, r in zip(model_frames, ref_frames)])
    de = np.array([(m[0] - r[0]) / r[2] for m, r in zip(model_frames, ref_frames)])
    return float(np.sqrt(np.mean(df ** 2))), float(np.sqrt(np.mean((de - de.mean()) ** 2)))


# --- online and offline training ----------------------------------------------


def online(work, chunks, extra=""):
    """fix torch/finetune on 2 replicas; the model after every chunk of 50
    steps (20 labels) in online.<labels>.pt; the labels in labels.<p>.xyz"""
    os.makedirs(work, exist_ok=True)
    text = replicas("4928 8146") + f"""fix ft all torch/finetune 5 {TEACHER} {TRAINING} {extra} save 0 online.pt log 0 check 10 labels labels.xyz
thermo_style custom step temp pe f_ft[1] f_ft[3] f_ft[7] f_ft[12] f_ft[18]
thermo 50
timestep 0.002
variable n loop {chunks}
label chunk
run 50
variable labels equal 20*$n
if "$p == 0" then "shell cp online.pt online.${{labels}}.pt"
next n
jump SELF chunk
print "RESULT $(f_ft[7]) $(f_ft[12]:%.3f) $(f_ft[18]:%.6g)"
"""
    t0 = time.perf_counter()
    lammps(text, work, ranks=2, partitions=2, name="in.online")
    wall = time.perf_counter() - t0
    log = open(os.path.join(work, "log.lammps.0")).read()
    updates, fix_s, anchor = (float(w) for w in log.split("\nRESULT ")[-1].split()[:3])
    return {"wall": wall, "updates": updates, "fix_s": fix_s, "anchor_term": anchor}


def xyz_frames(path):
    lines, out, i = open(path).read().splitlines(), [], 0
    while i < len(lines):
        n = int(lines[i])
        out.append(lines[i:i + 2 + n])
        i += 2 + n
    return out


def label_subset(work, n):
    """The first n labels of the online run, in the order they were made
    (each update takes one label of each replica)."""
    per = [xyz_frames(os.path.join(work, f"labels.{p}.xyz")) for p in (0, 1)]
    frames = [f for pair in zip(*per) for f in pair][:n]
    assert len(frames) == n, (len(frames), n)
    path = os.path.join(work, f"labels.first{n}.xyz")
    with open(path, "w") as f:
        for fr in frames:
            f.write("\n".join(fr) + "\n")
    return path


def offline(work, labels, epochs, out, resume=None, checkpoint=None):
    text = HEADER + f"""lattice diamond 5.431
region box block 0 1 0 1 0 1
create_box 1 box
create_atoms 1 box
mass 1 28.0855
pair_style torch
pair_coeff * * {original} Si
torch/train {labels} epochs {epochs} batch 4 {TRAINING} log 0 save 0 {out} {f"resume {resume}" if resume else ""} {f"checkpoint 0 {checkpoint}" if checkpoint else ""}
"""
    _, wall = lammps(text, work, ranks=2, name="in.offline")
    return wall


# --- the benchmark ------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=15, help="offline epochs (twice that for the last point)")
    ap.add_argument("--anchors", default="1,10,100", help="anchor lambdas of the guarded runs")
    ap.add_argument("--runs", nargs="*", default=["train post"],
                    help="more online runs: fix torch/finetune keywords each (e.g. 'replay 60 4')")
    ap.add_argument("--offline-every", type=int, default=20,
                    help="offline points every this many labels (0: no offline training)")
    ap.add_argument("--smoke", action="store_true", help="2 chunks, 2 epochs, few frames (ctest)")
    ap.add_argument("--out", default=os.path.join(root, "build", "finetune_bound"))
    args = ap.parse_args()
    if not os.path.exists(original):
        os.makedirs(os.path.dirname(original), exist_ok=True)
        tmp = original.replace(".pt", f".tmp{os.getpid()}.pt")    # the importer writes by extension
        subprocess.run([os.path.join(root, ".venv", "bin", "mltorch-import"), "sevenn", "7net-0", "--elements",
                        "Si", "-o", tmp], check=True)
        os.replace(tmp, original)
    chunks = 2 if args.smoke else 6
    epochs = 2 if args.smoke else args.epochs
    every = 40 if args.smoke else args.offline_every
    work = os.path.abspath(args.out)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    t_start = time.perf_counter()

    own = own_frames(work, 80 if args.smoke else 400)
    foreign = foreign_frames(work, 2 if args.smoke else 5)
    sets = {"own 900 K": own[0], "own 1500 K": own[1], **foreign}
    teacher = evaluate(work, "tersoff", f"* * {tersoff} Si", sets, "teacher")

    def table_row(model):
        got = evaluate(work, "torch", f"* * {model} Si", sets, "model")
        errs = {k: errors(got[k], teacher[k]) for k in sets}
        own_f = np.sqrt(np.mean([errs[k][0] ** 2 for k in sets if k.startswith("own")]))
        foreign_f = np.sqrt(np.mean([errs[k][0] ** 2 for k in sets if not k.startswith("own")]))
        return {"sets": errs, "own_F": float(own_f), "foreign_F": float(foreign_f)}

    results = {"original": table_row(original)}
    runs = {"online": ""}
    for a in [x for x in args.anchors.split(",") if x]:
        runs[f"anchor {a}"] = f"anchor {a}"
    for extra in args.runs:
        runs[extra] = extra
    info = {}
    for name, extra in runs.items():
        d = os.path.join(work, name.replace(" ", "_"))
        info[name] = online(d, chunks, extra)
        results[name] = {n: table_row(os.path.join(d, f"online.{n}.pt")) for n in range(20, 20 * chunks + 1, 20)}
        print(f"{name}: {info[name]}", flush=True)
    labels_dir = os.path.join(work, "online")
    results["offline"], info["offline"] = {}, {}
    points = list(range(every, 20 * chunks + 1, every)) if every > 0 else []
    for n in points:
        labels = label_subset(labels_dir, n)
        model = os.path.join(work, f"offline.{n}.pt")
        ck = os.path.join(work, f"offline.{n}.ck")
        info["offline"][n] = offline(work, labels, epochs, model, checkpoint=ck)
        results["offline"][n] = table_row(model)
        if n == points[-1]:     # converged? twice the epochs
            model2 = os.path.join(work, f"offline.{n}.x2.pt")
            info["offline"][f"{n} x2"] = offline(work, labels, 2 * epochs, model2, resume=ck)
            results["offline"][f"{n} x2"] = table_row(model2)
        print(f"offline {n} labels: {results['offline'][n]['own_F']:.4f} eV/A own", flush=True)

    with open(os.path.join(work, "results.json"), "w") as f:
        json.dump({"results": results, "info": info}, f, indent=1)
    report(results, info, points, chunks, epochs, list(runs))
    print(f"total wall {time.perf_counter() - t_start:.0f} s")
    # what must hold at any size: the run learns, offline from its labels too,
    # and an anchored run carries its term
    n_end = 20 * chunks
    assert results["online"][n_end]["own_F"] < 0.9 * results["original"]["own_F"], results["online"][n_end]
    if points:
        assert results["offline"][points[-1]]["own_F"] < 0.9 * results["original"]["own_F"]
    for name in runs:
        assert (info[name]["anchor_term"] > 0) == name.startswith("anchor"), (name, info[name])
    if not args.smoke and points:
        plot(results, points, chunks, os.path.join(here, "finetune_bound.png"))


def report(results, info, points, chunks, epochs, runs):
    o = results["original"]
    n_end = 20 * chunks
    if points:
        learning_curves(results, points, chunks, epochs)
    print("\n## Every set at the end: force RMSE (eV/A) / energy RMSE (meV/atom, offset removed)\n")
    names = ["original"] + runs + (["offline"] if points else [])
    sets = list(o["sets"])
    print("| model | " + " | ".join(sets) + " | own | foreign |")
    print("| --- " * (len(sets) + 3) + "|")
    for name in names:
        r = results[name] if name == "original" else results[name][n_end if name != "offline" else points[-1]]
        cells = [f"{r['sets'][s][0]:.3f} / {1000 * r['sets'][s][1]:.1f}" for s in sets]
        print(f"| {name} | " + " | ".join(cells) + f" | {r['own_F']:.4f} | {r['foreign_F']:.4f} |")
    print("\n## The runs against the unguarded one (end of the run)\n")
    print("| run | own F | own / unguarded | foreign F | foreign / original | worst foreign set / original | "
          "fix seconds per update |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    base = results["online"][n_end]
    for name in runs:
        r = results[name][n_end]
        i = info[name]
        worst = max((r["sets"][s][0] / o["sets"][s][0], s) for s in o["sets"] if not s.startswith("own"))
        print(f"| {name or 'online'} | {r['own_F']:.4f} | {r['own_F'] / base['own_F']:.2f} | {r['foreign_F']:.4f} | "
              f"{r['foreign_F'] / o['foreign_F']:.2f} | {worst[0]:.2f} ({worst[1]}) | "
              f"{i['fix_s'] / max(i['updates'], 1):.3f} |")


def learning_curves(results, points, chunks, epochs):
    o = results["original"]
    n_end = 20 * chunks
    print("\n## Learning curves: force RMSE on the held-out frames of the run's phases (eV/A)\n")
    print("| labels | online | offline (" + f"{epochs} epochs) | online / offline |")
    print("| --- | --- | --- | --- |")
    print(f"| 0 | {o['own_F']:.4f} | {o['own_F']:.4f} | |")
    for n in range(20, n_end + 1, 20):
        on = results["online"][n]["own_F"]
        off = results["offline"].get(n, {}).get("own_F")
        print(f"| {n} | {on:.4f} | {'' if off is None else f'{off:.4f}'} | "
              f"{'' if off is None else f'{on / off:.2f}'} |")
    last = f"{points[-1]} x2"
    print(f"| {points[-1]}, {2 * epochs} epochs | | {results['offline'][last]['own_F']:.4f} | "
          f"{results['online'][points[-1]]['own_F'] / results['offline'][last]['own_F']:.2f} |")


def plot(results, points, chunks, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    n = list(range(20, 20 * chunks + 1, 20))
    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    for name in [k for k in results if k not in ("original", "offline")]:
        style = "o-" if name == "online" else "^-." if name.startswith("anchor") else "s--"
        ax[0].plot([0] + n, [results["original"]["own_F"]] + [results[name][k]["own_F"] for k in n], style, label=name)
        ax[1].plot([0] + n, [results["original"]["foreign_F"]] + [results[name][k]["foreign_F"] for k in n], style,
                   label=name)
    ax[0].plot(points, [results["offline"][k]["own_F"] for k in points], "k*", ms=10, label="offline (bound)")
    ax[1].plot(points, [results["offline"][k]["foreign_F"] for k in points], "k*", ms=10, label="offline")
    last = f"{points[-1]} x2"
    ax[0].plot([points[-1]], [results["offline"][last]["own_F"]], "k*", ms=10, mfc="none",
               label="offline, twice the epochs")
    ax[1].plot([points[-1]], [results["offline"][last]["foreign_F"]], "k*", ms=10, mfc="none")
    for a, t in zip(ax, ["held-out, the run's phases", "foreign: strain, surface, vacancy, liquid"]):
        a.set_xlabel("labels")
        a.set_ylabel("force RMSE vs tersoff (eV/A)")
        a.set_title(t)
        a.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--plot":     # redraw from a results.json
        r = json.load(open(sys.argv[2]))["results"]
        r = {name: v if name == "original" else {(int(k) if k.isdigit() else k): x for k, x in v.items()}
             for name, v in r.items()}
        pts = sorted(k for k in r["offline"] if isinstance(k, int))
        plot(r, pts, 6, os.path.join(here, "finetune_bound.png"))
    else:
        main()
