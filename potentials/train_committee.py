#!/usr/bin/env python3
"""Train a committee of three strictly local Si models that know only the crystal.

    .venv/bin/python potentials/train_committee.py --lmp build/lmp

The teacher is the message-passing model potentials/si_mp2.pt: LAMMPS runs NVT
MD of crystalline diamond Si (64 atoms, 300 - 900 K, strains of +-2 %) with
`pair_style torch` and the teacher, and its energies, forces and virials are
the labels.  The students never see a liquid or amorphous configuration.  Three
LocalMBNet members (1 layer, cutoff 4.0 A, float64) differ by their seed (weights,
batch order) and by their data (a bootstrap resample of the training frames).

They are then measured against the teacher on an independent crystal
trajectory (other seed and temperatures), on a hotter crystal (1400 K,
outside the training range) and on liquid frames (teacher MD at 3000 K),
together with the committee force deviation (DeePMD's definition, per atom
sqrt(mean_m |F_m - <F>|^2)), and the card potentials/si_crystal_committee.md
is written with these numbers.  Each exported file is loaded by LAMMPS
(run 0) and its energy and forces compared with the Python evaluation.

Everything runs on one thread (torch and LAMMPS); the training length is a
number of epochs, not a time budget, so a rerun gives the same models.
"""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import warnings  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(here), "python"))
from mltorch import lammps_data  # noqa: E402
from mltorch.export import export, read_metadata  # noqa: E402
from mltorch.graph import build_graph  # noqa: E402
from mltorch.models import LocalMBNet  # noqa: E402
from mltorch.train import batch_predict, errors, fit_energy_shift, prepare, scale_features, train  # noqa: E402

NAME = "si_crystal"
MEMBERS = 3
CUTOFF = 4.0
LATTICE = 5.431
CELLS = 2                      # 2 x 2 x 2 conventional cells: 64 atoms
# the same sizes as si_local (LocalMBNet's defaults), spelled out for the metadata
ARCHITECTURE = dict(cutoff=CUTOFF, n_species=1, n_basis=8, channels=8, hidden=32)

HEAD = """
units           metal
atom_style      atomic
atom_modify     map array
boundary        p p p
lattice         diamond {a}
region          box prism 0 {n} 0 {n} 0 {n} 0 0 0
create_box      1 box
create_atoms    1 box
mass            1 28.0855
neighbor        1.0 bin
timestep        0.001
"""
TORCH = "pair_style      torch threads 1\npair_coeff      * * {model} Si\n"

# (tag, temperature K, steps, isotropic strain, extra strain along z, xy shear strain)
TRAIN_SEGMENTS = [
    ("300 K", 300, 500, 0.0, 0.0, 0.0),
    ("600 K", 600, 500, 0.0, 0.0, 0.0),
    ("900 K", 900, 500, 0.0, 0.0, 0.0),
    ("900 K, -2 % isotropic", 900, 500, -0.02, 0.0, 0.0),
    ("900 K, +2 % isotropic", 900, 500, 0.02, 0.0, 0.0),
    ("600 K, +2 % along z, 2 % xy shear", 600, 500, 0.0, 0.02, 0.02),
]
TRAIN_SEED, TRAIN_EVERY = 4928459, 20
TEST_SEGMENTS = [
    ("450 K", 450, 400, 0.0, 0.0, 0.0),
    ("750 K", 750, 400, 0.0, 0.0, 0.0),
    ("750 K, +1 % isotropic", 750, 400, 0.01, 0.0, 0.0),
    ("hot crystal 1400 K", 1400, 400, 0.0, 0.0, 0.0),
]
TEST_SEED, TEST_EVERY = 8675309, 40
# liquid: melted with the (cheap) Stillinger-Weber potential the teacher was
# trained on, then equilibrated and sampled with the teacher itself
LIQUID_T, LIQUID_SEED, LIQUID_MELT, LIQUID_EQUIL, LIQUID_STEPS, LIQUID_EVERY = 3000, 2718281, 4000, 300, 500, 50


