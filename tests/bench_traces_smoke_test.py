#!/usr/bin/env python3
"""tests/bench_traces_smoke_test.py CAPALLOC WORK_DIR: `capalloc bench` on a
tiny trace from each generator (tools/trace/gen_traces.py --scale 0.01), one
repetition, --json: every allocator is in the result, with sane fields; the
trace with captures runs through capalloc alone and reports its capture
costs. Then --callgrind on one trace, and the refusals of a bad trace and a
missing file. No timing is judged."""

import json
import math
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
GENERATOR = os.path.join(HERE, "..", "tools", "trace", "gen_traces.py")
ALLOCATORS = ["capalloc", "naive", "glibc", "jemalloc", "mimalloc", "tcmalloc"]
# Run where a GPU (and, for torch, PyTorch) is present; else skipped with why.
GPU_ALLOCATORS = ["capalloc-cuda", "cudaMallocAsync", "torch"]
TORCH_REPLAY = os.path.join(HERE, "..", "tools", "trace", "torch_replay.py")
LIBRARIES = {"glibc": "libc.so", "jemalloc": "jemalloc", "mimalloc": "mimalloc", "tcmalloc": "tcmalloc"}

failures = []


def check(condition, message):
    if not condition:
        failures.append(message)
        print("FAIL: " + message)


