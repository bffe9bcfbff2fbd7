"""The tensor-core fused head, clid.ops.token_logprob_hidden_tc (csrc/cuda/fused_head.cu).

On the CPU: its exact tile schedule (csrc/common/fused_head.h: the CTAs' position tiles and vocabulary
splits, the rows' running max and sum per thread column group, the quad and warp merges, the split merge,
the masks of the ragged last tiles) emulated step by step in float32 NumPy, against float64 references;
its data movement (each thread's cp.async pieces, the swizzle, ldmatrix, the MMA fragments, the pipeline's
stages) emulated exactly on integer-valued inputs; its split plan; its API on the CPU. On a GPU (skipped
elsewhere): the kernel itself against the same references.

Error bound (the float32 analysis of tests/test_ops_score.py, with the kernel's own terms): u = 2^-24; a
row z with maximum M, softmax weights w_v, t_v = M - z_v. Each exp is 2^((z_v - m) * log2 e) with both
the subtraction and the product rounded and ex2.approx's relative error below 2^-22: (2 t_v + 8) u. The
sum of the exps is a chain of at most n = 16 + 3 tiles + 3 splits + 16 roundings (16 adds in a thread's
chunk, a rescale and an add per tile, the merges), each relative u, counted twice (the rescales' own
error). The logits: tensor-core sums of exact products (bf16 x bf16 and fp16 x fp16 are exact in
float32) may truncate rather than round, so 2 (H + 2) u sum_k |h_k w_vk|, plus u |b_v| for the bias add.
"""
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import clid.ops as ops

ROOT = Path(__file__).resolve().parents[2]
U = 2.0 ** -24
GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
HALF = [torch.float16, torch.bfloat16]
BM, BN, BK, STAGES, WARPS_M, WARPS_N, MAX_SPLITS = torch.ops.clid.tc_head_tiling()
WARP_COLS = BN // WARPS_N
LOG2E = np.float32(1.4426950408889634)
F32 = np.float32


# ---------------------------------------------------------------------------------------------
# The schedule, emulated

