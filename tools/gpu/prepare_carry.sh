#!/usr/bin/env bash
# Prepare what the GPU check (tools/gpu/gpu_check.sh) needs on a machine
# that can download nothing: a trimmed LAMMPS 4 Jul 2026 tree (cmake/, the
# core src/ files, MANYBODY and the MPI stubs, Si.sw) and the nlohmann JSON
# headers, in gpu-carry/ (ignored by git, well under 64 MiB). Run after
# tools/setup.sh. Then carry gpu-carry/ to the GPU machine and run
#   tools/gpu/gpu_check.sh
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
src=${ML_TORCH_CACHE:-$HOME/.cache/ml-torch}/lammps-20260704
out=$here/gpu-carry
[ -f "$src/src/version.h" ] || { echo "ERROR: no LAMMPS tree at $src (run tools/setup.sh first)" >&2; exit 1; }
rm -rf "$out" && mkdir -p "$out/lammps/src" "$out/lammps/potentials" "$out/include"
cp -r "$src/cmake" "$out/lammps/"
find "$src/src" -maxdepth 1 -type f -exec cp {} "$out/lammps/src/" \;
for d in MANYBODY STUBS PLUGIN KOKKOS fmt nlohmann; do
  [ -d "$src/src/$d" ] && cp -r "$src/src/$d" "$out/lammps/src/"
done
cp "$src/potentials/Si.sw" "$out/lammps/potentials/"
[ -f "$src/LICENSE" ] && cp "$src/LICENSE" "$out/lammps/"
cp -r /usr/include/nlohmann "$out/include/"
du -sh "$out"
