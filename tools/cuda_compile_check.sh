#!/usr/bin/env bash
# CUDA compile check of pair_style torch/kk (no GPU and no CUDA build of the
# Kokkos library exist here, so nothing is linked or run):
# kokkos/pair_torch_kokkos.cpp, pair_torch_kokkos_halo.cpp and torch_graph_kokkos.cpp are compiled by nvcc for sm_90 (H100/H200)
# against the Kokkos 5.2 headers of the current KOKKOS lane's Debian 13 root,
# configured for the CUDA back end, and the LAMMPS 4 Jul 2026 KOKKOS headers,
# both instantiations (torch/kk/device on Kokkos::Cuda, torch/kk/host).
#
#   tools/cuda_compile_check.sh KOKKOS_CURRENT_BUILD_DIR LAMMPS_SOURCE_DIR
#
# The Kokkos headers Debian ships are configured for OpenMP; a copy in
# KOKKOS_CURRENT_BUILD_DIR/cuda-check is switched to Serial + CUDA (Hopper)
# the way Kokkos's own CMake would write them: KokkosCore_config.h, the
# back-end declaration/forward/setup headers, and desul's atomics config.
set -euo pipefail
kdir=${1:?usage: $0 KOKKOS_CURRENT_BUILD_DIR LAMMPS_SOURCE_DIR}
lammps=${2:?usage: $0 KOKKOS_CURRENT_BUILD_DIR LAMMPS_SOURCE_DIR}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
[ -x "$nvcc" ] || { echo "ERROR: nvcc not found (set NVCC)" >&2; exit 1; }

work=$kdir/cuda-check
rm -rf "$work" && mkdir -p "$work"
# a copy of the root's Kokkos headers, through the lane's in-root wrapper
"$kdir/in-root" tar -C /usr/include -chf - kokkos | tar -C "$work" -xf -
[ -f "$work/kokkos/KokkosCore_config.h" ] || { echo "ERROR: no Kokkos headers in the Debian 13 root" >&2; exit 1; }
src_inc=/usr/include/kokkos
k=$work/kokkos
sed -i -e 's|^#define KOKKOS_ENABLE_OPENMP$|/* OpenMP off for the CUDA check */|' \
       -e 's|^#define KOKKOS_IMPL_BUILD_SHARED_LIBS$||' \
       -e 's|^/\* #undef KOKKOS_ENABLE_SERIAL \*/$|#define KOKKOS_ENABLE_SERIAL|' \
       -e 's|^/\* #undef KOKKOS_ENABLE_CUDA \*/$|#define KOKKOS_ENABLE_CUDA|' \
       -e 's|^/\* #undef KOKKOS_ARCH_HOPPER \*/$|#define KOKKOS_ARCH_HOPPER|' \
       -e 's|^/\* #undef KOKKOS_ARCH_HOPPER90 \*/$|#define KOKKOS_ARCH_HOPPER90|' "$k/KokkosCore_config.h"
for m in KOKKOS_ENABLE_SERIAL KOKKOS_ENABLE_CUDA KOKKOS_ARCH_HOPPER KOKKOS_ARCH_HOPPER90; do
  grep -q "^#define $m$" "$k/KokkosCore_config.h" \
    || { echo "ERROR: could not switch on $m in KokkosCore_config.h (layout changed?)" >&2; exit 1; }
done
! grep -q "^#define KOKKOS_ENABLE_OPENMP$" "$k/KokkosCore_config.h"
sed -i 's|#include <decl/Kokkos_Declare_OPENMP.hpp>|#include <decl/Kokkos_Declare_SERIAL.hpp>\n#include <decl/Kokkos_Declare_CUDA.hpp>|' \
  "$k/KokkosCore_Config_DeclareBackend.hpp"
sed -i 's|#include <fwd/Kokkos_Fwd_OPENMP.hpp>|#include <fwd/Kokkos_Fwd_SERIAL.hpp>\n#include <fwd/Kokkos_Fwd_CUDA.hpp>|' \
  "$k/KokkosCore_Config_FwdBackend.hpp"
