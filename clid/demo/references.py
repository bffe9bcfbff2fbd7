"""Long references of the demo world: several true, detailed descriptions per level 3-6 (test images only),
and paragraphs: several true sentences about one scene (the paragraph task)."""
from __future__ import annotations

import math

from clid.base import english as en
from clid.base.rng import item_rng
from clid.base.text import caption_lengths, level_range
from clid.demo.captions import clause, noun_phrase, noun_word, partner, pick_salient, place_phrase, relation_words, verb
from clid.demo.relations import forward, grounded
from clid.demo.scenes import pick
from clid.demo.world import SCENES, Scene, Thing


def background_phrase(scene: Scene, rng, placed: bool = False) -> str:
    """Where it all is: "under a blue sky", "in a room with a yellow wall and a brown wooden floor".
    ``placed``: the sentence already said where (then only the sky may be added)."""
    regions = {t.category: t for t in scene.things if t.mode == "background"}
    if placed:
        return f"under a {regions['sky'].colour} sky" if "sky" in regions else ""
    if scene.kind == "room":
        wall, floor = regions["wall"], regions["floor"]
        floor_words = " ".join(en.order_attributes([a for a in (floor.colour, floor.texture) if a]) + ["floor"])
        return pick(rng, (f"in a room with a {wall.colour} wall and {en.with_article(floor_words)}",
                          f"in a room with {wall.colour} walls", f"on {en.with_article(floor_words)}"))
    sky = regions["sky"]
    ground = regions[SCENES[scene.kind][1]]
    options = [f"under a {sky.colour} sky", f"on the {ground.colour} {ground.category} under a {sky.colour} sky"]
    if "water" in regions:
        options.append(f"on a sandy beach by the {regions['water'].colour} water")
    return pick(rng, options)


def frame_phrase(t: Thing, scene: Scene, rng) -> str:
    """Where an object is in the picture: "in the background", "on the left side of the picture", ..."""
    options = []
    if grounded(t):
        depth = (t.box[3] - scene.horizon) / max(1, scene.height - scene.horizon)
        if depth > 0.7:
            options.append("in the foreground")
        elif depth < 0.3:
            options.append("in the background")
    if t.cx < scene.width / 3:
        options.append("on the left side of the picture")
    elif t.cx > 2 * scene.width / 3:
        options.append("on the right side of the picture")
    else:
        options.append("in the middle of the picture")
    return pick(rng, options)


