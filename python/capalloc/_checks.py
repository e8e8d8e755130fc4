"""Shared by the GPU check scripts that tools/gpu-check.sh runs
(tools/python/seed003_arms_torch.py, tools/python/torch_native_capture.py,
tools/gpu/torch_shim_check.py): not part of capalloc's API."""
import sys


def torch_with_cuda_or_skip():
    """PyTorch, when it imports and sees a CUDA device; otherwise prints the
    check's `result: skipped: ...` line and exits 77 (gpu-check.sh's SKIP)."""
    try:
        import torch
    except ImportError as e:
        print(f"result: skipped: PyTorch is not importable ({e})")
        sys.exit(77)
    if not torch.cuda.is_available():
        print("result: skipped: PyTorch sees no CUDA device")
        sys.exit(77)
    return torch


def install_or_skip(use_shim):
    """capalloc.install(use_shim=...) before the process's first CUDA
    allocation; through the shim, a shim that cannot be built here prints the
    check's `result: skipped: ...` line and exits 77."""
    import capalloc
    if not use_shim:
        capalloc.install(use_shim=False)
        return
    from capalloc import _shim_build
    try:
        capalloc.install(use_shim=True)
    except _shim_build.ShimBuildError as e:
        print(f"result: skipped: the shim cannot be built here: {e}")
        sys.exit(77)
