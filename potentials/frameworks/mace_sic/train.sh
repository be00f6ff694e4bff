#!/usr/bin/env bash
# mace_sic.model: a tiny MACE (2 interactions, 8x0e+8x1o, max_L 1, correlation
# 2, r_max 4.5 A, float64, 3,568 parameters) trained by MACE's own CLI on
# train.xyz (make_data.py) in MACE's environment (.venv-mace, tools/setup.sh);
# about 1 minute on one core. Writes mace_sic.model here.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../../.." && pwd)
work=$(mktemp -d)
cd "$work"
OMP_NUM_THREADS=1 "$root/.venv-mace/bin/mace_run_train" \
  --name mace_sic --seed 1 \
  --train_file "$here/train.xyz" --valid_fraction 0.1 --test_file "$here/test.xyz" \
  --energy_key REF_energy --forces_key REF_forces --stress_key REF_stress \
  --E0s average \
  --model ScaleShiftMACE --num_interactions 2 --hidden_irreps '8x0e+8x1o' --max_L 1 \
  --correlation 2 --max_ell 2 --r_max 4.5 --num_radial_basis 6 --radial_MLP '[16,16]' --MLP_irreps '8x0e' \
  --loss stress --compute_stress True \
  --batch_size 4 --valid_batch_size 4 --max_num_epochs 60 --swa --start_swa 45 \
  --default_dtype float64 --device cpu
cp mace_sic.model "$here/mace_sic.model"
rm -rf "$work"
