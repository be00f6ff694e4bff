#!/usr/bin/env bash
# The GPU check of pair_style torch (device cuda vs cpu), for a machine with
# an NVIDIA GPU, CMake, a C++20 compiler and a Python whose torch wheel
# carries a CUDA LibTorch, and no network. Needs gpu-carry/ from
# tools/gpu/prepare_carry.sh. Builds an MPI-less lmp (LAMMPS MPI stubs) in
# build-gpu/, then runs examples/gpu/in.gpu_check on the CPU and on the GPU
# and prints atom-steps/s of both and the largest force difference.
#   tools/gpu/gpu_check.sh [python]      (results also in $OUT if set)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$here"
py=${1:-python3}
out=${OUT:-$here/gpu-results}
mkdir -p "$out"
jobs=$(nproc)
"$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count())" | tee "$out/env.txt"
nvidia-smi -L 2>/dev/null | tee -a "$out/env.txt" || true
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
cmake -S . -B build-gpu "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DLAMMPS_SOURCE_DIR="$here/gpu-carry/lammps" \
      -DML_TORCH_PYTHON="$(command -v "$py")" -DML_TORCH_MPI=OFF -DML_TORCH_BUILD_TESTS=OFF \
      -DML_TORCH_JSON_INCLUDE_DIR="$here/gpu-carry/include" > "$out/cmake.log" 2>&1 \
  || { tail -40 "$out/cmake.log"; exit 1; }
cmake --build build-gpu --target lmp -j "$jobs" > "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
cd examples/gpu
for dev in cpu cuda; do
  ../../build-gpu/lmp -in in.gpu_check -var device "$dev" -var out "$out" \
    -log "$out/log.$dev" -echo none > /dev/null
  grep -E "Loop time|Performance" "$out/log.$dev" | sed "s/^/$dev: /"
done
"$py" - "$out" <<'PY'
import sys, numpy as np
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
PY
