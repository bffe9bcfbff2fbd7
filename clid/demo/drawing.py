"""Drawing the demo world. Each category is a few primitives in box-relative coordinates (0..1).
Primitives marked `body` form the object's main-coloured part, which gets the pattern or material texture.
"""
from __future__ import annotations

import math

import numpy as np
from PIL import Image, ImageDraw, ImageOps

from clid.demo.world import PEOPLE, Scene, Thing

SUPERSAMPLE = 2  # objects are drawn at 2x and box-filtered down (anti-aliasing)


def shade(rgb, factor: float) -> tuple:
    return tuple(int(max(0, min(255, c * factor))) for c in rgb)


def luminance(rgb) -> float:
    return 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2]


class Pen:
    """Draws box-relative primitives on a supersampled RGBA tile and tracks the body mask."""

    def __init__(self, w: int, h: int):
        self.W, self.H = max(1, w * SUPERSAMPLE), max(1, h * SUPERSAMPLE)
        self.img = Image.new("RGBA", (self.W, self.H), (0, 0, 0, 0))
        self.body = Image.new("L", (self.W, self.H), 0)
        self._img, self._body = ImageDraw.Draw(self.img), ImageDraw.Draw(self.body)

    def _xy(self, points):
        return [(x * (self.W - 1), y * (self.H - 1)) for x, y in points]

    def _paint(self, method: str, geometry, fill, body: bool, **kw):
        fill = tuple(fill) + (255,) if len(fill) == 3 else tuple(fill)
        getattr(self._img, method)(geometry, fill=fill, **kw)
        getattr(self._body, method)(geometry, fill=255 if body else 0, **kw)

    def rect(self, x1, y1, x2, y2, fill, body=False, radius=0.0):
        box = self._xy([(x1, y1), (x2, y2)])
        if radius:
            r = radius * min(self.W, self.H)
            self._paint("rounded_rectangle", box, fill, body, radius=r)
        else:
            self._paint("rectangle", box, fill, body)

    def ellipse(self, x1, y1, x2, y2, fill, body=False):
        self._paint("ellipse", self._xy([(x1, y1), (x2, y2)]), fill, body)

    def polygon(self, points, fill, body=False):
        self._paint("polygon", self._xy(points), fill, body)

    def line(self, points, fill, width: float, body=False):
        """``width`` as a share of the tile width."""
        self._paint("line", self._xy(points), fill, body, width=max(1, round(width * self.W)))

    def circle_outline(self, x1, y1, x2, y2, fill, width: float):
        box = self._xy([(x1, y1), (x2, y2)])
        fill = tuple(fill) + (255,)
        self._img.ellipse(box, outline=fill, width=max(1, round(width * self.H)))
        self._body.ellipse(box, outline=0, width=max(1, round(width * self.H)))

    def pieslice(self, x1, y1, x2, y2, start, end, fill, body=False):
        self._paint("pieslice", self._xy([(x1, y1), (x2, y2)]), fill, body, start=start, end=end)


