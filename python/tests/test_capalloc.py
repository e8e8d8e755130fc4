"""Tests of the installed capalloc package over the C ABI, on the host runtime
(no GPU, no PyTorch). Run by CTest (tests/python_package_test.sh) from
outside the source tree, with the package pip-installed into a temporary
virtual environment, CAPALLOC_LIBRARY naming the built libcapalloc.so and
CAPALLOC_RUNTIME=host. The library-search cases run in child interpreters,
since a process loads one library once."""

import ctypes
import json
import os
import subprocess
import sys
import tempfile
import threading
import unittest

import capalloc

LIBRARY = os.environ["CAPALLOC_LIBRARY"]


def run_child(code, env_changes, cwd=None):
    env = dict(os.environ)
    for key, value in env_changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          cwd=cwd or tempfile.gettempdir(), timeout=120)


class InstalledPackageTest(unittest.TestCase):
    def test_imported_from_site_packages_not_the_source_tree(self):
        here = os.path.dirname(os.path.abspath(capalloc.__file__))
        self.assertIn("site-packages", here)
        self.assertTrue(os.path.isfile(os.path.join(here, "_torch_shim.cpp")))

    def test_library_loads_and_runs_on_the_host_runtime(self):
        lib = capalloc.load()
        self.assertEqual(lib.capalloc_runtime_name(), b"host")
        self.assertEqual(capalloc.library_path(), os.path.abspath(LIBRARY))


class LibrarySearchTest(unittest.TestCase):
    def test_explicit_path_that_does_not_exist_is_an_error(self):
        # It used to load CAPALLOC_LIBRARY instead, silently.
        p = run_child("import capalloc\n"
                      "try:\n    capalloc.load('/nonexistent/libcapalloc.so')\n"
                      "except FileNotFoundError as e:\n    print('refused:', e)\n",
                      {"CAPALLOC_LIBRARY": LIBRARY})
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("refused:", p.stdout)
        self.assertIn("/nonexistent/libcapalloc.so", p.stdout)

    def test_explicit_path_comes_before_the_variable(self):
        p = run_child("import capalloc\ncapalloc.load(%r)\nprint(capalloc.library_path())\n"
                      % LIBRARY,
                      {"CAPALLOC_LIBRARY": "/nonexistent/other.so"})
        # An explicit path wins; the variable is not even looked at.
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout.strip(), os.path.abspath(LIBRARY))

    def test_variable_naming_no_file_is_an_error(self):
        p = run_child("import capalloc\ncapalloc.load()\n",
                      {"CAPALLOC_LIBRARY": "/nonexistent/libcapalloc.so"})
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("CAPALLOC_LIBRARY", p.stderr)
        self.assertIn("FileNotFoundError", p.stderr)

    def test_a_library_that_is_not_capalloc_is_refused_clearly(self):
        import _ctypes  # a shared object that surely loads, and is not capalloc
        libm = _ctypes.__file__
        p = run_child("import capalloc\n"
                      "try:\n    capalloc.load(%r)\n"
                      "except capalloc.CapallocError as e:\n    print('refused:', e)\n" % libm,
                      {"CAPALLOC_LIBRARY": None}, cwd=tempfile.gettempdir())
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("is not a capalloc library", p.stdout)

    def test_a_symlink_to_the_loaded_library_is_the_same_library(self):
        with tempfile.TemporaryDirectory() as d:
            link = os.path.join(d, "libcapalloc.so")
            os.symlink(os.path.abspath(LIBRARY), link)
            p = run_child("import capalloc\ncapalloc.load(%r)\ncapalloc.load(%r)\nprint('ok')\n"
                          % (LIBRARY, link), {})
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn("ok", p.stdout)

    def test_install_prefix_is_searched_last(self):
        # The virtual environment is the install prefix: its lib/libcapalloc.so.
        prefix_lib = os.path.join(sys.prefix, "lib", "libcapalloc.so")
        self.assertFalse(os.path.exists(prefix_lib))
        os.symlink(os.path.abspath(LIBRARY), prefix_lib)
        try:
            p = run_child("import capalloc\ncapalloc.load()\nprint(capalloc.library_path())\n",
                          {"CAPALLOC_LIBRARY": None})
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertEqual(p.stdout.strip(), prefix_lib)
            p = run_child("import capalloc\ncapalloc.load()\nprint(capalloc.library_path())\n",
                          {"CAPALLOC_LIBRARY": os.path.abspath(LIBRARY)})
            self.assertEqual(p.stdout.strip(), os.path.abspath(LIBRARY))
        finally:
            os.unlink(prefix_lib)


# A stand-in for PyTorch with no C++ headers: what install() does where the
# shim cannot be built (the real PyTorch path is tools/gpu/torch_shim_check.py).
FAKE_TORCH = """
import os, sys, tempfile, types
calls = []
class PluggableAllocator:
    def __init__(self, path, alloc_fn, free_fn):
        calls.append(("CUDAPluggableAllocator", path, alloc_fn, free_fn))
torch = types.ModuleType("torch")
torch.__version__ = "0.0+no-headers"
torch.__file__ = os.path.join(tempfile.mkdtemp(), "torch", "__init__.py")
torch.version = types.SimpleNamespace(cuda="13.0")
torch._C = types.SimpleNamespace(_GLIBCXX_USE_CXX11_ABI=True)
torch.cuda = types.SimpleNamespace(
    is_available=lambda: True,
    memory=types.SimpleNamespace(
        CUDAPluggableAllocator=PluggableAllocator,
        change_current_allocator=lambda a: calls.append(("change_current_allocator",))))
sys.modules["torch"] = torch
import capalloc
"""


