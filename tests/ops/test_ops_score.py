"""The fused Eq. 2 scoring kernels (clid.ops) against float64 PyTorch references.

Tolerances are error bounds computed from the data, not constants tuned to pass. The kernels
read float32/float16/bfloat16 inputs exactly into float32, so the float64 reference computed on the
same (already rounded) input values differs from them only by float32 arithmetic. With u = 2^-24 the
unit roundoff of float32, a row z with maximum M, softmax weights w_v and t_v = M - z_v >= 0:

- each exp(z_v - M) is off by a relative (t_v + 8) u: the subtraction rounds the argument by
  t_v u, and the polynomial / expf adds at most a few ulp (8 u covers both the CPU polynomial
  and CUDA's expf with margin);
- the sum s of the exps is a chain of at most n = ceil(V / 64) + 64 roundings of positive partial
  sums (per-lane or per-thread running sums, chunk rescales, the lane / warp merge tree), each
  relative u, so the relative error of s is <= sum_v w_v (t_v + 8) u + 2 n u (the factor 2 counts
  the rescale multiply next to each add);
- log(s) adds 2 |log s| u, the final (z_y - M) - log(s) adds |z_y - M| u + |result| u.

The hidden-state path adds the error of the logits themselves: any summation order of the H
products of a dot product is off by at most (H + 1) u sum_k |h_k w_vk| (the +1 for the bias add),
and log_softmax(z)[y] moves by at most |dz_y| + sum_v w_v |dz_v| when z moves by dz.
"""
import math
import subprocess
import sys

import pytest
import torch
from conftest import run_script

import clid.ops as ops

U = 2.0 ** -24  # float32 unit roundoff
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU on this machine")


ROW_BLOCK, VOCAB_TILE, SLAB_ROWS = torch.ops.clid.hidden_tiling()  # token_logprob_hidden's fixed tiling
ISAS = ("base", "avx2", "avx512")  # the CPU kernels' copies (csrc/cpu/isa.h)


# ---------------------------------------------------------------------------------------------
# Float64 references and error bounds

def row_terms(rows64: torch.Tensor, y: torch.Tensor):
    """Per row: the exact log_softmax at y and its float32 error bound (module docstring)."""
    V = rows64.shape[-1]
    exact = torch.log_softmax(rows64, -1).gather(-1, y[..., None])[..., 0]
    M = rows64.amax(-1, keepdim=True)
    finite = torch.isfinite(M)
    t = torch.where(finite, M - rows64, torch.zeros_like(rows64))
    w = torch.softmax(torch.where(finite, rows64, torch.zeros_like(rows64)), -1)
    t = torch.where(torch.isinf(t), torch.zeros_like(t), t)          # -inf entries have w = 0
    n_chain = math.ceil(V / 64) + 64
    s = torch.exp(torch.logsumexp(torch.where(finite, rows64 - M, torch.zeros_like(rows64)), -1))
    zy_minus_m = (rows64.gather(-1, y[..., None])[..., 0] - M[..., 0]).abs()
    zy_minus_m = torch.where(torch.isfinite(zy_minus_m), zy_minus_m, torch.zeros_like(zy_minus_m))
    bound = U * ((w * (t + 8)).sum(-1) + 2 * n_chain + 2 * s.log().abs() + zy_minus_m
                 + torch.where(torch.isfinite(exact), exact.abs(), torch.zeros_like(exact)))
    return exact, bound, w


def seq_expected(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor):
    """Per caption: the float64 mean log-probability and its bound (the mean of the row bounds)."""
    mask = mask != 0
    rows = logits.double()[mask]
    y = targets.long()[mask]
    exact, bound, _ = row_terms(rows, y)
    lengths = mask.sum(1)
    mean = ops.segment_mean_reference(exact, lengths=lengths)
    tol = ops.segment_mean_reference(bound, lengths=lengths) + U * mean.abs().nan_to_num(0.0)
    return mean, tol.nan_to_num(0.0)


