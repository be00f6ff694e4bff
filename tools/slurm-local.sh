#!/usr/bin/env bash
# A one-node Slurm on this machine, for testing batch scripts (examples/slurm
# or any other): slurmctld + slurmd + munged of Debian 12 (slurm-wlm 22.05,
# munge 0.5.15), with Open MPI 4.1 and PMIx, so `srun --mpi=pmix`, `mpirun`,
# job arrays, dependencies, --signal and scancel behave as on a cluster.
#
#   tools/slurm-local.sh up              start it (the first time also makes its
#                                        root: about 2 minutes; kept in
#                                        $ML_TORCH_CACHE/slurm-debian12)
#   tools/slurm-local.sh status          daemons, sinfo and squeue
#   tools/slurm-local.sh exec CMD...     run a Slurm client command against it
#                                        from the current directory, e.g.
#                                        exec sbatch job.sbatch, exec squeue
#   tools/slurm-local.sh down            cancel every job, stop the daemons and
#                                        every process left in the root
#
# Where it runs: in a Debian 12 root of its own (debootstrap), not on the host.
#   - A machine that uses this checkout may already be a Slurm client of a real
#     cluster (/etc/slurm, /etc/munge/munge.key, the munge and slurm users);
#     `apt-get install slurm-wlm munge` there would rewrite that set-up and its
#     post-install scripts would try to start services. In the root, the
#     packages, the configuration, the munge key, the state and the logs are
#     all private, and the host's /etc is never touched. The daemons listen on
#     ports 16817/16818, not Slurm's 6817/6818, so a real slurmd on the host
#     does not clash with them.
#   - The daemons run in a private mount namespace (unshare --mount) into which
#     /proc, /dev, /sys, /tmp, the checkout and the ML-TORCH cache (where the
#     LAMMPS tree that build/lammps-potentials links to lives) are bound at
#     the same paths, so a job sees every file of the checkout (build/lmp,
#     .venv, potentials/) and of /tmp under the names it has on the host, and
#     its output lands there. The mounts exist only in that namespace, which ends with its last
#     process: after `down` nothing is mounted and nothing of it runs (`down`
#     checks both), and the root can be deleted with rm -rf at any time.
#   - The root is Debian 12 like the host, so build/lmp (linked against the
#     host's Open MPI 4.1.4 and libstdc++) runs in it unchanged.
# What a job does not see: host programs outside the checkout (the root has
# Slurm, Open MPI, Python 3 and coreutils), and the host's network services
# other than through localhost. Jobs run as the user who submitted them
# (root here; Open MPI's mpirun then needs OMPI_ALLOW_RUN_AS_ROOT=1 and
# OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1, which `exec` sets).
#
# Configuration: one node "localhost" with this machine's CPUs and memory, one
# partition "debug", cons_tres by core, proctrack/linuxproc and task/none (no
# cgroups, no systemd), MpiDefault=pmix, no accounting (sacct does not work;
# `scontrol show job` keeps finished jobs for MinJobAge=600 s). Every `up`
# starts from an empty state (job IDs from 1). Needs root (debootstrap, chroot,
# mount namespaces) and, the first time, the Debian mirror the host uses.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${ML_TORCH_CACHE:-$HOME/.cache/ml-torch}
root=$cache/slurm-debian12
# libpmix-dev: Slurm's PMIx plugin dlopens the unversioned libpmix.so, which only
# the -dev package has (without it srun --mpi=pmix says "can not load PMIx library")
packages=(slurm-wlm munge libpmix-dev openmpi-bin python3 procps)
ctld_port=16817
slurmd_port=16818
# the ML-TORCH cache too: build/lammps-potentials links into the LAMMPS tree there
binds=(/tmp "$here" "$cache")

usage() { echo "usage: $0 up | down | status | exec CMD..." >&2; exit 2; }
say() { echo "slurm-local: $*"; }

