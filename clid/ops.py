"""Fused kernels of the csrc/ extension, each next to the plain PyTorch reference it is tested against.

The extension (``clid_ops``: ``csrc/binding.cpp``, every ``csrc/cpu/*.cpp``, and every
``csrc/cuda/*.cu`` when PyTorch has CUDA and a CUDA toolkit is found) is built once, at install time:

    python -m clid.ops build          # run by `make venv` and by slurm/submit_all.sh

with ``torch.utils.cpp_extension.load`` (ninja), into
``$XDG_CACHE_HOME/clid/torch_extensions/`` (``~/.cache`` by default; ``CLID_OPS_BUILD_DIR``
overrides it), in a folder named after a hash of the sources, the headers, the Python and torch
versions, the CPU, the compiler and the flags. At run time it is only imported; a run that finds
no build makes it once (see "Building and loading" below: killed builds never block later runs).
If the build fails, or ``CLID_OPS_DISABLE=1``, every wrapper warns once and runs its reference.

Scoring ops (Eq. 2 of the paper, ``log p(y|x) = (1/m) sum_t log P(w_t | ...)``):

    seq_logprob(logits[N,T,V], targets[N,T], mask[N,T]) -> [N]
    token_logprob(logits[..., V], targets[...]) -> [...]
    token_logprob_hidden(hidden[P,H], weight[V,H], bias[V] or None, targets[P]) -> [P]
    segment_mean(values[P], lengths=[N] | segment_ids=[P]) -> [N]

Inputs may be float32, float16 or bfloat16; arithmetic is float32 (sums over captions in float64)
and outputs are float32. Results are bitwise equal from run to run and do not depend on the number
of threads. A caption with no scored token (m = 0) gets NaN: the mean of nothing is undefined, and
0 (the best possible log-probability) would rank an empty caption first.
"""
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

ROOT = Path(__file__).resolve().parents[1]
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


# ---- score ops (C1) ----
# Fused Eq. 2 scoring. Each op has a plain PyTorch `*_reference` (float64 arithmetic when given
# float64, otherwise float32) that the tests compare against and that the wrappers fall back to.

def _as_long(targets: torch.Tensor) -> torch.Tensor:
    return targets.long() if targets.dtype != torch.long else targets


def _reference_float(x: torch.Tensor) -> torch.Tensor:
    """Inputs of the references: half types are upcast to float32 (float64 is kept)."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def _check_range(targets: torch.Tensor, V: int, op: str, where: torch.Tensor | None = None) -> None:
    bad = (targets < 0) | (targets >= V)
    if bool(bad.any()):
        first = int(bad.nonzero()[0, 0])
        pos = where[first].tolist() if where is not None else [first]
        raise RuntimeError(f"{op}: target {int(targets[first])} at position {pos} is outside the vocabulary [0, {V})")


def seq_logprob_reference(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(1/m_n) sum_t log_softmax(logits[n, t])[targets[n, t]] over mask[n, t] != 0; NaN if m_n = 0."""
    mask = mask != 0
    where = mask.nonzero()
    y = _as_long(targets)[mask]
    _check_range(y, logits.shape[-1], "seq_logprob", where)
    rows = _reference_float(logits)[mask]                      # [R, V], only the scored rows
    values = torch.log_softmax(rows, dim=-1).gather(1, y[:, None])[:, 0]
    return segment_mean_reference(values, lengths=mask.sum(1))


