#!/usr/bin/env python3
"""Seeded generators of allocation traces in the capalloc.trace/1 format
(docs/trace.md), for `capalloc bench` (docs/performance.md).

Each generator models one workload's allocation pattern (sizes in bytes, fp16
tensors unless said otherwise) and is deterministic: the same arguments give
the same file, byte for byte. Python's standard library only.

  gen_traces.py decoder  [--steps N] [--seed S] [--out FILE]
      a decoder serving loop: 32 layers, the batch cycling 1..256 and back
      (steps of 8), KV-cache blocks (16 tokens, one per layer) held by each
      sequence across steps until it finishes, prefill activations of up to
      thousands of tokens
  gen_traces.py training [--steps N] ...
      training steps: weights persistent, activations kept from forward until
      backward frees them in reverse, gradients and Adam states persistent
      once made, sequence length varying per step
  gen_traces.py churn    [--allocs N] ...
      small blocks, 512 B to 64 KiB (log-uniform), short lives
  gen_traces.py midsize  [--allocs N] ...
      blocks of 64 KiB to 45 MiB (log-uniform) with interleaved lifetimes
      (short, medium and long ones freed out of order)
  gen_traces.py capture  [--steps N] ...
      a graph-capture start-up: 67 batch sizes (1, 2, 4, 8..512 by 8), each
      warmed up eagerly then captured into one shared pool, largest first,
      then a serving loop replaying the graphs between eager allocations
  gen_traces.py all --out-dir DIR [--scale F] [--seed S]
      all five, as DIR/<name>.jsonl, their step counts scaled by F

--scale applies to every generator (0.01 makes tiny traces for tests).
"""

import argparse
import heapq
import io
import json
import math
import os
import random
import sys

FORMAT = "capalloc.trace/1"


class TraceWriter:
    """Writes events, checking what a reader would refuse (docs/trace.md)."""

    def __init__(self, out, source):
        self.out = out
        self.next_id = 1
        self.live = {}
        self.next_capture = 1
        self.events = 0
        self._write({"format": FORMAT, "source": source, "devices": 1})

    def _write(self, obj):
        self.out.write(json.dumps(obj, separators=(",", ":")))
        self.out.write("\n")

    def alloc(self, size, stream=0, tag=None, persistent=False):
        size = max(1, int(size))
        block = self.next_id
        self.next_id += 1
        event = {"op": "alloc", "id": block, "size": size, "stream": stream}
        if tag:
            event["tag"] = tag
        if persistent:
            event["lifetime"] = "persistent"
        self._write(event)
        self.live[block] = size
        self.events += 1
        return block

    def free(self, block):
        del self.live[block]
        self._write({"op": "free", "id": block})
        self.events += 1

    def capture_begin(self, stream, pool=None, label=None):
        capture = self.next_capture
        self.next_capture += 1
        event = {"op": "capture_begin", "capture": capture, "stream": stream}
        if pool is not None:
            event["pool"] = pool
        if label:
            event["label"] = label
        self._write(event)
        return capture

    def capture_end(self, capture):
        self._write({"op": "capture_end", "capture": capture})

    def replay(self, capture):
        self._write({"op": "replay", "capture": capture})

    def graph_destroy(self, capture):
        self._write({"op": "graph_destroy", "capture": capture})

    def alloc_freeing(self, size, *done):
        """Allocates `size` (a step's output), then frees `done` (what the
        step consumed), in that order; returns the new block."""
        block = self.alloc(size)
        for old in done:
            self.free(old)
        return block

    def free_all(self):
        for block in sorted(self.live):
            self.free(block)


def scaled(count, scale, minimum=1):
    return max(minimum, int(round(count * scale)))


# --- decoder serving loop ----------------------------------------------------

HIDDEN, KV_DIM, FFN, VOCAB, LAYERS = 4096, 1024, 14336, 32000, 32
KV_BLOCK_TOKENS = 16
KV_BLOCK_BYTES = KV_BLOCK_TOKENS * KV_DIM * 2 * 2  # K and V, fp16: 64 KiB per layer


