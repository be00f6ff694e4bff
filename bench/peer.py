"""Peers' LAMMPS styles built at benchmark time as LAMMPS plugins, outside the
repository (in the ML-TORCH cache), and loaded into our build/lmp with
`plugin load`: the plugin entry point, the compile and the link, shared by
bench/sevennet.py (SevenNet's pair_e3gnn, from the sevenn wheel) and
bench/nequip.py (pair_nequip_allegro, from a checkout the user gives)."""

import os
import re
import subprocess
import tempfile
import time

import numpy as np

# a LAMMPS plugin entry point registering one pair style
ENTRY = r"""
#include "lammpsplugin.h"
#include "version.h"
#include "{header}"
using namespace LAMMPS_NS;
static Pair *creator(LAMMPS *lmp) {{ return new {cls}(lmp); }}
extern "C" void lammpsplugin_init(void *lmp, void *handle, void *regfunc)
{{
  lammpsplugin_t plugin;
  auto register_plugin = (lammpsplugin_regfunc) regfunc;
  plugin.version = LAMMPS_VERSION;
  plugin.style = "pair";
  plugin.name = "{name}";
  plugin.info = "{info}";
  plugin.author = "{author}";
  plugin.creator.v1 = (lammpsplugin_factory1 *) &creator;
  plugin.handle = handle;
  (*register_plugin)(&plugin, lmp);
}}
"""


def cache_dir(name):
    base = os.environ.get("ML_TORCH_CACHE", os.path.expanduser("~/.cache/ml-torch"))
    return os.path.join(base, name)


def lammps_source(build):
    with open(os.path.join(build, "CMakeCache.txt")) as f:
        for line in f:
            if line.startswith("LAMMPS_SOURCE_DIR:"):
                return line.split("=", 1)[1].strip()
    raise SystemExit(f"LAMMPS_SOURCE_DIR not found in {build}/CMakeCache.txt")


def build_plugin(out, build, sources, include, style, defines=()):
    """`out`/STYLEplugin.so from the peer's `sources` (headers in `include`) and
    an entry point for `style` (a dict: name, cls, header, info, author),
    compiled with mpicxx against LAMMPS's headers and the project's torch;
    kept in `out` once built."""
    import torch
    lib = os.path.join(out, f"{style['name']}plugin.so")
    if os.path.exists(lib):
        print(f"  cached: {lib}", flush=True)
        return lib
    os.makedirs(out, exist_ok=True)
    entry = os.path.join(out, f"{style['name']}plugin.cpp")
    with open(entry, "w") as f:
        f.write(ENTRY.format(**style))
    tdir = os.path.dirname(torch.__file__)
    flags = ["-O3", "-fPIC", "-std=c++20", "-D_GLIBCXX_USE_CXX11_ABI=1", "-DLAMMPS_SMALLBIG",
             "-DMPICH_SKIP_MPICXX", "-DOMPI_SKIP_MPICXX", "-D_MPICC_H", *defines,
             f"-I{lammps_source(build)}/src", f"-I{include}", "-isystem", f"{tdir}/include",
             "-isystem", f"{tdir}/include/torch/csrc/api/include", "-w"]
    objs, t0 = [], time.time()
    for cpp in (*sources, entry):
        obj = os.path.join(out, os.path.basename(cpp) + ".o")
        t = time.time()
        subprocess.run(["mpicxx", *flags, "-c", cpp, "-o", obj], check=True)
        print(f"  compiled {os.path.basename(cpp)} in {time.time() - t:.0f} s", flush=True)
        objs.append(obj)
    subprocess.run(["mpicxx", "-shared", "-o", lib + ".tmp", *objs, f"-L{tdir}/lib",
                    f"-Wl,-rpath,{tdir}/lib", "-ltorch", "-ltorch_cpu", "-lc10"], check=True)
    os.replace(lib + ".tmp", lib)
    print(f"  built {lib} in {time.time() - t0:.0f} s", flush=True)
    return lib


def run_input(lmp, text, ranks, tmp):
    """LAMMPS input `text` on `ranks` ranks in a new folder under `tmp`, one
    thread per rank: (exit code, stdout + stderr, the log's text, the folder)."""
    work = tempfile.mkdtemp(dir=tmp)
    with open(os.path.join(work, "in.bench"), "w") as f:
        f.write(text)
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(ranks), lmp, "-in",
           "in.bench", "-log", "log.bench", "-screen", "none", "-nocite"]
    p = subprocess.run(cmd, cwd=work, env=dict(os.environ, OMP_NUM_THREADS="1"),
                       capture_output=True, text=True, timeout=3600)
    path = os.path.join(work, "log.bench")
    log = open(path).read() if os.path.exists(path) else ""
    return p.returncode, p.stdout + p.stderr, log, work


def results(work, log):
    """Seconds per step of the last run in a LAMMPS `log` (text), the energy of
    its step 0 and the forces of `work`/forces.dump (the benchmarks' inputs
    write it after `run 0`)."""
    loops = re.findall(r"Loop time of ([0-9.e+-]+) on \d+ procs for (\d+) steps", log)
    t, n = float(loops[-1][0]), int(loops[-1][1])
    pe = re.findall(r"^\s+0\s+(-?[0-9.e+-]+)\s*$", log, re.M)
    with open(os.path.join(work, "forces.dump")) as f:
        forces = np.array([[float(w) for w in line.split()[1:4]] for line in f.read().splitlines()[9:]])
    return {"step": t / n, "pe": float(pe[0]), "forces": forces}