def token_logprob_reference(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log_softmax(logits, -1)[..., targets] with targets of shape logits.shape[:-1]."""
    y = _as_long(targets)
    _check_range(y.reshape(-1), logits.shape[-1], "token_logprob")
    return torch.log_softmax(_reference_float(logits), dim=-1).gather(-1, y[..., None])[..., 0]


def token_logprob_hidden_reference(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                                   targets: torch.Tensor) -> torch.Tensor:
    """log_softmax(hidden @ weight.T + bias)[targets]: builds the full [P, V] logits."""
    y = _as_long(targets)
    _check_range(y, weight.shape[0], "token_logprob_hidden")
    dtype = torch.float64 if torch.float64 in (hidden.dtype, weight.dtype) else torch.float32
    logits = torch.nn.functional.linear(hidden.to(dtype), weight.to(dtype), None if bias is None else bias.to(dtype))
    return torch.log_softmax(logits, dim=-1).gather(1, y[:, None])[:, 0]


def _lengths_from_ids(segment_ids: torch.Tensor, num_segments: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(stable order that groups the positions by segment, segment lengths) from segment ids."""
    ids = _as_long(segment_ids)
    if ids.numel() and int(ids.min()) < 0:
        raise ValueError(f"segment_mean: segment ids must be >= 0, got {int(ids.min())}")
    n = num_segments if num_segments is not None else (int(ids.max()) + 1 if ids.numel() else 0)
    if ids.numel() and int(ids.max()) >= n:
        raise ValueError(f"segment_mean: segment id {int(ids.max())} >= num_segments = {n}")
    order = torch.sort(ids, stable=True).indices   # keeps each segment's positions in their order
    return order, torch.bincount(ids, minlength=n)


def segment_mean_reference(values: torch.Tensor, lengths: torch.Tensor | None = None,
                           segment_ids: torch.Tensor | None = None, num_segments: int | None = None) -> torch.Tensor:
    """Mean of each segment of ``values``: consecutive runs of ``lengths``, or the positions that share
    a ``segment_ids`` value (0 .. num_segments-1). Float64 sums; NaN for an empty segment."""
    if (lengths is None) == (segment_ids is None):
        raise ValueError("segment_mean: give exactly one of lengths and segment_ids")
    if segment_ids is not None:
        order, lengths = _lengths_from_ids(segment_ids, num_segments)
        values = values[order]
    lengths = _as_long(lengths)
    if int(lengths.sum()) != values.numel():
        raise ValueError(f"segment_mean: lengths sum to {int(lengths.sum())} but there are {values.numel()} values")
    sums = torch.zeros(lengths.numel(), dtype=torch.float64, device=values.device)
    sums.index_add_(0, torch.repeat_interleave(torch.arange(lengths.numel(), device=values.device), lengths),
                    values.double())
    means = sums / lengths.double()                  # 0 / 0 = NaN for an empty segment
    return means.to(values.dtype if values.dtype == torch.float64 else torch.float32)


def seq_logprob(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Eq. 2 from logits: (1/m_n) sum_t log_softmax(logits[n, t])[targets[n, t]] over mask[n] -> [N] float32.

    logits [N, T, V] float32/float16/bfloat16 (contiguous along V), targets [N, T] integer, mask [N, T]
    (nonzero = scored). One read of the logits, online log-sum-exp, no log-softmax tensor. Targets are
    checked only where mask is set. m_n = 0 gives NaN. float64 logits use the reference."""
    ext = _kernel_module("seq_logprob", logits)
    if ext is None or logits.dtype == torch.float64:
        return seq_logprob_reference(logits, targets, mask)
    return ext.seq_logprob(logits, targets, mask)


def token_logprob(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log_softmax(logits[..., V])[targets] -> targets.shape float32, without a log-softmax tensor."""
    ext = _kernel_module("token_logprob", logits)
    if ext is None or logits.dtype == torch.float64:
        return token_logprob_reference(logits, targets)
    return ext.token_logprob(logits, targets)


def token_logprob_hidden(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                         targets: torch.Tensor) -> torch.Tensor:
    """log_softmax(hidden @ weight.T + bias)[targets] -> [P] float32, over vocabulary tiles.

    hidden [P, H], weight [V, H] (the output projection, e.g. the tied word embeddings), bias [V] or
    None, targets [P]. No [P, V] logits buffer: fixed-size row blocks x vocabulary tiles, each one
    GEMM into a small buffer and an online log-sum-exp. Half-precision hidden states are upcast
    once on the CPU ([P, H] float32). float64 inputs use the reference."""
    ext = _kernel_module("token_logprob_hidden", hidden, weight)
    if ext is None or torch.float64 in (hidden.dtype, weight.dtype):
        return token_logprob_hidden_reference(hidden, weight, bias, targets)
    return ext.token_logprob_hidden(hidden, weight, bias, targets)


def segment_mean(values: torch.Tensor, lengths: torch.Tensor | None = None,
                 segment_ids: torch.Tensor | None = None, num_segments: int | None = None) -> torch.Tensor:
    """Per-caption means of per-position values -> [N] float32 (NaN for a caption with no position).

    Either ``lengths`` [N] (consecutive runs) or ``segment_ids`` [P] (any order; the positions of a
    segment are summed in their order, in float64, so the result is deterministic)."""
    ext = _kernel_module("segment_mean", values)
    if ext is None or values.dtype == torch.float64:
        return segment_mean_reference(values, lengths, segment_ids, num_segments)
    if (lengths is None) == (segment_ids is None):
        raise ValueError("segment_mean: give exactly one of lengths and segment_ids")
    if segment_ids is not None:
        order, lengths = _lengths_from_ids(segment_ids, num_segments)
        values = values[order]
    return ext.segment_mean(values, _as_long(lengths).to(values.device))


# ---- sampler ops (C2) ----
# Smooth-step data selection (docs/method.md, step 6) and the percentile threshold T_i.
#
#     kth_value(u, k) -> float                              k-th smallest, 1-based
#     percentile_threshold(u, q, method="linear") -> float  numpy.percentile(u, q[, method])
#     smoothstep_weights(u, threshold, s) -> float64 array  f(u) = 0.5 (1 + tanh((u - T) / s))
#     smoothstep_sample(u, threshold, s, k, seed, iteration, mode="successive") -> int64 indices
#
# Each has a plain NumPy reference (`*_reference`) that the tests compare against and that the
# wrappers fall back to; the sampler's reference computes the same per-item keys bit for bit.

import math as _math

import numpy as _np

_SAMPLER_MODES = ("successive", "bernoulli")
_UINT64 = 1 << 64


def _sampler_input(u, op: str) -> torch.Tensor:
    """u as a contiguous 1-D float32/float64 tensor (numpy arrays and half precision accepted)."""
    if not isinstance(u, torch.Tensor):
        u = torch.as_tensor(_np.asarray(u))
    if u.dim() != 1:
        raise ValueError(f"clid.ops.{op}: u must be 1-D, got shape {tuple(u.shape)}")
    if u.dtype in (torch.float16, torch.bfloat16):
        u = u.float()  # exact
    if u.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"clid.ops.{op}: u must be a floating-point tensor, got {u.dtype}")
    return u.contiguous()


def _first_nan_reference(values: _np.ndarray) -> int:
    bad = _np.flatnonzero(_np.isnan(values))
    return int(bad[0]) if bad.size else -1


def _raise_nan(op: str, index: int, m: int):
    raise ValueError(f"clid.ops.{op}: u[{index}] is NaN (the first NaN of {m} values)")


def _check_uint64(value, name: str, op: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, _np.integer)) or not 0 <= int(value) < _UINT64:
        raise ValueError(f"clid.ops.{op}: {name} must be an integer in [0, 2**64), got {value!r}")
    return int(value)


