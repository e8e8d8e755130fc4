#!/usr/bin/env bash
# Builds the libFuzzer target for the C ABI (tests/fuzz/c_api_fuzzer.cpp) in
# build-fuzz/ with clang-14, ASan and UBSan, and runs it for a bounded time
# over a copy of the seed corpus (tests/fuzz/corpus/c_api/). docs/fuzzing.md
# says what it covers.
#
# Usage: scripts/fuzz.sh [--seconds N]    (default 60)
#
# Installs clang-14 and libclang-rt-14-dev (libFuzzer and the sanitizer
# runtimes) with apt-get when they are missing, like scripts/install-deps.sh,
# which it runs first for the libraries. New corpus entries go to a temporary
# directory, never into the repository. Exits non-zero on any crash,
# sanitizer report, invariant violation, leak, timeout or out-of-memory; the
# reproducer is then kept and its path printed (run the fuzzer binary on it,
# with FUZZ_TRACE=1 to see every call).
#
# Environment: CCACHE_BASEDIR and CMAKE_CXX_COMPILER_LAUNCHER are honoured
# (ccache); FUZZ_JOBS (default 2) sets the build's parallelism.
set -euo pipefail

SECONDS_TO_RUN=60
while (($#)); do
  case "$1" in
    --seconds)
      [[ $# -ge 2 && "$2" =~ ^[0-9]+$ && "$2" -gt 0 ]] || {
        echo "fuzz.sh: --seconds needs a positive integer" >&2
        exit 2
      }
      SECONDS_TO_RUN="$2"
      shift 2
      ;;
    --seconds=*)
      SECONDS_TO_RUN="${1#--seconds=}"
      [[ "$SECONDS_TO_RUN" =~ ^[0-9]+$ && "$SECONDS_TO_RUN" -gt 0 ]] || {
        echo "fuzz.sh: --seconds needs a positive integer" >&2
        exit 2
      }
      shift
      ;;
    -h | --help)
      sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    *)
      echo "fuzz.sh: unknown argument '$1' (usage: scripts/fuzz.sh [--seconds N])" >&2
      exit 2
      ;;
  esac
done

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="$ROOT/build-fuzz"
CORPUS_SEEDS="$ROOT/tests/fuzz/corpus/c_api"
JOBS="${FUZZ_JOBS:-2}"

# --- Toolchain ------------------------------------------------------------------
bash "$ROOT/scripts/install-deps.sh"

FUZZ_PACKAGES=(clang-14 libclang-rt-14-dev)
is_installed() {
  [[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)" == "install ok installed" ]]
}
missing=()
for pkg in "${FUZZ_PACKAGES[@]}"; do
  is_installed "$pkg" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  SUDO=()
  if [[ "$(id -u)" -ne 0 ]]; then
    if command -v sudo >/dev/null 2>&1; then
      SUDO=(sudo)
    else
      echo "fuzz.sh: missing packages (${missing[*]}), not root, and no sudo." >&2
      exit 1
    fi
  fi
  echo "fuzz.sh: installing ${missing[*]}"
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
CC_BIN="$(command -v clang-14)"
CXX_BIN="$(command -v clang++-14)"

# --- Build ------------------------------------------------------------------------
launcher=()
if [[ -n "${CMAKE_CXX_COMPILER_LAUNCHER:-}" ]]; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER="$CMAKE_CXX_COMPILER_LAUNCHER"
            -DCMAKE_C_COMPILER_LAUNCHER="$CMAKE_CXX_COMPILER_LAUNCHER")
elif command -v ccache >/dev/null 2>&1; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi
generator=()
if [[ ! -f "$BUILD/CMakeCache.txt" ]] && command -v ninja >/dev/null 2>&1; then
  generator=(-G Ninja)
fi

