#!/usr/bin/env bash
# Run a command for ctest and pass only when it exits 0 AND its output
# (stdout and stderr) has, for every REGEX, a line matching it (grep -E).
# ctest's PASS_REGULAR_EXPRESSION alone ignores the exit code, so a command
# that printed the expected line and then failed would pass.
#   expect_output.sh REGEX [REGEX ...] -- COMMAND [ARG ...]
set -uo pipefail
regexes=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do regexes+=("$1"); shift; done
[ $# -ge 2 ] && [ ${#regexes[@]} -ge 1 ] || {
  echo "usage: expect_output.sh REGEX [REGEX ...] -- COMMAND [ARG ...]" >&2; exit 2; }
shift
out=$(mktemp)
"$@" 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
missing=()
for r in "${regexes[@]}"; do grep -Eq -- "$r" "$out" || missing+=("$r"); done
rm -f "$out"
if [ "$rc" -ne 0 ]; then echo "expect_output.sh: FAIL: the command exited with $rc"; exit 1; fi
if [ ${#missing[@]} -gt 0 ]; then echo "expect_output.sh: FAIL: no line matches: ${missing[*]}"; exit 1; fi
echo "expect_output.sh: PASS: exit 0 and a line matches each of: ${regexes[*]}"