def crystal_script(teacher, segments, seed):
    """MD with the teacher through `segments`; {sample} at the start. Returns the
    script and the last step of each segment (to tag the frames)."""
    lines = [HEAD.format(a=LATTICE, n=CELLS), TORCH.format(model=teacher),
             f"velocity        all create {segments[0][1]} {seed} loop geom", "{sample}"]
    step, ends, box = 0, [], (0.0, 0.0, 0.0)
    for tag, temp, steps, iso, z, shear in segments:
        if (iso, z, shear) != box:
            length = CELLS * LATTICE * (1.0 + iso)
            lz = length * (1.0 + z)
            lines.append(f"change_box      all x final 0 {length:.10g} y final 0 {length:.10g} "
                         f"z final 0 {lz:.10g} xy final {shear * length:.10g} remap units box")
            box = (iso, z, shear)
        lines.append(f"fix             md all nvt temp {temp} {temp} 0.1")
        lines.append(f"run             {steps}")
        step += steps
        ends.append(step)
    return "\n".join(lines) + "\n", ends


def liquid_script(teacher, sw_file):
    t = LIQUID_T
    return "\n".join([
        HEAD.format(a=LATTICE, n=CELLS),
        "pair_style      sw", f"pair_coeff      * * {sw_file} Si",
        f"velocity        all create {t} {LIQUID_SEED} loop geom",
        f"fix             md all nvt temp {t} {t} 0.1", f"run             {LIQUID_MELT}",
        TORCH.format(model=teacher),
        # mean squared displacement under the teacher: diffusion shows the liquid
        "compute         msd all msd", "thermo_style    custom step temp pe c_msd[4]", "thermo          100",
        f"run             {LIQUID_EQUIL}",
        "{sample}", f"run             {LIQUID_STEPS}"]) + "\n"


def check_script(model):
    """One displaced crystal, energy and forces from the model in LAMMPS (run 0)."""
    return "\n".join([HEAD.format(a=LATTICE, n=CELLS), TORCH.format(model=model),
                      "displace_atoms  all random 0.1 0.1 0.1 12345 units box",
                      "{sample}", "run             0"]) + "\n"


def lammps(lmp, script, workdir, every, reuse):
    """lammps_data.run, or reread the frames of an identical earlier run (--reuse)."""
    inp = os.path.join(workdir, "in.data")
    if reuse and os.path.exists(inp) and os.path.exists(os.path.join(workdir, "frames.dump")):
        with open(inp) as f:
            if f.read() == script.replace("{sample}", lammps_data.SAMPLE.format(every=every)):
                print(f"   reusing the frames in {workdir}", flush=True)
                return lammps_data.read(workdir)
    return lammps_data.run(lmp, script, workdir, every=every)


def tag_frames(frames, segments, ends):
    for fr in frames:
        k = next(i for i, e in enumerate(ends) if fr.step <= e)
        fr.tag = segments[k][0]
    return frames


def last_msd(workdir):
    """The last c_msd[4] (A^2) in the thermo output of the liquid run."""
    value, on = None, False
    with open(os.path.join(workdir, "log.data")) as f:
        for line in f:
            words = line.split()
            if words[:1] == ["Step"]:
                on = "c_msd[4]" in words
            elif on and len(words) == 4:
                try:
                    value = float(words[3])
                except ValueError:
                    on = False
    return value


def coordination(frames, r=3.0):
    """Mean number of neighbours within r, and the fraction of 4-fold atoms."""
    counts = []
    for fr in frames:
        g = build_graph(fr.pos, fr.cell, np.zeros(len(fr.types), dtype=np.int64), r, 1)
        counts.append(torch.bincount(g.edge_index[0], minlength=g.n_local)[: g.n_local])
    c = torch.cat(counts).double()
    return float(c.mean()), float((c == 4).double().mean())


def predict(model, samples, batch=16):
    """Per-frame energies [B] and forces [n, 3] of `model`."""
    energies, forces = [], []
    for i in range(0, len(samples), batch):
        chunk = samples[i:i + batch]
        e, f, _ = batch_predict(model, chunk, create_graph=False)
        energies.append(e.detach())
        forces.extend(torch.split(f.detach(), [s.n for s in chunk]))
    return torch.cat(energies), forces


