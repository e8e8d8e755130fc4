"""Builds and loads capalloc's PyTorch shim (_torch_shim.cpp) on this machine.

The shim is compiled with the system C++ compiler ($CXX, else c++ or g++)
against the installed PyTorch's own headers and libraries (the directories
torch.utils.cpp_extension would use; no ninja or setuptools needed), and
cached under $CAPALLOC_SHIM_CACHE (default ~/.cache/capalloc), keyed by the
source, the PyTorch version and the Python version, so later processes load
it at once.
PyTorch's CUDA headers include cuda_runtime_api.h: it comes from $CUDA_HOME,
/usr/local/cuda, or the nvidia-cuda-runtime wheel that PyTorch depends on.

Every failure raises ShimBuildError with the reason (and the compiler's last
lines), which install(use_shim="auto") reports through active_hooks().
"""

import glob
import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig

_MODULE = "_capalloc_torch_shim"
_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_torch_shim.cpp")


class ShimBuildError(RuntimeError):
    """The shim could not be built or loaded here."""


def _compiler():
    for candidate in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if candidate and shutil.which(candidate):
            return shutil.which(candidate)
    raise ShimBuildError("no C++ compiler found (set CXX, or install g++)")


def _cuda_include_dirs():
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    for root in roots:
        if root and os.path.isfile(os.path.join(root, "include", "cuda_runtime_api.h")):
            return [os.path.join(root, "include")]
    # PyTorch's pip wheels depend on NVIDIA's runtime wheel, which carries the headers.
    for base in sys.path:
        hits = glob.glob(os.path.join(base, "nvidia", "**", "include", "cuda_runtime_api.h"),
                         recursive=True)
        if hits:
            return sorted({os.path.dirname(h) for h in hits})
    raise ShimBuildError("cuda_runtime_api.h not found (set CUDA_HOME, or install the CUDA "
                         "toolkit or PyTorch's nvidia-cuda-runtime wheel)")


def _cache_dir(torch):
    with open(_SOURCE, "rb") as f:
        digest = hashlib.sha256(f.read())
    digest.update(torch.__version__.encode())
    digest.update(sys.version.encode())
    root = os.environ.get("CAPALLOC_SHIM_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "capalloc")
    return os.path.join(root, f"torch_shim-{digest.hexdigest()[:16]}")


def _load(path):
    loader = importlib.machinery.ExtensionFileLoader(_MODULE, path)
    spec = importlib.util.spec_from_file_location(_MODULE, path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _compile(torch, out):
    # The directories torch.utils.cpp_extension uses, named here: importing
    # cpp_extension would need setuptools, which a GPU machine may lack.
    torch_dir = os.path.dirname(torch.__file__)
    torch_lib = os.path.join(torch_dir, "lib")
    torch_include = os.path.join(torch_dir, "include")
    header = os.path.join(torch_include, "torch", "csrc", "cuda", "CUDAPluggableAllocator.h")
    if not os.path.isfile(header):
        raise ShimBuildError(f"this PyTorch ships no C++ headers ({header} is missing)")
    python_include = sysconfig.get_paths()["include"]
    if not os.path.isfile(os.path.join(python_include, "Python.h")):
        raise ShimBuildError(f"Python's headers are missing ({python_include}/Python.h; Debian: "
                             "python3-dev)")
    includes = [torch_include, os.path.join(torch_include, "torch", "csrc", "api", "include")]
    includes += _cuda_include_dirs() + [python_include]
    abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
    cxx = _compiler()
    base = [cxx, "-O2", "-fPIC", "-shared", f"-D_GLIBCXX_USE_CXX11_ABI={abi}"]
    base += [f"-I{d}" for d in includes]
    libs = [f"-L{torch_lib}", f"-Wl,-rpath,{torch_lib}", "-lc10", "-lc10_cuda", "-ltorch",
            "-ltorch_cpu", "-ltorch_cuda"]
    tmp = out + f".{os.getpid()}.tmp"
    errors = []
    # Recent PyTorch needs C++20 for its headers; older accepts C++17 too.
    for std in ("-std=c++20", "-std=c++17"):
        cmd = base + [std, _SOURCE, "-o", tmp] + libs
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode == 0:
            os.replace(tmp, out)
            return
        errors.append(f"{std}: " + "\n".join(p.stderr.strip().splitlines()[-15:]))
    raise ShimBuildError("compiling _torch_shim.cpp failed:\n" + "\n".join(errors))


def build():
    """The shim's module, built if not cached. Raises ShimBuildError."""
    try:
        import torch
    except ImportError as e:
        raise ShimBuildError(f"PyTorch is not importable ({e})") from None
    if not torch.cuda.is_available() and not getattr(torch.version, "cuda", None):
        raise ShimBuildError("this PyTorch has no CUDA")
    if not os.path.isfile(_SOURCE):
        raise ShimBuildError(f"{_SOURCE} is missing from the package")
    directory = _cache_dir(torch)
    os.makedirs(directory, exist_ok=True)
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    out = os.path.join(directory, _MODULE + suffix)
    if not os.path.isfile(out):
        _compile(torch, out)
    try:
        return _load(out)
    except ImportError as e:
        raise ShimBuildError(f"the built shim does not load: {e}") from None