def assert_within(got: torch.Tensor, expected: torch.Tensor, tol: torch.Tensor, what: str):
    """|got - expected| <= tol elementwise, with NaN and +-inf required at the same places."""
    got = got.double().cpu()
    assert got.shape == expected.shape, f"{what}: shape {tuple(got.shape)} != {tuple(expected.shape)}"
    same_special = (torch.isnan(got) == torch.isnan(expected)) & (torch.isinf(got) == torch.isinf(expected))
    assert bool(same_special.all()), f"{what}: NaN/inf pattern differs:\n{got}\n{expected}"
    finite = torch.isfinite(expected)
    assert bool((got[torch.isinf(expected)] == expected[torch.isinf(expected)]).all()), f"{what}: wrong inf sign"
    err = (got[finite] - expected[finite]).abs()
    ratio = err / tol[finite]
    assert bool((err <= tol[finite]).all()), (
        f"{what}: error {err.max().item():.3g} exceeds the bound (worst error/bound ratio {ratio.max().item():.3g})")


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.float().contiguous().view(torch.int32), b.float().contiguous().view(torch.int32))


def random_captions(N, T, V, dtype, gen, scale=4.0, device="cpu"):
    """Logits, targets and a mask with every caption length from 0 to T (0 = fully padded)."""
    logits = (torch.randn(N, T, V, generator=gen) * scale).to(dtype)
    targets = torch.randint(0, V, (N, T), generator=gen)
    lengths = torch.randint(0, T + 1, (N,), generator=gen)
    lengths[0], lengths[-1] = 1, 0                     # a length-1 caption and a fully padded row
    mask = torch.arange(T)[None, :] < lengths[:, None]
    targets[~mask] = -100                              # ignored where unmasked, as in training code
    return logits.to(device), targets.to(device), mask.to(device)


# ---------------------------------------------------------------------------------------------
# seq_logprob / token_logprob

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("V", [1, 15, 17, 129, 1000, 30522])
def test_seq_logprob_matches_float64(dtype, V):
    gen = torch.Generator().manual_seed(V)
    N, T = (5, 7) if V == 30522 else (9, 13)
    logits, targets, mask = random_captions(N, T, V, dtype, gen)
    got = ops.seq_logprob(logits, targets, mask)
    expected, tol = seq_expected(logits, targets, mask)
    assert got.dtype == torch.float32 and got.shape == (N,)
    assert torch.isnan(got[-1]) and not torch.isnan(got[0])   # padded row -> NaN, length 1 -> a value
    assert_within(got, expected, tol, f"seq_logprob {dtype} V={V}")


def extreme_logits(gen, V: int) -> torch.Tensor:
    """[6, 4, V] logits: a 1% of +1e4 and of -1e4, 5% of -inf, the rest N(0, 9)."""
    logits = torch.randn(6, 4, V, generator=gen) * 3
    big = torch.rand(6, 4, V, generator=gen)
    logits[big < 0.01] = 1e4
    logits[big > 0.99] = -1e4
    logits[(big > 0.4) & (big < 0.45)] = -math.inf
    return logits


@pytest.mark.parametrize("dtype", DTYPES)
def test_extreme_logits(dtype):
    """+-1e4 logits, -inf entries, a -inf target, an all -inf row, the maximum in the row's tail."""
    gen = torch.Generator().manual_seed(1)
    V = 30522
    logits = extreme_logits(gen, V)
    logits[1, 0, :] = -1e4
    logits[1, 0, V - 3] = 1e4                             # the maximum among the last, partial vector
    logits[1, 1, :] = -math.inf
    logits[1, 1, 5] = 2.0                                 # one finite entry in a -inf row
    logits[2, 0, :] = -math.inf                           # all -inf -> NaN (as log_softmax)
    targets = torch.randint(0, V, (6, 4), generator=gen)
    targets[1, 0], targets[1, 1] = V - 3, 5
    targets[3, 2] = int((logits[3, 2] == -math.inf).nonzero()[0])   # a -inf target -> -inf
    logits = logits.to(dtype)
    mask = torch.ones(6, 4, dtype=torch.bool)
    rows = ops.token_logprob(logits, targets)
    exact, bound, _ = row_terms(logits.double(), targets)
    assert_within(rows, exact, bound, f"token_logprob extremes {dtype}")
    assert rows[1, 0] == 0 and rows[1, 1] == 0             # a single dominant logit: log 1
    assert torch.isnan(rows[2, 0]) and rows[3, 2] == -math.inf
    expected, tol = seq_expected(logits, targets, mask)
    assert_within(ops.seq_logprob(logits, targets, mask), expected, tol, f"seq_logprob extremes {dtype}")


