#!/usr/bin/env bash
# tools/gpu/fetch_wheel.sh NAME VERSION [DIR]: PyPI's wheel of NAME==VERSION
# for the GPU machine (CPython 3.12, x86-64 manylinux), downloaded into DIR
# (default: the wheels/ folder of ML-TORCH's download cache) unless it is
# there; prints its path.
set -euo pipefail
[ $# = 2 ] || [ $# = 3 ] || { echo "usage: tools/gpu/fetch_wheel.sh NAME VERSION [DIR]" >&2; exit 2; }
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
file=${1//-/_}
dir=${3:-${ML_TORCH_CACHE:-$HOME/.cache/ml-torch}/wheels}
mkdir -p "$dir"
ls "$dir/$file-$2-"*.whl >/dev/null 2>&1 \
  || "${ML_TORCH_PYTHON:-$here/.venv/bin/python}" -m pip download -q --no-deps --only-binary=:all: \
       --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
       --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$dir" "$1==$2" >&2
ls "$dir/$file-$2-"*.whl | head -1
