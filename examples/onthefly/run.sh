#!/usr/bin/env bash
# The five runs of README.md (about 17 minutes on 2 cores), then the analysis:
# uncertainty-gated labels at 0.3 and 0.5 eV/A, and labels every 10, 20 and
# 40 steps without a gate.
set -euo pipefail
cd "$(dirname "$0")"
lmp=${LMP:-../../build/lmp}
run() { mpirun -np 2 "$lmp" -partition 2x1 -pscreen none -nocite -in in.onthefly "$@"; }
run -log log.gated
run -log log.gated50 -var low 0.5 -var tag gated50
for n in 10 20 40; do
  run -log log.every$n -var low 0 -var high 1e300 -var tag every$n -var every $n
done
../../.venv/bin/python analyse.py