# -O1 with line tables only, as OSS-Fuzz builds its fuzzers: reports name
# file and line, and the build takes about half as long as -O2 -g.
echo "fuzz.sh: configuring $BUILD (clang-14, ASan, UBSan, libFuzzer)"
cmake -S "$ROOT" -B "$BUILD" "${generator[@]}" "${launcher[@]}" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" \
  -DCMAKE_C_COMPILER="$CC_BIN" -DCMAKE_CXX_COMPILER="$CXX_BIN" \
  -DCAPALLOC_BUILD_FUZZERS=ON -DCAPALLOC_SANITIZE= \
  -DCAPALLOC_BUILD_TESTS=OFF -DCAPALLOC_BUILD_TOOLS=OFF -DCAPALLOC_WERROR=OFF \
  -DCAPALLOC_WITH_CUDA=OFF -DCAPALLOC_WITH_HIP=OFF >/dev/null
echo "fuzz.sh: building c_api_fuzzer"
cmake --build "$BUILD" --parallel "$JOBS" --target c_api_fuzzer

FUZZER="$BUILD/tests/fuzz/c_api_fuzzer"

# --- Run ----------------------------------------------------------------------------
WORK="$(mktemp -d "${TMPDIR:-/tmp}/capalloc-fuzz.XXXXXX")"
keep_work=0
cleanup() {
  if ((keep_work == 0)); then rm -rf "$WORK"; fi
}
trap cleanup EXIT
mkdir -p "$WORK/corpus" "$WORK/artifacts"
cp "$CORPUS_SEEDS"/* "$WORK/corpus/"

# -timeout: one input (at most 192 calls and their teardown) runs in
# milliseconds; 10 s means a hang. -rss_limit_mb: the process-wide allocator
# maps device memory lazily and the fuzzer caps its live blocks at 192 MiB,
# so 4 GiB means a leak. detect_leaks: LeakSanitizer after inputs that leave
# heap memory behind (each input tears down everything it made).
echo "fuzz.sh: running c_api_fuzzer for ${SECONDS_TO_RUN} s over a copy of $CORPUS_SEEDS"
LOG="$WORK/fuzz.log"
set +e
ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:strict_string_checks=1}" \
UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}" \
  "$FUZZER" "$WORK/corpus" \
    -max_total_time="$SECONDS_TO_RUN" -timeout=10 -rss_limit_mb=4096 -max_len=2048 \
    -print_final_stats=1 -artifact_prefix="$WORK/artifacts/" >"$LOG" 2>&1
rc=$?
set -e

# The final stats, and the last status line (its #N counts executions).
grep -E '^(#[0-9]+[[:space:]]+(DONE|pulse|NEW|REDUCE|INITED))' "$LOG" | tail -n 1 || true
grep -E '^(stat::|Done [0-9]+ runs)' "$LOG" || true
execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$LOG" | tail -n 1)"

artifacts=("$WORK/artifacts"/*)
if ((rc == 72)) && [[ ! -e "${artifacts[0]}" ]]; then
  # libFuzzer's exit status for a run stopped by a signal (SIGINT, SIGTERM):
  # nothing was found, but the run did not finish either.
  echo "fuzz.sh: INTERRUPTED: the fuzzer was stopped by a signal after ${execs:-?} executions" >&2
  exit 1
fi
if ((rc != 0)) || [[ -e "${artifacts[0]}" ]]; then
  keep_work=1
  echo "fuzz.sh: FAILED (exit status $rc); the fuzzer's report:" >&2
  grep -v -E '^#[0-9]+[[:space:]]+(NEW|REDUCE|pulse)' "$LOG" | tail -n 80 >&2
  echo "fuzz.sh: reproducers in $WORK/artifacts; full log $LOG" >&2
  echo "fuzz.sh: rerun one with: FUZZ_TRACE=1 $FUZZER <file>" >&2
  exit 1
fi
echo "fuzz.sh: OK: ${execs:-?} executions in ${SECONDS_TO_RUN} s, no crash, no sanitizer report"