def decoder_layer(w, hidden, tokens, stream=0):
    """One transformer layer's activations for `tokens` tokens; returns the
    new hidden state (the old one freed)."""
    h = tokens * HIDDEN * 2
    norm = w.alloc(h, stream)
    qkv = w.alloc(tokens * (HIDDEN + 2 * KV_DIM) * 2, stream)
    w.free(norm)
    attn = w.alloc(h, stream)
    w.free(qkv)
    proj = w.alloc(h, stream)
    w.free(attn)
    mid = w.alloc(h, stream)
    w.free(proj)
    w.free(hidden)
    norm2 = w.alloc(h, stream)
    gate_up = w.alloc(tokens * 2 * FFN * 2, stream)
    w.free(norm2)
    act = w.alloc(tokens * FFN * 2, stream)
    w.free(gate_up)
    down = w.alloc(h, stream)
    w.free(act)
    out = w.alloc(h, stream)
    w.free(down)
    w.free(mid)
    return out


def decoder_forward(w, tokens, rows, stream=0, keep_logits=False, layers=LAYERS):
    """Embedding, `layers` layers, logits for `rows` positions (fp32)."""
    hidden = w.alloc(tokens * HIDDEN * 2, stream)
    for _ in range(layers):
        hidden = decoder_layer(w, hidden, tokens, stream)
    logits = w.alloc(rows * VOCAB * 4, stream)
    w.free(hidden)
    if keep_logits:
        return logits
    sampled = w.alloc(rows * 8, stream)
    w.free(logits)
    w.free(sampled)
    return None


def batch_cycle(step):
    """1, 9, ..., 249, 256, 248, ..., 8, 1, 9, ...: the batch sizes cycle over 1..256."""
    ramp = list(range(1, 256, 8)) + [256] + list(range(248, 0, -8))
    return ramp[step % len(ramp)]


def gen_decoder(w, rng, steps):
    class Sequence:
        def __init__(self, prompt, max_len):
            self.tokens = prompt
            self.max_len = max_len
            self.blocks = []  # per KV block: one id per layer

        def grow_to(self, tokens):
            while len(self.blocks) * KV_BLOCK_TOKENS < tokens:
                self.blocks.append([w.alloc(KV_BLOCK_BYTES, tag="kv") for _ in range(LAYERS)])

        def finish(self):
            for block in self.blocks:
                for b in block:
                    w.free(b)

    active = []
    for step in range(steps):
        target = batch_cycle(step)
        # Finished sequences leave; the oldest leave when the batch shrinks.
        for seq in [s for s in active if s.tokens >= s.max_len]:
            seq.finish()
            active.remove(seq)
        while len(active) > target:
            active.pop(0).finish()
        prefill = 0
        while len(active) < target:
            seq = Sequence(rng.randint(16, 128), rng.randint(64, 320))
            seq.grow_to(seq.tokens)
            prefill += seq.tokens
            active.append(seq)
        for seq in active:
            seq.tokens += 1
            seq.grow_to(seq.tokens)
        # Decode tokens plus the new prompts, chunked as a server would.
        tokens = len(active) + prefill
        for chunk in range(0, tokens, 4096):
            decoder_forward(w, min(4096, tokens - chunk), len(active))
    for seq in active:
        seq.finish()


# --- training step -------------------------------------------------------------

