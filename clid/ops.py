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
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        compiler = [line for line in lines if "error:" in line]            # the compiler's own message
        errors = [line for line in lines if "error" in line.lower()]
        _build_error = f"{type(err).__name__}: {(compiler or errors or lines or [''])[0][:300]}"
    return _extension


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


def _check_cuda_tensor(op: str, ext, *tensors) -> bool:
    """True if the inputs are on a GPU and this build has CUDA kernels; an error if GPU without them."""
    on_gpu = any(t is not None and t.is_cuda for t in tensors)
    if on_gpu and not ext.with_cuda():
        raise RuntimeError(f"clid.ops.{op}: inputs are on the GPU but the extension was built without CUDA")
    return on_gpu


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