def test_nan_propagates():
    logits = torch.randn(2, 3, 200)
    logits[0, 1, 77] = math.nan
    got = ops.seq_logprob(logits, torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 3))
    assert torch.isnan(got[0]) and torch.isfinite(got[1])


def test_strided_logits_and_int32_targets():
    gen = torch.Generator().manual_seed(2)
    base = torch.randn(8, 10, 333, generator=gen)
    logits = base[1::2, ::3]                              # strided along N and T, contiguous along V
    targets = torch.randint(0, 333, logits.shape[:2], generator=gen, dtype=torch.int32)
    mask = torch.rand(logits.shape[:2], generator=gen) > 0.2
    expected, tol = seq_expected(logits, targets, mask)
    assert_within(ops.seq_logprob(logits, targets, mask), expected, tol, "strided logits")


def test_targets_checked_only_where_masked():
    logits = torch.randn(2, 3, 50)
    targets = torch.tensor([[1, 2, 50], [3, -1, 4]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 1]])
    assert torch.isfinite(ops.seq_logprob(logits, targets, mask)).all()
    mask[0, 2] = 1
    with pytest.raises(RuntimeError, match=r"target 50 at position \[0, 2\] is outside the vocabulary \[0, 50\)"):
        ops.seq_logprob(logits, targets, mask)


def test_token_logprob_shapes():
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 4, 5, 97, generator=gen, dtype=torch.float32).to(torch.bfloat16)
    targets = torch.randint(0, 97, (3, 4, 5), generator=gen)
    got = ops.token_logprob(logits, targets)
    exact, bound, _ = row_terms(logits.double(), targets)
    assert got.shape == (3, 4, 5)
    assert_within(got, exact, bound, "token_logprob 4-D")


def test_seq_logprob_deterministic_and_thread_independent():
    gen = torch.Generator().manual_seed(4)
    logits, targets, mask = random_captions(16, 9, 30522, torch.float32, gen)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = ops.seq_logprob(logits, targets, mask)
        torch.set_num_threads(2)
        two = ops.seq_logprob(logits, targets, mask)
        again = ops.seq_logprob(logits, targets, mask)
    finally:
        torch.set_num_threads(threads)
    assert bitwise_equal(one, two) and bitwise_equal(two, again)


# ---------------------------------------------------------------------------------------------
# token_logprob_hidden

def hidden_expected(hidden, weight, bias, targets):
    """Float64 log-probabilities and their bound: the logits path bound plus the GEMM error."""
    h, w = hidden.double(), weight.double()
    z = h @ w.T + (bias.double() if bias is not None else 0.0)
    exact, bound, softmax = row_terms(z, targets.long())
    H = h.shape[1]
    dz = (H + 1) * U * (h.abs() @ w.abs().T) + U * z.abs()          # per-logit error bound
    bound = bound + dz.gather(1, targets.long()[:, None])[:, 0] + (softmax * dz).sum(1)
    return exact, bound


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("P,H,V,with_bias", [(1, 8, 1, True), (129, 40, 1000, True), (300, 64, 3001, False),
                                              (37, 96, 30522, True)])
def test_hidden_matches_float64(dtype, P, H, V, with_bias):
    gen = torch.Generator().manual_seed(P * 7 + V)
    hidden = torch.randn(P, H, generator=gen).to(dtype)
    weight = (torch.randn(V, H, generator=gen) * (2.0 / math.sqrt(H))).to(dtype)
    bias = (torch.randn(V, generator=gen)).to(dtype) if with_bias else None
    targets = torch.randint(0, V, (P,), generator=gen)
    got = ops.token_logprob_hidden(hidden, weight, bias, targets)
    exact, bound = hidden_expected(hidden, weight, bias, targets)
    assert got.dtype == torch.float32 and got.shape == (P,)
    assert_within(got, exact, bound, f"token_logprob_hidden {dtype} P={P} H={H} V={V}")


