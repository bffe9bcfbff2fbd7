"""The sampler ops (clid.ops: kth_value, percentile_threshold, smoothstep_sample) against exact
references: numpy.partition / numpy.percentile, the bit-exact NumPy reference of the per-item
keys (clid/selection/reference.py), and exact successive-sampling probabilities computed by enumeration; every
CPU instruction-set copy of the kernels; the ops' registration (torch.library.opcheck)."""
import hashlib
import itertools
import math
import warnings

import numpy as np
import pytest
import torch
from scipy import stats

from clid import ops
from clid.ops.sampler import as_int64
from clid.selection.reference import (
    _exponential_from_bits,
    _one_plus_exp,
    _philox4x32_10,
    smoothstep_keys_reference,
    smoothstep_sample_reference,
    smoothstep_weights,
)

needs_gpu = pytest.mark.skipif(not (torch.cuda.is_available() and ops.with_cuda()),
                               reason="needs a GPU and a CUDA build of clid._C")
ISAS = ("base", "avx2", "avx512")  # the CPU kernels' copies (csrc/cpu/isa.h); a CPU runs those it supports


def keys_of(u, threshold, s, seed, iteration) -> np.ndarray:
    """The kernel's per-item keys (uint64)."""
    return torch.ops.clid.smoothstep_keys(torch.as_tensor(u), threshold, s, as_int64(seed),
                                         as_int64(iteration)).cpu().numpy().view(np.uint64)


def radix_kth(u, k) -> float:
    """kth_value by the radix select (the path taken when the sampled window misses)."""
    return float(torch.ops.clid.kth_value(torch.as_tensor(u), k, True))


def forced_path(u, threshold, s, k, seed, iteration, force):
    """The draw with the k-th key's search forced ('window' or 'radix'), and the path it took."""
    code = {"window": 1, "radix": 2}[force]
    indices, info = torch.ops.clid.smoothstep_successive(u, float(threshold), float(s), int(k), as_int64(seed),
                                                             as_int64(iteration), code)
    return indices, ("trivial", "window", "radix")[int(info[0])]


def awkward_scores(m: int, dtype, seed: int = 0) -> np.ndarray:
    """Normal scores plus the values that break naive code: +-inf, +-0, huge, exact ties."""
    rng = np.random.default_rng(seed)
    u = rng.normal(size=m).astype(dtype)
    special = np.array([np.inf, -np.inf, 0.0, -0.0, 1e30, -1e30, 0.25, 0.25, 3.0, -3.0], dtype)
    u[:len(special)] = special[:m]
    return u


# ---- Philox and the per-item math -----------------------------------------------------------

def test_philox_known_answers():
    # Random123's kat_vectors, "philox4x32 10": counter, key -> output.
    cases = [((0, 0, 0, 0), (0, 0), (0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8)),
             ((0xffffffff,) * 4, (0xffffffff,) * 2, (0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd)),
             ((0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344), (0xa4093822, 0x299f31d0),
              (0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1))]
    for counter, key, expected in cases:
        out = _philox4x32_10(*[np.array([c], np.uint32) for c in counter], *key)
        assert tuple(int(w[0]) for w in out) == expected


def test_reference_math_is_accurate():
    # 1 + exp(y) and -log(1 - j 2^-52) within a few units in the last place of libm's values.
    y = np.concatenate([np.linspace(-40, 700, 200001), [-40.0, 0.0, 1e-300, -1e-300, 700.0]])
    rel = np.abs(_one_plus_exp(y) / (1.0 + np.exp(y)) - 1.0)
    assert rel.max() < 4 * 2.0 ** -52
    j = np.concatenate([np.random.default_rng(1).integers(0, 2 ** 52, 200000, dtype=np.uint64),
                        np.array([0, 1, 2, 2 ** 51, 2 ** 52 - 1], np.uint64)])
    exact = -np.log1p(-(j.astype(np.float64) * 2.0 ** -52))
    got = _exponential_from_bits(j)
    assert got[-5] == 0.0 and abs(got[-1] - 36.04365338911715) < 1e-13  # U = 1 and U = 2^-52
    ok = exact > 0
    assert (np.abs(got[ok] / exact[ok] - 1.0)).max() < 4 * 2.0 ** -52


