"""Visual Genome scene graphs of the demo world: the truth, and what a scene-graph generator would output."""
from __future__ import annotations

import json

import numpy as np

from clid.base.rng import item_rng
from clid.demo.relations import attributes_of, true_relations
from clid.demo.scenes import pick
from clid.demo.world import ALL_COLOURS, CATEGORIES, MATERIALS, PATTERNS, SCENES, Scene, Thing

VG_ID_OFFSET = 1_000_000  # Visual Genome image id = offset + caption (COCO) id


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


HALLUCINATIONS = ("typical", "atypical")  # 00 --hallucinations: how corrupt_graph draws an object that is not there


def scene_graphs(scene: Scene, seed: int, noise: float, hallucinations: str = "typical") -> tuple[dict, dict]:
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
    noisy = corrupt_graph(clean, scene, item_rng(seed, scene.image_id, "noise"), noise, ids[len(scene.things):],
                          hallucinations)
    return clean, noisy


def wrong_attribute(value: str, rng) -> str:
    for family in (("small", "large"), ("tall", "small"), PATTERNS + MATERIALS, ALL_COLOURS):
        if value in family:
            return pick(rng, [v for v in family if v != value])
    return pick(rng, [c for c in ALL_COLOURS if c != value])


def corrupt_graph(graph: dict, scene: Scene, rng, noise: float, free_ids: list[int],
                  hallucinations: str = "typical") -> dict:
    """A scene-graph generator's typical errors, each at a rate scaled by ``noise``:
    attributes dropped (40%) or replaced (60%); a spurious attribute added; objects mislabelled as a
    confusable category; boxes jittered; predicates dropped (40%) or replaced (60%); hallucinated
    objects (valid box, attributes, one or two relations).

    ``hallucinations``: typical (a generator's: a category of the scene's own prior, in a colour its category
    has), or atypical (a category the scene kind never holds, drawn uniformly, in any colour: a second noise
    model, which a scene prior cannot make plausible). Everything else is drawn alike.

    The rate varies from image to image, as a generator's errors do with scene difficulty: it is
    ``noise`` times an exponential draw (mean 1), so many graphs are nearly right and a few are poor.
    """
    if hallucinations not in HALLUCINATIONS:
        raise ValueError(f"hallucinations must be one of {HALLUCINATIONS}, not {hallucinations!r}")
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
    if hallucinations == "atypical":  # the categories this scene kind never holds, each as likely
        names = tuple(c for c in CATEGORIES if c not in names) or tuple(CATEGORIES)
        weights = (1.0,) * len(names)
    for k in range(min(n_fake, len(free_ids))):
        name = pick(rng, names, weights)
        cat = CATEGORIES[name]
        h = float(np.clip(cat.height * H * rng.uniform(0.5, 1.3), 6, 0.8 * H))
        w = float(min(h * cat.aspect, 0.9 * W))
        x1, y1 = rng.uniform(0, W - w), rng.uniform(0, H - h)
        colours = cat.colours if hallucinations == "typical" else ALL_COLOURS
        attributes = [pick(rng, colours)] + ([pick(rng, cat.textures)] if cat.textures and rng.random() < 0.3 else [])
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