class InstallFallbackTest(unittest.TestCase):
    def test_auto_falls_back_to_plain_pluggable_and_says_why(self):
        p = run_child(FAKE_TORCH + (
            "capalloc.install(use_shim='auto')\n"
            "import json\n"
            "print(json.dumps({'hooks': capalloc.active_hooks(), 'calls': calls}))\n"), {})
        self.assertEqual(p.returncode, 0, p.stderr)
        out = json.loads(p.stdout)
        hooks = out["hooks"]
        self.assertEqual(hooks["route"], "pluggable")
        self.assertEqual(hooks["active"], ["malloc", "free"])
        self.assertIn("end_allocate_to_pool", hooks["inactive"])
        self.assertIn("C++ headers", hooks["shim_error"])
        self.assertEqual(out["calls"][0], ["CUDAPluggableAllocator", os.path.abspath(LIBRARY),
                                           "capalloc_torch_malloc", "capalloc_torch_free"])
        self.assertEqual(out["calls"][1], ["change_current_allocator"])

    def test_use_shim_true_raises_the_reason(self):
        p = run_child(FAKE_TORCH + "capalloc.install(use_shim=True)\n", {})
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("ShimBuildError", p.stderr)
        self.assertIn("C++ headers", p.stderr)

    def test_use_shim_false_never_builds_it(self):
        p = run_child(FAKE_TORCH + (
            "capalloc.install(use_shim=False)\n"
            "print(capalloc.active_hooks()['route'], capalloc.active_hooks()['shim_error'])\n"),
            {})
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout.split(), ["pluggable", "None"])


class ArgumentTest(unittest.TestCase):
    def test_integers_out_of_range_raise_instead_of_wrapping(self):
        # device 2**40 used to become 0, a size of 2**64 to become 0.
        with self.assertRaisesRegex(ValueError, "preallocate: device"):
            capalloc.preallocate(2**40, "py.range", 64)
        with self.assertRaisesRegex(ValueError, "preallocate: nbytes"):
            capalloc.preallocate(0, "py.range", 2**64)
        with self.assertRaisesRegex(ValueError, "preallocate: nbytes"):
            capalloc.preallocate(0, "py.range", -1)
        with self.assertRaisesRegex(ValueError, "get: device"):
            capalloc.get(-1, "py.range")
        with self.assertRaisesRegex(ValueError, "waive: graph"):
            capalloc.waive(2**64, "WS", "benign")
        with self.assertRaisesRegex(ValueError, "memory_stats: device"):
            capalloc.memory_stats(2**31)
        with self.assertRaisesRegex(ValueError, "empty_cache: device"):
            capalloc.empty_cache(-2)
        # Nothing was created under that key.
        with self.assertRaises(capalloc.CapallocError):
            capalloc.get(0, "py.range")

    def test_nul_bytes_in_strings_raise_instead_of_truncating(self):
        capalloc.preallocate(0, "py.nul", 64)
        with self.assertRaisesRegex(ValueError, "preallocate: key contains a NUL byte"):
            capalloc.preallocate(0, "py.nul\0suffix", 64)
        with self.assertRaisesRegex(ValueError, "get: key contains a NUL byte"):
            capalloc.get(0, "py.nul\0suffix")  # used to return py.nul's buffer
        with self.assertRaisesRegex(ValueError, "waive: reason"):
            capalloc.waive(1, "WS", "a\0b")

    def test_wrong_types_raise_type_error_naming_the_argument(self):
        # None used to give AttributeError.
        with self.assertRaisesRegex(TypeError, "preallocate: key must be a str, not NoneType"):
            capalloc.preallocate(0, None, 64)
        with self.assertRaisesRegex(TypeError, "get: device must be an int, not NoneType"):
            capalloc.get(None, "k")
        with self.assertRaisesRegex(TypeError, "preallocate: nbytes must be an int, not float"):
            capalloc.preallocate(0, "k", 64.0)
        with self.assertRaisesRegex(TypeError, "get: device must be an int, not bool"):
            capalloc.get(True, "k")
        with self.assertRaisesRegex(TypeError, "get: key must be a str, not bytes"):
            capalloc.get(0, b"k")
        with self.assertRaisesRegex(TypeError, "waive: reason must be a str"):
            capalloc.waive(1, "WS", None)
        with self.assertRaisesRegex(TypeError, "waive: victim"):
            capalloc.waive(1, 1.5, "benign")
        with self.assertRaisesRegex(TypeError, "set_strict: strict must be a bool"):
            capalloc.set_strict(None)
        with self.assertRaisesRegex(TypeError, "library_path: path must be"):
            capalloc.library_path(42)
        with self.assertRaisesRegex(ValueError, "install: use_shim"):
            capalloc.install(use_shim="sometimes")

    def test_waive_checks_its_arguments_before_c(self):
        with self.assertRaises(ValueError):
            capalloc.waive(1, "WS", "")
        with self.assertRaises(capalloc.CapallocError) as unknown:
            capalloc.waive(987654321, "WS", "benign")
        self.assertEqual(unknown.exception.status, 3)


