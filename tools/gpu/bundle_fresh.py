#!/usr/bin/env python3
"""Tells whether a GPU bundle was built from the source tree beside it.

    bundle_fresh.py BUNDLE TREE

The bundle's MANIFEST.json lists every tracked source file with its git blob
id as it was when the bundle was built (tools/gpu-bundle.sh). This computes
the same ids for TREE's files, without git (a blob id is the SHA-1 of
"blob <size>\\0" and the content), and prints the files that differ or are
missing. Exit status: 0 when they all match, 1 when any differs (the bundle
is stale: rebuild it), 77 when the manifest lists no sources.
"""
import hashlib
import json
import os
import sys


def blob_id(path):
    with open(path, "rb") as f:
        data = f.read()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    bundle, tree = sys.argv[1:]
    with open(os.path.join(bundle, "MANIFEST.json")) as f:
        manifest = json.load(f)
    sources = manifest.get("sources")
    if not sources:
        print("result: skipped: the bundle's manifest lists no sources (built outside git)")
        return 77
    changed, missing = [], []
    for path, want in sorted(sources.items()):
        full = os.path.join(tree, path)
        if not os.path.isfile(full):
            missing.append(path)
        elif blob_id(full) != want:
            changed.append(path)
    for path in changed:
        print(f"changed since the bundle was built: {path}")
    for path in missing:
        print(f"missing from this tree: {path}")
    commit = (manifest.get("commit") or "?")[:12]
    if changed or missing:
        print(f"result: STALE: the bundle (commit {commit}) differs from this tree in "
              f"{len(changed)} file(s), {len(missing)} missing: rebuild it with tools/gpu-bundle.sh")
        return 1
    print(f"result: the bundle was built from this tree ({len(sources)} files, commit {commit}"
          f"{', with uncommitted edits' if manifest.get('dirty') else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
