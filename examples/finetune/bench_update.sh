#!/usr/bin/env bash
# Usage: examples/finetune/bench_update.sh [cells per side, default 3 (216 atoms)] [steps, default 50] [ranks, default 1]
# Prints the MD-only and MD+update Loop times of the same process and the
# cost of one update in MD steps: (t_update/t_md - 1).
set -euo pipefail
cd "$(dirname "$0")"
n=${1:-3}; steps=${2:-50}; np=${3:-1}
log=$(mktemp)
mpirun --allow-run-as-root --oversubscribe -np "$np" ../../build/lmp -in in.bench_update \
  -var n "$n" -var steps "$steps" -log none -echo none > "$log"
grep "Loop time" "$log" | tail -n 6 | awk -v n="$n" -v s="$steps" '
  NR % 2 == 1 { md = $4 }
  NR % 2 == 0 { r = $4 / md; printf "atoms %d, %d steps: MD %.3f s, MD + update every step %.3f s, ratio %.2f -> one update = %.2f MD steps\n", 8*n*n*n, s, md, $4, r, r - 1 }'
rm -f "$log"