def committee_stats(models, samples):
    """Member errors, error of the committee mean, and the force deviation."""
    preds = [predict(m, samples) for m in models]
    f_ref = torch.cat([s.forces for s in samples])
    e_ref = torch.tensor([s.energy / s.n for s in samples], dtype=torch.float64)
    n = torch.tensor([s.n for s in samples], dtype=torch.float64)
    f_all = torch.stack([torch.cat(f) for _, f in preds])              # [M, atoms, 3]
    e_all = torch.stack([e / n for e, _ in preds])                       # [M, frames]
    rms = lambda x: float(torch.sqrt((x ** 2).mean()))
    f_mean = f_all.mean(0)
    dev = torch.sqrt(((f_all - f_mean) ** 2).sum(-1).mean(0))           # [atoms]
    frame_max = torch.stack([d.max() for d in torch.split(dev, [s.n for s in samples])])
    return {
        "frames": len(samples),
        "ref_force_rms": rms(f_ref),
        "member_force_rmse": [rms(f - f_ref) for f in f_all],
        "member_energy_rmse": [rms(e - e_ref) for e in e_all],
        "mean_force_rmse": rms(f_mean - f_ref),
        "mean_energy_rmse": rms(e_all.mean(0) - e_ref),
        "dev_mean": float(dev.mean()),
        "dev_max": float(dev.max()),
        "frame_max_min": float(frame_max.min()),
        "frame_max_median": float(frame_max.median()),
        "frame_max_max": float(frame_max.max()),
    }


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def segment_text(segments, every):
    return "; ".join(f"{tag} ({steps} steps)" for tag, _, steps, *_ in segments) + \
        f"; a frame every {every} steps"


def separation(t):
    crystal = max(t["test"]["frame_max_max"], t["val"]["frame_max_max"])
    liquid = t["liquid"]["frame_max_min"]
    hot = f"""The 1400 K crystal, hotter than anything trained on but still the crystal, has per-frame
maxima of {t["hot"]["frame_max_min"]:.3f} - {t["hot"]["frame_max_max"]:.3f} eV/A."""
    if crystal < liquid:
        return f"""The largest per-frame maximum on the 300 - 900 K crystal frames is {crystal:.3f} eV/A, the smallest
on the liquid frames {liquid:.3f} eV/A: any threshold in between (max_devi_f-style gating on the
per-frame maximum) separates every configuration the committee knows from every liquid one,
which is the signal uncertainty-gated labelling (ask the teacher only where sigma is large)
needs. {hot}"""
    return f"""The per-frame maxima overlap: up to {crystal:.3f} eV/A on the 300 - 900 K crystal frames, from
{liquid:.3f} eV/A on the liquid frames; the mean deviation still differs by a factor
{t["liquid"]["dev_mean"] / t["test"]["dev_mean"]:.0f} (independent crystal run vs liquid). {hot}"""