def positive(value):
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def main():
    capalloc, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    subprocess.run([sys.executable, GENERATOR, "all", "--out-dir", work, "--scale", "0.01"], check=True)
    names = ["capture", "churn", "decoder", "midsize", "training"]
    paths = [os.path.join(work, n + ".jsonl") for n in names]
    run = subprocess.run([capalloc, "bench", "--json", "--repetitions", "1"] + paths,
                         capture_output=True, text=True)
    print(run.stderr)
    check(run.returncode == 0, "capalloc bench exited %d" % run.returncode)
    result = json.loads(run.stdout)
    check(result["format"] == "capalloc.bench/1", "format")
    check(result["machine"]["nproc"] >= 1 and result["machine"]["cpu"], "machine")
    check(len(result["traces"]) == len(paths), "one entry per trace")
    for name, trace in zip(names, result["traces"]):
        by = {r["allocator"]: r for r in trace["results"]}
        check(sorted(by) == sorted(ALLOCATORS + GPU_ALLOCATORS), "%s: allocators %s" % (name, sorted(by)))
        for gpu in GPU_ALLOCATORS:
            r = by[gpu]
            if r["status"] == "skipped":
                check(bool(r.get("reason")), "%s: %s skipped without a reason" % (name, gpu))
            else:
                check(r["status"] == "ok" and name != "capture", "%s: %s %s" % (name, gpu, r))
                check(positive(r.get("ns_per_op_median")) and positive(r.get("peak_reserved_bytes")),
                      "%s: %s times and reserved bytes" % (name, gpu))
        check(trace["operations"] == trace["allocs"] + trace["frees"] and trace["operations"] > 0,
              "%s: operation counts" % name)
        check(trace["peak_requested_bytes"] > 0, "%s: peak requested" % name)
        c = by["capalloc"]
        check(c["status"] == "ok", "%s: capalloc %s" % (name, c))
        check(positive(c.get("ns_per_op_median")) and positive(c.get("ns_per_op_p99")),
              "%s: capalloc times" % name)
        check(c.get("time_vs_capalloc") == 1.0, "%s: capalloc's ratio to itself" % name)
        check(positive(c.get("peak_reserved_bytes")) and c["peak_reserved_over_requested"] >= 1.0,
              "%s: capalloc reserved at least what was requested" % name)
        if name == "capture":
            check(trace["captures"] == 67 and trace["replays"] > 0, "capture: 67 captures, replays")
            cap = c.get("captures", {})
            check(positive(cap.get("ns_per_op_inside")) and positive(cap.get("ns_per_op_outside")),
                  "capture: costs inside and outside captures")
            check(positive(cap.get("capture_end_ms_total")), "capture: capture_end time")
            check([p["name"] for p in cap.get("pools", [])] == ["decode_graphs"] and
                  positive(cap["pools"][0]["reserved_bytes_peak"]), "capture: the shared pool's memory")
            for other in ALLOCATORS[1:]:
                check(by[other]["status"] == "skipped", "capture: %s skipped" % other)
            continue
        for other in ALLOCATORS[1:]:
            r = by[other]
            check(r["status"] == "ok", "%s: %s %s" % (name, other, r))
            if r["status"] != "ok":
                continue
            check(positive(r["ns_per_op_median"]) and positive(r["time_vs_capalloc"]),
                  "%s: %s times" % (name, other))
            if other == "naive":
                check(r["peak_reserved_over_requested"] >= 1.0, "%s: naive reserved" % name)
            else:
                check(r["peak_reserved_bytes"] is None, "%s: %s has no reserved figure" % (name, other))
                check(LIBRARIES[other] in r["malloc_library"],
                      "%s: %s measured %s" % (name, other, r["malloc_library"]))
        check(positive(trace["summary"].get("capalloc_over_fastest")), "%s: summary" % name)

    # Instructions under callgrind, for capalloc and one host malloc.
    run = subprocess.run([capalloc, "bench", "--callgrind", "--json", "--allocators",
                          "capalloc,tcmalloc", paths[1]], capture_output=True, text=True)
    check(run.returncode == 0, "--callgrind exited %d: %s" % (run.returncode, run.stderr))
    if run.returncode == 0:
        for r in json.loads(run.stdout)["traces"][0]["results"]:
            check(r["status"] == "ok" and positive(r["ir_per_pair"]) and positive(r["ir_per_alloc"])
                  and positive(r["ir_per_free"]), "--callgrind: %s" % r)

    # --allocators takes one comma-separated value: the traces after it stay
    # traces (they were once taken as allocator names).
    run = subprocess.run([capalloc, "bench", "--json", "--allocators", "capalloc", paths[1], paths[2]],
                         capture_output=True, text=True)
    check(run.returncode == 0, "--allocators before two traces exited %d: %s" % (run.returncode, run.stderr))
    if run.returncode == 0:
        check(len(json.loads(run.stdout)["traces"]) == 2, "--allocators before two traces: both replayed")

    # An allocator named twice is a usage error (it would be measured twice).
    run = subprocess.run([capalloc, "bench", "--allocators", "capalloc,capalloc", paths[1]],
                         capture_output=True, text=True)
    check(run.returncode == 2 and "'capalloc' is named twice" in run.stderr,
          "--allocators capalloc,capalloc: exit %d, %s" % (run.returncode, run.stderr))

    # The PyTorch replay says whether it can run here (exit 0) or why not.
    run = subprocess.run([sys.executable, TORCH_REPLAY, "--check"], capture_output=True, text=True)
    check(run.returncode == 0 or ("PyTorch" in run.stderr and run.returncode == 1),
          "torch_replay.py --check: %d %s" % (run.returncode, run.stderr))
    # --callgrind skips the GPU allocators, saying why.
    run = subprocess.run([capalloc, "bench", "--callgrind", "--json", "--allocators",
                          "cudaMallocAsync", paths[1]], capture_output=True, text=True)
    check(run.returncode == 0, "--callgrind cudaMallocAsync exited %d" % run.returncode)
    if run.returncode == 0:
        r = json.loads(run.stdout)["traces"][0]["results"][0]
        check(r["status"] == "skipped" and r["reason"], "--callgrind cudaMallocAsync: %s" % r)

    # A bad trace fails with its line; a missing file is a usage error.
    bad = os.path.join(work, "bad.jsonl")
    with open(bad, "w") as f:
        f.write('{"format": "capalloc.trace/1"}\n{"op": "free", "id": 4}\n')
    run = subprocess.run([capalloc, "bench", bad], capture_output=True, text=True)
    check(run.returncode == 1 and "bad.jsonl:2: free of id 4" in run.stderr,
          "a bad trace: exit %d, %s" % (run.returncode, run.stderr))
    run = subprocess.run([capalloc, "bench", os.path.join(work, "missing.jsonl")],
                         capture_output=True, text=True)
    check(run.returncode == 2, "a missing file: exit %d" % run.returncode)

    # What a new user's probe found (2026-12-06). A pipe is refused up front
    # (each replay reopens the trace), as is a trace with nothing to time.
    fifo = os.path.join(work, "fifo")
    if not os.path.exists(fifo):  # left by an earlier run in the same directory
        os.mkfifo(fifo)
    run = subprocess.run([capalloc, "bench", "--allocators", "capalloc", fifo],
                         capture_output=True, text=True, timeout=60)
    check(run.returncode == 1 and "fifo: not a regular file" in run.stderr,
          "a FIFO: exit %d, %s" % (run.returncode, run.stderr))
    empty = os.path.join(work, "header_only.jsonl")
    with open(empty, "w") as f:
        f.write('{"format": "capalloc.trace/1"}\n')
    run = subprocess.run([capalloc, "bench", "--allocators", "capalloc", empty],
                         capture_output=True, text=True)
    check(run.returncode == 1 and "header_only.jsonl: no alloc or free to replay" in run.stderr,
          "a trace without operations: exit %d, %s" % (run.returncode, run.stderr))
    # A failed replay names the trace's line.
    huge = os.path.join(work, "huge.jsonl")
    with open(huge, "w") as f:
        f.write('{"format": "capalloc.trace/1"}\n# one comment\n'
                '{"op": "alloc", "id": 1, "size": 9223372036854775807, "stream": 0}\n')
    run = subprocess.run([capalloc, "bench", "--allocators", "capalloc", huge],
                         capture_output=True, text=True)
    check(run.returncode == 1 and "huge.jsonl:3: alloc of 9223372036854775807 bytes failed"
          in run.stderr, "a failed replay: exit %d, %s" % (run.returncode, run.stderr))
    # A file name beginning with '-' and one that is not UTF-8 replay like any
    # other; the JSON stays valid.
    odd = os.fsencode(work) + b"/-bad\xffname.jsonl"
    with open(odd, "wb") as f, open(paths[1], "rb") as src:
        f.write(src.read())
    run = subprocess.run([os.fsencode(capalloc), b"bench", b"--json", b"--repetitions", b"1",
                          b"--allocators", b"capalloc,naive", b"--", odd], capture_output=True)
    check(run.returncode == 0, "an odd file name: exit %d, %s" % (run.returncode, run.stderr))
    if run.returncode == 0:
        results = json.loads(run.stdout)["traces"][0]["results"]
        check(all(r["status"] == "ok" for r in results), "an odd file name: %s" % results)

    print("%d failure(s)" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