def vocab_tiles(V: int) -> int:
    return -(-V // BN)


def split_begin(k: int, splits: int, tiles: int) -> int:
    """First vocabulary tile of split k (csrc/common/fused_head.h)."""
    return k * tiles // splits


def thread_columns() -> np.ndarray:
    """[WARPS_N, 4, WARP_COLS // 4]: the columns of a tile whose running state one thread keeps (warp column
    wn, lane % 4 = q), in the order the thread adds them: wn * WARP_COLS + 8 j + 2 q + e, j-major."""
    j = np.arange(WARP_COLS // 8)[:, None] * 8
    e = np.arange(2)[None, :]
    return np.array([[(wn * WARP_COLS + 2 * q + j + e).ravel() for q in range(4)] for wn in range(WARPS_N)])


def lse_merge(am, a_s, bm, bs):
    """common/score.h's lse_merge, elementwise in float32: the larger maximum wins, the other sum rescaled;
    an empty side (-inf) adds 0; NaN propagates."""
    am, a_s, bm, bs = (np.asarray(x, dtype=F32) for x in (am, a_s, bm, bs))
    m = np.where(am > bm, am, bm)
    with np.errstate(invalid="ignore", over="ignore"):
        sa = np.where(am == -np.inf, F32(0), a_s * np.exp(am - m))
        sb = np.where(bm == -np.inf, F32(0), bs * np.exp(bm - m))
    s = (sa + sb).astype(F32)
    empty, nan = m == -np.inf, np.isnan(am) | np.isnan(bm)
    m, s = np.where(empty, F32(-np.inf), m), np.where(empty, F32(0), s)
    return np.where(nan, F32(np.nan), m).astype(F32), np.where(nan, F32(np.nan), s).astype(F32)


def exp2_ftz(x: np.ndarray) -> np.ndarray:
    """ex2.approx.ftz: results below 2^-126 flushed to 0."""
    with np.errstate(invalid="ignore", over="ignore"):
        return np.where(x < -126, F32(0), np.exp2(x)).astype(F32)


def emulate(hidden, weight, bias, targets, splits: int):
    """token_logprob_hidden_tc as its two kernels run it, in float32: (log p [P] float64, the number of
    writes of each position's target logit, the CTAs' (position tile, split) -> vocabulary tiles)."""
    P, H = hidden.shape
    V = weight.shape[0]
    tiles = vocab_tiles(V)
    assert 1 <= splits <= min(tiles, MAX_SPLITS)
    rows = -(-P // BM) * BM
    # what the CTAs read: rows past P and vocabulary rows past V as zeros (cp.async's zero fill)
    h = np.zeros((rows, H), F32)
    h[:P] = hidden.float().numpy()
    w = np.zeros((tiles * BN, H), F32)
    w[:V] = weight.float().numpy()
    b = bias.float().numpy() if bias is not None else None
    y = np.full(rows, -1, np.int64)  # (positions past P: a target that matches no column)
    y[:P] = targets.long().numpy()
    cols = thread_columns()
    target_logit = np.full(P, np.nan, F32)
    writes = np.zeros(P, np.int64)
    partial_m, partial_s = np.empty((splits, P), F32), np.empty((splits, P), F32)
    ctas = {}
    for split in range(splits):
        t0, t1 = split_begin(split, splits, tiles), split_begin(split + 1, splits, tiles)
        for r0 in range(0, rows, BM):
            ctas[r0 // BM, split] = list(range(t0, t1))
        # every thread's running state of each of its rows: [rows, WARPS_N, 4 lanes of a quad]
        m = np.full((rows, WARPS_N, 4), -np.inf, F32)
        s = np.zeros((rows, WARPS_N, 4), F32)
        for t in range(t0, t1):
            v = t * BN + np.arange(BN)
            z = (h @ w[v].T).astype(F32)                       # the tile's logits, float32 sums
            off = np.where(v < V, b[np.minimum(v, V - 1)] if b is not None else F32(0), F32(-np.inf)).astype(F32)
            x = (z + off).astype(F32)
            hit_r, hit_c = np.nonzero(y[:, None] == v[None, :])
            target_logit[hit_r] = x[hit_r, hit_c]
            np.add.at(writes, hit_r, 1)
            xg = x[:, cols]                                    # [rows, WARPS_N, 4, WARP_COLS // 4]
            mx = np.fmax.reduce(xg, axis=-1)                   # fmaxf: NaN ignored (the sum keeps it)
            new_m = np.fmax(m, mx)
            base = np.where(new_m == -np.inf, F32(0), new_m)
            with np.errstate(invalid="ignore"):
                terms = exp2_ftz(((xg - base[..., None]).astype(F32) * LOG2E).astype(F32))
                total = np.zeros_like(s)
                for k in range(terms.shape[-1]):               # in the thread's order
                    total = (total + terms[..., k]).astype(F32)
                s = (s * exp2_ftz(((m - base).astype(F32) * LOG2E).astype(F32)) + total).astype(F32)
            m = new_m.astype(F32)
        for lane_xor in (1, 2):                                # the quad's butterfly
            partner = [q ^ lane_xor for q in range(4)]
            m, s = lse_merge(m, s, m[..., partner], s[..., partner])
        for q in range(1, 4):                                  # every lane of a quad holds the same state
            assert np.array_equal(m[..., q], m[..., 0], equal_nan=True)
            assert np.array_equal(s[..., q], s[..., 0], equal_nan=True)
        M, S = np.full(rows, -np.inf, F32), np.zeros(rows, F32)
        for wn in range(WARPS_N):                              # the warps along the vocabulary, in order
            M, S = lse_merge(M, S, m[:, wn, 0], s[:, wn, 0])
        partial_m[split], partial_s[split] = M[:P], S[:P]      # positions past P are not stored
    M, S = np.full(P, -np.inf, F32), np.zeros(P, F32)
    for split in range(splits):                                # the merge kernel
        M, S = lse_merge(M, S, partial_m[split], partial_s[split])
    with np.errstate(divide="ignore", invalid="ignore"):
        out = ((target_logit - M).astype(F32) - np.log(S).astype(F32)).astype(F32)
    return torch.from_numpy(out.astype(np.float64)), writes, ctas


# ---------------------------------------------------------------------------------------------
# Float64 references and the bound

def expected(hidden, weight, bias, targets, splits: int = MAX_SPLITS):
    """Float64 log p of every position and its error bound (module docstring), computed on the inputs'
    device, returned on the CPU."""
    h, w = hidden.double(), weight.double()
    b = bias.float().double() if bias is not None else torch.zeros(w.shape[0], dtype=torch.float64, device=h.device)
    y = targets.long()
    z = h @ w.T + b
    exact = torch.log_softmax(z, -1).gather(1, y[:, None])[:, 0]
    M = z.amax(-1, keepdim=True)
    p = torch.softmax(z, -1)
    t = M - z
    tiles = vocab_tiles(w.shape[0])
    n_chain = 16 + 3 * tiles + 3 * splits + 16
    s = torch.exp(torch.logsumexp(z - M, -1))
    zy_m = (z.gather(1, y[:, None])[:, 0] - M[:, 0]).abs()
    H = h.shape[1]
    dz = 2 * (H + 2) * U * (h.abs() @ w.abs().T) + U * b.abs()
    bound = U * ((p * (2 * t + 8)).sum(-1) + 2 * n_chain + 2 * s.log().abs() + zy_m + exact.abs())
    bound = bound + dz.gather(1, y[:, None])[:, 0] + (p * dz).sum(-1)
    return exact.cpu(), bound.cpu()


def assert_within(got, exact, bound, what: str):
    got = got.double().cpu()
    assert got.shape == exact.shape, what
    assert bool(torch.isfinite(got).all()), f"{what}: non-finite results {got[~torch.isfinite(got)]}"
    err = (got - exact).abs()
    assert bool((err <= bound).all()), (f"{what}: error {err.max().item():.3g} exceeds the bound (worst error/bound "
                                        f"{(err / bound).max().item():.3g})")


def inputs(P, H, V, dtype, seed, with_bias=True, scale=1.0):
    """Random (never zero) hidden states, weight rows, a bias and targets; the first targets at the
    vocabulary's ends and at a tile edge."""
    gen = torch.Generator().manual_seed(seed)
    hidden = (torch.randn(P, H, generator=gen) * scale).to(dtype)
    weight = (torch.randn(V, H, generator=gen) * (2.0 / math.sqrt(H))).to(dtype)
    bias = torch.randn(V, generator=gen).to(dtype) if with_bias else None
    targets = torch.randint(0, V, (P,), generator=gen)
    edges = [t for t in (V - 1, 0, BN - 1, BN) if t < V][:P]
    targets[:len(edges)] = torch.tensor(edges)
    return hidden, weight, bias, targets


# ---------------------------------------------------------------------------------------------
# The emulated schedule against float64 (CPU)

CASES = [  # P, H, V, bias: a length-1 input, P and V that do not divide the tiles, several splits, BERT's V
    (1, 8, 1, True), (1, 16, 300, False), (37, 24, 1000, True), (BM + 1, 40, 3 * BN + 5, True),
    (300, 64, 3001, False), (45, 32, 30522, True)]


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("P,H,V,with_bias", CASES)
def test_emulated_schedule_matches_float64(dtype, P, H, V, with_bias):
    hidden, weight, bias, targets = inputs(P, H, V, dtype, seed=P * 31 + V)
    tiles = vocab_tiles(V)
    for splits in sorted({1, min(2, tiles), min(3, tiles), min(tiles, MAX_SPLITS)}):
        got, writes, ctas = emulate(hidden, weight, bias, targets, splits)
        assert (writes == 1).all(), "each target logit is written by exactly one thread"
        # every CTA of a position tile sees a non-empty, distinct part of the vocabulary; together all of it
        for r in range(-(-P // BM)):
            parts = [ctas[r, k] for k in range(splits)]
            assert all(parts) and sorted(sum(parts, [])) == list(range(tiles))
        exact, bound = expected(hidden, weight, bias, targets, splits)
        assert_within(got, exact, bound, f"emulation {dtype} P={P} H={H} V={V} splits={splits}")


@pytest.mark.parametrize("dtype", HALF)
def test_emulated_extreme_logits(dtype):
    """Logits of magnitude 1e4: a bias of +-1e4 inside the last, partial vocabulary tile and in the first;
    hidden states scaled so that the products alone reach thousands; the targets on them."""
    P, H, V = 20, 16, 3 * BN + 60
    hidden, weight, _, targets = inputs(P, H, V, dtype, seed=3, scale=300.0)
    bias = torch.zeros(V)
    bias[V - 1], bias[3], bias[BN + 1] = 1e4, -1e4, 5e3
    targets[:4] = torch.tensor([V - 1, 3, BN + 1, 0])
    assert float((hidden.double() @ weight.double().T).abs().max()) > 1e3
    for splits in (1, 2, 3):
        got, _, _ = emulate(hidden, weight, bias.to(dtype), targets, splits)
        exact, bound = expected(hidden, weight, bias.to(dtype), targets, splits)
        assert_within(got, exact, bound, f"emulated extremes {dtype} splits={splits}")
    assert float(exact[1]) < -1e4


def test_emulated_padding_with_minus_inf_changes_nothing():
    """The vocabulary padded to a multiple of 64 with a -inf bias (the benchmark's padded row): each padded
    column adds exactly 0 to its thread's sum, so the results are bitwise those of the unpadded head."""
    P, H, V = 50, 24, 301
    hidden, weight, bias, targets = inputs(P, H, V, torch.bfloat16, seed=8)
    padded_v = -(-V // 64) * 64
    padded_w = torch.cat([weight, torch.zeros(padded_v - V, H, dtype=weight.dtype)])
    padded_b = torch.cat([bias.float(), torch.full((padded_v - V,), -math.inf)])
    for splits in (1, 3):
        plain, _, _ = emulate(hidden, weight, bias.float(), targets, splits)
        padded, _, _ = emulate(hidden, padded_w, padded_b, targets, splits)
        assert torch.equal(plain, padded)


def test_emulated_eq2_with_lengths():
    """Eq. 2 from the emulated per-position values and caption lengths (segment_mean): a length-1 caption,
    a fully padded one (no position: NaN, as every scoring op), ragged lengths."""
    H, V = 32, 700
    lengths = torch.tensor([1, 0, 5, 17, 0, 9])
    P = int(lengths.sum())
    hidden, weight, bias, targets = inputs(P, H, V, torch.float16, seed=21)
    got, _, _ = emulate(hidden, weight, bias, targets, 2)
    exact, bound = expected(hidden, weight, bias, targets, 2)
    mean = ops.segment_mean_reference(got, lengths=lengths)
    want = ops.segment_mean_reference(exact, lengths=lengths)
    tol = ops.segment_mean_reference(bound, lengths=lengths)
    assert torch.isnan(mean[[1, 4]]).all() and torch.isnan(want[[1, 4]]).all()
    finite = ~torch.isnan(want)
    assert bool(((mean - want).abs()[finite] <= tol[finite] + 1e-12).all())


def test_emulated_nan_propagates():
    """A NaN hidden state gives NaN for its position only."""
    P, H, V = 5, 16, 200
    hidden, weight, bias, targets = inputs(P, H, V, torch.float16, seed=4)
    hidden[2, 3] = float("nan")
    got, _, _ = emulate(hidden, weight, bias, targets, 2)
    assert torch.isnan(got[2]) and bool(torch.isfinite(got[[0, 1, 3, 4]]).all())


def test_thread_columns_partition_a_tile():
    cols = thread_columns()
    assert sorted(cols.ravel().tolist()) == list(range(BN))
    assert BM % (16 * WARPS_M) == 0 and BN % (16 * WARPS_N) == 0 and BK % 16 == 0 and STAGES >= 2


# ---------------------------------------------------------------------------------------------
# The data movement, emulated: the loader's cp.async pieces, the swizzle, ldmatrix, the MMA fragments and
# the flat pipeline, with the index arithmetic of csrc/cuda/fused_head.cu, on integer-valued inputs in
# float64 (every product and sum exact): each tile's logits must equal the masked product exactly.

THREADS = 32 * WARPS_M * WARPS_N
ROW_BYTES = 2 * BK                      # one row of a stage: BK 2-byte elements
PIECES = ROW_BYTES // 16                # 16-byte pieces per row
ROW_STEP = THREADS // PIECES            # rows between a thread's loads (Loader)
LOADS_A, LOADS_B = BM * PIECES // THREADS, BN * PIECES // THREADS
TILE_BYTES_A = BM * ROW_BYTES
STAGE_BYTES = (BM + BN) * ROW_BYTES
WARP_ROWS = BM // WARPS_M
MMA_M, MMA_N = WARP_ROWS // 16, WARP_COLS // 8
LANE = np.arange(32)
GROUP, QUAD = LANE // 4, LANE % 4       # an MMA fragment's row in 8, its column pair


def tile_offset(row, piece):
    """The byte offset of 16-byte piece `piece` of row `row` in a stage's tile (swizzled)."""
    return row * ROW_BYTES + ((piece ^ ((row >> 1) & 3)) << 4)


def rows_left(left: int) -> int:
    """Loader::rows_left: how many of a thread's rows (ROW_STEP apart) exist."""
    return 0 if left <= 0 else -(-left // ROW_STEP)


def load_stage(stage, hidden, weight, row0: int, tile: int, k0: int) -> list:
    """Loader::start, set_tile and load for every thread: fills `stage` (float64 elements, index = byte
    offset / 2); returns the byte offsets of the 16-byte pieces written."""
    P, H = hidden.shape
    V = weight.shape[0]
    written = []
    for t in range(THREADS):
        row, piece = t // PIECES, t % PIECES
        k_piece = piece * 8
        offset = tile_offset(row, piece)
        a_rows, b_rows = rows_left(P - row0 - row), rows_left(V - (tile * BN + row))
        k_ok = k0 + k_piece < H
        for base, src, first, loads, n in ((0, hidden, row0 + row, LOADS_A, a_rows),
                                           (TILE_BYTES_A, weight, tile * BN + row, LOADS_B, b_rows)):
            for i in range(loads):
                dst = base + offset + i * ROW_STEP * ROW_BYTES
                valid = k_ok and i < n
                stage[dst // 2: dst // 2 + 8] = src[first + i * ROW_STEP, k0 + k_piece: k0 + k_piece + 8] if valid else 0
                written.append(dst)
    return written


def ldmatrix_x4(stage, addrs) -> np.ndarray:
    """ldmatrix.sync.aligned.m8n8.x4.shared.b16: lane l gives the address of row l % 8 of matrix l // 8;
    register q of thread T holds elements 2 (T % 4), +1 of row T // 4 of matrix q: [32, 4, 2]. Each matrix's
    8 rows must lie in 8 different 16-byte bank groups (no bank conflict)."""
    addrs = np.asarray(addrs)
    for q in range(4):
        assert len(set(((addrs[8 * q: 8 * q + 8] % 128) // 16).tolist())) == 8, "a bank conflict"
    first = addrs.reshape(4, 8)[:, GROUP].T // 2 + 2 * QUAD[:, None]   # [thread, matrix]
    return stage[first[..., None] + np.arange(2)]


def mma_16816(acc, a, b0, b1):
    """mma.sync m16n8k16 .row.col with the PTX fragment layouts: acc [32, 4] += A (16 x 16) B (16 x 8)."""
    A, B = np.empty((16, 16)), np.empty((16, 8))
    for e in range(2):
        A[GROUP, 2 * QUAD + e], A[GROUP + 8, 2 * QUAD + e] = a[:, 0, e], a[:, 1, e]
        A[GROUP, 8 + 2 * QUAD + e], A[GROUP + 8, 8 + 2 * QUAD + e] = a[:, 2, e], a[:, 3, e]
        B[2 * QUAD + e, GROUP], B[8 + 2 * QUAD + e, GROUP] = b0[:, e], b1[:, e]
    C = A @ B
    for e in range(2):
        acc[:, e] += C[GROUP, 2 * QUAD + e]
        acc[:, 2 + e] += C[GROUP + 8, 2 * QUAD + e]


def consume_stage(stage, acc):
    """The k-steps of one stage for every warp: ldmatrix of A and B at the kernel's offsets, then the MMAs.
    acc: [warps, MMA_M, MMA_N, 32 lanes, 4]."""
    for warp in range(THREADS // 32):
        wm, wn = warp // WARPS_N, warp % WARPS_N
        a_row, a_piece = wm * WARP_ROWS + LANE % 16, LANE // 16
        b_row, b_piece = wn * WARP_COLS + 8 * (LANE // 16) + LANE % 8, (LANE // 8) % 2
        for ks in range(BK // 16):
            a_off = tile_offset(a_row, 2 * ks + a_piece)
            b_off = TILE_BYTES_A + tile_offset(b_row, 2 * ks + b_piece)
            a = [ldmatrix_x4(stage, a_off + 16 * i * ROW_BYTES) for i in range(MMA_M)]
            b = []
            for jj in range(MMA_N // 2):
                r = ldmatrix_x4(stage, b_off + 16 * jj * ROW_BYTES)
                b += [(r[:, 0], r[:, 1]), (r[:, 2], r[:, 3])]
            for i in range(MMA_M):
                for j in range(MMA_N):
                    mma_16816(acc[warp, i, j], a[i], *b[j])


def tile_logits(acc) -> np.ndarray:
    """The [BM, BN] tile from the accumulators: acc[w][i][j][T][2 h + e] is row wm * WARP_ROWS + 16 i + 8 h +
    T // 4, column wn * WARP_COLS + 8 j + 2 (T % 4) + e; every entry held by exactly one thread."""
    z = np.full((BM, BN), np.nan)
    for warp in range(THREADS // 32):
        wm, wn = warp // WARPS_N, warp % WARPS_N
        for i in range(MMA_M):
            for j in range(MMA_N):
                for h in range(2):
                    for e in range(2):
                        r = wm * WARP_ROWS + 16 * i + 8 * h + GROUP
                        c = wn * WARP_COLS + 8 * j + 2 * QUAD + e
                        assert np.isnan(z[r, c]).all()
                        z[r, c] = acc[warp, i, j, :, 2 * h + e]
    return z


def run_cta(hidden, weight, row0: int, t_begin: int, t_end: int) -> dict:
    """One CTA's main loop: the producer's (tile, k0) sequence through the kStages ring (the prologue, then
    one load per step into the stage that step g - 1 used), the consumer's; the logits of each tile."""
    H = hidden.shape[1]
    nk = -(-H // BK)
    steps = (t_end - t_begin) * nk
    stages = np.full((STAGES, STAGE_BYTES // 2), np.nan)
    holds = [None] * STAGES                                   # which (tile, k0) each stage holds
    producer = [t_begin, 0]

    def load_next(s):
        written = load_stage(stages[s], hidden, weight, row0, *producer)
        assert sorted(written) == list(range(0, STAGE_BYTES, 16)), "every 16-byte piece written once"
        holds[s] = tuple(producer)
        producer[1] += BK
        if producer[1] >= H:
            producer[:] = [producer[0] + 1, 0]

    for s in range(STAGES - 1):
        if s < steps:
            load_next(s)
    tile, kk = t_begin, 0
    acc = np.zeros((THREADS // 32, MMA_M, MMA_N, 32, 4))
    logits = {}
    for g in range(steps):
        nxt = g + STAGES - 1
        if nxt < steps:
            assert nxt % STAGES == (g - 1) % STAGES != g % STAGES
            load_next(nxt % STAGES)
        assert holds[g % STAGES] == (tile, kk * BK), f"step {g} reads {holds[g % STAGES]}"
        consume_stage(stages[g % STAGES], acc)
        kk += 1
        if kk < nk:
            continue
        logits[tile] = tile_logits(acc)
        kk, tile = 0, tile + 1
        acc[:] = 0
    assert producer[0] == t_end and tile == t_end
    return logits


@pytest.mark.parametrize("P,H,V,row_tile,t_begin,t_end", [
    (1, 16, 1, 0, 0, 1),                    # one position, one vocabulary entry, pieces past H
    (BM + 37, 40, 3 * BN + 5, 1, 1, 4),     # ragged rows, the ragged last tile, a partial last k-step
    (300, 64, 1000, 2, 5, 8),               # several whole k-steps, a split ending on the ragged tile
    (2 * BM, 24, 2 * BN, 0, 0, 2)])         # nothing ragged but H
def test_emulated_data_movement_gives_the_exact_product(P, H, V, row_tile, t_begin, t_end):
    rng = np.random.default_rng(P + H + V)
    hidden = rng.integers(1, 9, (P, H)) * rng.choice([-1, 1], (P, H)).astype(np.float64)
    weight = rng.integers(1, 9, (V, H)) * rng.choice([-1, 1], (V, H)).astype(np.float64)
    row0 = row_tile * BM
    logits = run_cta(hidden, weight, row0, t_begin, t_end)
    assert sorted(logits) == list(range(t_begin, t_end))
    h = np.zeros((BM, H))
    h[:max(0, min(BM, P - row0))] = hidden[row0: row0 + BM]
    for t, z in logits.items():
        w = np.zeros((BN, H))
        w[:max(0, min(BN, V - t * BN))] = weight[t * BN: t * BN + BN]
        np.testing.assert_array_equal(z, h @ w.T, err_msg=f"tile {t}")


# ---------------------------------------------------------------------------------------------
# The split plan and the CPU API

def modelled(P, V, slots, splits):
    waves = -(-(-(-P // BM)) * splits // slots)
    return waves * (-(-vocab_tiles(V) // splits) + 1)


@pytest.mark.parametrize("P", [1, 100, 1024, 4096, 16384, 65536])
@pytest.mark.parametrize("slots", [216, 264])  # A100 (108 SMs) and H100/H200 (132 SMs), 2 CTAs each
def test_split_plan(P, slots):
    V = 30522
    splits = torch.ops.clid.tc_head_splits(P, V, slots)
    assert 1 <= splits <= min(vocab_tiles(V), MAX_SPLITS)
    best = min(modelled(P, V, slots, s) for s in range(1, min(vocab_tiles(V), MAX_SPLITS) + 1))
    assert modelled(P, V, slots, splits) == best
    if P <= 1024:
        assert splits > 1  # a few position tiles: the vocabulary is what fills the GPU


def test_split_plan_at_the_benchmark_shape():
    """BERT-base's head over 16,384 positions on an H200 (132 SMs, 2 CTAs each): 128 position tiles x 2
    splits = 256 CTAs in one wave of 264."""
    assert torch.ops.clid.tc_head_splits(16384, 30522, 264) == 2
    assert torch.ops.clid.tc_head_splits(16384, 1, 264) == 1


def test_on_the_cpu_it_raises():
    hidden, weight, bias, targets = inputs(4, 8, 10, torch.bfloat16, seed=1)
    with pytest.raises(RuntimeError, match="not on a GPU; clid.ops.token_logprob_hidden computes the same"):
        ops.token_logprob_hidden_tc(hidden, weight, bias, targets)


def test_fake_implementation():
    """The op's shape and dtype without running it (torch.compile, export)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        out = torch.ops.clid.token_logprob_hidden_tc(torch.empty(7, 16, dtype=torch.bfloat16),
                                                     torch.empty(50, 16, dtype=torch.bfloat16), None,
                                                     torch.zeros(7, dtype=torch.long))
    assert out.shape == (7,) and out.dtype == torch.float32


def test_bench_kernels_section_names_the_tensor_core_row_gpu_only(tmp_path):
    """bench/bench_gpu.py --smoke --sections kernels: on the CPU the tensor-core head is a note, not a row."""
    import json
    import os

    out = tmp_path / "rows.json"
    proc = subprocess.run([sys.executable, "bench/bench_gpu.py", "--smoke", "--repeats", "2", "--sections", "kernels",
                           "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = json.loads(out.read_text())
    notes = [r for r in rows if "note" in r and r["path"].startswith("token_logprob_hidden_tc")]
    assert notes and "GPU" in notes[0]["note"]
    assert not any("tensor-core" in r["path"] for r in rows if "ours" in r)


# ---------------------------------------------------------------------------------------------
# The kernel (skipped without a GPU)

def on_gpu(*tensors):
    return [t.cuda() if t is not None else None for t in tensors]


@GPU
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("P,H,V,with_bias", CASES + [(130, 20, 777, True), (1000, 72, 30522, True)])
def test_cuda_kernel_matches_float64(dtype, P, H, V, with_bias):
    """Every case of the emulation (and an H that is not a multiple of 8), planned and forced split counts,
    no host synchronisation, bitwise repeatable; close to the emulation."""
    hidden, weight, bias, targets = inputs(P, H, V, dtype, seed=P * 31 + V)
    h, w, b, y = on_gpu(hidden, weight, bias, targets)
    tiles = vocab_tiles(V)
    for splits in sorted({None, 1, min(3, tiles), min(tiles, MAX_SPLITS)}, key=lambda s: s or 0):
        torch.cuda.set_sync_debug_mode("error")
        try:
            got = ops.token_logprob_hidden_tc(h, w, b, y, splits=splits)
            again = ops.token_logprob_hidden_tc(h, w, b, y, splits=splits)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert got.dtype == torch.float32 and got.shape == (P,)
        assert torch.equal(got.view(torch.int32), again.view(torch.int32))
        exact, bound = expected(hidden, weight, bias, targets, splits or MAX_SPLITS)
        assert_within(got, exact, bound, f"cuda tc {dtype} P={P} H={H} V={V} splits={splits}")
        if splits is not None and V <= 3001:
            emulated, _, _ = emulate(hidden, weight, bias, targets, splits)
            assert bool(((got.double().cpu() - emulated).abs() <= 2 * bound).all())


@GPU
@pytest.mark.parametrize("dtype", HALF)
def test_cuda_kernel_extreme_logits(dtype):
    P, H, V = 40, 16, 30522
    hidden, weight, _, targets = inputs(P, H, V, dtype, seed=3, scale=300.0)
    bias = torch.zeros(V)
    bias[V - 1], bias[3], bias[BN + 1] = 1e4, -1e4, 5e3
    targets[:4] = torch.tensor([V - 1, 3, BN + 1, 0])
    for splits in (None, 1, 7):
        got = ops.token_logprob_hidden_tc(*on_gpu(hidden, weight, bias.to(dtype), targets), splits=splits)
        exact, bound = expected(hidden, weight, bias.to(dtype), targets, splits or MAX_SPLITS)
        assert_within(got, exact, bound, f"cuda tc extremes {dtype} splits={splits}")


@GPU
def test_cuda_kernel_padded_vocabulary_is_bitwise_the_same():
    """BERT's vocabulary and the same padded to 30,528 with a -inf bias: the same tiles and splits, the padded
    columns add exactly 0: bitwise equal results."""
    P, H, V = 300, 64, 30522
    hidden, weight, bias, targets = inputs(P, H, V, torch.bfloat16, seed=5)
    h, w, b, y = on_gpu(hidden, weight, bias.float(), targets)
    padded_w = torch.cat([w, torch.zeros(30528 - V, H, dtype=w.dtype, device="cuda")])
    padded_b = torch.cat([b, torch.full((30528 - V,), -math.inf, device="cuda")])
    for splits in (None, 4):
        plain = ops.token_logprob_hidden_tc(h, w, b, y, splits=splits)
        padded = ops.token_logprob_hidden_tc(h, padded_w, padded_b, y, splits=splits)
        assert torch.equal(plain.view(torch.int32), padded.view(torch.int32))


@GPU
def test_cuda_kernel_at_the_benchmark_shape():
    """BERT-base's head, bf16, P = 4,096 of the benchmark's 16,384: within the bound of float64, close to
    token_logprob_hidden, and Eq. 2 over ragged captions (one of length 1, one empty: NaN)."""
    gen = torch.Generator(device="cuda").manual_seed(14)
    P, H, V = 4096, 768, 30522
    hidden = torch.randn(P, H, generator=gen, device="cuda").bfloat16()
    weight = (torch.randn(V, H, generator=gen, device="cuda") / math.sqrt(H)).bfloat16()
    bias = torch.randn(V, generator=gen, device="cuda") * 0.1
    targets = torch.randint(0, V, (P,), generator=gen, device="cuda")
    got = ops.token_logprob_hidden_tc(hidden, weight, bias, targets)
    exact, bound = expected(hidden, weight, bias, targets, MAX_SPLITS)
    assert_within(got, exact, bound, "cuda tc BERT-base")
    cublas = ops.token_logprob_hidden(hidden, weight, bias, targets)
    assert float((got - cublas).abs().max()) <= 2 * float(bound.max())
    lengths = torch.tensor([1, 0] + [13] * ((P - 1) // 13) + [(P - 1) % 13], device="cuda")
    means = ops.segment_mean(got, lengths=lengths)
    want = ops.segment_mean_reference(exact, lengths=lengths.cpu())
    assert torch.isnan(means[1]) and bool(((means.double().cpu() - want).abs()[~torch.isnan(want)] <= 1e-3).all())


@GPU
def test_cuda_kernel_strided_unaligned_and_int32_inputs():
    """Rows one element off a 16-byte boundary, a weight with padded rows, int32 targets: the op copies or
    reads them as they are, with the same results."""
    P, H, V = 70, 32, 1000
    hidden, weight, bias, targets = inputs(P, H, V, torch.float16, seed=9)
    h, w, b, y = on_gpu(hidden, weight, bias, targets)
    want = ops.token_logprob_hidden_tc(h, w, b, y, splits=2)
    shifted = torch.empty(P * H + 1, dtype=h.dtype, device="cuda")[1:].view(P, H).copy_(h)
    wide = torch.zeros(V, H + 8, dtype=w.dtype, device="cuda")[:, :H].copy_(w)
    got = ops.token_logprob_hidden_tc(shifted, wide, b, y.int(), splits=2)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


@GPU
def test_cuda_kernel_rejects_other_types():
    h, w, _, y = on_gpu(*inputs(4, 8, 10, torch.float32, seed=1))
    with pytest.raises(RuntimeError, match="must both be float16 or both bfloat16"):
        ops.token_logprob_hidden_tc(h, w, None, y)
    with pytest.raises(RuntimeError, match="must both be float16 or both bfloat16"):
        ops.token_logprob_hidden_tc(h.half(), w.bfloat16(), None, y)


@GPU
def test_cuda_opcheck_and_plan_default_head():
    """The schema and fake implementation agree with the kernel; the GPU plan's head is still "eager"."""
    from clid.run import runtime

    h, w, b, y = on_gpu(*inputs(13, 16, 301, torch.bfloat16, seed=2))
    torch.library.opcheck(torch.ops.clid.token_logprob_hidden_tc.default, (h, w, b, y, 2))
    assert runtime.device_plan("cuda").head == "eager"


@GPU
def test_cuda_bad_target_is_a_device_assertion():
    """A target outside the vocabulary stops the process with a device-side assertion naming it (in a
    subprocess: the assertion ends its CUDA context)."""
    code = ("import torch\nimport clid.ops as ops\n"
            "h = torch.randn(4, 8, device='cuda').bfloat16()\nw = torch.randn(10, 8, device='cuda').bfloat16()\n"
            "out = ops.token_logprob_hidden_tc(h, w, None, torch.tensor([0, 1, -1, 2], device='cuda'))\n"
            "torch.cuda.synchronize()\nprint('no error')\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "no error" not in proc.stdout
    assert "token_logprob_hidden_tc: target -1 at position [2] is outside the vocabulary [0, 10)" in (
        proc.stdout + proc.stderr)
