#!/usr/bin/env bash
# CTest `gpu_bundle`: makes the GPU bundle from this source tree exactly as a
# user would (tools/gpu-bundle.sh, Release, CUDA on, HIP off), then checks it
# with tools/gpu/check_bundle.py: statically (every NEEDED resolves inside the
# bundle or to the C/C++ runtime or the driver; size at most 32 MiB) and by
# running its host-runtime parts from a relocated copy with LD_LIBRARY_PATH
# empty. Then shows that the checker catches a broken bundle (a binary with
# its RUNPATH removed, a size limit too small). Exit 77 (skipped) without nvcc.
#
#   bash tests/gpu_bundle_test.sh WORK_DIR [RELEASE_BUILD]
#
# With RELEASE_BUILD (CTest passes its own build tree when that is Release
# with the CUDA backend, as in scripts/test.sh), the bundle comes from that
# build as it is (gpu-bundle.sh --from-build), rather than from a second
# Release build of its own (about 8 minutes on 2 cores); the bundle and the
# checks are the same.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work="${1:?usage: gpu_bundle_test.sh WORK_DIR [RELEASE_BUILD]}"
release_build="${2:-}"
if ! command -v nvcc >/dev/null && [[ ! -x /usr/local/cuda/bin/nvcc ]]; then
  echo "gpu_bundle_test: no nvcc here, so no CUDA bundle can be built: skipped"
  exit 77
fi
mkdir -p "$work"
rm -rf "$work/bundle" "$work/broken"
if [[ -n "$release_build" ]]; then
  bash "$repo_root/tools/gpu-bundle.sh" --no-install --from-build "$release_build" --out "$work/bundle"
else
  bash "$repo_root/tools/gpu-bundle.sh" --no-install --build-dir "$work/build" --out "$work/bundle"
fi
python3 "$repo_root/tools/gpu/check_bundle.py" "$work/bundle"

# The checker must fail on a bundle that would not load on a bare machine.
cp -r "$work/bundle" "$work/broken"
patchelf --remove-rpath "$work/broken/bin/capalloc"
if python3 "$repo_root/tools/gpu/check_bundle.py" --no-run "$work/broken" >"$work/broken.log"; then
  echo "gpu_bundle_test: check_bundle.py passed a binary without its RUNPATH" >&2
  exit 1
fi
grep -q 'FAIL bin/capalloc: .* NEEDED' "$work/broken.log" || {
  echo "gpu_bundle_test: check_bundle.py failed for another reason:" >&2; cat "$work/broken.log" >&2; exit 1; }
if python3 "$repo_root/tools/gpu/check_bundle.py" --no-run --max-mib 1 "$work/bundle" >/dev/null; then
  echo "gpu_bundle_test: check_bundle.py passed a bundle over its size limit" >&2
  exit 1
fi
echo "gpu_bundle_test: the bundle checks out, and broken bundles are caught"
