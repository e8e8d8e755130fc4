#!/usr/bin/env python3
"""Compares two `capalloc arms --json` (or `gemm-scenario --json`) documents
field by field: the host runtime's against a GPU runtime's, run in the same
command by tools/gpu-check.sh.

    compare_verdicts.py HOST.json GPU.json [--out DIFF.json]

Every field must be equal except those that name the machine rather than the
verdict: the runtime's name, addresses (pointer strings, and `0x...` inside
messages), and capture positions (the host runtime counts operations, CUDA
counts graph nodes). Capture ids and graph handles are compared by identity,
not value: each document's are renumbered 1, 2, ... in order of first
appearance (CUDA's capture ids need not start at 1, and its graph handles
are pointers), so the same graph must carry the same number in both. Floating-point values (GEMM errors) agree within a
relative 1e-3: the device may sum in another order. Everything else, the alias answers, findings (severity,
evidence, writer and victim tags and sizes, overlap bytes, reuse chains),
replay numbers and `expected_match` flags, must agree.

Prints one line per difference and a last `result:` line; exits 0 when they
agree, 1 when they differ, 2 on unreadable input.
"""
import argparse
import json
import re
import sys

# Keys whose values describe where things landed, not what was decided.
MACHINE_KEYS = {"runtime", "ptr", "begin", "capture_position", "write_position", "freed_at"}
FLOAT_TOLERANCE = 1e-3
ADDRESS = re.compile(r"0x[0-9a-fA-F]+")


CAPTURE_IN_TEXT = re.compile(r"(capture )(\d+)")
CAPTURE_KEYS = {"capture", "freed_in_capture"}


def renumber(doc):
    """Returns `doc` with capture ids and graph handles renumbered by first
    appearance (0 stays 0: "none")."""
    ids = {"capture": {}, "graph": {}}

    def number(kind, value):
        if value == 0:
            return 0
        return ids[kind].setdefault(value, len(ids[kind]) + 1)

    def text(value):
        return CAPTURE_IN_TEXT.sub(lambda m: m.group(1) + str(number("capture", int(m.group(2)))),
                                   value)

    def walk(node):
        if isinstance(node, dict):
            out = {}
            for key, value in node.items():
                if key in CAPTURE_KEYS and isinstance(value, int):
                    out[key] = number("capture", value)
                elif key == "graph" and isinstance(value, int):
                    out[key] = number("graph", value)
                else:
                    out[key] = walk(value)
            return out
        if isinstance(node, list):
            return [walk(v) for v in node]
        if isinstance(node, str):
            return text(node)
        return node

    return walk(doc)


def normalize_text(value):
    return ADDRESS.sub("0x?", value)


def differences(host, gpu, path="$"):
    """Yields (path, host value, gpu value) for every field that differs."""
    if isinstance(host, dict) and isinstance(gpu, dict):
        for key in sorted(set(host) | set(gpu)):
            if key in MACHINE_KEYS:
                continue
            if key not in host or key not in gpu:
                yield f"{path}.{key}", host.get(key, "<missing>"), gpu.get(key, "<missing>")
                continue
            yield from differences(host[key], gpu[key], f"{path}.{key}")
    elif isinstance(host, list) and isinstance(gpu, list):
        if len(host) != len(gpu):
            yield f"{path}.length", len(host), len(gpu)
        for i, (h, g) in enumerate(zip(host, gpu)):
            yield from differences(h, g, f"{path}[{i}]")
    elif isinstance(host, str) and isinstance(gpu, str):
        if normalize_text(host) != normalize_text(gpu):
            yield path, host, gpu
    elif isinstance(host, float) and isinstance(gpu, float):
        if abs(host - gpu) > FLOAT_TOLERANCE * max(1.0, abs(host)):
            yield path, host, gpu
    elif host != gpu or type(host) is not type(gpu):
        yield path, host, gpu


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("host")
    parser.add_argument("gpu")
    parser.add_argument("--out", help="write the differences as JSON here")
    args = parser.parse_args()
    docs = []
    for name in (args.host, args.gpu):
        try:
            with open(name) as f:
                docs.append(json.load(f))
        except (OSError, ValueError) as e:
            print(f"result: cannot read {name}: {e}")
            return 2
    host, gpu = docs
    diffs = list(differences(renumber(host), renumber(gpu)))
    for path, h, g in diffs:
        print(f"differs {path}: host {json.dumps(h)} vs {gpu.get('runtime', 'gpu')} {json.dumps(g)}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump([{"path": p, "host": h, "gpu": g} for p, h, g in diffs], f, indent=1)
    both_match = host.get("all_match") is True and gpu.get("all_match") is True
    if diffs:
        print(f"result: {len(diffs)} field(s) differ between host and {gpu.get('runtime')}"
              f" (all_match host={host.get('all_match')}, gpu={gpu.get('all_match')})")
        return 1
    if not both_match:
        print(f"result: identical, but all_match is not true on both (host={host.get('all_match')},"
              f" gpu={gpu.get('all_match')})")
        return 1
    print(f"result: {gpu.get('runtime')} agrees with host on every verdict and replay field;"
          " all_match true on both")
    return 0


if __name__ == "__main__":
    sys.exit(main())