def test_weights_match_the_tanh_formula_and_the_schedules():
    u = np.linspace(-6, 6, 1001)
    f = smoothstep_weights(u, 0.5, 1.5)
    np.testing.assert_allclose(f, 1 / (1 + np.exp((u - 0.5) * (-2 / 1.5))), rtol=4 * 2.0 ** -52, atol=0)
    # 1 + tanh cancels near -1, so the tanh form itself is only accurate to ~1e-16 absolute
    np.testing.assert_allclose(f, 0.5 * (1 + np.tanh((u - 0.5) / 1.5)), rtol=0, atol=4 * 2.0 ** -53)
    # far below T, tanh rounds to -1 (the authors' weight is 0); ours stays positive until 350 s
    assert 0.5 * (1 + np.tanh(-40.0)) == 0.0 and smoothstep_weights(np.array([-40.0]), 0.0, 1.0)[0] > 0
    assert smoothstep_weights(np.array([-351.0]), 0.0, 1.0)[0] == 0.0
    hard = smoothstep_weights(np.array([-1.0, 0.0, 1e-30, 2.0, np.inf, -np.inf]), 0.0, 0.0)
    assert hard.tolist() == [0.0, 0.5, 1.0, 1.0, 1.0, 0.0]
    constant = smoothstep_weights(np.array([-1e30, 0.0, 5.0, np.inf, -np.inf]), 2.0, math.inf)
    assert constant.tolist() == [0.5] * 5
    assert smoothstep_weights(np.array([np.inf]), np.inf, 1.0)[0] == 0.5  # u == T


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kernel_keys_equal_the_reference_bit_for_bit(dtype):
    u = awkward_scores(100_003, dtype)
    settings = [(0.3, 1.0, 0, 0), (0.3, 0.0, 2 ** 64 - 1, 2 ** 64 - 1), (0.3, math.inf, 12345, 7),
                (-1.0, 0.01, 1, 2 ** 33), (math.inf, 1.0, 5, 5), (-math.inf, 1.0, 5, 6), (0.0, 1e-300, 9, 9)]
    for threshold, s, seed, iteration in settings:
        got = keys_of(u, threshold, s, seed, iteration)
        want = smoothstep_keys_reference(u, threshold, s, seed, iteration)
        bad = np.flatnonzero(got != want)
        assert bad.size == 0, f"T={threshold} s={s}: keys differ at {bad[:5]}"


