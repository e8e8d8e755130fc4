"""What segment policies would reserve for a trace: a what-if for issue 12's
memory goal (peak reserved / peak requested <= 1.10), standard library only.

    python3 tools/trace/segment_sim.py TRACE... [--json]

Replays a trace's allocations and frees (capalloc.trace/1, see
gen_traces.py; other operations are skipped) through three models and prints,
for each, peak reserved / peak requested, as `capalloc bench` does:

  fixed        capalloc's segment classes: requests under 1 MiB in 2 MiB
               segments, 1 to 2 MiB in 4 MiB ones, larger ones alone in a
               segment of their size rounded to 2 MiB; never given back.
  grow         requests of 1 MiB and more in one segment per stream that grows
               at its end in 2 MiB pages and never gives a page back (what
               PyTorch's expandable_segments does, on CUDA's virtual memory
               management); smaller ones as `fixed`.
  grow+release as `grow`, and whenever pages must be mapped (the segment
               grows, or a block is placed over pages given back) while the
               whole pages inside free blocks are more than a fraction of
               the mapped ones (--release-above, 0 by default: any), those
               pages are given back first. `passes` counts the give-backs and
               `pages mapped` every page mapped: on a GPU each pass waits for
               the segment's stream and each page is a map call, which is
               what this policy costs.

Each model places a request by exact best fit (the smallest free run that
holds it, then the lowest address) and merges a freed block with its free
neighbours. Not modelled: capalloc's quick cache, its release of free
oversize segments, its good-fit index (TLSF), record_stream and captures. The
fixed model is a baseline for the other two, not a replica of capalloc:
`capalloc bench` gives capalloc's own figure.
"""

import argparse
import bisect
import json
import sys

MIB = 1 << 20
PAGE = 2 * MIB
GRANULE = 512


def round_up(n, to):
    return (n + to - 1) // to * to


class FreeRuns:
    """Free address runs, merged with their neighbours, taken by exact best fit."""

    def __init__(self):
        self.by_size = []  # (size, addr), sorted
        self.size_at = {}  # addr -> size
        self.start_of_end = {}  # end -> addr

    def _unlink(self, addr):
        size = self.size_at.pop(addr)
        del self.start_of_end[addr + size]
        self.by_size.pop(bisect.bisect_left(self.by_size, (size, addr)))
        return size

    def _link(self, addr, size):
        self.size_at[addr] = size
        self.start_of_end[addr + size] = addr
        bisect.insort(self.by_size, (size, addr))

    def add(self, addr, size):
        if addr + size in self.size_at:
            size += self._unlink(addr + size)
        if addr in self.start_of_end:
            before = self.start_of_end[addr]
            size += self._unlink(before)
            addr = before
        self._link(addr, size)

    def take(self, size):
        """The address of a run of `size` bytes carved from the best fit, or None."""
        i = bisect.bisect_left(self.by_size, (size, -1))
        if i == len(self.by_size):
            return None
        run_size, addr = self.by_size[i]
        self._unlink(addr)
        if run_size > size:
            self._link(addr + size, run_size - size)
        return addr

    def run_ending_at(self, end):
        """(addr, size) of the free run that ends at `end`, or None."""
        addr = self.start_of_end.get(end)
        return None if addr is None else (addr, self.size_at[addr])

    def remove(self, addr):
        self._unlink(addr)

    def runs(self):
        return list(self.size_at.items())


def memory_events(path):
    """(op, id, size, stream) of each alloc and free, in trace order."""
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            try:
                e = json.loads(line)
            except json.JSONDecodeError as err:
                raise SystemExit("%s:%d: not JSON: %s" % (path, number, err))
            op = e.get("op")
            if op == "alloc":
                yield "alloc", e["id"], e["size"], e.get("stream", 0)
            elif op == "free":
                yield "free", e["id"], 0, 0


def peak_requested(path):
    current = peak = 0
    sizes = {}
    for op, ident, size, _ in memory_events(path):
        if op == "alloc":
            sizes[ident] = size
            current += size
            peak = max(peak, current)
        else:
            current -= sizes.pop(ident)
    return peak


class FixedSegments:
    """Segments of fixed sizes per (stream, size class); free runs per class."""

    def __init__(self):
        self.runs = {}
        self.reserved = 0
        self.next_base = 1 << 40

    @staticmethod
    def size_class(size):
        return 0 if size < MIB else (1 if size <= 2 * MIB else 2)

    def reserve(self, size):
        base = self.next_base
        self.next_base += size + PAGE  # segments never touch: no merge across them
        self.reserved += size
        return base

    def allocate(self, size, stream):
        key = (stream, self.size_class(size))
        runs = self.runs.setdefault(key, FreeRuns())
        addr = runs.take(size)
        if addr is None:
            segment = (2 * MIB, 4 * MIB, round_up(size, PAGE))[key[1]]
            runs.add(self.reserve(segment), segment)
            addr = runs.take(size)
        return addr, key

    def free(self, addr, size, key):
        self.runs[key].add(addr, size)


