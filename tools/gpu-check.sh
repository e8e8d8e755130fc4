#!/usr/bin/env bash
# tools/gpu-check.sh: every check that needs an NVIDIA GPU, in one run from a
# fresh checkout, with a summary table at the end. Meant to finish within 8
# minutes on an H200; each step has its own time limit.
#
#   bash tools/gpu-check.sh                 # build in build-gpu-check/, then check
#   CAPALLOC_GPU_BUILD_DIR=dir bash tools/gpu-check.sh   # reuse a CUDA build
#
# The build needs Debian's libabsl-dev, libspdlog-dev and catch2 (v2). A GPU
# machine without them and without network access cannot build: build on a
# machine that has them (with nvcc, -DCAPALLOC_WITH_CUDA=ON) and point
# CAPALLOC_GPU_BUILD_DIR at that build, with the Debian shared libraries it
# links reachable through LD_LIBRARY_PATH.
#
# Steps: configure and build with CUDA; the GPU-labelled CTest tests;
# `capalloc arms --runtime cuda`; `capalloc gemm-scenario --runtime cuda`;
# seed 003's arms in PyTorch with capalloc installed (when torch imports);
# the split-K GEMM against cuBLAS on the seed's shapes. Exit status: 0 when
# every step that ran passed (a skipped step does not fail the run).
set -uo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
build="${CAPALLOC_GPU_BUILD_DIR:-build-gpu-check}"
logs="$build/gpu-check-logs"
jobs="$(nproc 2>/dev/null || echo 4)"
mkdir -p "$logs"

summary=()
failed=0

# step NAME LIMIT_SECONDS COMMAND...: runs it, logs to $logs/NAME.log, shows
# the log's tail, and records PASS/FAIL/SKIP (exit 77 means skipped).
step() {
  local name="$1" limit="$2"
  shift 2
  local t0=$SECONDS rc
  echo "=== $name"
  timeout "$limit" "$@" >"$logs/$name.log" 2>&1
  rc=$?
  tail -n 40 "$logs/$name.log"
  local status=PASS
  if ((rc == 77)); then
    status=SKIP
  elif ((rc == 124)); then
    status="FAIL (timed out after ${limit}s)"
    failed=1
  elif ((rc != 0)); then
    status="FAIL (exit $rc)"
    failed=1
  fi
  summary+=("$(printf '%-22s %-28s %5ss' "$name" "$status" $((SECONDS - t0)))")
}

nvidia-smi -L 2>/dev/null || echo "nvidia-smi not found"

if [[ -z "${CAPALLOC_GPU_BUILD_DIR:-}" ]]; then
  step install-deps 240 bash scripts/install-deps.sh
  step configure 120 cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release \
    -DCAPALLOC_WITH_CUDA=ON -DCAPALLOC_WITH_HIP=OFF -DCAPALLOC_WERROR=OFF
  step build 300 cmake --build "$build" --parallel "$jobs"
fi

# Run directly: on a GPU machine a skip (exit 77, no device found) is a failure.
step gpu-tests 120 bash -c '"$0"; rc=$?; if ((rc == 77)); then echo "no GPU device found: the GPU tests did not run"; exit 1; fi; exit $rc' "$build/tests/gpu_runtime_test"

step arms-cuda 60 "$build/tools/capalloc" arms --runtime cuda
step gemm-scenario-cuda 60 "$build/tools/capalloc" gemm-scenario --runtime cuda
step torch-arms 120 env CAPALLOC_LIBRARY="$build/libcapalloc.so" CAPALLOC_RUNTIME=cuda bash -c '
  python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null || {
    echo "PyTorch with CUDA is not importable: skipped"; exit 77; }
  exec python3 tools/python/seed003_arms_torch.py' 
step gemm-vs-cublas 60 bash -c '[[ -x "$0" ]] || { echo "built without cuBLAS: skipped"; exit 77; }; exec "$0" --iters 50' "$build/tools/capalloc_bench_gemm_cuda"

echo
echo "=== summary (logs in $logs/)"
printf '%-22s %-28s %6s\n' step status time
for line in "${summary[@]}"; do echo "$line"; done
exit "$failed"