def draw_person(p: Pen, t: Thing, c):
    skin, hair, pants = t.extra["skin"], t.extra["hair"], t.extra["pants"]
    side = t.extra.get("hand_side", 1)
    hx, hy = t.extra.get("hand_rel", (0.06, 0.52))  # the holding hand (box-relative)
    rest = {1: (0.94, 0.52), -1: (0.06, 0.52)}
    if t.category == "man":
        p.rect(0.30, 0.58, 0.48, 0.97, pants)
        p.rect(0.52, 0.58, 0.70, 0.97, pants)
        p.rect(0.26, 0.95, 0.48, 1.0, (40, 30, 25))
        p.rect(0.52, 0.95, 0.74, 1.0, (40, 30, 25))
        p.rect(0.24, 0.2, 0.76, 0.62, c, body=True, radius=0.06)
    else:
        p.ellipse(0.28, 0.0, 0.72, 0.3, hair)  # long hair behind the head
        p.rect(0.38, 0.76, 0.46, 0.97, skin)
        p.rect(0.54, 0.76, 0.62, 0.97, skin)
        p.rect(0.34, 0.95, 0.48, 1.0, (40, 30, 25))
        p.rect(0.52, 0.95, 0.66, 1.0, (40, 30, 25))
        p.polygon([(0.30, 0.2), (0.70, 0.2), (0.86, 0.78), (0.14, 0.78)], c, body=True)
    for s in (-1, 1):  # arms: sleeve then hand
        shoulder = (0.5 + s * 0.22, 0.25)
        hand = (hx, hy) if (s == side and t.hand is not None) else rest[s]
        elbow = ((shoulder[0] + hand[0]) / 2, (shoulder[1] + hand[1]) / 2)
        p.line([shoulder, elbow], c, 0.13, body=True)
        p.line([elbow, hand], skin, 0.10)
        p.ellipse(hand[0] - 0.07, hand[1] - 0.03, hand[0] + 0.07, hand[1] + 0.03, skin)
    p.rect(0.44, 0.16, 0.56, 0.22, skin)
    p.ellipse(0.33, 0.0, 0.67, 0.19, skin)
    p.ellipse(0.32, -0.01, 0.68, 0.08, hair)


def draw_dog(p, t, c):
    dark = shade(c, 0.7)
    p.line([(0.2, 0.45), (0.04, 0.18)], c, 0.05, body=True)
    for x in (0.22, 0.34, 0.62, 0.74):
        p.rect(x, 0.55, x + 0.08, 1.0, c, body=True)
    p.ellipse(0.14, 0.3, 0.84, 0.72, c, body=True)
    p.ellipse(0.64, 0.04, 1.0, 0.48, c, body=True)
    p.polygon([(0.70, 0.1), (0.78, 0.0), (0.80, 0.36)], dark)
    p.ellipse(0.94, 0.2, 1.0, 0.3, (20, 20, 20))
    p.ellipse(0.83, 0.14, 0.87, 0.21, (20, 20, 20))


def draw_cat(p, t, c):
    p.line([(0.75, 0.95), (0.95, 0.75), (0.97, 0.45)], c, 0.07, body=True)
    p.ellipse(0.15, 0.4, 0.85, 1.0, c, body=True)
    p.polygon([(0.2, 0.22), (0.27, 0.0), (0.45, 0.12)], c, body=True)
    p.polygon([(0.8, 0.22), (0.73, 0.0), (0.55, 0.12)], c, body=True)
    p.ellipse(0.2, 0.06, 0.8, 0.5, c, body=True)
    eye = (120, 200, 80)
    p.ellipse(0.33, 0.22, 0.43, 0.3, eye)
    p.ellipse(0.57, 0.22, 0.67, 0.3, eye)
    p.polygon([(0.46, 0.34), (0.54, 0.34), (0.5, 0.39)], (230, 130, 150))


def draw_bird(p, t, c):
    if t.mode == "sky":  # flying: spread wings
        p.polygon([(0.0, 0.1), (0.35, 0.5), (0.5, 0.42), (0.65, 0.5), (1.0, 0.1), (0.62, 0.78), (0.38, 0.78)],
                  c, body=True)
        p.ellipse(0.38, 0.4, 0.62, 0.92, c, body=True)
        p.ellipse(0.43, 0.28, 0.57, 0.5, shade(c, 0.8))
        return
    p.polygon([(0.0, 0.35), (0.32, 0.5), (0.05, 0.72)], shade(c, 0.8))
    p.line([(0.45, 0.82), (0.45, 1.0)], (60, 50, 40), 0.04)
    p.line([(0.55, 0.82), (0.55, 1.0)], (60, 50, 40), 0.04)
    p.ellipse(0.15, 0.3, 0.8, 0.86, c, body=True)
    p.ellipse(0.55, 0.04, 0.9, 0.46, c, body=True)
    p.polygon([(0.87, 0.18), (1.0, 0.27), (0.87, 0.34)], (240, 150, 30))
    p.ellipse(0.7, 0.14, 0.77, 0.22, (10, 10, 10))