sed -i 's|^#define KOKKOS_SETUP_HPP_$|#define KOKKOS_SETUP_HPP_\n#include <setup/Kokkos_Setup_Cuda.hpp>|' \
  "$k/KokkosCore_Config_SetupBackend.hpp"
sed -i 's|^/\* #undef DESUL_ATOMICS_ENABLE_CUDA \*/$|#define DESUL_ATOMICS_ENABLE_CUDA|' "$k/desul/atomics/Config.hpp"
grep -q "Kokkos_Declare_CUDA" "$k/KokkosCore_Config_DeclareBackend.hpp"
grep -q "Kokkos_Setup_Cuda" "$k/KokkosCore_Config_SetupBackend.hpp"
grep -q "^#define DESUL_ATOMICS_ENABLE_CUDA$" "$k/desul/atomics/Config.hpp"

mpi_inc=$(mpicxx --showme:incdirs 2>/dev/null | awk '{print $1}')
[ -n "$mpi_inc" ] || mpi_inc=/usr/lib/x86_64-linux-gnu/openmpi/include
styles=$kdir/lammps/styles
[ -d "$styles" ] || styles=$(dirname "$(find "$kdir" -name style_pair.h | head -n1)")

echo "nvcc: $("$nvcc" --version | tail -n1)"
echo "Kokkos headers: $src_inc of the Debian 13 root ($(sed -n 's/^#define KOKKOS_VERSION \([0-9]*\)$/\1/p' "$k/KokkosCore_config.h")), configured for Serial + CUDA (HOPPER90)"
# LAMMPS's KOKKOS precisions: double (the default) and mixed (float
# positions, double accumulators), the common choice on GPUs
for prec in DOUBLE_DOUBLE SINGLE_DOUBLE; do
  start=$(date +%s)
  syms=0
  kernels=0
  # the style's translation units: the pair style, its communication, its graph
  for unit in pair_torch_kokkos pair_torch_kokkos_halo torch_graph_kokkos; do
    obj=$work/$unit.$prec.o
    rc=0
    "$nvcc" -std=c++20 -x cu -arch=sm_90 --extended-lambda --expt-relaxed-constexpr -O2 -c \
      -DLAMMPS_SMALLBIG -DLMP_KOKKOS -DLMP_KOKKOS_$prec -DLMP_KOKKOS_LAYOUT_LEGACY \
      -DML_TORCH_KOKKOS_PRECISION_LAYER -DOMPI_SKIP_MPICXX -DMPICH_SKIP_MPICXX \
      -I"$k" -I"$lammps/src/KOKKOS" -I"$lammps/src" -I"$styles" -I"$here/src" -I"$here/src/core" -I"$here/src/mpi" -I"$here/kokkos" \
      -I"$mpi_inc" "$here/kokkos/$unit.cpp" -o "$obj" > "$work/nvcc.$unit.$prec.log" 2>&1 || rc=$?
    head -n 60 "$work/nvcc.$unit.$prec.log"
    [ "$rc" -eq 0 ] || { echo "CUDA compile check ($prec, $unit.cpp) FAILED (nvcc exit $rc; log $work/nvcc.$unit.$prec.log)"; exit 1; }
    syms=$(( syms + $(nm -C "$obj" | grep -cE " [TW] LAMMPS_NS::(PairTorchKokkos|TorchGraphKokkos)<Kokkos::Cuda>::" || true) ))
    # device kernels: one host launch stub per parallel_for/reduce/scan of ours
    kernels=$(( kernels + $(nm "$obj" | grep -v " b " | grep -cE "__device_stub__.*(PairTorchKokkos|TorchGraphKokkos)" || true) ))
  done
  echo "CUDA compile check ($prec) passed in $(( $(date +%s) - start )) s: kokkos/pair_torch_kokkos*.cpp," \
       "$syms PairTorchKokkos/TorchGraphKokkos<Kokkos::Cuda> member functions, $kernels CUDA kernel launch stubs"
  [ "$syms" -gt 0 ] && [ "$kernels" -gt 0 ]
done
