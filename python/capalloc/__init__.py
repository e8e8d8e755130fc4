"""capalloc for Python: ctypes over libcapalloc's C ABI, and PyTorch's
allocator hooks through a small C++ shim built on the machine.

    import capalloc
    capalloc.install()                      # PyTorch: capalloc becomes the CUDA allocator
    print(capalloc.active_hooks())          # which of PyTorch's hooks reach capalloc
    capalloc.preallocate(0, "splitk.ws", 16 << 20)   # warmup, before any capture
    ... torch.cuda.graph(...) captures as usual ...
    for finding in capalloc.check():        # before the first replay
        print(finding)
    state = capalloc.snapshot()             # dict: devices, live blocks, graphs, findings
    cp = capalloc.checkpoint()              # retention audit: what a step leaves behind
    with capalloc.tag("decoder.layer3"):    # tags this task's allocations, with the call site
        ...
    for group in capalloc.live_since(cp)["groups"]:
        print(group["tag"], group["site"], group["bytes"])
    capalloc.memory_stats(0)                # torch.cuda.memory_stats()-style figures

The library is found, in order: the `path` argument (an error if that file
does not exist), $CAPALLOC_LIBRARY (an error if set to a file that does not
exist), then the install prefix: lib/libcapalloc.so in the nearest directory
above this package that has one (a GPU bundle's lib/, or the prefix a
virtual environment or `cmake --install` shares with the package), in
sys.prefix, then the system loader's search path. install() hands the same
file to PyTorch, so PyTorch and this module share one process-wide capalloc.

Arguments are checked before they reach C: a wrong type raises TypeError,
an integer out of its C type's range or a string with a NUL byte raises
ValueError, each naming the argument. Errors from the C ABI raise
CapallocError with capalloc's message.
"""

import atexit
import contextvars
import ctypes
import ctypes.util
import itertools
import json
import operator
import os
import sys
import threading

__all__ = [
    "CapallocError", "Finding", "load", "install", "check", "preallocate", "get",
    "release_persistent",
    "snapshot", "set_strict", "get_strict", "waive", "library_path", "memory_stats",
    "empty_cache", "active_hooks", "torch_pool", "last_capture_findings",
    "release_on_stream", "release_pending", "release_drain", "dlpack_import", "ImportedTensor",
    "checkpoint", "live_since", "tag", "sync_tag", "record_stacks", "trace_start", "trace_stop",
]

_OK = 0
_STATUS_NAMES = {
    1: "invalid argument", 2: "out of memory", 3: "not found",
    4: "failed precondition", 5: "unavailable", 6: "internal error",
}
_INT_MAX = 2**31 - 1
_UINT64_MAX = 2**64 - 1
_SIZE_MAX = 2**(8 * ctypes.sizeof(ctypes.c_size_t)) - 1

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
        # Never raises, whatever the JSON held (a repr that raises hides the
        # object it was asked to show).
        d = self._fields if isinstance(self._fields, dict) else {}

        def tag(side):
            block = d.get(side)
            return (block.get("tag") if isinstance(block, dict) else None) or "untagged"
        return (f"Finding({d.get('severity', '?')}: {d.get('graph_label', '?')} clobbers "
                f"{tag('victim')!r} through {tag('writer')!r})")

    def __str__(self):
        v, w = self.victim, self.writer
        return (f"[{self.severity}] {self.graph_label} (capture {self.capture}) overwrites "
                f"'{v['tag'] or 'untagged'}' (block #{v['sequence']}, {v['size']} bytes at {v['ptr']}) "
                f"through '{w['tag'] or 'untagged'}' (block #{w['sequence']}), "
                f"{self.overlap['bytes']} bytes, {self.evidence} evidence. Fix: {self.fix}")


# --- Arguments, checked before C sees them ----------------------------------

def _int(call, name, value, low, high):
    if isinstance(value, bool):
        raise TypeError(f"{call}: {name} must be an int, not bool")
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{call}: {name} must be an int, not {type(value).__name__}") from None
    if not low <= value <= high:
        raise ValueError(f"{call}: {name} {value} is out of range [{low}, {high}]")
    return value


def _device(call, value, allow_all=False):
    return _int(call, "device", value, -1 if allow_all else 0, _INT_MAX)


def _text(call, name, value):
    if not isinstance(value, str):
        raise TypeError(f"{call}: {name} must be a str, not {type(value).__name__}")
    if "\0" in value:
        raise ValueError(f"{call}: {name} contains a NUL byte (C would cut it there)")
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{call}: {name} is not encodable as UTF-8 ({e.reason})") from None