def draw_ball(p, t, c):
    p.ellipse(0.0, 0.0, 1.0, 1.0, shade(c, 0.75))
    p.ellipse(0.03, 0.03, 0.97, 0.97, c, body=True)
    p.ellipse(0.22, 0.16, 0.42, 0.34, shade(c, 1.35))


def draw_box(p, t, c):
    p.polygon([(0.0, 0.22), (0.22, 0.0), (1.0, 0.0), (0.78, 0.22)], shade(c, 1.25))
    p.polygon([(0.78, 0.22), (1.0, 0.0), (1.0, 0.78), (0.78, 1.0)], shade(c, 0.7))
    p.rect(0.0, 0.22, 0.78, 1.0, c, body=True)


def draw_tree(p, t, c):
    p.rect(0.42, 0.55, 0.58, 1.0, (105, 70, 40))
    if t.extra.get("variant", 0) < 0.35:  # a fir
        for y0, half in ((0.0, 0.28), (0.18, 0.38), (0.36, 0.5)):
            p.polygon([(0.5, y0), (0.5 + half, y0 + 0.38), (0.5 - half, y0 + 0.38)], c, body=True)
        return
    for box in ((0.02, 0.24, 0.56, 0.72), (0.44, 0.24, 0.98, 0.72), (0.14, 0.0, 0.86, 0.52)):
        p.ellipse(*box, c, body=True)
    p.ellipse(0.55, 0.12, 0.75, 0.3, shade(c, 1.2))


def draw_car(p, t, c):
    p.polygon([(0.18, 0.42), (0.3, 0.05), (0.7, 0.05), (0.84, 0.42)], c, body=True)
    p.rect(0.0, 0.38, 1.0, 0.82, c, body=True, radius=0.2)
    glass = (175, 210, 235)
    p.polygon([(0.27, 0.38), (0.35, 0.12), (0.48, 0.12), (0.48, 0.38)], glass)
    p.polygon([(0.52, 0.38), (0.52, 0.12), (0.66, 0.12), (0.76, 0.38)], glass)
    p.ellipse(0.93, 0.48, 1.0, 0.6, (250, 230, 120))
    for x in (0.1, 0.68):
        p.ellipse(x, 0.6, x + 0.22, 1.0, (25, 25, 25))
        p.ellipse(x + 0.06, 0.72, x + 0.16, 0.88, (160, 160, 165))


def draw_house(p, t, c):
    roof = t.extra["roof"]
    p.rect(0.7, 0.08, 0.8, 0.3, roof)
    p.rect(0.08, 0.42, 0.92, 1.0, c, body=True)
    p.polygon([(0.0, 0.46), (0.5, 0.0), (1.0, 0.46)], roof)
    p.rect(0.42, 0.66, 0.58, 1.0, (90, 55, 30))
    window = (250, 235, 150) if t.extra.get("variant", 0) < 0.4 else (175, 210, 235)
    for x in (0.16, 0.66):
        p.rect(x - 0.02, 0.53, x + 0.2, 0.77, (240, 240, 240))
        p.rect(x, 0.55, x + 0.18, 0.75, window)


def draw_cup(p, t, c):
    p.circle_outline(0.55, 0.22, 1.0, 0.72, c, 0.12)
    p.polygon([(0.02, 0.06), (0.74, 0.06), (0.66, 1.0), (0.1, 1.0)], c, body=True)
    p.ellipse(0.02, 0.0, 0.74, 0.14, shade(c, 0.55))


def draw_table(p, t, c):
    p.rect(0.05, 0.1, 0.15, 1.0, c, body=True)
    p.rect(0.85, 0.1, 0.95, 1.0, c, body=True)
    p.rect(0.0, 0.0, 1.0, 0.15, c, body=True)