def test_hidden_more_rows_than_a_slab():
    """Rows are processed in slabs (bounded memory); the last, partial slab and its partial row
    block are right, and the result does not depend on the thread count."""
    gen = torch.Generator().manual_seed(11)
    P, H, V = SLAB_ROWS + ROW_BLOCK + 37, 12, 700
    hidden = torch.randn(P, H, generator=gen)
    weight = torch.randn(V, H, generator=gen) * 0.5
    targets = torch.randint(0, V, (P,), generator=gen)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = ops.token_logprob_hidden(hidden, weight, None, targets)
    finally:
        torch.set_num_threads(threads)
    got = ops.token_logprob_hidden(hidden, weight, None, targets)
    exact, bound = hidden_expected(hidden, weight, None, targets)
    assert_within(got, exact, bound, "hidden, several slabs")
    assert bitwise_equal(one, got)


def test_hidden_extreme_logits():
    """Logits near +-1e4 through the hidden path: a weight row aligned with the hidden state."""
    gen = torch.Generator().manual_seed(5)
    P, H, V = 20, 16, 700
    hidden = torch.randn(P, H, generator=gen)
    weight = torch.randn(V, H, generator=gen)
    bias = torch.zeros(V)
    bias[V - 1] = 1e4                                       # in the last, partial vocabulary tile
    bias[3] = -1e4
    targets = torch.randint(0, V, (P,), generator=gen)
    targets[:3] = torch.tensor([V - 1, 3, 0])
    got = ops.token_logprob_hidden(hidden, weight, bias, targets)
    exact, bound = hidden_expected(hidden, weight, bias, targets)
    assert_within(got, exact, bound, "hidden extremes")


def test_hidden_deterministic_thread_and_alignment_independent():
    """Bitwise equal across runs, thread counts and the inputs' memory alignment (BLAS may pick
    kernels by alignment: the tile GEMMs must not)."""
    gen = torch.Generator().manual_seed(6)
    P, H, V = 300, 96, 3001                                   # several row blocks and vocabulary tiles
    hidden = torch.randn(P, H, generator=gen)
    weight = torch.randn(V, H, generator=gen) * 0.2
    bias = torch.randn(V, generator=gen)
    targets = torch.randint(0, V, (P,), generator=gen)
    shifted_h = torch.empty(P * H + 3)[3:].view(P, H).copy_(hidden)     # 12-byte offset
    shifted_w = torch.empty(V * H + 1)[1:].view(V, H).copy_(weight)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = ops.token_logprob_hidden(hidden, weight, bias, targets)
        torch.set_num_threads(2)
        two = ops.token_logprob_hidden(hidden, weight, bias, targets)
        again = ops.token_logprob_hidden(hidden, weight, bias, targets)
        shifted = ops.token_logprob_hidden(shifted_h, shifted_w, bias, targets)
    finally:
        torch.set_num_threads(threads)
    assert bitwise_equal(one, two) and bitwise_equal(two, again) and bitwise_equal(two, shifted)


def test_hidden_rows_do_not_depend_on_the_batch():
    """A position's score does not depend on its batch: scored alone (a 1-row GEMM, which BLAS may
    round differently from a 128-row one) and in a batch, both are within the bound of the exact
    value, so they differ by at most twice the bound."""
    gen = torch.Generator().manual_seed(7)
    hidden = torch.randn(200, 32, generator=gen)
    weight = torch.randn(800, 32, generator=gen) * 0.3
    targets = torch.randint(0, 800, (200,), generator=gen)
    batch = ops.token_logprob_hidden(hidden, weight, None, targets)
    alone = torch.stack([ops.token_logprob_hidden(hidden[i:i + 1], weight, None, targets[i:i + 1])[0]
                         for i in (0, 127, 128, 199)])
    _, bound = hidden_expected(hidden, weight, None, targets)
    idx = torch.tensor([0, 127, 128, 199])
    assert bool(((batch[idx] - alone).abs().double() <= 2 * bound[idx]).all())


