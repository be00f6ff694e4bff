#!/usr/bin/env bash
# Run a command for ctest and pass only when it exits 0 AND its output
# (stdout and stderr) has a line matching REGEX (grep -E). ctest's
# PASS_REGULAR_EXPRESSION alone ignores the exit code, so a command that
# printed the expected line and then failed would pass.
#   expect_output.sh REGEX COMMAND [ARG ...]
set -uo pipefail
[ $# -ge 2 ] || { echo "usage: expect_output.sh REGEX COMMAND [ARG ...]" >&2; exit 2; }
regex=$1
shift
out=$(mktemp)
"$@" 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
found=0
grep -Eq -- "$regex" "$out" && found=1
rm -f "$out"
if [ "$rc" -ne 0 ]; then echo "expect_output.sh: FAIL: the command exited with $rc"; exit 1; fi
if [ "$found" -ne 1 ]; then echo "expect_output.sh: FAIL: no line matches: $regex"; exit 1; fi
echo "expect_output.sh: PASS: exit 0 and a line matches: $regex"
