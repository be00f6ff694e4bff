#!/bin/bash
# Compile the shipped ML models into AOTInductor packages (potentials/*.pt2)
# with mltorch-compile, for this machine's CPU and LibTorch. Compiled code is
# specific to both, so the packages are made here, not shipped. A package
# newer than its .pt (and compiled by the same torch, vector width and graph
# passes) is kept.
#   tools/compile_models.sh [model ...]     (default: the models below)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
py=$here/.venv/bin/python
models=("$@")
[ ${#models[@]} -gt 0 ] || models=(lj_Ar si_local si_mp2 sic_local)
torch_version=$("$py" -c "import torch; print(torch.__version__)" 2>/dev/null)
for m in "${models[@]}"; do
  pt=$here/potentials/$m.pt
  pt2=$here/potentials/$m.pt2
  if [ -f "$pt2" ] && [ "$pt2" -nt "$pt" ] &&
     "$py" - "$pt2" "$torch_version" 2>/dev/null <<'PY'
import sys
from mltorch.compiled import DEFAULT_SIMDLEN, GRAPH_PASSES, read_package
from mltorch.export import read_metadata
twin_meta = read_metadata(sys.argv[1].rsplit(".", 1)[0] + ".pt")
info = read_package(sys.argv[1])[1]
# a layered model's package needs its compiled stages
stages_ok = "layered" not in twin_meta or bool(info.get("stages"))
sys.exit(0 if info["torch_version"] == sys.argv[2] and info.get("simdlen") == DEFAULT_SIMDLEN
         and info.get("graph_passes") == GRAPH_PASSES and stages_ok else 1)
PY
  then
    continue
  fi
  start=$(date +%s)
  "$here/.venv/bin/mltorch-compile" "$pt" -o "$pt2" 2> >(grep -v -i -E "warn|^W[0-9]{4}" >&2)
  echo "  ($(( $(date +%s) - start )) s)"
done