def _path(call, value):
    try:
        value = os.fspath(value)
    except TypeError:
        raise TypeError(f"{call}: path must be a str or os.PathLike, "
                        f"not {type(value).__name__}") from None
    if isinstance(value, bytes):
        value = os.fsdecode(value)
    if "\0" in value:
        raise ValueError(f"{call}: path contains a NUL byte")
    return value


# --- Finding the library -----------------------------------------------------

def _prefix_candidates():
    here = os.path.dirname(os.path.abspath(__file__))
    d = os.path.dirname(here)
    for _ in range(6):  # package -> site-packages -> pythonX.Y -> lib -> prefix, or a bundle
        yield os.path.join(d, "lib", "libcapalloc.so")
        parent = os.path.dirname(d)
        if parent == d:
            break
        d = parent
    yield os.path.join(sys.prefix, "lib", "libcapalloc.so")


def library_path(path=None):
    """The libcapalloc.so this module uses (or would use, given `path`)."""
    if path is None and _lib_path is not None:
        return _lib_path
    if path is not None:
        path = _path("library_path", path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"capalloc: the library path {path!r} does not exist")
        return os.path.abspath(path)
    env = os.environ.get("CAPALLOC_LIBRARY")
    if env:
        if not os.path.isfile(env):
            raise FileNotFoundError(
                f"capalloc: CAPALLOC_LIBRARY={env!r} names no file (unset it to search the "
                "install prefix)")
        return os.path.abspath(env)
    for candidate in _prefix_candidates():
        if os.path.isfile(candidate):
            return os.path.abspath(candidate)
    found = ctypes.util.find_library("capalloc")
    if found:
        return found  # a name the loader resolves (ldconfig's cache)
    raise FileNotFoundError(
        "capalloc: libcapalloc.so not found: pass its path, set CAPALLOC_LIBRARY, or install "
        "it under the prefix this package is installed in (lib/libcapalloc.so)")


def _declare(lib):
    c_int, c_u64, c_size, c_void_p, c_char_p = (ctypes.c_int, ctypes.c_uint64, ctypes.c_size_t,
                                                ctypes.c_void_p, ctypes.c_char_p)
    out_str = ctypes.POINTER(ctypes.c_char_p)
    lib.capalloc_last_error.restype = c_char_p
    lib.capalloc_last_error.argtypes = []
    lib.capalloc_runtime_name.restype = c_char_p
    lib.capalloc_runtime_name.argtypes = []
    for name in ("capalloc_check", "capalloc_snapshot"):
        getattr(lib, name).argtypes = [out_str]
    lib.capalloc_preallocate.argtypes = [c_int, c_char_p, c_size, ctypes.POINTER(c_void_p)]
    lib.capalloc_get.argtypes = [c_int, c_char_p, ctypes.POINTER(c_void_p)]
    lib.capalloc_release_persistent.argtypes = [c_int, c_char_p]
    lib.capalloc_set_strict.argtypes = [c_int]
    lib.capalloc_waive.argtypes = [c_u64, c_void_p, c_char_p, c_char_p]
    lib.capalloc_empty_cache.argtypes = [c_int]
    lib.capalloc_malloc_tagged.argtypes = [ctypes.POINTER(c_void_p), c_size, c_int, c_void_p,
                                           c_char_p, c_int]
    lib.capalloc_free.argtypes = [c_void_p]
    lib.capalloc_get_stats.argtypes = [c_int, ctypes.POINTER(_Stats)]
    if hasattr(lib, "capalloc_checkpoint"):
        lib.capalloc_checkpoint.argtypes = [ctypes.POINTER(c_u64)]
        lib.capalloc_live_since.argtypes = [c_u64, out_str]
        lib.capalloc_set_record_stacks.argtypes = [c_int]
        lib.capalloc_push_tag.argtypes = [c_char_p, c_char_p]
        lib.capalloc_pop_tag.argtypes = []
        if hasattr(lib, "capalloc_set_tag"):
            lib.capalloc_set_tag.argtypes = [c_char_p, c_char_p]
        lib.capalloc_trace_start.argtypes = [c_char_p]
        lib.capalloc_trace_stop.argtypes = []
    if hasattr(lib, "capalloc_get_strict"):
        lib.capalloc_get_strict.argtypes = [ctypes.POINTER(c_int)]
    if hasattr(lib, "capalloc_torch_begin_allocate_to_pool"):
        lib.capalloc_torch_begin_allocate_to_pool.argtypes = [c_int, c_u64, c_u64, c_void_p,
                                                              c_void_p]
        lib.capalloc_torch_end_allocate_to_pool.argtypes = [c_int, c_u64, c_u64, out_str]
        lib.capalloc_torch_release_pool.argtypes = [c_int, c_u64, c_u64]
    if hasattr(lib, "capalloc_release_on_stream"):
        lib.capalloc_release_on_stream.argtypes = [c_void_p, c_int, _RELEASE_FN, c_void_p,
                                                   c_void_p, c_size]
        lib.capalloc_release_pending.argtypes = [ctypes.POINTER(c_u64)]
        lib.capalloc_release_drain.argtypes = []
        lib.capalloc_dlpack_import.argtypes = [c_void_p, c_void_p, ctypes.POINTER(c_void_p),
                                               ctypes.POINTER(c_size)]
        lib.capalloc_dlpack_release.argtypes = [c_void_p]
        lib.capalloc_dlpack_import_token.argtypes = [c_void_p, c_void_p,
                                                     ctypes.POINTER(c_void_p),
                                                     ctypes.POINTER(c_size),
                                                     ctypes.POINTER(c_u64)]
        lib.capalloc_dlpack_release_token.argtypes = [c_void_p, c_u64]
    if hasattr(lib, "capalloc_torch_pool"):
        lib.capalloc_torch_pool.argtypes = [c_int, c_u64, c_u64, ctypes.POINTER(c_u64),
                                            ctypes.POINTER(c_int)]


