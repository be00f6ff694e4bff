#!/usr/bin/env python3
"""Advice is code: run the KOKKOS package options that ML-TORCH tells GPU users.

    gpu_advice.py LMP NP

Every place that tells users how to run torch/kk (any text file of the
checkout: the ERROR text in kokkos/pair_torch_kokkos.cpp, doc/, README.md,
bench/, tools/gpu/, examples/) must give the same `-pk kokkos ...`
options and the same `package kokkos ...` line. This test collects them,
fails if any place differs, and then RUNS them with this LAMMPS on NP ranks:

  lmp -k on t 1 -sf kk <the advised -pk options>   (the command line; `g N` is
                                                     `t 1` here: no GPU)
  lmp -k on t 1 -sf kk   + the advised `package kokkos` line in the input
  lmp                    (pair_style torch, no KOKKOS: the reference)

The two KOKKOS runs must be accepted by LAMMPS, run torch/kk and give the
reference energy, pressure and forces (relative 1e-10).
"""

import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
# every text file of the checkout that can tell a user how to run torch/kk
SKIP_DIRS = {".git", "build", "fuzz", "__pycache__"}    # (without git, e.g. in the lane's root)
TEXT = (".cpp", ".h", ".rst", ".md", ".py", ".sh", ".in", ".txt") + ("",)


def places():
    """the checkout's own files: what git tracks or would (ignored build
    products, downloads and installed third-party packages are not ours)"""
    try:
        listed = subprocess.run(["git", "-C", ROOT, "ls-files", "--cached", "--others", "--exclude-standard"],
                                capture_output=True, text=True, check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        listed = []
        for top, dirs, files in os.walk(ROOT):
            dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.startswith(("gpu-", "build-", ".venv"))]
            listed += [os.path.relpath(os.path.join(top, name), ROOT) for name in files]
    for rel in listed:
        name = os.path.basename(rel)
        if rel == os.path.join("unittest", "kokkos", "gpu_advice.py") or not os.path.isfile(os.path.join(ROOT, rel)):
            continue
        if os.path.splitext(name)[1] in TEXT or name.startswith("in."):
            yield rel


OPTION_WORDS = r"((?:\s+(?:newton|neigh|comm|gpu/aware|neigh/qeq|binsize)\s+[a-z0-9/.]+)+)"


def advice():
    """{'-pk': {options: [places]}, 'package': {...}} over every place."""
    found = {"-pk": {}, "package": {}}
    for rel in places():
        try:
            text = open(os.path.join(ROOT, rel), encoding="utf-8").read()
        except (UnicodeDecodeError, OSError):
            continue
        # the C++ ERROR text is split over string literals: join them
        text = re.sub(r'"\s*\n\s*"', "", text)
        for kind, pattern in (("-pk", r"-pk kokkos" + OPTION_WORDS),
                              ("package", r"(?<![-\w])package kokkos" + OPTION_WORDS)):
            for m in re.finditer(pattern, text):
                words = " ".join(m.group(1).split()).rstrip(".")
                found[kind].setdefault(words, []).append(rel)
    return found


INPUT = """units metal
atom_modify map array
newton on
{package}
lattice diamond 5.431
region box block 0 3 0 3 0 3
create_box 1 box
create_atoms 1 box
mass 1 28.0855
displace_atoms all random 0.1 0.1 0.1 4928 units box
pair_style torch
pair_coeff * * {model} Si
thermo_style custom step pe press
thermo_modify format float %.15g
run 0 post no
print "STYLE $(pe:%.15g) $(press:%.15g)" universe yes
write_dump all custom {dump} id fx fy fz modify sort id format float %.15g
"""


def run(lmp, np, args, package, tmp, tag):
    dump = os.path.join(tmp, f"forces.{tag}")
    inp = os.path.join(tmp, f"in.{tag}")
    with open(inp, "w") as f:
        f.write(INPUT.format(package=package, model=os.path.join(ROOT, "potentials", "si_local.pt"),
                             dump=dump))
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(np), lmp] + args + \
        ["-in", inp, "-log", os.path.join(tmp, f"log.{tag}"), "-screen", "none"]
    env = dict(os.environ, OMP_NUM_THREADS="1", OMP_PROC_BIND="false")
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    log = open(os.path.join(tmp, f"log.{tag}")).read() if os.path.exists(
        os.path.join(tmp, f"log.{tag}")) else ""
    if p.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)} exited with {p.returncode}:\n{log[-3000:]}\n{p.stderr[-2000:]}")
    style = re.search(r"^\s*(\d+)\s+atoms", log, re.M)
    m = re.search(r"^STYLE (\S+) (\S+)", log, re.M)
    forces = sorted(tuple(map(float, line.split())) for line in open(dump).read().splitlines()[9:])
    kokkos_style = "torch/kk" in log
    return float(m.group(1)), float(m.group(2)), forces, kokkos_style, style


def close(a, b, tol=1e-10):
    return abs(a - b) <= tol * max(1.0, abs(a), abs(b))


def main():
    lmp, np = sys.argv[1], int(sys.argv[2])
    found = advice()
    for kind, ways in found.items():
        if len(ways) != 1:
            sys.exit(f"FAIL: the places that advise '{kind} kokkos' disagree: {ways}")
    pk = next(iter(found["-pk"]))
    package = next(iter(found["package"]))
    print(f"advised: -pk kokkos {pk}  (in {sorted(set(found['-pk'][pk]))})")
    print(f"advised: package kokkos {package}  (in {sorted(set(found['package'][package]))})")
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR", "/tmp")) as tmp:
        ref = run(lmp, np, [], "", tmp, "torch")
        runs = {"-pk": run(lmp, np, ["-k", "on", "t", "1", "-sf", "kk", "-pk", "kokkos"] + pk.split(),
                           "", tmp, "pk"),
                "package": run(lmp, np, ["-k", "on", "t", "1", "-sf", "kk"], "package kokkos " + package,
                               tmp, "package")}
        if ref[3]:
            sys.exit("FAIL: the reference run used torch/kk")
        for name, r in runs.items():
            if not r[3]:
                sys.exit(f"FAIL: the {name} run did not use pair_style torch/kk")
            if not (close(r[0], ref[0]) and close(r[1], ref[1])):
                sys.exit(f"FAIL: {name}: energy/pressure {r[0]} {r[1]} vs pair_style torch {ref[0]} {ref[1]}")
            worst = max(abs(a - b) for fa, fb in zip(r[2], ref[2]) for a, b in zip(fa[1:], fb[1:]))
            if len(r[2]) != len(ref[2]) or worst > 1e-10:
                sys.exit(f"FAIL: {name}: forces differ from pair_style torch by {worst:.3g} eV/A")
            print(f"{name}: accepted, torch/kk on {np} rank(s): energy {r[0]:.12g} eV, "
                  f"forces within {worst:.2g} eV/A of pair_style torch")
    print("PASS")


if __name__ == "__main__":
    main()
