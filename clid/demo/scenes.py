"""Building a scene of the demo world: background regions, object placement, occlusion, salience."""
from __future__ import annotations

import math

import numpy as np
from PIL import Image, ImageDraw

from clid.base.rng import item_rng
from clid.demo.drawing import paint_background, paint_thing
from clid.demo.world import (
    ALL_COLOURS,
    CARRIES,
    CATEGORIES,
    CLOTHES,
    COLOURS,
    COVERS,
    GROUND,
    HAIR,
    PATTERNS,
    PEOPLE,
    SCENES,
    SKIN,
    SKY_COLOURS,
    WALL_COLOURS,
    Scene,
    Thing,
)


def pick(rng, options, weights=None):
    """One of ``options``, uniformly or proportionally to ``weights`` (plain Python: it is called a lot)."""
    if not isinstance(options, (list, tuple)):
        options = list(options)
    if weights is None:
        return options[min(int(rng.random() * len(options)), len(options) - 1)]
    r = rng.random() * sum(weights)
    for option, weight in zip(options, weights):
        r -= weight
        if r < 0:
            return option
    return options[-1]


def pick_many(rng, options, weights, k: int) -> list:
    """``k`` distinct options drawn proportionally to ``weights``, kept in their original order."""
    options, weights, out = list(options), list(weights), []
    for _ in range(min(k, len(options))):
        i = pick(rng, range(len(options)), weights)
        out.append(i)
        weights[i] = 0.0
    return [options[i] for i in sorted(out)]


def jitter_rgb(rng, rgb, amount=14) -> tuple:
    return tuple(int(np.clip(c + rng.integers(-amount, amount + 1), 0, 255)) for c in rgb)


def background_things(kind: str, W: int, H: int, rng) -> tuple[int, list]:
    """The background regions as Things (they are graph objects too, like VG's sky and grass)."""
    regions = []
    if kind == "room":
        hz = int(rng.uniform(0.42, 0.55) * H)
        wall = pick(rng, list(WALL_COLOURS))
        regions.append(Thing("wall", (0, 0, W, hz), colour=wall, mode="background",
                             rgb=jitter_rgb(rng, WALL_COLOURS[wall], 8)))
        if rng.random() < 0.6:
            regions.append(Thing("floor", (0, hz, W, H), colour="brown", texture="wooden", mode="background",
                                 rgb=jitter_rgb(rng, (160, 110, 65), 10)))
        else:
            regions.append(Thing("floor", (0, hz, W, H), colour="gray", mode="background",
                                 rgb=jitter_rgb(rng, (150, 150, 150), 10)))
        return hz, regions
    hz = int(rng.uniform(0.36, 0.5) * H)
    sky = "blue" if rng.random() < 0.75 else "gray"
    regions.append(Thing("sky", (0, 0, W, hz), colour=sky, mode="background", rgb=jitter_rgb(rng, SKY_COLOURS[sky], 8)))
    ground = SCENES[kind][1]
    top = hz
    if kind == "beach":
        top = hz + int(rng.uniform(0.12, 0.2) * H)
        word, rgb = GROUND["water"]
        regions.append(Thing("water", (0, hz, W, top), colour=word, mode="background", rgb=jitter_rgb(rng, rgb, 8)))
    word, rgb = GROUND[ground]
    regions.append(Thing(ground, (0, top, W, H), colour=word, mode="background", rgb=jitter_rgb(rng, rgb, 8)))
    return hz, regions


def size_word(category: str, ratio: float) -> str | None:
    """The size attribute a viewer reads off the drawn size (ratio to the category's nominal size)."""
    tall = category in ("man", "woman", "tree", "lamp")
    if ratio > 1.3:
        return "tall" if tall else "large"
    if ratio < 0.72 and category not in PEOPLE:
        return "small"
    return None


