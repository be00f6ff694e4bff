#!/usr/bin/env bash
# ML-TORCH set-up: system packages, project Python environment with the PyPI
# torch wheel (its LibTorch is what we link), LAMMPS 4 Jul 2026 from Debian's
# `lammps` source package, the build, and the flagship example.
#
#   tools/setup.sh            # everything, then run the flagship example
#   tools/setup.sh --no-run   # everything but the example
#   tools/setup.sh --kokkos   # also pair_style torch/kk on the current stack:
#                             # LAMMPS 4 Jul 2026 + KOKKOS with Debian's Kokkos 5.2
#                             # (OpenMP) in a Debian 13 build root, built in
#                             # build/kokkos-current (lmp-run wrapper there); its
#                             # tests and a CUDA compile check join ctest
#   tools/setup.sh --kokkos-2021   # also the older lane: LAMMPS 29 Sep 2021 +
#                             # Debian 12's Kokkos 3.4 (Serial) in build/kokkos
#
# Idempotent: a second run reuses the apt state, pip cache, fetched LAMMPS
# tarball (in $ML_TORCH_CACHE, default ~/.cache/ml-torch), ccache and build/.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$here"
run_example=1
kokkos=0
kokkos_2021=0
for arg in "$@"; do
  case "$arg" in
    --no-run) run_example=0 ;;
    --kokkos) kokkos=1 ;;
    --kokkos-2021) kokkos_2021=1 ;;
    *) echo "usage: tools/setup.sh [--no-run] [--kokkos] [--kokkos-2021]" >&2; exit 2 ;;
  esac
done

cache=${ML_TORCH_CACHE:-$HOME/.cache/ml-torch}
lammps_pkg_version=20260704+dfsg-2
lammps_tarball=lammps_20260704+dfsg.orig.tar.gz
lammps_sha256=cddbc45a047416bd48a4a0b87f24a5b61b3446982b74d18cafe619c22b17eb62
lammps_dir=$cache/lammps-20260704
# the KOKKOS build: the only LAMMPS whose KOKKOS package accepts Debian's Kokkos 3.4
kk_pkg_version=20220106.git7586adbb6a+ds1-2
kk_tarball=lammps_20220106.git7586adbb6a+ds1.orig.tar.xz
kk_sha256=65146c615ad24d8b8bc64f4e05e86226a7f1fdb45c0b5ea9416562b9f3863082
kk_lammps_dir=$cache/lammps-20210929
torch_spec=${ML_TORCH_TORCH_SPEC:-torch==2.15.0}
jobs=${ML_TORCH_JOBS:-$(nproc)}

say() { printf '\n== %s\n' "$*"; }
sudo_cmd=()
[ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)

# ---------------------------------------------------------------------------
say "system packages"
pkgs=(build-essential cmake ninja-build ccache git ca-certificates dpkg-dev
      libopenmpi-dev openmpi-bin python3 python3-venv python3-dev
      libgtest-dev libgmock-dev libyaml-dev nlohmann-json3-dev cp2k cp2k-data
      quantum-espresso quantum-espresso-data util-linux)
[ "$kokkos_2021" = 1 ] && pkgs+=(libtrilinos-kokkos-dev xz-utils)
[ "$kokkos" = 1 ] && pkgs+=(debootstrap)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq "${missing[@]}"
else
  echo "all present"
fi

