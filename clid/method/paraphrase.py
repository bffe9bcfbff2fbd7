"""The offline rule-based paraphraser of stage 03 (``--model rules``), and the noun-phrase rules
that stage 03 also uses to check a model's paraphrases.

It groups repeated objects ("a dog and a dog" -> "two dogs", "a dog and a dog on the grass" ->
"two dogs on the grass", up to ten), merges repeated predicates ("wearing a hat and wearing a shirt"
-> "wearing a hat and a shirt"), fixes articles, "and and" and the final punctuation. It does not
reword: no synonyms, no reordering, no relative clauses; a repeat that is not adjacent ("a man on the
snow and a man") or not the same phrase ("a man and a tall man") stays as written.
"""
from __future__ import annotations

import re

from clid.method import english as en
from clid.base.text import karpathy_tokens

# ---------------------------------------------------------------------------------------------
# Noun phrases, as far as rules can find them

ARTICLES = {"a", "an"}
DETERMINERS = ARTICLES | {"the"} | set(en.NUMBER_WORDS.values())
PREPOSITIONS = {"on", "in", "at", "of", "with", "near", "behind", "under", "above", "beside", "besides", "by",
                "next", "along", "across", "over", "inside", "outside", "against", "beneath", "below", "between",
                "from", "into", "onto", "to", "around", "for", "atop", "underneath", "within", "without",
                "through", "toward", "towards", "beyond", "past", "among", "up", "down", "off", "out", "like",
                "as", "top", "front", "and", "or", "while", "is", "are", "has", "have", "that", "which", "who"}
# words ending in -ing/-ed that are nouns, not verbs
ING_NOUNS = {"building", "ceiling", "painting", "clothing", "railing", "awning", "king", "ring", "string", "wing",
             "thing", "evening", "morning", "icing", "frosting", "topping", "lettering", "writing", "bedding",
             "siding", "pudding", "sing", "spring", "swing", "sling", "stuffing", "dressing", "seasoning",
             "wedding", "sibling", "flowerbed", "seabed", "hundred", "steed", "bobsled"}


def is_predicate_word(words: list[str], i: int) -> bool:
    """True where a noun phrase ends: a preposition, a determiner, or a verb form (-ing, -ed)
    that follows a noun rather than an article or another adjective ("a man riding", "a standing man")."""
    w = words[i]
    if w in PREPOSITIONS or w in DETERMINERS:
        return True
    if w.endswith(("ing", "ed")) and w not in ING_NOUNS and len(w) > 4:
        before = words[i - 1] if i else ""
        return not (before in DETERMINERS or before in en.SIZE_WORDS or before in en.COLOUR_WORDS
                    or before.endswith(("ing", "ed")))
    return False


def noun_phrase_end(words: list[str], start: int) -> int:
    """Index after the noun phrase that starts with the determiner at ``start``."""
    j = start + 1
    while j < len(words) and not is_predicate_word(words, j):
        j += 1
    return j


def head_nouns(text: str) -> list[str]:
    """The head noun (last word) of each noun phrase: each maximal run of words between
    determiners, prepositions and verbs, e.g. "a man riding a brown horse next to trees" ->
    ["man", "horse", "trees"]."""
    words = karpathy_tokens(text)
    nouns, run = [], []
    for i in range(len(words) + 1):
        if i == len(words) or is_predicate_word(words, i):
            if run:
                nouns.append(run[-1])
            run = []
        else:
            run.append(words[i])
    return nouns


def lemma(word: str) -> str:
    return en.singularize(word) if en.is_plural(word) else word


# ---------------------------------------------------------------------------------------------
# The rule-based paraphraser

_SENTENCE = re.compile(r"(?<=[.!?])\s+")


def sentences_of(text: str) -> list[str]:
    return [s for s in (x.strip().rstrip(".!? ").strip() for x in _SENTENCE.split(text.strip())) if s]


def _leading_np(words: list[str]) -> int:
    """Length of the noun phrase at the start of a segment (0 unless it opens with "a"/"an")."""
    if not words or words[0] not in ARTICLES:
        return 0
    end = noun_phrase_end(words, 0)
    return end if end > 1 else 0


