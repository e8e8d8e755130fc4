#!/usr/bin/env python3
"""Seed 003's four arms in PyTorch, with capalloc installed as the CUDA allocator.

The arms are the seed's pure-PyTorch script (N = 262144 float32, canary
1234.5). Each arm's verdict is checked against what replay really does, graph
by graph: capalloc.check() runs right after the captures, before any replay;
then every graph of the arm is replayed onto a fresh canary, and a graph must
have a clobber finding naming WS as its victim exactly when its replay
changes WS, its record must have the route's evidence (footprint on the
plain route, inspected through the shim), and findings about other blocks
are printed (these replays watch WS only).
On top of that, each arm's outcome must be the seed's for the route:

  --route pluggable (default)  plain CUDAPluggableAllocator: capalloc sees
      malloc and free only, not PyTorch's pool handle, so it gives every
      capture a graph pool of its own (by capture id). Arms A, B and C are
      the seed's; in arm D the second capture cannot reuse the first one's
      freed block, so graph 1 leaves WS alone (alias False) and only graph 2,
      whose own temporary V shares WS's address, writes it (15.0).
  --route shim   capalloc's C++ shim (built here): PyTorch's pool handle
      reaches capalloc, both captures of arm D share one pool, and arm D is
      the seed's: WS takes graph 1's freed T, graph 1 writes 6.0 and graph 2
      writes 15.0, both reported before the first replay.

Exit status: 0 when every arm matches, 1 otherwise, 77 when PyTorch with CUDA
is missing or (--route shim) the shim cannot be built here.

    CAPALLOC_LIBRARY=build/libcapalloc.so python3 tools/python/seed003_arms_torch.py [--route shim]

Needs a CUDA (or ROCm) GPU and PyTorch; run by tools/gpu-check.sh.
"""
import argparse
import os
import sys

# The capalloc package: beside this script in a GPU bundle (python/capalloc/),
# python/ in the source tree, else an installed one (pip install ./python).
_here = os.path.dirname(os.path.abspath(__file__))
for _d in (_here, os.path.join(_here, "..", "..", "python")):
    if os.path.isfile(os.path.join(_d, "capalloc", "__init__.py")):
        sys.path.insert(0, _d)
        break
import capalloc  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--route", choices=("pluggable", "shim"), default="pluggable")
ROUTE = parser.parse_args().route

from capalloc._checks import install_or_skip, torch_with_cuda_or_skip  # noqa: E402

torch = torch_with_cuda_or_skip()
install_or_skip(use_shim=ROUTE == "shim")  # before the first CUDA allocation of the process
print(f"route: {capalloc.active_hooks()['route']}")

N, CANARY = 1 << 18, 1234.5
dev = "cuda"
results = []


def evidence_by_capture():
    """{capture id: its record's evidence} for the graphs the tracker holds now."""
    return {g["capture"]: g["precision"] for g in capalloc.snapshot()["graphs"]}


def captured(graph, pool, stream, body):
    """Captures body() into graph; returns (its capture id, what body returned)."""
    before = evidence_by_capture().keys()
    with torch.cuda.graph(graph, pool=pool, stream=stream):
        out = body()
    new = evidence_by_capture().keys() - before
    if len(new) != 1:
        raise SystemExit(f"expected one new graph record after the capture, found {sorted(new)}")
    return new.pop(), out


def replay_onto_canary(graph, ws, times=1):
    """Fills ws with the canary, replays graph, returns (changed elements, ws[0])."""
    ws.fill_(CANARY)
    torch.cuda.synchronize()
    for _ in range(times):
        graph.replay()
    torch.cuda.synchronize()
    return int((ws != CANARY).sum()), ws[0].item()


# The evidence each route's records must have: the plain route sees only
# malloc and free; through the shim capalloc reads the captured graph.
EXPECTED_EVIDENCE = {"pluggable": "footprint", "shim": "inspected"}