def gen_training(w, rng, steps):
    hidden, ffn, vocab, layers, batch = 1024, 4096, 32000, 16, 4
    shapes = [hidden * 3 * hidden, hidden * hidden, hidden * 2 * ffn, ffn * hidden, hidden, hidden]
    params = [w.alloc(vocab * hidden * 2, tag="weight", persistent=True)]
    for _ in range(layers):
        params += [w.alloc(n * 2, tag="weight", persistent=True) for n in shapes]
    sizes = [w.live[p] for p in params]
    grads, adam = None, None
    for _ in range(steps):
        tokens = batch * rng.choice([512, 768, 1024])
        h = tokens * hidden * 2
        saved = []
        x = w.alloc(h)
        for _ in range(layers):
            norm = w.alloc(h)
            qkv = w.alloc(tokens * 3 * hidden * 2)
            attn = w.alloc(h)
            lse = w.alloc(tokens * 16 * 4)
            proj = w.alloc(h)
            mid = w.alloc(h)
            w.free(proj)
            norm2 = w.alloc(h)
            gate_up = w.alloc(tokens * 2 * ffn * 2)
            act = w.alloc(tokens * ffn * 2)
            down = w.alloc(h)
            out = w.alloc(h)
            w.free(down)
            saved.append([x, norm, qkv, attn, lse, mid, norm2, gate_up, act])
            x = out
        logits = w.alloc(tokens * vocab * 2)
        loss = w.alloc(4)
        # Backward: the loss's gradient, then every layer in reverse.
        dlogits = w.alloc(tokens * vocab * 2)
        w.free(logits)
        dx = w.alloc(h)
        w.free(dlogits)
        w.free(x)
        w.free(loss)
        if grads is None:
            grads = [w.alloc(s, tag="grad", persistent=True) for s in sizes]
        for layer_saved in reversed(saved):
            x_in, norm, qkv, attn, lse, mid, norm2, gate_up, act = layer_saved
            # Each gradient step: its output, then what it consumed goes.
            dact = w.alloc_freeing(tokens * ffn * 2, act)
            dgate_up = w.alloc_freeing(tokens * 2 * ffn * 2, dact, gate_up)
            dnorm2 = w.alloc_freeing(h, dgate_up, norm2)
            dmid = w.alloc_freeing(h, dnorm2, mid)
            dattn = w.alloc(h)
            dqkv = w.alloc_freeing(tokens * 3 * hidden * 2, dattn, attn, lse, qkv)
            dnorm = w.alloc_freeing(h, dqkv, norm)
            dx = w.alloc_freeing(h, dnorm, dmid, dx, x_in)
        w.free(dx)
        # Adam: states made on the first step; fp32 temporaries per tensor.
        if adam is None:
            adam = [w.alloc(s * 2, tag="adam", persistent=True) for s in sizes for _ in range(2)]
        for s in sizes:
            tmp = w.alloc(s * 2)
            tmp2 = w.alloc(s * 2)
            w.free(tmp)
            w.free(tmp2)


# --- small-block churn and mid-sized blocks -------------------------------------

def log_uniform(rng, low, high):
    return int(math.exp(rng.uniform(math.log(low), math.log(high))))


def gen_lifetimes(w, rng, allocs, size_of, life_of):
    """`allocs` allocations; each lives for life_of() later allocations, so
    frees interleave in the order the lifetimes say, not LIFO."""
    deaths = []  # (time of death, sequence, id)
    for now in range(allocs):
        while deaths and deaths[0][0] <= now:
            w.free(heapq.heappop(deaths)[2])
        block = w.alloc(size_of())
        heapq.heappush(deaths, (now + life_of(), now, block))
    while deaths:
        w.free(heapq.heappop(deaths)[2])


def gen_churn(w, rng, allocs):
    def life():
        return 1 + int(rng.expovariate(1 / 1000)) if rng.random() < 0.03 else 1 + int(rng.expovariate(1 / 8))
    gen_lifetimes(w, rng, allocs, lambda: log_uniform(rng, 512, 65536 + 1), life)


def gen_midsize(w, rng, allocs):
    def life():
        r = rng.random()
        mean = 4 if r < 0.5 else 64 if r < 0.85 else 512
        return 1 + int(rng.expovariate(1 / mean))
    gen_lifetimes(w, rng, allocs, lambda: log_uniform(rng, 64 << 10, 45 << 20), life)


# --- graph-capture start-up ---------------------------------------------------------

CAPTURE_SIZES = [1, 2, 4] + list(range(8, 513, 8))  # 67 batch sizes


def gen_capture(w, rng, steps, layers=LAYERS):
    assert len(CAPTURE_SIZES) == 67
    side = 1  # the stream the graphs are captured and replayed on
    for _ in range(layers):
        w.alloc(64 << 20, tag="weight", persistent=True)
    w.alloc(max(CAPTURE_SIZES) * 8, stream=side, tag="static_input", persistent=True)
    graphs = {}
    outputs = []
    # Largest first, so that smaller graphs reuse the shared pool's blocks.
    for size in sorted(CAPTURE_SIZES, reverse=True):
        decoder_forward(w, size, size, stream=side, layers=layers)  # the eager warm-up run
        capture = w.capture_begin(side, pool="decode_graphs", label="batch %d" % size)
        outputs.append(decoder_forward(w, size, size, stream=side, keep_logits=True, layers=layers))
        w.capture_end(capture)
        graphs[size] = capture
    for _ in range(steps):
        batch = rng.randint(1, max(CAPTURE_SIZES))
        padded = min(s for s in CAPTURE_SIZES if s >= batch)
        inputs = w.alloc(batch * 8)
        w.replay(graphs[padded])
        probs = w.alloc(batch * VOCAB * 4)
        sampled = w.alloc(batch * 8)
        w.free(probs)
        w.free(inputs)
        w.free(sampled)
        if rng.random() < 0.25:  # a new KV block now and then, outside any capture
            w.alloc(KV_BLOCK_BYTES, tag="kv")
    for capture in graphs.values():
        w.graph_destroy(capture)
    for block in outputs:
        w.free(block)