def load(path=None):
    """Loads the library once; later calls return the same handle (a later
    `path` naming another file is an error)."""
    global _lib, _lib_path
    if _lib is not None:
        if path is not None and not _same_file(library_path(path), _lib_path):
            raise CapallocError("load", 4, f"already loaded from {_lib_path!r}; one library "
                                "per process")
        return _lib
    resolved = library_path(path)
    lib = ctypes.CDLL(resolved, mode=ctypes.RTLD_GLOBAL)
    if not hasattr(lib, "capalloc_last_error"):
        raise CapallocError("load", 1, f"{resolved!r} is not a capalloc library (it has no "
                            "capalloc_last_error)")
    _declare(lib)
    _lib, _lib_path = lib, resolved
    return lib


def _same_file(a, b):
    """Whether two library paths name one file (a symlink names its target)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return a == b


def _message(lib):
    return (lib.capalloc_last_error() or b"").decode("utf-8", errors="replace")


def _call(name, *args):
    lib = load()
    status = getattr(lib, name)(*args)
    if status != _OK:
        raise CapallocError(name, status, _message(lib))


def _json(raw):
    # The JSON writer replaces invalid UTF-8 with U+FFFD; decode leniently all
    # the same, so that no byte from C can make a call raise UnicodeDecodeError.
    return json.loads(raw.decode("utf-8", errors="replace"))


# --- PyTorch -----------------------------------------------------------------

_PLAIN_HOOKS = ("malloc", "free")
_ALL_HOOKS = ("malloc", "free", "record_stream", "empty_cache", "begin_allocate_to_pool",
              "end_allocate_to_pool", "release_pool")
_install_state = {"route": None, "shim_error": None}
_shim = None


def install(path=None, use_shim="auto"):
    """Makes capalloc PyTorch's CUDA allocator. Call before the first CUDA
    allocation of the process (PyTorch refuses to switch after it).

    use_shim="auto" (default) builds the C++ shim (python/capalloc/
    _torch_shim.cpp, cached) when PyTorch's headers and a C++ compiler are
    there, else falls back to plain CUDAPluggableAllocator (malloc and free
    only); True requires the shim (an error says why it could not be built);
    False never builds it. active_hooks() says what is active."""
    if use_shim not in (True, False, "auto"):
        raise ValueError(f"install: use_shim must be True, False or 'auto', not {use_shim!r}")
    import torch  # only install() needs PyTorch

    global _shim
    resolved = library_path(path)
    load(resolved)
    if use_shim:
        from . import _shim_build
        try:
            _shim = _shim_build.build()
        except Exception as e:  # noqa: BLE001: the reason is reported, not swallowed
            if use_shim is True:
                raise
            _install_state["shim_error"] = f"{type(e).__name__}: {e}"
        else:
            _shim.install(resolved)
            _install_state["route"] = "shim"
            return _shim
    allocator = torch.cuda.memory.CUDAPluggableAllocator(
        resolved, "capalloc_torch_malloc", "capalloc_torch_free")
    torch.cuda.memory.change_current_allocator(allocator)
    _install_state["route"] = "pluggable"
    return allocator


def active_hooks():
    """Which of PyTorch's allocator hooks reach capalloc after install():
    {"route": "shim" | "pluggable" | None, "active": [...], "inactive": [...],
    "calls": {hook: times called} (shim only), "shim_error": why the shim
    could not be built (install(use_shim="auto") fell back), or None}."""
    route = _install_state["route"]
    active = list(_ALL_HOOKS if route == "shim" else _PLAIN_HOOKS if route else ())
    return {
        "route": route,
        "active": active,
        "inactive": [h for h in _ALL_HOOKS if h not in active],
        "calls": dict(_shim.hook_counts()) if route == "shim" else {},
        "shim_error": _install_state["shim_error"],
    }


def last_capture_findings():
    """The findings capalloc returned at the end of the last capture through
    the shim (PyTorch's endAllocateToPool, before the graph's first replay),
    as Finding objects; [] before any, or without the shim."""
    if _install_state["route"] != "shim":
        return []
    return [Finding(f) for f in json.loads(_shim.findings_of_last_end())]


def torch_pool(device, pool_id):
    """The capalloc graph pool that stands for PyTorch's pool `pool_id` (a
    pair of ints, as torch.cuda.graph_pool_handle() returns) on `device`, and
    how many captures use it: {"pool": handle, "uses": n}. CapallocError
    (not found) when no capture uses it (the shim's pool hooks only)."""
    device = _device("torch_pool", device)
    try:
        if not isinstance(pool_id, (tuple, list)):
            raise TypeError
        a, b = pool_id
    except (TypeError, ValueError):
        raise TypeError("torch_pool: pool_id must be a pair of ints (MempoolId_t), "
                        f"not {pool_id!r}") from None
    a = _int("torch_pool", "pool_id[0]", a, 0, _UINT64_MAX)
    b = _int("torch_pool", "pool_id[1]", b, 0, _UINT64_MAX)
    pool, uses = ctypes.c_uint64(), ctypes.c_int()
    _call("capalloc_torch_pool", device, a, b, ctypes.byref(pool), ctypes.byref(uses))
    return {"pool": pool.value, "uses": uses.value}


# --- The check, buffers, stats -----------------------------------------------

def check():
    """Every captured graph against the live blocks now, as Finding objects.
    Captures that have ended since the last call are recorded first."""
    out = ctypes.c_char_p()
    _call("capalloc_check", ctypes.byref(out))
    return [Finding(f) for f in _json(out.value)]


def preallocate(device, key, nbytes):
    """Creates (or returns) the persistent buffer (device, key); returns its
    address. Refused while a capture is active: call it during warmup."""
    device = _device("preallocate", device)
    key = _text("preallocate", "key", key)
    nbytes = _int("preallocate", "nbytes", nbytes, 0, _SIZE_MAX)
    out = ctypes.c_void_p()
    sync_tag()  # the current task's tag scope, not the last one on this thread
    _call("capalloc_preallocate", device, key, nbytes, ctypes.byref(out))
    return out.value


def get(device, key):
    """The address of a preallocated buffer; never allocates."""
    device = _device("get", device)
    key = _text("get", "key", key)
    out = ctypes.c_void_p()
    _call("capalloc_get", device, key, ctypes.byref(out))
    return out.value


def release_persistent(device, key):
    """Frees the persistent buffer (device, key): the only way to free one
    (free() of its address is refused). The caller guarantees that no graph
    using it replays again."""
    device = _device("release_persistent", device)
    key = _text("release_persistent", "key", key)
    _call("capalloc_release_persistent", device, key)


def snapshot():
    """The allocator's and the tracker's state as a dict (docs/snapshot.md)."""
    out = ctypes.c_char_p()
    _call("capalloc_snapshot", ctypes.byref(out))
    return _json(out.value)


def set_strict(strict=True, possible=False):
    """Strict mode: replays through capalloc of graphs with hazards are
    refused, and with the shim a capture's end raises (at the end of the
    torch.cuda.graph block); with possible=True also `possible` findings
    (the footprint evidence of plain CUDAPluggableAllocator)."""
    for name, value in (("strict", strict), ("possible", possible)):
        if not isinstance(value, bool):
            raise TypeError(f"set_strict: {name} must be a bool, not {type(value).__name__}")
    if possible and not strict:
        raise ValueError("set_strict: possible=True needs strict=True (possible findings are "
                         "refused only in strict mode)")
    _call("capalloc_set_strict", (2 if possible else 1) if strict else 0)


def get_strict():
    """The strict mode now: 0 (off), 1 (hazards) or 2 (also possible findings)."""
    out = ctypes.c_int(-1)
    _call("capalloc_get_strict", ctypes.byref(out))
    return out.value


def waive(graph, victim, reason):
    """Marks the findings of `graph` (a finding's `graph` field) on `victim`
    as judged benign: strict mode then replays the graph despite them, and
    check() still lists them, with f.waived == {"reason": reason}. `victim`
    is an address inside a live block (an int, e.g. tensor.data_ptr()) or a
    tag (a str: every block with that tag)."""
    graph = _int("waive", "graph", graph, 0, _UINT64_MAX)
    reason = _text("waive", "reason", reason)
    if not reason:
        raise ValueError("waive: reason must be a non-empty str")
    if isinstance(victim, str):
        _call("capalloc_waive", graph, None, _text("waive", "victim", victim), reason)
    elif isinstance(victim, int) and not isinstance(victim, bool):
        _call("capalloc_waive", graph, _int("waive", "victim", victim, 1, _UINT64_MAX), None,
              reason)
    else:
        raise TypeError("waive: victim must be an address (int) or a tag (str), "
                        f"not {type(victim).__name__}")


class _Stats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int64) for name in (
        "allocated_bytes", "allocated_bytes_peak", "requested_bytes", "requested_bytes_peak",
        "reserved_bytes", "reserved_bytes_peak", "segments", "allocated_blocks", "free_blocks",
        "pending_free_blocks")] + [(name, ctypes.c_uint64) for name in (
        "allocations", "frees", "retries", "ooms")]


