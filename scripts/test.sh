#!/usr/bin/env bash
# Builds capalloc and runs its whole test suite (the Catch2 suites and the
# find_package consumer test) with CTest, then builds the tree again as a
# plain Release build. Installs missing Debian packages
# first, so this is one of the two set-up commands in README.md; .ci/run runs
# exactly this.
#
# Usage:
#   bash scripts/test.sh                               # build/      (RelWithDebInfo)
#   bash scripts/test.sh --sanitize address,undefined  # build-asan/ (ASan + UBSan)
#   bash scripts/test.sh --sanitize thread             # build-tsan/ (TSan)
#
# Extra arguments after `--` go to ctest (e.g. `-- -R allocator_test`).
# Exits non-zero if installing, configuring, building or any test fails.
set -euo pipefail

usage() { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; }

sanitize=""
ctest_args=()
while (($#)); do
  case "$1" in
    --sanitize) [[ $# -ge 2 ]] || { usage >&2; exit 2; }; sanitize="$2"; shift 2 ;;
    --sanitize=*) sanitize="${1#--sanitize=}"; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; ctest_args=("$@"); break ;;
    *) echo "test.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done

# One preset per build flavour (CMakePresets.json holds the cache settings).
run=()
case "$sanitize" in
  "")
    preset=default; build_dir=build ;;
  address,undefined|undefined,address|asan|asan-ubsan)
    preset=asan-ubsan; build_dir=build-asan
    export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1}"
    export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}" ;;
  thread|tsan)
    preset=tsan; build_dir=build-tsan
    export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}"
    # GCC 12's TSan cannot map its shadow memory when the kernel randomizes
    # mmap addresses with more than 28 bits; run without ASLR there. (The build
    # runs test programs too: catch_discover_tests lists their cases.)
    rnd_bits="$(cat /proc/sys/vm/mmap_rnd_bits 2>/dev/null || echo 0)"
    if ((rnd_bits > 28)) && command -v setarch >/dev/null 2>&1; then
      run=(setarch "$(uname -m)" -R)
    fi ;;
  *)
    echo "test.sh: --sanitize takes 'address,undefined' or 'thread', not '$sanitize'" >&2
    exit 2 ;;
esac

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

bash scripts/install-deps.sh

jobs="$(nproc 2>/dev/null || echo 2)"
echo "test.sh: preset '$preset' in $build_dir/ with $jobs build jobs"
"${run[@]}" cmake --preset "$preset"
"${run[@]}" cmake --build --preset "$preset" --parallel "$jobs"
"${run[@]}" ctest --test-dir "$build_dir" --output-on-failure --no-tests=error "${ctest_args[@]}"

# A plain Release build, with no preset and no other flag, as a user or a
# packager would configure it (GCC 12 at -O3 warns where -O2 does not; the
# tree is built with warnings as errors, the top-level default).
if [[ -z "$sanitize" ]]; then
  echo "test.sh: plain 'cmake -DCMAKE_BUILD_TYPE=Release' build in build-release/"
  cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release
  cmake --build build-release --parallel "$jobs"
fi
