"""Tests of the trace tools (run: python3 -m unittest -v test_trace_tools, from
tools/trace; CTest's trace_tools_test): the PyTorch snapshot converter on a
synthetic snapshot with the structure of torch.cuda.memory._snapshot(), and
the generators' determinism and validity."""

import collections
import io
import json
import os
import pickle
import subprocess
import sys
import tempfile
import unittest

import gen_traces
import segment_sim
import torch_replay
import torch_snapshot_to_trace as converter

HERE = os.path.dirname(os.path.abspath(__file__))


def event(action, addr, size, stream=0, **extra):
    e = {"action": action, "addr": addr, "size": size, "stream": stream}
    e.update(extra)
    return e


def synthetic_snapshot():
    """Two devices. Device 0's trace, as a ring buffer would keep it: it
    begins with the free of a block allocated before it; a block on a side
    stream used with record_stream (free_requested, later free_completed);
    an older-style `free`; a free_completed with no request; segment events."""
    frames = [{"filename": "model.py", "line": 12, "name": "forward"}]
    device0 = [
        event("free_requested", 0x7000, 512),  # allocated before the trace began
        event("free_completed", 0x7000, 512),
        event("segment_alloc", 0x1000, 2 << 20),
        event("alloc", 0x1000, 1024, time_us=10, frames=frames),
        event("alloc", 0x1400, 4096, stream=140212),
        event("free_requested", 0x1400, 4096, stream=140212),
        event("alloc", 0x2400, 256),
        event("free_completed", 0x1400, 4096, stream=140212),
        event("free", 0x1000, 1024),
        event("alloc", 0x1000, 2048, stream=140212),  # the address again, a new block
        event("free_completed", 0x2400, 256),  # no request was recorded
        event("snapshot", 0, 0),
        event("oom", 0, 1 << 40, device_free=0),
    ]
    device1 = [event("alloc", 0x9000, 64), event("free_requested", 0x9000, 64)]
    return {"segments": [{"device": 0, "address": 0x1000, "total_size": 2 << 20, "stream": 0,
                          "blocks": [{"size": 2048, "state": "active_allocated"}]}],
            "device_traces": [device0, device1]}


def read_lines(text):
    return [json.loads(line) for line in text.splitlines() if line and not line.startswith("#")]