# real_path PATH: PATH with every symlink resolved (PATH need not exist). The
# kernel names a process's root (/proc/PID/root) and mount points (/proc/mounts,
# mountinfo) so; compared with $root as written (the cache path may pass
# through a symlink) they would never match
real_path() { realpath -m -- "$1"; }

# host_debian_uri: the Debian mirror the host's apt already uses
# shellcheck source=tools/debian-mirror.sh
. "$here/tools/debian-mirror.sh"

# in_root DIR CMD...: CMD inside the root DIR, in a new private mount namespace
# with /proc, /dev, /sys and the binds, from the caller's directory (which
# must be under one of the binds). A daemon started this way keeps the
# namespace alive; the namespace and its mounts go with its last process.
in_root() {
  local dir=$1; shift
  local d ok=0
  for d in "${binds[@]}"; do
    case "$PWD/" in "$d"/*) ok=1 ;; esac
  done
  [ "$ok" = 1 ] || { echo "ERROR: run from a directory under ${binds[*]} (not $PWD): jobs see only those" >&2; exit 1; }
  local script='set -e; r=$1; shift; n=$1; shift
    mount -t proc proc "$r/proc"
    mount --rbind /dev "$r/dev"; mount --make-rslave "$r/dev"
    mount --rbind /sys "$r/sys"; mount --make-rslave "$r/sys"
    for ((k = 0; k < n; k++)); do
      d=$1; shift
      mkdir -p "$r$d"
      mount --bind "$d" "$r$d"
    done
    exec chroot "$r" /usr/bin/env -u LD_LIBRARY_PATH -u LIBRARY_PATH -u CPATH -C "$PWD" \
      PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$@"'
  unshare --mount --propagation private /bin/bash -c "$script" in-root "$dir" "${#binds[@]}" "${binds[@]}" "$@"
}

# apt_install DIR: the packages into the root DIR
apt_install() {
  local dir=$1 apt=(env DEBIAN_FRONTEND=noninteractive apt-get -y -qq -o Dpkg::Use-Pty=0)
  say "apt-get install in the root: ${packages[*]} (log: $dir.log)"
  (cd "$here" &&
   { in_root "$dir" "${apt[@]}" update &&
     in_root "$dir" "${apt[@]}" install --no-install-recommends "${packages[@]}" &&
     in_root "$dir" apt-get clean; } >> "$dir.log" 2>&1) \
    || { tail -20 "$dir.log"; echo "ERROR: apt-get in the root failed (log: $dir.log)" >&2; exit 1; }
  [ -e "$dir/usr/lib/x86_64-linux-gnu/pmix2/lib/libpmix.so" ] \
    || { echo "ERROR: the root has no libpmix.so for Slurm's PMIx plugin" >&2; exit 1; }
  echo "${packages[*]}" > "$dir/.ml-torch-complete"
}

create_root() {
  if [ -f "$root/.ml-torch-complete" ]; then
    # a root made for another package list gets the missing ones
    [ "$(cat "$root/.ml-torch-complete")" = "${packages[*]}" ] || apt_install "$root"
    return 0
  fi
  if ! command -v debootstrap >/dev/null; then
    say "installing debootstrap"
    apt-get install -y -qq debootstrap >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq debootstrap >/dev/null; }
  fi
  local uri tmp t0=$SECONDS
  uri=$(host_debian_uri)
  tmp=$root.partial
  # debootstrap's own mounts die with it and in_root mounts in a private
  # namespace, but never delete through a mount
  if grep -qF " $(real_path "$tmp")/" /proc/mounts; then
    echo "ERROR: $tmp has mounts (see /proc/mounts); unmount them first" >&2; exit 1
  fi
  rm -rf "$tmp" "$tmp.log"
  mkdir -p "$cache"
  say "debootstrap bookworm from $uri into $tmp (log: $tmp.log)"
  debootstrap --variant=minbase bookworm "$tmp" "$uri" > "$tmp.log" 2>&1 \
    || { tail -20 "$tmp.log"; echo "ERROR: debootstrap failed (log: $tmp.log)" >&2; exit 1; }
  cp /etc/resolv.conf "$tmp/etc/resolv.conf"
  # the archive's Release files are past their Valid-Until here, as on the host
  printf 'Acquire::Check-Valid-Until "false";\nAcquire::Check-Date "false";\nAcquire::Languages "none";\n' \
    > "$tmp/etc/apt/apt.conf.d/99ml-torch"
  printf 'deb %s bookworm main\n' "$uri" > "$tmp/etc/apt/sources.list"
  # no service is started by the packages' scripts: `up` starts the daemons
  printf '#!/bin/sh\nexit 101\n' > "$tmp/usr/sbin/policy-rc.d"
  chmod +x "$tmp/usr/sbin/policy-rc.d"
  # a minimal root has no /etc/hosts: without localhost slurmd cannot register
  printf '127.0.0.1 localhost\n::1 localhost ip6-localhost\n' > "$tmp/etc/hosts"
  apt_install "$tmp"
  mv "$tmp" "$root"
  mv "$tmp.log" "$root.log"
  say "root $root made in $((SECONDS - t0)) s ($(chroot "$root" dpkg-query -W -f='slurm-wlm ${Version}' slurm-wlm))"
}

# is_in_root PID: whether the root directory of process PID is the Slurm root
is_in_root() {
  local r
  r=$(readlink -f "/proc/$1/root" 2>/dev/null) && [ -n "$r" ] && [ "$r" = "$(real_path "$root")" ]
}

# PIDs of the processes whose root directory is the Slurm root (the daemons,
# jobs and clients), found through /proc: only ours
root_pids() {
  local p r want
  want=$(real_path "$root")
  for p in /proc/[0-9]*; do
    r=$(readlink -f "$p/root" 2>/dev/null) || continue
    [ -n "$r" ] && [ "$r" = "$want" ] && echo "${p#/proc/}"
  done
  return 0
}

# pid_of NAME: the PID in the root's pid file of daemon NAME, if it runs in the root
pid_of() {
  local f pid
  case "$1" in
    munged) f=$root/run/munge/munged.pid ;;
    *) f=$root/run/$1.pid ;;
  esac
  [ -f "$f" ] || return 1
  pid=$(cat "$f" 2>/dev/null) || return 1
  [ -n "$pid" ] && is_in_root "$pid" || return 1
  echo "$pid"
}

# the CPUs this machine gives us (GNU nproc also honours OMP_NUM_THREADS,
# which a user running one thread per rank has set to 1)
machine_cpus() { env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc; }
is_up() { pid_of slurmctld >/dev/null && pid_of slurmd >/dev/null && pid_of munged >/dev/null; }

write_config() {
  local cpus mem
  cpus=$(machine_cpus)
  mem=$(awk '/^MemTotal:/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)
  mkdir -p "$root/etc/slurm"
  cat > "$root/etc/slurm/slurm.conf" <<EOF
# written by tools/slurm-local.sh: a one-node test cluster
ClusterName=mltorch-local
SlurmctldHost=localhost
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
MpiDefault=pmix
MailProg=/bin/true
ReturnToService=2
MinJobAge=600
KillWait=10
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
}

up() {
  if is_up; then say "already up"; return 0; fi
  if [ -n "$(root_pids)" ]; then
    echo "ERROR: processes of an earlier Slurm are still running in $root ($(root_pids | tr '\n' ' ')); run: $0 down" >&2
    exit 1
  fi
  local t0=$SECONDS
  create_root
  write_config
  # a fresh state every time: no jobs of an earlier session, job IDs from 1
  rm -rf "$root/var/spool/slurmctld" "$root/var/spool/slurmd" "$root/var/log/slurm"
  mkdir -p "$root/var/spool/slurmctld" "$root/var/spool/slurmd" "$root/var/log/slurm"
  rm -f "$root/run/slurmctld.pid" "$root/run/slurmd.pid"
  (cd "$here" && in_root "$root" /bin/sh -c '
     set -e
     mkdir -p /run/munge /var/log/munge /var/lib/munge
     chown munge:munge /run/munge /var/log/munge /var/lib/munge /etc/munge
     chmod 0755 /run/munge
     [ -s /etc/munge/munge.key ] || { mungekey --create --keyfile=/etc/munge/munge.key; chown munge:munge /etc/munge/munge.key; }
     chmod 0400 /etc/munge/munge.key
     rm -f /run/munge/munged.pid
     setpriv --reuid=munge --regid=munge --init-groups /usr/sbin/munged --origin=127.0.0.1
     /usr/sbin/slurmctld
     /usr/sbin/slurmd -N localhost')
  local k state=""
  for ((k = 0; k < 120; k++)); do
    state=$(cd "$here" && in_root "$root" timeout 5 sinfo -h -N -o %t 2>/dev/null || true)
    [ "$state" = idle ] && break
    sleep 0.5
  done
  if [ "$state" != idle ]; then
    echo "ERROR: the node did not become idle (state '$state'); logs in $root/var/log/slurm" >&2
    grep -h -i error "$root/var/log/slurm/slurmctld.log" "$root/var/log/slurm/slurmd.log" | tail -n 5 >&2 || true
    down
    exit 1
  fi
  say "up in $((SECONDS - t0)) s: node localhost ($(machine_cpus) CPUs), partition debug; submit with: $0 exec sbatch ..."
}

down() {
  local pids p k
  if pid_of slurmctld >/dev/null; then
    (cd "$here" && in_root "$root" scancel --user="$(id -un)" --quiet 2>/dev/null) || true
    for ((k = 0; k < 20; k++)); do
      [ -z "$(cd "$here" && in_root "$root" squeue -h -o %i 2>/dev/null)" ] && break
      sleep 0.5
    done
  fi
  for p in slurmd slurmctld munged; do
    pid_of "$p" >/dev/null && kill -TERM "$(pid_of "$p")" 2>/dev/null || true
  done
  # then whatever is left in the root (a job step that outlived its job:
  # without cgroups Slurm cannot always find all of a job's processes)
  for ((k = 0; k < 40; k++)); do
    pids=$(root_pids)
    [ -z "$pids" ] && break
    [ "$k" = 20 ] && { say "still running in the root, killing: $(echo $pids)"; kill -KILL $pids 2>/dev/null || true; }
    sleep 0.25
  done
  pids=$(root_pids)
  if [ -n "$pids" ]; then
    echo "ERROR: processes still run in $root: $(echo $pids)" >&2; exit 1
  fi
  if grep -qF " $(real_path "$root")/" /proc/self/mountinfo; then
    echo "ERROR: something is still mounted under $root (see /proc/self/mountinfo)" >&2; exit 1
  fi
  say "down: no process runs in $root and nothing is mounted there"
}

status() {
  if ! is_up; then
    say "down$( [ -n "$(root_pids)" ] && echo " (but processes run in the root: $(root_pids | tr '\n' ' '); run: $0 down)")"
    return 3
  fi
  say "up: slurmctld $(pid_of slurmctld), slurmd $(pid_of slurmd), munged $(pid_of munged) in $root"
  cd "$here"
  in_root "$root" sinfo
  in_root "$root" squeue
}

client() {
  is_up || { echo "ERROR: the local Slurm is not up (run: $0 up)" >&2; exit 1; }
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 in_root "$root" "$@"
}

[ $# -ge 1 ] || usage
[ "$(id -u)" -eq 0 ] || { echo "ERROR: $0 needs root (debootstrap, chroot, mount namespaces)" >&2; exit 1; }
cmd=$1; shift
case "$cmd" in
  up) [ $# -eq 0 ] || usage; up ;;
  down) [ $# -eq 0 ] || usage; down ;;
  status) [ $# -eq 0 ] || usage; status ;;
  exec) [ $# -ge 1 ] || usage; client "$@" ;;
  *) usage ;;
esac