def memory_stats(device=0):
    """capalloc's figures for `device` in torch.cuda.memory_stats()'s key
    style (torch.cuda.memory_stats() itself raises under a pluggable
    allocator). Keys with no PyTorch equivalent are prefixed "capalloc."."""
    device = _device("memory_stats", device)
    s = _Stats()
    _call("capalloc_get_stats", device, ctypes.byref(s))
    return {
        "allocated_bytes.all.current": s.allocated_bytes,
        "allocated_bytes.all.peak": s.allocated_bytes_peak,
        "requested_bytes.all.current": s.requested_bytes,
        "requested_bytes.all.peak": s.requested_bytes_peak,
        "reserved_bytes.all.current": s.reserved_bytes,
        "reserved_bytes.all.peak": s.reserved_bytes_peak,
        "segment.all.current": s.segments,
        "allocation.all.current": s.allocated_blocks,
        "allocation.all.allocated": s.allocations,
        "allocation.all.freed": s.frees,
        "num_alloc_retries": s.retries,
        "num_ooms": s.ooms,
        "capalloc.free_blocks": s.free_blocks,
        "capalloc.pending_free_blocks": s.pending_free_blocks,
    }


def empty_cache(device=-1):
    """Returns capalloc's cached free segments of `device` (-1: every device)
    to the runtime; with the shim, torch.cuda.empty_cache() does the same."""
    device = _device("empty_cache", device, allow_all=True)
    _call("capalloc_empty_cache", device)


