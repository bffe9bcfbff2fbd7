"""Eq. 2: length-normalised caption log-likelihoods under a (non-autoregressive) captioner.

    log p(y | x) = (1/m) * sum_t log P(w_t | w_<t, x)                            (Eq. 2)

Stage 05 computes it under the trusted and the extended model; Eq. 1 (:mod:`clid.selection.quality`) is their
difference.

Modes (``prefix`` is the default and the authors' definition):

- ``prefix``: mask every text token, reveal the true prefix w_<t, read position t: one encoder pass
  per position. Made fast without changing the numbers: captions are grouped by level (the text
  length of a pass) and sorted by caption length, so no pass is spent on padding; finished captions
  drop out of the batch; the last encoder layer and the LM head run only at the scored position,
  the head through the fused ``clid.ops.token_logprob_hidden`` on the CPU (no [P, V] logits) and
  the plain linear + log_softmax + gather on a GPU (the device plan's head: clid.run.runtime).
- ``pseudo``: reveal every other token and mask only position t (a pseudo-log-likelihood; the
  authors' ``past_only=False`` branch). An approximation.
- ``onepass``: mask everything, one pass, read every position. The cheapest approximation.

``m`` is the level's highest length: the caption's tokens, its final "." and the "." tokens that pad
it to the level's length, every one of them scored, as the authors' ``measure_noise.py`` divides by
every non-pad position (``count_padding=True``, the default). ``count_padding=False`` counts and
scores the caption's own tokens and its final "." only.
"""
from __future__ import annotations

import numpy as np
import torch

from clid import ops
from clid.base.text import eos_id
from clid.data.examples import Examples
from clid.data.store import RegionCache
from clid.model import MODES
from clid.model.captioner import Captioner
from clid.run import runtime


def _batches(examples: Examples, model: Captioner, batch_size: int, count_padding: bool):
    """Groups of example indices with the same level and source, longest first inside a group. A batch never
    mixes sources, so 05 ``--include-trusted`` scores the self-generated captions in the batches it scores
    them in without it: a CPU's float sums can depend on the other rows of a batch, and its u stay bit for bit."""
    highs = np.array([model.levels[lv - 1][1] for lv in examples.levels])
    lengths = highs if count_padding else np.array([len(t) for t in examples.tokens])
    _, source = np.unique(np.array(examples.sources or [""] * len(examples), dtype=object), return_inverse=True)
    group = np.array(examples.levels) * (int(source.max(initial=0)) + 1) + source  # (level, source)
    order = np.lexsort((-lengths, group))  # by level and source, then longest first
    groups = group[order]
    for key in np.unique(groups):
        members = order[groups == key]
        for start in range(0, len(members), batch_size):
            chunk = members[start:start + batch_size]
            yield chunk, lengths[chunk]


def _head_logprob(head: str, model: Captioner, weight):
    """log P(target) from the head's hidden states: the fused op (no [P, V] logits) or the plain way."""
    if head == "fused":
        return lambda h, classes: ops.token_logprob_hidden(h.to(weight.dtype), weight, model.head.bias, classes)
    if head == "eager":
        return lambda h, classes: model.logits_from_hidden(h).float().log_softmax(-1).gather(1, classes[:, None])[:, 0]
    raise ValueError(f"head must be one of {HEADS}")


HEADS = ("fused", "eager")


