#!/usr/bin/env bash
# The distillation example of README.md (about 10 minutes on 2 cores):
# imports SevenNet-0 for Zn and S if needed (about a minute), makes the
# students if needed (make_students.py, about 2 minutes), runs in.distill on
# 2 replicas and analyses the logs (analyse.py: the numbers and distill.png).
#   ./run.sh [extra lmp arguments, e.g. -var steps 500]
set -euo pipefail
cd "$(dirname "$0")"
root=../..
lmp=${LMP:-$root/build/lmp}
[ -f 7net-0_ZnS.pt ] || "$root/.venv/bin/mltorch-import" sevenn 7net-0 --elements Zn S -o 7net-0_ZnS.pt
[ -f student_c0.pt ] && [ -f student_c1.pt ] || "$root/.venv/bin/python" make_students.py
OMP_NUM_THREADS=1 mpirun ${MPIRUN_FLAGS:---allow-run-as-root --oversubscribe} -np 2 "$lmp" \
  -partition 2x1 -pscreen none -nocite -in in.distill -log log.distill "$@"
"$root/.venv/bin/python" analyse.py log.distill
