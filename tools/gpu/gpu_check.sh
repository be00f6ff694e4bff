#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU, CMake, a C++20 compiler
# and a Python whose torch wheel carries a CUDA LibTorch, and no network.
# Needs gpu-carry/ from tools/gpu/prepare_carry.sh. In this order, so that a
# run cut short still answers the first questions (report.txt in the
# results):
#   - builds an MPI-less lmp (LAMMPS MPI stubs) in build-gpu/ and exports
#     the carried models with this machine's torch (tools/gpu/models.py);
#   - (a) pair_style torch device cuda against the CPU on
#     examples/gpu/in.gpu_check: largest force difference, atom-steps/s;
#   - with a CUDA Kokkos (KOKKOS_CUDA_PREFIX, an installed one, or the source
#     that prepare_carry.sh --kokkos carries, built by tools/gpu/kokkos_cuda.sh)
#     builds LAMMPS + KOKKOS + torch/kk in build-gpu-kk/ (compiled by Kokkos's
#     nvcc_wrapper) and runs (b) forces, per-atom energy and virial and
#     atom-steps/s at 4k to 262k atoms, (d) fine-tuning under torch/kk with
#     comm device, (f) compute torch/deviation (tools/gpu/kk_items.sh);
#   - (c) two ranks and (e) SevenNet-0 are reported as not run (no MPI and no
#     sevenn wheel carried yet).
#   tools/gpu/gpu_check.sh [--rehearse [--kk-link]] [python]      (results also in $OUT if set)
# --rehearse: on a machine without a GPU, everything up to the first CUDA
# call (the carry's size against the 64 MiB a GPU machine takes, the build,
# the model export, the CPU run), with the time the GPU machine would need
# estimated from it; with a carried Kokkos also its CUDA build and the
# torch/kk units compiled against it by nvcc_wrapper (--kk-link: the whole
# torch/kk lmp, linked); with the OpenMP KOKKOS lane (tools/setup.sh
# --kokkos) the comparisons of (b), (d), (f) against its torch/kk.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$here"
rehearse=0 kk_link=0
if [ "${1:-}" = "--rehearse" ]; then rehearse=1; shift; fi
if [ "${1:-}" = "--kk-link" ]; then kk_link=1; shift; fi
# the Python, as an absolute path (the script changes folders; a venv's link is kept)
py=$(command -v "${1:-python3}") && py=$(realpath -s "$py") \
  || { echo "ERROR: no Python '${1:-python3}'" >&2; exit 1; }
out=${OUT:-$here/gpu-results}
mkdir -p "$out"
jobs=$(nproc)
command -v nvcc >/dev/null || export PATH=$PATH:/usr/local/cuda/bin    # Kokkos's nvcc_wrapper calls nvcc
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
      -DML_TORCH_PYTHON="$py" -DML_TORCH_MPI=OFF -DML_TORCH_BUILD_TESTS=OFF \
      -DML_TORCH_JSON_INCLUDE_DIR="$here/gpu-carry/include" > "$out/cmake.log" 2>&1 \
  || { tail -40 "$out/cmake.log"; exit 1; }