class GrowingSegments(FixedSegments):
    """Requests of 1 MiB and more in one growing segment per stream."""

    def __init__(self, release_above=None):
        """release_above: None never gives pages back; else the fraction of
        the mapped pages that free whole pages must pass for a give-back."""
        super().__init__()
        self.release_above = release_above
        self.ends = {}  # stream -> end of the segment's address range
        self.mapped = {}  # stream -> set of mapped page numbers
        self.passes = 0
        self.pages_mapped = 0

    def reserved_bytes(self):
        return self.reserved + PAGE * sum(len(m) for m in self.mapped.values())

    def allocate(self, size, stream):
        if size < MIB:
            return super().allocate(size, stream)
        key = (stream, "grow")
        runs = self.runs.setdefault(key, FreeRuns())
        mapped = self.mapped.setdefault(stream, set())
        base = (stream + 1) << 48  # each stream's segment in its own range
        end = self.ends.setdefault(stream, base)
        addr = runs.take(size)
        if addr is None:  # grow: extend the free run at the end, if any
            tail = runs.run_ending_at(end)
            start = end
            if tail is not None:
                runs.remove(tail[0])
                start = tail[0]
            self.ends[stream] = end = base + round_up(start + size - base, PAGE)
            runs.add(start, end - start)
            addr = runs.take(size)
        pages = range(addr // PAGE, (addr + size - 1) // PAGE + 1)
        missing = [p for p in pages if p not in mapped]
        if missing and self.release_above is not None:
            free_pages = [p for run_addr, run_size in runs.runs()
                          for p in range(-(-run_addr // PAGE), (run_addr + run_size) // PAGE)
                          if p in mapped]
            if len(free_pages) > self.release_above * len(mapped):
                self.passes += 1
                mapped.difference_update(free_pages)
                missing = [p for p in pages if p not in mapped]
        self.pages_mapped += len(missing)
        mapped.update(missing)
        return addr, key


def simulate(path, model):
    """Peak reserved bytes of `model` over the trace."""
    live = {}
    peak = 0
    reserved = getattr(model, "reserved_bytes", lambda: model.reserved)
    for op, ident, size, stream in memory_events(path):
        if op == "alloc":
            rounded = round_up(max(size, 1), GRANULE)
            addr, key = model.allocate(rounded, stream)
            live[ident] = (addr, rounded, key)
            peak = max(peak, reserved())
        else:
            addr, rounded, key = live.pop(ident)
            model.free(addr, rounded, key)
    return peak


def report(path, release_above=0.0):
    requested = peak_requested(path)
    if requested == 0:
        raise SystemExit("%s: no allocation of a non-zero size" % path)
    grow = GrowingSegments()
    release = GrowingSegments(release_above)
    return {
        "trace": path,
        "peak_requested": requested,
        "fixed": simulate(path, FixedSegments()) / requested,
        "grow": simulate(path, grow) / requested,
        "grow_pages_mapped": grow.pages_mapped,
        "release_above": release_above,
        "grow+release": simulate(path, release) / requested,
        "grow+release_passes": release.passes,
        "grow+release_pages_mapped": release.pages_mapped,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="+", help="capalloc.trace/1 files")
    parser.add_argument("--json", action="store_true", help="one JSON object per trace")
    parser.add_argument("--release-above", type=float, default=0.0, metavar="FRACTION",
                        help="grow+release gives pages back only when free whole pages are "
                             "more than this fraction of the mapped ones (default 0)")
    args = parser.parse_args(argv)
    if not 0 <= args.release_above < 1:
        parser.error("--release-above must be at least 0 and below 1")
    for path in args.traces:
        r = report(path, args.release_above)
        if args.json:
            print(json.dumps(r))
            continue
        print("%s: peak requested %.2f MiB; peak reserved / peak requested: fixed %.3f, "
              "grow %.3f (%d pages mapped), grow+release above %g %.3f (%d passes, %d pages "
              "mapped)" % (path, r["peak_requested"] / MIB, r["fixed"], r["grow"],
                           r["grow_pages_mapped"], r["release_above"], r["grow+release"],
                           r["grow+release_passes"], r["grow+release_pages_mapped"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
