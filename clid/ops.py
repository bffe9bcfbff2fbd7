"""Fused kernels of the csrc/ extension, each next to the plain PyTorch reference it is tested against.

The extension (``clid_ops``) is built just in time with ``torch.utils.cpp_extension.load`` (ninja)
on first use: ``csrc/binding.cpp`` plus every ``csrc/cpu/*.cpp``, plus every ``csrc/cuda/*.cu`` when
PyTorch has CUDA and a CUDA toolkit is found. The build is cached under
``$XDG_CACHE_HOME/clid/torch_extensions/`` (``~/.cache`` by default; ``CLID_OPS_BUILD_DIR``
overrides it), in a folder keyed by the Python/torch versions, the CPU and the compiler flags, and
ninja rebuilds whatever source or header changed. If the build fails, or ``CLID_OPS_DISABLE=1``,
every wrapper warns once and runs its reference instead.

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

import hashlib
import os
import platform
import sys
import warnings
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


def compile_flags(with_cuda: bool) -> tuple[list[str], list[str]]:
    """Host and nvcc flags. -march=native is safe because the build folder is keyed by the CPU."""
    cflags = ["-O3", "-fopenmp", "-march=native", "-DNDEBUG"]
    cuda_flags = ["-O3", "-DNDEBUG", "--expt-relaxed-constexpr", "-lineinfo"]
    if with_cuda:
        cflags.append("-DCLID_WITH_CUDA")
        cuda_flags.append("-DCLID_WITH_CUDA")
    return cflags, cuda_flags


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


def build_directory(with_cuda: bool) -> Path:
    """The cache folder of this build: one per Python, torch, CPU, flags and CUDA-ness."""
    cflags, cuda_flags = compile_flags(with_cuda)
    key = "|".join([sys.version, torch.__version__, _cpu_fingerprint(), *cflags, *cuda_flags, str(with_cuda)])
    tag = hashlib.sha1(key.encode()).hexdigest()[:12]
    base = os.environ.get("CLID_OPS_BUILD_DIR")
    if not base:
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        base = os.path.join(cache, "clid", "torch_extensions")
    return Path(base) / f"{EXTENSION_NAME}_py{sys.version_info[0]}{sys.version_info[1]}_{tag}"


def _build(verbose: bool = False):
    from torch.utils.cpp_extension import load

    with_cuda = cuda_build_enabled()
    cflags, cuda_flags = compile_flags(with_cuda)
    folder = build_directory(with_cuda)
    folder.mkdir(parents=True, exist_ok=True)
    return load(name=EXTENSION_NAME, sources=[str(s) for s in sources(with_cuda)],
                extra_include_paths=[str(CSRC)], extra_cflags=cflags, extra_cuda_cflags=cuda_flags,
                extra_ldflags=["-fopenmp"], build_directory=str(folder), with_cuda=with_cuda,
                verbose=verbose)


def extension(verbose: bool = False):
    """The compiled ``clid_ops`` module (built on first call), or None if it cannot be built."""
    global _extension, _build_error
    if _extension is not None or _build_error is not None:
        return _extension
    if os.environ.get("CLID_OPS_DISABLE") == "1":
        _build_error = "disabled by CLID_OPS_DISABLE=1"
        return None
    try:
        _extension = _build(verbose=verbose or os.environ.get("CLID_OPS_VERBOSE") == "1")
    except Exception as err:  # a compiler error, a missing ninja, a broken toolchain: fall back
        _build_error = f"{type(err).__name__}: {str(err).strip().splitlines()[-1] if str(err).strip() else ''}"
    return _extension


def build_error() -> str | None:
    """Why the extension is not available (None if it is, or has not been tried yet)."""
    return _build_error


def _kernel_module(op: str):
    """The extension for ``op``, or None after warning once per op that the reference is used."""
    ext = extension()
    if ext is None and op not in _warned:
        _warned.add(op)
        warnings.warn(f"clid.ops.{op}: the C++ extension is unavailable ({_build_error}); "
                      f"using the slower PyTorch reference", RuntimeWarning, stacklevel=3)
    return ext


def _check_cuda_tensor(op: str, ext, *tensors) -> bool:
    """True if the inputs are on a GPU and this build has CUDA kernels; an error if GPU without them."""
    on_gpu = any(t is not None and t.is_cuda for t in tensors)
    if on_gpu and not ext.with_cuda():
        raise RuntimeError(f"clid.ops.{op}: inputs are on the GPU but the extension was built without CUDA")
    return on_gpu


# ---- score ops (C1) ----


# ---- sampler ops (C2) ----
