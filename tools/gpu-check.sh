#!/usr/bin/env bash
# tools/gpu-check.sh: every check that needs an NVIDIA GPU, run from a bundle
# made by tools/gpu-bundle.sh, on a bare GPU machine (no Debian packages, no
# network, no build). Fits in 5 minutes on an H200: each step has its own
# time limit, and the whole run stops starting steps at 290 s.
#
#   bash tools/gpu-check.sh --bundle DIR --out OUTDIR [--only STEP,...]
#
#   --bundle DIR   the bundle (default: gpu-bundle/ beside tools/, or the
#                  directory this script sits in when it is the bundle's copy)
#   --out OUTDIR   logs, per-step outputs, summary.txt and summary.json
#                  (default: gpu-check-out/)
#   --only STEPS   run only these steps (comma-separated), e.g. --only arms,gemm-scenario
#   --list         print the steps and exit
#
# Steps (docs/gpu.md says what each proves):
#   nvidia-smi           the device, driver and memory
#   bundle-loads         every ELF in the bundle loads with the GPU machine's
#                        own loader (ldd: nothing "not found")
#   gpu-tests            gpu_runtime_test (a skip for want of a device fails)
#   arms                 `capalloc arms --json` on cuda and on host in this
#                        run, compared field by field
#   gemm-scenario        the same for `capalloc gemm-scenario --json`
#   torch-arms           seed 003's four arms in PyTorch with capalloc
#                        installed through CUDAPluggableAllocator
#   torch-native-capture a graph PyTorch captures natively: the tracker's
#                        findings and evidence, checked against a replay
#   gemm-vs-cublas       the split-K GEMM against cuBLAS, seed 003's shapes
#
# A step that cannot run here (no PyTorch, no cuBLAS) exits 77 and is marked
# SKIP with its reason, never PASS. Exit status: 0 when no step failed.
set -uo pipefail

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ -f "$script_dir/MANIFEST.json" ]]; then
  bundle="$script_dir"            # this is the bundle's own copy
else
  bundle="$script_dir/../gpu-bundle"
fi
out="gpu-check-out"
only=""
all_steps=(nvidia-smi bundle-loads gpu-tests arms gemm-scenario torch-arms
           torch-native-capture gemm-vs-cublas)
usage() { sed -n '2,32p' "$0" | sed 's/^# \{0,1\}//'; }
while (($#)); do
  case "$1" in
    --bundle) [[ $# -ge 2 ]] || { usage >&2; exit 2; }; bundle="$2"; shift 2 ;;
    --out) [[ $# -ge 2 ]] || { usage >&2; exit 2; }; out="$2"; shift 2 ;;
    --only) [[ $# -ge 2 ]] || { usage >&2; exit 2; }; only="$2"; shift 2 ;;
    --list) printf '%s\n' "${all_steps[@]}"; exit 0 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu-check.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
if [[ ! -f "$bundle/MANIFEST.json" || ! -x "$bundle/bin/capalloc" ]]; then
  echo "gpu-check.sh: '$bundle' is not a bundle (no MANIFEST.json or bin/capalloc)." >&2
  echo "  make one on a build machine: bash tools/gpu-bundle.sh" >&2
  exit 2
fi
if [[ -n "$only" ]]; then
  IFS=',' read -r -a wanted <<<"$only"
  for s in "${wanted[@]}"; do
    [[ " ${all_steps[*]} " == *" $s "* ]] || {
      echo "gpu-check.sh: unknown step '$s' (steps: ${all_steps[*]})" >&2; exit 2; }
  done
else
  wanted=("${all_steps[@]}")
fi
bundle="$(cd "$bundle" && pwd)"
mkdir -p "$out" || exit 2
out="$(cd "$out" && pwd)"
bin="$bundle/bin"
py="$bundle/python"
export CAPALLOC_LIBRARY="$bundle/lib/libcapalloc.so"
export CAPALLOC_LOG_LEVEL="${CAPALLOC_LOG_LEVEL:-warn}"
python="$(command -v python3 || command -v python || true)"

deadline=$((SECONDS + 290))
summary_rows=()
json_rows=()
failed=0

# step NAME LIMIT COMMAND...: runs COMMAND with a time limit (cut to what is
# left before the deadline), logs to OUTDIR/NAME.log, and records PASS, FAIL
# or SKIP (exit 77) with the log's last `result:` line (else its last line).
step() {
  local name="$1" limit="$2"
  shift 2
  [[ " ${wanted[*]} " == *" $name "* ]] || return 0
  local left=$((deadline - SECONDS)) status rc note t0=$SECONDS
  local log="$out/$name.log"
  if ((left < 5)); then
    status=SKIP rc=-1 note="not started: the run's 290 s were spent"
  else
    ((limit > left)) && limit=$left
    echo "=== $name (limit ${limit}s)"
    # A step's command is one of the functions below, exported to the bash
    # that timeout starts.
    timeout --kill-after=5 "$limit" bash -c '"$@"' "$name" "$@" >"$log" 2>&1
    rc=$?
    tail -n 25 "$log"
    note="$(grep -E '^result: ' "$log" | tail -n 1 | sed 's/^result: //')"
    [[ -n "$note" ]] || note="$(grep -v '^[[:space:]]*$' "$log" | tail -n 1)"
    case "$rc" in
      0) status=PASS ;;
      77) status=SKIP ;;
      124|137) status=FAIL; note="timed out after ${limit}s; $note"; failed=1 ;;
      *) status=FAIL; failed=1 ;;
    esac
  fi
  local secs=$((SECONDS - t0))
  summary_rows+=("$(printf '%-21s %-5s %4ss  %s' "$name" "$status" "$secs" "${note:0:160}")")
  json_rows+=("$(printf '%s\t%s\t%s\t%s\t%s' "$name" "$status" "$rc" "$secs" "$note")")
}