def _trailing_np(words: list[str]) -> int:
    """Start of a segment's final noun phrase ("a"/"an" ... up to the end), or -1."""
    for k in range(len(words) - 1, -1, -1):
        if words[k] in ARTICLES:
            return k if noun_phrase_end(words, k) == len(words) and k + 1 < len(words) else -1
        if words[k] in DETERMINERS:
            return -1
    return -1


def _counted(np_words: list[str], count: int) -> list[str]:
    """ "a red car" x 3 -> "three red cars"."""
    return en.count_phrase(count, " ".join(np_words[1:])).split() if count > 1 else np_words


def rules_sentence(sentence: str) -> str:
    words = re.sub(r"[^a-z0-9' -]+", " ", sentence.lower()).split()
    words = en.remove_doubled_words(" ".join(words)).split()  # also "and and"
    while words and words[0] == "and":
        words = words[1:]
    while words and words[-1] == "and":
        words = words[:-1]
    segments, current = [], []
    for w in words:
        if w == "and":
            segments.append(current)
            current = []
        else:
            current.append(w)
    segments.append(current)
    segments = [s for s in segments if s]

    # each output segment: [words, count, which noun phrase is counted ("lead" or "tail")]
    out: list[list] = []
    for seg in segments:
        if out:
            prev, prev_count, prev_mode = out[-1]
            # merge a repeated predicate: "wearing a hat" + "wearing a shirt" -> "wearing a hat and a shirt"
            shared = False
            first = next((i for i, w in enumerate(seg) if w in ARTICLES), 0)  # seg = predicate + "a ..."
            tail = _trailing_np(prev)
            if 0 < first and tail >= first and prev[tail - first:tail] == seg[:first]:
                seg, shared = seg[first:], True
            # group repeated objects, up to ten: "a dog" + "a dog" -> "two dogs"; a repeated clause
            # counts its subject: "a man riding a horse" x 2 -> "two men riding a horse";
            # "wearing a hat" + "(wearing) a hat" -> "wearing two hats"
            lead = _leading_np(seg)
            if lead and prev_count < 10:
                if shared and lead == len(seg) and tail >= 0 and prev[tail:] == seg and prev_mode in ("tail", None):
                    out[-1][1:] = [prev_count + 1, "tail"]
                    continue
                if not shared and prev == seg and prev_mode in ("lead", None):
                    out[-1][1:] = [prev_count + 1, "lead"]
                    continue
                # the last repeat may go on: "a dog" + "a dog on the grass" -> "two dogs on the grass", and
                # "two men" + "a man on the snow" -> "three men on the snow", never "two men and a man on the snow"
                if not shared and prev_mode in ("lead", None) and seg[:lead] == prev and _leading_np(prev) == len(prev):
                    out[-1] = [seg, prev_count + 1, "lead"]
                    continue
        out.append([seg, 1, None])

    pieces = []
    for seg, count, mode in out:
        if mode == "lead":
            lead = _leading_np(seg)
            seg = _counted(seg[:lead], count) + seg[lead:]
        elif mode == "tail":
            tail = _trailing_np(seg)
            seg = seg[:tail] + _counted(seg[tail:], count)
        pieces.append(" ".join(seg))
    text = " and ".join(pieces)
    # articles: "a" / "an" by the next word; none before a plural or a mass noun phrase
    words = text.split()
    fixed = []
    for i, w in enumerate(words):
        if w in ARTICLES and i + 1 < len(words):
            end = noun_phrase_end(words, i)
            head = words[end - 1] if end > i + 1 else ""
            if head and (en.is_plural(head) or en.is_mass_noun(head)) and end - i <= 4:
                continue
            w = en.article(words[i + 1])
        fixed.append(w)
    return en.finish_sentence(en.remove_doubled_words(" ".join(fixed)))


def rules_paraphrase(caption: str) -> str:
    """The offline paraphrase of one caption (each sentence on its own)."""
    return " ".join(rules_sentence(s) for s in sentences_of(caption)) or caption