class CallTest(unittest.TestCase):
    def test_preallocate_then_get_returns_the_same_buffer(self):
        ptr = capalloc.preallocate(0, "py.workspace", 1 << 20)
        self.assertTrue(ptr)
        self.assertEqual(capalloc.get(0, "py.workspace"), ptr)
        self.assertEqual(capalloc.preallocate(0, "py.workspace", 1 << 10), ptr)

    def test_release_persistent_is_the_way_to_free_a_persistent_buffer(self):
        # Issue 11: a plain free of a persistent buffer is refused and names
        # this call; release_persistent frees it, once.
        ptr = capalloc.preallocate(0, "py.release", 1 << 16)
        lib = capalloc.load()
        self.assertEqual(lib.capalloc_free(ptr), 4)  # FAILED_PRECONDITION
        self.assertIn(b"capalloc.release_persistent(0, \"py.release\")",
                      lib.capalloc_last_error())
        self.assertEqual(capalloc.get(0, "py.release"), ptr)
        capalloc.release_persistent(0, "py.release")
        with self.assertRaises(capalloc.CapallocError) as gone:
            capalloc.get(0, "py.release")
        self.assertEqual(gone.exception.status, 3)
        with self.assertRaises(capalloc.CapallocError) as twice:
            capalloc.release_persistent(0, "py.release")
        self.assertEqual(twice.exception.status, 3)
        with self.assertRaisesRegex(TypeError, "release_persistent: key must be a str"):
            capalloc.release_persistent(0, None)

    def test_errors_raise_with_capallocs_message(self):
        with self.assertRaises(capalloc.CapallocError) as cold:
            capalloc.get(0, "py.never.warmed")
        self.assertIn("preallocate", str(cold.exception))
        self.assertEqual(cold.exception.status, 3)
        with self.assertRaises(capalloc.CapallocError):
            capalloc.preallocate(0, "py.workspace.big", 0)

    def test_check_returns_findings_objects(self):
        findings = capalloc.check()
        self.assertIsInstance(findings, list)
        for f in findings:
            self.assertIsInstance(f, capalloc.Finding)

    def test_snapshot_describes_devices_blocks_and_graphs(self):
        capalloc.preallocate(0, "py.snapshot", 4096)
        state = capalloc.snapshot()
        self.assertEqual(state["schema"], "capalloc.snapshot/4")
        self.assertEqual(state["runtime"], "host")
        tags = [b["tag"] for d in state["devices"] for b in d["live_blocks"]]
        self.assertIn("py.snapshot", tags)
        self.assertIn("graphs", state)
        self.assertIn("findings", state)

    def test_invalid_utf8_tag_reaches_python_as_replacement_characters(self):
        # A tag from C with invalid UTF-8: the JSON writer replaces it with
        # U+FFFD, and snapshot() parses it (it used to raise UnicodeDecodeError).
        lib = capalloc.load()
        p = ctypes.c_void_p()
        status = lib.capalloc_malloc_tagged(ctypes.byref(p), 256, 0, None, b"bad\xff\xfetag", 0)
        self.assertEqual(status, 0)
        try:
            state = capalloc.snapshot()
            tags = [b["tag"] for d in state["devices"] for b in d["live_blocks"]]
            self.assertIn("bad\ufffd\ufffdtag", tags)
            # The JSON is valid UTF-8 as it comes from C: a strict decode and
            # Python's json parse it.
            raw = ctypes.c_char_p()
            self.assertEqual(lib.capalloc_snapshot(ctypes.byref(raw)), 0)
            strict = json.loads(raw.value.decode("utf-8", errors="strict"))
            self.assertIn("bad\ufffd\ufffdtag",
                          [b["tag"] for d in strict["devices"] for b in d["live_blocks"]])
        finally:
            self.assertEqual(lib.capalloc_free(p), 0)

    def test_memory_stats_in_torchs_key_style(self):
        before = capalloc.memory_stats(0)
        ptr = capalloc.preallocate(0, "py.stats", 1 << 16)
        self.assertTrue(ptr)
        after = capalloc.memory_stats(0)
        for key in ("allocated_bytes.all.current", "allocated_bytes.all.peak",
                    "reserved_bytes.all.current", "requested_bytes.all.current",
                    "segment.all.current", "allocation.all.current", "allocation.all.allocated",
                    "allocation.all.freed", "num_alloc_retries", "num_ooms"):
            self.assertIn(key, after)
        self.assertEqual(after["allocated_bytes.all.current"],
                         before["allocated_bytes.all.current"] + (1 << 16))
        self.assertEqual(after["allocation.all.allocated"], before["allocation.all.allocated"] + 1)
        self.assertGreaterEqual(after["reserved_bytes.all.current"],
                                after["allocated_bytes.all.current"])
        with self.assertRaises(capalloc.CapallocError):
            capalloc.memory_stats(5)  # no such device on the host runtime

    def test_empty_cache_returns_cached_segments(self):
        capalloc.empty_cache()
        capalloc.empty_cache(0)
        self.assertGreaterEqual(capalloc.memory_stats(0)["reserved_bytes.all.current"], 0)

    def test_strict_mode_round_trips(self):
        try:
            capalloc.set_strict(True)
            self.assertEqual(capalloc.get_strict(), 1)
            capalloc.set_strict(True, possible=True)
            self.assertEqual(capalloc.get_strict(), 2)
        finally:
            capalloc.set_strict(False)
        self.assertEqual(capalloc.get_strict(), 0)

    def test_active_hooks_before_install(self):
        hooks = capalloc.active_hooks()
        self.assertIsNone(hooks["route"])
        self.assertEqual(hooks["active"], [])
        self.assertIn("record_stream", hooks["inactive"])

    def test_torch_pool_checks_its_arguments_and_reports_unknown_pools(self):
        with self.assertRaisesRegex(TypeError, "torch_pool: pool_id must be a pair"):
            capalloc.torch_pool(0, 5)
        with self.assertRaisesRegex(ValueError, r"torch_pool: pool_id\[1\]"):
            capalloc.torch_pool(0, (1, 2**64))
        with self.assertRaises(capalloc.CapallocError) as unknown:
            capalloc.torch_pool(0, (123456, 0))
        self.assertEqual(unknown.exception.status, 3)
        # A pool PyTorch's hooks began (through the C ABI, as the shim calls it).
        lib = capalloc.load()
        self.assertEqual(lib.capalloc_torch_begin_allocate_to_pool(0, 0, 4242, None, None), 0)
        try:
            info = capalloc.torch_pool(0, (0, 4242))
            self.assertEqual(info["uses"], 1)
            self.assertGreater(info["pool"], 0)
        finally:
            self.assertEqual(lib.capalloc_torch_end_allocate_to_pool(0, 0, 4242, None), 0)
            self.assertEqual(lib.capalloc_torch_release_pool(0, 0, 4242), 0)

    def test_finding_repr_never_raises(self):
        for fields in ({}, {"victim": None, "writer": 3}, {"severity": "hazard"}):
            self.assertIn("Finding(", repr(capalloc.Finding(fields)))

    def test_possible_without_strict_is_refused(self):
        before = capalloc.get_strict()
        with self.assertRaises(ValueError):
            capalloc.set_strict(False, possible=True)
        self.assertEqual(capalloc.get_strict(), before)

    def test_torch_pool_id_must_be_a_pair(self):
        with self.assertRaises(TypeError):
            capalloc.torch_pool(0, {1: 2, 3: 4})

    def test_finding_reads_its_fields(self):
        f = capalloc.Finding({
            "severity": "hazard", "graph_label": "g", "capture": 1, "evidence": "footprint",
            "victim": {"tag": "WS", "sequence": 4, "size": 1024, "ptr": "0x1"},
            "writer": {"tag": "T", "sequence": 2}, "overlap": {"bytes": 1024}, "fix": "x"})
        self.assertEqual(f.victim["tag"], "WS")
        self.assertIn("[hazard] g", str(f))