@torch.no_grad()
def caption_logprobs(model: Captioner, examples: Examples, regions: RegionCache, mode: str = "prefix",
                     batch_size: int = 64, device="cpu", count_padding: bool = True, progress=None,
                     precision: str = "fp32", head: str | None = None) -> np.ndarray:
    """Eq. 2 for every example, as float64 [N] in the order of ``examples``.

    ``precision`` (clid.run.runtime): under bf16 the encoder runs in bfloat16 autocast and the head's
    projection in bfloat16 (float32 results). ``head``: "fused" (``clid.ops.token_logprob_hidden``),
    "eager" (linear, log_softmax, gather) or None (the plan's). ``device``: a device, or the stage's
    :class:`~clid.run.runtime.DevicePlan`, whose head and encoding are used. On a GPU nothing waits for the device
    until the end: each batch's regions are read and padded in a second thread while the GPU works on
    the batch before, and copied from pinned memory.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}")
    model.eval()
    tok = model.tokenizer
    end, mask_id = eos_id(tok), tok.mask_token_id
    plan = runtime.as_plan(device, precision)
    device, precision, grouped = plan.device, plan.compute, plan.grouped_encoding
    bf16 = precision == "bf16"
    logprob = _head_logprob(head or plan.head, model, model.output_weight.to(torch.bfloat16) if bf16 else model.output_weight)

    def batch_inputs(batch):  # (CPU, pinned on a GPU) targets and regions of a batch
        chunk, _ = batch
        high = model.levels[examples.levels[chunk[0]] - 1][1]
        targets = torch.tensor([examples.tokens[i] + [end] * (high - len(examples.tokens[i])) for i in chunk])
        return runtime.pin([targets, *regions.batch([examples.image_ids[i] for i in chunk])], device)

    out = np.full(len(examples), np.nan)
    batches = list(_batches(examples, model, batch_size, count_padding))
    totals = []
    for (chunk, lengths), inputs in zip(batches, runtime.prefetch(batches, batch_inputs, device)):
        targets, feats, pos, rmask = runtime.to_device(inputs, device)
        level = examples.levels[chunk[0]]
        high = model.levels[level - 1][1]
        classes = model.to_output(targets)
        levels = torch.full((len(chunk),), level, dtype=torch.long, device=device)
        total = torch.zeros(len(chunk), dtype=torch.float64, device=device)
        n_max = int(lengths.max())
        with runtime.autocast(precision, device):
            if mode == "onepass":
                ids = torch.full_like(targets, mask_id)
                states = model.encode(feats, pos, rmask, ids, levels, grouped=grouped)[:, :n_max]
                scored = torch.arange(n_max, device=device)[None, :] < torch.as_tensor(lengths, device=device)[:, None]
                logp = logprob(model.hidden(states, scored), classes[:, :n_max][scored])
                total.index_add_(0, scored.nonzero()[:, 0], logp.double())
            else:
                for t in range(n_max):
                    n = int((lengths > t).sum())  # captions are longest first: the first n are unfinished
                    if mode == "prefix":
                        ids = torch.full((n, high), mask_id, dtype=torch.long, device=device)
                        ids[:, :t] = targets[:n, :t]
                    else:
                        ids = targets[:n].clone()
                        ids[:, t] = mask_id
                    at_t = torch.full((n, 1), t, dtype=torch.long, device=device)
                    states = model.encode(feats[:n], pos[:n], rmask[:n], ids, levels[:n], text_positions=at_t,
                                          grouped=grouped)
                    total[:n] += logprob(model.hidden(states[:, 0]), classes[:n, t]).double()
        totals.append(total)
        if progress is not None:
            progress(len(chunk))
    for (chunk, lengths), total in zip(batches, totals):  # (the one wait for the device)
        out[chunk] = (total.cpu() / torch.as_tensor(lengths, dtype=torch.float64)).numpy()
    return out


@torch.no_grad()
def caption_logprobs_eager(model: Captioner, examples: Examples, regions: RegionCache, batch_size: int = 64,
                           device="cpu", count_padding: bool = True, seed: int = 0) -> np.ndarray:
    """A faithful eager re-implementation of the authors' prefix scoring loop (the benchmark's peer).

    Random batches (captions of any level, padded with [PAD] to the batch's longest level), one pass
    per position up to the batch's longest padded length, a full-vocabulary softmax at every position
    of every pass, then a gather. Returns the same numbers as :func:`caption_logprobs`.
    """
    model.eval()
    tok = model.tokenizer
    end, mask_id, pad = eos_id(tok), tok.mask_token_id, tok.pad_token_id
    out = np.full(len(examples), np.nan)
    order = np.random.default_rng(seed).permutation(len(examples))
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        highs = [model.levels[examples.levels[i] - 1][1] for i in chunk]
        T = max(highs)
        targets = torch.full((len(chunk), T), pad, dtype=torch.long)
        for row, (i, high) in enumerate(zip(chunk, highs)):
            ids = examples.tokens[i]
            targets[row, :high] = torch.tensor(ids + [end] * (high - len(ids)))
        feats, pos, rmask = (t.to(device) for t in regions.batch([examples.image_ids[i] for i in chunk]))
        targets = targets.to(device)
        levels = torch.tensor([examples.levels[i] for i in chunk], device=device)
        masked = torch.where(targets != pad, mask_id, pad)
        probs_at = torch.zeros(targets.shape, dtype=torch.float32, device=device)
        everywhere = torch.ones_like(targets, dtype=torch.bool)
        for t in range(T):
            masked[:, :t] = targets[:, :t]
            states = model.encode(feats, pos, rmask, masked, levels)
            probs = model.logits_from_hidden(model.hidden(states, everywhere)).softmax(-1).view(*targets.shape, -1)
            probs = probs.gather(2, model.to_output(targets).clamp(min=0)[..., None]).squeeze(2)
            probs_at[:, t] = probs[:, t]
        lengths = torch.tensor(highs if count_padding else [len(examples.tokens[i]) for i in chunk], device=device)
        scored = torch.arange(T, device=device)[None, :] < lengths[:, None]
        logp = (probs_at.double().log() * scored).sum(1) / lengths
        out[chunk] = logp.cpu().numpy()
    return out
