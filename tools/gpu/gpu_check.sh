#!/usr/bin/env bash
# The GPU check of pair_style torch (device cuda vs cpu), for a machine with
# an NVIDIA GPU, CMake, a C++20 compiler and a Python whose torch wheel
# carries a CUDA LibTorch, and no network. Needs gpu-carry/ from
# tools/gpu/prepare_carry.sh. Builds an MPI-less lmp (LAMMPS MPI stubs) in
# build-gpu/, then runs examples/gpu/in.gpu_check on the CPU and on the GPU
# and prints atom-steps/s of both and the largest force difference.
# With KOKKOS_CUDA_PREFIX set to an installed Kokkos >= 5.1 built for CUDA
# (none can be had on the machines this project is built on), it also
# builds LAMMPS + KOKKOS with pair_style torch/kk in build-gpu-kk/ and runs
# the same input with -k on g 1 -sf kk -pk kokkos newton on neigh half.
#   tools/gpu/gpu_check.sh [--rehearse] [python]      (results also in $OUT if set)
# --rehearse: on a machine without a GPU, everything up to the first CUDA
# call (the carry's size against the 64 MiB a GPU machine takes, the build,
# the CPU run), with the time the GPU machine would need estimated from it.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$here"
rehearse=0
if [ "${1:-}" = "--rehearse" ]; then rehearse=1; shift; fi
py=${1:-python3}
out=${OUT:-$here/gpu-results}
mkdir -p "$out"
jobs=$(nproc)
"$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count())" | tee "$out/env.txt"
nvidia-smi -L 2>/dev/null | tee -a "$out/env.txt" || true
ngpu=$("$py" -c "import torch; print(torch.cuda.device_count())")
if [ "$rehearse" = 0 ] && [ "$ngpu" -lt 1 ]; then
  echo "ERROR: torch ($py) sees no CUDA GPU here; on a machine without one run tools/gpu/gpu_check.sh --rehearse" >&2
  exit 1
fi
[ -d gpu-carry/lammps ] || { echo "ERROR: no gpu-carry/ here: run tools/gpu/prepare_carry.sh (after tools/setup.sh) and carry gpu-carry/" >&2; exit 1; }
if [ "$rehearse" = 1 ]; then
  # what a GPU machine is sent: the working tree (tracked files and untracked
  # ones git does not ignore) and the carried gpu-carry/, 64 MiB in all
  tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s | awk '{s += $1} END {print s + 0}')
  carry=$(du -sb gpu-carry | cut -f1)
  echo "carry: working tree $((tree / 1048576)) MiB + gpu-carry/ $((carry / 1048576)) MiB = $(((tree + carry) / 1048576)) MiB (a GPU machine takes 64 MiB)" | tee -a "$out/env.txt"
  [ $((tree + carry)) -le $((64 * 1048576)) ] || { echo "ERROR: the carry is over 64 MiB" >&2; exit 1; }
fi
build_start=$(date +%s)
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
cmake -S . -B build-gpu "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DLAMMPS_SOURCE_DIR="$here/gpu-carry/lammps" \
      -DML_TORCH_PYTHON="$(command -v "$py")" -DML_TORCH_MPI=OFF -DML_TORCH_BUILD_TESTS=OFF \
      -DML_TORCH_JSON_INCLUDE_DIR="$here/gpu-carry/include" > "$out/cmake.log" 2>&1 \
  || { tail -40 "$out/cmake.log"; exit 1; }
