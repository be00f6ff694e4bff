#!/usr/bin/env bash
# Add ML-TORCH to a LAMMPS source tree as a package of LAMMPS's own CMake
# build, the way pair_nequip_allegro's and DeePMD-kit's packages go in:
#
#   tools/install_into_lammps.sh /path/to/lammps
#   cmake -S /path/to/lammps/cmake -B build-lammps -C /path/to/lammps/cmake/presets/basic.cmake \
#         -D PKG_ML-TORCH=on -D ML_TORCH_PYTHON=$(command -v python3)
#   cmake --build build-lammps -j 8
#
# (doc/lammps_build.md: LibTorch from pip or a download, the site's MPI and
# compilers, a CUDA KOKKOS build). It copies the package into
# src/ML-TORCH (styles), src/ML-TORCH/{core,mpi,kokkos,cmake} and
# cmake/Modules/Packages/ML-TORCH.cmake, and adds ML-TORCH to the package
# lists of cmake/CMakeLists.txt. Nothing else of the tree changes. Running it
# again replaces the package's files (after an update of ML-TORCH).
# Needs LAMMPS >= 22 Jul 2025; no root.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ $# -ne 1 ] || [ "$1" = "-h" ] || [ "$1" = "--help" ]; then
  echo "usage: tools/install_into_lammps.sh <lammps source tree (with src/ and cmake/)>" >&2
  exit 2
fi
tree=$(cd "$1" && pwd)
lists=$tree/cmake/CMakeLists.txt
if [ ! -f "$tree/src/version.h" ] || [ ! -f "$lists" ]; then
  echo "ERROR: $tree is not a LAMMPS source tree (no src/version.h or cmake/CMakeLists.txt)" >&2
  exit 1
fi
if ! grep -q "add_request(" "$tree/src/neighbor.h"; then
  echo "ERROR: $tree is older than LAMMPS 22 Jul 2025 (no neighbor->add_request()); ML-TORCH needs a newer LAMMPS" >&2
  exit 1
fi
if ! grep -q "^  ML-IAP$" "$lists" || ! grep -q "^foreach(PKG_WITH_INCL .* ML-IAP " "$lists"; then
  echo "ERROR: $lists does not list its packages as expected (STANDARD_PACKAGES and PKG_WITH_INCL with ML-IAP)" >&2
  exit 1
fi

pkg=$tree/src/ML-TORCH
rm -rf "$pkg"
mkdir -p "$pkg/core" "$pkg/mpi" "$pkg/kokkos" "$pkg/cmake"
# the styles (src/plugin is the plugin's entry point, not the package's)
cp "$here"/src/*.cpp "$here"/src/*.h "$pkg/"
cp -r "$here"/src/core/* "$pkg/core/"
cp -r "$here"/src/mpi/* "$pkg/mpi/"
cp "$here"/kokkos/*.cpp "$here"/kokkos/*.h "$pkg/kokkos/"
cp "$here/cmake/MLTorchLibTorch.cmake" "$pkg/cmake/"
cp "$here/cmake/ML-TORCH.cmake" "$tree/cmake/Modules/Packages/ML-TORCH.cmake"
cat > "$pkg/README" <<EOF
ML-TORCH: machine-learned potentials in PyTorch (TorchScript and AOTInductor
models) for LAMMPS: pair_style torch and torch/kk, fix torch/finetune,
compute torch/deviation, the torch/train and write_restart/atomic commands.
Installed by tools/install_into_lammps.sh of ML-TORCH $(git -C "$here" describe --always --dirty 2>/dev/null || echo "(no git)").
Build with LAMMPS's CMake and -D PKG_ML-TORCH=on; needs LibTorch.
EOF

# the package lists of LAMMPS's CMake: a standard package (its styles and
# sources), with a module of its own (Packages/ML-TORCH.cmake)
if ! grep -q "^  ML-TORCH$" "$lists"; then
  sed -i 's/^  ML-IAP$/  ML-IAP\n  ML-TORCH/' "$lists"
fi
if ! grep -q "^foreach(PKG_WITH_INCL .* ML-TORCH " "$lists"; then
  sed -i 's/^\(foreach(PKG_WITH_INCL .* ML-IAP\) /\1 ML-TORCH /' "$lists"
fi
grep -q "^  ML-TORCH$" "$lists" && grep -q "^foreach(PKG_WITH_INCL .* ML-TORCH " "$lists" || {
  echo "ERROR: could not add ML-TORCH to the package lists of $lists" >&2
  exit 1
}
echo "ML-TORCH installed into $tree (src/ML-TORCH, cmake/Modules/Packages/ML-TORCH.cmake)."
echo "Configure LAMMPS with -D PKG_ML-TORCH=on and LibTorch (-D ML_TORCH_PYTHON=<python with torch>,"
echo "-D Torch_DIR=<libtorch>/share/cmake/Torch or -D CMAKE_PREFIX_PATH=<libtorch>)."
