"""capalloc for Python: ctypes over libcapalloc's C ABI, no build step.

    import capalloc
    capalloc.install()                      # PyTorch: capalloc becomes the CUDA allocator
    capalloc.preallocate(0, "splitk.ws", 16 << 20)   # warmup, before any capture
    ... torch.cuda.graph(...) captures as usual ...
    for finding in capalloc.check():        # before the first replay
        print(finding)
    state = capalloc.snapshot()             # dict: devices, live blocks, graphs, findings

The library is found, in order: the `path` argument, $CAPALLOC_LIBRARY,
../lib/libcapalloc.so beside this file (a GPU bundle), the build tree next to
this file (build/libcapalloc.so), then the system's library path. install() hands the same file to
torch.cuda.memory.CUDAPluggableAllocator, so PyTorch and this module share
one process-wide capalloc.

Errors from the C ABI raise CapallocError with capalloc's message.
"""

import ctypes
import ctypes.util
import json
import os

__all__ = [
    "CapallocError", "Finding", "load", "install", "check", "preallocate", "get",
    "snapshot", "set_strict", "waive", "library_path",
]

_OK = 0
_STATUS_NAMES = {
    1: "invalid argument", 2: "out of memory", 3: "not found",
    4: "failed precondition", 5: "unavailable", 6: "internal error",
}

_lib = None
_lib_path = None


class CapallocError(RuntimeError):
    """A C ABI call failed; `status` is its capalloc_status code."""

    def __init__(self, call, status, message):
        super().__init__(f"{call}: {_STATUS_NAMES.get(status, status)}: {message}")
        self.status = status


class Finding:
    """One finding of the alias check (see docs/findings.md for every field).

    Attribute access reads the JSON fields: f.severity, f.graph_label,
    f.victim["tag"], f.writer["tag"], f.overlap["bytes"], f.fix, ...
    """

    def __init__(self, fields):
        self._fields = fields

    def __getattr__(self, name):
        try:
            return self._fields[name]
        except KeyError:
            raise AttributeError(name) from None

    def as_dict(self):
        return dict(self._fields)

    def __repr__(self):
        return (f"Finding({self.severity}: {self.graph_label} clobbers "
                f"{self.victim['tag'] or 'untagged'!r} through {self.writer['tag'] or 'untagged'!r})")

    def __str__(self):
        v, w = self.victim, self.writer
        return (f"[{self.severity}] {self.graph_label} (capture {self.capture}) overwrites "
                f"'{v['tag'] or 'untagged'}' (block #{v['sequence']}, {v['size']} bytes at {v['ptr']}) "
                f"through '{w['tag'] or 'untagged'}' (block #{w['sequence']}), "
                f"{self.overlap['bytes']} bytes, {self.evidence} evidence. Fix: {self.fix}")


def _candidates(path):
    if path:
        yield path
    env = os.environ.get("CAPALLOC_LIBRARY")
    if env:
        yield env
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.join(here, "..", "lib", "libcapalloc.so")  # in a GPU bundle (docs/gpu.md)
    yield os.path.join(here, "..", "..", "build", "libcapalloc.so")
    found = ctypes.util.find_library("capalloc")
    if found:
        yield found


def library_path(path=None):
    """The libcapalloc.so this module uses (or would use)."""
    if _lib_path is not None and path is None:
        return _lib_path
    for candidate in _candidates(path):
        if os.path.sep not in candidate or os.path.exists(candidate):
            return os.path.abspath(candidate) if os.path.exists(candidate) else candidate
    raise CapallocError("load", 5, "libcapalloc.so not found: pass its path or set CAPALLOC_LIBRARY")


def load(path=None):
    """Loads the library once; later calls return the same handle."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    resolved = library_path(path)
    lib = ctypes.CDLL(resolved, mode=ctypes.RTLD_GLOBAL)
    lib.capalloc_last_error.restype = ctypes.c_char_p
    for name in ("capalloc_check", "capalloc_snapshot"):
        getattr(lib, name).argtypes = [ctypes.POINTER(ctypes.c_char_p)]
    lib.capalloc_preallocate.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t,
                                         ctypes.POINTER(ctypes.c_void_p)]
    lib.capalloc_get.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
    lib.capalloc_set_strict.argtypes = [ctypes.c_int]
    lib.capalloc_waive.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_char_p,
                                   ctypes.c_char_p]
    _lib, _lib_path = lib, resolved
    return lib


def _call(name, *args):
    lib = load()
    status = getattr(lib, name)(*args)
    if status != _OK:
        raise CapallocError(name, status, lib.capalloc_last_error().decode())


def install(path=None):
    """Makes capalloc PyTorch's CUDA allocator. Call before the first CUDA
    allocation of the process (PyTorch refuses to switch after it)."""
    import torch  # only install() needs PyTorch

    resolved = library_path(path)
    allocator = torch.cuda.memory.CUDAPluggableAllocator(
        resolved, "capalloc_torch_malloc", "capalloc_torch_free")
    torch.cuda.memory.change_current_allocator(allocator)
    load(resolved)
    return allocator


def check():
    """Every captured graph against the live blocks now, as Finding objects.
    Captures that have ended since the last call are recorded first."""
    out = ctypes.c_char_p()
    _call("capalloc_check", ctypes.byref(out))
    return [Finding(f) for f in json.loads(out.value.decode())]


def preallocate(device, key, nbytes):
    """Creates (or returns) the persistent buffer (device, key); returns its
    address. Refused while a capture is active: call it during warmup."""
    out = ctypes.c_void_p()
    _call("capalloc_preallocate", device, key.encode(), nbytes, ctypes.byref(out))
    return out.value


def get(device, key):
    """The address of a preallocated buffer; never allocates."""
    out = ctypes.c_void_p()
    _call("capalloc_get", device, key.encode(), ctypes.byref(out))
    return out.value


def snapshot():
    """The allocator's and the tracker's state as a dict (docs/snapshot.md)."""
    out = ctypes.c_char_p()
    _call("capalloc_snapshot", ctypes.byref(out))
    return json.loads(out.value.decode())


def set_strict(strict=True, possible=False):
    """Strict mode: replays through capalloc of graphs with hazards are
    refused; with possible=True also those with `possible` findings (the
    footprint evidence of plain CUDAPluggableAllocator)."""
    _call("capalloc_set_strict", (2 if possible else 1) if strict else 0)


def waive(graph, victim, reason):
    """Marks the findings of `graph` (a finding's `graph` field) on `victim`
    as judged benign: strict mode then replays the graph despite them, and
    check() still lists them, with f.waived == {"reason": reason}. `victim`
    is an address inside a live block (an int, e.g. tensor.data_ptr()) or a
    tag (a str: every block with that tag)."""
    if not isinstance(reason, str) or not reason:
        raise ValueError("waive: reason must be a non-empty str")
    if isinstance(victim, str):
        _call("capalloc_waive", graph, None, victim.encode(), reason.encode())
    elif isinstance(victim, int):
        _call("capalloc_waive", graph, victim, None, reason.encode())
    else:
        raise TypeError("waive: victim must be an address (int) or a tag (str)")
