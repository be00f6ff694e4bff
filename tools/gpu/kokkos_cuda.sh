#!/usr/bin/env bash
# Build and install Kokkos with the CUDA back end for sm_90 (H100/H200), for
# pair_style torch/kk in the GPU check:
#   tools/gpu/kokkos_cuda.sh SOURCE.tar.gz PREFIX [jobs]
# SOURCE.tar.gz: a Kokkos source tree (tools/gpu/prepare_carry.sh --kokkos
# packs one into gpu-carry/). Needs nvcc (CUDA 13) on PATH or in
# /usr/local/cuda/bin, CMake and a host C++20 compiler.
#
# The newest Kokkos source this project can reach is 4.6.99 (develop of
# 2025-06-20): Debian serves no Kokkos 5 source (404) and PyPI has none.
# LAMMPS 4 Jul 2026 asks for 5.1, and the GPU machines have CUDA 13, which
# Kokkos 4.6 predates. Three edits make a 4.6 tree build for them, made in
# the unpacked copy only and each checked to apply exactly once:
#  1. bin/nvcc_wrapper: default architecture sm_90. Its default, sm_70, is
#     gone from CUDA 13, and CMake's compiler checks call the wrapper
#     without -arch ("nvcc fatal: Unsupported gpu architecture 'sm_70'").
#  2. core/src/Cuda/Kokkos_Cuda_Instance.hpp: CUDA 13's signatures of
#     cudaGraphAddDependencies (edge data) and cudaMemPrefetchAsync
#     (cudaMemLocation and flags); 4 errors in every unit otherwise.
#  3. containers/src/Kokkos_UnorderedMap.hpp: Kokkos 5's name
#     host_mirror_type for HostMirror, which LAMMPS 2026's kokkos_type.h uses.
# A Kokkos 5.1 or newer tree is built as it is. The static libraries are
# position-independent (they are linked into liblammps.so), and Kokkos 4's
# deprecated interfaces are off, as in Kokkos 5, which LAMMPS 2026 is
# written for (with them on, Cuda::concurrency() is the static one).
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: tools/gpu/kokkos_cuda.sh SOURCE.tar.gz PREFIX [jobs]" >&2; exit 2; }
tarball=$(realpath "$1")
prefix=$(realpath -m "$2")
jobs=${3:-$(nproc)}
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
command -v nvcc >/dev/null || { echo "ERROR: no nvcc (CUDA) on PATH or in /usr/local/cuda/bin" >&2; exit 1; }
work=$prefix.build
rm -rf "$work" && mkdir -p "$work"
tar -C "$work" -xzf "$tarball"
src=$(dirname "$(find "$work" -maxdepth 2 -name CMakeLists.txt -path '*/CMakeLists.txt' | head -1)")
[ -f "$src/core/src/Kokkos_Core.hpp" ] || { echo "ERROR: $1 holds no Kokkos source tree" >&2; exit 1; }
version() { sed -n "s/^set(Kokkos_VERSION_$1 \([0-9]*\))/\1/p" "$src/CMakeLists.txt"; }
major=$(version MAJOR) minor=$(version MINOR) patch=$(version PATCH)
echo "Kokkos $major.$minor.$patch from $1, for CUDA sm_90 ($(nvcc --version | tail -1))"

# edit FILE SED-EXPRESSION NEW-TEXT: apply, and check NEW-TEXT is there once
edit() {
  sed -i "$2" "$src/$1"
  [ "$(grep -cF -- "$3" "$src/$1")" = 1 ] || { echo "ERROR: the CUDA 13 edit of $1 did not apply ($3)" >&2; exit 1; }
}
if [ "$major" -lt 5 ]; then
  [ "$major" = 4 ] && [ "$minor" -ge 6 ] || { echo "ERROR: Kokkos $major.$minor is older than 4.6" >&2; exit 1; }
  edit bin/nvcc_wrapper 's/^default_arch="sm_70"/default_arch="sm_90"/' 'default_arch="sm_90"'
  edit core/src/Cuda/Kokkos_Cuda_Instance.hpp \
    's/cudaGraphAddDependencies(graph, from, to, numDependencies)/cudaGraphAddDependencies(graph, from, to, nullptr, numDependencies)/' \
    'from, to, nullptr, numDependencies'
  edit core/src/Cuda/Kokkos_Cuda_Instance.hpp \
    's/cudaMemPrefetchAsync(devPtr, count, dstDevice, m_stream)/cudaMemPrefetchAsync(devPtr, count, cudaMemLocation{cudaMemLocationTypeDevice, dstDevice}, 0, m_stream)/' \
    'cudaMemLocation{cudaMemLocationTypeDevice, dstDevice}, 0, m_stream'
  edit containers/src/Kokkos_UnorderedMap.hpp \
    's/^  using histogram_type = Impl::UnorderedMapHistogram<const_map_type>;/  using host_mirror_type = HostMirror;\n&/' \
    'using host_mirror_type = HostMirror;'
fi
export NVCC_WRAPPER_DEFAULT_COMPILER=${NVCC_WRAPPER_DEFAULT_COMPILER:-$(command -v g++ || command -v c++)}
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
start=$(date +%s)
cmake -S "$src" -B "$work/build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER="$src/bin/nvcc_wrapper" \
      -DCMAKE_CXX_STANDARD=20 -DKokkos_ENABLE_CUDA=ON -DKokkos_ENABLE_SERIAL=ON -DKokkos_ARCH_HOPPER90=ON \
      -DKokkos_ENABLE_DEPRECATED_CODE_4=OFF -DBUILD_SHARED_LIBS=OFF -DCMAKE_POSITION_INDEPENDENT_CODE=ON \
      -DCMAKE_INSTALL_PREFIX="$prefix" > "$work/cmake.log" 2>&1 \
  || { tail -30 "$work/cmake.log"; exit 1; }
cmake --build "$work/build" -j "$jobs" > "$work/build.log" 2>&1 || { grep -m 20 -E "error|FAILED" "$work/build.log"; exit 1; }
cmake --install "$work/build" > "$work/install.log" 2>&1
echo "Kokkos $major.$minor.$patch (CUDA, sm_90) installed in $prefix: $(( $(date +%s) - start )) s on $jobs core(s)"
# the nvcc_wrapper LAMMPS must compile with (CMAKE_CXX_COMPILER)
[ -x "$prefix/bin/nvcc_wrapper" ] || { echo "ERROR: no nvcc_wrapper installed in $prefix/bin" >&2; exit 1; }