# A DLPack tensor made with ctypes (no numpy needed): the structs of
# <dlpack/dlpack.h>, a deleter that counts its calls, and a capsule named
# "dltensor" holding it, as a producer's __dlpack__ returns one.
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                             ("deleter", _DELETER)]
_KDLCPU, _KDLCUDA = 1, 2


class _Producer:
    """Exports one float32 tensor of n elements; counts its deleter's calls."""

    def __init__(self, n=16, device_type=_KDLCPU):
        self.buffer = (ctypes.c_float * n)()
        self.shape = (ctypes.c_int64 * 1)(n)
        self.deleted = 0
        self.deleter = _DELETER(self._delete)
        self.managed = _DLManagedTensor()
        self.managed.dl_tensor.data = ctypes.cast(self.buffer, ctypes.c_void_p)
        self.managed.dl_tensor.device = _DLDevice(device_type, 0)
        self.managed.dl_tensor.ndim = 1
        self.managed.dl_tensor.dtype = _DLDataType(2, 32, 1)
        self.managed.dl_tensor.shape = self.shape
        self.managed.deleter = self.deleter

    def _delete(self, _self):
        self.deleted += 1

    def capsule(self):
        new = ctypes.pythonapi.PyCapsule_New
        new.restype = ctypes.py_object
        new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        return new(ctypes.addressof(self.managed), b"dltensor", None)


def _wait_until_released():
    while capalloc.release_pending() != 0:
        pass