class SnapshotConverterTest(unittest.TestCase):
    def convert(self, snapshot, **kwargs):
        out = io.StringIO()
        counts = converter.convert(converter.load_snapshot(pickle.dumps(snapshot)), out, **kwargs)
        return out.getvalue(), counts

    def test_events_become_trace_lines(self):
        text, counts = self.convert(synthetic_snapshot(), tags=True)
        lines = read_lines(text)
        self.assertEqual(lines[0], {"format": "capalloc.trace/1",
                                    "source": "torch-snapshot (device 0)", "devices": 1})
        ops = [{k: v for k, v in line.items() if k != "t"} for line in lines[1:]]
        self.assertEqual(ops, [
            {"op": "alloc", "id": 1, "size": 1024, "stream": 0, "tag": "model.py:12:forward"},
            {"op": "alloc", "id": 2, "size": 4096, "stream": 1},
            {"op": "free", "id": 2},  # at free_requested, not at free_completed
            {"op": "alloc", "id": 3, "size": 256, "stream": 0},
            {"op": "free", "id": 1},
            {"op": "alloc", "id": 4, "size": 2048, "stream": 1},
            {"op": "free", "id": 3},  # free_completed with no request
        ])
        self.assertEqual(lines[1]["t"], 10000)
        self.assertEqual(counts, {"alloc": 4, "free": 3, "dropped_free": 1, "repeated_free": 0,
                                  "ignored": 3})
        self.assertIn("# converted: 4 allocs, 3 frees; 1 frees", text)

    def test_other_device(self):
        text, _ = self.convert(synthetic_snapshot(), device=1)
        self.assertEqual(read_lines(text)[1:], [{"op": "alloc", "id": 1, "size": 64, "stream": 0},
                                                {"op": "free", "id": 1}])
        with self.assertRaisesRegex(ValueError, "device 2: the snapshot has traces for 2"):
            self.convert(synthetic_snapshot(), device=2)

    def test_not_a_snapshot(self):
        with self.assertRaisesRegex(ValueError, "no 'device_traces'"):
            self.convert({"segments": []})

    def test_classes_are_refused(self):
        data = pickle.dumps(collections.OrderedDict(device_traces=[]))
        with self.assertRaisesRegex(pickle.UnpicklingError, "collections.OrderedDict"):
            converter.load_snapshot(data)

    def test_command_line(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "s.pickle")
            with open(path, "wb") as f:
                pickle.dump(synthetic_snapshot(), f)
            out = os.path.join(tmp, "t.jsonl")
            run = subprocess.run([sys.executable, os.path.join(HERE, "torch_snapshot_to_trace.py"),
                                  path, "--out", out], capture_output=True, text=True)
            self.assertEqual(run.returncode, 0, run.stderr)
            with open(out) as f:
                self.assertEqual(len(read_lines(f.read())), 8)
            with open(path, "wb") as f:
                f.write(b"not a pickle")
            run = subprocess.run([sys.executable, os.path.join(HERE, "torch_snapshot_to_trace.py"),
                                  path], capture_output=True, text=True)
            self.assertEqual(run.returncode, 1)
            self.assertIn("s.pickle", run.stderr)


    def test_repeated_frees_are_dropped_and_counted(self):
        snapshot = {"device_traces": [[event("alloc", 0x10, 8), event("free", 0x10, 8),
                                       event("free", 0x10, 8), event("free_requested", 0x20, 8)]]}
        text, counts = self.convert(snapshot)
        self.assertEqual(read_lines(text)[1:], [{"op": "alloc", "id": 1, "size": 8, "stream": 0},
                                                {"op": "free", "id": 1}])
        self.assertEqual((counts["repeated_free"], counts["dropped_free"]), (1, 1))

    def test_events_it_cannot_convert_are_named(self):
        cases = [
            ([{"action": "alloc", "size": 8, "stream": 0}], "event 0 \\(alloc\\): 'addr' is None"),
            ([event("alloc", 0x10, 1 << 70)], "event 0: alloc of size"),
            ([event("alloc", 0x10, 8), {"action": "alloc", "addr": 0x20, "stream": 0}],
             "event 1 \\(alloc\\): 'size' is None"),
            ([event("alloc", 0x10, 8, time_us="abc")], "'time_us' is 'abc', not a time"),
            ([event("alloc", 0x10, 8, time_us=float("inf"))], "'time_us' is inf, not a time"),
            ([event("alloc", 0x10, 8, time_us=10 ** 400)], "not a time in microseconds"),
            ([3], "event 0: not a dict but int"),
        ]
        for events, message in cases:
            with self.subTest(message=message):
                with self.assertRaisesRegex(ValueError, message):
                    self.convert({"device_traces": [events]})

    def test_a_tag_is_valid_utf8(self):
        frames = [{"filename": "\udcff.py", "line": 3, "name": "f"}]
        text, _ = self.convert({"device_traces": [[event("alloc", 0x10, 8, frames=frames)]]},
                               tags=True)
        self.assertEqual(read_lines(text)[1]["tag"], "\\udcff.py:3:f")
        text.encode("utf-8")  # no lone surrogate left

    def test_a_failed_conversion_leaves_out_as_it_was(self):
        script = os.path.join(HERE, "torch_snapshot_to_trace.py")
        with tempfile.TemporaryDirectory() as tmp:
            path, out = os.path.join(tmp, "s.pickle"), os.path.join(tmp, "t.jsonl")
            with open(out, "w") as f:
                f.write("kept\n")
            for snapshot in ({}, {"device_traces": [[event("alloc", 1, 8), event("alloc", 2, 0)]]}):
                with open(path, "wb") as f:
                    pickle.dump(snapshot, f)
                run = subprocess.run([sys.executable, script, path, "--out", out],
                                     capture_output=True, text=True)
                self.assertEqual(run.returncode, 1)
                self.assertTrue(run.stderr.startswith("torch_snapshot_to_trace: "), run.stderr)
                self.assertNotIn("Traceback", run.stderr)
                with open(out) as f:
                    self.assertEqual(f.read(), "kept\n")
            self.assertEqual(sorted(os.listdir(tmp)), ["s.pickle", "t.jsonl"])  # nothing else written
            # A link is written through, not replaced.
            with open(path, "wb") as f:
                pickle.dump(synthetic_snapshot(), f)
            link = os.path.join(tmp, "link.jsonl")
            os.symlink(out, link)
            run = subprocess.run([sys.executable, script, path, "--out", link],
                                 capture_output=True, text=True)
            self.assertEqual(run.returncode, 0, run.stderr)
            self.assertTrue(os.path.islink(link))
            with open(out) as f:
                self.assertEqual(len(read_lines(f.read())), 8)
            for data, message in ((b"", "not a pickle"), (b"\x7fELF", "not a pickle")):
                with open(path, "wb") as f:
                    f.write(data)
                run = subprocess.run([sys.executable, script, path], capture_output=True, text=True)
                self.assertEqual(run.returncode, 1)
                self.assertIn(message, run.stderr)
                self.assertEqual(run.stdout, "")
            run = subprocess.run([sys.executable, script, os.path.join(tmp, "absent.pickle")],
                                 capture_output=True, text=True)
            self.assertEqual(run.returncode, 1)
            self.assertIn("absent.pickle: No such file", run.stderr)


