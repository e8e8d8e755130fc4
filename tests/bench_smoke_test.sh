#!/usr/bin/env bash
# tests/bench_smoke_test.sh PROGRAM TABLE_PATTERN [ARGS...]: runs a host
# benchmark with the tiny ARGS, and checks that it exits 0 and prints its
# table (a line matching TABLE_PATTERN, an extended regex). Then checks its
# argument handling: a negative, missing or unknown value fails with exit 2
# and a message naming the flag; --help exits 0. No timing is judged.
set -uo pipefail
program=$1 pattern=$2
shift 2
failed=0
fail() { echo "FAIL: $*"; failed=1; }

out="$("$program" "$@" --benchmark_color=false 2>&1)"
rc=$?
echo "$out"
((rc == 0)) || fail "$program $* exited $rc"
grep -Eq "$pattern" <<<"$out" || fail "no line matching '$pattern' (the table)"

# expect_usage_error EXPECTED_MESSAGE ARGS...: exit 2, EXPECTED_MESSAGE on stderr.
expect_usage_error() {
  local message=$1 err
  shift
  err="$("$program" "$@" 2>&1 >/dev/null)"
  local rc=$?
  echo "\$ $(basename "$program") $* -> exit $rc: ${err//$'\n'/ | }"
  ((rc == 2)) || fail "'$*' exited $rc, not 2"
  grep -Fq -- "$message" <<<"$err" || fail "'$*': no '$message' in: $err"
}
first_flag=$(sed -n 's/^ *\(--[a-z-]*\) .*/\1/p' <<<"$("$program" --help)" | head -n 1)
[[ -n "$first_flag" ]] || fail "--help lists no flag"
expect_usage_error "$first_flag: Value -1 not in range" "$first_flag" -1
expect_usage_error "$first_flag: 1 required" "$first_flag"
expect_usage_error "$first_flag: Value x not in range" "$first_flag" x
expect_usage_error "unrecognized command-line flag: --no-such-flag" --no-such-flag
"$program" --help >/dev/null || fail "--help exited $?"
exit $failed