class ReleaseTest(unittest.TestCase):
    def test_release_on_stream_runs_the_callback_once_on_capallocs_thread(self):
        ran = []
        done = threading.Event()

        def callback():
            ran.append(threading.get_ident())
            done.set()

        capalloc.release_on_stream(callback)
        done.wait()
        _wait_until_released()
        self.assertEqual(len(ran), 1)
        self.assertNotEqual(ran[0], threading.get_ident())

    def test_release_on_stream_checks_its_arguments(self):
        with self.assertRaises(TypeError):
            capalloc.release_on_stream(42)
        with self.assertRaises(TypeError):
            capalloc.release_on_stream(lambda: None, memory=7)
        with self.assertRaises(ValueError):
            capalloc.release_on_stream(lambda: None, device=-1)
        with self.assertRaises(capalloc.CapallocError) as e:
            capalloc.release_on_stream(lambda: None, stream=0x7777)
        self.assertEqual(e.exception.status, 3)  # not found: an unknown stream
        self.assertEqual(capalloc.release_pending(), 0)

    def test_dlpack_import_then_release_calls_the_deleter_once(self):
        producer = _Producer()
        capsule = producer.capsule()
        imported = capalloc.dlpack_import(capsule)
        self.assertEqual(imported.data, ctypes.addressof(producer.buffer))
        self.assertEqual(imported.nbytes, 16 * 4)
        with self.assertRaises(ValueError):  # the capsule is consumed
            capalloc.dlpack_import(capsule)
        self.assertEqual(producer.deleted, 0)
        imported.release()
        _wait_until_released()
        self.assertEqual(producer.deleted, 1)
        with self.assertRaises(capalloc.CapallocError) as e:
            imported.release()
        self.assertEqual(e.exception.status, 3)

    def test_a_dlpack_tensor_never_released_is_released_at_exit(self):
        # Break test of issue 13: its deleter never ran. At interpreter exit
        # the package drains: the deleter runs, and the library says how many.
        code = (
            "import sys\n"
            "sys.path.insert(0, %r)\n"
            "import capalloc, test_capalloc\n"
            "producer = test_capalloc._Producer()\n"
            "producer.deleter = test_capalloc._DELETER(lambda m: print('deleter ran', flush=True))\n"
            "producer.managed.deleter = producer.deleter\n"
            "t = capalloc.dlpack_import(producer.capsule())\n"
            "print('imported', t.nbytes, flush=True)\n" % os.path.dirname(os.path.abspath(__file__)))
        child = run_child(code, {"CAPALLOC_LOG_LEVEL": "warn"})
        self.assertEqual(child.returncode, 0, child.stderr)
        self.assertEqual(child.stdout.split("\n")[:2], ["imported 64", "deleter ran"], child.stdout)
        self.assertIn("1 tensor(s) still imported at teardown were released", child.stderr)

    def test_a_second_release_never_releases_a_reused_struct(self):
        # Break test 13, item 2: a producer that reuses its DLManagedTensor
        # once the deleter has run gives the next import the same address; a
        # second release() of the first handle released the second import.
        producer = _Producer()
        first = capalloc.dlpack_import(producer.capsule())
        first.release()
        _wait_until_released()
        self.assertTrue(first.released)
        second = capalloc.dlpack_import(producer.capsule())  # the same struct
        with self.assertRaises(capalloc.CapallocError) as e:
            first.release()
        self.assertEqual(e.exception.status, 3)
        self.assertIn("released already", str(e.exception))
        _wait_until_released()
        self.assertEqual(producer.deleted, 1)  # the second import is untouched
        # The C ABI's token alone protects too (a handle made before the flag).
        stale = capalloc.ImportedTensor(first._managed, first.data, first.nbytes, None,
                                        first._token)
        with self.assertRaises(capalloc.CapallocError) as e:
            stale.release()
        self.assertIn("released already", str(e.exception))
        self.assertEqual(producer.deleted, 1)
        second.release()
        _wait_until_released()
        self.assertEqual(producer.deleted, 2)
        # A drain releases what is still imported: the handle then knows (in
        # a child: a drain here would stop this process's progress thread).
        code = ("import sys\n"
                "sys.path.insert(0, %r)\n"
                "import capalloc, test_capalloc\n"
                "p = test_capalloc._Producer()\n"
                "t = capalloc.dlpack_import(p.capsule())\n"
                "capalloc.release_drain()\n"
                "print(t.released, p.deleted)\n"
                "try:\n"
                "    t.release()\n"
                "except capalloc.CapallocError as e:\n"
                "    print('refused', e.status)\n" % os.path.dirname(os.path.abspath(__file__)))
        child = run_child(code, {"CAPALLOC_LOG_LEVEL": "error"})
        self.assertEqual(child.returncode, 0, child.stderr)
        self.assertEqual(child.stdout.splitlines(), ["True 1", "refused 3"], child.stdout)

    def test_import_after_the_exit_drain_is_refused_not_a_crash(self):
        # Break test 13, item 3: an atexit handler that runs after the
        # package's drain imported a tensor (or requested a release); the
        # library's own exit handler then ran the Python deleter after
        # finalization (SIGSEGV). Now both are refused with a clear error.
        code = (
            "import atexit, sys\n"
            "sys.path.insert(0, %r)\n"
            "keep = []\n"
            "def late():\n"
            "    import capalloc, test_capalloc\n"
            "    p = test_capalloc._Producer(); keep.append(p)\n"
            "    c = p.capsule(); keep.append(c)\n"
            "    for call in (lambda: capalloc.dlpack_import(c),\n"
            "                 lambda: capalloc.release_on_stream(lambda: None)):\n"
            "        try:\n"
            "            call(); print('accepted', flush=True)\n"
            "        except capalloc.CapallocError as e:\n"
            "            print('refused', e.status, e, flush=True)\n"
            "atexit.register(late)\n"
            "import capalloc\n"
            "capalloc.release_on_stream(lambda: None)\n" % os.path.dirname(os.path.abspath(__file__)))
        child = run_child(code, {})
        self.assertEqual(child.returncode, 0, child.stdout + child.stderr)
        lines = child.stdout.splitlines()
        self.assertEqual(len(lines), 2, child.stdout)
        for line in lines:
            self.assertTrue(line.startswith("refused 4"), line)
            self.assertIn("capalloc's exit drain has run", line)

    def test_a_failed_release_on_stream_leaves_no_exit_message(self):
        # Break test 13, item 8: _release_used was set before the call, so a
        # failed first release made the exit drain print a stale error.
        code = ("import capalloc\n"
                "try:\n"
                "    capalloc.release_on_stream(lambda: None, stream=0x7777)\n"
                "except capalloc.CapallocError:\n"
                "    pass\n")
        child = run_child(code, {})
        self.assertEqual(child.returncode, 0, child.stderr)
        self.assertNotIn("release_drain at exit", child.stderr)

    def test_a_forked_child_is_refused_a_release_and_exits(self):
        # Break test 13, item 11: a fork() child has no progress thread; its
        # release never ran and its exit hung joining the parent's thread.
        code = (
            "import os, sys, threading\n"
            "import capalloc\n"
            "done = threading.Event()\n"
            "capalloc.release_on_stream(done.set); done.wait()\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    try:\n"
            "        capalloc.release_on_stream(lambda: None)\n"
            "        print('child: accepted', flush=True)\n"
            "    except capalloc.CapallocError as e:\n"
            "        print('child: refused', e.status, e, flush=True)\n"
            "    sys.exit(0)\n"
            "_, status = os.waitpid(pid, 0)\n"
            "print('parent: child status', status, flush=True)\n"
            "ran = threading.Event()\n"
            "capalloc.release_on_stream(ran.set)\n"
            "print('parent: release ran', ran.wait(10), flush=True)\n")
        child = run_child(code, {})
        self.assertEqual(child.returncode, 0, child.stdout + child.stderr)
        lines = child.stdout.splitlines()
        self.assertTrue(lines[0].startswith("child: refused 4"), child.stdout)
        self.assertIn("fork() child", lines[0])
        self.assertEqual(lines[1:], ["parent: child status 0", "parent: release ran True"])

    def test_dlpack_import_refuses_a_device_the_runtime_cannot_serve(self):
        producer = _Producer(device_type=_KDLCUDA)
        capsule = producer.capsule()
        with self.assertRaises(capalloc.CapallocError) as e:
            capalloc.dlpack_import(capsule)
        self.assertEqual(e.exception.status, 1)
        self.assertIn("kDLCUDA", str(e.exception))
        # Nothing changed: the capsule is still the caller's.
        self.assertTrue(ctypes.pythonapi.PyCapsule_IsValid(ctypes.py_object(capsule), b"dltensor"))
        with self.assertRaises(TypeError):
            capalloc.dlpack_import(object())


