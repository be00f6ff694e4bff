#!/usr/bin/env bash
# A LibTorch built with the pre-C++11 string ABI is refused at configure time
# (its _GLIBCXX_USE_CXX11_ABI=0 would otherwise spread over all of LAMMPS):
# configure against a stand-in LibTorch prefix whose TorchConfig.cmake asks
# for that ABI, and expect the FATAL_ERROR.
#   check_libtorch_abi.sh SOURCE_DIR LAMMPS_SOURCE_DIR
set -euo pipefail
src=$1 lammps=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/torch/share/cmake/Torch" "$work/torch/lib" "$work/torch/include"
echo 'set(TORCH_CXX_FLAGS "-D_GLIBCXX_USE_CXX11_ABI=0")' > "$work/torch/share/cmake/Torch/TorchConfig.cmake"
for l in torch torch_cpu c10; do : > "$work/torch/lib/lib$l.so"; done
out=$(cmake -S "$src" -B "$work/build" -DLAMMPS_SOURCE_DIR="$lammps" -DTorch_DIR="$work/torch/share/cmake/Torch" 2>&1 || true)
out=$(echo "$out" | tr '\n' ' ' | tr -s ' ')    # CMake wraps long messages
echo "$out" | grep -q "uses the pre-C++11 ABI (_GLIBCXX_USE_CXX11_ABI=0)" \
  || { echo "no ABI error; cmake said:"; echo "$out" | tail -20; exit 1; }
echo "pre-C++11-ABI LibTorch refused: $(echo "$out" | grep -o 'LibTorch at [^ ]* uses the pre-C++11 ABI (_GLIBCXX_USE_CXX11_ABI=0)')"
