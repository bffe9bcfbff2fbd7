"""Smooth-step data selection (docs/method.md, step 6) and the percentile threshold T_i (clid._C).

    kth_value(u, k) -> float                              k-th smallest, 1-based
    percentile_threshold(u, q, method="linear") -> float  numpy.percentile(u, q[, method])
    smoothstep_sample(u, threshold, s, k, seed, iteration, mode="successive") -> int64 indices

kth_value has a NumPy reference here; the sampler's reference, the kernels' per-item arithmetic in
NumPy bit for bit, is clid/selection/reference.py.
"""
from __future__ import annotations

import math as _math
import warnings

import numpy as _np
import torch

from clid.ops.device import check_device

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

def _check_weight_params(threshold, s, op: str) -> tuple[float, float]:
    threshold, s = float(threshold), float(s)
    if _math.isnan(threshold):
        raise ValueError(f"clid.ops.{op}: threshold is NaN")
    if _math.isnan(s) or s < 0:
        raise ValueError(f"clid.ops.{op}: s must be >= 0 (0 = hard step, inf = constant), got {s}")
    return threshold, s


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
    check_device("kth_value", u)
    return float(torch.ops.clid.kth_value(u, k))


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
    thread count, and in the NumPy reference (clid/selection/reference.py). Weights and keys are computed on the fly;
    no key is stored (on the CPU: one bit per item, M/8 bytes, and a candidate buffer of ~1% of M).

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
    check_device("smoothstep_sample", u)
    if mode == "bernoulli":
        return torch.ops.clid.smoothstep_bernoulli(u, threshold, s, as_int64(seed), as_int64(iteration))
    indices, info = torch.ops.clid.smoothstep_successive(u, threshold, s, k, as_int64(seed), as_int64(iteration))
    _path, filled, positive = info.tolist()
    if filled:
        _warn_fill(positive, len(u), k)
    return indices



def as_int64(value: int) -> int:
    """A uint64 seed or iteration as the int64 with the same bits (the ops' schemas take int64)."""
    return value - _UINT64 if value >= 1 << 63 else value


# Shapes and dtypes of the ops' results without running them (fake tensors: torch.compile, export).

@torch.library.register_fake("clid::kth_value")
def _(u, k, force_radix=False):
    return u.new_empty(())


@torch.library.register_fake("clid::smoothstep_successive")
def _(u, threshold, s, k, seed, iteration, force_path=0):
    return u.new_empty(k, dtype=torch.long), u.new_empty(3, dtype=torch.long, device="cpu")


@torch.library.register_fake("clid::smoothstep_bernoulli")
def _(u, threshold, s, seed, iteration):
    return u.new_empty(torch.library.get_ctx().new_dynamic_size(), dtype=torch.long)


@torch.library.register_fake("clid::smoothstep_keys")
def _(u, threshold, s, seed, iteration):
    return u.new_empty(u.shape, dtype=torch.long)
