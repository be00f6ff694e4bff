#!/usr/bin/env bash
# examples/dft: SevenNet-0 fine-tuned online against CP2K (PBE) on 2 replicas
# (about 15 minutes on 2 cores; README.md has the numbers):
#   1. imports SevenNet-0 for Si if needed (about a minute)
#   2. runs in.dft on 2 replicas, each labelled by its own CP2K in driver
#      mode (the i-PI protocol), started when the replica's socket exists
#   3. trains the original model offline on the run's CP2K labels (in.retrain:
#      torch/train, DDP over 2 ranks)
#   4. makes held-out configurations with the original model (in.heldout),
#      labels them with CP2K's own ENERGY_FORCE runs, and compares the force
#      error of the original, the fine-tuned and the offline-trained model on
#      them (analyse.py)
#   ./run.sh [--steps N] [--heldout-steps N] [--quick]
# --quick: 10 MD steps (2 labels per replica), 2 held-out frames: what ctest runs
set -euo pipefail
cd "$(dirname "$0")"
root=$(cd ../.. && pwd)
lmp=${LMP:-$root/build/lmp}
py=$root/.venv/bin/python
steps=300
heldout=400
every=40
epochs=20
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    --heldout-steps) heldout=$2; shift 2 ;;
    --quick) steps=10; heldout=40; every=20; epochs=2; shift ;;
    *) echo "usage: run.sh [--steps N] [--heldout-steps N] [--quick]" >&2; exit 2 ;;
  esac
done
command -v cp2k.psmp >/dev/null || { echo "ERROR: cp2k.psmp not found (tools/setup.sh installs Debian's cp2k)" >&2; exit 1; }
export OMP_NUM_THREADS=1
mpirun_flags=${MPIRUN_FLAGS:---allow-run-as-root --oversubscribe}
# CP2K's settings (tools/cp2k_input.py): PBE, GTH pseudopotentials, a small
# MOLOPT basis and cutoff so that a label takes seconds on one core
cp2k_args=(--elements Si --basis SZV-MOLOPT-SR-GTH --cutoff 120 --rel-cutoff 30 --eps-scf 1e-7)

[ -f 7net-0_Si.pt ] || "$root/.venv/bin/mltorch-import" sevenn 7net-0 --elements Si -o 7net-0_Si.pt

# --- fine-tuning: LAMMPS (2 replicas) and one CP2K per replica
name=mltorch_dft_$$
# the labels of this run (labels dft_labels.xyz: one file per replica); a
# run appends to a file that is there, so a new run starts them afresh
rm -f dft_labels.0.xyz dft_labels.1.xyz
start=$(date +%s)
# shellcheck disable=SC2086
mpirun $mpirun_flags -np 2 "$lmp" -partition 2x1 -pscreen none -nocite -in in.dft -log log.dft \
  -var steps "$steps" -var name "$name" &
server=$!
for k in 0 1; do
  (
    # the server listens once its run starts (after writing system.k.data)
    while [ ! -S "/tmp/ipi_${name}_$k" ]; do
      kill -0 "$server" 2>/dev/null || exit 0
      sleep 0.1
    done
    "$py" "$root/tools/cp2k_input.py" "system.$k.data" "${cp2k_args[@]}" --driver "${name}_$k" \
      --project "cp2k.$k" -o "cp2k.$k.inp"
    exec cp2k.psmp -i "cp2k.$k.inp" -o "cp2k.$k.out"
  ) &
done
status=0
wait "$server" || status=$?
wait || true
[ "$status" = 0 ] || { echo "ERROR: the fine-tuning run failed (log.dft.0, log.dft.1, cp2k.*.out)" >&2; exit 1; }
train_wall=$(( $(date +%s) - start ))
grep -h "^replica" log.dft.0 log.dft.1
# every CP2K label kept: extended XYZ that ASE (and MACE's, NequIP's and
# SevenNet's trainers) read
"$py" -c "import ase.io, sys
for k in (0, 1):
    f = ase.io.read(f'dft_labels.{k}.xyz', ':')
    print(f'dft_labels.{k}.xyz: {len(f)} CP2K labels (steps {f[0].info[\"step\"]} to {f[-1].info[\"step\"]})')
"

# --- the same labels trained offline, from the same start
cat dft_labels.0.xyz dft_labels.1.xyz > dft_labels.xyz
start=$(date +%s)
# shellcheck disable=SC2086
mpirun $mpirun_flags -np 2 "$lmp" -nocite -in in.retrain -log log.retrain -var epochs "$epochs" > /dev/null
echo "offline: $(grep -c 'Lattice=' dft_labels.xyz) labels, $epochs epochs in $(( $(date +%s) - start )) s (log.retrain)"
grep "^torch/train: epoch" log.retrain | tail -n 1

# --- held-out configurations and the comparison
# shellcheck disable=SC2086
mpirun $mpirun_flags -np 2 "$lmp" -partition 2x1 -pscreen none -nocite -in in.heldout \
  -log log.heldout -var steps "$heldout" -var every "$every"
"$py" analyse.py --lmp "$lmp" --train-wall "$train_wall" "${cp2k_args[@]}"
