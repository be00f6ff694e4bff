#!/usr/bin/env bash
# Checks of the tools that make and use Debian roots (tools/debian13-root.sh,
# tools/slurm-local.sh), run without root privileges, debootstrap or a
# network: both scripts are copied into a temporary checkout (with a stub
# tools/debian-mirror.sh) and run with stub commands first on PATH
# (debootstrap: makes a fake minimal root; unshare: stands for "run CMD in
# the root" and fails on request; id -u: says 0).
#
#   debian13 control  create with every step succeeding: the root is made and
#                     marked complete (the stubs are good enough)
#   debian13 apt      create with one apt-get step in the root failing (update,
#                     the main install, libkokkos-dev from unstable): the
#                     script fails at once, the root is neither made nor
#                     marked complete, the error and the log are reported
#   debian13 mount    something mounted under ROOT.partial, ROOT reached
#                     through a symlink: create refuses and deletes nothing
#                     through the mount                    (mount namespace)
#   slurm pids        ML_TORCH_CACHE a symlink, a process chrooted into the
#                     Slurm root and named by its pid files: status says up
#                     and down stops it                    (chroot)
#   slurm mount       ML_TORCH_CACHE a symlink, something mounted in the root:
#                     down fails                           (mount namespace)
#
# The checks marked (mount namespace) or (chroot) use unshare -rm / unshare -r
# when not run as root and are skipped where the kernel refuses them.
#
#   unittest/test_tools.sh      exit 0: passed, 1: a check failed, 77: skipped
set -uo pipefail

src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
T=$(mktemp -d "${TMPDIR:-/tmp}/mltorch-tools.XXXXXX")
helper=""
cleanup() {
  if [ -n "$helper" ]; then kill -KILL "$helper" 2>/dev/null; wait "$helper" 2>/dev/null; fi
  rm -rf "$T" 2>/dev/null || echo "note: could not remove all of $T"
}
trap cleanup EXIT

failed=0
ran=0
ok() { echo "ok: $*"; ran=$((ran + 1)); }
fail() { echo "FAIL: $*"; failed=$((failed + 1)); ran=$((ran + 1)); }
skip() { echo "SKIP: $*"; }
show() { sed 's/^/    | /' "$1"; }

real_unshare=$(command -v unshare || true)
real_id=$(command -v id)

# --- a temporary checkout with the two scripts, and the stubs
co=$T/co
mkdir -p "$co/tools" "$T/bin" "$T/cache"
cp "$src/tools/debian13-root.sh" "$src/tools/slurm-local.sh" "$co/tools/"
cat > "$co/tools/debian-mirror.sh" <<'EOF'
host_debian_uri() { echo http://deb.invalid/debian; }
EOF
cat > "$T/bin/id" <<EOF
#!/bin/sh
if [ "\$*" = -u ]; then echo 0; else exec $real_id "\$@"; fi
EOF
cat > "$T/bin/debootstrap" <<'EOF'
#!/bin/sh
# debootstrap --variant=minbase SUITE DIR URI: a fake root with what the scripts touch
d=$3
mkdir -p "$d/etc/apt/apt.conf.d" "$d/etc/apt/preferences.d" "$d/usr/bin" "$d/usr/sbin" \
         "$d/usr/lib/cmake/Kokkos" || exit 1
: > "$d/usr/bin/env" && chmod +x "$d/usr/bin/env" && : > "$d/usr/lib/cmake/Kokkos/KokkosConfig.cmake"
EOF
cat > "$T/bin/unshare" <<'EOF'
#!/bin/sh
# the scripts call: unshare --mount ... /bin/bash -c SCRIPT NAME ROOT N BINDS... CMD...
# a line per call in $STUB_LOG (the last 4 arguments); exit 100 when one
# argument is $STUB_FAIL
line=""; n=$#
for a; do
  [ "$n" -le 4 ] && line="$line $a"; n=$((n - 1))
done
echo "call$line" >> "${STUB_LOG:-/dev/null}"
for a; do
  if [ -n "${STUB_FAIL:-}" ] && [ "$a" = "$STUB_FAIL" ]; then
    echo "FAILED" >> "${STUB_LOG:-/dev/null}"
    echo "stub: failing on $STUB_FAIL" >&2; exit 100
  fi
done
for a; do
  case "$a" in
    dpkg-query) printf '5.2.2-1\n'; exit 0 ;;
    -dumpfullversion) echo 14.2.0; exit 0 ;;
  esac
done
exit 0
EOF
chmod +x "$T/bin/"*
stubpath=$T/bin:$PATH

# a directory and a symlink to it: paths through "link" are the unresolved ones
mkdir -p "$T/real"
ln -s real "$T/link"