cmake --build build-gpu --target lmp -j "$jobs" > "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
build_s=$(( $(date +%s) - build_start ))
echo "build of lmp (MPI stubs, pair_style torch): $build_s s on $jobs core(s)" | tee -a "$out/env.txt"
# the models, exported here by this torch (a TorchScript file written by a
# newer torch may not load in an older one)
"$py" tools/gpu/models.py unpack gpu-carry/models "$here/build-gpu-models" 2>&1 | grep -v -i "warn" | tee -a "$out/env.txt"
[ -f "$here/build-gpu-models/si_mp2_perturbed.pt" ] || { echo "ERROR: the models were not exported" >&2; exit 1; }
export ML_TORCH_GPU_MODELS=$here/build-gpu-models
# torch/kk: a CUDA Kokkos, then LAMMPS + KOKKOS compiled by its nvcc_wrapper.
# lmp leaves what LibTorch's libraries need of theirs to them
# (--allow-shlib-undefined): nvcc puts the CUDA toolkit's library folder
# first, which can hold an older NCCL than the torch wheel's, and a machine
# without a GPU driver has no libcuda.so.1 to link against.
kk_configure() {
  cmake -S . -B build-gpu-kk "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DLAMMPS_SOURCE_DIR="$here/gpu-carry/lammps" \
        -DCMAKE_CXX_COMPILER="$KOKKOS_CUDA_PREFIX/bin/nvcc_wrapper" -DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined \
        -DML_TORCH_PYTHON="$py" -DML_TORCH_MPI=OFF -DML_TORCH_BUILD_TESTS=OFF \
        -DML_TORCH_KOKKOS=ON -DCMAKE_PREFIX_PATH="$KOKKOS_CUDA_PREFIX" \
        -DML_TORCH_JSON_INCLUDE_DIR="$here/gpu-carry/include" > "$out/cmake-kk.log" 2>&1
}
kk_kokkos() {
  if [ -z "${KOKKOS_CUDA_PREFIX:-}" ] && [ -f gpu-carry/kokkos.tar.gz ]; then
    tools/gpu/kokkos_cuda.sh gpu-carry/kokkos.tar.gz "$here/build-gpu-kokkos" "$jobs" 2>&1 | tee "$out/kokkos.log" \
      && KOKKOS_CUDA_PREFIX=$here/build-gpu-kokkos \
      || echo "the CUDA Kokkos build failed (log $out/kokkos.log): torch/kk is left out"
  fi
}
if [ "$rehearse" = 1 ]; then kk_kokkos; fi
if [ "$rehearse" = 1 ] && [ -n "${KOKKOS_CUDA_PREFIX:-}" ]; then
  kk_start=$(date +%s)
  kk_configure || { tail -30 "$out/cmake-kk.log"; exit 1; }
  if [ "$kk_link" = 1 ] || ! command -v ninja >/dev/null; then
    targets=(lmp)
  else
    # the torch/kk units (with LibTorch's and KOKKOS's headers, the longest)
    mapfile -t targets < <(ninja -C build-gpu-kk -t targets all | sed -n 's|^\(.*/kokkos/[a-z_]*kokkos[a-z_]*\.cpp\.o\):.*|\1|p')
    [ "${#targets[@]}" = 3 ] || { echo "ERROR: expected the 3 torch/kk units in build-gpu-kk, found ${#targets[@]}" >&2; exit 1; }
  fi
  cmake --build build-gpu-kk -j "$jobs" --target "${targets[@]}" > "$out/build-kk.log" 2>&1 \
    || { grep -m 20 -E "error|FAILED" "$out/build-kk.log"; exit 1; }
  if [ "$kk_link" = 1 ]; then
    # the linked lmp loads (the CUDA driver's stub library standing in for
    # the driver) and lists torch/kk; -k on g 1 stops at the first CUDA call
    mkdir -p build-gpu-kk/stubs
    ln -sf "$(dirname "$(command -v nvcc)")/../lib64/stubs/libcuda.so" build-gpu-kk/stubs/libcuda.so.1
    help=$(LD_LIBRARY_PATH=$here/build-gpu-kk/stubs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} build-gpu-kk/lmp -h)
    grep -E "Kokkos library version|KOKKOS package API" <<< "$help" | tee -a "$out/env.txt"
    grep -qw "torch/kk" <<< "$help" || { echo "ERROR: the torch/kk lmp has no pair_style torch/kk" >&2; exit 1; }
  fi
  kk_s=$(( $(date +%s) - kk_start ))
  echo "torch/kk with CUDA Kokkos: ${targets[*]##*/} built by nvcc_wrapper in $kk_s s on $jobs core(s)" \
    | tee -a "$out/env.txt"
  [ "$kk_link" = 1 ] && echo "On a 16-core GPU machine expect about $(( kk_s * jobs / 16 + 60 )) s for the torch/kk build" \
    | tee -a "$out/env.txt"
