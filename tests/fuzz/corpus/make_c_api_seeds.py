#!/usr/bin/env python3
"""Writes the seed corpus of c_api_fuzzer (tests/fuzz/corpus/c_api/).

The fuzzer reads its input with FuzzedDataProvider: operation numbers and
integer arguments come from the end of the input, strings (keys, tags) from
its start. Byte strings from a fixed pseudo-random sequence reach every
operation within a few hundred bytes; the mutator takes it from there.
Deterministic: rerunning writes the same files.
"""
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "c_api")
SIZES = [48, 96, 160, 256, 384, 512, 768, 1024]


def main():
    os.makedirs(OUT, exist_ok=True)
    rng = random.Random(20261202)
    for i, size in enumerate(SIZES):
        data = bytes(rng.randrange(256) for _ in range(size))
        with open(os.path.join(OUT, "seed-%02d" % i), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
