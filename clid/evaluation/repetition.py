"""Repeated and broken phrases in captions: the share of captions that repeat a 3-gram, the most times any
4-gram occurs in one caption ("a dress and a dress and a dress and a" holds "a dress and a" three times),
and the share whose phrase is broken: that end on a function word ("... and a") or put one after an article
("a in front of", "a the road"; clid.base.english.broken_phrase), and the share that read as a list of
objects rather than a sentence ("a sand and a dress and a woman and a shirt"; clid.base.english.object_list).

Words are the caption's lower-cased, whitespace-separated words (a full stop stays on its word). A
reference text is measured as a caption is, so the two compare.
"""
from __future__ import annotations

from collections import Counter

from clid.base.english import broken_phrase, object_list


def words(caption: str) -> list[str]:
    """The caption's lower-cased, whitespace-separated words."""
    return caption.lower().split()


def most_repeated(caption: str, n: int) -> int:
    """How many times the caption's most frequent n-gram occurs (0 for a caption under n words)."""
    tokens = words(caption)
    counts = Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))
    return max(counts.values(), default=0)


def repetition(captions) -> dict:
    """``n``, ``repeats_3gram`` (the share of captions holding some 3-gram twice or more), ``max_4gram``
    (the most times one 4-gram occurs in one caption), ``broken`` (the share with a broken phrase) and ``listed``
    (the share that list objects) of an iterable of captions."""
    captions = list(captions)
    repeated = sum(most_repeated(c, 3) >= 2 for c in captions)
    stripped = [[w for w in (w.strip(".,;") for w in words(c)) if w] for c in captions]
    broken = sum(broken_phrase(ws) for ws in stripped)
    listed = sum(object_list(ws) for ws in stripped)
    return {"n": len(captions), "repeats_3gram": repeated / len(captions) if captions else 0.0,
            "max_4gram": max((most_repeated(c, 4) for c in captions), default=0),
            "broken": broken / len(captions) if captions else 0.0,
            "listed": listed / len(captions) if captions else 0.0}


def reference_texts(world, levels="caption") -> dict[int, tuple[str, list[str]]]:
    """The demo world's own texts at each level, to hold captions against: ``{level: (kind, texts)}``, its
    true long descriptions of the test images (``long_refs.json``) where the level has them, else its
    trusted test captions whose length falls in the level (``captions.json``)."""
    from pathlib import Path

    from clid.base.text import caption_length, get_levels, length_to_level, load_tokenizer
    from clid.evaluation.metrics import load_long_refs, load_refs

    world = Path(world)
    long_refs = load_long_refs(world / "long_refs.json")
    tokenizer = load_tokenizer()
    trusted: dict[int, list[str]] = {}
    for texts in load_refs(world / "captions.json", "test", None)[0].values():
        for text in texts:
            trusted.setdefault(length_to_level(caption_length(text, tokenizer), levels), []).append(text)
    out = {}
    for level in range(1, len(get_levels(levels)) + 1):
        if long_refs.get(level):
            out[level] = ("long references", [t for by_image in long_refs[level].values() for t in by_image])
        elif trusted.get(level):
            out[level] = ("trusted captions", trusted[level])
    return out