class Placer:
    """Places objects one by one: on the ground at a depth, on supporters, under them, in hands, in the sky."""

    def __init__(self, kind, W, H, horizon, regions, rng):
        self.kind, self.W, self.H, self.hz, self.rng = kind, W, H, horizon, rng
        self.regions = {t.category: t for t in regions}
        self.things: list[Thing] = []
        self.ground = self.regions[SCENES[kind][1]]
        self.ground_top = self.ground.box[1]
        self.occupied: dict[int, list] = {}  # supporter index -> [(x1, x2)] of things on it
        self.covered: set[int] = set()  # supporters with something under them

    def depth_scale(self, baseline: float) -> float:
        return 0.55 + 0.65 * (baseline - self.hz) / max(1.0, self.H - self.hz)

    def size_multiplier(self, small_bias=0.0) -> float:
        return pick(self.rng, (0.68, 1.0, 1.38), (0.25 + small_bias, 0.5, 0.25 - small_bias * 0.8))

    def modes_for(self, name: str) -> list[tuple[str, float]]:
        cat = CATEGORIES[name]
        out = []
        if "ground" in cat.modes:
            out.append(("ground", 1.0 if name not in ("cup", "bottle", "book") else 0.4))
        if "water" in cat.modes and "water" in self.regions:
            out.append(("water", 1.0))
        if "sky" in cat.modes and "sky" in self.regions:
            out.append(("sky", 1.2 if name == "bird" else 1.0))
        if "on" in cat.modes and any(name in CARRIES.get(t.category, ()) for t in self.things):
            out.append(("on", 2.0))
        if "under" in cat.modes and any(name in COVERS.get(t.category, ()) and i not in self.covered
                                        for i, t in enumerate(self.things)):
            out.append(("under", 0.8))
        if "held" in cat.modes and self.free_hands():
            out.append(("held", 1.5))
        if name == "kite" and self.free_hands():
            out.append(("kite-held", 2.0))
        return out

    def free_hands(self) -> list[int]:
        return [i for i, t in enumerate(self.things) if t.category in PEOPLE and t.hand is None and t.mode == "ground"]

    def new_thing(self, name: str, box, mode: str, ratio: float, support=None, depth=0.0) -> Thing:
        cat, rng = CATEGORIES[name], self.rng
        colour = pick(rng, cat.colours)
        texture = None
        if cat.textures and rng.random() < 0.4 and min(box[2] - box[0], box[3] - box[1]) >= 12:
            texture = pick(rng, cat.textures)
            if texture == "wooden":
                colour = "brown"
            elif texture == "metal":
                colour = "gray"
        t = Thing(name, tuple(int(round(v)) for v in box), colour=colour, size=size_word(name, ratio), texture=texture,
                  mode=mode, support=support, depth=depth, flip=bool(cat.flippable and rng.random() < 0.5),
                  rgb=jitter_rgb(rng, COLOURS[colour]))
        t.extra["variant"] = float(rng.random())
        if name == "house":
            t.extra["roof"] = jitter_rgb(rng, pick(rng, ((150, 50, 40), (90, 60, 45), (80, 80, 90))), 10)
        if name in PEOPLE:
            t.extra.update(skin=SKIN[int(rng.integers(len(SKIN)))], hair=HAIR[int(rng.integers(len(HAIR)))],
                           pants=jitter_rgb(rng, pick(rng, ((40, 50, 90), (35, 35, 40), (110, 90, 70))), 8),
                           hand_side=int(pick(rng, (-1, 1))))
            t.colour, t.texture = pick(rng, ALL_COLOURS), (pick(rng, PATTERNS) if rng.random() < 0.3 else None)
            t.rgb = jitter_rgb(rng, COLOURS[t.colour])
        return t

    def fits(self, box) -> bool:
        x1, y1, x2, y2 = box
        return x1 >= 0 and y1 >= 0 and x2 <= self.W and y2 <= self.H and y2 - y1 >= 7 and x2 - x1 >= 6

    def place(self, name: str) -> bool:
        modes = self.modes_for(name)
        if not modes:
            return False
        mode = pick(self.rng, [m for m, _ in modes], [w for _, w in modes])
        return getattr(self, "place_" + mode.replace("-", "_"))(name)

    def _x_centre(self, w: float) -> float:
        if self.rng.random() < 0.6:  # people frame their subject near the centre
            cx = self.rng.normal(self.W / 2, 0.2 * self.W)
        else:
            cx = self.rng.uniform(0, self.W)
        return float(np.clip(cx, w / 2, self.W - w / 2))

    def place_ground(self, name: str, band=None) -> bool:
        cat, rng = CATEGORIES[name], self.rng
        top = band[0] if band else self.ground_top
        bottom = band[1] if band else self.H
        if name in ("house", "tree"):  # big things stand further back
            baseline = top + rng.uniform(0.05, 0.45) * (bottom - top)
        else:
            baseline = top + rng.uniform(0.12, 1.0) * (bottom - top)
        scale = self.depth_scale(baseline)
        mult = self.size_multiplier()
        h = cat.height * self.H * scale * mult
        w = h * cat.aspect
        if w > self.W * 0.9:
            return False
        cx = self._x_centre(w)
        box = (cx - w / 2, baseline - h, cx + w / 2, baseline)
        if not self.fits(box):
            return False
        self.things.append(self.new_thing(name, box, "water" if band else "ground", scale * mult, depth=baseline / self.H))
        return True

    def place_water(self, name: str) -> bool:
        water = self.regions["water"].box
        return self.place_ground(name, band=(water[1] + 0.35 * (water[3] - water[1]), water[3]))

    def place_sky(self, name: str, tether=None) -> bool:
        cat, rng = CATEGORIES[name], self.rng
        h = cat.height * self.H * rng.uniform(0.6, 1.1)
        w = h * (1.9 if name == "bird" else cat.aspect)
        cx = self._x_centre(w) if tether is None else float(np.clip(tether[0] + rng.uniform(-0.25, 0.25) * self.W,
                                                                     w / 2, self.W - w / 2))
        y1 = rng.uniform(2, max(3.0, self.hz - h - 4))
        box = (cx - w / 2, y1, cx + w / 2, y1 + h)
        if not self.fits(box) or box[3] > self.hz - 1:
            return False
        self.things.append(self.new_thing(name, box, "sky", 1.0, depth=-1.0 + 0.01 * len(self.things)))
        return True

    def place_on(self, name: str) -> bool:
        cat, rng = CATEGORIES[name], self.rng
        supporters = [i for i, t in enumerate(self.things) if name in CARRIES.get(t.category, ())]
        i = pick(rng, supporters)
        s = self.things[i]
        ys, xs1, xs2 = s.surface()
        h = cat.height * self.H * self.depth_scale(s.box[3]) * self.size_multiplier(small_bias=0.1)
        w = h * cat.aspect
        free = xs2 - xs1
        if w > free:
            h, w = h * free / w * 0.9, free * 0.9
        if h < 7:
            return False
        for _ in range(6):
            x1 = rng.uniform(xs1, xs2 - w)
            if all(x1 + w <= a or x1 >= b for a, b in self.occupied.get(i, [])):
                break
        else:
            return False
        box = (x1, ys - h + 1, x1 + w, ys + 1)
        if not self.fits(box):
            return False
        self.occupied.setdefault(i, []).append((x1, x1 + w))
        ratio = h / (cat.height * self.H)
        self.things.append(self.new_thing(name, box, "on", ratio, support=i, depth=s.depth + 0.001 * (len(self.things) + 1)))
        return True

    def place_under(self, name: str) -> bool:
        cat, rng = CATEGORIES[name], self.rng
        options = [i for i, t in enumerate(self.things) if name in COVERS.get(t.category, ()) and i not in self.covered]
        i = pick(rng, options)
        s = self.things[i]
        ys, xs1, xs2 = s.surface()
        room = s.box[3] - ys - 3
        h = min(cat.height * self.H * self.depth_scale(s.box[3]) * self.size_multiplier(0.1), room)
        w = h * cat.aspect
        inner = (s.box[0] + 0.16 * s.w, s.box[2] - 0.16 * s.w)
        if w > inner[1] - inner[0]:
            h, w = h * (inner[1] - inner[0]) / w, inner[1] - inner[0]
        if h < 7:
            return False
        # (max: when the object fills the inner span, inner[1] - w can fall one rounding below inner[0])
        x1 = rng.uniform(inner[0], max(inner[0], inner[1] - w))
        box = (x1, s.box[3] - h, x1 + w, s.box[3])
        if not self.fits(box):
            return False
        self.covered.add(i)
        self.things.append(self.new_thing(name, box, "under", h / (cat.height * self.H), support=i,
                                          depth=s.depth + 0.0005))
        return True

    def _hand(self, person: Thing, pose: str) -> tuple:
        side = person.extra["hand_side"]
        rel_x = 0.97 if side == 1 else 0.03
        rel_y = {"low": 0.42, "high": 0.14}[pose]
        person.extra["hand_rel"] = (rel_x, rel_y)
        return person.box[0] + rel_x * person.w, person.box[1] + rel_y * person.h

    def place_held(self, name: str) -> bool:
        cat, rng = CATEGORIES[name], self.rng
        i = pick(rng, self.free_hands())
        person = self.things[i]
        h = cat.held_height * person.h
        w = h * cat.aspect
        hx, hy = self._hand(person, "low")
        side = person.extra["hand_side"]
        if name == "umbrella":  # the handle is in the hand, the canopy over the head
            box = (hx - w / 2, hy - h * 0.97, hx + w / 2, hy + h * 0.03)
            grip = (hx, hy)
        else:  # the object hangs from the hand, on the outer side
            x1 = hx - 0.25 * w if side == 1 else hx - 0.75 * w
            box = (x1, hy - 0.3 * h, x1 + w, hy + 0.7 * h)
            grip = (hx, hy)
        if h < 6 or not self.fits(box):
            person.extra.pop("hand_rel", None)
            return False
        person.hand = (hx, hy)
        t = self.new_thing(name, box, "held", h / (cat.height * self.H), support=i, depth=person.depth + 0.0008)
        t.grip = grip
        self.things.append(t)
        return True

    def place_kite_held(self, name: str) -> bool:
        i = pick(self.rng, self.free_hands())
        person = self.things[i]
        hand = self._hand(person, "high")
        if not self.place_sky(name, tether=hand):
            person.extra.pop("hand_rel", None)
            return False
        person.hand = hand
        kite = self.things[-1]
        kite.support, kite.mode, kite.grip = i, "held", hand  # held by its string, which ends in the hand
        kite.extra["string_from"] = (kite.cx, kite.box[3] - 0.28 * kite.h)
        return True


