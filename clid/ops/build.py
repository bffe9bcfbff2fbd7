"""Building and loading the csrc/ extension (``clid_ops``) just in time; ``python -m clid.ops build``."""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import platform
import re
import shutil
import socket
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
CSRC = ROOT / "csrc"
EXTENSION_NAME = "clid_ops"

_extension = None          # the loaded module, once built
_build_error: str | None = None   # why it could not be built (then every wrapper uses its reference)
_warned: set[str] = set()


# ---------------------------------------------------------------------------------------------
# Building and loading the extension
#
# Built once, at install time (`python -m clid.ops build`, run by `make venv` and by the cluster
# recipe), into a folder named after a hash of everything that goes into it: the sources and
# headers, the Python and torch versions, the CPU, the compiler and its flags. At run time the
# finished module is only imported. If it was never built, the first run builds it, with these
# guarantees (a killed build used to leave torch's `lock` file behind and hang every later run):
# - the build happens in a private staging folder renamed into place when complete, with a
#   `ready.json` inside, so a half-built folder is never used;
# - builders take turns through an flock() on `<folder>.lock`, which the kernel releases when its
#   holder dies (kill -9, Ctrl-C, a preempted job): nothing stale can block the next run; a waiter
#   prints which process it waits for, and since when, every 30 s;
# - a failed build is recorded in `<folder>.failed`, so later runs fall back at once instead of
#   failing the same build again; `python -m clid.ops build` always tries again.

READY = "ready.json"
WAIT_REPORT_SECONDS = 30.0


@dataclass(frozen=True)
class ExtensionSpec:
    """What to compile: the module's name, its sources, include folders and flags."""

    name: str
    sources: tuple[Path, ...]
    include_dirs: tuple[Path, ...] = ()
    cflags: tuple[str, ...] = ()
    cuda_flags: tuple[str, ...] = ()
    ldflags: tuple[str, ...] = ()
    with_cuda: bool = False


def cuda_build_enabled() -> bool:
    """CUDA sources are compiled only where PyTorch has CUDA and a toolkit (nvcc) is found."""
    if os.environ.get("CLID_OPS_NO_CUDA") == "1" or torch.version.cuda is None:
        return False
    from torch.utils.cpp_extension import CUDA_HOME
    return CUDA_HOME is not None


def sources(with_cuda: bool | None = None) -> list[Path]:
    """The binding, every csrc/cpu/*.cpp and (with CUDA) every csrc/cuda/*.cu, in a fixed order."""
    with_cuda = cuda_build_enabled() if with_cuda is None else with_cuda
    found = [CSRC / "binding.cpp", *sorted((CSRC / "cpu").glob("*.cpp"))]
    if with_cuda:
        found += sorted((CSRC / "cuda").glob("*.cu"))
    return found


CUDA_ARCHS = ("80", "90")  # A100, H100 (the archs csrc/check_cuda.sh checks); PTX of the last for newer GPUs


def compile_flags(with_cuda: bool) -> tuple[list[str], list[str]]:
    """Host and nvcc flags. -march=native is safe because the build folder is keyed by the CPU.

    GPU code is compiled for CUDA_ARCHS (TORCH_CUDA_ARCH_LIST overrides them), not for the visible
    GPUs as torch would pick: a build made where no GPU is visible (a login node) still runs."""
    cflags = ["-O3", "-fopenmp", "-march=native", "-DNDEBUG"]
    cuda_flags = ["-O3", "-DNDEBUG", "--expt-relaxed-constexpr", "-lineinfo"]
    if with_cuda:
        cflags.append("-DCLID_WITH_CUDA")
        cuda_flags.append("-DCLID_WITH_CUDA")
        if not os.environ.get("TORCH_CUDA_ARCH_LIST"):
            cuda_flags += [f"-gencode=arch=compute_{a},code=sm_{a}" for a in CUDA_ARCHS]
            cuda_flags.append(f"-gencode=arch=compute_{CUDA_ARCHS[-1]},code=compute_{CUDA_ARCHS[-1]}")
    return cflags, cuda_flags


def extension_spec() -> ExtensionSpec:
    """The ``clid_ops`` extension of csrc/, with CUDA kernels where PyTorch and a toolkit allow."""
    with_cuda = cuda_build_enabled()
    cflags, cuda_flags = compile_flags(with_cuda)
    return ExtensionSpec(EXTENSION_NAME, tuple(sources(with_cuda)), (CSRC,), tuple(cflags), tuple(cuda_flags),
                         ("-fopenmp",), with_cuda)


def _cpu_fingerprint() -> str:
    """The CPU model and its instruction set extensions: a build for one CPU may not run on another."""
    text = platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key = line.split(":", 1)[0].strip()
                if key in ("model name", "flags", "Features", "CPU part"):
                    text += line
                if key in ("flags", "Features"):
                    break
    except OSError:
        text += platform.processor()
    return text