def draw_lamp(p, t, c):
    grey = (70, 70, 75)
    p.rect(0.45, 0.34, 0.55, 0.93, grey)
    p.ellipse(0.2, 0.88, 0.8, 1.0, grey)
    p.ellipse(0.3, 0.3, 0.7, 0.42, (255, 240, 170))
    p.polygon([(0.22, 0.0), (0.78, 0.0), (1.0, 0.36), (0.0, 0.36)], c, body=True)


def draw_flower(p, t, c):
    green = (50, 130, 50)
    p.line([(0.5, 0.35), (0.5, 1.0)], green, 0.1)
    p.ellipse(0.5, 0.58, 0.9, 0.7, green)
    p.ellipse(0.1, 0.7, 0.5, 0.82, green)
    for k in range(6):
        a = k * math.pi / 3
        x, y = 0.5 + 0.3 * math.cos(a), 0.22 + 0.13 * math.sin(a)
        p.ellipse(x - 0.2, y - 0.09, x + 0.2, y + 0.09, c, body=True)
    centre = (120, 70, 30) if t.colour in ("yellow", "orange") else (245, 205, 40)
    p.ellipse(0.36, 0.16, 0.64, 0.28, centre)


def draw_kite(p, t, c):
    dark = (50, 50, 50)
    p.line([(0.5, 0.72), (0.42, 0.82), (0.56, 0.9), (0.48, 1.0)], dark, 0.03)
    for y in (0.8, 0.92):
        p.polygon([(0.42, y - 0.04), (0.58, y + 0.04), (0.58, y - 0.04), (0.42, y + 0.04)], shade(c, 0.7))
    p.polygon([(0.5, 0.0), (1.0, 0.3), (0.5, 0.72), (0.0, 0.3)], c, body=True)
    p.line([(0.5, 0.0), (0.5, 0.72)], dark, 0.025)
    p.line([(0.0, 0.3), (1.0, 0.3)], dark, 0.025)


def draw_boat(p, t, c):
    p.line([(0.5, 0.0), (0.5, 0.62)], (90, 60, 35), 0.04)
    p.polygon([(0.54, 0.03), (0.54, 0.58), (0.92, 0.58)], (248, 248, 245))
    p.polygon([(0.46, 0.12), (0.46, 0.58), (0.18, 0.58)], (235, 235, 230))
    p.polygon([(0.0, 0.6), (1.0, 0.6), (0.84, 1.0), (0.16, 1.0)], c, body=True)


def draw_chair(p, t, c):
    p.rect(0.08, 0.0, 0.22, 1.0, c, body=True)
    p.rect(0.08, 0.45, 0.92, 0.58, c, body=True)
    p.rect(0.8, 0.58, 0.92, 1.0, c, body=True)


def draw_umbrella(p, t, c):
    dark = (50, 50, 55)
    p.line([(0.5, 0.3), (0.5, 0.95)], dark, 0.04)
    p.line([(0.5, 0.95), (0.56, 1.0), (0.6, 0.94)], dark, 0.04)
    p.pieslice(0.0, 0.0, 1.0, 0.9, 180, 360, c, body=True)
    for x in (0.25, 0.75):
        p.line([(0.5, 0.02), (x, 0.45)], shade(c, 0.7), 0.015)


def draw_bench(p, t, c):
    dark = (60, 55, 50)
    for x in (0.08, 0.86):
        p.rect(x, 0.0, x + 0.06, 1.0, dark)
    p.rect(0.0, 0.0, 1.0, 0.12, c, body=True)
    p.rect(0.0, 0.18, 1.0, 0.3, c, body=True)
    p.rect(0.0, 0.4, 1.0, 0.54, c, body=True)