fi
if [ "$rehearse" = 1 ]; then
  # the CPU half of the check, then stop before the first CUDA call
  cd examples/gpu
  run_start=$(date +%s)
  ../../build-gpu/lmp -in in.gpu_check -var device cpu -var out "$out" -var models "$ML_TORCH_GPU_MODELS" \
    -log "$out/log.cpu" -echo none > /dev/null
  run_s=$(( $(date +%s) - run_start ))
  grep -E "Loop time" "$out/log.cpu" | sed "s/^/cpu: /"
  [ -s "$out/forces.cpu" ] || { echo "ERROR: the CPU run wrote no forces" >&2; exit 1; }
  # the comparisons of (b), (d), (f), against torch/kk of the OpenMP lane where there is one
  if [ -x "$here/build/kokkos-current/lmp-run" ]; then
    rm -rf "$out/lane"
    "$here/tools/gpu/kk_items.sh" "$out/lane" "$here/build-gpu/lmp" "$here/build/kokkos-current/lmp-run" \
      "-k on t 1 -sf kk -pk kokkos newton on neigh half" "$py" "3 4" \
      && [ "$(grep -c "largest difference\|thermo columns" "$out/lane/report.txt")" = 6 ] \
      || { echo "ERROR: the comparisons of torch/kk (OpenMP lane) with the CPU failed or did not all run" >&2; exit 1; }
  fi
  echo "rehearsal: stops before the first CUDA call (pair_style torch device cuda)." \
       "On a 16-core GPU machine expect about $(( build_s * jobs / 16 + 60 )) s for the build (this build's" \
       "core-seconds over 16 cores, plus a minute) and $run_s s for the CPU run" | tee -a "$out/env.txt"
  exit 0
fi
# (a) pair_style torch device cuda against the CPU, first: a run cut short still answers it
cd examples/gpu
for dev in cpu cuda; do
  ../../build-gpu/lmp -in in.gpu_check -var device "$dev" -var out "$out" -var models "$ML_TORCH_GPU_MODELS" \
    -log "$out/log.$dev" -echo none > /dev/null
  grep -E "Loop time|Performance" "$out/log.$dev" | sed "s/^/$dev: /"
done
compare() {
  echo "$1: max |F_$1 - F_cpu| over max |F|: $("$py" "$here/tools/gpu/compare.py" forces "$out/forces.cpu" "$out/forces.$1");" \
       "cpu and $1: $("$py" "$here/tools/gpu/compare.py" speed "$out/log.cpu" "$out/log.$1")"
}
compare cuda | tee -a "$out/report.txt"
# (b) torch/kk on CUDA
cd "$here"
kk_kokkos
if [ -n "${KOKKOS_CUDA_PREFIX:-}" ]; then
  kk_start=$(date +%s)
  kk_configure && cmake --build build-gpu-kk --target lmp -j "$jobs" > "$out/build-kk.log" 2>&1 \
    || { echo "torch/kk build failed: see $out/cmake-kk.log, $out/build-kk.log"; tail -20 "$out/build-kk.log"; }
  echo "torch/kk build: $(( $(date +%s) - kk_start )) s on $jobs cores" | tee -a "$out/env.txt"
fi
if [ -x build-gpu-kk/lmp ]; then
  (cd examples/gpu && ../../build-gpu-kk/lmp -k on g 1 -sf kk -pk kokkos newton on neigh half -in in.gpu_check \
     -var device kk -var out "$out" -var models "$ML_TORCH_GPU_MODELS" -log "$out/log.kk" -echo none > /dev/null) \
    && compare kk | tee -a "$out/report.txt" || echo "torch/kk run failed (log $out/log.kk)"
  # (b), (d), (f): torch/kk against the CPU at 4k to 262k atoms, fine-tuning, committee deviation
  tools/gpu/kk_items.sh "$out" build-gpu/lmp build-gpu-kk/lmp "-k on g 1 -sf kk -pk kokkos newton on neigh half" "$py" \
    || echo "torch/kk: see the comparisons over the tolerance above"
else
  echo "torch/kk on CUDA: skipped (no CUDA Kokkos: carry one with tools/gpu/prepare_carry.sh --kokkos SOURCE, or set KOKKOS_CUDA_PREFIX)" \
    | tee -a "$out/report.txt"
fi
echo "(c) 2 ranks on the GPU: not run (no MPI library on the GPU machine, and none carried yet)" | tee -a "$out/report.txt"
echo "(e) imported SevenNet-0 under torch/kk: not run (the sevenn wheel is not carried yet)" | tee -a "$out/report.txt"