def long_description(scene: Scene, rng, low: int, high: int, tokenizer) -> str | None:
    """A single detailed sentence describing the true scene, built clause by clause until its length
    falls in [low, high] tokens (None if this attempt overshoots or the scene has too little to say).

    New objects are introduced first, each related to the nearest object already mentioned; when
    there are no more, further true relations between mentioned objects are stated."""
    fg = scene.foreground()
    target = low + rng.random() * (high - low)
    words = {}

    def noun(t: Thing, n_attr: int, definite=False) -> str:  # one noun per object throughout the sentence
        words.setdefault(id(t), noun_word(t, rng))
        return noun_phrase(t, scene, rng, n_attr, definite, word=words[id(t)])

    def unique(t: Thing) -> bool:  # "the dog" is only clear when one dog was mentioned
        return sum(x.category == t.category for x in mentioned) == 1

    framed = []

    def where(t: Thing) -> str:  # now and then (once at most), where the subject is in the picture
        if framed or rng.random() > 0.25:
            return ""
        framed.append(t)
        return " " + frame_phrase(t, scene, rng)

    first = pick_salient(fg, rng, power=1.5)
    mentioned = [first]
    second = partner(first, scene, rng)
    stated = set()
    rich = lambda: pick(rng, (1, 2, 3), (0.25, 0.45, 0.3))  # noqa: E731
    placed = second is None or second.category == first.category
    if placed:
        text = " ".join(x for x in (noun(first, rich()), verb(first, True, rng) or "is",
                                    place_phrase(first, scene, rng, full=True)) if x)
    else:
        s, p, o = forward(first, second, scene)
        text = clause(s, p, o, scene, rng, noun(s, rich()), noun(o, rich()), finite=True) + where(s)
        mentioned.append(second)
        stated.add(frozenset((id(first), id(second))))
    length = lambda t: caption_lengths([t], tokenizer)[0]  # noqa: E731
    closing = background_phrase(scene, rng, placed) if rng.random() < 0.7 else ""
    rest = [t for t in fg if all(t is not m for m in mentioned)]
    rng.shuffle(rest)
    rest.sort(key=lambda t: -t.salience * rng.uniform(0.5, 1.5))
    for t in rest:
        if length(text + " " + closing) >= target:
            break
        anchors = [m for m in mentioned if m.category != t.category and unique(m)]
        if not anchors:
            continue
        anchor = min(anchors, key=lambda m: math.dist((m.cx, m.box[3]), (t.cx, t.box[3])))
        s, p, o = forward(t, anchor, scene)
        new = noun(t, rich())
        the = noun(anchor, 0, definite=True)
        s_text, o_text = (new, the) if s is t else (the, new)
        joiner = pick(rng, (", and", " and", ", while", ", with"), (3, 1, 1.5, 1.5 if s is t and p != "holding" else 0))
        if joiner == ", with":
            text += f", with {new} {relation_words(p, rng)} {the}"
        else:
            text += f"{joiner} {clause(s, p, o, scene, rng, s_text, o_text, finite=True)}{where(s)}"
        mentioned.append(t)
        stated.add(frozenset((id(t), id(anchor))))
    pairs = [(a, b) for i, a in enumerate(mentioned) for b in mentioned[i + 1:]
             if frozenset((id(a), id(b))) not in stated and a.category != b.category]
    rng.shuffle(pairs)
    for a, b in pairs:
        if length(text + " " + closing) >= target:
            break
        if unique(a) and unique(b):
            s, p, o = forward(a, b, scene)
            joiner = pick(rng, (", and", ", while"), (3, 1))
            text += f"{joiner} {clause(s, p, o, scene, rng, noun(s, 0, True), noun(o, 0, True), finite=True)}"
    if closing:
        text += (", " if rng.random() < 0.5 else " ") + closing
    text = en.finish_sentence(en.remove_doubled_words(text))
    return text if low <= length(text) <= high else None


def long_references(scene: Scene, seed: int, levels, per_level: int, tokenizer, attempts: int = 60) -> dict:
    """level -> up to ``per_level`` distinct descriptions of the level's length (fewer when the scene
    cannot fill the level truthfully; the caller counts those)."""
    rng = item_rng(seed, scene.image_id, "long refs")
    out = {}
    for level in levels:
        low, high = level_range(level)
        found = []
        for _ in range(attempts):
            text = long_description(scene, rng, low, high, tokenizer)
            if text and text not in found:
                found.append(text)
                if len(found) == per_level:
                    break
        out[level] = found
    return out


def paragraph(scene: Scene, seed: int, tokenizer, attempts: int = 40) -> str:
    """A paragraph about the true scene, as the Stanford paragraphs are: a few true sentences of 8 to
    30 tokens each, added until a target length is reached. The target is drawn from the paper's
    length shares of the Stanford paragraphs (2% up to 29 tokens, 32% at 30-59, 52% at 60-89, 14% at
    90-129); a scene with little in it says less (the paragraph stops after ``attempts`` tries, or,
    when no sentence fitted the target, after as many tries at any sentence of up to 30 tokens)."""
    from clid.data.stats import PAPER_PARAGRAPH_BANDS

    rng = item_rng(seed, scene.image_id, "paragraph")
    shares = [share for _, share in PAPER_PARAGRAPH_BANDS]
    (low, high), _ = PAPER_PARAGRAPH_BANDS[rng.choice(len(shares), p=[x / sum(shares) for x in shares])]
    target = int(rng.integers(low, high + 1))
    longest = PAPER_PARAGRAPH_BANDS[-1][0][1]
    sentences, length = [], 0
    for attempt in range(2 * attempts):
        if length >= target:
            break
        if attempt >= attempts and sentences:
            break
        # when no sentence fits a short target, any true sentence of up to 30 tokens rather than no paragraph
        fewest, most = (8, max(12, min(30, target - length))) if attempt < attempts else (1, 30)
        text = long_description(scene, rng, fewest, most, tokenizer)
        if not text or text in sentences:
            continue
        longer = caption_lengths([" ".join(sentences + [text])], tokenizer, keep_sentences=True)[0]
        if longer <= longest:  # a sentence that would leave the last level is not added
            sentences.append(text)
            length = longer
    return " ".join(sentences)