GENERATORS = {
    # name: (function, count argument, its default)
    "decoder": (gen_decoder, "steps", 120),
    "training": (gen_training, "steps", 150),
    "churn": (gen_churn, "allocs", 100000),
    "midsize": (gen_midsize, "allocs", 50000),
    "capture": (gen_capture, "steps", 4000),
}


def generate(name, out, seed, count, scale):
    function, argument, default = GENERATORS[name]
    given = default if count is None else count
    n = scaled(given, scale)
    # The command that makes this trace again: the count before scaling.
    source = "tools/trace/gen_traces.py %s --%s %d --seed %d" % (name, argument, given, seed)
    if scale != 1:
        source += " --scale %g" % scale
    w = TraceWriter(out, source)
    if name == "capture":  # 67 captures whatever the scale; fewer layers when scaled down
        function(w, random.Random(seed), n, layers=scaled(LAYERS, min(scale, 1.0)))
    else:
        function(w, random.Random(seed), n)
    w.free_all()
    return w.events


def positive_int(text):
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be a positive whole number, not %s" % text)
    return value


def positive_scale(text):
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError("must be a positive finite number, not %s" % text)
    return value


def write_file(path, name, seed, count, scale):
    """Generates the whole trace, then writes it to `path` (through a link,
    into a pipe or a device as into a file): a failure while generating
    leaves `path` as it was. Returns the events."""
    buffer = io.StringIO()
    events = generate(name, buffer, seed, count, scale)
    with open(path, "w", encoding="utf-8") as out:
        out.write(buffer.getvalue())
    return events


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("generator", choices=sorted(GENERATORS) + ["all"])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--scale", type=positive_scale, default=1.0,
                        help="multiplies the step or allocation count (default 1)")
    parser.add_argument("--steps", "--allocs", dest="count", type=positive_int, default=None,
                        help="steps (decoder, training, capture) or allocations (churn, midsize)")
    parser.add_argument("--out", help="output file (default: stdout); left as it was on an error")
    parser.add_argument("--out-dir", help="for `all`: the directory of the five traces")
    args = parser.parse_args(argv)
    try:
        if args.generator == "all":
            if not args.out_dir:
                parser.error("`all` needs --out-dir")
            if args.count is not None or args.out:
                parser.error("`all` takes --scale and --out-dir; --steps, --allocs and --out "
                             "name one generator's trace")
            os.makedirs(args.out_dir, exist_ok=True)
            for name in sorted(GENERATORS):
                path = os.path.join(args.out_dir, name + ".jsonl")
                events = write_file(path, name, args.seed, None, args.scale)
                print("%s: %d alloc/free events" % (path, events), file=sys.stderr)
            return 0
        if args.out_dir:
            parser.error("--out-dir is for `all`; one generator writes to --out or stdout")
        if args.out == "":
            parser.error("an empty path: name a file (or leave --out out for stdout)")
        if args.out is not None:
            write_file(args.out, args.generator, args.seed, args.count, args.scale)
        else:
            if sys.stdout is None:
                print("gen_traces: stdout is closed: name a file with --out", file=sys.stderr)
                return 1
            generate(args.generator, sys.stdout, args.seed, args.count, args.scale)
            sys.stdout.flush()
    except OSError as e:
        if isinstance(e, BrokenPipeError):
            # The reader stopped early (`| head`): not an error of the generator.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
        where = e.filename or args.out or args.out_dir or "<stdout>"
        print("gen_traces: %s: %s" % (where, e.strerror or e), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
