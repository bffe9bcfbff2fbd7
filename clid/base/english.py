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


# ---------------------------------------------------------------------------------------------
# Scene-graph surface text (02, 03): number of a noun, mentions, predicates as verb phrases

# nouns that are plural although they do not look it, and singulars that end in "s"
_PLURAL_ONLY = {"glasses", "jeans", "pants", "shorts", "trousers", "scissors", "clothes", "goggles",
                "people", "men", "women", "children", "feet", "teeth", "mice", "geese", "oxen", "police",
                "sunglasses", "leggings", "tongs", "pliers", "binoculars", "headphones", "earphones", "menus",
                "emus", "tutus"}
_SINGULAR_S = {"bus", "lens", "news", "series", "species", "gas", "canvas", "atlas", "christmas", "tennis",
               "physics", "mathematics", "chaos", "apparatus", "hummus", "octopus", "walrus", "iris", "axis",
               "basis", "oasis", "chassis", "hibiscus", "cactus", "asparagus", "citrus", "bonus", "circus"}
# nouns that take no "a"/"an" ("green grass", not "a green grass")
MASS_NOUNS = {"grass", "water", "snow", "sand", "dirt", "mud", "hair", "fur", "food", "rice", "broccoli",
              "bread", "cheese", "meat", "sauce", "pasta", "lettuce", "furniture", "luggage", "traffic",
              "wood", "concrete", "asphalt", "gravel", "foliage", "smoke", "steam", "ice", "milk", "coffee",
              "tea", "juice", "wine", "beer", "soup", "cereal", "spinach", "frosting", "icing", "graffiti",
              "writing", "lettering", "text", "clothing", "scenery", "vegetation", "shade", "sunlight",
              "weather", "fog", "rain", "foam", "soil", "hay", "straw", "moss", "ivy", "seaweed", "butter",
              "chocolate", "cream", "salt", "sugar", "metal", "plastic"}


# nouns of which a scene has one: first mentioned with "the" ("the blue sky")
UNIQUE_NOUNS = {"sky", "sun", "moon", "horizon", "ocean", "sea", "ground"}


def is_plural(noun: str) -> bool:
    """True for plural nouns ("trees", "people", "glasses"); judged by the last word."""
    last = noun.strip().rsplit(" ", 1)[-1].lower()
    if last in _PLURAL_ONLY or noun.strip().lower() in _PLURAL_ONLY:
        return True
    if last in _SINGULAR_S or noun.strip().lower() in _SINGULAR_S or last in _IRREGULAR_PLURALS:
        return False
    if len(last) <= 3 or re.search(r"(ss|us|ous)$", last):
        return False
    return last.endswith("s")


def is_mass_noun(noun: str) -> bool:
    return noun.strip().rsplit(" ", 1)[-1].lower() in MASS_NOUNS


def mention(noun: str, attributes=(), definite: bool = False) -> str:
    """A first mention with its adjectives ("a small red ball", "tall trees", "green grass",
    "the blue sky") or a re-mention ("the ball", "the trees"). Plural and mass nouns take no
    "a"/"an"; a scene's unique things (sky, sea, ground) take "the"."""
    if definite:
        return f"the {noun}"
    phrase = " ".join(order_attributes([a for a in attributes if a != noun]) + [noun])
    if noun in UNIQUE_NOUNS:
        return f"the {phrase}"
    if is_plural(noun) or is_mass_noun(noun):
        return phrase
    return with_article(phrase)


# Verbs that appear as Visual Genome predicates ("man rides horse", "man wear hat").
VERBS = {"wear", "hold", "ride", "sit", "stand", "carry", "eat", "look", "walk", "lay", "lie", "hang", "cover",
         "contain", "touch", "watch", "play", "fly", "throw", "catch", "pull", "drive", "grow", "use", "lean",
         "swing", "hit", "park", "show", "read", "face", "cast", "cross", "drink", "support", "surround",
         "belong", "rest", "sleep", "run", "chase", "fill", "enter", "reach", "overlook", "border", "line",
         "adorn", "attach", "mount", "pass", "push", "graze", "kick", "light", "tow", "cut", "brush", "feed",
         "pet", "hug", "kiss", "guard", "serve", "type", "say", "block", "reflect", "wait", "sell", "print",
         "decorate", "frame", "float", "climb", "lick", "bite", "smell", "lift", "hold", "swim", "jump", "sniff",
         "talk", "smile", "point", "carve", "wash", "open", "close", "pick", "drag", "dig", "paint", "fix",
         "sail", "skate", "ski", "surf", "board", "hover", "stick", "tie", "slice", "stir", "pour", "grab"}
_AUXILIARIES = {"is", "are", "am", "was", "were", "be", "being", "been", "it", "its"}

# Words that end no caption and follow no article ("... and a", "a the", "next a on"): articles, conjunctions,
# prepositions, possessives, auxiliaries and the walks' participles (clid.selfgen.walk)
ARTICLES = {"a", "an", "the"}
FUNCTION_WORDS = ARTICLES | {"and", "or", "of", "on", "in", "at", "to", "with", "by", "for", "from", "into", "onto",
                             "over", "under", "below", "above", "behind", "beside", "near", "next", "front", "inside",
                             "its", "his", "her", "their", "is", "are", "was", "were", "wearing", "holding"}


ADJECTIVES = SIZE_WORDS | COLOUR_WORDS