# ---- k-th value and percentiles -------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kth_value_equals_numpy_partition(dtype):
    rng = np.random.default_rng(3)
    for m in (1, 2, 7, 1000, 65537, 300_001):
        zeros = np.where(rng.random(m) < 0.5, -0.0, 0.0)
        zeros[::7], zeros[::11] = np.inf, -np.inf
        for u in (awkward_scores(m, dtype, m), rng.integers(-3, 4, m).astype(dtype), zeros.astype(dtype)):
            for k in sorted({1, m, max(1, m // 2), max(1, m // 50), max(1, m - 3)}):
                got = ops.kth_value(torch.from_numpy(u), k)
                radix = radix_kth(u, k)  # the fallback path
                want = np.partition(u, k - 1)[k - 1]
                assert got == want and radix == want, (m, k, got, radix, want)
                if want != 0:
                    assert np.array(got, dtype).tobytes() == want.tobytes()


def test_kth_value_bucket_larger_than_the_collection_cap():
    # half the values in one 16-bit bucket: the radix select takes its second histogram pass
    u = np.full(1_000_000, 1.0, np.float32)
    u[::2] = np.float32(1.0) + np.arange(500_000, dtype=np.float32) * np.float32(2 ** -23)
    for k in (1, 250_000, 600_000, 1_000_000):
        want = np.partition(u, k - 1)[k - 1]
        assert ops.kth_value(u, k) == want and radix_kth(u, k) == want


def test_kth_value_rejects_nan_and_bad_k():
    u = torch.randn(100)
    u[37] = float("nan")
    u[60] = float("nan")
    with pytest.raises(ValueError, match=r"u\[37\] is NaN"):
        ops.kth_value(u, 3)
    with pytest.raises(ValueError, match=r"u\[37\] is NaN"):
        ops.kth_value_reference(u, 3)
    with pytest.raises(ValueError, match=r"u\[37\] is NaN"):
        radix_kth(u, 3)
    with pytest.raises(ValueError, match=r"k must be in \[1, 5\]"):
        ops.kth_value(torch.zeros(5), 0)
    with pytest.raises(ValueError, match=r"k must be in \[1, 5\]"):
        ops.kth_value(torch.zeros(5), 6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_percentile_threshold_equals_numpy_percentile(dtype):
    rng = np.random.default_rng(4)
    for m in (1, 2, 3, 101, 1000, 54321):
        u = rng.normal(size=m).astype(dtype)
        for q in (0, 2, 4, 2.5, 33.3, 50, 98, 99.99, 100):
            assert ops.percentile_threshold(u, q) == np.percentile(u, q), (m, q)
            assert ops.percentile_threshold(u, q, method="lower") == np.percentile(u, q, method="lower"), (m, q)
    with pytest.raises(ValueError, match=r"q must be in \[0, 100\]"):
        ops.percentile_threshold(u, 101)


# ---- successive sampling: the exact distribution --------------------------------------------

def successive_probabilities(w: np.ndarray, k: int) -> tuple[dict, np.ndarray, np.ndarray]:
    """Exact successive sampling: probability of every k-subset, and first- and second-order
    inclusion probabilities, by enumerating the ordered draws."""
    subsets, total = {}, w.sum()
    for order in itertools.permutations(range(len(w)), k):
        p, left = 1.0, total
        for i in order:
            p *= w[i] / left
            left -= w[i]
        key = tuple(sorted(order))
        subsets[key] = subsets.get(key, 0.0) + p
    pi, pij = np.zeros(len(w)), np.zeros((len(w), len(w)))
    for subset, p in subsets.items():
        idx = list(subset)
        pi[idx] += p
        pij[np.ix_(idx, idx)] += p
    return subsets, pi, pij


def inclusion_statistic(counts: np.ndarray, n: int, mean: np.ndarray, cov: np.ndarray) -> float:
    """Chi-square statistic of inclusion frequencies: n d' S^-1 d over the first M-1 items, with S
    the exact covariance of the inclusion indicators (they sum to k, so one item is left out);
    chi-square with M-1 degrees of freedom when the mean and covariance are the sampler's."""
    d = counts / n - mean
    r = slice(0, len(mean) - 1)
    return float(n * d[r] @ np.linalg.solve(cov[r, r], d[r]))


def test_successive_sampling_matches_exact_probabilities():
    u = np.array([-2.5, -1.5, -0.8, -0.3, 0.0, 0.4, 1.0, 2.2], np.float32)
    threshold, s, k, n = 0.0, 1.0, 3, 6000
    w = smoothstep_weights(u, threshold, s)
    subsets, pi, pij = successive_probabilities(w, k)
    counts, subset_counts = np.zeros(len(u)), {key: 0 for key in subsets}
    tensor = torch.from_numpy(u)
    for iteration in range(n):
        chosen = torch.ops.clid.smoothstep_successive(tensor, threshold, s, k, 2024, iteration)[0].numpy()
        counts[chosen] += 1
        subset_counts[tuple(chosen)] += 1
    dof, cov = len(u) - 1, pij - np.outer(pi, pi)
    statistic = inclusion_statistic(counts, n, pi, cov)
    assert stats.chi2.sf(statistic, dof) > 1e-3, (statistic, counts / n, pi)
    # the test has power: the same frequencies reject inclusion in proportion to f
    wrong = k * w / w.sum()
    assert stats.chi2.sf(inclusion_statistic(counts, n, wrong, cov), dof) < 1e-6
    # and the joint law of the drawn subsets, C(8, 3) = 56 cells
    observed = np.array([subset_counts[key] for key in subsets])
    expected = n * np.array(list(subsets.values()))
    assert stats.chisquare(observed, expected).pvalue > 1e-3


def test_bernoulli_inclusion_frequencies():
    u = np.linspace(-3, 3, 13).astype(np.float32)
    f = smoothstep_weights(u, 0.5, 1.0)
    n = 4000
    tensor, counts = torch.from_numpy(u), np.zeros(len(u))
    for iteration in range(n):
        counts[ops.smoothstep_sample(tensor, 0.5, 1.0, None, 7, iteration, mode="bernoulli").numpy()] += 1
    statistic = float(np.sum((counts - n * f) ** 2 / (n * f * (1 - f))))  # independent binomials
    assert stats.chi2.sf(statistic, len(u)) > 1e-3


def test_hard_and_constant_schedules_are_uniform():
    u = np.array([-1.0, -0.5, 0.1, 0.2, 0.3, 0.7, 1.5, 2.0], np.float32)
    n = 3000
    hard, constant = np.zeros(len(u)), np.zeros(len(u))
    tensor = torch.from_numpy(u)
    for iteration in range(n):
        hard[ops.smoothstep_sample(tensor, 0.0, 0.0, 3, 1, iteration).numpy()] += 1
        constant[ops.smoothstep_sample(tensor, 0.0, math.inf, 3, 1, iteration).numpy()] += 1
    assert hard[:2].sum() == 0  # below T: weight 0
    assert stats.chisquare(hard[2:]).pvalue > 1e-3  # uniform among the six above T
    assert stats.chisquare(constant).pvalue > 1e-3  # uniform among all


# ---- determinism, paths, threads, edge cases ------------------------------------------------

def test_same_arguments_same_draw_and_paths_agree_with_the_reference():
    u = awkward_scores(300_001, np.float32, 9)
    tensor = torch.from_numpy(u)
    for threshold, s, k in [(0.0, 1.0, 270_000), (0.5, 0.0, 80_000), (0.0, math.inf, 150_000), (1.0, 0.3, 2)]:
        reference = smoothstep_sample_reference(u, threshold, s, k, 11, 3)
        window, path_w = forced_path(tensor, threshold, s, k, 11, 3, "window")
        radix, path_r = forced_path(tensor, threshold, s, k, 11, 3, "radix")
        plain = ops.smoothstep_sample(tensor, threshold, s, k, 11, 3)
        assert (path_w, path_r) == ("window", "radix")
        assert torch.equal(window, reference) and torch.equal(radix, reference) and torch.equal(plain, reference)
        assert len(plain) == k and bool((plain[1:] > plain[:-1]).all())
    a = ops.smoothstep_sample(tensor, 0.0, 1.0, 1000, 11, 4)
    assert not torch.equal(a, ops.smoothstep_sample(tensor, 0.0, 1.0, 1000, 11, 5))  # another iteration
    assert not torch.equal(a, ops.smoothstep_sample(tensor, 0.0, 1.0, 1000, 12, 4))  # another seed
    assert torch.equal(a, ops.smoothstep_sample(tensor, 0.0, 1.0, 1000, 11, 4))


# Draws at M = 1,000,003 as the kernels drew them before their window pass kept its record (the
# sha256 of the int64 indices, first 24 hex digits): a faster kernel must keep every draw.
FROZEN_DRAWS = [  # (scores, dtype, T, s, seed, iteration, k, digest, [path, filled, positive])
    ("normal", np.float32, -2.05, 1.0, 0, 1, 900_002, "c59d907b1c7e2afe8cd27a51", [1, 0, -1]),
    ("normal", np.float32, -2.05, 1.0, 12345, 7, 500_001, "c20b790ddcb5202664652220", [1, 0, -1]),
    ("ties", np.float32, 0.3, 0.3, 2 ** 64 - 1, 2 ** 40 + 3, 500_001, "6f13beed808ba495df2d8e21", [1, 0, -1]),
    ("awkward", np.float64, 3.0, 0.005, 12345, 7, 20_000, "a1c0c4b2261217751b41f527", [1, 0, -1]),
    ("normal", np.float64, 0.0, 0.0, 0, 1, 900_002, "95641cfcc975a8d5b25f0027", [1, 1, 500_082]),
    ("ties", np.float32, 3.0, 0.005, 0, 1, 500_001, "2b6ee1fcaf0d4128264eaeec", [1, 1, 130_339]),
]


def frozen_scores(kind: str, dtype, m: int = 1_000_003) -> np.ndarray:
    u = np.random.default_rng(m % 97).normal(size=m)
    if kind == "ties":
        u = np.round(u * 4) / 4
    if kind == "awkward":
        u[:10] = [np.inf, -np.inf, 0.0, -0.0, 1e30, -1e30, 0.25, 0.25, 3.0, -3.0]
    return u.astype(dtype)


@pytest.mark.parametrize("threads", [1, 2])
def test_draws_are_the_frozen_ones(threads):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for kind, dtype, threshold, s, seed, iteration, k, digest, info in FROZEN_DRAWS:
            u = torch.from_numpy(frozen_scores(kind, dtype))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # (the draws that fill by u)
                indices, got = torch.ops.clid.smoothstep_successive(u, threshold, s, k, as_int64(seed),
                                                                    as_int64(iteration), 0)
            assert hashlib.sha256(indices.numpy().tobytes()).hexdigest()[:24] == digest, (kind, threshold, s, seed, k)
            assert got.tolist() == info
    finally:
        torch.set_num_threads(before)


def test_thread_count_does_not_change_the_draw():
    u = torch.from_numpy(awkward_scores(1_500_000, np.float32, 10))
    before = torch.get_num_threads()
    try:
        draws = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            draws.append((ops.smoothstep_sample(u, 0.0, 1.0, 1_350_000, 5, 1),
                          ops.smoothstep_sample(u, 0.0, 1.0, None, 5, 1, mode="bernoulli"),
                          ops.kth_value(u, 30_000)))
    finally:
        torch.set_num_threads(before)
    for other in draws[1:]:
        assert torch.equal(draws[0][0], other[0]) and torch.equal(draws[0][1], other[1]) and draws[0][2] == other[2]


def test_bernoulli_equals_the_reference():
    u = awkward_scores(100_001, np.float64, 12)
    for threshold, s in [(0.0, 1.0), (0.5, 0.0), (0.0, math.inf), (-100.0, 1.0)]:
        got = ops.smoothstep_sample(u, threshold, s, None, 3, 8, mode="bernoulli")
        assert torch.equal(got, smoothstep_sample_reference(u, threshold, s, None, 3, 8, mode="bernoulli"))


def test_fewer_positive_weights_than_k_fills_by_descending_u():
    rng = np.random.default_rng(13)
    u = rng.normal(size=50_000).astype(np.float32)
    threshold, s = 3.0, 0.005  # weight zero below T - 1.75: all but about 2000 items
    positive = np.flatnonzero(smoothstep_weights(u, threshold, s) > 0)
    k = 20_000
    with pytest.warns(RuntimeWarning, match=f"only {len(positive)} of 50000 items have a positive weight"):
        got = ops.smoothstep_sample(u, threshold, s, k, 1, 1).numpy()
    assert set(positive) <= set(got)
    rest = np.setdiff1d(got, positive)
    others = np.setdiff1d(np.arange(len(u)), got)
    assert len(rest) == k - len(positive) and u[rest].min() >= u[np.setdiff1d(others, positive)].max()
    with pytest.warns(RuntimeWarning):
        assert np.array_equal(got, smoothstep_sample_reference(u, threshold, s, k, 1, 1).numpy())
        radix, _ = forced_path(torch.from_numpy(u), threshold, s, k, 1, 1, "radix")
    assert np.array_equal(got, radix.numpy())
    # ties in u among the zero weights are broken by index
    tied = np.full(10, -5.0, np.float32)
    tied[[2, 7]] = 1.0
    with pytest.warns(RuntimeWarning):
        assert ops.smoothstep_sample(tied, 0.0, 0.0, 5, 0, 0).tolist() == [0, 1, 2, 3, 7]


def test_edge_cases():
    u = torch.randn(1000)
    assert ops.smoothstep_sample(u, 0.0, 1.0, 0, 1, 1).tolist() == []
    assert torch.equal(ops.smoothstep_sample(u, 0.0, 1.0, 1000, 1, 1), torch.arange(1000))
    assert ops.smoothstep_sample(torch.zeros(0), 0.0, 1.0, 0, 1, 1).tolist() == []
    assert ops.smoothstep_sample(torch.ones(1), 0.0, 1.0, 1, 1, 1).tolist() == [0]
    # numpy and half-precision input, the same draw as float32
    half = torch.randn(5000).half()
    assert torch.equal(ops.smoothstep_sample(half, 0.1, 1.0, 100, 4, 4),
                       ops.smoothstep_sample(half.float().numpy(), 0.1, 1.0, 100, 4, 4))
    bad = torch.randn(5000)
    bad[4321] = float("nan")
    with pytest.raises(ValueError, match=r"u\[4321\] is NaN"):
        ops.smoothstep_sample(bad, 0.0, 1.0, 10, 1, 1)
    with pytest.raises(ValueError, match=r"u\[4321\] is NaN"):
        ops.smoothstep_sample(bad, 0.0, 1.0, None, 1, 1, mode="bernoulli")
    with pytest.raises(ValueError, match=r"k must be an integer in \[0, 1000\]"):
        ops.smoothstep_sample(u, 0.0, 1.0, 1001, 1, 1)
    with pytest.raises(ValueError, match="pass k=None"):
        ops.smoothstep_sample(u, 0.0, 1.0, 10, 1, 1, mode="bernoulli")
    with pytest.raises(ValueError, match=r"seed must be an integer in \[0, 2\*\*64\)"):
        ops.smoothstep_sample(u, 0.0, 1.0, 10, -1, 1)
    with pytest.raises(ValueError, match="s must be >= 0"):
        ops.smoothstep_sample(u, 0.0, -1.0, 10, 1, 1)
    with pytest.raises(ValueError, match="threshold is NaN"):
        ops.smoothstep_sample(u, float("nan"), 1.0, 10, 1, 1)


def test_more_than_2_24_items():
    m = 2 ** 24 + 5
    u = torch.full((m,), -1000.0)
    u[2 ** 24:] = 5.0  # five positive weights, all beyond index 2^24
    assert ops.smoothstep_sample(u, 0.0, 1.0, 5, 1, 1).tolist() == list(range(2 ** 24, m))
    with pytest.warns(RuntimeWarning, match="only 5 of 16777221"):
        assert ops.smoothstep_sample(u, 0.0, 1.0, 7, 1, 1).tolist() == [0, 1] + list(range(2 ** 24, m))
    assert ops.kth_value(u, m - 4) == 5.0 and ops.kth_value(u, m - 5) == -1000.0
    with pytest.raises(RuntimeError):  # the peer that cannot do this
        torch.multinomial(torch.ones(m), 5, replacement=False)


@pytest.mark.parametrize("isa", ISAS)
def test_every_instruction_set_draws_the_reference_indices(isa, monkeypatch):
    """Each CPU copy of the kernels (CLID_CPU_ISA lowers the choice; a copy this CPU cannot run
    falls back to the best it can) gives the reference's keys, draws and k-th values."""
    monkeypatch.setenv("CLID_CPU_ISA", isa)
    running = ops.build_info().split("cpu kernels ")[1].split(",")[0]
    assert running == isa or ISAS.index(running) < ISAS.index(isa)  # (a CPU without that instruction set)
    u = awkward_scores(70_001, np.float32, 4)
    tensor = torch.from_numpy(u)
    assert np.array_equal(keys_of(u, 0.1, 1.0, 5, 6), smoothstep_keys_reference(u, 0.1, 1.0, 5, 6))
    for force in ("window", "radix"):
        assert torch.equal(forced_path(tensor, 0.1, 1.0, 60_000, 5, 6, force)[0],
                           smoothstep_sample_reference(u, 0.1, 1.0, 60_000, 5, 6))
    assert torch.equal(ops.smoothstep_sample(tensor, 0.1, 1.0, None, 5, 6, mode="bernoulli"),
                       smoothstep_sample_reference(u, 0.1, 1.0, None, 5, 6, mode="bernoulli"))
    for k in (1, 35_000, 70_001):
        assert ops.kth_value(tensor, k) == radix_kth(u, k) == np.partition(u, k - 1)[k - 1]


def test_opcheck_every_sampler_op():
    """The schemas, the fake (meta) implementations and the registrations agree with the kernels."""
    u = torch.from_numpy(awkward_scores(5_003, np.float32, 2))
    torch.library.opcheck(torch.ops.clid.kth_value.default, (u, 17))
    torch.library.opcheck(torch.ops.clid.smoothstep_successive.default, (u, 0.1, 1.0, 4_000, 3, 2))
    torch.library.opcheck(torch.ops.clid.smoothstep_keys.default, (u, 0.1, 1.0, 3, 2))
    torch.library.opcheck(torch.ops.clid.smoothstep_bernoulli.default, (u, 0.1, 1.0, 3, 2),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


# ---- GPU ------------------------------------------------------------------------------------

@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gpu_matches_cpu(dtype):
    u = torch.from_numpy(awkward_scores(400_003, np.float64, 21)).to(dtype)
    gpu = u.cuda()
    keys = torch.ops.clid.smoothstep_keys
    assert torch.equal(keys(gpu, 0.2, 1.0, 3, 4).cpu(), keys(u, 0.2, 1.0, 3, 4))
    for k in (1, 1000, 200_000, 399_999):
        assert ops.kth_value(gpu, k) == ops.kth_value(u, k)
        for threshold, s in [(0.2, 1.0), (0.0, 0.0), (0.0, math.inf)]:
            assert torch.equal(ops.smoothstep_sample(gpu, threshold, s, k, 3, 4).cpu(),
                               ops.smoothstep_sample(u, threshold, s, k, 3, 4))
    assert torch.equal(ops.smoothstep_sample(gpu, 0.2, 1.0, None, 3, 4, mode="bernoulli").cpu(),
                       ops.smoothstep_sample(u, 0.2, 1.0, None, 3, 4, mode="bernoulli"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert torch.equal(ops.smoothstep_sample(gpu, 3.0, 0.005, 300_000, 3, 4).cpu(),
                           ops.smoothstep_sample(u, 3.0, 0.005, 300_000, 3, 4))
    gpu[777] = float("nan")
    with pytest.raises(ValueError, match=r"u\[777\] is NaN"):
        ops.smoothstep_sample(gpu, 0.0, 1.0, 10, 1, 1)


@needs_gpu
def test_gpu_matches_cpu_above_2_24_items():
    """torch.multinomial refuses more than 2^24 categories; our draw takes them, the same on both devices."""
    m = 2**24 + 3
    u = torch.from_numpy(np.random.default_rng(5).normal(size=m).astype(np.float32))
    gpu = u.cuda()
    k = m // 3
    assert torch.equal(ops.smoothstep_sample(gpu, 0.1, 1.0, k, 7, 2).cpu(), ops.smoothstep_sample(u, 0.1, 1.0, k, 7, 2))
    assert ops.kth_value(gpu, m // 50) == ops.kth_value(u, m // 50)