def test_hidden_bad_input_messages():
    hidden, weight = torch.randn(4, 8), torch.randn(10, 8)
    with pytest.raises(RuntimeError, match=r"target 10 at position \[2\] is outside the vocabulary \[0, 10\)"):
        ops.token_logprob_hidden(hidden, weight, None, torch.tensor([0, 1, 10, 2]))
    with pytest.raises(RuntimeError, match="hidden must be \\[P, H\\] and weight \\[V, H\\]"):
        ops.token_logprob_hidden(hidden, torch.randn(10, 7), None, torch.zeros(4, dtype=torch.long))
    with pytest.raises(RuntimeError, match="float32, float16 or bfloat16"):
        torch.ops.clid.token_logprob_hidden(hidden.int(), weight, None, torch.zeros(4, dtype=torch.long))


# ---------------------------------------------------------------------------------------------
# segment_mean

def test_segment_mean_lengths_and_ids():
    gen = torch.Generator().manual_seed(8)
    values = torch.randn(50, generator=gen)
    lengths = torch.tensor([3, 0, 1, 20, 0, 26])
    got = ops.segment_mean(values, lengths=lengths)
    expected = torch.stack([values[s:s + n].double().mean() if n else torch.tensor(math.nan, dtype=torch.float64)
                            for s, n in zip([0, 3, 3, 4, 24, 24], lengths.tolist())])
    assert_within(got, expected, U * expected.abs().nan_to_num(0.0) * 2 + 1e-12, "segment_mean lengths")
    # the same segments as unsorted ids (as 05 produces them: position by position over captions)
    ids = torch.repeat_interleave(torch.arange(6), lengths)
    perm = torch.randperm(50, generator=gen)
    by_ids = ops.segment_mean(values[perm], segment_ids=ids[perm], num_segments=6)
    assert_within(by_ids, expected, U * expected.abs().nan_to_num(0.0) * 2 + 1e-12, "segment_mean ids")
    assert torch.equal(ops.segment_mean(values[perm], segment_ids=ids[perm], num_segments=8)[6:].isnan(),
                       torch.tensor([True, True]))
    with pytest.raises(RuntimeError, match="lengths sum to 49 but there are 50 values"):
        ops.segment_mean(values, lengths=torch.tensor([49]))


# ---------------------------------------------------------------------------------------------
# The build: every CPU copy of the kernels, the ops' registration, no silent fallback

@pytest.mark.parametrize("isa", ISAS)
def test_every_instruction_set_matches_the_reference(isa, monkeypatch):
    """Each CPU copy of the kernels (CLID_CPU_ISA lowers the run-time choice) is within the bounds."""
    monkeypatch.setenv("CLID_CPU_ISA", isa)
    gen = torch.Generator().manual_seed(21)
    for dtype in DTYPES:
        logits, targets, mask = random_captions(5, 9, 1003, dtype, gen)
        expected, tol = seq_expected(logits, targets, mask)
        assert_within(ops.seq_logprob(logits, targets, mask), expected, tol, f"{isa} seq_logprob {dtype}")
        hidden = torch.randn(ROW_BLOCK + 5, 24, generator=gen).to(dtype)
        weight = (torch.randn(VOCAB_TILE + 77, 24, generator=gen) * 0.5).to(dtype)
        targets = torch.randint(0, weight.shape[0], (hidden.shape[0],), generator=gen)
        exact, bound = hidden_expected(hidden, weight, None, targets)
        assert_within(ops.token_logprob_hidden(hidden, weight, None, targets), exact, bound, f"{isa} hidden {dtype}")


