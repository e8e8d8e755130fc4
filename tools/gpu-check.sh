#!/usr/bin/env bash
# tools/gpu-check.sh: every check that needs an NVIDIA GPU, run from a bundle
# made by tools/gpu-bundle.sh, on a bare GPU machine (no Debian packages, no
# network, no build). Fits in 5 minutes on an H200: each step has its own
# time limit, and the run starts no step after 290 s.
#
#   bash tools/gpu-check.sh --bundle DIR --out OUTDIR [--only STEP,...] [--keep-logs]
#
#   --bundle DIR   the bundle (default: gpu-bundle/ beside tools/, or the
#                  directory this script sits in when it is the bundle's copy)
#   --out OUTDIR   where results go (default: gpu-check-out/). Three files:
#                  summary.txt, summary.json and logs.tar.gz (every step's log
#                  and outputs, under logs/): the device tool brings back at
#                  most 8 files
#   --only STEPS   run only these steps (comma-separated), e.g. --only arms,gemm-scenario
#   --keep-logs    also leave OUTDIR/logs/ unpacked
#   --list         print the steps and exit
#
# Steps (docs/gpu.md says what each proves):
#   nvidia-smi           the device, driver and memory
#   bundle-fresh         the bundle was built from the source tree beside it
#   bundle-loads         every ELF in the bundle loads with this machine's
#                        loader and glibc (ldd: nothing "not found")
#   gpu-tests            gpu_runtime_test (a skip for want of a device fails)
#   arms                 `capalloc arms --json` on cuda and on host in this
#                        run, compared field by field
#   gemm-scenario        the same for `capalloc gemm-scenario --json`
#   torch-arms           seed 003's four arms in PyTorch with capalloc
#                        installed through CUDAPluggableAllocator; every
#                        graph's findings checked against its replay
#   torch-native-capture a graph PyTorch captures natively: the tracker's
#                        findings and evidence, checked against a replay
#   torch-shim           the PyTorch shim built here: record_stream,
#                        empty_cache, pool sharing and release reach capalloc;
#                        strict mode raises at the end of a capture with a hazard
#   torch-arms-shim      the same through the shim: arm D's captures share a
#                        pool, as in the seed
#   gemm-vs-cublas       the split-K GEMM against cuBLAS, seed 003's shapes
#   bench-gpu            `capalloc bench`'s GPU columns (capalloc on cuda,
#                        cudaMallocAsync, PyTorch) on a churn trace; a skipped
#                        column fails
#
# A step that cannot run here (no PyTorch, no cuBLAS, no source tree) exits
# 77 and is marked SKIP with its reason, never PASS. A step past its limit is
# killed with its whole process group; a step not started because the run's
# 290 s were spent FAILs. Exit status: 0 when no step failed.
set -uo pipefail

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ -f "$script_dir/MANIFEST.json" ]]; then
  bundle="$script_dir"            # this is the bundle's own copy
  tree="$script_dir/.."
else
  bundle="$script_dir/../gpu-bundle"
  tree="$script_dir/.."
fi
out="gpu-check-out"
only=""
only_given=0
keep_logs=0
all_steps=(nvidia-smi bundle-fresh bundle-loads gpu-tests arms gemm-scenario torch-arms
           torch-native-capture torch-shim torch-arms-shim gemm-vs-cublas bench-gpu)
usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
while (($#)); do
  case "$1" in
    --bundle) [[ $# -ge 2 ]] || { usage >&2; exit 2; }; bundle="$2"; shift 2 ;;
    --out) [[ $# -ge 2 ]] || { usage >&2; exit 2; }; out="$2"; shift 2 ;;
    --only) [[ $# -ge 2 ]] || { usage >&2; exit 2; }; only="$2"; only_given=1; shift 2 ;;
    --keep-logs) keep_logs=1; shift ;;
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
is_step() {
  local s
  for s in "${all_steps[@]}"; do [[ "$s" == "$1" ]] && return 0; done
  return 1
}
wanted=()
if ((only_given)); then
  IFS=',' read -r -a wanted <<<"$only"
  ((${#wanted[@]})) || { echo "gpu-check.sh: --only names no step (steps: ${all_steps[*]})" >&2; exit 2; }
  for s in "${wanted[@]}"; do
    is_step "$s" || { echo "gpu-check.sh: unknown step '$s' (steps: ${all_steps[*]})" >&2; exit 2; }
  done
else
  wanted=("${all_steps[@]}")
fi
is_wanted() {
  local s
  for s in "${wanted[@]}"; do [[ "$s" == "$1" ]] && return 0; done
  return 1
}
bundle="$(cd "$bundle" && pwd)"
tree="$(cd "$tree" && pwd)"
mkdir -p "$out" || exit 2
out="$(cd "$out" && pwd)"
logs="$out/logs"
rm -rf "$logs" "$out/logs.tar.gz"
mkdir -p "$logs"
bin="$bundle/bin"
py="$bundle/python"
export CAPALLOC_LIBRARY="$bundle/lib/libcapalloc.so"
# The GPU backends are plugins in lib/ (the bundle's binaries link capalloc
# statically, so the library's own directory is bin/).
export CAPALLOC_BACKEND_PATH="$bundle/lib"
export CAPALLOC_LOG_LEVEL="${CAPALLOC_LOG_LEVEL:-warn}"
python="$(command -v python3 || command -v python || true)"

deadline=$((SECONDS + 290))
summary_rows=()
json_rows=()
failed=0

# run_limited LIMIT LOG COMMAND...: runs COMMAND (a function below) in a
# session of its own, output to LOG; past LIMIT seconds the whole process
# group gets SIGTERM, then SIGKILL 3 s later, and the status is 124.
run_limited() {
  local limit="$1" log="$2"
  shift 2
  if ! command -v setsid >/dev/null; then
    timeout --kill-after=3 "$limit" bash -c '"$@"' step "$@" >"$log" 2>&1
    return
  fi
  # A background job of a script without job control is no group leader,
  # so setsid makes it one without forking: $! is the group's id.
  setsid bash -c '"$@"' step "$@" >"$log" 2>&1 &
  local pid=$! tenths=0
  while kill -0 "$pid" 2>/dev/null; do
    if ((tenths >= limit * 10)); then
      kill -TERM -- "-$pid" 2>/dev/null
      sleep 3
      kill -KILL -- "-$pid" 2>/dev/null
      wait "$pid" 2>/dev/null
      return 124
    fi
    sleep 0.1
    tenths=$((tenths + 1))
  done
  wait "$pid"
}

# step NAME LIMIT COMMAND...: runs COMMAND with a time limit (cut to what is
# left before the deadline), logs to logs/NAME.log, and records PASS, FAIL or
# SKIP (exit 77) with the log's last `result:` line (else its last line).
step() {
  local name="$1" limit="$2"
  shift 2
  is_wanted "$name" || return 0
  local left=$((deadline - SECONDS)) status rc note t0=$SECONDS
  local log="$logs/$name.log"
  if ((left < 5)); then
    # A check that never ran proves nothing: it fails, so a run cut short
    # cannot pass for a complete one.
    status=FAIL rc=-1 note="not started: the run's 290 s were spent"; failed=1
  else
    ((limit > left)) && limit=$left
    echo "=== $name (limit ${limit}s)"
    run_limited "$limit" "$log" "$@"
    rc=$?
    tail -n 25 "$log"
    note="$(grep -a -E '^result: ' "$log" | tail -n 1 | sed 's/^result: //')"
    [[ -n "$note" ]] || note="$(grep -a -v '^[[:space:]]*$' "$log" | tail -n 1)"
    case "$rc" in
      0) status=PASS ;;
      77) status=SKIP ;;
      124|137) status=FAIL; note="timed out after ${limit}s; $note"; failed=1 ;;
      *) status=FAIL; failed=1 ;;
    esac
  fi
  local secs=$((SECONDS - t0))
  note="${note//$'\t'/ }"
  summary_rows+=("$(printf '%-21s %-5s %4ss  %s' "$name" "$status" "$secs" "${note:0:160}")")
  json_rows+=("$(printf '%s\t%s\t%s\t%s\t%s' "$name" "$status" "$rc" "$secs" "$note")")
}

# The GPU runtime's JSON and the host runtime's, in this run, compared (also
# when a run reports a mismatch: the comparison says where).
compare_with_host() {
  local name="$1" rc_host rc_cuda
  shift
  "$bin/capalloc" "$@" --runtime host --json >"$logs/$name.host.json"
  rc_host=$?
  "$bin/capalloc" "$@" --runtime cuda --json >"$logs/$name.cuda.json"
  rc_cuda=$?
  if ! "$python" -c 'import json, sys; json.load(open(sys.argv[1]))' "$logs/$name.cuda.json" 2>/dev/null; then
    echo "result: the cuda runtime's run gave no JSON (exit $rc_cuda)"
    return 1
  fi
  "$python" "$py/compare_verdicts.py" "$logs/$name.host.json" "$logs/$name.cuda.json" \
    --out "$logs/$name.diff.json" || return 1
  ((rc_host == 0 && rc_cuda == 0)) || { echo "result: exit host $rc_host, cuda $rc_cuda"; return 1; }
}

# PyTorch with CUDA importable? (exit 77 with the reason when not)
torch_ready() {
  [[ -n "$python" ]] || { echo "result: skipped: no python3"; return 77; }
  "$python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)' 2>"$logs/torch-import.err"
  case $? in
    0) return 0 ;;
    3) echo "result: skipped: PyTorch imports but sees no CUDA device"; return 77 ;;
    *) echo "result: skipped: PyTorch is not importable: $(tail -n 1 "$logs/torch-import.err")"; return 77 ;;
  esac
}

