#!/bin/bash
# Submit a chain of N fine-tuning jobs: each starts when the one before it
# has ended successfully (--dependency=afterok) and continues from its
# restart files and model (finetune.sbatch finds the last complete set).
#
#   ./chain.sh N [sbatch options...]     e.g. ./chain.sh 3 --export=ALL,JOB_CHUNKS=100
#
# A job that fails cancels the ones after it (--kill-on-invalid-dep=yes; without
# it they would stay PENDING, reason DependencyNeverSatisfied); a job stopped
# by its time-limit signal ends COMPLETED, so the next one continues. SBATCH= names another
# sbatch command (tools/slurm-local.sh exec sbatch for the local test cluster).
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 N [sbatch options...]" >&2; exit 2; }
n=$1; shift
here=$(cd "$(dirname "$0")" && pwd)
read -r -a sbatch <<< "${SBATCH:-sbatch}"
dep=()
for ((k = 1; k <= n; k++)); do
  id=$("${sbatch[@]}" --parsable --kill-on-invalid-dep=yes "${dep[@]}" "$@" "$here/finetune.sbatch")
  id=${id%%;*}
  echo "$id"
  dep=(--dependency=afterok:$id)
done
