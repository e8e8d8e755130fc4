"""Tests of the Python module over the C ABI, on the host runtime (no GPU, no
PyTorch): run by CTest with CAPALLOC_LIBRARY and CAPALLOC_RUNTIME=host."""

import ctypes
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import capalloc  # noqa: E402


class PythonModuleTest(unittest.TestCase):
    def test_library_loads_and_runs_on_the_host_runtime(self):
        lib = capalloc.load()
        lib.capalloc_runtime_name.restype = ctypes.c_char_p
        self.assertEqual(lib.capalloc_runtime_name(), b"host")

    def test_preallocate_then_get_returns_the_same_buffer(self):
        ptr = capalloc.preallocate(0, "py.workspace", 1 << 20)
        self.assertTrue(ptr)
        self.assertEqual(capalloc.get(0, "py.workspace"), ptr)
        self.assertEqual(capalloc.preallocate(0, "py.workspace", 1 << 10), ptr)

    def test_errors_raise_with_capallocs_message(self):
        with self.assertRaises(capalloc.CapallocError) as cold:
            capalloc.get(0, "py.never.warmed")
        self.assertIn("preallocate", str(cold.exception))
        self.assertEqual(cold.exception.status, 3)
        with self.assertRaises(capalloc.CapallocError):
            capalloc.preallocate(0, "py.workspace.big", 0)

    def test_check_returns_findings_objects(self):
        findings = capalloc.check()
        self.assertIsInstance(findings, list)
        for f in findings:
            self.assertIsInstance(f, capalloc.Finding)

    def test_snapshot_describes_devices_blocks_and_graphs(self):
        capalloc.preallocate(0, "py.snapshot", 4096)
        state = capalloc.snapshot()
        self.assertEqual(state["schema"], "capalloc.snapshot/3")
        self.assertEqual(state["runtime"], "host")
        tags = [b["tag"] for d in state["devices"] for b in d["live_blocks"]]
        self.assertIn("py.snapshot", tags)
        self.assertIn("graphs", state)
        self.assertIn("findings", state)

    def test_waive_checks_its_arguments_before_c(self):
        with self.assertRaises(ValueError):
            capalloc.waive(1, "WS", "")
        with self.assertRaises(TypeError):
            capalloc.waive(1, 1.5, "benign")
        with self.assertRaises(capalloc.CapallocError) as unknown:
            capalloc.waive(987654321, "WS", "benign")
        self.assertEqual(unknown.exception.status, 3)

    def test_finding_reads_its_fields(self):
        f = capalloc.Finding({
            "severity": "hazard", "graph_label": "g", "capture": 1, "evidence": "footprint",
            "victim": {"tag": "WS", "sequence": 4, "size": 1024, "ptr": "0x1"},
            "writer": {"tag": "T", "sequence": 2}, "overlap": {"bytes": 1024}, "fix": "x"})
        self.assertEqual(f.victim["tag"], "WS")
        self.assertIn("[hazard] g", str(f))


if __name__ == "__main__":
    unittest.main()