def draw_bottle(p, t, c):
    p.rect(0.12, 0.38, 0.88, 1.0, c, body=True, radius=0.12)
    p.polygon([(0.12, 0.44), (0.35, 0.2), (0.65, 0.2), (0.88, 0.44)], c, body=True)
    p.rect(0.36, 0.05, 0.64, 0.26, c, body=True)
    p.rect(0.33, 0.0, 0.67, 0.08, (40, 40, 40))
    p.rect(0.12, 0.56, 0.88, 0.8, (245, 240, 225))


def draw_book(p, t, c):
    p.rect(0.0, 0.0, 0.97, 0.3, c, body=True)
    p.rect(0.03, 0.28, 0.97, 0.74, (245, 240, 225))
    p.line([(0.1, 0.51), (0.95, 0.51)], (200, 195, 180), 0.01)
    p.rect(0.0, 0.72, 1.0, 1.0, c, body=True)
    p.rect(0.0, 0.0, 0.07, 1.0, shade(c, 0.8))


def draw_bicycle(p, t, c):
    black = (25, 25, 25)
    p.circle_outline(0.0, 0.36, 0.42, 1.0, black, 0.07)
    p.circle_outline(0.58, 0.36, 1.0, 1.0, black, 0.07)
    rear, crank, seat, head, front = (0.21, 0.68), (0.48, 0.68), (0.38, 0.28), (0.72, 0.28), (0.79, 0.68)
    for a, b in ((rear, crank), (crank, seat), (seat, rear), (seat, head), (head, crank), (head, front)):
        p.line([a, b], c, 0.045, body=True)
    p.rect(0.29, 0.18, 0.46, 0.25, black)
    p.line([(0.72, 0.28), (0.78, 0.1), (0.86, 0.1)], black, 0.04)


DRAW = {"man": draw_person, "woman": draw_person, "dog": draw_dog, "cat": draw_cat, "bird": draw_bird,
        "ball": draw_ball, "box": draw_box, "tree": draw_tree, "car": draw_car, "house": draw_house,
        "cup": draw_cup, "table": draw_table, "lamp": draw_lamp, "flower": draw_flower, "kite": draw_kite,
        "boat": draw_boat, "chair": draw_chair, "umbrella": draw_umbrella, "bench": draw_bench,
        "bottle": draw_bottle, "book": draw_book, "bicycle": draw_bicycle}


def texture_layer(size, texture: str, rgb, period: float) -> Image.Image:
    """The body texture as an RGBA layer: stripes, spots, checks, wood grain or a metal sheen."""
    W, H = size
    layer = Image.new("RGBA", size, (0, 0, 0, 0))
    d = ImageDraw.Draw(layer)
    other = (35, 35, 35, 255) if luminance(rgb) > 150 else (245, 245, 240, 255)
    p = max(4.0, period)
    if texture == "striped":
        y = p / 4
        while y < H:
            d.rectangle([0, y, W, y + p / 2 - 1], fill=other)
            y += p
    elif texture == "spotted":
        r, row = p / 3.2, 0
        y = p / 2
        while y < H + r:
            x = p / 2 + (p / 2 if row % 2 else 0)
            while x < W + r:
                d.ellipse([x - r, y - r, x + r, y + r], fill=other)
                x += p
            y += p * 0.9
            row += 1
    elif texture == "checkered":
        s = p / 2
        for i in range(int(H / s) + 1):
            for j in range(int(W / s) + 1):
                if (i + j) % 2 == 0:
                    d.rectangle([j * s, i * s, (j + 1) * s - 1, (i + 1) * s - 1], fill=other)
    elif texture == "wooden":
        grain = shade(rgb, 0.62) + (255,)
        y = p / 3
        while y < H:
            pts = [(x, y + 0.12 * p * math.sin(x / p * 2.1 + y)) for x in np.linspace(0, W, 12)]
            d.line(pts, fill=grain, width=max(1, int(p / 7)))
            y += p / 2.4
    elif texture == "metal":  # a bright diagonal sheen and a darker lower part
        d.polygon([(0.15 * W, 0), (0.4 * W, 0), (0.25 * W, H), (0.0, H)], fill=shade(rgb, 1.45) + (180,))
        d.rectangle([0, 0.75 * H, W, H], fill=shade(rgb, 0.7) + (120,))
    return layer


