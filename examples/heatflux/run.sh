#!/usr/bin/env bash
# examples/heatflux: Green-Kubo thermal conductivity of crystalline Si with
# the message-passing model potentials/si_mp2.pt (README.md has the numbers)
#   ./run.sh [--steps N] [--np N] [--quick]
# --quick: 200 NVE steps after 100 NVT steps: what ctest runs
set -euo pipefail
cd "$(dirname "$0")"
root=$(cd ../.. && pwd)
lmp=${LMP:-$root/build/lmp}
py=$root/.venv/bin/python
steps=20000
neq=2000
np=2
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    --np) np=$2; shift 2 ;;
    --quick) steps=400; neq=100; shift ;;
    *) echo "usage: run.sh [--steps N] [--np N] [--quick]" >&2; exit 2 ;;
  esac
done
export OMP_NUM_THREADS=1
mpirun_flags=${MPIRUN_FLAGS:---allow-run-as-root --oversubscribe}
start=$(date +%s)
# shellcheck disable=SC2086
mpirun $mpirun_flags -np "$np" "$lmp" -in in.heatflux -var nrun "$steps" -var neq "$neq" -log log.lammps
echo "wall time: $(( $(date +%s) - start )) s for $neq NVT + $steps NVE steps on $np rank(s)"
"$py" analyse.py J0Jt.dat --log log.lammps -o heatflux.png