def build_key(spec: ExtensionSpec) -> str:
    """A hash of everything the build depends on: the content of the sources and of every header
    in the include folders, the Python and torch versions, the CPU, the compiler, the flags and
    TORCH_CUDA_ARCH_LIST. Equal sources in two clones give the same key."""
    digest = hashlib.sha256()
    for part in (spec.name, sys.version, torch.__version__, str(torch.version.cuda), _cpu_fingerprint(),
                 os.environ.get("CXX", "c++"), *spec.cflags, "|", *spec.cuda_flags, "|", *spec.ldflags,
                 str(spec.with_cuda), os.environ.get("TORCH_CUDA_ARCH_LIST", "")):
        digest.update(part.encode() + b"\0")
    headers = sorted({h for folder in spec.include_dirs for pattern in ("*.h", "*.cuh", "*.hpp")
                      for h in Path(folder).rglob(pattern)})
    for path in [*spec.sources, *headers]:
        digest.update(Path(path).name.encode() + b"\0" + Path(path).read_bytes() + b"\0")
    return digest.hexdigest()


def build_root() -> Path:
    """Where builds are kept: ``CLID_OPS_BUILD_DIR``, else ``$XDG_CACHE_HOME/clid/torch_extensions``."""
    base = os.environ.get("CLID_OPS_BUILD_DIR")
    if not base:
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        base = os.path.join(cache, "clid", "torch_extensions")
    return Path(base)


def build_directory(spec: ExtensionSpec | None = None) -> Path:
    """The folder of this build, e.g. ``clid_ops_py311_torch2.13.0_cpu_<hash>``."""
    spec = spec or extension_spec()
    torch_version = re.sub(r"[^A-Za-z0-9.]", "_", torch.__version__)
    return build_root() / f"{spec.name}_py{sys.version_info[0]}{sys.version_info[1]}_torch{torch_version}_{build_key(spec)[:16]}"


