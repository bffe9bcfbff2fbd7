"""Trusted captions of the demo world: short, varied, naming the 1 to 3 most salient objects.

First the words (nouns, verbs, relations and places, as people write them), then the captions.
"""
from __future__ import annotations

import math

import numpy as np

from clid.base import english as en
from clid.base.rng import item_rng
from clid.base.text import caption_lengths
from clid.demo.relations import attributes_of, forward, region_of
from clid.demo.scenes import pick, pick_many
from clid.demo.world import PATTERNS, PEOPLE, Scene, Thing

# =============================================================================================
# Words: nouns, verbs, relations and places, as people write them

NOUNS = {"man": (("man", 8), ("person", 1), ("guy", 1)), "woman": (("woman", 8), ("person", 1), ("lady", 1)),
         "bicycle": (("bicycle", 2), ("bike", 1)), "cup": (("cup", 3), ("mug", 1))}
YOUNG = {"dog": "puppy", "cat": "kitten"}
SIZE_SYNONYMS = {"large": (("large", 6), ("big", 3)), "small": (("small", 6), ("little", 2)), "tall": (("tall", 1),)}
RELATION_WORDS = {"on": (("on", 5), ("on top of", 2)), "under": (("under", 5), ("underneath", 1), ("beneath", 1)),
                  "in": (("in", 1),), "next to": (("next to", 5), ("beside", 2), ("near", 2), ("by", 1)),
                  "left of": (("to the left of", 1),), "right of": (("to the right of", 1),),
                  "in front of": (("in front of", 1),), "behind": (("behind", 1),),
                  "above": (("above", 3), ("over", 1)), "below": (("below", 2), ("beneath", 1)),
                  "holding": (("holding", 1),), "wearing": (("wearing", 1),)}
PLACES = {  # where a grounded object is, then where the scene is
    "grass": ("on the grass", "in a grassy field", "in a park", "on a grassy field", "in the park"),
    "sand": ("on the beach", "on the sand", "on a sandy beach"),
    "road": ("on the street", "on the road", "on a city street", "in the street"),
    "snow": ("in the snow", "on the snow", "on a snowy field"),
    "floor": ("in a room", "on the floor", "in a living room"),
    "water": ("on the water", "in the water"),
}
SCENE_PLACES = {"park": ("in a park", "in the park", "outside"), "beach": ("on the beach", "at the beach"),
                "street": ("on the street", "on a city street"), "snow": ("in the snow", "outside in the snow"),
                "room": ("in a room", "in a living room", "indoors")}


def wpick(rng, pairs):
    words, weights = zip(*pairs)
    return pick(rng, words, weights)


def noun_word(t: Thing, rng) -> str:
    if t.category in YOUNG and t.size == "small" and rng.random() < 0.3:
        return YOUNG[t.category]
    return wpick(rng, NOUNS[t.category]) if t.category in NOUNS else t.category


def clothes_of(t: Thing, scene: Scene) -> Thing | None:
    for u in scene.things:
        if u.mode == "part" and scene.things[u.support] is t:
            return u
    return None


def noun_phrase(t: Thing, scene: Scene, rng, n_attr: int, definite=False, word=None) -> str:
    """ "a small brown dog", "a man in a red striped shirt", "the dog" (re-mentions keep no adjectives)."""
    word = word or noun_word(t, rng)
    if definite:
        return f"the {word}"
    clothes = clothes_of(t, scene) if t.category in PEOPLE else None
    slots = [a for a in attributes_of(t)]
    if clothes is not None:
        slots += [("clothes", a) for a in (clothes.colour, clothes.texture) if a]
    weights = [1.5 if a == t.size else 1.2 if (isinstance(a, tuple) and a[1] in PATTERNS) or a == t.texture else 3.0
               for a in slots]
    chosen = pick_many(rng, slots, weights, n_attr) if n_attr > 0 else []
    adjectives = en.order_attributes([a for a in chosen if isinstance(a, str)])
    adjectives = [wpick(rng, SIZE_SYNONYMS[a]) if a in SIZE_SYNONYMS else a for a in adjectives]
    phrase = en.with_article(" ".join(adjectives + [word]))
    worn = en.order_attributes([a[1] for a in chosen if isinstance(a, tuple)])
    if worn:
        garment = " ".join(worn + [clothes.category])
        phrase += (" in " if rng.random() < 0.6 else " wearing ") + en.with_article(garment)
    return phrase