# --- Stream-ordered release and DLPack import (docs/lifetimes.md) -------------
#
# A release runs on capalloc's progress thread once the stream's work up to
# the request has completed. Python callbacks wait in _releases under a key
# that travels through C as the context; the trampoline takes the GIL (ctypes
# does), pops the callback and calls it. At interpreter exit, release_drain()
# runs what is pending while Python can still run callbacks.

_RELEASE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_releases = {}
_releases_lock = threading.Lock()
_release_keys = itertools.count(1)


def _run_release(context):
    with _releases_lock:
        callback = _releases.pop(context, None)
    if callback is not None:
        try:
            callback()
        except BaseException as e:  # never into C: print, as threading does
            print(f"capalloc: a release callback raised {e!r}", file=sys.stderr)


_release_trampoline = _RELEASE_FN(_run_release)

# Interpreter exit: once _drain_at_exit has run, Python can no longer be
# trusted to be alive when the C library's own exit handler runs (after
# finalization), so no new Python callback or deleter may reach the queue.
# _exit_lock makes "not yet drained, so queue it" one step against the drain.
_exit_lock = threading.RLock()
_exit_drained = False
# Counts the package's drains: an ImportedTensor imported before one was
# released by it (teardown releases every tensor still imported).
_drain_count = 0


def _refuse_after_exit_drain(call):
    if _exit_drained:
        raise CapallocError(call, 4, "the interpreter is exiting and capalloc's exit drain has "
                            "run: nothing imported or released now could run before Python is "
                            "finalized (release before exit, or in an atexit handler registered "
                            "after importing capalloc)")