class TorchReplayTest(unittest.TestCase):
    def test_reads_what_the_cpp_replay_reads(self):
        """Comments are skipped and the trace's stream 0 is the current stream,
        whichever stream comes first, as in `capalloc bench-replay`."""
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "t.jsonl")
            with open(path, "w") as f:
                f.write('{"format":"capalloc.trace/1","source":"t"}\n# a comment\n\n'
                        '{"op":"alloc","id":1,"size":64,"stream":5}\n'
                        '{"op":"alloc","id":2,"size":64,"stream":0}\n'
                        '{"op":"free","id":1}\n{"op":"free","id":2}\n# converted: ...\n')
            ops, streams = torch_replay.read_trace(path)
        self.assertEqual(ops, [("alloc", 1, 64, 1), ("alloc", 2, 64, 0), ("free", 1), ("free", 2)])
        self.assertEqual(streams, 2)

    def test_a_byte_order_mark_and_a_lone_carriage_return(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "t.jsonl")
            with open(path, "wb") as f:
                f.write(b'\xef\xbb\xbf{"format":"capalloc.trace/1"}\r\n'
                        b'{"op":"alloc",\r"id":1,"size":8,"stream":0}\n{"op":"free","id":1}\n')
            ops, _ = torch_replay.read_trace(path)
        self.assertEqual(ops, [("alloc", 1, 8, 0), ("free", 1)])


class GeneratorTest(unittest.TestCase):
    def generate(self, name, seed=1, scale=0.01):
        out = io.StringIO()
        gen_traces.generate(name, out, seed, None, scale)
        return out.getvalue()

    def check_valid(self, text):
        lines = read_lines(text)
        self.assertEqual(lines[0]["format"], "capalloc.trace/1")
        live, captures = set(), {}
        for line in lines[1:]:
            if line["op"] == "alloc":
                self.assertNotIn(line["id"], live)
                self.assertGreater(line["size"], 0)
                live.add(line["id"])
            elif line["op"] == "free":
                live.remove(line["id"])
            elif line["op"] == "capture_begin":
                captures[line["capture"]] = line
        self.assertEqual(live, set())  # the generators free everything at the end
        return lines, captures

    def test_deterministic_by_seed(self):
        for name in sorted(gen_traces.GENERATORS):
            with self.subTest(name=name):
                self.assertEqual(self.generate(name), self.generate(name))
        self.assertNotEqual(self.generate("churn", seed=1), self.generate("churn", seed=2))

    def test_every_generator_writes_a_valid_trace(self):
        for name in sorted(gen_traces.GENERATORS):
            with self.subTest(name=name):
                self.check_valid(self.generate(name))

    def test_the_recorded_command_makes_the_trace_again(self):
        for name in sorted(gen_traces.GENERATORS):
            with self.subTest(name=name):
                text = self.generate(name, scale=0.01)
                argv = json.loads(text.splitlines()[0])["source"].split()[1:]
                out = io.StringIO()
                args = dict(zip(argv[1::2], argv[2::2]))
                count = int(args.get("--steps", args.get("--allocs")))
                gen_traces.generate(argv[0], out, int(args["--seed"]), count,
                                    float(args.get("--scale", 1)))
                self.assertEqual(out.getvalue(), text)

    def test_command_line_refuses_what_it_would_ignore(self):
        script = os.path.join(HERE, "gen_traces.py")
        with tempfile.TemporaryDirectory() as tmp:
            for args in (["churn", "--allocs", "0"], ["decoder", "--steps", "-5"],
                         ["churn", "--scale", "nan"], ["churn", "--scale", "inf"],
                         ["all", "--out-dir", tmp, "--steps", "5"], ["churn", "--out-dir", tmp],
                         ["churn", "--out", ""]):
                with self.subTest(args=args):
                    run = subprocess.run([sys.executable, script] + args, capture_output=True,
                                         text=True)
                    self.assertEqual(run.returncode, 2, run.stderr)
                    self.assertEqual(run.stdout, "")
                    self.assertEqual(os.listdir(tmp), [])
            run = subprocess.run([sys.executable, script, "churn", "--allocs", "10", "--out",
                                  os.path.join(tmp, "absent", "t.jsonl")], capture_output=True,
                                 text=True)
            self.assertEqual(run.returncode, 1)
            self.assertIn("absent/t.jsonl: No such file or directory", run.stderr)
            self.assertNotIn("Traceback", run.stderr)

    def test_workload_shapes(self):
        churn, _ = self.check_valid(self.generate("churn"))
        self.assertTrue(all(512 <= l["size"] <= 65536 for l in churn[1:] if l["op"] == "alloc"))
        mid, _ = self.check_valid(self.generate("midsize"))
        self.assertTrue(all(64 << 10 <= l["size"] <= 45 << 20 for l in mid[1:] if l["op"] == "alloc"))
        _, captures = self.check_valid(self.generate("capture"))
        self.assertEqual(len(captures), 67)
        self.assertEqual({c["pool"] for c in captures.values()}, {"decode_graphs"})
        self.assertEqual([gen_traces.batch_cycle(s) for s in (0, 1, 31, 32, 33, 63, 64)],
                         [1, 9, 249, 256, 248, 8, 1])