cmake --build build-gpu --target lmp -j "$jobs" > "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
build_s=$(( $(date +%s) - build_start ))
echo "build of lmp (MPI stubs, pair_style torch): $build_s s on $jobs core(s)" | tee -a "$out/env.txt"
if [ "$rehearse" = 1 ]; then
  # the CPU half of the check, then stop before the first CUDA call
  cd examples/gpu
  run_start=$(date +%s)
  ../../build-gpu/lmp -in in.gpu_check -var device cpu -var out "$out" -log "$out/log.cpu" -echo none > /dev/null
  run_s=$(( $(date +%s) - run_start ))
  grep -E "Loop time" "$out/log.cpu" | sed "s/^/cpu: /"
  [ -s "$out/forces.cpu" ] || { echo "ERROR: the CPU run wrote no forces" >&2; exit 1; }
  echo "rehearsal: stops before the first CUDA call (pair_style torch device cuda)." \
       "On a 16-core GPU machine expect about $(( build_s * jobs / 16 + 60 )) s for the build (this build's" \
       "core-seconds over 16 cores, plus a minute) and $run_s s for the CPU run" | tee -a "$out/env.txt"
  exit 0
fi
if [ -n "${KOKKOS_CUDA_PREFIX:-}" ]; then
  cmake -S . -B build-gpu-kk "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DLAMMPS_SOURCE_DIR="$here/gpu-carry/lammps" \
        -DML_TORCH_PYTHON="$(command -v "$py")" -DML_TORCH_MPI=OFF -DML_TORCH_BUILD_TESTS=OFF \
        -DML_TORCH_KOKKOS=ON -DCMAKE_PREFIX_PATH="$KOKKOS_CUDA_PREFIX" \
        -DML_TORCH_JSON_INCLUDE_DIR="$here/gpu-carry/include" > "$out/cmake-kk.log" 2>&1 \
    && cmake --build build-gpu-kk --target lmp -j "$jobs" > "$out/build-kk.log" 2>&1 \
    || { echo "torch/kk build failed: see $out/cmake-kk.log, $out/build-kk.log"; tail -20 "$out/build-kk.log"; }
fi
cd examples/gpu
if [ -x ../../build-gpu-kk/lmp ]; then
  ../../build-gpu-kk/lmp -k on g 1 -sf kk -pk kokkos newton on neigh half -in in.gpu_check -var device kk \
    -var out "$out" -log "$out/log.kk" -echo none > /dev/null || echo "torch/kk run failed (log $out/log.kk)"
fi
for dev in cpu cuda; do
  ../../build-gpu/lmp -in in.gpu_check -var device "$dev" -var out "$out" \
    -log "$out/log.$dev" -echo none > /dev/null
  grep -E "Loop time|Performance" "$out/log.$dev" | sed "s/^/$dev: /"
done
"$py" - "$out" <<'PY'
import os, sys, numpy as np
out = sys.argv[1]
def forces(dev):
    rows = [l.split() for l in open(f"{out}/forces.{dev}") if l[:1].isdigit()]
    a = np.array([[float(x) for x in r] for r in rows if len(r) == 4])
    return a[np.argsort(a[:, 0])][:, 1:]
def rate(dev):
    w = [l.split() for l in open(f"{out}/log.{dev}") if l.startswith("Loop time")][-1]
    return float(w[-2]) * int(w[-4]) / float(w[3])    # atoms x steps / seconds of the last run
fc, fg = forces("cpu"), forces("cuda")
print(f"max |F_cuda - F_cpu| = {np.abs(fc - fg).max():.3e} eV/A (max |F| {np.abs(fc).max():.3f})")
rc, rg = rate("cpu"), rate("cuda")
print(f"atom-steps/s: cpu {rc:.4g}, cuda {rg:.4g}, speed-up {rg / rc:.2f}x")
if os.path.exists(f"{out}/forces.kk"):
    fk = forces("kk")
    print(f"torch/kk on CUDA: max |F_kk - F_cpu| = {np.abs(fc - fk).max():.3e} eV/A, "
          f"atom-steps/s {rate('kk'):.4g}")
PY
if [ -z "${KOKKOS_CUDA_PREFIX:-}" ]; then
  echo "torch/kk on CUDA: skipped (no CUDA Kokkos; set KOKKOS_CUDA_PREFIX to an installed Kokkos >= 5.1 with CUDA)"
fi