def _stream(call, stream):
    """A stream as C takes it: None (the default stream), an int (a
    cudaStream_t's address, or a host-runtime handle), or an object with a
    `cuda_stream` attribute (torch.cuda.Stream)."""
    if stream is None:
        return None
    stream = getattr(stream, "cuda_stream", stream)
    return _int(call, "stream", stream, 0, _UINT64_MAX) or None


def release_on_stream(callback, stream=None, device=0, memory=None):
    """Calls `callback()` once the work enqueued on `stream` up to now has
    completed, on capalloc's thread; never waits. `memory`, (address, nbytes),
    names the memory the callback gives back: while a live graph reads or
    writes it, the release waits until that graph is destroyed. A release on
    a capturing stream waits until the capture's graph is gone."""
    if not callable(callback):
        raise TypeError(f"release_on_stream: callback must be callable, not "
                        f"{type(callback).__name__}")
    stream = _stream("release_on_stream", stream)
    device = _device("release_on_stream", device)
    ptr, nbytes = None, 0
    if memory is not None:
        try:
            ptr, nbytes = memory
        except (TypeError, ValueError):
            raise TypeError("release_on_stream: memory must be (address, nbytes)") from None
        ptr = _int("release_on_stream", "memory address", ptr, 1, _UINT64_MAX)
        nbytes = _int("release_on_stream", "memory nbytes", nbytes, 1, _SIZE_MAX)
    global _release_used
    key = next(_release_keys)
    with _exit_lock:
        _refuse_after_exit_drain("release_on_stream")
        with _releases_lock:
            _releases[key] = callback
        try:
            _call("capalloc_release_on_stream", stream, device, _release_trampoline, key, ptr,
                  nbytes)
        except BaseException:
            with _releases_lock:
                _releases.pop(key, None)
            raise
        _release_used = True  # only once something was queued: the exit drain has work


def release_pending():
    """Releases requested and not yet run."""
    out = ctypes.c_uint64()
    _call("capalloc_release_pending", ctypes.byref(out))
    return out.value


def release_drain():
    """Teardown now: releases every DLPack tensor still imported, then runs
    every pending release after its stream's work (those held by a live
    graph too). Called at interpreter exit."""
    global _drain_count
    _drain_count += 1  # before: a tensor imported during the drain is not marked
    _call("capalloc_release_drain")


_release_used = False  # set by release_on_stream and dlpack_import


@atexit.register
def _drain_at_exit():
    # Whatever is pending runs now, while Python can still run it: Python
    # callbacks, DLPack deleters too (a producer's deleter may take the GIL;
    # after finalization, from the C library's exit handler, it would crash
    # the interpreter), and the deleters of tensors imported and never
    # released (the library releases them, after their streams' work, and
    # logs a warning with their number).
    # From here on, release_on_stream, dlpack_import and release() refuse
    # (FAILED_PRECONDITION): what they queued would run from the library's
    # exit handler, after finalization, and crash the interpreter.
    # The lock is not held while draining: a callback run by the drain may
    # request a release (which the drained queue runs at once). Draining
    # again after the flag is set catches what was imported meanwhile.
    global _exit_drained, _drain_count

    def drain():
        global _drain_count
        _drain_count += 1
        if _release_used and _lib is not None and hasattr(_lib, "capalloc_release_drain"):
            if _lib.capalloc_release_drain() != _OK:
                print(f"capalloc: release_drain at exit: {_message(_lib)}", file=sys.stderr)

    drain()
    with _exit_lock:
        _exit_drained = True
    drain()


_pythonapi = ctypes.pythonapi
_pythonapi.PyCapsule_IsValid.restype = ctypes.c_int
_pythonapi.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_pythonapi.PyCapsule_GetPointer.restype = ctypes.c_void_p
_pythonapi.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_pythonapi.PyCapsule_SetName.restype = ctypes.c_int
_pythonapi.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]