def test_opcheck_every_scoring_op():
    """The schemas, the fake (meta) implementations and the registrations agree with the kernels."""
    gen = torch.Generator().manual_seed(22)
    logits, targets = torch.randn(3, 5, 101, generator=gen), torch.randint(0, 101, (3, 5), generator=gen)
    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [0, 1, 0, 1, 0]])  # (no empty caption: NaN != NaN)
    torch.library.opcheck(torch.ops.clid.seq_logprob.default, (logits, targets, mask))
    torch.library.opcheck(torch.ops.clid.token_logprob.default, (logits, targets))
    torch.library.opcheck(torch.ops.clid.segment_mean.default, (torch.randn(9, generator=gen), torch.tensor([4, 2, 3])))
    hidden, weight = torch.randn(7, 16, generator=gen), torch.randn(101, 16, generator=gen)
    for bias in (None, torch.randn(101, generator=gen)):
        torch.library.opcheck(torch.ops.clid.token_logprob_hidden.default,
                              (hidden, weight, bias, torch.randint(0, 101, (7,), generator=gen)))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ELF shared objects")
def test_the_extension_uses_the_shared_libstdcxx():
    """A toolchain that links libstdc++ statically by default gives clid._C a second, uninitialised
    C++ locale beside torch's: every error message holding a number then crashes (seen on a GPU
    machine whose GCC did so). setup.py names the shared library."""
    import clid._C
    dynamic = subprocess.run(["readelf", "-d", clid._C.__file__], capture_output=True, text=True, check=True).stdout
    assert "[libstdc++.so.6]" in dynamic
    symbols = subprocess.run(["nm", "--defined-only", clid._C.__file__], capture_output=True, text=True).stdout
    assert "_ZNKSt6locale2id5_M_idEv" not in symbols      # std::locale::id::_M_id: libstdc++'s, not ours


def test_without_the_extension_the_import_fails_naming_the_fix():
    """No silent fallback to the references: a missing clid._C is one clear ImportError."""
    code = "import sys\nsys.modules['clid._C'] = None\nimport clid.ops\n"
    proc = run_script("-c", code, check=False)
    assert proc.returncode != 0
    assert "clid._C, the compiled kernels, is not built" in proc.stderr
    assert "pip install --no-build-isolation -e ." in proc.stderr


def test_gpu_tensors_need_a_cuda_build():
    if ops.with_cuda():
        pytest.skip("this build has CUDA kernels")
    from clid.ops.device import check_device

    class FakeCuda:  # a CPU-only machine has no CUDA tensor to pass: the check itself is tested
        is_cuda = True
    with pytest.raises(RuntimeError, match="built without CUDA kernels"):
        check_device("seq_logprob", FakeCuda())


# ---------------------------------------------------------------------------------------------
# GPU (skipped without a GPU)

@CUDA
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_seq_logprob(dtype):
    gen = torch.Generator().manual_seed(9)
    logits, targets, mask = random_captions(7, 11, 30522, dtype, gen)
    expected, tol = seq_expected(logits, targets, mask)
    got = ops.seq_logprob(logits.cuda(), targets.cuda(), mask.cuda())
    assert_within(got, expected, tol, f"cuda seq_logprob {dtype}")
    assert bitwise_equal(got, ops.seq_logprob(logits.cuda(), targets.cuda(), mask.cuda()))


@CUDA
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_hidden(dtype):
    gen = torch.Generator().manual_seed(10)
    P, H, V = 133, 72, 30522
    hidden = torch.randn(P, H, generator=gen).to(dtype)
    weight = (torch.randn(V, H, generator=gen) * 0.25).to(dtype)
    bias = torch.randn(V, generator=gen).to(dtype)
    targets = torch.randint(0, V, (P,), generator=gen)
    targets[:2] = torch.tensor([0, V - 1])
    exact, bound = hidden_expected(hidden, weight, bias, targets)
    got = ops.token_logprob_hidden(hidden.cuda(), weight.cuda(), bias.cuda(), targets.cuda())
    assert_within(got, exact, bound, f"cuda token_logprob_hidden {dtype}")
    assert bitwise_equal(got, ops.token_logprob_hidden(hidden.cuda(), weight.cuda(), bias.cuda(), targets.cuda()))