def _import_built(folder: Path):
    """Import the finished module of a build folder (no compiler, no lock)."""
    import importlib.util

    ready = json.loads((folder / READY).read_text())
    path = folder / ready["file"]
    spec = importlib.util.spec_from_file_location(ready["module"], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _lock_holder(lock_path: Path) -> str:
    try:
        return lock_path.read_text().strip() or "another process"
    except OSError:
        return "another process"


@contextlib.contextmanager
def build_lock(lock_path: Path, folder: Path, report_every: float = WAIT_REPORT_SECONDS):
    """Hold an exclusive flock() on ``lock_path`` for the block (the builder's pid and host written in
    it); yields whether the lock is held.

    The kernel releases the lock when its holder exits or is killed, so a lock is never stale.
    While a live holder builds, prints what it waits for every ``report_every`` seconds. On a file
    system without flock() (e.g. Lustre mounted without ``-o flock``) it says so and goes on
    unlocked: builds then may run twice, but never half-built, since each has its own staging folder.
    """
    import fcntl

    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        started, last_report, locked = time.monotonic(), -math.inf, True
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:  # a live process holds it
                now = time.monotonic()
                if now - last_report >= report_every:
                    print(f"clid.ops: waiting for {_lock_holder(lock_path)}, building the extension in {folder} "
                          f"({now - started:.0f} s so far)", file=sys.stderr, flush=True)
                    last_report = now
                time.sleep(0.2)
            except OSError as err:
                print(f"clid.ops: cannot lock {lock_path} ({err.strerror}); building without a lock",
                      file=sys.stderr, flush=True)
                locked = False
                break
        if locked:
            os.ftruncate(fd, 0)
            os.write(fd, f"pid {os.getpid()} on host {socket.gethostname()} since "
                         f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())
        yield locked
    finally:
        os.close(fd)  # releases the lock


def load_or_build(spec: ExtensionSpec, force: bool = False, verbose: bool = False,
                  report_every: float = WAIT_REPORT_SECONDS):
    """The compiled module of ``spec``: imported if already built, else built once (see above).

    Raises if the build fails; the failure is recorded in ``<folder>.failed`` and re-raised by later
    calls without building again, unless ``force`` (what ``python -m clid.ops build`` passes).
    """
    folder = build_directory(spec)
    failed = folder.with_name(folder.name + ".failed")
    if (folder / READY).exists():
        return _import_built(folder)
    if failed.exists() and not force:
        first_line = failed.read_text().partition("\n")[0]
        raise RuntimeError(f"the build failed before ({first_line}); `python -m clid.ops build` tries again")
    folder.parent.mkdir(parents=True, exist_ok=True)
    with build_lock(folder.with_name(folder.name + ".lock"), folder, report_every) as locked:
        if (folder / READY).exists():  # built by the process we waited for
            return _import_built(folder)
        if locked:  # no other builder is alive: what is there was left by killed ones
            for leftover in folder.parent.glob(folder.name + ".tmp-*"):
                shutil.rmtree(leftover, ignore_errors=True)
        staging = folder.with_name(f"{folder.name}.tmp-{os.getpid()}")
        staging.mkdir()
        hint = "" if force else " (once for these sources; `python -m clid.ops build` does it at install time)"
        print(f"clid.ops: building the {spec.name} extension in {folder}{hint}", file=sys.stderr, flush=True)
        started = time.time()
        try:
            from torch.utils.cpp_extension import load

            module = load(name=spec.name, sources=[str(s) for s in spec.sources],
                          extra_include_paths=[str(d) for d in spec.include_dirs], extra_cflags=list(spec.cflags),
                          extra_cuda_cflags=list(spec.cuda_flags), extra_ldflags=list(spec.ldflags),
                          build_directory=str(staging), with_cuda=spec.with_cuda, verbose=verbose)
        except Exception as err:
            shutil.rmtree(staging, ignore_errors=True)
            with contextlib.suppress(OSError):  # the telling line first, then the whole log
                failed.write_text(f"{_short_error(err)}\n{type(err).__name__}: {err}\n")
            raise
        (staging / READY).write_text(json.dumps({
            "module": module.__name__, "file": Path(module.__file__).name, "key": build_key(spec),
            "seconds": round(time.time() - started, 1), "host": socket.gethostname(),
            "sources": [str(s) for s in spec.sources]}, indent=1))
        try:
            os.rename(staging, folder)
        except OSError:  # an unlocked builder finished first: keep its folder
            shutil.rmtree(staging, ignore_errors=True)
        failed.unlink(missing_ok=True)
    return module


def extension(verbose: bool = False):
    """The compiled ``clid_ops`` module (built on first call if it never was), or None if it cannot be."""
    global _extension, _build_error
    if _extension is not None or _build_error is not None:
        return _extension
    if os.environ.get("CLID_OPS_DISABLE") == "1":
        _build_error = "disabled by CLID_OPS_DISABLE=1"
        return None
    try:
        _extension = load_or_build(extension_spec(), verbose=verbose or os.environ.get("CLID_OPS_VERBOSE") == "1")
    except Exception as err:  # a compiler error, a missing ninja, a broken toolchain: fall back
        _build_error = _short_error(err)
    return _extension


def _short_error(err: Exception) -> str:
    """The telling line of a build error: the compiler's own ``error:`` line if there is one."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    compiler = [line for line in lines if "error:" in line]
    errors = [line for line in lines if "error" in line.lower()]
    return f"{type(err).__name__}: {(compiler or errors or lines or [''])[0][:300]}"


def build_error() -> str | None:
    """Why the extension is not available (None if it is, or has not been tried yet)."""
    return _build_error


def _kernel_module(op: str, *tensors):
    """The extension for ``op`` on these tensors, or None after warning once per op that the
    reference is used (no extension, or GPU tensors and a build without CUDA kernels)."""
    ext = extension()
    reason = None if ext is not None else f"the C++ extension is unavailable ({_build_error}; " \
                                          f"CLID_OPS_VERBOSE=1 shows the build log)"
    if ext is not None and any(t is not None and t.is_cuda for t in tensors) and not ext.with_cuda():
        ext, reason = None, "the extension was built without CUDA kernels"
    if ext is None and op not in _warned:
        _warned.add(op)
        warnings.warn(f"clid.ops.{op}: {reason}; using the slower PyTorch reference", RuntimeWarning, stacklevel=3)
    return ext



# ---------------------------------------------------------------------------------------------
# The install-time build: python -m clid.ops build

def parse_args(argv=None):
    import argparse

    from clid.cli import HelpFormatter

    p = argparse.ArgumentParser(prog="python -m clid.ops", description="Build the clid_ops C++/CUDA extension once "
                                "(make venv and the cluster recipe run this); later runs only import it.",
                                formatter_class=HelpFormatter)
    p.add_argument("command", choices=["build"])
    p.add_argument("--strict", action="store_true", help="exit 1 if the build fails (without it: warn and exit 0; "
                                                          "every op then runs its PyTorch reference)")
    p.add_argument("--verbose", action="store_true", help="show the compiler's commands and output")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if os.environ.get("CLID_OPS_DISABLE") == "1":
        print("clid.ops: CLID_OPS_DISABLE=1, nothing to build")
        return 0
    spec = extension_spec()
    folder = build_directory(spec)
    if (folder / READY).exists():
        print(f"clid.ops: {spec.name} is already built in {folder}")
        return 0
    started = time.time()
    try:
        module = load_or_build(spec, force=True, verbose=args.verbose)
    except Exception as err:
        print(f"clid.ops: could not build the {spec.name} extension ({_short_error(err)}; --verbose shows the "
              f"build log); every op will run its slower PyTorch reference", file=sys.stderr)
        return 1 if args.strict else 0
    kernels = "CPU and CUDA" if module.with_cuda() else "CPU"
    print(f"clid.ops: built {spec.name} ({kernels} kernels) in {folder} in {time.time() - started:.0f} s")
    return 0