class ImportedTensor:
    """A DLPack tensor capalloc owns until release(): `data` (the address of
    its first element) and `nbytes` (the bytes it addresses)."""

    def __init__(self, managed, data, nbytes, stream, token=0):
        self._managed = managed
        self._token = token  # this import's number: a stale handle releases nothing else
        self._drains = _drain_count
        self._released = False
        self.data = data
        self.nbytes = nbytes
        self.stream = stream

    @property
    def released(self):
        """True once release() succeeded or a drain (release_drain(), the
        exit drain) released the tensor."""
        return self._released or self._drains != _drain_count

    def release(self):
        """Gives the tensor back: its deleter runs once the work enqueued on
        the import's stream up to now has completed. Never waits. A second
        release, or one after release_drain() released the tensor, raises
        CapallocError (not found) and touches nothing: the producer may have
        reused the DLManagedTensor for another import."""
        if self.released:
            raise CapallocError("capalloc_dlpack_release", 3, "this ImportedTensor was "
                                "released already (by release() or by a drain); its deleter "
                                "has run or will run once")
        _call("capalloc_dlpack_release_token", self._managed, self._token)
        self._released = True

    def __repr__(self):
        return f"<capalloc.ImportedTensor data=0x{self.data or 0:x} nbytes={self.nbytes}>"


def dlpack_import(tensor, stream=None):
    """Imports a DLPack tensor (an object with __dlpack__, or a "dltensor"
    capsule) for use on `stream`. The capsule is consumed (renamed
    "used_dltensor", as the protocol asks); its deleter runs only after
    ImportedTensor.release() and the stream's work up to it. Device types:
    kDLCPU on the host runtime, kDLCUDA on cuda, kDLROCM on hip."""
    c_stream = _stream("dlpack_import", stream)
    capsule = tensor
    if hasattr(tensor, "__dlpack__"):
        capsule = tensor.__dlpack__() if c_stream is None else tensor.__dlpack__(stream=c_stream)
    if type(capsule).__name__ != "PyCapsule":
        raise TypeError("dlpack_import: expected an object with __dlpack__ or a DLPack capsule, "
                        f"not {type(capsule).__name__}")
    if not _pythonapi.PyCapsule_IsValid(capsule, b"dltensor"):
        raise ValueError("dlpack_import: the capsule is not an unconsumed \"dltensor\" (it was "
                         "imported already)")
    managed = _pythonapi.PyCapsule_GetPointer(capsule, b"dltensor")
    data = ctypes.c_void_p()
    nbytes = ctypes.c_size_t()
    token = ctypes.c_uint64()
    global _release_used
    with _exit_lock:
        _refuse_after_exit_drain("dlpack_import")
        _call("capalloc_dlpack_import_token", managed, c_stream, ctypes.byref(data),
              ctypes.byref(nbytes), ctypes.byref(token))
        _release_used = True
        _pythonapi.PyCapsule_SetName(capsule, b"used_dltensor")
        return ImportedTensor(managed, data.value, nbytes.value, c_stream, token.value)


# --- Retention audit and event trace -----------------------------------------

def checkpoint():
    """A point in the allocation order (an int): live_since(checkpoint) lists
    the blocks allocated after it that are still live. Also remembered as the
    latest checkpoint, which snapshot()["audit"] reports against."""
    out = ctypes.c_uint64()
    _call("capalloc_checkpoint", ctypes.byref(out))
    return out.value


def live_since(checkpoint):
    """The blocks allocated after `checkpoint` and still live, grouped by tag
    and allocation site: {"checkpoint", "blocks", "bytes", "groups": [{"tag",
    "site", "location", "stack", "blocks", "bytes", "requested_bytes",
    "block_list": [{"ptr", "size", "requested", "sequence", "device",
    "stream"}]}]}, most bytes first (docs/snapshot.md, the audit section)."""
    checkpoint = _int("live_since", "checkpoint", checkpoint, 0, _UINT64_MAX)
    out = ctypes.c_char_p()
    _call("capalloc_live_since", checkpoint, ctypes.byref(out))
    return _json(out.value)


def record_stacks(on=True):
    """Records the C++ call stack of each allocation from now on (as
    CAPALLOC_STACKS=1 does from the start); live_since() then reports each
    group's stack. Behind PyTorch the stack shows PyTorch's frames only: tag()
    names the Python call site."""
    if not isinstance(on, bool):
        raise TypeError(f"record_stacks: on must be a bool, not {type(on).__name__}")
    _call("capalloc_set_record_stacks", 1 if on else 0)