def verb(t: Thing, finite: bool, rng) -> str | None:
    """What the object is doing as a participle ("sitting") or a finite verb ("sits"), or None."""
    c, mode = t.category, t.mode
    if mode == "held":
        return ("flying", "flies") [finite] if c == "kite" else None
    if c in PEOPLE or c == "dog":
        pair = ("standing", "stands")
    elif c == "cat":
        pair = ("sitting", "sits")
    elif c == "bird":
        pair = ("flying", "flies") if mode == "sky" else pick(rng, (("perched", "is perched"), ("sitting", "sits")))
    elif c == "kite":
        pair = ("flying", "flies")
    elif c == "boat":
        pair = pick(rng, (("floating", "floats"), ("sailing", "sails")))
    elif c in ("car", "bicycle"):
        pair = ("parked", "is parked")
    elif c in ("ball", "book"):
        pair = ("lying", "lies")
    elif c in ("cup", "bottle", "box"):
        pair = ("sitting", "sits")
    elif c == "flower" and mode == "ground":
        pair = ("growing", "grows")
    else:
        pair = ("standing", "stands")
    return pair[finite]


def relation_words(p: str, rng) -> str:
    return wpick(rng, RELATION_WORDS[p])


def place_phrase(t: Thing, scene: Scene, rng, full=False) -> str:
    """Where the object is: its ground region when it stands on it, else where the scene is."""
    region = region_of(t, scene)
    if region is not None and region.category == "sky":
        return f"in the {region.colour} sky" if full or rng.random() < 0.3 else "in the sky"
    if region is not None and region.category in PLACES and t.mode in ("ground", "water"):
        return pick(rng, PLACES[region.category])
    return pick(rng, SCENE_PLACES[scene.kind])


def count_of(t: Thing, scene: Scene) -> int:
    return sum(u.category == t.category for u in scene.foreground())


# =============================================================================================
# Trusted captions: short, varied, naming the 1 to 3 most salient objects

# COCO 2014 val caption lengths (tokens incl. the final ".", measured with `python -m clid.stats`), in %
COCO_LENGTHS = {8: 0.6, 9: 11.4, 10: 18.4, 11: 20.5, 12: 17.1, 13: 12.2, 14: 7.8, 15: 4.7, 16: 2.7, 17: 1.6,
                18: 1.0, 19: 0.6, 20: 0.4, 21: 0.3, 22: 0.2, 23: 0.15, 24: 0.1}


def pick_salient(things: list, rng, power: float, exclude=()) -> Thing | None:
    options = [t for t in things if all(t is not e for e in exclude)]
    if not options:
        return None
    return pick(rng, options, [max(t.salience, 1e-4) ** power for t in options])


def partner(t: Thing, scene: Scene, rng, exclude=()) -> Thing | None:
    """A second object to mention with ``t``: salient, and preferably touching or near it."""
    others = [u for u in scene.foreground() if u is not t and all(u is not e for e in exclude)]
    if not others:
        return None
    weights = []
    for u in others:
        w = max(u.salience, 1e-4)
        if u.support is not None and scene.things[u.support] is t or t.support is not None and scene.things[t.support] is u:
            w *= 4.0
        d = math.dist((t.cx, t.box[3]), (u.cx, u.box[3])) / scene.width
        weights.append(w / (0.3 + d))
    return pick(rng, others, weights)


def n_attributes(rng, richer=False) -> int:
    return pick(rng, (0, 1, 2), (0.2, 0.45, 0.35) if richer else (0.32, 0.5, 0.18))


def clause(s: Thing, p: str, o: Thing, scene: Scene, rng, s_text: str, o_text: str, finite=False) -> str:
    """ "<s> <verb> <relation> <o>", e.g. "a dog standing next to a ball", "a man flying a kite"."""
    if p == "holding":
        if o.category == "kite" and rng.random() < 0.5:
            return f"{s_text} {'flies' if finite else 'flying'} {o_text}"
        return f"{s_text} {pick(rng, ('holds', 'is holding') if finite else ('holding',))} {o_text}"
    v = verb(s, finite, rng)
    if finite and v is None:
        v = "is"
    elif not finite and (v is None or rng.random() < 0.35):
        v = ""
    return " ".join(x for x in (s_text, v, relation_words(p, rng), o_text) if x)


