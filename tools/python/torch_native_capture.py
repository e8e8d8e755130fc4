#!/usr/bin/env python3
"""A graph captured natively by PyTorch (torch.cuda.graph), with capalloc
installed through CUDAPluggableAllocator: what the tracker reports before the
first replay, which evidence it rests on, and whether the replay agrees.

capalloc sees only PyTorch's malloc and free on this path. The program is an
ordinary two-layer step (matmul, relu, elementwise, matmul, reduction) whose
temporaries are freed inside the capture, as in any multi-op graph. Before
the capture it computes the expected output eagerly and keeps copies of the
inputs; after one replay it checks the output and every live tensor it knows
(inputs, a canary allocated before the capture, one allocated after it).

Prints the graph record (evidence, writes), every finding, the replay's
outcome per tensor and a last `result:` line. Exit status: 0 when capalloc
recorded the graph and the tracker and the replay agree (no `hazard` whose
victim the replay left intact, and no clobbered tensor without a finding
naming it), 1 otherwise, 77 when PyTorch with CUDA is not available.

    CAPALLOC_LIBRARY=.../libcapalloc.so python3 torch_native_capture.py
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

from capalloc._checks import torch_with_cuda_or_skip  # noqa: E402

torch = torch_with_cuda_or_skip()

# Plain CUDAPluggableAllocator (malloc and free only): the route this script
# checks; tools/gpu/torch_shim_check.py checks the shim's.
capalloc.install(use_shim=False)  # before the first CUDA allocation of the process

dev = "cuda"
torch.manual_seed(0)


def step(x, w1, w2):
    h = torch.relu(x @ w1)
    h = h * 2.0 + 1.0
    return (h @ w2).sum(dim=1)


x = torch.randn(512, 1024, device=dev)
w1 = torch.randn(1024, 1024, device=dev) / 32
w2 = torch.randn(1024, 256, device=dev) / 32
canary_before = torch.full((1 << 18,), 1234.5, device=dev)
refs = {"x": x.clone(), "w1": w1.clone(), "w2": w2.clone()}
expected = step(x, w1, w2)

# Warm up on a side stream, as PyTorch's documentation asks before capturing.
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    for _ in range(2):
        step(x, w1, w2)
torch.cuda.current_stream().wait_stream(side)
torch.cuda.synchronize()

graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    out = step(x, w1, w2)
canary_after = torch.full((1 << 18,), 4321.5, device=dev)
torch.cuda.synchronize()

# The tracker's verdict, before any replay.
findings = capalloc.check()
snapshot = capalloc.snapshot()
records = [g for g in snapshot["graphs"] if g.get("discovered")]
print(f"graph records found through the allocator: {len(records)}")
for g in records:
    print(f"  graph {g['label']}: evidence {g['precision']}, {g['writes']} recorded writes")
print(f"findings before the first replay: {len(findings)}")
for f in findings:
    print(f"  {f}")

# The replay: what really happens to memory.
graph.replay()
torch.cuda.synchronize()
tensors = {"out": out, "x": x, "w1": w1, "w2": w2,
           "canary_before": canary_before, "canary_after": canary_after}
intact = {
    "out": bool(torch.allclose(out, expected, rtol=1e-3, atol=1e-2)),
    "x": bool(torch.equal(x, refs["x"])),
    "w1": bool(torch.equal(w1, refs["w1"])),
    "w2": bool(torch.equal(w2, refs["w2"])),
    "canary_before": bool((canary_before == 1234.5).all()),
    "canary_after": bool((canary_after == 4321.5).all()),
}
by_ptr = {hex(t.data_ptr()): name for name, t in tensors.items()}
named = {}
for f in findings:
    named.setdefault(by_ptr.get(f.victim["ptr"]), []).append(f)

disagreements = []
for name, ok in intact.items():
    verdicts = [f.severity for f in named.get(name, [])]
    print(f"  replay: {name:14s} {'intact' if ok else 'CHANGED':8s} findings: {verdicts or 'none'}")
    if not ok and not verdicts:
        disagreements.append(f"{name} changed by the replay with no finding (missed hazard)")
    if ok and "hazard" in verdicts:
        disagreements.append(f"{name} intact after the replay but reported as a hazard (false hazard)")
unverified = named.get(None, [])
if unverified:
    print(f"  {len(unverified)} finding(s) name blocks this script does not hold "
          "(PyTorch's own, e.g. cuBLAS workspaces): not checked against the replay")
if not records:
    disagreements.append("capalloc recorded no graph for the capture: the allocator was not "
                         "used, or the capture was not found through it")
for d in disagreements:
    print(f"DISAGREE: {d}")

evidence = sorted({g["precision"] for g in records}) or ["none"]
severities = {}
for f in findings:
    severities[f.severity] = severities.get(f.severity, 0) + 1
print(f"result: evidence {'/'.join(evidence)}; {len(findings)} finding(s) {severities or ''}; "
      f"replay {'output correct' if intact['out'] else 'OUTPUT WRONG'}, "
      f"{sum(intact.values())}/{len(intact)} tensors intact; "
      + ("tracker and replay agree" if not disagreements else
         f"{len(disagreements)} disagreement(s)"))
sys.exit(1 if disagreements else 0)