# ---- k-th value and percentile ----------------------------------------------------------------

def kth_value_reference(u, k: int) -> float:
    """The k-th smallest (1-based) of u: ``numpy.partition(u, k - 1)[k - 1]``."""
    values = _sampler_input(u, "kth_value").cpu().numpy()
    if not 1 <= k <= len(values):
        raise ValueError(f"clid.ops.kth_value: k must be in [1, {len(values)}], got {k}")
    bad = _first_nan_reference(values)
    if bad >= 0:
        _raise_nan("kth_value", bad, len(values))
    return float(_np.partition(values, k - 1)[k - 1])


def kth_value(u, k: int) -> float:
    """The k-th smallest value of the 1-D float tensor u, k = 1 .. len(u) (k = 1 is the minimum).

    Equal to ``numpy.partition(u, k - 1)[k - 1]``, exact, always one of the values of u. Works on
    order-preserving integer keys: radix select (CUDA: 11-bit digits; CPU: 16-bit digits, after a
    faster single pass that counts the keys below a range guessed from a sample and selects among
    the few inside it, whenever that range holds the k-th key). -0.0 orders before +0.0,
    so where numpy could return either zero this returns the one at rank k in that order (the two
    compare equal). A NaN anywhere is an error naming its first index.
    """
    u = _sampler_input(u, "kth_value")
    k = int(k)
    if not 1 <= k <= len(u):
        raise ValueError(f"clid.ops.kth_value: k must be in [1, {len(u)}], got {k}")
    ext = _kernel_module("kth_value", u)
    if ext is None:
        return kth_value_reference(u, k)
    return float(ext.sampler_kth_value(u, k))


