#!/usr/bin/env python3
"""Converts a pickled PyTorch memory snapshot to a capalloc.trace/1 trace
(docs/trace.md), with Python's standard library only.

  python -c "import torch, pickle; ...; pickle.dump(torch.cuda.memory._snapshot(), open('s.pickle', 'wb'))"
  torch_snapshot_to_trace.py s.pickle [--device N] [--tags] [--out FILE]

What it reads of the snapshot (a dict of plain dicts, lists, strings and
numbers; record it with torch.cuda.memory._record_memory_history() first):

  snapshot["device_traces"]    a list, one entry per device: that device's
                               events, oldest first
  event["action"]              "alloc", "free_requested", "free_completed",
                               "free" (older PyTorch), "segment_alloc",
                               "segment_free", "segment_map", "segment_unmap",
                               "snapshot", "oom"
  event["addr"]                the block's address (an integer)
  event["size"]                its size in bytes
  event["stream"]              the stream (an integer; 0: the default stream)
  event["time_us"]             optional: microseconds, written as `t` (ns)
  event["frames"]              optional: a list of {"filename", "line", "name"}
                               dicts, the first written as the tag with --tags

How events become trace lines:
  alloc            -> alloc, with a new id for the address
  free_requested   -> free: the caller's free (the block may go back to the
                      pool later, after its streams' work: free_completed)
  free             -> free (older snapshots have no free_requested)
  free_completed   -> nothing, unless no free was requested for the block
                      (then it is the free)
  segment_*, snapshot, oom -> nothing (counted in the closing comment)

The snapshot's trace is a ring buffer (trace_alloc_max_entries): its first
events may free blocks allocated before it starts. Those frees are dropped
and counted. Streams are renumbered in order of appearance, the default
stream (0) staying 0. The pickle is read by an unpickler that refuses every
class, so a snapshot cannot run code; a snapshot that needs a class is
reported as such.
"""

import argparse
import io
import json
import pickle
import sys

FORMAT = "capalloc.trace/1"


class PlainUnpickler(pickle.Unpickler):
    """Loads dicts, lists, tuples, strings and numbers; refuses any class."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(
            "the snapshot needs the class %s.%s; only plain dicts, lists, strings and numbers "
            "are read (save torch.cuda.memory._snapshot() itself, not an object holding it)"
            % (module, name))


def load_snapshot(data):
    return PlainUnpickler(io.BytesIO(data)).load()


def convert(snapshot, out, device=0, tags=False):
    """Writes the trace of `device`; returns the counts of what was done."""
    if not isinstance(snapshot, dict) or "device_traces" not in snapshot:
        raise ValueError("not a memory snapshot: no 'device_traces' (record with "
                         "torch.cuda.memory._record_memory_history() before taking it)")
    traces = snapshot["device_traces"]
    if not 0 <= device < len(traces):
        raise ValueError("device %d: the snapshot has traces for %d device(s)" % (device, len(traces)))
    counts = {"alloc": 0, "free": 0, "dropped_free": 0, "ignored": 0}
    write = lambda obj: out.write(json.dumps(obj, separators=(",", ":")) + "\n")
    write({"format": FORMAT, "source": "torch-snapshot (device %d)" % device, "devices": 1})
    streams = {0: 0}
    live = {}  # address -> [id, free requested?]
    next_id = 1
    for index, event in enumerate(traces[device]):
        action = event.get("action")
        addr = event.get("addr")
        line = {}
        if "time_us" in event:
            line["t"] = int(event["time_us"] * 1000)
        if action == "alloc":
            previous = live.pop(addr, None)
            if previous is not None and not previous[1]:
                # The address is handed out again with no free seen: free it first.
                write({"op": "free", "id": previous[0]})
                counts["free"] += 1
            stream = streams.setdefault(event.get("stream", 0), len(streams))
            size = int(event["size"])
            if size <= 0:
                raise ValueError("event %d: alloc of size %d" % (index, size))
            line.update({"op": "alloc", "id": next_id, "size": size, "stream": stream})
            frames = event.get("frames") or []
            if tags and frames:
                top = frames[0]
                line["tag"] = "%s:%s:%s" % (top.get("filename", "?"), top.get("line", "?"),
                                            top.get("name", "?"))
            live[addr] = [next_id, False]
            next_id += 1
            counts["alloc"] += 1
        elif action in ("free_requested", "free"):
            entry = live.get(addr)
            if entry is None:
                counts["dropped_free"] += 1  # allocated before the trace began
                continue
            if entry[1]:
                continue  # requested twice: the first request was the free
            line.update({"op": "free", "id": entry[0]})
            if action == "free_requested":
                entry[1] = True  # its free_completed follows
            else:
                del live[addr]
            counts["free"] += 1
        elif action == "free_completed":
            entry = live.pop(addr, None)
            if entry is None or entry[1]:
                continue  # completes a free already written, or one before the trace
            line.update({"op": "free", "id": entry[0]})
            counts["free"] += 1
        else:
            counts["ignored"] += 1
            continue
        write(line)
    out.write("# converted: %(alloc)d allocs, %(free)d frees; %(dropped_free)d frees of blocks "
              "allocated before the trace began dropped; %(ignored)d other events ignored\n" % counts)
    return counts


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("snapshot", help="a pickled torch.cuda.memory._snapshot()")
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--tags", action="store_true", help="tag each alloc with its first frame")
    parser.add_argument("--out", help="output file (default: stdout)")
    args = parser.parse_args(argv)
    with open(args.snapshot, "rb") as f:
        data = f.read()
    try:
        snapshot = load_snapshot(data)
        if args.out:
            with open(args.out, "w", encoding="utf-8") as out:
                counts = convert(snapshot, out, args.device, args.tags)
        else:
            counts = convert(snapshot, sys.stdout, args.device, args.tags)
    except (ValueError, pickle.UnpicklingError, KeyError, TypeError) as e:
        print("torch_snapshot_to_trace: %s: %s" % (args.snapshot, e), file=sys.stderr)
        return 1
    print("torch_snapshot_to_trace: %(alloc)d allocs, %(free)d frees" % counts, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
