#!/usr/bin/env bash
# Prepare, here, what the GPU check (tools/gpu/gpu_check.sh) needs on a
# machine that can download nothing, in gpu-carry/ (ignored by git):
#   tools/gpu/prepare_carry.sh [--kokkos SOURCE]
# Run after tools/setup.sh; then tools/gpu/build_binaries.sh for the lmp
# that the check runs. What travels (gpu_check.sh --rehearse checks its size
# against the 64 MiB a GPU machine takes) is named in tools/gpu/carry.txt:
#  - sources.tar.xz: a trimmed LAMMPS 4 Jul 2026 tree (cmake/, the core src/
#    files, MANYBODY, KOKKOS and the MPI stubs, Si.sw) and the nlohmann JSON
#    headers, for a build there when no carried lmp fits its torch (the
#    same, unpacked, in gpu-carry/lammps and gpu-carry/include, is what
#    build_binaries.sh builds here; copied with their times kept, so that
#    preparing again rebuilds nothing);
#  - models/: the check's models, packed for export by the GPU machine's own
#    torch (tools/gpu/models.py pack);
#  - wheels/: what the GPU machine's Python lacks for item (e), SevenNet-0
#    imported there: sevenn (its wheel, trimmed to SevenNet-0's checkpoint:
#    the whole is 43 MB), ase, braceexpand and matscipy, at the versions
#    tested here; build_binaries.sh adds Open MPI's wheel;
#  - kokkos.tar.gz (--kokkos SOURCE): a Kokkos source tree for torch/kk on
#    CUDA (tools/gpu/kokkos_cuda.sh): a .tar.gz, a source folder, or a git
#    repository (its develop branch). No Kokkos 5.1 or newer can be had here,
#    so a 4.6 tree is what goes; the carried LAMMPS then asks for Kokkos 4.6
#    instead of 5.1 (its copy of KOKKOS.cmake only, never the product's
#    build).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
kokkos=
if [ "${1:-}" = "--kokkos" ]; then kokkos=${2:?"--kokkos needs a source"}; shift 2; fi
src=${ML_TORCH_CACHE:-$HOME/.cache/ml-torch}/lammps-20260704
out=$here/gpu-carry
[ -f "$src/src/version.h" ] || { echo "ERROR: no LAMMPS tree at $src (run tools/setup.sh first)" >&2; exit 1; }
# gpu-carry/bin (tools/gpu/build_binaries.sh) stays
rm -rf "$out/lammps" "$out/include" "$out/models" "$out/wheels" "$out/kokkos.tar.gz" "$out/sources.tar.xz"
mkdir -p "$out/lammps/src" "$out/lammps/potentials" "$out/include" "$out/wheels"
cp -rp "$src/cmake" "$out/lammps/"
find "$src/src" -maxdepth 1 -type f -exec cp -p {} "$out/lammps/src/" \;
for d in MANYBODY STUBS PLUGIN KOKKOS fmt nlohmann; do
  [ -d "$src/src/$d" ] && cp -rp "$src/src/$d" "$out/lammps/src/"
done
cp -p "$src/potentials/Si.sw" "$out/lammps/potentials/"
[ -f "$src/LICENSE" ] && cp -p "$src/LICENSE" "$out/lammps/"
cp -rp /usr/include/nlohmann "$out/include/"
# (e): SevenNet-0's import there; the other checkpoints, sevenn's own LAMMPS
# sources and its compiled D3 libraries are left out of its wheel
for w in sevenn==0.13.0 ase==3.29.0 braceexpand==0.1.7 matscipy==1.3.1; do
  cp "$("$here/tools/gpu/fetch_wheel.sh" "${w%%==*}" "${w##*==}")" "$out/wheels/"
done
mapfile -t others < <(unzip -Z1 "$out"/wheels/sevenn-*.whl | grep '^sevenn/pretrained_potentials/.*/' \
                      | grep -v '/SevenNet_0__11Jul2024/' | sed 's|/[^/]*$|/*|' | sort -u)
zip -q -d "$out"/wheels/sevenn-*.whl 'sevenn/*.so' 'sevenn/pair_e3gnn/*' "${others[@]}"
[ "$(unzip -Z1 "$out"/wheels/sevenn-*.whl | grep -c 'SevenNet_0__11Jul2024/checkpoint_sevennet_0.pth')" = 1 ] \
  || { echo "ERROR: the trimmed sevenn wheel lost SevenNet-0's checkpoint" >&2; exit 1; }
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
tar -C "$out" -cJf "$out/sources.tar.xz" lammps include
du -sh "$out"
