#!/usr/bin/env python3
"""Checks a GPU bundle (tools/gpu-bundle.sh) on the machine that built it.

    check_bundle.py BUNDLE [--max-mib 32] [--no-run]

Static part, from the ELF headers alone (readelf), without this machine's
library search path:
  * every NEEDED library of every ELF in the bundle resolves through that
    file's own RUNPATH, which must stay inside the bundle ($ORIGIN-relative),
    or is the C/C++ runtime (libc, libm, libdl, libpthread, librt, ld-linux,
    libstdc++, libgcc_s) or the NVIDIA driver (libcuda.so.1);
  * nothing needs Debian's Abseil, spdlog or fmt from outside the bundle,
    and nothing needs HIP at all;
  * the bundle is at most --max-mib MiB.
Run part (skipped with --no-run): a copy of the bundle moved to a temporary
directory, run with LD_LIBRARY_PATH empty:
  * `ldd` of every ELF finds every library, and none of Abseil, spdlog, fmt or
    cudart outside the copy;
  * `capalloc arms --runtime host --json` and `gemm-scenario --runtime host
    --json` match seed 003 (all_match true);
  * the Python module loads the copy's libcapalloc.so and allocates on the host
    runtime; gpu_runtime_test starts and, with no device here, exits 77.

Prints one line per check and a last `N passed, N failed` line; exits 1 on any
failure.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

SYSTEM = re.compile(r"^(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|libcuda)\.so\.\d+$"
                    r"|^ld-linux[-\w.]*\.so\.\d+$")
CARRIED_ONLY = re.compile(r"libabsl_|libspdlog|libfmt|libcudart")
FORBIDDEN = re.compile(r"amdhip|libhip|hsa-runtime|rocm")

results = []


def check(ok, what):
    results.append(bool(ok))
    print(f"{'ok  ' if ok else 'FAIL'} {what}")
    return ok


def is_elf(path):
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def dynamic_section(path):
    text = subprocess.run(["readelf", "-d", "-W", path], capture_output=True, text=True,
                          check=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", text)
    runpath = re.findall(r"\((?:RUNPATH|RPATH)\)\s+Library r(?:un)?path: \[([^\]]*)\]", text)
    return needed, (runpath[0].split(":") if runpath else [])


def static_checks(bundle, max_mib):
    elves, links = [], []
    total = 0
    for root, _, names in os.walk(bundle):
        for name in names:
            path = os.path.join(root, name)
            if os.path.islink(path):
                links.append(os.path.relpath(path, bundle))
                continue
            total += os.path.getsize(path)
            if is_elf(path):
                elves.append(path)
    check(not links, "every file is a plain file (the device tool carries no links)"
          + (f"; links: {links}" if links else ""))
    check(total <= max_mib * 2**20, f"bundle size {total / 2**20:.1f} MiB <= {max_mib} MiB")
    for want in ("bin/capalloc", "bin/gpu_runtime_test", "bin/capalloc_bench_gemm_cuda",
                 "lib/libcapalloc.so", "python/capalloc/__init__.py",
                 "python/capalloc/_shim_build.py", "python/capalloc/_torch_shim.cpp",
                 "python/capalloc/_checks.py",
                 "python/seed003_arms_torch.py", "python/torch_native_capture.py",
                 "python/torch_shim_check.py", "python/compare_verdicts.py", "gpu-check.sh",
                 "MANIFEST.json"):
        check(os.path.exists(os.path.join(bundle, want)), f"bundle has {want}")
    for elf in sorted(elves):
        rel = os.path.relpath(elf, bundle)
        needed, runpath = dynamic_section(elf)
        dirs = []
        for entry in runpath:
            resolved = os.path.realpath(entry.replace("$ORIGIN", os.path.dirname(elf)))
            inside = entry.startswith("$ORIGIN") and resolved.startswith(os.path.realpath(bundle))
            check(inside, f"{rel}: RUNPATH entry '{entry}' stays inside the bundle")
            dirs.append(resolved)
        unresolved = []
        for lib in needed:
            if FORBIDDEN.search(lib):
                unresolved.append(f"{lib} (HIP)")
            elif any(os.path.exists(os.path.join(d, lib)) for d in dirs):
                continue
            elif not SYSTEM.match(lib):
                unresolved.append(lib)
        check(not unresolved, f"{rel}: {len(needed)} NEEDED resolve inside the bundle or to the "
              f"C/C++ runtime or driver" + (f"; not: {', '.join(unresolved)}" if unresolved else ""))
    return elves


def run(cmd, env, **kw):
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, **kw)


def run_checks(bundle):
    with tempfile.TemporaryDirectory(prefix="capalloc-bundle-") as tmp:
        copy = os.path.join(tmp, "moved")
        shutil.copytree(bundle, copy, symlinks=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("CAPALLOC_")}
        env["LD_LIBRARY_PATH"] = ""
        env["CAPALLOC_LOG_LEVEL"] = "error"
        for root, _, names in os.walk(copy):
            for name in names:
                path = os.path.join(root, name)
                if not is_elf(path):
                    continue
                rel = os.path.relpath(path, copy)
                out = run(["ldd", path], env).stdout
                missing = [line.strip() for line in out.splitlines() if "not found" in line]
                outside = [line.strip() for line in out.splitlines()
                           if "=>" in line and CARRIED_ONLY.search(line.split("=>")[0])
                           and not line.split("=>")[1].strip().startswith(copy)]
                check(not missing and not outside,
                      f"moved {rel}: ldd finds everything, carried libraries from the copy"
                      + (f"; missing {missing}" if missing else "")
                      + (f"; from outside {outside}" if outside else ""))
        for command in ("arms", "gemm-scenario"):
            p = run([os.path.join(copy, "bin", "capalloc"), command, "--runtime", "host", "--json"], env)
            try:
                doc = json.loads(p.stdout)
            except ValueError:
                doc = {}
            check(p.returncode == 0 and doc.get("all_match") is True and doc.get("runtime") == "host",
                  f"moved bin/capalloc {command} --runtime host: exit {p.returncode}, "
                  f"all_match {doc.get('all_match')}" + (f"; {p.stderr.strip()[-300:]}" if p.returncode else ""))
        p = run([os.path.join(copy, "bin", "gpu_runtime_test")], env)
        check(p.returncode == 77, f"moved bin/gpu_runtime_test starts and skips without a device "
              f"(exit {p.returncode}, want 77)")
        py_env = dict(env, CAPALLOC_LIBRARY=os.path.join(copy, "lib", "libcapalloc.so"),
                      CAPALLOC_RUNTIME="host")
        script = ("import capalloc, ctypes\n"
                  "lib = capalloc.load()\n"
                  "lib.capalloc_runtime_name.restype = ctypes.c_char_p\n"
                  "assert lib.capalloc_runtime_name() == b'host', lib.capalloc_runtime_name()\n"
                  "p = capalloc.preallocate(0, 'bundle.check', 1 << 20)\n"
                  "assert p and capalloc.get(0, 'bundle.check') == p\n"
                  "assert capalloc.library_path().startswith(%r)\n"
                  "print(len(capalloc.snapshot()['devices']))\n" % copy)
        p = run([sys.executable, "-c", script], py_env, cwd=os.path.join(copy, "python"))
        check(p.returncode == 0, "moved python/capalloc loads the copy's libcapalloc.so and "
              "allocates on the host runtime" + (f"; {p.stderr.strip()[-300:]}" if p.returncode else ""))
        # Without CAPALLOC_LIBRARY: the package finds the bundle's lib/ (its
        # install prefix) by itself.
        bare_env = {k: v for k, v in py_env.items() if k != "CAPALLOC_LIBRARY"}
        p = run([sys.executable, "-c", script], bare_env, cwd=os.path.join(copy, "python"))
        check(p.returncode == 0, "moved python/capalloc finds ../lib/libcapalloc.so without "
              "CAPALLOC_LIBRARY" + (f"; {p.stderr.strip()[-300:]}" if p.returncode else ""))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle")
    parser.add_argument("--max-mib", type=float, default=32)
    parser.add_argument("--no-run", action="store_true")
    args = parser.parse_args()
    if not os.path.isfile(os.path.join(args.bundle, "MANIFEST.json")):
        print(f"check_bundle.py: {args.bundle} is not a bundle (no MANIFEST.json)", file=sys.stderr)
        return 2
    static_checks(args.bundle, args.max_mib)
    if not args.no_run:
        run_checks(args.bundle)
    passed = sum(results)
    print(f"{passed} passed, {len(results) - passed} failed")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
