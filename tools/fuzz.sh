#!/usr/bin/env bash
# libFuzzer runs of ML-TORCH's input parsers (a script, not a CI step):
#   fuzz_metadata: the model-metadata JSON parser (src/core/metadata.cpp),
#                  coverage-guided, with AddressSanitizer + UBSan
#   fuzz_restart:  the reader of fix torch/finetune's restart record
#                  (src/core/restart_record.cpp), the same way
#   fuzz_keywords: the keyword parsers of pair_style torch, pair_coeff,
#                  fix torch/finetune and compute torch/deviation, through a
#                  LAMMPS instance (build/'s liblammps). ML-TORCH's styles and
#                  core are built here a second time, with coverage and the
#                  sanitizers, as a plugin that the harness loads over the
#                  built-in styles (-Bsymbolic binds the plugin's calls to its
#                  own code), so the search is guided by the coverage of our
#                  parsers inside LAMMPS; LAMMPS's own code is not instrumented
#   tools/fuzz.sh [SECONDS per target, default 600]
#   (ML_TORCH_FUZZ_TARGETS="restart" tools/fuzz.sh runs only the named targets)
# Needs tools/setup.sh (build/) and clang (Debian's clang-14). Crashers are
# written to fuzz/crashers/ (not kept in git); each one found must become a
# regression test: a metadata input in test_core's metadata table, a keyword
# line in test_pair_errors or test_finetune's FinetuneErrors.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$here"
secs=${1:-600}
cxx=$(command -v clang++-14 || command -v clang++ || true)
[ -n "$cxx" ] || { echo "ERROR: clang++ not found (apt-get install clang-14)" >&2; exit 1; }
[ -f build/CMakeCache.txt ] || { echo "run tools/setup.sh first" >&2; exit 1; }
lammps_dir=$(sed -n 's/^LAMMPS_SOURCE_DIR:PATH=//p' build/CMakeCache.txt)
out=build-fuzz
mkdir -p "$out" fuzz/crashers
san=(-fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -g -O1 -std=c++20)

"$cxx" "${san[@]}" -I src/core fuzz/fuzz_metadata.cpp src/core/metadata.cpp -o "$out/fuzz_metadata"
"$cxx" "${san[@]}" -I src/core fuzz/fuzz_restart.cpp src/core/restart_record.cpp src/core/metadata.cpp \
  -o "$out/fuzz_restart"
mpi_inc=$(mpicxx --showme:incdirs | tr ' ' '\n' | sed 's/^/-I/')
mpi_lib=$(mpicxx --showme:link)
# shellcheck disable=SC2086
"$cxx" "${san[@]}" -DLAMMPS_SMALLBIG -I "$lammps_dir/src" $mpi_inc fuzz/fuzz_keywords.cpp \
  -o "$out/fuzz_keywords" -L build -llammps -Wl,-rpath,"$here/build" $mpi_lib

# the instrumented plugin: the styles and the core, with LibTorch's flags
torch_dir=$(sed -n "s/^ML_TORCH_LIBTORCH_PREFIX:PATH=//p" build/CMakeCache.txt)
[ -n "$torch_dir" ] || torch_dir=$(.venv/bin/python -c "import torch, os; print(os.path.dirname(torch.__file__))")
# the sources build/ compiles into the plugin and its core, read from ninja
mapfile -t plugin_src < <(ninja -C build -t commands mltorchplugin | grep -o ' -c [^ ]*' | awk '{print $2}')
[ "${#plugin_src[@]}" -gt 0 ] || { echo "no plugin sources found in build/ (ninja -t commands mltorchplugin)" >&2; exit 1; }
cov=(-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -g -O1 -std=c++20 -fPIC)
torch_inc=(-isystem "$torch_dir/include" -isystem "$torch_dir/include/torch/csrc/api/include")
# the core is LAMMPS-free (and takes nlohmann/json from the system, not LAMMPS's copy)
core_inc=(-I src/core "${torch_inc[@]}")
style_inc=(-DLAMMPS_SMALLBIG -I src -I src/core -I "$lammps_dir/src" -I "$lammps_dir/third_party"
           -I build/lammps/includes "${torch_inc[@]}")
mkdir -p "$out/plugin"
objs=()
for f in "${plugin_src[@]}"; do
  o=$out/plugin/$(basename "$f" .cpp).o
  # rebuilt when its source or any of our headers is newer (a class whose
  # layout changed must not meet an object compiled against the old one)
  if [ ! -f "$o" ] || [ "$f" -nt "$o" ] || [ -n "$(find src -name '*.h' -newer "$o" -print -quit)" ]; then
    inc=("${style_inc[@]}")
    case $f in */src/core/*) inc=("${core_inc[@]}") ;; esac
    # shellcheck disable=SC2086
    $(command -v ccache || true) "$cxx" "${cov[@]}" "${inc[@]}" $mpi_inc -c "$f" -o "$o"
  fi
  objs+=("$o")
done
# shellcheck disable=SC2086
"$cxx" -fsanitize=address,undefined -shared -Wl,-Bsymbolic -o "$out/mltorchplugin_cov.so" "${objs[@]}" \
  -L "$torch_dir/lib" -ltorch -ltorch_cpu -lc10 -Wl,-rpath,"$torch_dir/lib" $mpi_lib
export ML_TORCH_FUZZ_PLUGIN=$here/$out/mltorchplugin_cov.so

export ASAN_OPTIONS=detect_leaks=0:detect_odr_violation=0
export ML_TORCH_POTENTIALS=$here/potentials LAMMPS_POTENTIALS=$lammps_dir/potentials OMP_NUM_THREADS=1
for target in ${ML_TORCH_FUZZ_TARGETS:-metadata restart keywords}; do
  corpus=$out/corpus_$target
  mkdir -p "$corpus"
  cp -n fuzz/corpus_$target/* "$corpus/" 2>/dev/null || true
  dict=()
  [ "$target" = keywords ] && dict=(-dict=fuzz/keywords.dict)
  echo "== fuzz_$target for $secs s"
  start=$(date +%s)
  rc=0
  "$out/fuzz_$target" "${dict[@]}" -max_total_time="$secs" -timeout=30 -rss_limit_mb=4096 \
    -artifact_prefix=fuzz/crashers/$target- -print_final_stats=1 "$corpus" > "$out/fuzz_$target.log" 2>&1 || rc=$?
  grep -E "^(#[0-9]+.*DONE|stat::number_of_executed_units|stat::average_exec_per_sec|stat::new_units_added)|ERROR|crash-|timeout-" \
    "$out/fuzz_$target.log" | tail -6
  echo "fuzz_$target: $(( $(date +%s) - start )) s, exit $rc, corpus $(ls "$corpus" | wc -l) inputs," \
       "findings: $(ls fuzz/crashers | grep -c "^$target-" || true)"
done
