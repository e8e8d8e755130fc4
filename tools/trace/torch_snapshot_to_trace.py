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
and counted, as are repeated frees of one block. An event it cannot
convert (no integer address, a size that is not 1 to 2^63 - 1) stops the
conversion with its index; `--out` is then left as it was. Streams are renumbered in order of appearance, the default
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


class ClassRefused(pickle.UnpicklingError):
    """The snapshot names a class (PlainUnpickler loads none)."""


class PlainUnpickler(pickle.Unpickler):
    """Loads dicts, lists, tuples, strings and numbers; refuses any class."""

    def find_class(self, module, name):
        raise ClassRefused(
            "the snapshot needs the class %s.%s; only plain dicts, lists, strings and numbers "
            "are read (save torch.cuda.memory._snapshot() itself, not an object holding it)"
            % (module, name))


def load_snapshot(data):
    try:
        return PlainUnpickler(io.BytesIO(data)).load()
    except ClassRefused:
        raise
    except EOFError:
        raise pickle.UnpicklingError("not a pickle: the data ends before the first object")
    except Exception as e:  # a damaged pickle raises what its opcodes happen to raise
        raise pickle.UnpicklingError("not a pickle (%s: %s)" % (type(e).__name__, e))


MAX_SIZE = (1 << 63) - 1  # what a trace's size may be (docs/trace.md)


def is_integer(value):
    """An int, not a bool (which Python counts as one)."""
    return isinstance(value, int) and not isinstance(value, bool)


def text(value):
    """`value` as text a trace can hold: valid UTF-8 (a lone surrogate from a
    file name PyTorch could not decode is written as its escape)."""
    return str(value).encode("utf-8", "backslashreplace").decode("utf-8")


def convert(snapshot, out, device=0, tags=False):
    """Writes the trace of `device`; returns the counts of what was done.
    Raises ValueError, naming the event, on anything it cannot convert."""
    if not isinstance(snapshot, dict) or "device_traces" not in snapshot:
        raise ValueError("not a memory snapshot: no 'device_traces' (record with "
                         "torch.cuda.memory._record_memory_history() before taking it)")
    traces = snapshot["device_traces"]
    if not isinstance(traces, list):
        raise ValueError("not a memory snapshot: 'device_traces' is not a list")
    if not 0 <= device < len(traces):
        raise ValueError("device %d: the snapshot has traces for %d device(s)" % (device, len(traces)))
    if not isinstance(traces[device], list):
        raise ValueError("device %d: its trace is not a list of events" % device)
    counts = {"alloc": 0, "free": 0, "dropped_free": 0, "repeated_free": 0, "ignored": 0}
    write = lambda obj: out.write(json.dumps(obj, separators=(",", ":")) + "\n")
    write({"format": FORMAT, "source": "torch-snapshot (device %d)" % device, "devices": 1})
    streams = {0: 0}
    live = {}  # address -> [id, free requested?]
    freed = set()  # addresses whose last block was freed (and not handed out again)
    next_id = 1
    for index, event in enumerate(traces[device]):
        if not isinstance(event, dict):
            raise ValueError("event %d: not a dict but %s" % (index, type(event).__name__))
        action = event.get("action")
        if action not in ("alloc", "free_requested", "free", "free_completed"):
            counts["ignored"] += 1
            continue
        addr = event.get("addr")
        if not is_integer(addr):
            raise ValueError("event %d (%s): 'addr' is %r, not an integer address" % (index, action, addr))
        line = {}
        if "time_us" in event:
            time_us = event["time_us"]
            if (not isinstance(time_us, (int, float)) or isinstance(time_us, bool)
                    or not abs(time_us) < 2 ** 53):  # false for NaN and infinities too
                raise ValueError("event %d (%s): 'time_us' is %r, not a time in microseconds"
                                 % (index, action, time_us))
            line["t"] = int(time_us * 1000)
        if action == "alloc":
            previous = live.pop(addr, None)
            if previous is not None and not previous[1]:
                # The address is handed out again with no free seen: free it first.
                write({"op": "free", "id": previous[0]})
                counts["free"] += 1
            size = event.get("size")
            if not is_integer(size):
                raise ValueError("event %d (alloc): 'size' is %r, not an integer" % (index, size))
            if not 0 < size <= MAX_SIZE:
                raise ValueError("event %d: alloc of size %d (a trace's sizes are 1 to 2^63 - 1)"
                                 % (index, size))
            stream_id = event.get("stream", 0)
            if not is_integer(stream_id):
                raise ValueError("event %d (alloc): 'stream' is %r, not an integer" % (index, stream_id))
            stream = streams.setdefault(stream_id, len(streams))
            line.update({"op": "alloc", "id": next_id, "size": size, "stream": stream})
            frames = event.get("frames") or []
            if tags and isinstance(frames, list) and frames:
                top = frames[0] if isinstance(frames[0], dict) else {}
                line["tag"] = text("%s:%s:%s" % (top.get("filename", "?"), top.get("line", "?"),
                                                 top.get("name", "?")))
            live[addr] = [next_id, False]
            freed.discard(addr)
            next_id += 1
            counts["alloc"] += 1
        elif action in ("free_requested", "free"):
            entry = live.get(addr)
            if entry is None:
                # A block allocated before the trace began, or one freed already.
                counts["repeated_free" if addr in freed else "dropped_free"] += 1
                continue
            if entry[1]:
                counts["repeated_free"] += 1  # requested twice: the first request was the free
                continue
            line.update({"op": "free", "id": entry[0]})
            if action == "free_requested":
                entry[1] = True  # its free_completed follows
            else:
                del live[addr]
                freed.add(addr)
            counts["free"] += 1
        else:  # free_completed
            entry = live.pop(addr, None)
            freed.add(addr)
            if entry is None or entry[1]:
                continue  # completes a free already written, or one before the trace
            line.update({"op": "free", "id": entry[0]})
            counts["free"] += 1
        write(line)
    out.write("# converted: %(alloc)d allocs, %(free)d frees; %(dropped_free)d frees of blocks "
              "allocated before the trace began dropped; %(repeated_free)d repeated frees "
              "dropped; %(ignored)d other events ignored\n" % counts)
    return counts


