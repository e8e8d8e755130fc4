#!/usr/bin/env bash
# Builds the capalloc CLI and runs the main demo: `capalloc arms`, the four
# arms of field report 003 (split-K workspace and semaphore allocated during
# graph capture) on the host runtime. Installs missing Debian packages first,
# so this is one of the two set-up commands in README.md.
#
# Usage: bash scripts/demo.sh [extra arguments for `capalloc arms`]
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

bash scripts/install-deps.sh

jobs="$(nproc 2>/dev/null || echo 2)"
cmake --preset default
cmake --build --preset default --target capalloc_cli --parallel "$jobs"

# No GPU is needed: without CAPALLOC_RUNTIME, `auto` falls back to the host
# runtime when no device is present.
exec build/tools/capalloc arms "$@"