# how to get a mount namespace and a chroot here
if [ "$("$real_id" -u)" -eq 0 ]; then ns_mount=(-m); ns_root=(); else ns_mount=(-r -m); ns_root=(-r); fi
can_mount=0
if [ -n "$real_unshare" ] && "$real_unshare" "${ns_mount[@]}" /bin/sh -c \
     'd=$(mktemp -d) && mount -t tmpfs none "$d" && umount "$d" && rmdir "$d"' 2>/dev/null; then
  can_mount=1
fi
can_chroot=0
if command -v python3 >/dev/null && \
   { [ ${#ns_root[@]} = 0 ] || { [ -n "$real_unshare" ] && "$real_unshare" "${ns_root[@]}" true 2>/dev/null; }; }; then
  can_chroot=1
fi
# the prefix of a command that may chroot (a simple command, so that $! of
# "${as_root[@]}" CMD & is CMD's PID: unshare without --fork execs CMD)
as_root=()
[ ${#ns_root[@]} = 0 ] || as_root=("$real_unshare" "${ns_root[@]}")

# ========== tools/debian13-root.sh create
# d13 NAME ROOT [FAILING-ARGUMENT]: create ROOT; output in $T/NAME.out, stub calls in $T/NAME.calls
d13() {
  local name=$1 root=$2
  (cd "$co" && env PATH="$stubpath" ML_TORCH_CACHE="$T/cache" STUB_LOG="$T/$name.calls" STUB_FAIL="${3:-}" \
     "$co/tools/debian13-root.sh" create "$root") > "$T/$name.out" 2>&1
}

if [ ! -r /etc/resolv.conf ]; then
  skip "debian13-root.sh: create copies /etc/resolv.conf, which this machine does not have"
else
  r=$T/roots/control
  d13 control "$r"; rc=$?
  if [ "$rc" = 0 ] && [ -f "$r/.ml-torch-complete" ] && [ ! -e "$r.partial" ]; then
    ok "debian13 control: with every step succeeding, create exits 0 and marks $r complete"
  else
    fail "debian13 control: exit $rc, complete marker $( [ -f "$r/.ml-torch-complete" ] && echo present || echo absent) (the stubs do not fit the script)"
    show "$T/control.out"
  fi

  for step in update g++ libkokkos-dev; do
    r=$T/roots/fail-$step
    d13 "fail-$step" "$r" "$step"; rc=$?
    what="debian13 apt: apt-get step '$step' in the root failing"
    if ! grep -q "^FAILED" "$T/fail-$step.calls" 2>/dev/null; then
      fail "$what: the failure was never injected (no such step reached)"; show "$T/fail-$step.out"; continue
    fi
    after=$(sed -n '/^FAILED/,$p' "$T/fail-$step.calls" | tail -n +2)
    problems=()
    [ "$rc" != 0 ] || problems+=("create exited 0")
    [ ! -e "$r" ] || problems+=("$r was made")
    [ ! -e "$r/.ml-torch-complete" ] && [ ! -e "$r.partial/.ml-torch-complete" ] \
      || problems+=("the root was marked complete")
    [ -z "$after" ] || problems+=("it went on to run: $(tr '\n' ' ' <<< "$after")")
    grep -q "ERROR: apt-get in the root failed (log: $r.partial.log)" "$T/fail-$step.out" \
      || problems+=("no 'apt-get in the root failed' error")
    grep -q "stub: failing on $step" "$r.partial.log" 2>/dev/null \
      || problems+=("the failed step's output is not in $r.partial.log")
    grep -q "stub: failing on $step" "$T/fail-$step.out" \
      || problems+=("the log's tail was not shown")
    if [ ${#problems[@]} = 0 ]; then
      ok "$what: create exits $rc at once, no root made or marked complete, the log's tail and the error shown"
    else
      fail "$what: $(IFS=';'; echo "${problems[*]}")"; show "$T/fail-$step.out"
    fi
  done

  if [ "$can_mount" = 1 ]; then
    r=$T/link/d13           # ROOT through the symlink; the mount is at the resolved path
    mnt=$T/real/d13.partial/proc
    mkdir -p "$mnt"
    (cd "$co" && env PATH="$stubpath" ML_TORCH_CACHE="$T/cache" STUB_LOG=/dev/null \
       "$real_unshare" "${ns_mount[@]}" /bin/bash -c '
         mount -t tmpfs mltorch-test "$1" && echo keep > "$1/sentinel" || { echo "test set-up: mount failed"; exit 0; }
         "$2" create "$3"; echo "rc=$?"
         [ -f "$1/sentinel" ] && echo "sentinel kept"' _ "$mnt" "$co/tools/debian13-root.sh" "$r") \
      > "$T/d13-mount.out" 2>&1
    if grep -q "^rc=[1-9]" "$T/d13-mount.out" && grep -q "has mounts" "$T/d13-mount.out" \
       && grep -q "sentinel kept" "$T/d13-mount.out"; then
      ok "debian13 mount: create $r refuses while $mnt is a mount point (reached through a symlink), the file on the mount kept"
    else
      fail "debian13 mount: create $r with $mnt mounted did not refuse, or deleted through the mount"
      show "$T/d13-mount.out"
    fi
  else
    skip "debian13 mount: no mount namespace here (unshare ${ns_mount[*]})"
  fi
fi

# ========== tools/slurm-local.sh with ML_TORCH_CACHE through a symlink
# slurm NAME CMD...: tools/slurm-local.sh CMD; output in $T/NAME.out
slurm() {
  local name=$1; shift
  (cd "$co" && env PATH="$stubpath" ML_TORCH_CACHE="$T/link" STUB_LOG=/dev/null \
     "$co/tools/slurm-local.sh" "$@") > "$T/$name.out" 2>&1
}
alive() {   # alive PID: it runs (a zombie does not)
  local s
  s=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)
  [ -n "$s" ] && [ "$s" != Z ]
}
sroot=$T/link/slurm-debian12
mkdir -p "$T/real/slurm-debian12/run/munge" "$T/real/slurm-debian12/tmp"

if [ "$can_chroot" = 1 ]; then
  # one process in the root stands for the three daemons: it chroots (through
  # the symlinked path), then writes its PID into their pid files
  "${as_root[@]}" python3 -c '
import os, sys, time
os.chroot(sys.argv[1]); os.chdir("/")
for f in ("/run/slurmctld.pid", "/run/slurmd.pid", "/run/munge/munged.pid"):
    with open(f + ".new", "w") as o: o.write("%d\n" % os.getpid())
    os.rename(f + ".new", f)
time.sleep(120)' "$sroot" > "$T/helper.out" 2>&1 &
  helper=$!
  for ((k = 0; k < 100; k++)); do
    [ -s "$T/real/slurm-debian12/run/munge/munged.pid" ] && break
    alive "$helper" || break
    sleep 0.1
  done
  if [ -s "$T/real/slurm-debian12/run/munge/munged.pid" ]; then
    slurm status status; rc=$?
    if [ "$rc" = 0 ] && grep -q "up: slurmctld $helper, slurmd $helper, munged $helper" "$T/status.out"; then
      ok "slurm pids: status finds the daemon $helper whose root is $sroot, a path through a symlink (/proc/$helper/root: $(readlink "/proc/$helper/root"))"
    else
      fail "slurm pids: status does not see the process $helper chrooted into $sroot (exit $rc)"; show "$T/status.out"
    fi
    slurm down down; rc=$?
    for ((k = 0; k < 20; k++)); do alive "$helper" || break; sleep 0.1; done
    if [ "$rc" = 0 ] && ! alive "$helper"; then
      ok "slurm pids: down stopped the process in the root"
    else
      fail "slurm pids: after down (exit $rc) the process $helper in the root $( alive "$helper" && echo "still runs" || echo "is gone")"
      show "$T/down.out"
    fi
  else
    skip "slurm pids: the helper could not chroot into $sroot"; show "$T/helper.out"
  fi
  kill -KILL "$helper" 2>/dev/null; wait "$helper" 2>/dev/null; helper=""
else
  skip "slurm pids: no python3, or no user namespace to chroot in"
fi
rm -f "$T/real/slurm-debian12/run/"*.pid "$T/real/slurm-debian12/run/munge/"*.pid

if [ "$can_mount" = 1 ]; then
  mnt=$T/real/slurm-debian12/tmp
  (cd "$co" && env PATH="$stubpath" ML_TORCH_CACHE="$T/link" STUB_LOG=/dev/null \
     "$real_unshare" "${ns_mount[@]}" /bin/bash -c '
       mount -t tmpfs mltorch-test "$1" || { echo "test set-up: mount failed"; exit 0; }
       "$2" down; echo "rc=$?"' _ "$mnt" "$co/tools/slurm-local.sh") > "$T/slurm-mount.out" 2>&1
  if grep -q "^rc=[1-9]" "$T/slurm-mount.out" && grep -q "still mounted under" "$T/slurm-mount.out"; then
    ok "slurm mount: down fails while $mnt is mounted (root named $sroot, through a symlink)"
  else
    fail "slurm mount: down did not notice the mount at $mnt (root named $sroot)"; show "$T/slurm-mount.out"
  fi
else
  skip "slurm mount: no mount namespace here (unshare ${ns_mount[*]})"
fi

if [ "$failed" != 0 ]; then echo "FAIL: $failed of $ran checks"; exit 1; fi
if [ "$ran" = 0 ]; then echo "SKIP: no check could run"; exit 77; fi
echo "PASS: $ran checks"