def write_trace(path, snapshot, device, tags):
    """Converts the whole trace, then writes it to `path` (through a link,
    into a pipe or a device as into a file): a conversion that fails leaves
    `path` as it was."""
    buffer = io.StringIO()
    counts = convert(snapshot, buffer, device, tags)
    with open(path, "w", encoding="utf-8") as out:
        out.write(buffer.getvalue())
    return counts


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("snapshot", help="a pickled torch.cuda.memory._snapshot()")
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--tags", action="store_true", help="tag each alloc with its first frame")
    parser.add_argument("--out", help="output file (default: stdout); left as it was on an error")
    args = parser.parse_args(argv)
    try:
        with open(args.snapshot, "rb") as f:
            data = f.read()
        snapshot = load_snapshot(data)
        if args.out == "":
            parser.error("--out '': name a file (or leave --out out for stdout)")
        if args.out is not None:
            counts = write_trace(args.out, snapshot, args.device, args.tags)
        elif sys.stdout is None:
            print("torch_snapshot_to_trace: stdout is closed: name a file with --out",
                  file=sys.stderr)
            return 1
        else:
            # To stdout: the trace is built first, so an error prints no partial trace.
            buffer = io.StringIO()
            counts = convert(snapshot, buffer, args.device, args.tags)
            sys.stdout.write(buffer.getvalue())
    except OSError as e:  # the snapshot unreadable, or --out unwritable
        where = args.snapshot if e.filename == args.snapshot else (args.out or e.filename
                                                                    or "<stdout>")
        print("torch_snapshot_to_trace: %s: %s" % (where, e.strerror or e), file=sys.stderr)
        return 1
    except (ValueError, pickle.UnpicklingError) as e:
        print("torch_snapshot_to_trace: %s: %s" % (args.snapshot, e), file=sys.stderr)
        return 1
    print("torch_snapshot_to_trace: %(alloc)d allocs, %(free)d frees" % counts, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
