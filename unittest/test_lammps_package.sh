#!/usr/bin/env bash
# ML-TORCH built into LAMMPS by LAMMPS's own CMake, as doc/lammps_build.md
# tells users: tools/install_into_lammps.sh on a copy of the LAMMPS tree,
# LAMMPS's basic preset + PKG_ML-TORCH, LibTorch from the project's pip
# wheel, the system MPI, no root. Then the lmp it built lists the styles and
# runs lj_Ar.pt against lj/cut on 2 ranks (ctest LammpsPackage).
#   unittest/test_lammps_package.sh <lammps tree> <python with torch> <work folder> [mpiexec]
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
lammps=$1 python=$2 work=$3 mpiexec=${4:-mpiexec}
mkdir -p "$work"
work=$(cd "$work" && pwd)
tree=$work/lammps

# the user's tree: a copy (the recipe writes into it)
rm -rf "$tree" && mkdir -p "$tree"
cp -a "$lammps/src" "$lammps/cmake" "$lammps/lib" "$tree/"

"$here/tools/install_into_lammps.sh" "$tree"
# the second run replaces the files and leaves the package lists as they are
"$here/tools/install_into_lammps.sh" "$tree" > /dev/null
test "$(grep -c '^  ML-TORCH$' "$tree/cmake/CMakeLists.txt")" = 1

# paths under the checkout hash relative, so another clone reuses the cache
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$here}
launcher=()
command -v ccache > /dev/null && launcher=(-D CMAKE_CXX_COMPILER_LAUNCHER=ccache -D CMAKE_C_COMPILER_LAUNCHER=ccache)
# doc/lammps_build.md's step 3 as it is (with ccache added)
cmake -S "$tree/cmake" -B "$work/build" -C "$tree/cmake/presets/basic.cmake" \
      -D PKG_ML-TORCH=on -D PKG_REPLICA=on -D PKG_EXTRA-PAIR=on -D PKG_PHONON=on \
      -D BUILD_MPI=on -D ML_TORCH_PYTHON="$python" "${launcher[@]}" > "$work/configure.log" || { tail -40 "$work/configure.log"; exit 1; }
grep "ML-TORCH: LibTorch" "$work/configure.log"
cmake --build "$work/build" -j "${ML_TORCH_JOBS:-$(nproc)}" > "$work/build.log" 2>&1 || { tail -40 "$work/build.log"; exit 1; }

lmp=$work/build/lmp
"$lmp" -h > "$work/help.txt"
for pkg in ML-TORCH REPLICA EXTRA-PAIR PHONON; do
  sed -n '/^Installed packages/,/^List of individual/p' "$work/help.txt" | grep -qw -- "$pkg" || { echo "lmp -h lists no package $pkg"; exit 1; }
done
for style in "torch " "torch/finetune" "torch/deviation" "torch/train"; do
  grep -q "$style" "$work/help.txt" || { echo "lmp -h lists no style '$style'"; exit 1; }
done

cd "$work"
: > results.txt
for pair in "pair_style torch
pair_coeff * * $here/potentials/lj_Ar.pt Ar" "pair_style lj/cut 8.5
pair_coeff 1 1 0.0104 3.40"; do
  cat > in.check <<IN
units metal
lattice fcc 5.26
region box block 0 4 0 4 0 4
create_box 1 box
create_atoms 1 box
mass 1 39.948
displace_atoms all random 0.1 0.1 0.1 12345 units box
$pair
run 0
print "RESULT \$(pe:%.17g) \$(press:%.17g)"
IN
  "$mpiexec" --allow-run-as-root --oversubscribe -np 2 "$lmp" -nocite -log none -in in.check \
    | grep "^RESULT" >> results.txt
done
cat results.txt
python3 - "$work/results.txt" <<'PY'
import sys
(e1, p1), (e0, p0) = [[float(w) for w in l.split()[1:]] for l in open(sys.argv[1])]
de, dp = abs(e1 - e0) / abs(e0), abs(p1 - p0) / abs(p0)
assert de < 1e-13 and dp < 1e-13, (de, dp)
print(f"lmp built by LAMMPS's CMake with ML-TORCH, 2 ranks: lj_Ar.pt vs lj/cut, energy {de:.1e}, "
      f"pressure {dp:.1e} relative")
PY
