#!/usr/bin/env bash
# The whole test suite under AddressSanitizer + UndefinedBehaviorSanitizer:
# configures build-asan/ (-DML_TORCH_SANITIZE=ON, same LAMMPS and LibTorch as
# build/, which tools/setup.sh must have made), builds it and runs ctest.
#   tools/sanitize.sh [ctest args...]
# Any ASan report or UB stops the test that hit it (halt_on_error), so a
# green run is a clean run. Leak checking is off: LibTorch and Open MPI keep
# process-lifetime allocations that LeakSanitizer would list.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$here"
[ -f build/CMakeCache.txt ] || { echo "run tools/setup.sh first" >&2; exit 1; }
lammps_dir=$(sed -n 's/^LAMMPS_SOURCE_DIR:PATH=//p' build/CMakeCache.txt)
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
export CCACHE_BASEDIR="$here"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DML_TORCH_SANITIZE=ON \
      -DLAMMPS_SOURCE_DIR="$lammps_dir" -DML_TORCH_PYTHON="$here/.venv/bin/python" "${launcher[@]}" > /dev/null
cmake --build build-asan -j "${ML_TORCH_JOBS:-$(nproc)}"
export ASAN_OPTIONS=detect_leaks=0:halt_on_error=1:abort_on_error=1:detect_odr_violation=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
ctest --test-dir build-asan --output-on-failure "$@"
