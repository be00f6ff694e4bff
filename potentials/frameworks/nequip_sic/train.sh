#!/usr/bin/env bash
# nequip_sic.ckpt and allegro_sic.ckpt: a tiny NequIP (3 layers, l_max 1, 8
# features, r_max 4 A, ZBL, float64) and a tiny Allegro (2 layers, l_max 1,
# float64) trained by nequip's own nequip-train (hydra configs nequip.yaml and
# allegro.yaml) on sic.xyz (make_data.py), 15 epochs each on the CPU (about 3
# and 2 minutes on one core). Writes the two checkpoints here.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../../.." && pwd)
work=$(mktemp -d)
cd "$work"
for model in nequip allegro; do
  OMP_NUM_THREADS=1 "$root/.venv/bin/nequip-train" -cp "$here" -cn "$model.yaml" \
    hydra.run.dir="$work/$model" data.split_dataset.file_path="$here/sic.xyz"
  cp "$work/$model/best.ckpt" "$here/${model}_sic.ckpt"
done
rm -rf "$work"