# cuBLAS for the benchmark: the CUDA toolkit's, else PyTorch's nvidia wheels'.
cublas_dirs() {
  local dirs=() d
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

run_bundle_fresh() {
  [[ -f "$tree/tools/gpu-check.sh" ]] || {
    echo "result: skipped: no source tree beside the bundle ($tree) to compare with"; return 77; }
  "$python" "$py/bundle_fresh.py" "$bundle" "$tree"
}

run_bundle_loads() {
  "$python" -c 'import json, sys; m = json.load(open(sys.argv[1])); m.pop("files", None); m.pop("sources", None); print("bundle:", json.dumps(m))' \
    "$bundle/MANIFEST.json"
  echo "this machine: $(ldd --version 2>&1 | head -n 1)"
  local bad=0 elf report
  for elf in "$bin"/* "$bundle"/lib/*.so*; do
    report="$(ldd "$elf" 2>&1)"
    if grep -q 'not found' <<<"$report"; then
      echo "$elf:"; grep 'not found' <<<"$report"; bad=1
    fi
  done
  ((bad)) && { echo "result: some bundle files do not load here (a library or a glibc/libstdc++ version not found)"; return 1; }
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

# The same arms through the shim: PyTorch's pool handle reaches capalloc, so
# arm D's two captures share one pool as in the seed. Runs after torch-shim,
# whose build it finds in the shim cache.
run_torch_arms_shim() {
  torch_ready || return $?
  CAPALLOC_RUNTIME=cuda CAPALLOC_SHIM_CACHE="$shim_cache" \
    "$python" "$py/seed003_arms_torch.py" --route shim
}

run_torch_native_capture() {
  torch_ready || return $?
  CAPALLOC_RUNTIME=cuda "$python" "$py/torch_native_capture.py"
}

# The shim is compiled here (under a minute) into a scratch cache; a machine
# without a C++ compiler or PyTorch's headers skips (77) with the reason.
run_torch_shim() {
  torch_ready || return $?
  CAPALLOC_RUNTIME=cuda CAPALLOC_SHIM_CACHE="$shim_cache" \
    "$python" "$py/torch_shim_check.py"
}

# capalloc bench's GPU columns (capalloc on the cuda runtime, cudaMallocAsync,
# PyTorch's caching allocator) next to capalloc on the host runtime, on a
# small generated churn trace. Needs the source tree for the generator and
# the PyTorch replay script.
run_bench_gpu() {
  [[ -n "$python" ]] || { echo "result: skipped: no python3"; return 77; }
  [[ -f "$tree/tools/trace/gen_traces.py" ]] || {
    echo "result: skipped: no source tree at $tree (the trace generator and PyTorch replay live there)"
    return 77; }
  local dir
  dir="$(mktemp -d)"
  trap 'rm -rf "$dir"' RETURN
  "$python" "$tree/tools/trace/gen_traces.py" churn --allocs 20000 --out "$dir/churn.jsonl" || return 1
  CAPALLOC_TORCH_REPLAY="$tree/tools/trace/torch_replay.py" "$bin/capalloc" bench --repetitions 2 \
    --allocators capalloc,capalloc-cuda,cudaMallocAsync,torch "$dir/churn.jsonl" | tee "$dir/table.txt"
  local rc=${PIPESTATUS[0]}
  ((rc == 0)) || { echo "result: capalloc bench exited $rc"; return 1; }
  # A GPU column that was skipped is a failure here: this step exists for them.
  if grep -q ' skipped: ' "$dir/table.txt"; then
    echo "result: $(grep -c ' skipped: ' "$dir/table.txt") GPU column(s) skipped: $(grep -m1 ' skipped: ' "$dir/table.txt" | sed 's/^ *//')"
    return 1
  fi
  echo "result: churn trace, ns/op median: $(awk '$1 ~ /^(capalloc|capalloc-cuda|cudaMallocAsync|torch)$/ && $2 ~ /^[0-9.]+$/ {printf "%s%s %s", sep, $1, $2; sep=", "}' "$dir/table.txt")"
}

run_gemm_vs_cublas() {
  local dirs
  dirs="$(cublas_dirs)"
  [[ -n "$dirs" ]] && echo "cuBLAS from: $dirs"
  local path="$dirs"
  [[ -n "${LD_LIBRARY_PATH:-}" ]] && path="${path:+$path:}$LD_LIBRARY_PATH"
  LD_LIBRARY_PATH="$path" "$bin/capalloc_bench_gemm_cuda" --iters 50
}

# The shim torch-shim builds and torch-arms-shim reuses.
shim_cache="${TMPDIR:-/tmp}/capalloc-shim-cache"
export bundle tree logs bin py python shim_cache
# Each step runs its function in a fresh bash (run_limited), which sees only
# exported functions: export every function defined above, so a new step
# cannot be forgotten here (bench-gpu's first GPU run failed that way).
mapfile -t defined_functions < <(declare -F | awk '{print $3}')
export -f "${defined_functions[@]}"
echo "gpu-check.sh: bundle $bundle, output $out, steps: ${wanted[*]}"
step nvidia-smi 15 run_nvidia_smi
step bundle-fresh 15 run_bundle_fresh
step bundle-loads 30 run_bundle_loads
step gpu-tests 90 run_gpu_tests
step arms 40 compare_with_host arms arms
step gemm-scenario 40 compare_with_host gemm-scenario gemm-scenario
step torch-arms 60 run_torch_arms
step torch-native-capture 45 run_torch_native_capture
step torch-shim 100 run_torch_shim
step torch-arms-shim 60 run_torch_arms_shim
step gemm-vs-cublas 45 run_gemm_vs_cublas
step bench-gpu 60 run_bench_gpu

gpu_line="$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1)"
{
  echo "capalloc gpu-check $(date -u '+%Y-%m-%d %H:%M UTC') on $(hostname)"
  echo "gpu: ${gpu_line:-none found}"
  echo "bundle: $bundle (commit $(grep -o '"commit": *"[0-9a-f]*"' "$bundle/MANIFEST.json" | grep -o '[0-9a-f]\{12,\}' | cut -c1-12))"
  printf '%-21s %-5s %5s  %s\n' step status time result
  printf '%s\n' "${summary_rows[@]}"
} >"$out/summary.txt"
printf '%s\n' "${json_rows[@]}" | "${python:-python3}" -c '
import json, sys
sys.stdin.reconfigure(errors="replace")
steps = []
for line in sys.stdin:
    if line.strip():
        name, status, rc, secs, note = line.rstrip("\n").split("\t", 4)
        steps.append({"step": name, "status": status, "exit": int(rc), "seconds": int(secs),
                      "result": note})
manifest = json.load(open(sys.argv[1]))
json.dump({"schema": "capalloc.gpu-check/1", "gpu": sys.argv[2],
           "bundle_commit": manifest.get("commit"), "steps": steps,
           "failed": any(s["status"] == "FAIL" for s in steps)},
          open(sys.argv[3], "w"), indent=1)
' "$bundle/MANIFEST.json" "$gpu_line" "$out/summary.json" \
  || echo "gpu-check.sh: could not write summary.json" >&2
tar -czf "$out/logs.tar.gz" -C "$out" logs || echo "gpu-check.sh: could not pack the logs" >&2
((keep_logs)) || rm -rf "$logs"
echo
cat "$out/summary.txt"
exit "$failed"