def build_scene(seed: int, image_id: int, W: int, H: int) -> Scene:
    """The true scene of one image (keyed by seed and image id): regions, objects, masks, salience."""
    for attempt in range(20):
        rng = item_rng(seed, image_id, "scene", attempt)
        kind = pick(rng, list(SCENES), [v[0] for v in SCENES.values()])
        horizon, regions = background_things(kind, W, H, rng)
        n_target = pick(rng, range(2, 13), (8, 12, 14, 14, 13, 11, 9, 7, 5, 4, 3))
        placer = Placer(kind, W, H, horizon, regions, rng)
        names, weights = zip(*SCENES[kind][2].items())
        for _ in range(8 * n_target):
            if len(placer.things) >= n_target:
                break
            placer.place(pick(rng, names, weights))
        scene = Scene(image_id, kind, W, H, horizon, placer.things + regions)
        finish_scene(scene, rng)
        if len(scene.foreground()) >= 2:
            return scene
    raise RuntimeError(f"image {image_id}: could not build a scene with 2 or more objects")


def finish_scene(scene: Scene, rng) -> None:
    """Paint objects, drop the ones nearer objects hide, add clothes, compute salience and the image."""
    fg = scene.foreground()
    tiles = {id(t): paint_thing(t) for t in fg}
    for t in fg:
        t.mask = silhouette(tiles[id(t)], t, scene)
    while True:  # drop mostly hidden objects (and what rests on / is held by them), then recompute
        order = sorted(fg, key=lambda t: t.depth)
        cover = np.zeros((scene.height, scene.width), bool)
        for t in reversed(order):
            t.visible = t.mask & ~cover
            cover |= t.mask
        hidden = [t for t in fg if t.visible.sum() < max(20, 0.4 * t.mask.sum())]
        if not hidden:
            break
        drop = {id(hidden[0])}
        grew = True
        while grew:
            grew = False
            for t in fg:
                if id(t) not in drop and t.support is not None and id(scene.things[t.support]) in drop:
                    drop.add(id(t))
                    grew = True
        for t in fg:  # a hand that lost its object hangs down again
            if t.category in PEOPLE and t.hand is not None and not any(
                    u.support is not None and scene.things[u.support] is t and id(u) not in drop for u in fg):
                t.hand = None
                t.extra.pop("hand_rel", None)
                tiles[id(t)] = paint_thing(t)
                t.mask = silhouette(tiles[id(t)], t, scene)
        fg = [t for t in fg if id(t) not in drop]
        reindex(scene, keep=fg)
    regions = [t for t in scene.things if t.mode == "background"]
    clothes = []
    for i, t in enumerate(fg):
        if t.category in PEOPLE:
            x1, y1 = t.box[:2]
            fx1, fy1, fx2, fy2 = (0.24, 0.2, 0.76, 0.62) if t.category == "man" else (0.14, 0.2, 0.86, 0.78)
            box = (int(x1 + fx1 * t.w), int(y1 + fy1 * t.h), int(math.ceil(x1 + fx2 * t.w)), int(math.ceil(y1 + fy2 * t.h)))
            part = Thing(CLOTHES[t.category], box, colour=t.colour, texture=t.texture, mode="part", support=i,
                         depth=t.depth, rgb=t.rgb)
            body = np.zeros((scene.height, scene.width), bool)
            body[t.box[1]:t.box[3], t.box[0]:t.box[2]] = np.asarray(t.extra["body"]) > 127
            part.mask, part.visible = body & t.mask, body & t.visible
            clothes.append(part)
    scene.things = fg + clothes + regions
    scene.background = paint_background(scene, rng)
    image = Image.fromarray(scene.background).convert("RGBA")
    for t in sorted(fg, key=lambda t: t.depth):
        if t.category == "kite" and t.mode == "held":  # the string, from the kite to the hand
            ImageDraw.Draw(image).line([t.extra["string_from"], t.grip], fill=(60, 60, 60, 255), width=1)
        image.alpha_composite(tiles[id(t)], (t.box[0], t.box[1]))
    scene.image = image.convert("RGB")
    compute_salience(scene)