@CUDA
def test_cuda_extremes_and_segments():
    V = 1000
    logits = torch.randn(3, 2, V)
    logits[0, 0, V - 1] = 1e4
    logits[0, 1, :] = -math.inf
    logits[1, 0, 10] = -math.inf
    targets = torch.tensor([[V - 1, 0], [10, 3], [4, 5]])
    exact, bound, _ = row_terms(logits.double(), targets)
    assert_within(ops.token_logprob(logits.cuda(), targets.cuda()), exact, bound, "cuda extremes")
    values = torch.randn(10)
    lengths = torch.tensor([0, 4, 6])
    assert_within(ops.segment_mean(values.cuda(), lengths=lengths.cuda()),
                  ops.segment_mean_reference(values.double(), lengths=lengths), torch.full((3,), 1e-6), "cuda segments")


@CUDA
def test_opcheck_on_cuda():
    gen = torch.Generator().manual_seed(12)
    logits, targets, mask = random_captions(5, 7, 301, torch.float32, gen)
    mask[:, 0], targets[:, 0] = True, 3                   # (no empty caption: NaN != NaN)
    logits, targets, mask = logits.cuda(), targets.cuda(), mask.cuda()
    torch.library.opcheck(torch.ops.clid.seq_logprob.default, (logits, targets, mask))
    # (token_logprob scores every position: its targets must all be inside the vocabulary)
    torch.library.opcheck(torch.ops.clid.token_logprob.default, (logits, targets.clamp(min=0)))
    torch.library.opcheck(torch.ops.clid.segment_mean.default,
                          (torch.randn(9, generator=gen).cuda(), torch.tensor([4, 2, 3]).cuda()))
    hidden, weight = torch.randn(13, 8, generator=gen).cuda(), torch.randn(301, 8, generator=gen).cuda()
    torch.library.opcheck(torch.ops.clid.token_logprob_hidden.default,
                          (hidden, weight, torch.randn(301, generator=gen).cuda(), targets.clamp(min=0).flatten()[:13].contiguous()))


# The CUDA seq_logprob and token_logprob_hidden run without host synchronisation: their target check
# is a device-side assertion, and token_logprob_hidden's product is cuBLAS's, a tile at a time.

@CUDA
@pytest.mark.parametrize("V", [1, 15, 17, 30522])
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_seq_logprob_unaligned_rows_and_target_types(dtype, V):
    """Rows that start off a 16-byte boundary (an odd V, a sliced tensor), int32 and int64 targets,
    bool and float masks: all equal the float64 reference, with no host synchronisation."""
    gen = torch.Generator().manual_seed(V + 31)
    logits, targets, mask = random_captions(6, 9, V + 1, dtype, gen)
    logits = logits[:, :, 1:]                             # every row starts one element past its storage
    targets = targets.clamp(max=V - 1)
    expected, tol = seq_expected(logits, targets.clamp(min=0), mask)
    z, y = logits.cuda(), targets.clamp(min=0).cuda()
    for yt, m in ((y, mask.cuda()), (y.int(), mask.float().cuda())):
        torch.cuda.set_sync_debug_mode("error")
        try:
            got = ops.seq_logprob(z, yt, m)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert_within(got, expected, tol, f"cuda seq_logprob {dtype} V={V} {yt.dtype} {m.dtype}")


@CUDA
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_extreme_logits(dtype):
    """The CPU test's extremes through the CUDA seq_logprob and token_logprob_hidden."""
    gen = torch.Generator().manual_seed(1)
    V = 30522
    logits = extreme_logits(gen, V)
    logits[1, 0, V - 3] = 3e4
    logits[2, 0, :] = -math.inf                           # all -inf -> NaN
    targets = torch.randint(0, V, (6, 4), generator=gen)
    targets[1, 0] = V - 3
    logits = logits.to(dtype)
    mask = torch.ones(6, 4, dtype=torch.bool)
    mask[4, 1:] = False                                   # a length-1 caption
    mask[5] = False                                       # a fully padded one: NaN
    expected, tol = seq_expected(logits, targets, mask)
    assert_within(ops.seq_logprob(logits.cuda(), targets.cuda(), mask.cuda()), expected, tol, f"cuda extremes {dtype}")
    P, H = 40, 16
    hidden = torch.randn(P, H, generator=gen).to(dtype)
    weight = torch.randn(V, H, generator=gen).to(dtype)
    bias = torch.zeros(V)
    bias[V - 1], bias[3] = 1e4, -1e4                      # in the last, partial vocabulary tile
    targets = torch.randint(0, V, (P,), generator=gen)
    targets[:3] = torch.tensor([V - 1, 3, 0])
    exact, bound = hidden_expected(hidden, weight, bias, targets)
    got = ops.token_logprob_hidden(hidden.cuda(), weight.cuda(), bias.cuda(), targets.cuda())
    assert_within(got, exact, bound, f"cuda hidden extremes {dtype}")