def paint_thing(t: Thing) -> Image.Image:
    """The object drawn on its own RGBA tile of the box's size (anti-aliased)."""
    pen = Pen(t.w, t.h)
    DRAW[t.category](pen, t, t.rgb)
    if t.flip:
        pen.img, pen.body = ImageOps.mirror(pen.img), ImageOps.mirror(pen.body)
    if t.texture:
        period = max(pen.W, pen.H) / (5.0 if t.texture != "checkered" else 4.0)
        if t.category in PEOPLE:
            period = pen.W / 3.2
        layer = texture_layer(pen.img.size, t.texture, t.rgb, period)
        alpha = Image.fromarray((np.asarray(layer.split()[3], np.uint16) * np.asarray(pen.body, np.uint16)
                                 // 255).astype(np.uint8))
        layer.putalpha(alpha)
        pen.img = Image.alpha_composite(pen.img, layer)
    tile = pen.img.resize((t.w, t.h), Image.Resampling.BOX)
    t.extra["body"] = pen.body.resize((t.w, t.h), Image.Resampling.BOX)
    return tile


def paint_background(scene: Scene, rng) -> np.ndarray:
    """Sky and ground (outdoors) or wall and floor (rooms), with a little texture."""
    W, H, hz = scene.width, scene.height, scene.horizon
    img = Image.new("RGB", (W, H))
    d = ImageDraw.Draw(img)
    regions = {t.category: t for t in scene.things if t.mode == "background"}
    if "sky" in regions:
        top = np.array(shade(regions["sky"].rgb, 0.85), float)
        low = np.array(shade(regions["sky"].rgb, 1.15), float)
        for y in range(hz):
            d.line([(0, y), (W, y)], fill=tuple(int(v) for v in top + (low - top) * y / max(1, hz)))
    else:
        d.rectangle([0, 0, W, hz], fill=regions["wall"].rgb)
        d.rectangle([0, hz - 3, W, hz], fill=shade(regions["wall"].rgb, 0.8))
    for name in ("water", "grass", "sand", "road", "snow", "floor"):
        if name in regions:
            x1, y1, x2, y2 = regions[name].box
            d.rectangle([x1, y1, x2, y2], fill=regions[name].rgb)
    ground = regions.get("grass") or regions.get("sand") or regions.get("road") or regions.get("snow") \
        or regions.get("floor")
    gx1, gy1, gx2, gy2 = ground.box
    if ground.category == "grass":
        for _ in range(60):
            x, y = rng.uniform(0, W), rng.uniform(gy1 + 2, H)
            d.line([(x, y), (x + rng.uniform(-1.5, 1.5), y - 3)], fill=shade(ground.rgb, 0.75))
    elif ground.category == "road":
        for x in range(4, W, 24):
            d.rectangle([x, (gy1 + H) // 2, x + 12, (gy1 + H) // 2 + 2], fill=(235, 235, 235))
    elif ground.category == "floor":
        if ground.texture == "wooden":
            for y in range(gy1 + 8, H, 9):
                d.line([(0, y), (W, y)], fill=shade(ground.rgb, 0.8))
    if "water" in regions:
        x1, y1, x2, y2 = regions["water"].box
        for _ in range(25):
            x, y = rng.uniform(0, W), rng.uniform(y1 + 2, y2 - 1)
            d.line([(x, y), (x + 6, y)], fill=shade(regions["water"].rgb, 1.3))
    pixels = np.asarray(img, np.int16) + rng.integers(-6, 7, size=(H, W, 1))  # sensor-like grain
    return np.clip(pixels, 0, 255).astype(np.uint8)
