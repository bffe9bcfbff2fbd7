"""Small English surface rules shared by the caption writers (00, 02, 03).

Articles, plurals, number words, attribute order and phrase joining: as much English as rules
allow, with no model.
"""
from __future__ import annotations

import re

NUMBER_WORDS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven",
                8: "eight", 9: "nine", 10: "ten"}
WORD_NUMBERS = {word: n for n, word in NUMBER_WORDS.items()}

SIZE_WORDS = {"tiny", "small", "little", "large", "big", "huge", "tall", "short", "long", "giant", "medium"}
COLOUR_WORDS = {"red", "green", "blue", "yellow", "orange", "purple", "pink", "brown", "black", "white",
                "gray", "grey", "silver", "gold", "golden", "tan", "beige", "dark", "light", "navy", "teal"}

# "an" before a vowel sound; a few spelling exceptions either way
_AN_EXCEPTIONS = ("hour", "honest", "honor", "heir")
_A_EXCEPTIONS = ("uni", "use", "usu", "eu", "one", "once", "ur")

_IRREGULAR_PLURALS = {"man": "men", "woman": "women", "child": "children", "person": "people", "foot": "feet",
                      "tooth": "teeth", "mouse": "mice", "goose": "geese", "sheep": "sheep", "fish": "fish",
                      "deer": "deer", "ox": "oxen", "knife": "knives", "leaf": "leaves", "shelf": "shelves",
                      "wolf": "wolves", "scarf": "scarves", "glasses": "glasses", "jeans": "jeans",
                      "pants": "pants", "shorts": "shorts", "grass": "grass", "bus": "buses"}
_PLURAL_TO_SINGULAR = {v: k for k, v in _IRREGULAR_PLURALS.items() if k != v}


def article(phrase: str) -> str:
    """ "a" or "an" for the phrase that follows (judged by its first word)."""
    word = phrase.strip().split(" ", 1)[0].lower()
    if not word:
        return "a"
    if word.startswith(_AN_EXCEPTIONS):
        return "an"
    if word.startswith(_A_EXCEPTIONS):
        return "a"
    return "an" if word[0] in "aeiou" else "a"


def with_article(phrase: str) -> str:
    return f"{article(phrase)} {phrase}"


def pluralize(noun: str) -> str:
    """Plural of a noun or noun phrase (the last word is inflected)."""
    head, _, last = noun.rpartition(" ")
    prefix = head + " " if head else ""
    lower = last.lower()
    if lower in _IRREGULAR_PLURALS:
        return prefix + _IRREGULAR_PLURALS[lower]
    if re.search(r"(s|x|z|ch|sh)$", lower):
        return prefix + last + "es"
    if re.search(r"[^aeiou]y$", lower):
        return prefix + last[:-1] + "ies"
    if lower.endswith("fe"):
        return prefix + last[:-2] + "ves"
    return prefix + last + "s"


def singularize(noun: str) -> str:
    """Inverse of :func:`pluralize` for the common cases (used when grouping mentions)."""
    head, _, last = noun.rpartition(" ")
    prefix = head + " " if head else ""
    lower = last.lower()
    if lower in _PLURAL_TO_SINGULAR:
        return prefix + _PLURAL_TO_SINGULAR[lower]
    if lower.endswith("ies") and len(lower) > 4:
        return prefix + last[:-3] + "y"
    if re.search(r"(ses|xes|zes|ches|shes)$", lower):
        return prefix + last[:-2]
    if lower.endswith("s") and not lower.endswith("ss"):
        return prefix + last[:-1]
    return noun


def count_phrase(n: int, noun: str) -> str:
    """ "a dog", "two dogs", ..., "ten dogs", "11 dogs"."""
    if n == 1:
        return with_article(noun)
    return f"{NUMBER_WORDS.get(n, str(n))} {pluralize(noun)}"


def order_attributes(attributes: list[str]) -> list[str]:
    """Adjective order: size first, then colour, then the rest (pattern, material, ...)."""
    def rank(attribute: str) -> int:
        if attribute in SIZE_WORDS:
            return 0
        if attribute in COLOUR_WORDS:
            return 1
        return 2

    seen, ordered = set(), []
    for a in sorted(attributes, key=rank):  # stable within a rank
        if a not in seen:
            seen.add(a)
            ordered.append(a)
    return ordered


def noun_phrase(noun: str, attributes: list[str] = (), definite: bool = False) -> str:
    """ "a small red ball" / "the ball" (a re-mention keeps no adjectives)."""
    if definite:
        return f"the {noun}"
    return with_article(" ".join(order_attributes(list(attributes)) + [noun]))


def remove_doubled_words(text: str) -> str:
    """ "a a dog on on the grass" -> "a dog on the grass"."""
    return re.sub(r"\b(\w+)(\s+\1\b)+", r"\1", text, flags=re.IGNORECASE)


def finish_sentence(text: str) -> str:
    """Collapse spaces, capitalise the first letter and end with exactly one period."""
    text = re.sub(r"\s+", " ", text).strip().rstrip(" .,;")
    if not text:
        return text
    return text[0].upper() + text[1:] + "."