def report(arm, alias, ws, findings, replays, expected):
    """replays: [(name, capture id, changed, value)]. Checks the truth rule
    (a clobber finding about WS from a graph exactly when its replay changed
    WS), the evidence the route must give, and the route's expected outcome.
    Findings of the arm's captures about other blocks are printed: the
    replays here watch WS only."""
    ws_ptr = hex(ws.data_ptr())
    captures = {c for _, c, _, _ in replays}
    about_ws = [f for f in findings if f.victim["ptr"] == ws_ptr]
    others = [f for f in findings if f.capture in captures and f.victim["ptr"] != ws_ptr]
    print(f"\narm {arm}: alias={alias}")
    print(f"  findings about WS before any replay: {len(about_ws)}")
    for f in about_ws:
        print(f"    [{f.harm}] {f}")
    truthful = True
    evidence_now = evidence_by_capture()
    for name, capture, changed, value in replays:
        clobber = any(f.capture == capture and f.harm == "clobber" for f in about_ws)
        agrees = clobber == (changed > 0)
        truthful &= agrees
        evidence = evidence_now.get(capture)
        evidence_ok = evidence == EXPECTED_EVIDENCE[ROUTE]
        truthful &= evidence_ok
        print(f"  replay {name} (capture {capture}, {evidence} evidence"
              f"{'' if evidence_ok else ', want ' + EXPECTED_EVIDENCE[ROUTE]}): {changed}/{N}"
              f" changed, WS[0] = {value}; clobber reported: {clobber}"
              f" -> {'agrees' if agrees else 'DISAGREES'}")
    unreplayed = {f.capture for f in about_ws} - captures
    if unreplayed:
        truthful = False
        print(f"  findings about WS from captures this arm did not replay: {sorted(unreplayed)}")
    if others:
        print(f"  findings of these captures about other blocks (not checked by these replays):")
        for f in others:
            print(f"    [{f.harm}] {f}")
    ok = truthful and expected
    print(f"  verdict vs replay: {'truthful' if truthful else 'WRONG'};"
          f" seed 003 on the {ROUTE} route: {'match' if expected else 'MISMATCH'}")
    results.append(ok)


def arm_a():
    pool, g, s = torch.cuda.graph_pool_handle(), torch.cuda.CUDAGraph(), torch.cuda.Stream()
    src = torch.full((N,), 3.0, device=dev)

    def body():
        T = src * 2.0
        t_ptr = T.data_ptr()
        sink = T.sum()
        del T
        return t_ptr, sink, torch.empty(N, device=dev)
    cap, (t_ptr, sink, WS) = captured(g, pool, s, body)
    alias = t_ptr == WS.data_ptr()
    findings = capalloc.check()
    changed, value = replay_onto_canary(g, WS)
    report("A", alias, WS, findings, [("graph", cap, changed, value)],
           alias and changed == N and value == 6.0)


def arm_b():
    pool, g, s = torch.cuda.graph_pool_handle(), torch.cuda.CUDAGraph(), torch.cuda.Stream()
    src = torch.full((N,), 3.0, device=dev)
    WS = torch.empty(N, device=dev)

    def body():
        T = src * 2.0
        sink = T.sum()
        del T
        return sink
    cap, sink = captured(g, pool, s, body)
    findings = capalloc.check()
    changed, value = replay_onto_canary(g, WS, times=5)
    report("B", False, WS, findings, [("graph x5", cap, changed, value)], changed == 0)


def arm_c():
    pool, s = torch.cuda.graph_pool_handle(), torch.cuda.Stream()
    src = torch.full((N,), 3.0, device=dev)
    g1, g2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()

    def body1():
        T = src * 2.0
        s1 = T.sum()
        del T
        return s1, torch.empty(N, device=dev)
    cap1, (s1, WS) = captured(g1, pool, s, body1)

    def body2():
        U = src * 7.0
        u_ptr = U.data_ptr()
        s2 = U.sum()
        del U
        return u_ptr, s2
    cap2, (u_ptr, s2) = captured(g2, pool, s, body2)
    alias = u_ptr == WS.data_ptr()
    findings = capalloc.check()
    changed2, value2 = replay_onto_canary(g2, WS)
    changed1, value1 = replay_onto_canary(g1, WS)
    report("C", alias, WS, findings,
           [("graph 2", cap2, changed2, value2), ("graph 1", cap1, changed1, value1)],
           not alias and changed2 == 0)


def arm_d():
    pool, s = torch.cuda.graph_pool_handle(), torch.cuda.Stream()
    src = torch.full((N,), 3.0, device=dev)
    g1, g2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()

    def body1():
        T = src * 2.0
        t_ptr = T.data_ptr()
        s1 = T.sum()
        del T
        return t_ptr, s1
    cap1, (t_ptr, s1) = captured(g1, pool, s, body1)

    def body2():
        V = src * 5.0
        s2 = V.sum()
        del V
        return s2, torch.empty(N, device=dev)
    cap2, (s2, WS) = captured(g2, pool, s, body2)
    alias = t_ptr == WS.data_ptr()
    findings = capalloc.check()
    changed1, v1 = replay_onto_canary(g1, WS)
    changed2, v2 = replay_onto_canary(g2, WS)
    if ROUTE == "shim":   # one shared pool: the seed's cross-capture alias
        expected = alias and v1 == 6.0 and v2 == 15.0
    else:                 # a pool per capture: graph 1 cannot reach WS
        expected = not alias and changed1 == 0 and v2 == 15.0
    report("D", alias, WS, findings,
           [("graph 1", cap1, changed1, v1), ("graph 2", cap2, changed2, v2)], expected)


for arm in (arm_a, arm_b, arm_c, arm_d):
    arm()
verdict = "yes" if all(results) else "NO"
print(f"\nresult: {ROUTE} route: every arm's findings agree with its replays and match seed 003: {verdict}")
sys.exit(0 if all(results) else 1)
