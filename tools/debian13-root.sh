#!/usr/bin/env bash
# The Debian 13 (trixie) build root of the current KOKKOS lane: GCC 14,
# CMake 3.31, Open MPI and Debian unstable's Kokkos 5.2 (OpenMP back end),
# which need a newer glibc/libstdc++ than the Debian 12 host has.
#
#   tools/debian13-root.sh create ROOT      make ROOT (idempotent: a complete
#                                           root is kept as it is)
#   tools/debian13-root.sh run ROOT CMD...  run CMD inside ROOT
#
# `run` uses a private mount namespace (unshare --mount): /proc, /dev, /sys,
# /tmp, the checkout and the ML-TORCH cache are bound at the same paths as
# on the host, so files named by host paths are the same files inside, and
# every mount disappears with the command. Nothing is left mounted, so the
# root can be deleted with rm -rf at any time. Needs root (debootstrap,
# chroot, mount); run from tools/setup.sh --kokkos.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${ML_TORCH_CACHE:-$HOME/.cache/ml-torch}
packages=(g++ cmake ninja-build ccache make libopenmpi-dev openmpi-bin libgtest-dev libgmock-dev
          nlohmann-json3-dev ca-certificates python3)
kokkos_version=5.2.2    # Debian unstable's libkokkos-dev; LAMMPS 2026 needs >= 5.1

usage() { echo "usage: $0 create ROOT | run ROOT CMD..." >&2; exit 2; }

# host_debian_uri: the Debian mirror the host's apt already uses
# shellcheck source=tools/debian-mirror.sh
. "$here/tools/debian-mirror.sh"

