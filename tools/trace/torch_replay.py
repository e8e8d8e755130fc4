#!/usr/bin/env python3
"""PyTorch's CUDA caching allocator as a replay of `capalloc bench`.

  torch_replay.py TRACE [--warmups N]        replay and print one JSON object
  torch_replay.py --check                    exit 0 when torch sees a CUDA device

Replays a capalloc.trace/1 file (docs/trace.md) through
torch.cuda.caching_allocator_alloc / caching_allocator_delete on device 0,
the trace's dense stream 0 being the current stream and the others streams
of its own: a warm-up pass, then one measured pass timed in batches of 256
alloc/free operations, as `capalloc bench-replay` times its own. Prints the
same result object (the members `capalloc bench` reads: pass with its
batches, stats with reserved_bytes_peak from torch.cuda.max_memory_reserved).
A trace with captures is refused (exit 1): replaying PyTorch's graph capture
is not modelled. Memory is not touched, as in the other replays.
"""
import argparse
import json
import sys
import time

BATCH_OPS = 256


def read_trace(path):
    """(ops, stream count): ops as ("alloc", id, size, stream) or ("free", id)."""
    # The trace's stream 0 is the default stream, as in `capalloc bench-replay`;
    # the others are numbered in order of appearance.
    ops, streams = [], {0: 0}
    # As the C++ reader: a byte-order mark is skipped, and only "\n" ends a line.
    with open(path, encoding="utf-8-sig", newline="\n") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue  # blank lines and comments (docs/trace.md)
            event = json.loads(line)
            op = event.get("op")
            if op is None:
                continue  # the preamble
            if op == "alloc":
                stream = streams.setdefault(event.get("stream", 0), len(streams))
                ops.append(("alloc", event["id"], int(event["size"]), stream))
            elif op == "free":
                ops.append(("free", event["id"]))
            elif op in ("record_stream",):
                continue  # the caching allocator's record_stream needs a tensor
            elif op in ("capture_begin", "capture_end", "replay", "graph_destroy"):
                raise SystemExit(f"{path}:{number}: a trace with captures is not replayed through PyTorch")
    return ops, len(streams)


def one_pass(torch, ops, streams, timed):
    live = {}
    batches = []
    done = 0
    t0 = time.perf_counter_ns()
    start = t0
    for op in ops:
        if op[0] == "alloc":
            live[op[1]] = torch.cuda.caching_allocator_alloc(op[2], 0, streams[op[3]])
        else:
            torch.cuda.caching_allocator_delete(live.pop(op[1]))
        done += 1
        if timed and done == BATCH_OPS:
            now = time.perf_counter_ns()
            batches.append((now - t0) / done)
            t0, done = now, 0
    if timed and done:
        batches.append((time.perf_counter_ns() - t0) / done)
    for ptr in live.values():
        torch.cuda.caching_allocator_delete(ptr)
    torch.cuda.synchronize()
    return time.perf_counter_ns() - start, batches


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("trace", nargs="?")
    parser.add_argument("--warmups", type=int, default=1)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    try:
        import torch
    except ImportError as e:
        print(f"PyTorch is not installed: {e}", file=sys.stderr)
        return 1
    if not torch.cuda.is_available():
        print("PyTorch sees no CUDA device", file=sys.stderr)
        return 1
    if args.check:
        return 0
    if args.trace is None:
        parser.error("a trace is required")
    ops, stream_count = read_trace(args.trace)
    current = torch.cuda.current_stream(0)
    streams = [current.cuda_stream] + [torch.cuda.Stream(0).cuda_stream for _ in range(stream_count - 1)]
    for _ in range(args.warmups):
        one_pass(torch, ops, streams, timed=False)
    torch.cuda.reset_peak_memory_stats(0)
    cpu0 = time.thread_time_ns()
    wall, batches = one_pass(torch, ops, streams, timed=True)
    cpu = time.thread_time_ns() - cpu0
    result = {
        "allocator": "torch",
        "malloc_library": "",
        "trace": args.trace,
        "operations": len(ops),
        "warmups": args.warmups,
        "counted": False,
        "pass": {
            "ops_outside": len(ops), "ns_outside": wall, "ops_inside": 0, "ns_inside": 0,
            "capture_begin": {"count": 0, "ns": 0}, "capture_end": {"count": 0, "ns": 0},
            "replay": {"count": 0, "ns": 0}, "graph_destroy": {"count": 0, "ns": 0},
            "cpu_ns": cpu, "batch_ns_per_op": batches,
        },
        "stats": {"reserved_bytes_peak": torch.cuda.max_memory_reserved(0)},
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