# The GPU runtime's JSON and the host runtime's, in this run, compared.
compare_with_host() {
  local name="$1"
  shift
  "$bin/capalloc" "$@" --runtime host --json >"$out/$name.host.json" || {
    echo "result: the host runtime's run failed (exit $?)"; return 1; }
  "$bin/capalloc" "$@" --runtime cuda --json >"$out/$name.cuda.json" || {
    echo "result: the cuda runtime's run failed (exit $?)"; cat "$out/$name.cuda.json"; return 1; }
  "$python" "$py/compare_verdicts.py" "$out/$name.host.json" "$out/$name.cuda.json" \
    --out "$out/$name.diff.json"
}

# PyTorch with CUDA importable? (exit 77 with the reason when not)
torch_ready() {
  [[ -n "$python" ]] || { echo "result: skipped: no python3"; return 77; }
  "$python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)' 2>"$out/torch-import.err"
  case $? in
    0) return 0 ;;
    3) echo "result: skipped: PyTorch imports but sees no CUDA device"; return 77 ;;
    *) echo "result: skipped: PyTorch is not importable: $(tail -n 1 "$out/torch-import.err")"; return 77 ;;
  esac
}

# cuBLAS for the benchmark: the CUDA toolkit's, else PyTorch's nvidia wheels'.
cublas_dirs() {
  local dirs=()
  for d in "${CUDA_HOME:-/usr/local/cuda}/lib64" /usr/local/cuda/lib64 /usr/local/cuda/lib \
           /usr/lib/x86_64-linux-gnu; do
    [[ -e "$d/libcublas.so.13" && " ${dirs[*]} " != *" $d "* ]] && dirs+=("$d")
  done
  if [[ -n "$python" ]]; then
    while read -r d; do [[ -n "$d" ]] && dirs+=("$d"); done < <("$python" - <<'PY' 2>/dev/null
import glob, os, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()] + sys.path
seen = set()
for root in roots:
    for hit in glob.glob(os.path.join(root, "nvidia", "**", "libcublas.so.13"), recursive=True):
        d = os.path.dirname(hit)
        if d not in seen:
            seen.add(d)
            print(d)
PY
)
  fi
  local IFS=:
  echo "${dirs[*]}"
}

run_nvidia_smi() {
  command -v nvidia-smi >/dev/null || { echo "result: nvidia-smi not found"; return 1; }
  nvidia-smi || return 1
  echo "result: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -n 1)"
}