# Tag scopes follow contextvars: each asyncio task (and each thread, and
# each contextvars.Context a caller runs code in) sees the scopes it entered
# itself. The stack is a tuple in a ContextVar; entering a scope sets a
# longer tuple and keeps the token, leaving resets to exactly what the
# entry saw. The C side keeps one current tag per thread, so the package
# tells it (capalloc_set_tag) the current context's innermost scope when a
# scope is entered or left, and before each allocation the package makes
# itself (sync_tag).
_tag_stack = contextvars.ContextVar("capalloc_tag_stack", default=())
_tags_used = False  # set by the first scope entered: until then C needs no telling
_MAX_TAG_SCOPES = 64


def sync_tag():
    """Tells capalloc's C side the current context's innermost tag scope (or
    none) as the calling thread's tag. tag() does it on entering and leaving
    a scope; in asyncio code, call it after an await and before allocating
    through PyTorch, so that the allocations get this task's tag and not the
    tag of whichever task entered or left a scope last on the thread."""
    stack = _tag_stack.get()
    if not stack and not _tags_used:
        return  # no scope was ever entered: nothing to tell C
    lib = load()
    if not hasattr(lib, "capalloc_set_tag"):
        raise CapallocError("tag", 5, "this libcapalloc has no capalloc_set_tag (too old)")
    name, site = (stack[-1][0], stack[-1][1]) if stack else (None, None)
    _call("capalloc_set_tag", name, site)


class tag:
    """with capalloc.tag("decoder.layer3"): ... tags the allocations made
    inside the block without a tag of their own (PyTorch's included) with the
    tag, and names the call site that entered the block ("file.py:12 in
    forward") as their allocation site. Scopes nest; the innermost applies.

    Scopes belong to the current contextvars context: each asyncio task
    (and each thread) has its own, so two tasks that interleave their tag
    scopes on one thread do not see or close each other's, and leaving a
    scope restores exactly what was current when it was entered. capalloc's
    C side keeps one current tag per thread: it is set from the current
    context when a scope is entered or left and before the package's own
    allocating calls (preallocate). An allocation PyTorch makes directly
    gets the tag of the scope most recently entered or left on that thread
    (by any task): in asyncio code, enter the scope in the task, around the
    code that allocates, without awaiting another task's allocations inside
    it, or call capalloc.sync_tag() after an await (docs/lifetimes.md)."""

    def __init__(self, name):
        self._name = _text("tag", "name", name)

    def __enter__(self):
        global _tags_used
        frame = sys._getframe(1)  # the frame whose `with` statement entered
        site = f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"
        del frame  # no frame kept alive by the scope (seed 002)
        site = _text("tag", "site", site)
        stack = _tag_stack.get()
        if len(stack) >= _MAX_TAG_SCOPES:
            raise CapallocError("tag", 2, f"{_MAX_TAG_SCOPES} tag scopes are already open in "
                                "this context; is a scope never left?")
        # The entry keeps its owner and its token: one tag object may be
        # entered by several tasks at once, and each exit must find its own.
        entry = [self._name, site, self, None]
        token = _tag_stack.set(stack + (entry,))
        entry[3] = token
        try:
            _tags_used = True
            sync_tag()
        except BaseException:
            _tag_stack.reset(token)
            raise
        return self

    def __exit__(self, exc_type, exc, tb):
        stack = _tag_stack.get()
        # This object's innermost scope in the current context: what its
        # entry saw is restored, whatever other tasks did meanwhile.
        for i in range(len(stack) - 1, -1, -1):
            if stack[i][2] is self:
                try:
                    _tag_stack.reset(stack[i][3])
                except (ValueError, RuntimeError):  # a token of another context (a task's parent)
                    _tag_stack.set(stack[:i])
                break
        sync_tag()
        return False


def trace_start(path):
    """Writes the event trace (docs/trace.md, JSON Lines) to `path` from now
    on: every alloc, free and record_stream, captures, replays and findings.
    CAPALLOC_TRACE=path does the same from the start."""
    path = _path("trace_start", path)
    _call("capalloc_trace_start", _text("trace_start", "path", path))


def trace_stop():
    """Writes what the trace buffered and closes its file."""
    _call("capalloc_trace_stop")
