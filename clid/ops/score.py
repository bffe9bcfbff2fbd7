"""Eq. 2 from logits or hidden states (clid._C), each op beside its plain PyTorch ``*_reference``
(float64 arithmetic when given float64, otherwise float32), which the tests compare it against and
which computes float64 inputs (the kernels take float32, float16 and bfloat16).

token_logprob_hidden_tc is token_logprob_hidden fused on the GPU's tensor cores (CUDA only; float16 or
bfloat16 operands of one type): selected by name, never a default; on the CPU it raises."""
from __future__ import annotations

import torch

from clid.ops.device import check_device, check_on_gpu


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
    checked only where mask is set. m_n = 0 gives NaN. float64 logits use the reference.

    On the GPU the op never waits for the device: an out-of-range target stops the kernel with a
    device-side assertion naming it (as torch's own index checks there), not a RuntimeError."""
    if logits.dtype == torch.float64:
        return seq_logprob_reference(logits, targets, mask)
    check_device("seq_logprob", logits)
    return torch.ops.clid.seq_logprob(logits, targets, mask)


def token_logprob(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log_softmax(logits[..., V])[targets] -> targets.shape float32, without a log-softmax tensor."""
    if logits.dtype == torch.float64:
        return token_logprob_reference(logits, targets)
    check_device("token_logprob", logits)
    return torch.ops.clid.token_logprob(logits, targets)


def token_logprob_hidden(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                         targets: torch.Tensor) -> torch.Tensor:
    """log_softmax(hidden @ weight.T + bias)[targets] -> [P] float32, over vocabulary tiles.

    hidden [P, H], weight [V, H] (the output projection, e.g. the tied word embeddings), bias [V] or
    None, targets [P]. No [P, V] logits buffer: fixed-size row blocks x vocabulary tiles, each one
    GEMM into a small buffer and an online log-sum-exp. Half-precision hidden states are upcast
    once on the CPU ([P, H] float32). float64 inputs use the reference.

    On the GPU each tile's product is cuBLAS's (tensor cores for half inputs of one type, float32
    results) into a buffer of at most 32 MiB; the op never waits for the device, and an out-of-range
    target is a device-side assertion, as in :func:`seq_logprob`."""
    if torch.float64 in (hidden.dtype, weight.dtype):
        return token_logprob_hidden_reference(hidden, weight, bias, targets)
    check_device("token_logprob_hidden", hidden, weight)
    return torch.ops.clid.token_logprob_hidden(hidden, weight, bias, targets)


def token_logprob_hidden_tc(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                            targets: torch.Tensor, splits: int | None = None) -> torch.Tensor:
    """:func:`token_logprob_hidden` fused on the GPU's tensor cores -> [P] float32 (CUDA only).

    hidden [P, H] and weight [V, H] both float16 or both bfloat16 (mma.sync operands, float32 sums), bias
    [V] (any float type, used as float32) or None, targets [P]. Tiles of 128 positions x 128 vocabulary
    entries; an online log-sum-exp over the vocabulary tiles and the target's logit in the same pass; the
    vocabulary split across ``splits`` groups of CTAs (None: planned from P, V and the GPU), whose partial
    states a second kernel merges. No logits buffer, no padded copy of the weight. Schedule:
    csrc/common/fused_head.h. Not a default anywhere: chosen by name (or the scoring head "tensor-core").
    On the CPU it raises (:func:`token_logprob_hidden` computes the same there)."""
    check_on_gpu("token_logprob_hidden_tc", "token_logprob_hidden", hidden, weight)
    check_device("token_logprob_hidden_tc", hidden, weight)
    if splits is not None and splits < 1:
        raise ValueError(f"token_logprob_hidden_tc: splits must be >= 1 or None, got {splits}")
    return torch.ops.clid.token_logprob_hidden_tc(hidden, weight, bias, targets, splits or 0)


def segment_mean(values: torch.Tensor, lengths: torch.Tensor | None = None,
                 segment_ids: torch.Tensor | None = None, num_segments: int | None = None) -> torch.Tensor:
    """Per-caption means of per-position values -> [N] float32 (NaN for a caption with no position).

    Either ``lengths`` [N] (consecutive runs) or ``segment_ids`` [P] (any order; the positions of a
    segment are summed in their order, in float64, so the result is deterministic)."""
    if values.dtype == torch.float64:
        return segment_mean_reference(values, lengths, segment_ids, num_segments)
    check_device("segment_mean", values)
    if (lengths is None) == (segment_ids is None):
        raise ValueError("segment_mean: give exactly one of lengths and segment_ids")
    if segment_ids is not None:
        order, lengths = _lengths_from_ids(segment_ids, num_segments)
        values = values[order]
    return torch.ops.clid.segment_mean(values, _as_long(lengths).to(values.device))


# Shapes and dtypes of the ops' results without running them (fake tensors: torch.compile, export).

@torch.library.register_fake("clid::seq_logprob")
def _(logits, targets, mask):
    return logits.new_empty(logits.shape[0], dtype=torch.float32)


@torch.library.register_fake("clid::token_logprob")
def _(logits, targets):
    return logits.new_empty(targets.shape, dtype=torch.float32)


@torch.library.register_fake("clid::segment_mean")
def _(values, lengths):
    return values.new_empty(lengths.shape[0], dtype=torch.float32)


@torch.library.register_fake("clid::token_logprob_hidden")
def _(hidden, weight, bias, targets):
    return hidden.new_empty(hidden.shape[0], dtype=torch.float32)


@torch.library.register_fake("clid::token_logprob_hidden_tc")
def _(hidden, weight, bias, targets, splits=0):
    return hidden.new_empty(hidden.shape[0], dtype=torch.float32)
