#!/usr/bin/env bash
# Prepare what the GPU check (tools/gpu/gpu_check.sh) needs on a machine
# that can download nothing: a trimmed LAMMPS 4 Jul 2026 tree (cmake/, the
# core src/ files, MANYBODY and the MPI stubs, Si.sw), the nlohmann JSON
# headers and the check's models (tools/gpu/models.py pack), in gpu-carry/ (ignored by git, well under 64 MiB). Run after
# tools/setup.sh. Then carry gpu-carry/ to the GPU machine and run
#   tools/gpu/gpu_check.sh
#   tools/gpu/prepare_carry.sh [--kokkos SOURCE]
# --kokkos SOURCE: also carry a Kokkos source tree for torch/kk on CUDA
# (gpu-carry/kokkos.tar.gz, which gpu_check.sh builds with
# tools/gpu/kokkos_cuda.sh): a .tar.gz, a source folder, or a git
# repository (its develop branch). No Kokkos 5.1 or newer can be had here,
# so a 4.6 tree is what goes; the carried LAMMPS then asks for Kokkos 4.6
# instead of 5.1 (its copy of KOKKOS.cmake only, never the product's build).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
kokkos=
if [ "${1:-}" = "--kokkos" ]; then kokkos=${2:?"--kokkos needs a source"}; shift 2; fi
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
# the check's models, packed for export by the GPU machine's own torch
"${ML_TORCH_PYTHON:-$here/.venv/bin/python}" "$here/tools/gpu/models.py" pack "$out/models" \
  "$here/potentials/si_local.pt" "$here/potentials/si_mp2.pt" "$here/unittest/models/si_mp2_perturbed.pt" 2>&1 \
  | grep -v -i "warn"
if [ -n "$kokkos" ]; then
  if [ -f "$kokkos" ]; then
    cp "$kokkos" "$out/kokkos.tar.gz"
  elif git -C "$kokkos" rev-parse --git-dir >/dev/null 2>&1; then
    git -C "$kokkos" archive --format=tar.gz --prefix=kokkos/ develop > "$out/kokkos.tar.gz"
  elif [ -f "$kokkos/core/src/Kokkos_Core.hpp" ]; then
    tar -C "$(dirname "$kokkos")" -czf "$out/kokkos.tar.gz" "$(basename "$kokkos")"
  else
    echo "ERROR: --kokkos $kokkos is no .tar.gz, Kokkos source folder or git repository" >&2; exit 1
  fi
  major=$(tar -xzOf "$out/kokkos.tar.gz" --wildcards '*/CMakeLists.txt' 2>/dev/null \
          | sed -n 's/^set(Kokkos_VERSION_MAJOR \([0-9]*\))/\1/p' | head -1)
  [ -n "$major" ] || { echo "ERROR: no Kokkos version in $kokkos" >&2; exit 1; }
  if [ "$major" -lt 5 ]; then
    kcmake=$out/lammps/cmake/Modules/Packages/KOKKOS.cmake
    sed -i 's/find_package(Kokkos 5.1.0 REQUIRED CONFIG)/find_package(Kokkos 4.6 REQUIRED CONFIG)/' "$kcmake"
    grep -q 'find_package(Kokkos 4.6 REQUIRED CONFIG)' "$kcmake" \
      || { echo "ERROR: the carried LAMMPS's KOKKOS.cmake asks for no Kokkos 5.1.0 to relax" >&2; exit 1; }
  fi
  echo "Kokkos source: $out/kokkos.tar.gz ($(du -h "$out/kokkos.tar.gz" | cut -f1), major version $major)"
fi
du -sh "$out"