def trusted_caption(scene: Scene, rng) -> str:
    """One short caption in one of many human-like phrasings; every statement in it is true."""
    fg = scene.foreground()
    a = pick_salient(fg, rng, power=2.0)
    k = pick(rng, (1, 2, 3), (0.3, 0.55, 0.15))
    b = partner(a, scene, rng) if k >= 2 else None
    if b is None:  # one object (or a group of one category)
        n = count_of(a, scene)
        np_a = en.count_phrase(n, noun_word(a, rng)) if n > 1 and rng.random() < 0.6 \
            else noun_phrase(a, scene, rng, n_attributes(rng, richer=True))
        v = verb(a, False, rng) if a.mode != "held" else None
        where = place_phrase(a, scene, rng)
        form = pick(rng, ("plain", "there", "picture", "is"), (5, 1.5, 1.5, 1.5 if v else 0))
        if form == "there":
            return f"there {'are' if np_a.split()[0] in en.WORD_NUMBERS else 'is'} {np_a} {v or ''} {where}"
        if form == "picture":
            return f"{pick(rng, ('a picture of', 'a photo of', 'an image of', 'a view of'))} {np_a} {where}"
        if form == "is" and np_a.split()[0] not in en.WORD_NUMBERS:
            return f"{np_a} is {v} {where}"
        return f"{np_a} {v or ''} {where}"
    s, p, o = forward(a, b, scene)
    if s.category == o.category:  # two of a kind: people would count them
        n = count_of(s, scene)
        return f"{en.count_phrase(n, noun_word(s, rng))} {verb(s, False, rng) or ''} {place_phrase(s, scene, rng)}"
    np_s = noun_phrase(s, scene, rng, n_attributes(rng))
    np_o = noun_phrase(o, scene, rng, n_attributes(rng))
    if k == 3:
        c = partner(s, scene, rng, exclude=(o,))
        if c is not None and c.category not in (s.category, o.category):
            np_c = noun_phrase(c, scene, rng, n_attributes(rng) and 1)
            s2, p2, o2 = forward(o, c, scene)
            if s2 is o and p2 not in ("holding",) and rng.random() < 0.5:  # a chain: s - o - c
                return f"{clause(s, p, o, scene, rng, np_s, np_o)} {relation_words(p2, rng)} {np_c}"
            return f"{np_s}, {np_o} and {np_c} {pick(rng, SCENE_PLACES[scene.kind])}"
    form = pick(rng, ("clause", "clause+place", "with", "and", "there", "is"), (4, 3, 1 if p in ("on", "holding") else 0,
                                                                               1.5, 1, 1.5))
    if form == "with" and p == "on":
        return f"{np_o} with {np_s} {pick(rng, ('on it', 'on top of it', 'on top'))}"
    if form == "with" and p == "holding":
        return f"{np_s} with {np_o} {place_phrase(s, scene, rng)}"
    if form == "and":
        return f"{np_s} and {np_o} {pick(rng, SCENE_PLACES[scene.kind])}"
    if form == "there":
        return f"there is {clause(s, p, o, scene, rng, np_s, np_o)}"
    if form == "is" and p != "holding":
        v = verb(s, False, rng)
        return f"{np_s} is {v + ' ' if v and s.mode != 'held' else ''}{relation_words(p, rng)} {np_o}"
    text = clause(s, p, o, scene, rng, np_s, np_o)
    if form == "clause+place" and p not in ("in",):
        text += " " + place_phrase(s, scene, rng)
    return text


def style(text: str, rng) -> str:
    """People's punctuation: mostly "A dog on the grass.", sometimes lower case or no period."""
    text = en.remove_doubled_words(" ".join(text.split()))
    r = rng.random()
    if r < 0.82:
        return en.finish_sentence(text)
    if r < 0.92:
        return text
    return text[0].upper() + text[1:]


def trusted_captions(scene: Scene, seed: int, n: int, tokenizer, candidates: int = 30) -> list[str]:
    """``n`` distinct captions whose lengths follow COCO's: many candidates are drawn, then for each
    caption a target length is drawn from COCO's histogram and the nearest unused candidate is taken."""
    rng = item_rng(seed, scene.image_id, "captions")
    pool = list(dict.fromkeys(style(trusted_caption(scene, rng), rng) for _ in range(candidates)))
    lengths = np.asarray(caption_lengths(pool, tokenizer))
    targets, probs = zip(*COCO_LENGTHS.items())
    chosen = []
    for _ in range(min(n, len(pool))):
        target = pick(rng, targets, probs)
        gap = np.abs(lengths - target).astype(float) + rng.random(len(pool)) * 0.5
        gap[chosen] = np.inf
        chosen.append(int(np.argmin(gap)))
    return [pool[i] for i in chosen]