if __name__ == "__main__":
    unittest.main()


class _DeviceBuffer:
    """A device buffer owned by a Python object, as a torch tensor owns its
    memory: allocated without a tag (as capalloc_torch_malloc is), freed when
    the object goes."""

    def __init__(self, nbytes):
        lib = capalloc.load()
        lib.capalloc_malloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t,
                                        ctypes.c_int, ctypes.c_void_p]
        p = ctypes.c_void_p()
        if lib.capalloc_malloc(ctypes.byref(p), nbytes, 0, None) != 0:
            raise RuntimeError(lib.capalloc_last_error())
        self._lib = lib
        self.ptr = p.value

    def __del__(self):
        self._lib.capalloc_free(self.ptr)


def _define_trivial_kernels_like_cute_4_6_1():
    """nvidia-cutlass-dsl 4.6.1's decorator (seed 002): binding its own frame
    to a local makes a frame -> locals -> frame cycle, which pins the caller's
    frame (f_back) and its locals until the cyclic collector runs."""
    cur_frame = sys._getframe()
    frame = cur_frame.f_back
    return frame is not None


class RetentionAuditTest(unittest.TestCase):
    def test_distinct_tags_are_bounded(self):
        # Break test 13, item 10: every distinct tag (a request id in each)
        # was interned for the life of the process: 1M tags, +588 MB. Past
        # 65536 distinct strings, new ones share one placeholder (warned once).
        code = (
            "import ctypes, capalloc\n"
            "lib = capalloc.load()\n"
            "lib.capalloc_malloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t,\n"
            "                                ctypes.c_int, ctypes.c_void_p]\n"
            "for i in range(70000):\n"
            "    lib.capalloc_set_tag(b'request-%d' % i, b'here')\n"
            "lib.capalloc_set_tag(None, None)\n"
            "cp = capalloc.checkpoint()\n"
            "with capalloc.tag('request-999999'):\n"
            "    p = ctypes.c_void_p(); lib.capalloc_malloc(ctypes.byref(p), 256, 0, None)\n"
            "print([g['tag'] for g in capalloc.live_since(cp)['groups']])\n")
        child = run_child(code, {"CAPALLOC_LOG_LEVEL": "warn"})
        self.assertEqual(child.returncode, 0, child.stderr)
        self.assertEqual(child.stdout.strip(), "['<capalloc: too many distinct tags>']")
        self.assertEqual(child.stderr.count("distinct tags, locations and names are interned"), 1,
                         child.stderr)

    def test_live_since_groups_by_what_it_shows(self):
        # Break test 13, item 6: with stacks recorded, allocations from one
        # Python line on threads of different depths made one group per raw
        # stack, each shown with the same tag, site and symbolized frames.
        capalloc.record_stacks(True)
        try:
            lib = capalloc.load()
            lib.capalloc_malloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t,
                                            ctypes.c_int, ctypes.c_void_p]
            cp = capalloc.checkpoint()
            ptrs = []
            lock = threading.Lock()

            def deep(n):
                if n:
                    return deep(n - 1)
                p = ctypes.c_void_p()
                self.assertEqual(lib.capalloc_malloc(ctypes.byref(p), 4096, 0, None), 0)
                with lock:
                    ptrs.append(p.value)

            threads = [threading.Thread(target=lambda: [deep(30) for _ in range(100)])
                       for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            live = capalloc.live_since(cp)
        finally:
            capalloc.record_stacks(False)
        for p in ptrs:
            lib.capalloc_free(ctypes.c_void_p(p))
        shown = [(g["tag"], g["site"], g["location"], tuple(g["stack"])) for g in live["groups"]]
        self.assertEqual(len(shown), len(set(shown)), shown)
        self.assertEqual(live["blocks"], 400)
        self.assertEqual(sum(g["blocks"] for g in live["groups"]), 400)
        self.assertEqual(sum(len(g["block_list"]) for g in live["groups"]), 400)

    def test_seed002_decorator_frame_cycle_pins_a_buffer_and_live_since_names_tag_and_site(self):
        import gc
        gc.disable()  # as CUDA-graph training loops run
        try:
            cp = capalloc.checkpoint()

            def probe_cuda_tensor():
                with capalloc.tag("probe.big"):
                    big = _DeviceBuffer(1 << 20)
                _define_trivial_kernels_like_cute_4_6_1()
                return big.ptr  # big dies with this frame, unless the frame is pinned

            ptr = probe_cuda_tensor()
            live = capalloc.live_since(cp)
            groups = [g for g in live["groups"] if g["tag"] == "probe.big"]
            self.assertEqual(len(groups), 1, live)
            g = groups[0]
            self.assertEqual(g["blocks"], 1)
            self.assertEqual(g["requested_bytes"], 1 << 20)
            self.assertEqual(int(g["block_list"][0]["ptr"], 16), ptr)
            # The site is the line of the `with capalloc.tag(...)` statement.
            self.assertIn("test_capalloc.py:", g["site"])
            self.assertTrue(g["site"].endswith(" in probe_cuda_tensor"), g["site"])
            self.assertEqual(g["location"], g["site"])
            # The snapshot's audit section lists the same, against the latest
            # checkpoint.
            audit = capalloc.snapshot()["audit"]
            self.assertEqual(audit["checkpoint"], cp)
            self.assertIn("probe.big", [x["tag"] for x in audit["groups"]])
            gc.collect()  # the collection that breaks the cycle frees it
            self.assertEqual([x for x in capalloc.live_since(cp)["groups"]
                              if x["tag"] == "probe.big"], [])
        finally:
            gc.enable()

    def test_seed002_fixed_decorator_leaves_nothing_behind(self):
        import gc
        gc.disable()
        try:
            cp = capalloc.checkpoint()

            def fixed_decorator():
                frame = sys._getframe().f_back  # 4.4.2: no local names the frame itself
                return frame is not None

            def probe():
                with capalloc.tag("probe.fixed"):
                    big = _DeviceBuffer(1 << 20)
                fixed_decorator()
                return big.ptr

            probe()
            self.assertEqual([x for x in capalloc.live_since(cp)["groups"]
                              if x["tag"] == "probe.fixed"], [])
        finally:
            gc.enable()

    def test_tag_scopes_nest_and_pop(self):
        cp = capalloc.checkpoint()
        with capalloc.tag("outer"):
            with capalloc.tag("inner"):
                inner = _DeviceBuffer(512)
            outer = _DeviceBuffer(512)
        untagged = _DeviceBuffer(512)
        tags = {g["tag"]: g["blocks"] for g in capalloc.live_since(cp)["groups"]}
        self.assertEqual(tags, {"inner": 1, "outer": 1, "": 1})
        del inner, outer, untagged
        self.assertEqual(capalloc.live_since(cp)["blocks"], 0)
        with self.assertRaises(capalloc.CapallocError):
            capalloc._call("capalloc_pop_tag")  # no scope open: an error, not a crash
        for _ in range(64):
            capalloc._call("capalloc_push_tag", b"deep", None)
        with self.assertRaises(capalloc.CapallocError) as raised:
            capalloc._call("capalloc_push_tag", b"too deep", None)
        self.assertIn("64 tag scopes", str(raised.exception))
        for _ in range(64):
            capalloc._call("capalloc_pop_tag")
        with self.assertRaises(TypeError):
            capalloc.tag(3)

    def test_tag_scopes_follow_asyncio_tasks(self):
        # Break test of issue 13: two tasks interleaving their scopes on one
        # thread closed each other's (the scopes were the thread's).
        import asyncio
        cp = capalloc.checkpoint()
        kept = []
        shared = capalloc.tag("shared")  # one object entered by both tasks

        async def task(name, first_wait, second_wait):
            with capalloc.tag(name):
                await asyncio.sleep(first_wait)
                capalloc.sync_tag()  # after an await, before allocating
                kept.append((name, _DeviceBuffer(256)))
                with shared:
                    await asyncio.sleep(second_wait)
                    capalloc.sync_tag()
                    kept.append(("shared", _DeviceBuffer(256)))
                await asyncio.sleep(0)
                capalloc.sync_tag()
                kept.append((name, _DeviceBuffer(256)))
            capalloc.sync_tag()
            kept.append(("", _DeviceBuffer(256)))

        async def main():
            # b enters and leaves `shared` while a waits inside it, and leaves
            # its own scope before a leaves `shared`.
            await asyncio.gather(task("task.a", 0, 0.05), task("task.b", 0.01, 0))

        asyncio.run(main())
        capalloc.sync_tag()
        expected = {}
        for name, _ in kept:
            expected[name] = expected.get(name, 0) + 1
        tags = {g["tag"]: g["blocks"] for g in capalloc.live_since(cp)["groups"]}
        self.assertEqual(tags, expected)
        self.assertEqual(expected, {"task.a": 2, "task.b": 2, "shared": 2, "": 2})
        del kept[:]
        # A scope left restores what its entry saw, in its own context: none here.
        self.assertEqual(capalloc._tag_stack.get(), ())

    def test_tag_scopes_are_per_thread_too(self):
        cp = capalloc.checkpoint()
        other = []
        with capalloc.tag("main.thread"):
            def work():
                other.append(_DeviceBuffer(256))  # a new thread: no scope of its own
            t = threading.Thread(target=work)
            t.start()
            t.join()
            mine = _DeviceBuffer(256)
        tags = {g["tag"]: g["blocks"] for g in capalloc.live_since(cp)["groups"]}
        self.assertEqual(tags, {"main.thread": 1, "": 1})
        del mine, other[:]

    def test_record_stacks_takes_a_bool_and_c_takes_0_or_1(self):
        # Break test of issue 13: set_record_stacks(5) was accepted.
        for bad in (5, 1, None, "yes"):
            with self.assertRaises(TypeError):
                capalloc.record_stacks(bad)
        with self.assertRaises(capalloc.CapallocError) as raised:
            capalloc._call("capalloc_set_record_stacks", 5)
        self.assertEqual(raised.exception.status, 1)
        self.assertIn("must be 0 (off) or 1 (on)", str(raised.exception))
        capalloc.record_stacks(False)

    def test_an_unwritable_trace_path_leaves_the_library_working(self):
        # Break test of issue 13: an unwritable CAPALLOC_TRACE made every call fail.
        code = (
            "import capalloc\n"
            "capalloc.preallocate(0, 'ws', 4096)\n"
            "print('preallocated', capalloc.get(0, 'ws') != 0)\n"
            "try:\n"
            "    capalloc.trace_start('/nonexistent-dir/again.jsonl')\n"
            "except capalloc.CapallocError as e:\n"
            "    print('trace_start:', e.status, e)\n")
        child = run_child(code, {"CAPALLOC_TRACE": "/nonexistent-dir/trace.jsonl",
                                 "CAPALLOC_LOG_LEVEL": "error"})
        self.assertEqual(child.returncode, 0, child.stderr)
        self.assertIn("preallocated True", child.stdout)
        self.assertIn("trace_start: 1 ", child.stdout)
        self.assertIn("cannot create the trace file '/nonexistent-dir/again.jsonl'", child.stdout)
        self.assertEqual(child.stderr.count("cannot create the trace file "
                                            "'/nonexistent-dir/trace.jsonl'"), 1, child.stderr)

    def test_trace_of_a_run_follows_the_trace_rules(self):
        path = os.path.join(tempfile.mkdtemp(), "run.jsonl")
        capalloc.trace_start(path)
        with self.assertRaises(capalloc.CapallocError):
            capalloc.trace_start(path)  # one at a time
        buffers = [_DeviceBuffer(4096) for _ in range(10)]
        del buffers
        capalloc.trace_stop()
        with open(path) as f:
            lines = [json.loads(line) for line in f]
        self.assertEqual(lines[0]["format"], "capalloc.trace/1")
        live = set()
        ops = [e["op"] for e in lines[1:]]
        for e in lines[1:]:
            if e["op"] == "alloc":
                self.assertNotIn(e["id"], live)
                live.add(e["id"])
            elif e["op"] == "free":
                self.assertIn(e["id"], live)
                live.remove(e["id"])
        self.assertEqual(ops.count("alloc") - ops.count("free"), len(live))
        self.assertGreaterEqual(ops.count("free"), 10)
