#!/usr/bin/env bash
# libFuzzer runs of ML-TORCH's input parsers (a script, not a CI step):
#   fuzz_metadata: the model-metadata JSON parser (src/core/metadata.cpp),
#                  coverage-guided, with AddressSanitizer + UBSan
#   fuzz_keywords: the keyword parsers of pair_style torch, pair_coeff and
#                  fix torch/finetune, through a LAMMPS instance (build/'s
#                  liblammps, so only the harness is instrumented: the
#                  fuzzer mutates guided by a keyword dictionary; crashes
#                  and hangs are what it finds there)
#   tools/fuzz.sh [SECONDS per target, default 600]
# Needs tools/setup.sh (build/) and clang (Debian's clang-14). Crashers are
# written to fuzz/crashers/; each one found must become a regression test
# (unittest/test_fuzz_regressions.sh replays everything in fuzz/crashers/).
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
mpi_inc=$(mpicxx --showme:incdirs | tr ' ' '\n' | sed 's/^/-I/')
mpi_lib=$(mpicxx --showme:link)
# shellcheck disable=SC2086
"$cxx" "${san[@]}" -DLAMMPS_SMALLBIG -I "$lammps_dir/src" $mpi_inc fuzz/fuzz_keywords.cpp \
  -o "$out/fuzz_keywords" -L build -llammps -Wl,-rpath,"$here/build" $mpi_lib

export ASAN_OPTIONS=detect_leaks=0:detect_odr_violation=0
export ML_TORCH_POTENTIALS=$here/potentials LAMMPS_POTENTIALS=$lammps_dir/potentials OMP_NUM_THREADS=1
for target in metadata keywords; do
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