def _percentile_index(m: int, q: float) -> tuple[int, float]:
    """numpy's 'linear' rule: virtual index (m - 1) * q / 100 -> (floor, fractional part)."""
    virtual = (m - 1) * (q / 100.0)  # the same float64 operations as numpy
    below = min(int(_math.floor(virtual)), m - 1)
    return below, virtual - below


def percentile_threshold(u, q: float, method: str = "linear") -> float:
    """The q-th percentile of u (0 <= q <= 100), equal to ``numpy.percentile(u, q, method=method)``.

    The index rule: with v = (M - 1) * q / 100 (float64) and j = floor(v),
      method="lower":  the (j + 1)-th smallest value, kth_value(u, j + 1) (an order statistic);
      method="linear": numpy's default (the authors' np.percentile(scores, p)): the (j + 1)-th and
                       (j + 2)-th smallest a, b interpolated as numpy does, in u's dtype:
                       a + (b - a) g, or b - (b - a)(1 - g) when g = v - j >= 0.5
                       (a when g = 0 or a == b; the infinite end if a or b is infinite, where
                       numpy returns NaN).
    The threshold T_i of step 6 is percentile_threshold(u, c * i).
    """
    u = _sampler_input(u, "percentile_threshold")
    if len(u) == 0:
        raise ValueError("clid.ops.percentile_threshold: u is empty")
    q = float(q)
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"clid.ops.percentile_threshold: q must be in [0, 100], got {q}")
    if method not in ("linear", "lower"):
        raise ValueError(f"clid.ops.percentile_threshold: method must be 'linear' or 'lower', got {method!r}")
    m = len(u)
    below, gamma = _percentile_index(m, q)
    a = kth_value(u, below + 1)
    if method == "lower" or below + 1 >= m or gamma == 0.0:
        return a
    b = kth_value(u, below + 2)
    if a == b:
        return a
    if _math.isinf(a) or _math.isinf(b):  # numpy gives NaN here; the limit is the infinite end
        return a if _math.isinf(a) else b
    scalar = _np.float32 if u.dtype == torch.float32 else _np.float64
    a, b = scalar(a), scalar(b)
    diff = b - a  # numpy's _lerp with a Python-scalar q: arithmetic in u's dtype
    value = b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma
    return float(value)


# ---- the sampler's reference: the kernels' per-item math in NumPy, bit for bit ----------------
# (csrc/common/philox.h and csrc/common/sampler_math.h spell out the same operations.)

def _philox4x32_10(c0, c1, c2, c3, k0: int, k1: int):
    """Philox4x32-10 on uint32 arrays (the counter-based generator of Random123)."""
    m0, m1 = _np.uint64(0xD2511F53), _np.uint64(0xCD9E8D57)
    k0, k1 = _np.uint32(k0), _np.uint32(k1)
    w0, w1 = _np.uint32(0x9E3779B9), _np.uint32(0xBB67AE85)
    c0, c1, c2, c3 = (_np.asarray(c, dtype=_np.uint32) for c in (c0, c1, c2, c3))
    with _np.errstate(over="ignore"):
        for round_ in range(10):
            if round_:
                k0, k1 = k0 + w0, k1 + w1
            p0 = m0 * c0.astype(_np.uint64)
            p1 = m1 * c2.astype(_np.uint64)
            c0, c1, c2, c3 = ((p1 >> _np.uint64(32)).astype(_np.uint32) ^ c1 ^ k0, p1.astype(_np.uint32),
                              (p0 >> _np.uint64(32)).astype(_np.uint32) ^ c3 ^ k1, p0.astype(_np.uint32))
    return c0, c1, c2, c3


