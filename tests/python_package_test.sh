#!/usr/bin/env bash
# CTest `python_package`: installs the Python package (python/) into a
# temporary virtual environment as a user would (python3 -m venv, then
# pip install --no-build-isolation --no-index: no network), and runs its
# tests from outside the source tree against the built libcapalloc.so on the
# host runtime.
#
#   bash tests/python_package_test.sh LIBCAPALLOC WORK_DIR [PYTHON...]
#
# The interpreter is the first of PYTHON... (then python3, /usr/bin/python3)
# that has venv, pip, setuptools and wheel (Debian: python3-venv, python3-pip,
# python3-setuptools, python3-wheel; scripts/install-deps.sh installs them).
# The venv sees the system's site-packages for setuptools and wheel only:
# nothing is downloaded.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
library="${1:?usage: python_package_test.sh LIBCAPALLOC WORK_DIR [PYTHON...]}"
work="${2:?usage: python_package_test.sh LIBCAPALLOC WORK_DIR [PYTHON...]}"
shift 2
python=""
for candidate in "$@" python3 /usr/bin/python3; do
  [[ -n "$candidate" ]] && command -v "$candidate" >/dev/null || continue
  if "$candidate" -c 'import venv, ensurepip, setuptools, wheel' 2>/dev/null ||
     "$candidate" -c 'import venv, pip, setuptools, wheel' 2>/dev/null; then
    python="$(command -v "$candidate")"
    break
  fi
done
if [[ -z "$python" ]]; then
  echo "python_package_test: no python3 with venv, pip, setuptools and wheel" >&2
  echo "  (bash scripts/install-deps.sh installs python3-venv python3-pip python3-setuptools python3-wheel)" >&2
  exit 1
fi
echo "python_package_test: $python ($("$python" --version 2>&1))"
rm -rf "$work"
mkdir -p "$work"
# A copy of the package's sources: pip builds in the tree it is given.
cp -r "$repo_root/python" "$work/src"
# Not setuptools' leftovers of an earlier in-tree `pip install ./python`: its
# build/lib would be packaged instead of the sources, which cp just made newer.
rm -rf "$work/src/build" "$work/src/"*.egg-info
"$python" -m venv --system-site-packages "$work/venv"
"$work/venv/bin/python" -m pip install --no-build-isolation --no-index --no-deps \
  --disable-pip-version-check -q "$work/src"
# Run from a scratch directory: `import capalloc` must find the installed copy.
mkdir -p "$work/run"
cp "$repo_root/python/tests/test_capalloc.py" "$work/run/"
cd "$work/run"
CAPALLOC_LIBRARY="$library" CAPALLOC_RUNTIME=host CAPALLOC_LOG_LEVEL=error \
  "$work/venv/bin/python" -m unittest -v test_capalloc
