"""Tests of compare_verdicts.py: what may differ between the host runtime's
and a GPU runtime's JSON (addresses, capture ids, graph handles, positions)
and what may not (any verdict or replay field). Run by CTest with the path of
a `capalloc arms --json` output in $CAPALLOC_ARMS_JSON."""
import copy
import json
import os
import re
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_verdicts  # noqa: E402


def load_arms():
    with open(os.environ["CAPALLOC_ARMS_JSON"]) as f:
        return json.load(f)


def as_gpu(doc, capture_offset=1000, graph_base=0x7f0000000000):
    """The same verdicts as a CUDA run would print them: other capture ids,
    pointer-valued graph handles, other addresses and positions."""
    gpu = copy.deepcopy(doc)
    gpu["runtime"] = "cuda"

    def walk(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("capture", "freed_in_capture") and isinstance(value, int) and value:
                    node[key] = value + capture_offset
                elif key == "graph" and isinstance(value, int):
                    node[key] = graph_base + 64 * value
                elif key in ("ptr", "begin"):
                    node[key] = "0x7e0000001000"
                elif key in ("capture_position", "write_position"):
                    node[key] = value + 3
                else:
                    walk(value)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(gpu)
    for arm in gpu["arms"]:
        for f in arm["findings_before_replay"]:
            f["fix"] = re.sub(r"capture (\d+)", lambda m: f"capture {int(m.group(1)) + capture_offset}",
                              f["fix"])
    return gpu


def diffs(host, gpu):
    return list(compare_verdicts.differences(compare_verdicts.renumber(host),
                                             compare_verdicts.renumber(gpu)))


class CompareVerdictsTest(unittest.TestCase):
    def test_the_same_verdicts_on_another_machine_agree(self):
        host = load_arms()
        self.assertTrue(any(arm["findings_before_replay"] for arm in host["arms"]))
        self.assertEqual(diffs(host, as_gpu(host)), [])

    def test_a_changed_severity_is_a_difference(self):
        host = load_arms()
        gpu = as_gpu(host)
        finding = next(f for arm in gpu["arms"] for f in arm["findings_before_replay"])
        finding["severity"] = "cross_graph_output"
        self.assertEqual(len(diffs(host, gpu)), 1)

    def test_a_changed_replay_number_is_a_difference(self):
        host = load_arms()
        gpu = as_gpu(host)
        gpu["arms"][0]["replays"][0]["clobbered"] -= 1
        self.assertEqual([d[0] for d in diffs(host, gpu)], ["$.arms[0].replays[0].clobbered"])

    def test_two_graphs_reported_as_one_is_a_difference(self):
        # Arm D has two findings from two graphs: renumbering handles must not
        # hide one graph standing for both.
        host = load_arms()
        gpu = as_gpu(host)
        d = next(arm for arm in gpu["arms"] if arm["arm"] == "D")
        self.assertEqual(len(d["findings_before_replay"]), 2)
        first, second = d["findings_before_replay"]
        second["graph"] = first["graph"]
        self.assertTrue(diffs(host, gpu))

    def test_a_capture_id_that_changes_identity_is_a_difference(self):
        host = load_arms()
        gpu = as_gpu(host)
        d = next(arm for arm in gpu["arms"] if arm["arm"] == "D")
        first, second = d["findings_before_replay"]
        second["victim"]["capture"] = first["capture"]  # WS said to come from graph 1's capture
        self.assertTrue(diffs(host, gpu))


if __name__ == "__main__":
    unittest.main()
