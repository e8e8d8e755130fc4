#!/usr/bin/env bash
# Installs the Debian packages capalloc needs to build and test, and nothing
# else. Idempotent: packages already installed are left alone, and `apt-get
# update` runs only when something is missing. Works as root or through sudo.
#
# Usage: bash scripts/install-deps.sh
#
# Both README set-up commands (scripts/demo.sh and scripts/test.sh) call this
# script first, so a fresh Debian 12 machine needs nothing else.
set -euo pipefail

# Required: the toolchain and the libraries found by CMake's find_package.
REQUIRED_PACKAGES=(
  build-essential
  cmake
  # The sanitizer presets and the fuzzer build with Ninja: on two cores it
  # compiles a program's sources while the libraries it links are still
  # building, where Make waits for them.
  ninja-build
  git
  libabsl-dev
  libspdlog-dev
  libfmt-dev
  nlohmann-json3-dev
  # dlpack.h, for DLPack import (capalloc/dlpack.hpp)
  libdlpack-dev
  libcli11-dev
  libbenchmark-dev
  catch2
  pkg-config
  python3
  # The Python package's test: a virtual environment, pip install without
  # network (python/pyproject.toml builds with setuptools and wheel).
  python3-venv
  python3-pip
  python3-setuptools
  python3-wheel
  patchelf
  # The visual report's test (tests/report_page_test.sh) renders the pages
  # in headless Chromium (about 300 MB installed with its libraries).
  chromium
  # `capalloc bench` (docs/performance.md): the host mallocs it replays
  # traces through (preloaded into its children), and callgrind for its
  # instruction counts (--callgrind, and its smoke test).
  libjemalloc2
  libmimalloc2.0
  libtcmalloc-minimal4
  # The hot-path cost of the audit and the trace is measured in instructions
  # with callgrind (README, "Retention audit and event trace").
  valgrind
)

# GPU toolchains that Debian packages: HIP, so that the HIP kernels (and the
# hip runtime) compile and link on any machine, GPU or not. CUDA is not a
# Debian 12 package here: nvcc comes with the machine where it is present, and
# CMake builds the CUDA parts only when it finds it (CAPALLOC_WITH_CUDA=AUTO).
OPTIONAL_PACKAGES=(
  hipcc
  libamdhip64-dev
)

is_installed() {
  # dpkg-query prints "install ok installed" for a fully installed package.
  [[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)" == "install ok installed" ]]
}

if ! command -v dpkg-query >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1; then
  echo "install-deps: this script needs a Debian-like system (dpkg-query, apt-get)." >&2
  echo "install-deps: install by other means: ${REQUIRED_PACKAGES[*]}" >&2
  exit 1
fi

missing=()
for pkg in "${REQUIRED_PACKAGES[@]}" "${OPTIONAL_PACKAGES[@]}"; do
  is_installed "$pkg" || missing+=("$pkg")
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all packages present."
  exit 0
fi

SUDO=()
if [[ "$(id -u)" -ne 0 ]]; then
  if command -v sudo >/dev/null 2>&1; then
    SUDO=(sudo)
  else
    echo "install-deps: missing packages (${missing[*]}) and not root, and sudo is not available." >&2
    exit 1
  fi
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive \
  apt-get install -y -q --no-install-recommends "${missing[@]}"
