"""The vocabulary of the demo world (colours, categories, scene kinds) and its scene records."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from PIL import Image

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
BACKGROUND_NAMES = ("sky", "grass", "sand", "water", "road", "snow", "floor", "wall")


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