def _item_bits52(m: int, seed: int, iteration: int) -> _np.ndarray:
    """The 52 random bits of items 0..m-1: Philox block (i >> 1, iteration) under key seed, words
    0-1 for even i, 2-3 for odd i, top 52 of their 64 bits."""
    pair = _np.arange((m + 1) // 2, dtype=_np.uint64)
    x = _philox4x32_10(pair.astype(_np.uint32), (pair >> _np.uint64(32)).astype(_np.uint32),
                       _np.full(pair.shape, iteration & 0xFFFFFFFF, _np.uint32),
                       _np.full(pair.shape, iteration >> 32, _np.uint32), seed & 0xFFFFFFFF, seed >> 32)
    top = lambda hi, lo: ((hi.astype(_np.uint64) << _np.uint64(32)) | lo.astype(_np.uint64)) >> _np.uint64(12)
    bits = _np.empty(2 * len(pair), _np.uint64)
    bits[0::2], bits[1::2] = top(x[0], x[1]), top(x[2], x[3])
    return bits[:m]


_H = float.fromhex
_LN2_HI, _LN2_LO = _H("0x1.62e42fee00000p-1"), _H("0x1.a39ef35793c76p-33")
_INV_LN2, _SHIFTER, _SQRT2 = _H("0x1.71547652b82fep+0"), _H("0x1.8p52"), _H("0x1.6a09e667f3bcdp+0")
_ZERO_WEIGHT_KEY = _np.uint64(0x7FF0000000000000)


def _one_plus_exp(y: _np.ndarray) -> _np.ndarray:
    """1 + exp(y) for y in [-40, 700], the operations of sampler_math.h's one_plus_exp."""
    t = y * _INV_LN2 + _SHIFTER
    n = t - _SHIFTER
    r = (y - n * _LN2_HI) - n * _LN2_LO
    r2 = r * r
    r4 = r2 * r2
    r8 = r4 * r4
    p0 = 0.5 + r * _H("0x1.5555555555555p-3")
    p1 = _H("0x1.5555555555555p-5") + r * _H("0x1.1111111111111p-7")
    p2 = _H("0x1.6c16c16c16c17p-10") + r * _H("0x1.a01a01a01a01ap-13")
    p3 = _H("0x1.a01a01a01a01ap-16") + r * _H("0x1.71de3a556c734p-19")
    p4 = _H("0x1.27e4fb7789f5cp-22") + r * _H("0x1.ae64567f544e4p-26")
    p5 = _H("0x1.1eed8eff8d898p-29")
    q = ((p0 + r2 * p1) + r4 * (p2 + r2 * p3)) + r8 * (p4 + r2 * p5)
    expm1_r = r + r2 * q
    n_bits = t.view(_np.uint64) - _np.float64(_SHIFTER).view(_np.uint64)
    scale = ((n_bits + _np.uint64(1023)) << _np.uint64(52)).view(_np.float64)
    return 1.0 + (scale + scale * expm1_r)


def _exponential_from_bits(j52: _np.ndarray) -> _np.ndarray:
    """E = -log(1 - j 2^-52), the operations of sampler_math.h's exponential_from_bits."""
    u = 2.0 - (_np.uint64(0x3FF0000000000000) | j52).view(_np.float64)
    ub = u.view(_np.uint64)
    e = (ub >> _np.uint64(52)).astype(_np.int64) - 1023
    m = ((ub & _np.uint64(0x000FFFFFFFFFFFFF)) | _np.uint64(0x3FF0000000000000)).view(_np.float64)
    high = m > _SQRT2
    m = _np.where(high, m * 0.5, m)
    e = _np.where(high, e + 1, e)
    f = m - 1.0
    s = f / (2.0 + f)
    z = s * s
    z2 = z * z
    z4 = z2 * z2
    z8 = z4 * z4
    a0 = _H("0x1.5555555555555p-2") + z * _H("0x1.999999999999ap-3")
    a1 = _H("0x1.2492492492492p-3") + z * _H("0x1.c71c71c71c71cp-4")
    a2 = _H("0x1.745d1745d1746p-4") + z * _H("0x1.3b13b13b13b14p-4")
    a3 = _H("0x1.1111111111111p-4") + z * _H("0x1.e1e1e1e1e1e1ep-5")
    p = z * (((a0 + z2 * a1) + z4 * (a2 + z2 * a3)) + z8 * _H("0x1.af286bca1af28p-5"))
    two_s = s + s
    log_m = two_s + two_s * p
    ed = e.astype(_np.float64)
    return 0.0 - (ed * _LN2_HI + (ed * _LN2_LO + log_m))


def _weight_denominator(u: _np.ndarray, threshold: float, s: float) -> _np.ndarray:
    """D = 1 / f(u) = 1 + exp(-2 (u - T) / s), +inf for a zero weight (sampler_math.h)."""
    u = u.astype(_np.float64)
    with _np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        slope = _np.float64(-2.0) / _np.float64(s)
        y = (u - threshold) * slope
        smooth = _one_plus_exp(_np.where((y >= -40.0) & (y <= 700.0), y, 0.0))
        den = _np.where(y > 700.0, _np.inf, _np.where(y < -40.0, 1.0, smooth))
    return _np.where((u == threshold) | _math.isinf(s), 2.0, den)


def _check_weight_params(threshold, s, op: str) -> tuple[float, float]:
    threshold, s = float(threshold), float(s)
    if _math.isnan(threshold):
        raise ValueError(f"clid.ops.{op}: threshold is NaN")
    if _math.isnan(s) or s < 0:
        raise ValueError(f"clid.ops.{op}: s must be >= 0 (0 = hard step, inf = constant), got {s}")
    return threshold, s


def smoothstep_weights(u, threshold: float, s: float) -> _np.ndarray:
    """The weights f(u) = 0.5 * (1 + tanh((u - T) / s)) as the kernels compute them (float64).

    Computed as 1 / (1 + exp(-2 (u - T) / s)), the same function without the rounding of
    tanh to -1: f is zero only for u < T - 350 s. s = 0 is the hard step (1 above T, 0 below),
    s = inf the constant 1/2, and u == T gives 1/2 for any s.
    """
    threshold, s = _check_weight_params(threshold, s, "smoothstep_weights")
    values = _sampler_input(u, "smoothstep_weights").cpu().numpy()
    return 1.0 / _weight_denominator(values, threshold, s)


def smoothstep_keys_reference(u, threshold: float, s: float, seed: int, iteration: int) -> _np.ndarray:
    """Every item's exponential key E_i / f_i as the uint64 bits of a non-negative double
    (0x7FF0000000000000, the bits of +inf, for a zero weight); the kernels' keys bit for bit."""
    threshold, s = _check_weight_params(threshold, s, "smoothstep_sample")
    values = _sampler_input(u, "smoothstep_sample").cpu().numpy()
    seed = _check_uint64(seed, "seed", "smoothstep_sample")
    iteration = _check_uint64(iteration, "iteration", "smoothstep_sample")
    den = _weight_denominator(values, threshold, s)
    with _np.errstate(invalid="ignore", over="ignore"):
        key = (_exponential_from_bits(_item_bits52(len(values), seed, iteration)) * den).view(_np.uint64)
    return _np.minimum(key, _ZERO_WEIGHT_KEY)


def _k_smallest(keys: _np.ndarray, k: int) -> _np.ndarray:
    """Sorted indices of the k smallest keys, ties by index."""
    return _np.sort(_np.argsort(keys, kind="stable")[:k])


def smoothstep_sample_reference(u, threshold: float, s: float, k: int | None, seed: int, iteration: int,
                                mode: str = "successive") -> torch.Tensor:
    """smoothstep_sample in NumPy (materialises every key): the same indices as the kernels."""
    tensor = _sampler_input(u, "smoothstep_sample")
    values = tensor.cpu().numpy()
    k = _check_sample_args(len(values), k, mode)
    bad = _first_nan_reference(values)
    if bad >= 0:
        _raise_nan("smoothstep_sample", bad, len(values))
    keys = smoothstep_keys_reference(values, threshold, s, seed, iteration)
    if mode == "bernoulli":
        seed, iteration = int(seed), int(iteration)
        v = (_np.uint64(0x3FF0000000000000) | _item_bits52(len(values), seed, iteration)).view(_np.float64) - 1.0
        chosen = _np.flatnonzero(v < 1.0 / _weight_denominator(values, float(threshold), float(s)))
    elif k in (0, len(values)):
        chosen = _np.arange(k)
    else:
        chosen = _k_smallest(keys, k)
        positive = int((keys < _ZERO_WEIGHT_KEY).sum())
        if positive < k:
            _warn_fill(positive, len(values), k)
            order = _np.where(keys < _ZERO_WEIGHT_KEY, _np.uint64(0), ~_order_keys(values))
            chosen = _k_smallest(order, k)
    return torch.from_numpy(chosen.astype(_np.int64)).to(tensor.device)


def _order_keys(values: _np.ndarray) -> _np.ndarray:
    """Order-preserving unsigned keys (sampler_math.h's ord_key), as uint64."""
    if values.dtype == _np.float32:
        bits = values.view(_np.uint32).astype(_np.uint64)
        sign = _np.uint64(0x80000000)
        return _np.where(bits & sign, ~bits & _np.uint64(0xFFFFFFFF), bits | sign)
    bits = values.view(_np.uint64)
    sign = _np.uint64(0x8000000000000000)
    return _np.where(bits & sign, ~bits, bits | sign)


def _warn_fill(positive: int, m: int, k: int):
    warnings.warn(f"clid.ops.smoothstep_sample: only {positive} of {m} items have a positive weight "
                  f"(u > T - 350 s); took them all and the {k - positive} others with the largest u",
                  RuntimeWarning, stacklevel=3)


def _check_sample_args(m: int, k, mode: str) -> int | None:
    if mode not in _SAMPLER_MODES:
        raise ValueError(f"clid.ops.smoothstep_sample: mode must be one of {_SAMPLER_MODES}, got {mode!r}")
    if mode == "bernoulli":
        if k is not None:
            raise ValueError("clid.ops.smoothstep_sample: mode='bernoulli' draws a random number of items; pass k=None")
        return None
    if k is None or isinstance(k, bool) or not isinstance(k, (int, _np.integer)) or not 0 <= int(k) <= m:
        raise ValueError(f"clid.ops.smoothstep_sample: k must be an integer in [0, {m}], got {k!r}")
    return int(k)


def smoothstep_sample(u, threshold: float, s: float, k: int | None, seed: int, iteration: int,
                      mode: str = "successive") -> torch.Tensor:
    """Draw items with weights f(u) = 0.5 * (1 + tanh((u - T) / s)); sorted int64 indices into u.

    mode="successive": k distinct items drawn one after another with probability proportional
      to f among those not yet drawn -- the distribution of
      ``numpy.random.choice(M, k, replace=False, p=f / f.sum())``, the authors' draw. Computed by
      exponential keys (Efraimidis-Spirakis): key_i = E_i / f_i with E_i ~ Exp(1), the k smallest
      win (ties by index).
    mode="bernoulli": each item kept independently with probability f_i; pass k=None.

    Randomness: Philox4x32-10 keyed by the seed, counter (item index, iteration); the indices
    depend only on (u, threshold, s, k, seed, iteration, mode): the same on CPU and CUDA, for any
    thread count, and in the NumPy reference fallback. Weights and keys are recomputed on the fly;
    nothing of size M is stored besides the output (a candidate buffer of ~1% of M on the CPU).

    Schedules: s = 0 is the hard step (f = 1 above T, 0 below: a uniform draw among u > T);
    s = inf, or u == T for all items, gives every item f = 1/2 (the constant schedule, a uniform
    draw). f is computed as 1 / (1 + exp(-2 (u - T) / s)), which is zero only for u < T - 350 s.
    Fewer than k positive weights (the authors' numpy code raises there): every positive-weight
    item is taken and the rest filled by descending u (ties by index), with a RuntimeWarning.
    k = 0 gives an empty tensor and k = M all indices. M beyond 2**24 is fine (torch.multinomial
    refuses it). A NaN in u is an error naming its first index. seed and iteration are integers
    in [0, 2**64).
    """
    u = _sampler_input(u, "smoothstep_sample")
    k = _check_sample_args(len(u), k, mode)
    threshold, s = _check_weight_params(threshold, s, "smoothstep_sample")
    seed = _check_uint64(seed, "seed", "smoothstep_sample")
    iteration = _check_uint64(iteration, "iteration", "smoothstep_sample")
    ext = _kernel_module("smoothstep_sample", u)
    if ext is None:
        return smoothstep_sample_reference(u, threshold, s, k, seed, iteration, mode)
    if mode == "bernoulli":
        return ext.sampler_bernoulli(u, threshold, s, seed, iteration)
    indices, _path, filled, positive = ext.sampler_successive(u, threshold, s, k, seed, iteration, 0)
    if filled:
        _warn_fill(positive, len(u), k)
    return indices


def _smoothstep_sample_path(u, threshold: float, s: float, k: int, seed: int, iteration: int,
                            force: str | None = None) -> tuple[torch.Tensor, str]:
    """Tests: the kernel's draw with its k-th-key search forced ('window' or 'radix'), and the
    path it took ('trivial', 'window' or 'radix')."""
    u = _sampler_input(u, "smoothstep_sample")
    force_code = {None: 0, "window": 1, "radix": 2}[force]
    indices, path, _filled, _positive = extension().sampler_successive(u, float(threshold), float(s), int(k), seed,
                                                                       iteration, force_code)
    return indices, ("trivial", "window", "radix")[path]


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


if __name__ == "__main__":
    sys.exit(main())
