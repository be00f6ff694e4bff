#!/usr/bin/env bash
# torch-LJ vs native lj/cut on the same 32k-atom input, one after the other in
# one invocation; prints timesteps/s of each and their ratio.
set -euo pipefail
cd "$(dirname "$0")"
lmp=${LMP:-../../build/lmp}
np=${NP:-1}
run() { mpirun --allow-run-as-root --oversubscribe -np "$np" "$lmp" -log none -var pstyle "$1" -var nsteps "${NSTEPS:-20}" -in in.lj_bench \
          | awk '/^Performance:/{for(i=1;i<=NF;i++) if($i ~ /timesteps\/s/) print $(i-1)}'; }
t=$(run torch); n=$(run native)
echo "torch:  $t timesteps/s"
echo "native: $n timesteps/s"
awk -v t="$t" -v n="$n" 'BEGIN{printf "native/torch speed ratio: %.2f\n", n/t}'