# ---------------------------------------------------------------------------
# fetch_lammps PKG_VERSION TARBALL SHA256 DIR TAR_FLAGS: a Debian lammps source
# package's orig tarball, checked against the SHA-256 Debian lists and ours
fetch_lammps() {
  local pkg_version=$1 tarball=$2 sha=$3 dir=$4 tar_flags=$5
  [ -f "$dir/.complete" ] && return 0
  mkdir -p "$cache"
  if [ ! -f "$cache/$tarball" ] || \
     ! echo "$sha  $cache/$tarball" | sha256sum -c --quiet - 2>/dev/null; then
    # deb-src entry derived from the machine's own Debian source
    src_list=/etc/apt/sources.list.d/ml-torch-src.sources
    if ! apt-cache showsrc lammps 2>/dev/null | grep -q "^Version: $pkg_version"; then
      uri=$(grep -h -m1 -E '^URIs:.*debian' /etc/apt/sources.list.d/*.sources 2>/dev/null \
              | grep -v security | awk '{print $2}' | head -n1 || true)
      if [ -z "$uri" ]; then
        uri=$(grep -h -E '^deb .*debian' /etc/apt/sources.list 2>/dev/null \
                | grep -v security | awk '{print $2}' | head -n1 || true)
      fi
      [ -n "$uri" ] || { echo "ERROR: no Debian apt source found to derive a deb-src entry from" >&2; exit 1; }
      printf 'Types: deb-src\nURIs: %s\nSuites: bookworm trixie sid\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
        "$uri" | "${sudo_cmd[@]}" tee "$src_list" >/dev/null
      "${sudo_cmd[@]}" apt-get update -qq
    fi
    listed=$(apt-cache showsrc lammps | awk -v v="$pkg_version" -v f="$tarball" \
               '/^Package:/{ok=0} $1=="Version:"{ok=($2==v)} /^Checksums-Sha256:/{s=1;next}
                /^[A-Z]/{s=0} ok && s && $3==f {print $1}' | head -n1)
    if [ "$listed" != "$sha" ]; then
      echo "ERROR: Debian lists SHA-256 '$listed' for $tarball, expected $sha" >&2
      exit 1
    fi
    # the .dsc / debian tarball may 404 on this network; the orig tarball is all we need
    (cd "$cache" && apt-get source --download-only "lammps=$pkg_version" >/dev/null 2>&1 || true)
    [ -f "$cache/$tarball" ] || { echo "ERROR: could not download $tarball" >&2; exit 1; }
    echo "$sha  $cache/$tarball" | sha256sum -c --quiet - \
      || { echo "ERROR: SHA-256 mismatch for $cache/$tarball" >&2; rm -f "$cache/$tarball"; exit 1; }
  fi
  rm -rf "$dir" && mkdir -p "$dir"
  # shellcheck disable=SC2086
  tar $tar_flags "$cache/$tarball" -C "$dir"
  touch "$dir/.complete"
}

say "LAMMPS source ($lammps_pkg_version, Debian source package)"
fetch_lammps "$lammps_pkg_version" "$lammps_tarball" "$lammps_sha256" "$lammps_dir" "-xzf"   # no top-level folder
echo "LAMMPS tree: $lammps_dir ($(grep -o '"[^"]*"' "$lammps_dir/src/version.h" | head -n1))"
kk_args=(-DML_TORCH_KOKKOS_LEGACY_BUILD=OFF)
if [ "$kokkos_2021" = 1 ]; then
  say "LAMMPS source for the KOKKOS build ($kk_pkg_version, Debian source package)"
  fetch_lammps "$kk_pkg_version" "$kk_tarball" "$kk_sha256" "$kk_lammps_dir" "--strip-components=1 -xJf"
  echo "LAMMPS tree: $kk_lammps_dir ($(grep -o '"[^"]*"' "$kk_lammps_dir/src/version.h" | head -n1))"
  kk_args=(-DML_TORCH_KOKKOS_LEGACY_BUILD=ON -DML_TORCH_KOKKOS_LAMMPS_DIR="$kk_lammps_dir")
fi

# ---------------------------------------------------------------------------
say "Python environment (.venv, $torch_spec)"
[ -x .venv/bin/python ] || /usr/bin/python3 -m venv .venv
if ! .venv/bin/python -c "import torch, numpy, matplotlib" 2>/dev/null; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q "$torch_spec" numpy matplotlib
fi
# the frameworks mltorch-import imports from (their PyPI wheels; torch pinned
# to ours so that pip keeps the LibTorch we link): SevenNet ships its trained
# universal potentials in its wheel
if ! .venv/bin/python -c "import sevenn, e3nn, ase" 2>/dev/null; then
  .venv/bin/python -m pip install -q "sevenn==0.13.0" "$torch_spec"
fi
# NequIP and Allegro (mltorch-import nequip; their e3nn 0.6 is SevenNet's too)
if ! .venv/bin/python -c "import nequip, allegro" 2>/dev/null; then
  .venv/bin/python -m pip install -q "nequip==0.19.1" "nequip-allegro==0.8.3" "$torch_spec"
fi
# MACE (mltorch-import mace) pins e3nn 0.4.4, which SevenNet's e3nn >= 0.5
# excludes: it gets an environment of its own, .venv-mace, that shares
# .venv's torch and packages (a .pth file appends .venv's site-packages and
# the project's Python tooling after its own, so its e3nn 0.4.4 wins)
if ! .venv-mace/bin/python -c "import mace, e3nn, mltorch.importers; assert e3nn.__version__.startswith('0.4.')" 2>/dev/null; then
  [ -x .venv-mace/bin/python ] || /usr/bin/python3 -m venv .venv-mace
  main_site=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  mace_site=$(.venv-mace/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  printf '%s\n%s\n' "$main_site" "$here/python" > "$mace_site/zz_ml_torch_main_venv.pth"
  # pip takes the version without the local tag (+cu...) as a constraint
  echo "$torch_spec" | sed 's/+.*//' > .venv-mace/constraints.txt
  .venv-mace/bin/python -m pip install -q -c .venv-mace/constraints.txt "mace-torch==0.3.16"
  echo "(pip's note on e3nn above is about .venv's SevenNet and nequip seen from .venv-mace;" \
       ".venv keeps e3nn 0.6, .venv-mace has 0.4.4 for MACE)"
fi
# tad-dftd3: an independent DFT-D3 (PyTorch) that the D3 test checks
# pair_style dispersion/d3 on top of SevenNet-0 against
if ! .venv/bin/python -c "import tad_dftd3" 2>/dev/null; then
  .venv/bin/python -m pip install -q "tad-dftd3==0.7.0" "$torch_spec"
fi
# i-PI's own Python driver (i-pi-py_driver): a client of teacher ipi that
# takes the NEEDINIT/INIT path (test IpiClients)
if ! .venv/bin/python -c "import ipi" 2>/dev/null || [ ! -x .venv/bin/i-pi-py_driver ]; then
  .venv/bin/python -m pip install -q "ipi==3.3.1"
fi
# the project's own tooling (mltorch-info, mltorch-compile, mltorch-import,
# exporter, trainer), editable
if ! .venv/bin/python -c "import mltorch.importers" 2>/dev/null || [ ! -x .venv/bin/mltorch-import ]; then
  .venv/bin/python -m pip install -q --no-deps --no-build-isolation -e python
fi
.venv/bin/python -c "import torch; print('torch', torch.__version__)"

# ---------------------------------------------------------------------------
say "configure and build (build/)"
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
# paths under the checkout hash relative, so another clone reuses the cache
export CCACHE_BASEDIR="$here"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DLAMMPS_SOURCE_DIR="$lammps_dir" -DML_TORCH_PYTHON="$here/.venv/bin/python" "${launcher[@]}" \
      "${kk_args[@]}" -DML_TORCH_KOKKOS_CURRENT_DIR="$([ "$kokkos" = 1 ] && echo "$here/build/kokkos-current")"
cmake --build build -j "$jobs"

# ---------------------------------------------------------------------------
say "compiled models: potentials/*.pt2 (mltorch-compile, for this CPU and LibTorch; kept while up to date)"
tools/compile_models.sh

# ---------------------------------------------------------------------------
if [ "$kokkos" = 1 ]; then
  say "KOKKOS lane: LAMMPS 4 Jul 2026 + Kokkos 5.2 (OpenMP) in a Debian 13 build root (build/kokkos-current)"
  root=$cache/debian13
  tools/debian13-root.sh create "$root"
  kdir=$here/build/kokkos-current
  mkdir -p "$kdir"
  # wrappers: any command, and lmp [-np N], inside the root, from the caller's directory
  printf '#!/bin/sh\n# run a command inside the Debian 13 root of this build\nexec %q run %q "$@"\n' \
    "$here/tools/debian13-root.sh" "$root" > "$kdir/in-root"
  sed -e "s|@IN_ROOT@|$kdir/in-root|" -e "s|@LMP@|$kdir/lmp|" tools/lmp-run.in > "$kdir/lmp-run"
  chmod +x "$kdir/in-root" "$kdir/lmp-run"
  torch_prefix=$(.venv/bin/python -c "import torch, os; print(os.path.dirname(torch.__file__))")
  "$kdir/in-root" env CCACHE_DIR="$cache/ccache-debian13" CCACHE_BASEDIR="$here" \
    cmake -S "$here" -B "$kdir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAMMPS_SOURCE_DIR="$lammps_dir" \
          -DML_TORCH_KOKKOS=ON -DTorch_DIR="$torch_prefix/share/cmake/Torch" \
          -DML_TORCH_LAMMPS_PACKAGES="MANYBODY;MISC" \
          -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache
  "$kdir/in-root" env CCACHE_DIR="$cache/ccache-debian13" CCACHE_BASEDIR="$here" \
    cmake --build "$kdir" -j "$jobs"
  "$kdir/lmp-run" -h | grep -E "^(Large-scale|KOKKOS package API|Kokkos library version)" || true
fi

# ---------------------------------------------------------------------------
if [ "$run_example" = 1 ]; then
  say "flagship example: examples/finetune (online distillation of Si.sw into a perturbed student, 2 replicas)"
  (cd examples/finetune &&
   mpirun --allow-run-as-root --oversubscribe -np 2 ../../build/lmp -partition 2x1 -in in.finetune &&
   grep -h "^replica at" log.lammps.0 log.lammps.1 &&
   ../../.venv/bin/python plot_log.py log.lammps.0 -o learning_curve.png)
fi
say "done: run the tests with  ctest --test-dir build --output-on-failure"