run_bundle_loads() {
  echo "bundle: $(cat "$bundle/MANIFEST.json" | tr -d '\n' | sed 's/"files".*//' | cut -c1-400)"
  echo "this machine: $(ldd --version 2>&1 | head -n 1)"
  local bad=0 elf
  for elf in "$bin"/* "$bundle"/lib/*.so*; do
    if ldd "$elf" 2>&1 | grep -q 'not found'; then
      echo "$elf:"; ldd "$elf" 2>&1 | grep 'not found'; bad=1
    fi
    if ! ldd -r "$elf" >/dev/null 2>&1; then echo "$elf: ldd -r failed"; bad=1; fi
    ldd "$elf" 2>&1 | grep -q 'version .* not found' && {
      echo "$elf: this machine's glibc or libstdc++ is older than the build's:"
      ldd "$elf" 2>&1 | grep 'version .* not found'; bad=1; }
  done
  ((bad)) && { echo "result: some bundle files do not load here"; return 1; }
  echo "result: every bundle ELF resolves on this machine"
}

run_gpu_tests() {
  "$bin/gpu_runtime_test"
  local rc=$?
  if ((rc == 77)); then echo "result: no GPU device found: the GPU tests did not run"; return 1; fi
  ((rc == 0)) && echo "result: gpu_runtime_test passed"
  return $rc
}

run_torch_arms() {
  torch_ready || return $?
  CAPALLOC_RUNTIME=cuda "$python" "$py/seed003_arms_torch.py"
}

run_torch_native_capture() {
  torch_ready || return $?
  CAPALLOC_RUNTIME=cuda "$python" "$py/torch_native_capture.py"
}

run_gemm_vs_cublas() {
  local dirs
  dirs="$(cublas_dirs)"
  [[ -n "$dirs" ]] && echo "cuBLAS from: $dirs"
  LD_LIBRARY_PATH="$dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$bin/capalloc_bench_gemm_cuda" --iters 50
}

export bundle out bin py python
export -f compare_with_host torch_ready cublas_dirs run_nvidia_smi run_bundle_loads run_gpu_tests \
  run_torch_arms run_torch_native_capture run_gemm_vs_cublas
echo "gpu-check.sh: bundle $bundle, output $out, steps: ${wanted[*]}"
step nvidia-smi 15 run_nvidia_smi
step bundle-loads 15 run_bundle_loads
step gpu-tests 90 run_gpu_tests
step arms 40 compare_with_host arms arms
step gemm-scenario 40 compare_with_host gemm-scenario gemm-scenario
step torch-arms 60 run_torch_arms
step torch-native-capture 45 run_torch_native_capture
step gemm-vs-cublas 45 run_gemm_vs_cublas

{
  echo "capalloc gpu-check $(date -u '+%Y-%m-%d %H:%M UTC') on $(hostname)"
  echo "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1)"
  echo "bundle: $bundle"
  printf '%-21s %-5s %5s  %s\n' step status time result
  printf '%s\n' "${summary_rows[@]}"
} >"$out/summary.txt"
printf '%s\n' "${json_rows[@]}" | "${python:-python3}" -c '
import json, sys, subprocess
steps = []
for line in sys.stdin:
    if line.strip():
        name, status, rc, secs, note = line.rstrip("\n").split("\t", 4)
        steps.append({"step": name, "status": status, "exit": int(rc), "seconds": int(secs),
                      "result": note})
gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                     capture_output=True, text=True).stdout.strip() if sys.argv[2] == "1" else ""
manifest = json.load(open(sys.argv[1]))
json.dump({"schema": "capalloc.gpu-check/1", "gpu": gpu, "bundle_commit": manifest.get("commit"),
           "steps": steps, "failed": any(s["status"] == "FAIL" for s in steps)},
          open(sys.argv[3], "w"), indent=1)
' "$bundle/MANIFEST.json" "$(command -v nvidia-smi >/dev/null && echo 1 || echo 0)" "$out/summary.json" \
  || echo "gpu-check.sh: could not write summary.json" >&2
echo
cat "$out/summary.txt"
exit "$failed"