class SegmentSimTest(unittest.TestCase):
    """segment_sim.py's models on a trace small enough to place by hand."""

    MIB = 1 << 20

    def write_trace(self, lines):
        f = tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False)
        self.addCleanup(os.unlink, f.name)
        f.write(json.dumps({"format": "capalloc.trace/1", "devices": 1}) + "\n")
        for line in lines:
            f.write(json.dumps(line) + "\n")
        f.close()
        return f.name

    def three_large_blocks(self):
        # 3 MiB, 3 MiB, free the first, 5 MiB: 8 MiB requested at the peak.
        m = self.MIB
        return self.write_trace([
            {"op": "alloc", "id": 1, "size": 3 * m, "stream": 0},
            {"op": "alloc", "id": 2, "size": 3 * m, "stream": 0},
            {"op": "free", "id": 1},
            {"op": "alloc", "id": 3, "size": 5 * m, "stream": 0},
            {"op": "free", "id": 2},
            {"op": "free", "id": 3},
        ])

    def test_each_model_places_as_worked_out(self):
        r = segment_sim.report(self.three_large_blocks())
        self.assertEqual(r["peak_requested"], 8 * self.MIB)
        # Fixed: 4 + 4 MiB segments; the 5 MiB request fits no free run (4 and
        # 1 MiB) and reserves 6 MiB: 14 MiB.
        self.assertEqual(r["fixed"], 14 / 8)
        # Grow: [0, 4) then [0, 6) MiB; 5 MiB fits neither the free 3 MiB at 0
        # nor the end, which grows to 12 MiB.
        self.assertEqual(r["grow"], 12 / 8)
        self.assertEqual(r["grow_pages_mapped"], 6)
        # Release: before mapping pages 3 to 5, the free page 0 (bytes 0 to
        # 2 MiB of the free 3 MiB) is given back: 5 pages stay mapped.
        self.assertEqual(r["grow+release"], 10 / 8)
        self.assertEqual(r["grow+release_passes"], 1)
        # Pages mapped: 0 and 1, then 2, then 3 to 5 (page 0 is not needed again).
        self.assertEqual(r["grow+release_pages_mapped"], 6)

    def test_release_above_a_fraction(self):
        # One free page against three mapped: not more than half of them.
        r = segment_sim.report(self.three_large_blocks(), release_above=0.5)
        self.assertEqual(r["grow+release"], 12 / 8)
        self.assertEqual(r["grow+release_passes"], 0)

    def test_small_requests_share_fixed_segments_per_stream(self):
        path = self.write_trace([
            {"op": "alloc", "id": 1, "size": 4096, "stream": 0},
            {"op": "alloc", "id": 2, "size": 4096, "stream": 0},
            {"op": "alloc", "id": 3, "size": 4096, "stream": 7},
        ])
        r = segment_sim.report(path)
        # Two 2 MiB segments, one per stream, in every model.
        for model in ("fixed", "grow", "grow+release"):
            self.assertEqual(r[model], (4 * self.MIB) / (3 * 4096), model)

    def test_command_line(self):
        path = self.three_large_blocks()
        out = subprocess.run([sys.executable, os.path.join(HERE, "segment_sim.py"), "--json", path],
                             capture_output=True, text=True, check=True).stdout
        self.assertEqual(json.loads(out)["grow"], 12 / 8)
        bad = subprocess.run([sys.executable, os.path.join(HERE, "segment_sim.py"),
                              "--release-above", "1", path], capture_output=True, text=True)
        self.assertEqual(bad.returncode, 2)
        self.assertIn("--release-above", bad.stderr)
        empty = self.write_trace([])
        none = subprocess.run([sys.executable, os.path.join(HERE, "segment_sim.py"), empty],
                              capture_output=True, text=True)
        self.assertNotEqual(none.returncode, 0)
        self.assertIn("no allocation", none.stderr)


if __name__ == "__main__":
    unittest.main()
