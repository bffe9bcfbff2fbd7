"""Relations between the objects of a demo scene, read off the drawn geometry."""
from __future__ import annotations

import math

from clid.demo.world import PEOPLE, SCENES, Scene, Thing

INVERSE = {"held by": "holding", "supporting": "on", "over": "under"}  # b <pred> a reads better


def grounded(t: Thing) -> bool:
    return t.mode in ("ground", "water")


def predicate(a: Thing, b: Thing, scene: Scene) -> str:
    """How ``a`` relates to ``b`` in the picture; an INVERSE key means "b <forward> a"."""
    if a.hand is not None and b.grip is not None and math.dist(a.hand, b.grip) <= 2.0:
        return "holding"
    if b.hand is not None and a.grip is not None and math.dist(b.hand, a.grip) <= 2.0:
        return "held by"
    for x, y, fwd, inv in ((a, b, "on", "supporting"), (b, a, "supporting", "on")):
        surface = y.surface()
        if surface and x.mode == "on" and abs(x.box[3] - 1 - surface[0]) <= 2 and surface[1] <= x.cx <= surface[2]:
            return fwd
        if surface and x.mode == "under" and x.box[1] >= surface[0] and y.box[0] <= x.cx <= y.box[2] \
                and abs(x.box[3] - y.box[3]) <= 3:
            return "under" if fwd == "on" else "over"
    if (a.mask & b.mask).sum() >= 4:  # drawn silhouettes overlap: the later one hides the other
        return "in front of" if a.depth > b.depth else "behind"
    x_overlap = min(a.box[2], b.box[2]) - max(a.box[0], b.box[0])
    if x_overlap > 0.3 * min(a.w, b.w):
        if grounded(a) and grounded(b):  # both stand on the ground: higher in the picture = further away
            if abs(a.box[3] - b.box[3]) > 3:
                return "in front of" if a.box[3] > b.box[3] else "behind"
        elif a.box[3] <= b.box[1] + 1:
            return "above"
        elif a.box[1] >= b.box[3] - 1:
            return "below"
    if grounded(a) and grounded(b) and abs(a.box[3] - b.box[3]) < 0.15 * scene.height:
        gap = max(b.box[0] - a.box[2], a.box[0] - b.box[2])
        if gap <= 0.5 * (a.w + b.w) / 2:
            return "next to"
    return "left of" if a.cx < b.cx else "right of"


def forward(a: Thing, b: Thing, scene: Scene) -> tuple[Thing, str, Thing]:
    """The relation of a and b as (subject, forward predicate, object)."""
    p = predicate(a, b, scene)
    return (b, INVERSE[p], a) if p in INVERSE else (a, p, b)


def region_of(t: Thing, scene: Scene) -> Thing | None:
    """The background region a grounded or flying object is on or in (with the predicate)."""
    regions = {r.category: r for r in scene.things if r.mode == "background"}
    if t.mode == "sky" or (t.mode == "held" and t.category == "kite"):
        return regions.get("sky")
    if t.mode == "water":
        return regions.get("water")
    if t.mode == "ground":
        return regions.get(SCENES[scene.kind][1])
    return None


def true_relations(scene: Scene, rng) -> list[tuple[int, str, int]]:
    """The graph's edges as (subject index, predicate, object index), like VG annotators would mark them:
    clothes, supports and holds, the region an object is on, and relations to its nearest neighbours."""
    things = scene.things
    index = {id(t): i for i, t in enumerate(things)}
    edges, linked = [], set()

    def add(a: int, p: str, b: int):
        edges.append((a, p, b))
        linked.add(frozenset((a, b)))

    for i, t in enumerate(things):
        if t.mode == "part":
            add(t.support, "wearing", i)
        elif t.support is not None and t.mode in ("on", "under", "held"):
            s, p, o = forward(t, things[t.support], scene)
            add(index[id(s)], p, index[id(o)])
    fg = scene.foreground()
    for t in fg:
        region = region_of(t, scene)
        if region is not None and rng.random() < 0.55:
            add(index[id(t)], "in" if region.category == "sky" else "on", index[id(region)])
    for t in fg:
        others = sorted((u for u in fg if u is not t),
                        key=lambda u: math.dist(((t.box[0] + t.box[2]) / 2, (t.box[1] + t.box[3]) / 2),
                                                ((u.box[0] + u.box[2]) / 2, (u.box[1] + u.box[3]) / 2)))
        for u in others[:2]:
            i, j = index[id(t)], index[id(u)]
            if frozenset((i, j)) not in linked and rng.random() < 0.8:
                s, p, o = forward(t, u, scene)
                add(index[id(s)], p, index[id(o)])
    return edges


def attributes_of(t: Thing) -> list[str]:
    """The attributes a viewer can read: size, colour, pattern/material (people's colours are their clothes')."""
    if t.category in PEOPLE:
        return [t.size] if t.size else []
    return [a for a in (t.size, t.colour, t.texture) if a]
