#!/usr/bin/env bash
# Items (b), (d) and (f) of the GPU check: torch/kk against pair_style torch
# on the CPU, on examples/gpu/in.gpu_kk (diamond Si, 8 n^3 atoms).
#   tools/gpu/kk_items.sh OUT CPU-LMP KK-LMP "KK-SWITCHES" [python] [sizes]
# CPU-LMP: an lmp with pair_style torch; KK-LMP with KK-SWITCHES: torch/kk,
# e.g. build-gpu-kk/lmp "-k on g 1 -sf kk -pk kokkos newton on neigh half"
# (gpu_check.sh), or the OpenMP lane's lmp-run with "-k on t 1 -sf kk -pk
# kokkos newton on neigh half" (its rehearsal of the comparisons).
# sizes: cells per side for (b), default "8 16 24 32" (4k, 32k, 110k and
# 262k atoms); the CPU reference runs 5 steps above 8 cells, and the first
# size torch/kk cannot run ends the list ("the largest size that fits").
# Every line of the report goes to OUT/report.txt as well. ML_TORCH_GPU_MODELS:
# the folder of the models (tools/gpu/models.py unpack) instead of the
# repository's.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
[ $# -ge 4 ] || { echo "usage: tools/gpu/kk_items.sh OUT CPU-LMP KK-LMP \"KK-SWITCHES\" [python] [sizes]" >&2; exit 2; }
out=$(realpath -m "$1") cpu=$(realpath "$2") kk=$(realpath "$3")
read -r -a switches <<< "$4"
py=$(command -v "${5:-python3}") && py=$(realpath -s "$py") || { echo "ERROR: no Python '${5:-python3}'" >&2; exit 2; }
sizes=${6:-8 16 24 32}
sw=${ML_TORCH_SI_SW:-$here/build/lammps-potentials/Si.sw}
[ -f "$sw" ] || sw=$here/gpu-carry/lammps/potentials/Si.sw
mkdir -p "$out"
cd "$here/examples/gpu" || exit 2
say() { echo "$*" | tee -a "$out/report.txt"; }
failed=0
# compare.py; a difference over ML_TORCH_GPU_TOL (1e-10) is printed and counted
cmp_() { "$py" "$here/tools/gpu/compare.py" "$@" || { echo " (over the tolerance)"; failed=$((failed + 1)); }; }
# run WHICH TAG VARS...: one in.gpu_kk run on the CPU (cpu) or torch/kk (kk)
run() {
  local which=$1 tag=$2
  shift 2
  local vars=(-var out "$out" -var sw "$sw" "$@")
  [ -n "${ML_TORCH_GPU_MODELS:-}" ] && vars+=(-var models "$ML_TORCH_GPU_MODELS" -var perturbed "$ML_TORCH_GPU_MODELS")
  if [ "$which" = cpu ]; then
    "$cpu" -in in.gpu_kk -var device cpu "${vars[@]}" -log "$out/log.$tag.cpu" -echo none -screen none > /dev/null 2>&1
  else
    "$kk" "${switches[@]}" -in in.gpu_kk -var device kk "${vars[@]}" -log "$out/log.$tag.kk" -echo none -screen none \
      > "$out/screen.$tag.kk" 2>&1
  fi
}

# (b) forces, per-atom energy and virial, atom-steps/s: local and layered models
for model in si_local si_mp2; do
  for n in $sizes; do
    tag=md.$model.$n
    steps=5
    [ "$n" -le 8 ] && steps=50
    if ! run kk "$tag" -var task md -var model "$model" -var n "$n"; then
      say "(b) torch/kk $model, $((8 * n * n * n)) atoms: did not run (see $out/log.$tag.kk): the largest size that fits is below it"
      break
    fi
    run cpu "$tag" -var task md -var model "$model" -var n "$n" -var steps "$steps" \
      || { say "(b) CPU reference $model n=$n failed (log $out/log.$tag.cpu)"; continue; }
    say "(b) torch/kk $model, $((8 * n * n * n)) atoms: $(cmp_ atoms "$out/atoms.$tag.cpu" "$out/atoms.$tag.kk");" \
        "CPU and torch/kk: $(cmp_ speed "$out/log.$tag.cpu" "$out/log.$tag.kk")"
  done
done
# (d) fine-tuning labels and gradient (Stillinger-Weber teacher, an update
# every 5 steps) under torch/kk with the KOKKOS communication on the device
n=4
run cpu finetune -var task finetune -var model si_mp2 -var n $n \
  && switches+=(comm device) && run kk finetune -var task finetune -var model si_mp2 -var n $n \
  && say "(d) fix torch/finetune under torch/kk (comm device) vs the CPU, 20 steps, 4 updates: pe, loss, force RMSE," \
         "gradient norm, updates: $(cmp_ thermo "$out/log.finetune.cpu" "$out/log.finetune.kk")" \
  || say "(d) fix torch/finetune under torch/kk: failed (logs $out/log.finetune.*)"
# (f) compute torch/deviation (si_mp2 and a perturbed copy as a committee)
run cpu deviation -var task deviation -var model si_mp2 -var n $n \
  && run kk deviation -var task deviation -var model si_mp2 -var n $n \
  && say "(f) compute torch/deviation under torch/kk vs the CPU, 20 steps: pe and outputs 1-4:" \
         "$(cmp_ thermo "$out/log.deviation.cpu" "$out/log.deviation.kk")" \
  || say "(f) compute torch/deviation under torch/kk: failed (logs $out/log.deviation.*)"
[ "$failed" = 0 ] || say "torch/kk vs the CPU: $failed comparison(s) over the tolerance ${ML_TORCH_GPU_TOL:-1e-10}"
exit "$failed"
