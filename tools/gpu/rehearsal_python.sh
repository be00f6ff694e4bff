#!/usr/bin/env bash
# A Python like the GPU machine's, for the rehearsal of the GPU check:
#   tools/gpu/rehearsal_python.sh [PYTHON3.12]      -> build-gpu-bin/py312/bin/python
# Python 3.12 with PyPI's torch 2.11.0 (its CUDA 13.0 build, the GPU
# machine's) and the packages the check uses that the machine has (numpy,
# e3nn, torch_geometric, pandas, scikit-learn, ...). What the machine lacks
# (sevenn, ase, ...) is not installed: the check installs it from
# gpu-carry/wheels, here as there. The torch wheel is installed without its
# nvidia-* packages (gigabytes): its libraries find this machine's .venv's
# CUDA 13 libraries of the same names through a link to their folder, as
# they would find their own. So the models are exported, SevenNet-0 is
# imported and the carried lmp runs with the same torch as on the GPU machine.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
py312=${1:-}
if [ -z "$py312" ]; then   # python3.12 on PATH, else a pyenv one
  for p in python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3.12; do
    "$p" -c pass 2>/dev/null && py312=$p && break
  done
fi
[ -n "$py312" ] || { echo "ERROR: no python3.12 here (give one as the argument)" >&2; exit 1; }
venv=$here/build-gpu-bin/py312
nvidia=$("$here/.venv/bin/python" -c "import nvidia; print(list(nvidia.__path__)[0])")
[ -d "$nvidia/cu13" ] || { echo "ERROR: no CUDA 13 nvidia libraries in $here/.venv (tools/setup.sh)" >&2; exit 1; }
[ -x "$venv/bin/python" ] || "$py312" -m venv "$venv"
pip=("$venv/bin/python" -m pip install -q --no-deps --only-binary=:all:)
"${pip[@]}" "$("$here/tools/gpu/fetch_wheel.sh" torch 2.11.0)"
# what the check and SevenNet-0's import use, with what they need, as pip
# resolves it, less torch and its CUDA packages
want=(numpy e3nn torch_geometric pandas scikit-learn scipy pyyaml tqdm requests cloudpickle)
"$venv/bin/python" -m pip install -q --dry-run --ignore-installed --only-binary=:all: --report "$venv/want.json" \
  "${want[@]}" "torch==2.11.0"
mapfile -t pins < <("$venv/bin/python" -c "
import json, sys
for i in json.load(open(sys.argv[1]))['install']:
    m = i['metadata']
    n = m['name'].lower().replace('_', '-')
    if n not in ('torch', 'triton') and not n.startswith(('nvidia-', 'cuda-')):
        print(m['name'] + '==' + m['version'])" "$venv/want.json")
"${pip[@]}" "${pins[@]}"
site=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
ln -sfn "$nvidia" "$site/nvidia"
"$venv/bin/python" -c "import torch, e3nn, torch_geometric; print('rehearsal Python', torch.__version__, 'CUDA', torch.version.cuda)"