# run CMD in ROOT in a private mount namespace
run_in() {
  local root=$1; shift
  [ -x "$root/usr/bin/env" ] || { echo "ERROR: $root is not a Debian root (run: $0 create $root)" >&2; exit 1; }
  local binds=(/tmp "$cache" "$here") d ok=0
  # commands run in the caller's directory, which must be one of those
  for d in "${binds[@]}"; do
    case "$PWD/" in "$d"/*) ok=1 ;; esac
  done
  [ "$ok" = 1 ] || { echo "ERROR: run from a directory under $here, /tmp or $cache (not $PWD)" >&2; exit 1; }
  local script='set -e; root=$1; shift; n=$1; shift
    mount -t proc proc "$root/proc"
    mount --rbind /dev "$root/dev"; mount --make-rslave "$root/dev"
    mount --rbind /sys "$root/sys"; mount --make-rslave "$root/sys"
    for ((k = 0; k < n; k++)); do
      d=$1; shift
      [ -d "$d" ] || continue
      mkdir -p "$root$d"
      mountpoint -q "$root$d" || mount --bind "$d" "$root$d"
    done
    # one node: Open MPI between ranks through shared memory (its TCP
    # transport finds no usable interface pairs inside the root and says so)
    exec chroot "$root" /usr/bin/env -u LD_LIBRARY_PATH -u LIBRARY_PATH -u CPATH -u CUDA_HOME -C "$PWD" \
      PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      OMPI_MCA_btl="${OMPI_MCA_btl:-self,sm}" "$@"'
  exec unshare --mount --propagation private /bin/bash -c "$script" run-in "$root" "${#binds[@]}" \
    "${binds[@]}" "$@"
}

# Debian's Kokkos CMake config names libkokkosalgorithms.a and libkokkossimd.a,
# which the package does not ship (both are header-only in practice): empty
# archives let find_package(Kokkos) succeed
kokkos_archives() {
  local root=$1 cfgdir lib
  cfgdir=$(dirname "$(find "$root/usr/lib" -name KokkosConfig.cmake | head -n1)")
  for lib in $(grep -ho '{_IMPORT_PREFIX}/[^"]*libkokkos[a-z]*\.a' "$cfgdir"/*.cmake | sort -u); do
    lib=/usr${lib#\{_IMPORT_PREFIX\}}
    [ -e "$root$lib" ] || { echo "empty archive for Debian's missing $lib"; run_in_sub "$root" ar rcs "$lib"; }
  done
}

# apt_install DIR: the packages into the root DIR. Each step is checked here:
# set -e does not act inside a function or { ...; } whose status is tested
# (if !, ||, &&), so an unchecked failed step would go unnoticed and the root
# would be marked complete
apt_install() {
  local dir=$1 apt=(env DEBIAN_FRONTEND=noninteractive apt-get -y -qq -o Dpkg::Use-Pty=0)
  run_in_sub "$dir" "${apt[@]}" update || return
  run_in_sub "$dir" "${apt[@]}" install --no-install-recommends "${packages[@]}" || return
  run_in_sub "$dir" "${apt[@]}" install --no-install-recommends -t unstable libkokkos-dev || return
}

create() {
  local root=$1
  if [ -f "$root/.ml-torch-complete" ]; then
    kokkos_archives "$root"
    echo "Debian 13 root: $root (present)"
    return 0
  fi
  command -v debootstrap >/dev/null || {
    echo "installing debootstrap"; apt-get install -y -qq debootstrap >/dev/null; }
  local uri tmp
  uri=$(host_debian_uri)
  tmp="$root.partial"
  # a half-made root from an interrupted run: nothing is mounted in it (run_in
  # mounts in a private namespace; debootstrap's own mounts die with it), but
  # check before deleting through a mount (/proc/mounts names mount points
  # with every symlink resolved)
  if grep -qF " $(realpath -m -- "$tmp")/" /proc/mounts; then
    echo "ERROR: $tmp has mounts (see /proc/mounts); unmount them before re-running" >&2; exit 1
  fi
  rm -rf "$tmp"
  mkdir -p "$(dirname "$root")"
  echo "debootstrap trixie from $uri into $tmp"
  debootstrap --variant=minbase trixie "$tmp" "$uri" > "$tmp.log" 2>&1 \
    || { tail -20 "$tmp.log"; echo "ERROR: debootstrap failed (log: $tmp.log)" >&2; exit 1; }
  cp /etc/resolv.conf "$tmp/etc/resolv.conf"
  # the archive's Release files are past their Valid-Until here, as on the host
  printf 'Acquire::Check-Valid-Until "false";\nAcquire::Check-Date "false";\nAcquire::Languages "none";\n' \
    > "$tmp/etc/apt/apt.conf.d/99ml-torch"
  printf 'deb %s trixie main\ndeb %s sid main\n' "$uri" "$uri" > "$tmp/etc/apt/sources.list"
  # unstable only where asked for (-t unstable), everything else from trixie
  printf 'Package: *\nPin: release a=unstable\nPin-Priority: 100\n' > "$tmp/etc/apt/preferences.d/ml-torch-sid"
  echo "apt-get install in the root: ${packages[*]}, and libkokkos-dev from unstable (log: $tmp.log)"
  if ! apt_install "$tmp" >> "$tmp.log" 2>&1; then
    tail -20 "$tmp.log"; echo "ERROR: apt-get in the root failed (log: $tmp.log)" >&2; exit 1
  fi
  kokkos_archives "$tmp"
  local v
  v=$(run_in_sub "$tmp" dpkg-query -W -f='${Version}' libkokkos-dev)
  case "$v" in
    "$kokkos_version"*) ;;
    *) echo "ERROR: Debian unstable's libkokkos-dev is $v; ML-TORCH's current lane is tested with $kokkos_version" >&2
       exit 1 ;;
  esac
  run_in_sub "$tmp" apt-get clean
  touch "$tmp/.ml-torch-complete"
  mv "$tmp" "$root"
  echo "Debian 13 root: $root (GCC $(run_in_sub "$root" gcc -dumpfullversion), Kokkos $v)"
}

# run_in in a subshell (run_in ends with exec)
run_in_sub() { ( run_in "$@" ); }

[ $# -ge 2 ] || usage
[ "$(id -u)" -eq 0 ] || { echo "ERROR: $0 needs root (debootstrap, chroot, mount namespaces)" >&2; exit 1; }
cmd=$1; root=$2; shift 2
case "$cmd" in
  create) create "$root" ;;
  run) [ $# -ge 1 ] || usage; run_in "$root" "$@" ;;
  *) usage ;;
esac
