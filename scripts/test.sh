#!/usr/bin/env bash
# Builds capalloc and runs its whole test suite with CTest, as CI does
# (.ci/run runs exactly this), then the checks that need other builds:
#   1. a plain `cmake -S . -B build -DCMAKE_BUILD_TYPE=Release` (no preset,
#      no other flag, as a user or packager configures it; the same cache as
#      preset `default`): every Catch2 suite, the CLI, stress, the oracle, the
#      find_package consumer, the Python package, the GPU bundle;
#   2. ASan + UBSan (build-asan/, no CUDA/HIP): the suite, less the tests
#      that configure other projects, the oracle with fewer programs (the
#      preset builds neither the benchmarks nor gpu_runtime_test, which
#      could only skip there: Release runs them);
#   3. TSan (build-tsan/, no CUDA/HIP): the programs that run threads and
#      the stress driver's own cases (the CLI's stress runs: steps 1 and 2);
#   4. the C ABI fuzzer for 60 s (scripts/fuzz.sh, build-fuzz/).
# CTest runs as many tests at once as there are cores (`nproc`), the
# costliest (the oracle) first. Each step prints its time (docs/ci.md keeps
# the table). Installs missing Debian packages first, so this is one of the
# two set-up commands in README.md.
#
# Usage:
#   bash scripts/test.sh                               # all four steps
#   bash scripts/test.sh --no-sanitizers               # step 1 only
#   bash scripts/test.sh --sanitize address,undefined  # build-asan/: the whole suite
#   bash scripts/test.sh --sanitize thread             # build-tsan/: the whole suite
#
# Extra arguments after `--` go to ctest (e.g. `-- -R allocator_test`).
# Exits non-zero if installing, configuring, building or any test fails.
set -euo pipefail

usage() { sed -n "2,/^set -euo/p" "$0" | sed "\$d" | sed "s/^# \\{0,1\\}//"; }

sanitize=""
sanitizers=1
ctest_args=()
while (($#)); do
  case "$1" in
    --sanitize) [[ $# -ge 2 ]] || { usage >&2; exit 2; }; sanitize="$2"; shift 2 ;;
    --sanitize=*) sanitize="${1#--sanitize=}"; shift ;;
    --no-sanitizers) sanitizers=0; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; ctest_args=("$@"); break ;;
    *) echo "test.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
jobs="$(nproc 2>/dev/null || echo 2)"

# step NAME COMMAND...: runs the command and prints how long it took.
step() {
  local name="$1" start="$SECONDS"
  shift
  echo "test.sh: step '$name'"
  "$@"
  echo "test.sh: step '$name' took $((SECONDS - start)) s"
}

# sanitizer_env KIND: the runtime options of that sanitizer, and in `run` the
# prefix that its programs need.
run=()
sanitizer_env() {
  run=()
  case "$1" in
    asan-ubsan)
      export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1}"
      export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}" ;;
    tsan)
      export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}"
      # GCC 12's TSan cannot map its shadow memory when the kernel randomizes
      # mmap addresses with more than 28 bits; run without ASLR there. (The
      # build runs test programs too: catch_discover_tests lists their cases.)
      local rnd_bits
      rnd_bits="$(cat /proc/sys/vm/mmap_rnd_bits 2>/dev/null || echo 0)"
      if ((rnd_bits > 28)) && command -v setarch >/dev/null 2>&1; then
        run=(setarch "$(uname -m)" -R)
      fi ;;
  esac
}

# build_and_test PRESET DIR [TARGETS (space-separated; "" = all)] [CTEST ARGS...]
build_and_test() {
  local preset="$1" dir="$2" targets="$3"
  shift 3
  sanitizer_env "$preset"
  local target_args=()
  if [[ -n "$targets" ]]; then
    for t in $targets; do target_args+=(--target "$t"); done
  fi
  "${run[@]}" cmake --preset "$preset"
  "${run[@]}" cmake --build --preset "$preset" --parallel "$jobs" "${target_args[@]}"
  "${run[@]}" ctest --test-dir "$dir" --parallel "$jobs" --output-on-failure --no-tests=error "$@"
}

case "$sanitize" in
  "") ;;
  address,undefined|undefined,address|asan|asan-ubsan) sanitize=asan-ubsan ;;
  thread|tsan) sanitize=tsan ;;
  *)
    echo "test.sh: --sanitize takes 'address,undefined' or 'thread', not '$sanitize'" >&2
    exit 2 ;;
esac

step install bash scripts/install-deps.sh

# One sanitizer's whole suite, by hand.
if [[ -n "$sanitize" ]]; then
  dir=build-asan
  [[ "$sanitize" == tsan ]] && dir=build-tsan
  step "$sanitize suite" build_and_test "$sanitize" "$dir" "" "${ctest_args[@]}"
  exit 0
fi

# The main build is configured exactly as a user or a packager would (no
# preset, no flag but the build type), so it is also the check that a plain
# Release build passes with warnings as errors (GCC 12 at -O3 warns where -O2
# does not; warnings as errors is the top-level default). Preset `default`
# writes the same cache.
release_build_and_test() {
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
  cmake --build build --parallel "$jobs"
  ctest --test-dir build --parallel "$jobs" --output-on-failure --no-tests=error "$@"
}
echo "test.sh: a plain Release build in build/ with $jobs build jobs"
step "Release build and tests" release_build_and_test "${ctest_args[@]}"

((sanitizers)) || exit 0

# ASan + UBSan: the suite, less the two tests that configure and build other
# CMake projects (packaging checks, run in the default build above).
# The oracle runs 2,500 random programs here rather than 10,000 (it is about
# ten times slower instrumented); the full count runs in step 1.
asan_suite() {
  local -x CAPALLOC_ORACLE_PROGRAMS="${CAPALLOC_ORACLE_PROGRAMS:-2500}"
  build_and_test asan-ubsan build-asan "" -E '^(consumer_find_package|subproject_defaults)$'
}
step "ASan+UBSan suite" asan_suite

# TSan: the programs that run threads (the host runtime's stream workers and
# its lock-free capture states, the allocator from many threads, the C ABI's
# thread-local errors, the reliability cases that race queued kernels, the
# release queue's progress thread, the tracker's event log drained while
# another thread allocates in a capture) and the stress driver's own cases
# (two threads on one allocator among them). The CLI's stress runs
# (stress_1m, stress_threads) run in steps 1 and 2, not here: the CLI's
# sources cost about 150 s of compile under TSan, for a front end that runs
# the same driver (`--sanitize thread` still builds and runs everything).
tsan_targets="runtime_host_test allocator_test allocator_shards_test c_api_test reliability_test release_test capture_tracker_test stress_driver_test"
step "TSan concurrency and stress" build_and_test tsan build-tsan "$tsan_targets" \
  -R '^(runtime_host_test|allocator_test|allocator_shards_test|c_api_test|reliability_test|release_test|capture_tracker_test|stress_driver_test):'

step "fuzz the C ABI (60 s)" bash scripts/fuzz.sh --seconds 60
