"""Tokenised captions as flat arrays (:class:`Examples`: one int32 array of token ids, offsets, levels, ids),
the table every caption reader returns, and the digest of a caption's text that 05 records."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np


class TokenRows:
    """``rows[i]``: the token ids of caption i as a list (its final "." included)."""

    def __init__(self, token_ids: np.ndarray, offsets: np.ndarray):
        self.token_ids, self.offsets = token_ids, offsets

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i) -> list[int]:
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self.token_ids[self.offsets[i]:self.offsets[i + 1]].tolist()

    def __iter__(self):
        return (self[i] for i in range(len(self)))


def _empty(dtype):
    return field(default_factory=lambda: np.zeros(0, dtype))


@dataclass
class Examples:
    """Tokenised captions: caption i's token ids, its final "." included, are
    ``token_ids[offsets[i]:offsets[i + 1]]`` (``tokens[i]`` as a list); ``levels[i]`` is 1-based (0: outside
    the levels, in a file's table); ``digests[i]`` is a digest of the caption's text (:func:`text_digests`)."""

    image_ids: list[str] = field(default_factory=list)
    caption_ids: list[str] = field(default_factory=list)
    token_ids: np.ndarray = _empty(np.int32)
    offsets: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    levels: np.ndarray = _empty(np.int64)
    sources: list[str] = field(default_factory=list)  # "trusted" / "selfgen"
    digests: np.ndarray = _empty(np.uint64)

    def __len__(self) -> int:
        return len(self.caption_ids)

    @property
    def tokens(self) -> TokenRows:
        return TokenRows(self.token_ids, self.offsets)

    @property
    def lengths(self) -> np.ndarray:
        """Tokens of each caption, its final "." included."""
        return np.diff(self.offsets)

    def __add__(self, other: "Examples") -> "Examples":
        """These examples, then ``other``'s (new arrays and lists: neither is changed)."""
        return Examples(self.image_ids + other.image_ids, self.caption_ids + other.caption_ids,
                        np.concatenate([self.token_ids, other.token_ids]),
                        np.concatenate([self.offsets, other.offsets[1:] + self.offsets[-1]]),
                        np.concatenate([self.levels, other.levels]), self.sources + other.sources,
                        np.concatenate([self.digests, other.digests]))

    def outside(self, token_ids) -> np.ndarray:
        """Whether each caption holds a token not among ``token_ids`` (a model's output vocabulary)."""
        known = np.zeros(max(int(self.token_ids.max(initial=0)), max(token_ids, default=0)) + 1, dtype=bool)
        known[np.asarray(token_ids, dtype=np.int64)] = True
        caption = np.repeat(np.arange(len(self)), self.lengths)  # (the caption of each token)
        return np.bincount(caption[~known[self.token_ids]], minlength=len(self)) > 0

    def select(self, keep: np.ndarray) -> "Examples":
        """The examples where the boolean mask ``keep`` is true (these very examples when it is true everywhere)."""
        return self if keep.all() else self.subset(np.flatnonzero(keep))

    def subset(self, indices) -> "Examples":
        """The examples at ``indices`` (in that order; repeats allowed)."""
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        lengths = self.lengths[indices]
        offsets = np.zeros(len(indices) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        # token k of output row r is token (k - offsets[r]) of input row indices[r]
        at = np.repeat(self.offsets[indices] - offsets[:-1], lengths) + np.arange(offsets[-1])
        pick = indices.tolist()
        return Examples([self.image_ids[i] for i in pick], [self.caption_ids[i] for i in pick], self.token_ids[at],
                        offsets, self.levels[indices], [self.sources[i] for i in pick], self.digests[indices])


def text_digest(text: str) -> int:
    """A 64-bit digest of a caption's text (BLAKE2b of its UTF-8): what 05 records of each caption it scored."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def text_digests(texts) -> np.ndarray:
    return np.fromiter(map(text_digest, texts), dtype=np.uint64)
