#!/usr/bin/env python3
"""Seed 003's four arms in PyTorch, with capalloc installed as the CUDA allocator.

The arms are the seed's pure-PyTorch script (N = 262144 float32, canary
1234.5). capalloc knows nothing but malloc and free here, as in any PyTorch
process: it routes each capture's allocations into a graph pool by capture id
and checks footprint write records. Per arm this prints the tracker's findings
before any replay (capalloc.check() right after the capture) and the replay
outcome, and exits 0 when everything matches the seed.

    CAPALLOC_LIBRARY=build/libcapalloc.so python3 tools/python/seed003_arms_torch.py

Needs a CUDA (or ROCm) GPU and PyTorch; run by tools/gpu-check.sh.
"""
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

# Plain CUDAPluggableAllocator (malloc and free only): the route this script
# checks; tools/gpu/torch_shim_check.py checks the shim's.
capalloc.install(use_shim=False)  # before the first CUDA allocation of the process

import torch  # noqa: E402

N, CANARY = 1 << 18, 1234.5
dev = "cuda"
results = []



def report(arm, alias, findings, outcome, expected):
    ok = expected
    print(f"\narm {arm}: alias={alias}")
    print(f"  findings before replay: {len(findings)}")
    for f in findings:
        print(f"    {f}")
    print(f"  replay: {outcome}")
    print(f"  expected -> {'match' if ok else 'MISMATCH'}")
    results.append(ok)


def arm_a():
    pool, g, s = torch.cuda.graph_pool_handle(), torch.cuda.CUDAGraph(), torch.cuda.Stream()
    src = torch.full((N,), 3.0, device=dev)
    with torch.cuda.graph(g, pool=pool, stream=s):
        T = src * 2.0
        t_ptr = T.data_ptr()
        sink = T.sum()
        del T
        WS = torch.empty(N, device=dev)
    alias = t_ptr == WS.data_ptr()
    findings = capalloc.check()
    WS.fill_(CANARY); torch.cuda.synchronize()
    g.replay(); torch.cuda.synchronize()
    clobbered = int((WS != CANARY).sum())
    value = WS[0].item()
    report("A", alias, findings, f"{clobbered}/{N} clobbered, value {value}",
           alias and clobbered == N and value == 6.0 and len(findings) > 0)
    del sink


def arm_b():
    pool, g, s = torch.cuda.graph_pool_handle(), torch.cuda.CUDAGraph(), torch.cuda.Stream()
    src = torch.full((N,), 3.0, device=dev)
    WS = torch.empty(N, device=dev)
    before = len(capalloc.check())
    with torch.cuda.graph(g, pool=pool, stream=s):
        T = src * 2.0
        sink = T.sum()
        del T
    findings = capalloc.check()[before:]
    WS.fill_(CANARY); torch.cuda.synchronize()
    for _ in range(5):
        g.replay()
    torch.cuda.synchronize()
    clobbered = int((WS != CANARY).sum())
    ws_findings = [f for f in findings if f.victim["ptr"] == hex(WS.data_ptr())]
    report("B", False, ws_findings, f"5 replays, {clobbered}/{N} clobbered",
           clobbered == 0 and not ws_findings)
    del sink


def arm_c():
    pool, s = torch.cuda.graph_pool_handle(), torch.cuda.Stream()
    src = torch.full((N,), 3.0, device=dev)
    g1 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g1, pool=pool, stream=s):
        T = src * 2.0
        s1 = T.sum()
        del T
        WS = torch.empty(N, device=dev)
    g2 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g2, pool=pool, stream=s):
        U = src * 7.0
        u_ptr = U.data_ptr()
        s2 = U.sum()
        del U
    alias = u_ptr == WS.data_ptr()
    ws_ptr = hex(WS.data_ptr())
    findings = [f for f in capalloc.check() if f.victim["ptr"] == ws_ptr]
    WS.fill_(CANARY); torch.cuda.synchronize()
    g2.replay(); torch.cuda.synchronize()
    clobbered = int((WS != CANARY).sum())
    report("C", alias, findings, f"after graph 2's replay {clobbered}/{N} clobbered",
           not alias and clobbered == 0 and len(findings) > 0)
    del s1, s2


def arm_d():
    pool, s = torch.cuda.graph_pool_handle(), torch.cuda.Stream()
    src = torch.full((N,), 3.0, device=dev)
    g1 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g1, pool=pool, stream=s):
        T = src * 2.0
        t_ptr = T.data_ptr()
        s1 = T.sum()
        del T
    g2 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g2, pool=pool, stream=s):
        V = src * 5.0
        s2 = V.sum()
        del V
        WS = torch.empty(N, device=dev)
    alias = t_ptr == WS.data_ptr()
    ws_ptr = hex(WS.data_ptr())
    findings = [f for f in capalloc.check() if f.victim["ptr"] == ws_ptr]
    WS.fill_(CANARY); torch.cuda.synchronize()
    g1.replay(); torch.cuda.synchronize()
    v1 = WS[0].item()
    WS.fill_(CANARY); torch.cuda.synchronize()
    g2.replay(); torch.cuda.synchronize()
    v2 = WS[0].item()
    report("D", alias, findings, f"replay graph 1 -> {v1}, graph 2 -> {v2}",
           alias and v1 == 6.0 and v2 == 15.0 and len(findings) > 0)
    del s1, s2


for arm in (arm_a, arm_b, arm_c, arm_d):
    arm()
print(f"\nevery arm matches seed 003: {'yes' if all(results) else 'NO'}")
sys.exit(0 if all(results) else 1)
