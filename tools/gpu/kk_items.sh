#!/usr/bin/env bash
# Items (b) to (f) of the GPU check: torch/kk against pair_style torch on the
# CPU, on examples/gpu/in.gpu_kk (diamond Si, 8 n^3 atoms).
#   tools/gpu/kk_items.sh OUT CPU-LMP KK-LMP "KK-SWITCHES" [python] [sizes]
# CPU-LMP: an lmp with pair_style torch; KK-LMP with KK-SWITCHES: torch/kk,
# e.g. build-gpu-kk/lmp "-k on g 1 -sf kk -pk kokkos newton on neigh half"
# (gpu_check.sh), or the OpenMP lane's lmp-run with "-k on t 1 -sf kk -pk
# kokkos newton on neigh half" (its rehearsal of the comparisons).
# sizes: cells per side for (b), default "8 16 24 32" (4k, 32k, 110k and
# 262k atoms); the CPU reference runs 5 steps above 8 cells, and the first
# size torch/kk cannot run ends the list ("the largest size that fits").
# Every line of the report goes to ML_TORCH_GPU_REPORT (default
# OUT/report.txt) as well. ML_TORCH_GPU_MODELS: the folder of the models
# (tools/gpu/models.py unpack) instead of the repository's.
# (c) runs when ML_TORCH_GPU_KK2 is the command that starts KK-LMP on two
# ranks (e.g. "mpirun -n 2 build-gpu-bin/run/lmp.sh", or the lane's
# "lmp-run -np 2"): si_mp2 at the second size, comm device and comm host.
# (e) runs when ML_TORCH_GPU_SEVENNET names an imported SevenNet-0 in that
# folder (gpu_check.sh imports it), at ML_TORCH_GPU_SEVENNET_N cells (4).
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
say() { echo "$*" | tee -a "${ML_TORCH_GPU_REPORT:-$out/report.txt}"; }
failed=0
# compare.py; a difference over ML_TORCH_GPU_TOL (1e-10) is printed and counted
cmp_() { "$py" "$here/tools/gpu/compare.py" "$@" || { echo " (over the tolerance)"; failed=$((failed + 1)); }; }
# run WHICH TAG VARS...: one in.gpu_kk run on the CPU (cpu), torch/kk (kk)
# or torch/kk on two ranks (kk2, with the switches that follow TAG up to --)
run() {
  local which=$1 tag=$2 extra=()
  shift 2
  if [ "$which" = kk2 ]; then
    while [ "$1" != -- ]; do extra+=("$1"); shift; done
    shift
  fi
  local vars=("$@" -var out "$out" -var sw "$sw")    # the first -var of a name holds: the caller's go first
  [ -n "${ML_TORCH_GPU_MODELS:-}" ] && vars+=(-var models "$ML_TORCH_GPU_MODELS" -var perturbed "$ML_TORCH_GPU_MODELS")
  if [ "$which" = cpu ]; then
    "$cpu" -in in.gpu_kk -var device cpu "${vars[@]}" -log "$out/log.$tag.cpu" -echo none -screen none > /dev/null 2>&1
  elif [ "$which" = kk ]; then
    "$kk" "${switches[@]}" -in in.gpu_kk -var device kk "${vars[@]}" -log "$out/log.$tag.kk" -echo none -screen none \
      > "$out/screen.$tag.kk" 2>&1
  else
    local launch
    read -r -a launch <<< "$ML_TORCH_GPU_KK2"
    "${launch[@]}" "${switches[@]}" "${extra[@]}" -in in.gpu_kk -var device kk "${vars[@]}" -log "$out/log.$tag.kk" \
      -echo none -screen none > "$out/screen.$tag.kk" 2>&1
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
# (c) two ranks on the device, the KOKKOS communication on the device and on
# the host: si_mp2 (the per-layer halo exchange) at the second size
read -r -a sz <<< "$sizes"
nc=${sz[1]:-${sz[0]}}
if [ -n "${ML_TORCH_GPU_KK2:-}" ] && [ -f "$out/atoms.md.si_mp2.$nc.cpu" ]; then
  for comm in device host; do
    mkdir -p "$out/c-$comm"
    run kk2 "c-$comm" comm "$comm" -- -var task md -var model si_mp2 -var n "$nc" -var out "$out/c-$comm" \
      && say "(c) torch/kk on 2 ranks, comm $comm, si_mp2, $((8 * nc * nc * nc)) atoms:" \
             "$(cmp_ atoms "$out/atoms.md.si_mp2.$nc.cpu" "$out/c-$comm/atoms.md.si_mp2.$nc.kk");" \
             "1 and 2 ranks: $(cmp_ speed "$out/log.md.si_mp2.$nc.kk" "$out/log.c-$comm.kk")" \
      || say "(c) torch/kk on 2 ranks, comm $comm: failed (log $out/log.c-$comm.kk)"
  done
elif [ -z "${ML_TORCH_GPU_KK2:-}" ]; then
  say "(c) torch/kk on 2 ranks: not run (no MPI launcher given: ML_TORCH_GPU_KK2)"
fi
# (d) fine-tuning labels and gradient (Stillinger-Weber teacher, an update
# every 5 steps) under torch/kk with the KOKKOS communication on the device
n=4
run cpu finetune -var task finetune -var model si_mp2 -var n $n \
  && switches+=(comm device) && run kk finetune -var task finetune -var model si_mp2 -var n $n \
  && say "(d) fix torch/finetune under torch/kk (comm device) vs the CPU, 20 steps, 4 updates: pe, loss, force RMSE," \
         "gradient norm, updates: $(cmp_ thermo "$out/log.finetune.cpu" "$out/log.finetune.kk")" \
  || say "(d) fix torch/finetune under torch/kk: failed (logs $out/log.finetune.*)"
# (e) an imported SevenNet-0 (5 layers, float64): forces and per-atom
# quantities against the CPU (2 steps there), atom-steps/s over 20 steps
if [ -n "${ML_TORCH_GPU_SEVENNET:-}" ]; then
  ne=${ML_TORCH_GPU_SEVENNET_N:-4} m=$ML_TORCH_GPU_SEVENNET
  run cpu "md.$m.$ne" -var task md -var model "$m" -var n "$ne" -var steps 2 \
    && run kk "md.$m.$ne" -var task md -var model "$m" -var n "$ne" -var steps 20 \
    && say "(e) torch/kk SevenNet-0, $((8 * ne * ne * ne)) atoms: $(cmp_ atoms "$out/atoms.md.$m.$ne.cpu" "$out/atoms.md.$m.$ne.kk");" \
           "CPU and torch/kk: $(cmp_ speed "$out/log.md.$m.$ne.cpu" "$out/log.md.$m.$ne.kk")" \
    || say "(e) torch/kk SevenNet-0: failed (logs $out/log.md.$m.$ne.*)"
else
  say "(e) SevenNet-0 under torch/kk: not run (no imported SevenNet-0: ML_TORCH_GPU_SEVENNET)"
fi
# (f) compute torch/deviation (si_mp2 and a perturbed copy as a committee)
run cpu deviation -var task deviation -var model si_mp2 -var n $n \
  && run kk deviation -var task deviation -var model si_mp2 -var n $n \
  && say "(f) compute torch/deviation under torch/kk vs the CPU, 20 steps: pe and outputs 1-4:" \
         "$(cmp_ thermo "$out/log.deviation.cpu" "$out/log.deviation.kk")" \
  || say "(f) compute torch/deviation under torch/kk: failed (logs $out/log.deviation.*)"
[ "$failed" = 0 ] || say "torch/kk vs the CPU: $failed comparison(s) over the tolerance ${ML_TORCH_GPU_TOL:-1e-10}"
exit "$failed"