@CUDA
@pytest.mark.parametrize("hdtype,wdtype", [(torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16),
                                           (torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32)])
def test_cuda_hidden_tiles_and_row_blocks(hdtype, wdtype):
    """More rows than one row block (8,192 at this vocabulary) and a vocabulary of three tiles, the last
    partial; mixed input types; a length-1 input; no host synchronisation; bitwise repeatable."""
    gen = torch.Generator().manual_seed(13)
    P, H, V = 8192 + 37, 24, 2 * 1024 + 77
    hidden = torch.randn(P, H, generator=gen).to(hdtype)
    weight = (torch.randn(V, H, generator=gen) * 0.3).to(wdtype)
    bias = torch.randn(V, generator=gen)
    targets = torch.randint(0, V, (P,), generator=gen)
    targets[:4] = torch.tensor([0, V - 1, 1023, 1024])  # both sides of a tile edge
    h, w, b, y = hidden.cuda(), weight.cuda(), bias.cuda(), targets.cuda()
    exact, bound = hidden_expected(h, w, b, y)
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = ops.token_logprob_hidden(h, w, b, y)
        again = ops.token_logprob_hidden(h, w, b, y)
        one = ops.token_logprob_hidden(h[5:6], w, b, y[5:6])
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert_within(got, exact.cpu(), bound.cpu(), f"cuda hidden {hdtype} x {wdtype}")
    assert_within(one, exact[5:6].cpu(), bound[5:6].cpu(), "cuda hidden, one row")
    assert bitwise_equal(got, again)


@CUDA
def test_cuda_hidden_memory_is_bounded():
    """BERT-base's head over 16,384 positions: the op's extra GPU memory stays under 5% of the logits."""
    gen = torch.Generator(device="cuda").manual_seed(14)
    P, H, V = 16384, 768, 30522
    hidden = torch.randn(P, H, generator=gen, device="cuda").bfloat16()
    weight = (torch.randn(V, H, generator=gen, device="cuda") / math.sqrt(H)).bfloat16()
    targets = torch.randint(0, V, (P,), generator=gen, device="cuda")
    ops.token_logprob_hidden(hidden, weight, None, targets)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    ops.token_logprob_hidden(hidden, weight, None, targets)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - before
    logits = P * V * 2
    assert extra <= 0.05 * logits, f"{extra / 2**20:.1f} MiB extra, {100 * extra / logits:.1f}% of the logits"


@CUDA
@pytest.mark.parametrize("call,message", [
    ("ops.seq_logprob(torch.randn(2, 3, 50, device='cuda'), torch.tensor([[1, 2, 50], [3, 4, 5]], device='cuda'), "
     "torch.ones(2, 3, dtype=torch.bool, device='cuda'))",
     "seq_logprob: target 50 at position [0, 2] is outside the vocabulary [0, 50)"),
    ("ops.token_logprob_hidden(torch.randn(4, 8, device='cuda'), torch.randn(10, 8, device='cuda'), None, "
     "torch.tensor([0, 1, -1, 2], device='cuda'))",
     "token_logprob_hidden: target -1 at position [2] is outside the vocabulary [0, 10)"),
])
def test_cuda_bad_target_is_a_device_assertion(call, message):
    """A target outside the vocabulary stops the process with a device-side assertion that names it
    (run in a subprocess: the assertion ends the CUDA context)."""
    code = f"import torch\nimport clid.ops as ops\nout = {call}\ntorch.cuda.synchronize()\nprint('no error')\n"
    proc = run_script("-c", code, check=False)
    assert proc.returncode != 0 and "no error" not in proc.stdout
    assert message in proc.stdout + proc.stderr