def reindex(scene: Scene, keep: list) -> None:
    """Keep only ``keep`` (plus the background) and renumber the support links."""
    regions = [t for t in scene.things if t.mode == "background"]
    position = {id(t): i for i, t in enumerate(keep)}
    for t in keep:
        if t.support is not None:
            t.support = position[id(scene.things[t.support])]
    scene.things = keep + regions


def silhouette(tile: Image.Image, t: Thing, scene: Scene) -> np.ndarray:
    mask = np.zeros((scene.height, scene.width), bool)
    mask[t.box[1]:t.box[3], t.box[0]:t.box[2]] = np.asarray(tile.split()[3]) > 127
    return mask


def compute_salience(scene: Scene) -> None:
    """Salience of each foreground object: visible area x centrality x contrast, people and animals first.

    Normalised to sum 1 over the image's foreground objects. Clothes share their wearer's salience.
    """
    W, H = scene.width, scene.height
    pixels = np.asarray(scene.image, np.float32)
    fg = scene.foreground()
    for t in fg:
        area = t.visible.sum()
        ys, xs = np.nonzero(t.visible)
        if area == 0:
            t.salience = 0.0
            continue
        a = min(1.0, (area / (W * H) / 0.12) ** 0.6)
        dist = math.hypot(xs.mean() - W / 2, ys.mean() - H / 2) / (math.hypot(W, H) / 2)
        centrality = 1.0 - min(1.0, dist)
        behind = scene.background[t.visible].astype(np.float32).mean(0)
        contrast = min(1.0, float(np.linalg.norm(pixels[t.visible].mean(0) - behind)) / 120.0)
        bonus = 1.5 if t.category in PEOPLE else 1.3 if t.category in ("dog", "cat") else 1.0
        t.salience = a * (0.4 + 0.6 * centrality) * (0.3 + 0.7 * contrast) * bonus
    total = sum(t.salience for t in fg) or 1.0
    for t in fg:
        t.salience /= total
    for t in scene.things:
        if t.mode == "part":
            t.salience = scene.things[t.support].salience