def card(r):
    m = r["members"]
    rows = "\n".join(
        f"| `{x['file']}` | {x['seed']} | {x['n_train']} ({x['n_unique']} distinct) | "
        f"`{x['content_hash']}` | `{x['sha256']}` |" for x in m)

    def errs(key, label):
        s = r["sets"][key]
        return (f"| {label} | {s['frames']} | {s['ref_force_rms']:.2f} | "
                + " | ".join(f"{v:.4f}" for v in s["member_force_rmse"])
                + f" | {s['mean_force_rmse']:.4f} | "
                + " / ".join(f"{v * 1000:.1f}" for v in s["member_energy_rmse"]) + " |")

    def devs(key, label):
        s = r["sets"][key]
        return (f"| {label} | {s['dev_mean']:.4f} | {s['frame_max_min']:.4f} | "
                f"{s['frame_max_median']:.4f} | {s['frame_max_max']:.4f} |")

    sets = [("val", "crystal, validation (training run)"), ("test", "crystal, independent run 450 / 750 K"),
            ("hot", "crystal 1400 K (outside training range)"), ("liquid", f"liquid {LIQUID_T} K")]
    checks = "\n".join(f"| `{c['file']}` | {c['lammps_energy']:.6f} | {c['de']:.1e} | {c['df']:.1e} |"
                       for c in r["lammps_check"])
    t = r["sets"]
    return f"""# Model card: {NAME}_c0.pt, {NAME}_c1.pt, {NAME}_c2.pt (committee)

| | |
| --- | --- |
| architecture | LocalMBNet (strictly local many-body network), 3 members of the same architecture |
| elements | Si |
| cutoff | {CUTOFF} A (1 interaction layer: ghost cutoff 1 x {CUTOFF} A + skin) |
| units / dtype | metal / float64 |
| trainable parameters | {r["n_parameters"]} per member (`{json.dumps(ARCHITECTURE)}`) |
| teacher | `potentials/si_mp2.pt`, content hash `{r["teacher_hash"]}` |

| file | seed | training frames (bootstrap) | content hash | file sha256 |
| --- | --- | --- | --- | --- |
{rows}

The content hash (`mltorch-info`) covers the TorchScript code and the parameters and is
what a rerun reproduces; the file sha256 identifies these files as written (torch {torch.__version__}):
the exporter's temporary file name is stored inside the zip archive, so a rerun writes
other bytes.

## Data
Reference ("teacher"): `potentials/si_mp2.pt` (itself trained on Stillinger-Weber Si,
see `si_mp2.md`), evaluated by LAMMPS `pair_style torch`. Generated by LAMMPS from
`potentials/train_committee.py`, 64-atom periodic cells of diamond Si (a = {LATTICE} A),
NVT MD with the teacher, 1 fs, crystal only:

- training run (seed {TRAIN_SEED}): {segment_text(TRAIN_SEGMENTS, TRAIN_EVERY)}:
  {r["n_train_frames"]} frames, split {r["n_pool"]} training pool / {r["n_val"]} validation (random, seed 0);
- independent test run (seed {TEST_SEED}): {segment_text(TEST_SEGMENTS, TEST_EVERY)}:
  {t["test"]["frames"]} crystal frames at 450 / 750 K (the perfect lattice at step 0 left out) and {t["hot"]["frames"]} at 1400 K;
- liquid (never trained on): melted with `pair_style sw` at {LIQUID_T} K for {LIQUID_MELT} steps, then
  the teacher at {LIQUID_T} K, {LIQUID_EQUIL} steps of equilibration and {LIQUID_STEPS} sampled steps:
  {t["liquid"]["frames"]} frames.

Structure check (neighbours within 3.0 A): training frames {r["coord"]["train"][0]:.2f} per atom
({100 * r["coord"]["train"][1]:.0f} % four-fold), 1400 K crystal {r["coord"]["hot"][0]:.2f}
({100 * r["coord"]["hot"][1]:.0f} %), liquid {r["coord"]["liquid"][0]:.2f} ({100 * r["coord"]["liquid"][1]:.0f} %); the liquid's mean squared
displacement over the {LIQUID_EQUIL + LIQUID_STEPS} teacher steps is {r["liquid_msd"]:.1f} A^2 (it diffuses).

## Training
Each member: `torch.manual_seed(seed)` for the weights and the batch order, and its own
bootstrap resample (`random.Random(seed)`, with replacement, as many frames as the pool)
of the training pool; per-atom energy offset and feature scaling fitted on that resample
(`mltorch.train.fit_energy_shift`, `scale_features`); `mltorch.train.train` for
{r["epochs"]} epochs (batch 4, lr 1e-2 -> 3e-4 over the epochs, loss weights
E 10 / F 1 / W 0.1), no time budget, so a rerun gives the same models. One thread for
torch and for LAMMPS. Data generation took {r["seconds_data"] / 60:.1f} min, training
{" / ".join(f"{x['seconds'] / 60:.1f}" for x in m)} min, the whole script
{r["seconds_total"] / 60:.1f} min on 1 CPU core.

## Errors against the teacher
Force components: RMSE in eV/A of each member and of the committee mean; energy RMSE in
meV/atom of each member (the energies of the liquid are far outside what the members saw).

| frames | n | teacher RMS force | c0 | c1 | c2 | committee mean | energy c0 / c1 / c2 |
| --- | --- | --- | --- | --- | --- | --- | --- |
{chr(10).join(errs(k, label) for k, label in sets)}

Validation virial RMSE: {" / ".join(f"{x['val']['virial_rmse_eV_per_atom'] * 1000:.2f}" for x in m)} meV/atom;
training (own resample) forces {" / ".join(f"{x['train']['force_rmse_eV_per_A']:.4f}" for x in m)} eV/A.

## Committee force deviation
Per atom: sigma_i = sqrt(mean_m |F_m,i - <F>_i|^2) over the 3 members (DeePMD's
`max_devi_f` is the per-frame maximum over atoms). In eV/A:

| frames | mean over atoms | per-frame max: min | median | max |
| --- | --- | --- | --- | --- |
{chr(10).join(devs(k, label) for k, label in sets)}

{separation(t)}

## Checked in LAMMPS
Each file loaded by `build/lmp` (`pair_style torch threads 1`, `run 0`, 64 atoms displaced by up to
0.1 A), compared with the Python evaluation of the same parameters:

| file | LAMMPS energy (eV) | abs. energy difference (eV) | max force difference (eV/A) |
| --- | --- | --- | --- |
{checks}

## Meant for
Crystalline diamond Si at 300 - 900 K within about +-2 % of the equilibrium lattice
constant, and above all as a deliberately narrow committee to demonstrate and test
uncertainty-gated (active) learning with ML-TORCH: the members agree on the crystal and
disagree on configurations they never saw.

## Limits
They know only the crystal: liquid, amorphous, surfaces, defects, large strains and
melting are outside their data, and their energies and forces there are wrong (table
above), not merely less accurate. 64-atom cells only (short-wavelength phonons). The
teacher is a small ML model of a classical potential, so the students inherit its errors
(`si_mp2.md`) on top of their own; not for predictions about real Si.

## Reproduce
    .venv/bin/python potentials/train_committee.py --lmp build/lmp
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lmp", required=True, help="LAMMPS executable (build/lmp)")
    ap.add_argument("--teacher", default=os.path.join(here, "si_mp2.pt"))
    ap.add_argument("--epochs", type=int, default=180, help="training epochs per member")
    ap.add_argument("--workdir", default=os.path.join(here, "..", "build", "training", "committee"))
    ap.add_argument("--out", default=here)
    ap.add_argument("--reuse", action="store_true",
                    help="reread the frames of an earlier run with the same LAMMPS inputs")
    args = ap.parse_args()
    warnings.filterwarnings("ignore", category=FutureWarning)   # torch.jit's deprecation notices
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    t_start = time.time()
    lmp = os.path.abspath(args.lmp)
    teacher = os.path.abspath(args.teacher)
    work = os.path.abspath(args.workdir)
    sw_file = os.path.join(os.path.dirname(lmp), "lammps-potentials", "Si.sw")
    os.makedirs(args.out, exist_ok=True)

    print("== frames from LAMMPS with the teacher", flush=True)
    script, ends = crystal_script(teacher, TRAIN_SEGMENTS, TRAIN_SEED)
    train_frames = tag_frames(lammps(lmp, script, os.path.join(work, "train"), TRAIN_EVERY, args.reuse),
                              TRAIN_SEGMENTS, ends)
    script, ends = crystal_script(teacher, TEST_SEGMENTS, TEST_SEED)
    test_frames = tag_frames(lammps(lmp, script, os.path.join(work, "test"), TEST_EVERY, args.reuse),
                             TEST_SEGMENTS, ends)
    liquid_frames = lammps(lmp, liquid_script(teacher, sw_file), os.path.join(work, "liquid"),
                           LIQUID_EVERY, args.reuse)
    msd = last_msd(os.path.join(work, "liquid"))
    hot_frames = [f for f in test_frames if f.tag.startswith("hot")]
    # step 0 is the perfect lattice (zero forces): not a test
    test_frames = [f for f in test_frames if not f.tag.startswith("hot") and f.step > 0]
    seconds_data = time.time() - t_start
    coord = {"train": coordination(train_frames), "hot": coordination(hot_frames),
             "liquid": coordination(liquid_frames)}
    print(f"   {len(train_frames)} training-run, {len(test_frames)} test, {len(hot_frames)} hot-crystal, "
          f"{len(liquid_frames)} liquid frames in {seconds_data:.0f} s; neighbours within 3.0 A "
          f"(mean, four-fold fraction): {coord}; liquid MSD {msd} A^2", flush=True)
    if coord["train"][1] < 0.99 or coord["liquid"][1] > 0.8 or not msd or msd < 2.0:
        sys.exit("the training frames are not all crystalline or the liquid did not melt")

    type2species = {1: 0}
    samples = prepare(train_frames, type2species, CUTOFF, 1)
    idx = list(range(len(samples)))
    random.Random(0).shuffle(idx)
    n_val = len(idx) // 5
    val = [samples[i] for i in idx[:n_val]]
    pool = [samples[i] for i in idx[n_val:]]
    test = prepare(test_frames, type2species, CUTOFF, 1)
    hot = prepare(hot_frames, type2species, CUTOFF, 1)
    liquid = prepare(liquid_frames, type2species, CUTOFF, 1)
    teacher_hash = read_metadata(teacher)["content_hash"]

    models, members = [], []
    for m in range(MEMBERS):
        seed = m
        rng = random.Random(seed)
        picks = [rng.randrange(len(pool)) for _ in pool]
        trn = [pool[i] for i in picks]
        torch.manual_seed(seed)
        model = LocalMBNet(**ARCHITECTURE).double()
        fit_energy_shift(model, trn, 1)
        scale_features(model, trn)
        n_par = sum(p.numel() for p in model.parameters())
        print(f"== member {m}: seed {seed}, {len(trn)} bootstrap frames ({len(set(picks))} distinct), "
              f"{n_par} parameters", flush=True)
        t0 = time.time()
        train(model, trn, val, epochs=args.epochs, seed=seed, log=lambda s: print("  ", s, flush=True))
        seconds = time.time() - t0
        val_metrics, train_metrics = errors(model, val), errors(model, trn)
        name = f"{NAME}_c{m}.pt"
        path = os.path.join(args.out, name)
        extra = {"n_parameters": n_par, "validation": val_metrics,
                 "reference": f"potentials/si_mp2.pt (content hash {teacher_hash}) on crystalline Si only",
                 "committee": {"name": NAME, "member": m, "members": MEMBERS, "seed": seed,
                               "data": "bootstrap resample of the training pool"}}
        meta = export(model, path, cutoff=CUTOFF, elements=["Si"], units="metal", dtype="float64",
                      num_interaction_layers=1, model_type="LocalMBNet", extra=extra,
                      architecture=ARCHITECTURE)
        models.append(model)
        members.append({"file": name, "seed": seed, "n_train": len(trn), "n_unique": len(set(picks)),
                        "content_hash": meta["content_hash"], "sha256": sha256(path), "seconds": seconds,
                        "val": val_metrics, "train": train_metrics,
                        "size_bytes": os.path.getsize(path)})
        print(f"   {name}: validation {json.dumps(val_metrics)}, {seconds:.0f} s", flush=True)

    print("== committee against the teacher", flush=True)
    sets = {"val": committee_stats(models, val), "test": committee_stats(models, test),
            "hot": committee_stats(models, hot), "liquid": committee_stats(models, liquid)}
    for k, s in sets.items():
        print(f"   {k}: {json.dumps(s)}", flush=True)

    print("== each file in LAMMPS (run 0)", flush=True)
    checks = []
    for m, model in enumerate(models):
        name = f"{NAME}_c{m}.pt"
        frames = lammps_data.run(lmp, check_script(os.path.join(os.path.abspath(args.out), name)),
                                 os.path.join(work, f"check_c{m}"), every=1)
        s = prepare(frames[:1], type2species, CUTOFF, 1)
        e, f = predict(model, s)
        checks.append({"file": name, "lammps_energy": frames[0].energy,
                       "de": abs(float(e[0]) - frames[0].energy),
                       "df": float(np.abs(f[0].numpy() - frames[0].forces).max())})
        print(f"   {json.dumps(checks[-1])}", flush=True)
        if checks[-1]["de"] > 1e-6 or checks[-1]["df"] > 1e-6:
            sys.exit(f"{name}: LAMMPS and Python disagree")

    result = {"members": members, "sets": sets, "lammps_check": checks, "coord": coord, "liquid_msd": msd,
              "epochs": args.epochs, "n_parameters": members and sum(p.numel() for p in models[0].parameters()),
              "n_train_frames": len(train_frames), "n_pool": len(pool), "n_val": len(val),
              "teacher_hash": teacher_hash, "seconds_data": seconds_data,
              "seconds_total": time.time() - t_start}
    with open(os.path.join(args.out, f"{NAME}_committee.md"), "w") as f:
        f.write(card(result))
    with open(os.path.join(work, "results.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(f"== done in {result['seconds_total']:.0f} s; card {NAME}_committee.md, "
          f"numbers in {os.path.join(work, 'results.json')}", flush=True)


if __name__ == "__main__":
    main()
