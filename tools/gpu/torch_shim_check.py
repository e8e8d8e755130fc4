#!/usr/bin/env python3
"""PyTorch with capalloc's shim (python/capalloc/_torch_shim.cpp): every hook
reaches capalloc, and strict mode raises at the end of a torch.cuda.graph
block that captured a real hazard.

Builds the shim (capalloc.install(use_shim=True)), then checks, each against
capalloc's own state, not only the shim's counters:

  record_stream   a tensor recorded on a side stream and freed: the hook ran
                  and capalloc took it (an error would raise)
  empty_cache     torch.cuda.empty_cache() gives a freed 256 MiB segment back
                  (capalloc's reserved bytes drop)
  pools           two graphs captured with one torch.cuda.graph_pool_handle():
                  capalloc keeps one graph pool for it, used twice, and both
                  graphs' outputs live in it; each capture's end ran the check
  release_pool    deleting both graphs releases the pool (capalloc forgets it)
  strict          with capalloc.set_strict(True), a capture whose memcpy writes
                  through a freed temporary onto a block left live raises at
                  the end of the `with torch.cuda.graph(...)` block, naming the
                  finding

Prints one line per check and a last `result:` line. Exit status: 0 when
every check passed, 1 otherwise, 77 when PyTorch with CUDA is missing or the
shim cannot be built here (no compiler or headers: the reason is printed).

    CAPALLOC_LIBRARY=.../libcapalloc.so CAPALLOC_RUNTIME=cuda python3 torch_shim_check.py
"""
import gc
import json
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
# The capalloc package: beside this script in a GPU bundle (python/capalloc/),
# python/ in the source tree, else an installed one (pip install ./python).
for _d in (_here, os.path.join(_here, "..", "..", "python")):
    if os.path.isfile(os.path.join(_d, "capalloc", "__init__.py")):
        sys.path.insert(0, _d)
        break
import capalloc  # noqa: E402

from capalloc._checks import install_or_skip, torch_with_cuda_or_skip  # noqa: E402

torch = torch_with_cuda_or_skip()
install_or_skip(use_shim=True)  # before the first CUDA allocation of the process

hooks = capalloc.active_hooks()
print("active hooks:", json.dumps(hooks))
failures = []


def check(ok, what):
    print(("PASS " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def calls():
    return capalloc.active_hooks()["calls"]


check(hooks["route"] == "shim" and not hooks["inactive"],
      f"every hook is active through the shim (inactive: {hooks['inactive']})")
dev = torch.cuda.current_device()

# record_stream: a tensor used on a side stream, then freed.
side = torch.cuda.Stream()
a = torch.ones(1 << 20, device="cuda")
before = calls()["record_stream"]
with torch.cuda.stream(side):
    b = a * 2
a.record_stream(side)
del a
torch.cuda.synchronize()
check(calls()["record_stream"] == before + 1 and float(b[0]) == 2.0,
      "tensor.record_stream(side) reached capalloc_record_stream")
del b

# empty_cache: a freed 256 MiB segment goes back.
big = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
del big
torch.cuda.synchronize()
reserved = capalloc.memory_stats(dev)["reserved_bytes.all.current"]
before = calls()["empty_cache"]
torch.cuda.empty_cache()
after = capalloc.memory_stats(dev)["reserved_bytes.all.current"]
check(calls()["empty_cache"] == before + 1 and after <= reserved - (256 << 20),
      f"torch.cuda.empty_cache() reached capalloc: reserved {reserved} -> {after} bytes")

# Two graphs sharing one pool.
x = torch.randn(1 << 16, device="cuda")
torch.cuda.synchronize()
pool = torch.cuda.graph_pool_handle()
begins, ends = calls()["begin_allocate_to_pool"], calls()["end_allocate_to_pool"]
g1 = torch.cuda.CUDAGraph()
with torch.cuda.graph(g1, pool=pool):
    out1 = x * 2
g2 = torch.cuda.CUDAGraph()
with torch.cuda.graph(g2, pool=pool):
    out2 = out1 + 1
check(calls()["begin_allocate_to_pool"] == begins + 2 and
      calls()["end_allocate_to_pool"] == ends + 2,
      "torch.cuda.graph(pool=...) reached begin/end_allocate_to_pool twice")
print("findings at the last capture's end:", [str(f) for f in capalloc.last_capture_findings()])
pool_id = tuple(int(v) for v in pool)
shared = capalloc.torch_pool(dev, pool_id)
live = {int(blk["ptr"], 16): blk for d in capalloc.snapshot()["devices"]
        for blk in d["live_blocks"]}
in_pool = [live.get(t.data_ptr(), {}).get("pool") for t in (out1, out2)]
check(shared["uses"] == 2 and in_pool == [shared["pool"]] * 2,
      f"capalloc keeps one graph pool ({shared}) for PyTorch pool {pool_id}; "
      f"the outputs' pools: {in_pool}")
g1.replay()
g2.replay()
torch.cuda.synchronize()
check(torch.allclose(out2, x * 2 + 1), "the graphs replay correctly from capalloc's pool")
releases = calls()["release_pool"]
del g1, g2
gc.collect()
try:
    capalloc.torch_pool(dev, pool_id)
    gone = False
except capalloc.CapallocError as e:
    gone = e.status == 3
check(calls()["release_pool"] == releases + 2 and gone,
      "deleting both graphs released the pool (capalloc_torch_release_pool), and capalloc "
      "forgot it")
del out1, out2

# Strict mode: a real hazard raises at the end of the `with` block. Inside
# the capture a temporary is written by a memcpy (copy_ of a contiguous
# tensor), read into y, freed; `ws` takes its address and stays live,
# written by no graph: each replay's memcpy overwrites it.
y = torch.empty_like(x)
torch.cuda.synchronize()
capalloc.set_strict(True)
g3 = torch.cuda.CUDAGraph()
raised = None
ws = None
tmp_ptr = None
try:
    with torch.cuda.graph(g3):
        tmp = torch.empty_like(x)
        tmp.copy_(x)
        y.copy_(tmp)
        tmp_ptr = tmp.data_ptr()
        del tmp
        ws = torch.empty_like(x)
except RuntimeError as e:
    raised = str(e)
finally:
    capalloc.set_strict(False)
    torch.cuda.set_stream(torch.cuda.default_stream())  # the block's __exit__ stopped early
print("findings at that capture's end:", [str(f) for f in capalloc.last_capture_findings()])
check(raised is not None and "strict mode" in raised and "hazard" in raised,
      "strict mode raised at the end of the torch.cuda.graph block, naming the finding"
      + (f": {raised.splitlines()[0][:300]}" if raised else " (nothing raised)")
      + f"; ws {'took' if ws is not None and ws.data_ptr() == tmp_ptr else 'did not take'} "
      "the temporary's address")

if failures:
    print(f"result: {len(failures)} check(s) failed: {'; '.join(f[:80] for f in failures)}")
    sys.exit(1)
print("result: record_stream, empty_cache, pool sharing and release reach capalloc through the "
      "shim; strict mode raised at the end of the capture with a hazard")
