"""Repeated phrases in captions: the share of captions that repeat a 3-gram, and the most times any
4-gram occurs in one caption ("a dress and a dress and a dress and a" holds "a dress and a" three times).

Words are the caption's lower-cased words with punctuation set apart, so "the road." and "the road"
are the same words. A reference text is measured as a caption is, so the two compare.
"""
from __future__ import annotations

import re
from collections import Counter

WORD = re.compile(r"[a-z0-9']+|[^\sa-z0-9']")


def words(caption: str) -> list[str]:
    """The caption's lower-cased words and punctuation marks."""
    return WORD.findall(caption.lower())


def most_repeated(caption: str, n: int) -> int:
    """How many times the caption's most frequent n-gram occurs (0 for a caption under n words)."""
    tokens = words(caption)
    counts = Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))
    return max(counts.values(), default=0)


def repetition(captions) -> dict:
    """``n``, ``repeats_3gram`` (the share of captions holding some 3-gram twice or more) and
    ``max_4gram`` (the most times one 4-gram occurs in one caption) of an iterable of captions."""
    captions = list(captions)
    repeated = sum(most_repeated(c, 3) >= 2 for c in captions)
    return {"n": len(captions), "repeats_3gram": repeated / len(captions) if captions else 0.0,
            "max_4gram": max((most_repeated(c, 4) for c in captions), default=0)}
