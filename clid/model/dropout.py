"""Dropout drawn per example, so that a run does not depend on how its global batch is split over ranks.

torch's dropout draws from the process's generator: the same example gets other masks on 2 ranks than in
one process. Keyed dropout draws each element's mask from a counter-based hash of (the example's key, the
dropout site, the element's canonical place), so an example's masks depend on it alone: its key comes from
(seed, step, its place in the global batch) (clid.training.batches), its sites are numbered in the model, and
an element's place is counted in a layout that neither padding nor the rank changes: region j at position
j, text token t at ``TEXT_AT + t``, whatever the batch's largest region count or the cut of a grouped pass.

The hash is lowbias32 (a 32-bit multiply-xorshift mix) applied twice, computed in int64 with every product
below 2**63, so it is exact on any device; an element is dropped when its hash is below ``p * 2**32``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

MASK32 = 0xFFFFFFFF
TEXT_AT = 4096  # the canonical position of the first text token (regions come first, fewer than this)
PLACES = 1 << 13  # canonical positions are below this (regions, then TEXT_AT + at most 4,096 text tokens)


def _mul32(x, m: int):
    """(x * m) mod 2**32 for x < 2**32, split so that no product reaches 2**63."""
    return (x * (m & 0xFFFF) + (((x * (m >> 16)) & 0xFFFF) << 16)) & MASK32


def mix32(x):
    """lowbias32 of 32-bit values held in an int64 tensor (or of one Python int)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


@dataclass
class DropoutKeys:
    """The keys of a batch's examples (int64 [B], 32-bit values) and the canonical positions (int64 [S]) of
    the sequence the encoder runs (regions, then text)."""
    rows: torch.Tensor
    positions: torch.Tensor

    @classmethod
    def for_batch(cls, rows: torch.Tensor, regions: int, text: int) -> "DropoutKeys":
        if regions >= TEXT_AT or TEXT_AT + text > PLACES:
            raise ValueError(f"keyed dropout counts at most {TEXT_AT - 1} regions and {PLACES - TEXT_AT} text tokens")
        device = rows.device
        positions = torch.cat([torch.arange(regions, device=device), TEXT_AT + torch.arange(text, device=device)])
        return cls(rows, positions)

    def take(self, rows: torch.Tensor, length: int) -> "DropoutKeys":
        """The keys of some rows, for a pass over the first ``length`` positions."""
        return DropoutKeys(self.rows[rows], self.positions[:length])

    def regions(self, count: int) -> "DropoutKeys":
        return DropoutKeys(self.rows, self.positions[:count])


def keep_mask(keys: DropoutKeys, site: int, places: torch.Tensor, p: float) -> torch.Tensor:
    """Bool [B, *places.shape], True where kept: ``places`` (int64, below 2**32) numbers the elements of one
    example in its canonical layout; each (example, site, place) is kept with probability 1 - p."""
    seed = mix32((keys.rows & MASK32) ^ mix32(site + 1))  # (the site's hash a Python int: no copy to the device)
    seed = seed.view(-1, *[1] * places.dim())
    hashed = mix32(mix32(places[None] ^ seed) ^ (seed >> 1))
    return hashed >= int(p * 2 ** 32)


def hidden_places(positions: torch.Tensor, width: int) -> torch.Tensor:
    """Canonical places [S, H] of hidden states at ``positions``: position * H + feature."""
    return positions[:, None] * width + torch.arange(width, device=positions.device)


def attention_places(heads: int, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Canonical places [heads, Q, S] of attention probabilities: (head, query position, key position)."""
    if heads > (1 << 32) // PLACES ** 2:
        raise ValueError(f"keyed dropout counts at most {(1 << 32) // PLACES ** 2} attention heads")
    head = torch.arange(heads, device=queries.device)[:, None, None] * PLACES ** 2
    return head + queries[None, :, None] * PLACES + keys[None, None, :]


def drop(x: torch.Tensor, keep: torch.Tensor, p: float) -> torch.Tensor:
    """``x`` with the elements not kept zeroed and the others scaled by 1 / (1 - p), as nn.Dropout."""
    return x * keep.to(x.dtype) / (1.0 - p)


class KeyedDropout(nn.Module):
    """nn.Dropout over hidden states [B, S, H]; given :class:`DropoutKeys`, in training, each example's mask is
    keyed (module docstring). ``site`` is set by the model, one number per dropout of the network."""

    def __init__(self, p: float):
        super().__init__()
        self.p, self.site = p, 0

    def forward(self, x: torch.Tensor, keys: DropoutKeys | None = None) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        if keys is None:
            return nn.functional.dropout(x, self.p, True)
        return drop(x, keep_mask(keys, self.site, hidden_places(keys.positions, x.shape[-1]), self.p), self.p)