# words ending in -ing/-ed that are nouns, not verbs
ING_NOUNS = {"building", "ceiling", "painting", "clothing", "railing", "awning", "king", "ring", "string", "wing",
             "thing", "evening", "morning", "icing", "frosting", "topping", "lettering", "writing", "bedding",
             "siding", "pudding", "sing", "spring", "swing", "sling", "stuffing", "dressing", "seasoning",
             "wedding", "sibling", "flowerbed", "seabed", "hundred", "steed", "bobsled"}
# verbs of the long descriptions and of the sentence paraphrases ("stands", "is"), besides -ing and -ed forms
FINITE_VERBS = {"is", "are", "has", "have", "stands", "stand", "sits", "sit", "holds", "hold", "wears", "wear", "lies",
                "rides", "walks", "looks", "hangs", "grows", "flies", "rests", "waits", "plays"}


def bare_noun_phrase(words: list[str]) -> bool:
    """Whether lower-cased words are a noun phrase alone: no preposition, no verb ("a tall man", "water")."""
    return bool(words) and not any(
        (w in FUNCTION_WORDS and w not in ARTICLES) or w in FINITE_VERBS
        or (w.endswith(("ing", "ed")) and len(w) > 4 and w not in ING_NOUNS) for w in words)


def and_parts(words: list[str]) -> list[list[str]]:
    """The runs of words between "and"s, empty ones left out ("a dog and and a cat" -> [a dog], [a cat])."""
    parts, current = [], []
    for w in words + ["and"]:
        if w == "and":
            if current:
                parts.append(current)
            current = []
        else:
            current.append(w)
    return parts


def object_list(words: list[str]) -> bool:
    """Whether a caption's lower-cased words (punctuation stripped) read as a list of objects: two or more of
    its parts between "and"s are bare noun phrases, and they are at least half of its parts ("a sand and a
    dress and a woman and a shirt"), where a sentence links its objects by verbs and prepositions."""
    parts = and_parts(words)
    bare = sum(bare_noun_phrase(p) for p in parts)
    return bare >= 2 and 2 * bare >= len(parts)


def breaks_phrase(left: str, right: str | None, sound: bool = True) -> bool:
    """Whether the word ``left`` then ``right`` (None: the end) breaks a phrase: a function word at the end,
    an article before a function word, an adjective before an article ("a gray the sky"), and (``sound``)
    "a" or "an" against the next word's sound ("a umbrella", which :func:`fix_articles` mends)."""
    if right is None:
        return left in FUNCTION_WORDS
    if sound and left in ("a", "an") and right.isalpha() and right not in FUNCTION_WORDS:
        return left != article(right)
    return (left in ARTICLES and right in FUNCTION_WORDS) or (left in ADJECTIVES and right in ARTICLES)


def fix_articles(text: str) -> str:
    """"a" or "an" as the next word sounds ("a umbrella" -> "an umbrella"); the word count stays."""
    words = text.split(" ")
    for i, (word, right) in enumerate(zip(words, words[1:])):
        if word.lower() in ("a", "an") and right[:1].isalpha() and right.lower() not in FUNCTION_WORDS:
            fixed = article(right)
            words[i] = fixed if word.islower() else fixed.capitalize()
    return " ".join(words)


def broken_phrase(words: list[str]) -> bool:
    """Whether lower-cased words (a full stop stripped) hold a pair that breaks a phrase (:func:`breaks_phrase`)."""
    return any(breaks_phrase(left, right) for left, right in zip(words, words[1:] + [None]))
_DOUBLING = re.compile(r"^[^aeiou]*[aeiou][^aeiouwxy]$")  # one-syllable CVC words double: sit -> sitting


def present_participle(verb: str) -> str:
    """ "ride" -> "riding", "sit" -> "sitting", "lie" -> "lying", "look" -> "looking"."""
    if verb.endswith("ie"):
        return verb[:-2] + "ying"
    if verb.endswith("e") and not verb.endswith(("ee", "ye", "oe")) and len(verb) > 2:
        return verb[:-1] + "ing"
    if _DOUBLING.match(verb) and verb not in {"open", "visit"}:
        return verb + verb[-1] + "ing"
    return verb + "ing"


def _verb_base(word: str) -> str | None:
    """The base form of a verb in VERBS given as base or third person ("rides" -> "ride"), else None."""
    if word in VERBS:
        return word
    candidates = []
    if word.endswith("ies"):
        candidates.append(word[:-3] + "y")
        candidates.append(word[:-1])  # lies -> lie, ties -> tie
    if word.endswith("es"):
        candidates.append(word[:-2])
    if word.endswith("s"):
        candidates.append(word[:-1])
    return next((c for c in candidates if c in VERBS), None)


def predicate_phrase(predicate: str) -> str:
    """A scene-graph predicate as a verb phrase that can follow a noun phrase.

    "riding" -> "riding", "rides" / "ride" -> "riding", "has" / "have" -> "with",
    "is on" -> "on", "sits on" -> "sitting on", "parked on" -> "parked on", "next to" -> "next to".
    """
    words = re.sub(r"[^a-z0-9' ]+", " ", predicate.lower()).split()
    while words and words[0] in _AUXILIARIES and len(words) > 1:
        words = words[1:]
    while len(words) > 1 and words[-1] in ("a", "an", "the"):
        words = words[:-1]
    if not words or words[0] in _AUXILIARIES:
        return "with"
    first = words[0]
    if words in (["left", "of"], ["right", "of"]):
        return f"to the {first} of"
    if first in ("has", "have", "having", "had"):
        return " ".join(["with"] + words[1:])
    base = _verb_base(first)
    if base is not None:
        words = [present_participle(base)] + words[1:]
    return " ".join(words)
