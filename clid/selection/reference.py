"""Step 6's draw in NumPy, the reference the compiled sampler (clid.ops) is tested against.

:func:`schedule_draw` is the schedule at one iteration, read top to bottom. Below it, the kernels' per-item
arithmetic in NumPy, bit for bit (csrc/common/philox.h and csrc/common/sampler_math.h spell out the same
operations), and the draw computed from every key at once."""
from __future__ import annotations

import math as _math

import numpy as _np
import torch

from clid.ops.sampler import (
    _check_sample_args,
    _check_uint64,
    _check_weight_params,
    _first_nan_reference,
    _raise_nan,
    _sampler_input,
    _warn_fill,
)


def schedule_draw(u, iteration: int, c: float = 2.0, s: float = 1.0, seed: int = 0) -> _np.ndarray:
    """The pool indices drawn at ``iteration`` (sorted), as :func:`clid.selection.schedule.draw` draws them:

    T_i = the (c i)-th percentile of u; k = floor((100 - c i)% of the M captions); each caption j weighs
    f_j = 0.5 (1 + tanh((u_j - T_i) / s)); the k captions of smallest exponential key E_j / f_j are a draw
    of k without replacement, proportional to f (E_j: a unit exponential keyed by (seed, iteration, j)).
    """
    u = _np.asarray(u, dtype=_np.float32)
    percent = c * iteration
    k = _math.floor(len(u) * (100.0 - percent) / 100.0 + 1e-9)
    threshold = float(_np.percentile(u, percent))
    keys = smoothstep_keys_reference(u, threshold, s, seed, iteration)  # E_j / f_j, f as the kernels compute it
    return _k_smallest(keys, k)


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
