#!/usr/bin/env bash
# tools/gpu-bundle.sh: builds, on this machine, everything the GPU check runs
# and gathers it into one self-contained directory that can travel to a bare
# GPU machine (no Debian packages, no network) and run there.
#
#   bash tools/gpu-bundle.sh [--out DIR] [--build-dir DIR | --from-build DIR] [--no-install]
#
#   --out DIR         the bundle (default: gpu-bundle/ in the repository; git-ignored)
#   --build-dir DIR   the CMake build it comes from (default: build-gpu-bundle/),
#                     configured here: Release, CUDA on, HIP off
#   --from-build DIR  take an existing Release build with the CUDA backend as
#                     it is configured (e.g. build/ after scripts/test.sh):
#                     its bundle targets are brought up to date, nothing is
#                     reconfigured; refused if it is not Release or has no
#                     CUDA backend
#   --no-install      do not run scripts/install-deps.sh first
#
# The bundle holds:
#   bin/      capalloc (CLI), gpu_runtime_test, capalloc_bench_gemm_cuda
#   lib/      libcapalloc.so, and every shared library these need that is not
#             the C/C++ runtime or the NVIDIA driver (Abseil, spdlog, fmt from
#             Debian; libcudart from the CUDA toolkit), found through
#             $ORIGIN-relative RUNPATHs
#   python/   the Python package (capalloc/), the PyTorch scripts, the verdict
#             comparator
#   gpu-check.sh, MANIFEST.json (commit, the build's settings read from its
#   CMake cache, files, glibc needs, and the git blob id of every tracked
#   source file as built, so gpu-check.sh can tell a stale bundle)
# cuBLAS is not carried (hundreds of MiB): the benchmark loads it at run time
# from the GPU machine's CUDA toolkit or PyTorch's wheels.
#
# Then run on the GPU machine: bash tools/gpu-check.sh --bundle gpu-bundle --out OUT
# (docs/gpu.md). tools/gpu/check_bundle.py checks a bundle here, statically and
# by running its host-runtime parts from a relocated copy.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$repo_root/gpu-bundle"
build="$repo_root/build-gpu-bundle"
install=1
from_build=0
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
while (($#)); do
  case "$1" in
    --out) [[ $# -ge 2 ]] || { usage >&2; exit 2; }; out="$2"; shift 2 ;;
    --build-dir) [[ $# -ge 2 ]] || { usage >&2; exit 2; }; build="$2"; from_build=0; shift 2 ;;
    --from-build) [[ $# -ge 2 ]] || { usage >&2; exit 2; }; build="$2"; from_build=1; shift 2 ;;
    --no-install) install=0; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu-bundle.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
# Absolute paths: the build runs from elsewhere.
if ((from_build)) && [[ ! -d "$build" ]]; then
  echo "gpu-bundle.sh: --from-build '$build': no such directory" >&2
  exit 2
fi
mkdir -p "$out" "$build"
out="$(cd "$out" && pwd)"
build="$(cd "$build" && pwd)"
# The bundle directory is wiped and rewritten: only an empty one or an
# earlier bundle (it has a MANIFEST.json) is taken.
if [[ "$out" == "$repo_root" || "$out" == / ]] ||
   [[ -n "$(ls -A "$out")" && ! -f "$out/MANIFEST.json" ]]; then
  echo "gpu-bundle.sh: '$out' is neither empty nor an earlier bundle: refusing to overwrite it" >&2
  exit 2
fi

((install)) && bash "$repo_root/scripts/install-deps.sh"
for tool in patchelf readelf strip; do
  command -v "$tool" >/dev/null || { echo "gpu-bundle.sh: '$tool' not found (scripts/install-deps.sh installs it)" >&2; exit 1; }
done
nvcc="$(command -v nvcc || true)"
[[ -n "$nvcc" ]] || nvcc="$(ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)"
if [[ -z "$nvcc" ]]; then
  echo "gpu-bundle.sh: no nvcc on this machine: the bundle needs the CUDA toolkit to build" >&2
  exit 1
fi

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
jobs="$(nproc 2>/dev/null || echo 2)"
targets=(capalloc capalloc_cli gpu_runtime_test capalloc_bench_gemm_cuda)

if ((from_build)); then
  # An existing build, taken as configured: it must be one the bundle can
  # come from (Release, so the binaries are what users run; the CUDA backend
  # built, with its tests and tools).
  cache="$build/CMakeCache.txt"
  if [[ ! -f "$cache" ]]; then
    echo "gpu-bundle.sh: --from-build '$build' is not a CMake build directory (no CMakeCache.txt)" >&2
    exit 2
  fi
  build_type="$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$cache")"
  if [[ "$build_type" != Release ]]; then
    echo "gpu-bundle.sh: --from-build '$build' is a '$build_type' build; the bundle needs Release (or use --build-dir)" >&2
    exit 2
  fi
  cuda_compiler="$(sed -n 's/^CMAKE_CUDA_COMPILER:[A-Z]*=//p' "$cache")"
  if [[ -z "$cuda_compiler" || "$cuda_compiler" == *NOTFOUND ||
        "$(sed -n 's/^CAPALLOC_WITH_CUDA:[A-Z]*=//p' "$cache")" == OFF ]]; then
    echo "gpu-bundle.sh: --from-build '$build' was configured without CUDA; the bundle needs the CUDA backend (or use --build-dir)" >&2
    exit 2
  fi
  echo "gpu-bundle.sh: bringing ${targets[*]} up to date in $build (as configured: $build_type)"
else
  echo "gpu-bundle.sh: building ${targets[*]} in $build (Release, CUDA on, HIP off)"
  # Configured every time, so an existing build directory gets the bundle's
  # settings too (the generator of an existing one is kept).
  [[ -f "$build/CMakeCache.txt" ]] && generator=()
  cmake -S "$repo_root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_COMPILER="$nvcc" -DCAPALLOC_WITH_CUDA=ON -DCAPALLOC_WITH_HIP=OFF \
    -DCAPALLOC_BUILD_TESTS=ON -DCAPALLOC_BUILD_TOOLS=ON >/dev/null
fi
cmake --build "$build" --parallel "$jobs" --target "${targets[@]}"

echo "gpu-bundle.sh: assembling $out"
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/python"
# Real files only (no symlinks): the device tool carries plain files.
install -m 0755 "$build/tools/capalloc" "$build/tests/gpu_runtime_test" \
  "$build/tools/capalloc_bench_gemm_cuda" "$out/bin/"
install -m 0755 "$(readlink -f "$build/libcapalloc.so")" "$out/lib/libcapalloc.so"
# The cuda backend and scenario plugins (runtime/plugins.hpp): loaded at run
# time from CAPALLOC_BACKEND_PATH, which gpu-check.sh points at lib/.
install -m 0755 "$build/libcapalloc_backend_cuda.so" "$build/libcapalloc_scenarios_cuda.so" \
  "$out/lib/"

# Libraries that the GPU machine provides: the C/C++ runtime and the driver.
# Everything else a binary needs is copied in under its soname.
is_system_library() {
  case "$1" in
    libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*|ld-linux*.so.*|\
    libstdc++.so.*|libgcc_s.so.*|libcuda.so.*|linux-vdso.so.*) return 0 ;;
  esac
  return 1
}
copy_dependencies() {
  local elf="$1" name path
  # ldd resolves the whole closure with this machine's search path.
  while read -r name _ path _; do
    [[ "$path" == /* ]] || continue
    is_system_library "$name" && continue
    [[ -e "$out/lib/$name" ]] && continue
    install -m 0644 "$(readlink -f "$path")" "$out/lib/$name"
  done < <(ldd "$elf" | grep '=>')
}
for elf in "$out"/bin/* "$out"/lib/libcapalloc*.so; do copy_dependencies "$elf"; done

strip --strip-unneeded "$out"/bin/* "$out"/lib/*.so*
for elf in "$out"/bin/*; do patchelf --set-rpath '$ORIGIN/../lib' "$elf"; done
for elf in "$out"/lib/*; do patchelf --set-rpath '$ORIGIN' "$elf"; done

# The Python package (python/capalloc/: the module and the PyTorch shim's
# source, which torch_shim_check.py builds on the GPU machine) beside the
# scripts that import it.
mkdir -p "$out/python/capalloc"
install -m 0644 "$repo_root/python/capalloc/__init__.py" "$repo_root/python/capalloc/_shim_build.py" \
  "$repo_root/python/capalloc/_checks.py" \
  "$repo_root/python/capalloc/_torch_shim.cpp" "$out/python/capalloc/"
install -m 0644 "$repo_root/tools/gpu/compare_verdicts.py" "$repo_root/tools/gpu/bundle_fresh.py" \
  "$out/python/"
install -m 0755 "$repo_root/tools/python/seed003_arms_torch.py" \
  "$repo_root/tools/python/torch_native_capture.py" "$repo_root/tools/gpu/torch_shim_check.py" \
  "$out/python/"
install -m 0755 "$repo_root/tools/gpu-check.sh" "$out/gpu-check.sh"

# The manifest: what was built, from what, and what the GPU machine must
# have (the newest glibc and libstdc++ symbol versions any file needs).
python3 - "$out" "$repo_root" "$nvcc" "$build/CMakeCache.txt" <<'PY'
import json, os, re, subprocess, sys
out, repo, nvcc, cache_file = sys.argv[1:5]
def run(*cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return ""
def newest(tag, text):
    found = {tuple(int(x) for x in v.split(".")) for v in re.findall(tag + r"_([0-9.]+[0-9])", text)}
    return ".".join(map(str, max(found))) if found else None
files, needs = [], ""
for root, _, names in os.walk(out):
    for name in sorted(names):
        path = os.path.join(root, name)
        files.append({"path": os.path.relpath(path, out), "bytes": os.path.getsize(path)})
        with open(path, "rb") as f:
            if f.read(4) == b"\x7fELF":
                needs += run("readelf", "--version-info", "-W", path)
nvcc_version = re.search(r"release ([0-9.]+)", run(nvcc, "--version"))
cache = {}
with open(cache_file) as f:
    for line in f:
        m = re.match(r"([A-Za-z_0-9]+):[A-Z]+=(.*)$", line.rstrip("\n"))
        if m:
            cache[m.group(1)] = m.group(2)
# The tracked sources as they were built: path -> git blob id of the file in
# the work tree (uncommitted edits included).
sources = None
listed = subprocess.run(["git", "-C", repo, "ls-files", "-z"], capture_output=True)
if listed.returncode == 0:
    paths = [p for p in listed.stdout.decode().split("\0") if p and os.path.isfile(os.path.join(repo, p))]
    ids = subprocess.run(["git", "-C", repo, "hash-object", "--stdin-paths"], input="\n".join(paths),
                         capture_output=True, text=True, check=True).stdout.split()
    sources = dict(zip(paths, ids))
manifest = {
    "schema": "capalloc.gpu-bundle/1",
    "commit": run("git", "-C", repo, "rev-parse", "HEAD").strip() or None,
    "dirty": bool(run("git", "-C", repo, "status", "--porcelain", "--untracked-files=no").strip()),
    "build_type": cache.get("CMAKE_BUILD_TYPE"),
    "cuda": nvcc_version.group(1) if nvcc_version else None,
    "cuda_architectures": cache.get("CAPALLOC_CUDA_ARCHITECTURES"),
    "with_cuda": cache.get("CAPALLOC_WITH_CUDA"), "with_hip": cache.get("CAPALLOC_WITH_HIP"),
    "needs": {"glibc": newest("GLIBC", needs), "glibcxx": newest("GLIBCXX", needs),
              "driver_library": "libcuda.so.1"},
    "total_bytes": sum(f["bytes"] for f in files), "files": files,
    "sources": sources,
}
with open(os.path.join(out, "MANIFEST.json"), "w") as f:
    json.dump(manifest, f, indent=2)
print(f"gpu-bundle.sh: {len(files)} files, {manifest['total_bytes'] / 2**20:.1f} MiB; "
      f"needs glibc {manifest['needs']['glibc']}, libstdc++ GLIBCXX {manifest['needs']['glibcxx']}")
PY
echo "gpu-bundle.sh: done: $out"
echo "  check here:       python3 tools/gpu/check_bundle.py '$out'"
echo "  on the GPU box:   bash tools/gpu-check.sh --bundle '$out' --out OUTDIR"
