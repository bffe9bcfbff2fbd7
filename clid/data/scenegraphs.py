"""Scene graphs: Visual Genome ``scene_graphs.json`` with ``image_data.json`` (sizes, VG-to-COCO ids),
and a scene-graph generator's predictions (the Scene Graph Benchmark's TSV). :func:`load_graph_files`
reads several files of either kind, each image from one source.

The Scene Graph Benchmark's TSV has one line per image: the image key, a tab, then a JSON object with
  "objects":   [{"rect": [x1, y1, x2, y2], "class", "conf", optional "attr"/"attributes"}, ...]
  "relations": [{"subj_id", "obj_id" (indices into "objects"), "class", "conf"}, ...]
Classes are names, or label indices resolved with the benchmark's labelmap JSON (label_to_idx,
predicate_to_idx, attribute_to_idx, or their idx_to_* inverses).
"""
from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

from clid.base.files import DataError, id_problem, read_json
from clid.base.text import preprocess
from clid.data.images import IMAGE_SUFFIXES, auto_key
from clid.data.records import (
    Relation,
    SceneGraph,
    SGObject,
    _first_time,
    _image_id,
    _list,
    _need,
    _number,
    _show,
    _string,
)


def load_image_data(path) -> dict[str, dict]:
    """VG ``image_data.json``: image id -> ``{"width", "height", "coco_id"}`` (coco_id may be None)."""
    data = read_json(path)
    if not isinstance(data, list):
        raise DataError(path, "top level", "expected a list of image records")
    out, seen = {}, {}
    for index, item in enumerate(data):
        where = f"[{index}]"
        # (VG 1.0 uses "id")
        key = "id" if isinstance(item, dict) and "image_id" not in item and "id" in item else "image_id"
        image_id = _image_id(item, key, path, where)
        _first_time(seen, image_id, path, where)
        where = f"[{index}] (image {image_id})"
        width, height = _number(item, "width", path, where), _number(item, "height", path, where)
        if not (math.isfinite(width) and math.isfinite(height) and width > 0 and height > 0):
            raise DataError(path, where, f"'width' and 'height' must be positive numbers, got {width:g} x {height:g}")
        coco_id = item.get("coco_id")
        if coco_id is not None and id_problem(coco_id):
            raise DataError(path, where, f"'coco_id' {id_problem(coco_id)}")
        out[image_id] = {"width": width, "height": height,
                         "coco_id": None if coco_id is None else str(coco_id)}
    return out


def vg_to_coco_ids(image_data: dict[str, dict]) -> dict[str, str]:
    """VG image id -> COCO image id, for the VG images that are also in COCO."""
    return {vg: info["coco_id"] for vg, info in image_data.items() if info["coco_id"] is not None}


def check_box(obj: SGObject, width: float | None, height: float | None, tolerance: float = 1.0) -> str | None:
    """Why a box is invalid (non-finite, empty, or outside the image by more than ``tolerance`` px), or None."""
    values = (obj.x, obj.y, obj.w, obj.h)
    if not all(math.isfinite(v) for v in values):
        return f"object {obj.object_id} has a non-finite box {values}"
    if obj.w <= 0 or obj.h <= 0:
        return f"object {obj.object_id} has an empty box (w={obj.w}, h={obj.h})"
    if width is not None and height is not None:
        if (obj.x < -tolerance or obj.y < -tolerance or obj.x + obj.w > width + tolerance
                or obj.y + obj.h > height + tolerance):
            return (f"object {obj.object_id} box (x={obj.x}, y={obj.y}, w={obj.w}, h={obj.h}) "
                    f"lies outside the {width:g}x{height:g} image")
    return None


def _parse_graph(item: dict, path, index: int, sizes: dict[str, dict]) -> SceneGraph:
    """One VG scene-graph record; raises DataError on malformed structure or bad references."""
    image_id = _image_id(item, "image_id", path, f"[{index}]")
    where = f"[{index}] (image {image_id})"
    objects, seen = [], set()
    for j, o in enumerate(_list(item, "objects", path, where)):
        at = f"{where} objects[{j}]"
        oid = _need(o, "object_id", path, at)
        if isinstance(oid, bool) or not isinstance(oid, int):
            raise DataError(path, at, f"'object_id' must be an integer, got {_show(oid)}")
        raw_box = [_need(o, k, path, at) for k in ("x", "y", "w", "h")]
        try:
            box = [float(v) for v in raw_box]
        except (TypeError, ValueError):
            raise DataError(path, at, "box coordinates must be numbers") from None
        names = o.get("names") or ([o["name"]] if o.get("name") else None)
        if not names or not isinstance(names, list):
            raise DataError(path, at, "missing key 'names' (a non-empty list)")
        attributes = o.get("attributes") or []
        if not isinstance(attributes, list):
            raise DataError(path, at, f"'attributes' must be a list, got {_show(attributes)}")
        for word in names + attributes:  # each becomes words of a caption: a null must not read "none"
            if not isinstance(word, str) or (word.strip() and not preprocess(word)):
                raise DataError(path, at, f"name or attribute {_show(word)} is not a word")
        if not preprocess(" ".join(names)):
            raise DataError(path, at, "'names' holds no word")
        if oid in seen:
            raise DataError(path, at, f"duplicate object_id {oid}")
        seen.add(oid)
        attributes = [a.strip().lower() for a in attributes if a.strip()]
        objects.append(SGObject(int(oid), *box, [n.strip().lower() for n in names if n.strip()], attributes))
    relations = []
    relationships = item.get("relationships") or []
    if not isinstance(relationships, list):
        raise DataError(path, where, f"'relationships' must be a list, got {_show(relationships)}")
    for j, r in enumerate(relationships):
        at = f"{where} relationships[{j}]"
        if not isinstance(r, dict):
            raise DataError(path, at, f"expected a JSON object, got {_show(r)}")
        subject_id = _need(r["subject"], "object_id", path, at) if isinstance(r.get("subject"), dict) \
            else _need(r, "subject_id", path, at)
        object_id = _need(r["object"], "object_id", path, at) if isinstance(r.get("object"), dict) \
            else _need(r, "object_id", path, at)
        predicate = _string(r, "predicate", path, at).strip().lower()
        for role, oid in (("subject", subject_id), ("object", object_id)):
            if oid not in seen:
                raise DataError(path, at, f"{role} {oid} names an object that does not exist in this graph")
        relations.append(Relation(int(subject_id), int(object_id), predicate))
    size = sizes.get(image_id, {})
    width = _number(item, "width", path, where) if "width" in item else size.get("width")
    height = _number(item, "height", path, where) if "height" in item else size.get("height")
    graph = SceneGraph(image_id, objects, relations,
                       None if width is None else float(width), None if height is None else float(height),
                       size.get("coco_id"))
    for obj in objects:
        problem = check_box(obj, graph.width, graph.height)
        if problem:
            raise DataError(path, where, problem)
    return graph


def load_scene_graphs(path, image_data=None, strict: bool = True):
    """VG ``scene_graphs.json`` (+ optional ``image_data.json`` path or dict for sizes and COCO ids).

    ``strict=True`` raises :class:`DataError` at the first malformed graph and returns the graphs.
    ``strict=False`` returns ``(graphs, problems)``, where ``problems`` lists ``(image_id, reason)``
    for every graph that was left out, so the caller can count and report them.
    """
    if isinstance(image_data, (str, Path)):
        image_data = load_image_data(image_data)
    sizes = image_data or {}
    data = read_json(path)
    if not isinstance(data, list):
        raise DataError(path, "top level", "expected a list of scene graphs")
    graphs, problems = [], []
    for index, item in enumerate(data):
        try:
            graphs.append(_parse_graph(item, path, index, sizes))
        except DataError as err:
            if strict:
                raise
            image_id = str(item.get("image_id", f"[{index}]")) if isinstance(item, dict) else f"[{index}]"
            problems.append((image_id, err.problem))
    return graphs if strict else (graphs, problems)


NO_LABEL = {"__background__", "__no_attribute__", "__no_relation__"}  # the labelmaps' index 0


def image_key_to_id(key: str) -> str:
    """A TSV image key as our image id, by the one rule of file names (:func:`clid.data.images.auto_key`): a
    COCO file name or a zero-padded number gives the COCO id ("COCO_val2014_000000391895.jpg",
    "000000391895" -> "391895"); another key only loses an image extension and its folder
    ("flickr/1000092795.jpg" -> "1000092795")."""
    return auto_key(key)


def load_labelmap(path) -> dict[str, dict[int, str]]:
    """The benchmark's labelmap JSON: ``{"object"|"predicate"|"attribute": {index: name}}``."""
    data = read_json(path)
    out = {}
    for kind, key in (("object", "label"), ("predicate", "predicate"), ("attribute", "attribute")):
        table = data.get(f"{key}_to_idx") if isinstance(data, dict) else None
        inverse = data.get(f"idx_to_{key}") if isinstance(data, dict) else None
        try:
            if isinstance(table, dict):
                out[kind] = {int(index): str(name) for name, index in table.items()}
            elif isinstance(inverse, dict):
                out[kind] = {int(index): str(name) for index, name in inverse.items()}
        except (TypeError, ValueError):
            raise DataError(path, f"'{key}_to_idx'", "label indices must be integers") from None
    if "object" not in out:
        raise DataError(path, "top level", "expected 'label_to_idx' or 'idx_to_label' (the Scene Graph Benchmark's "
                                           "labelmap JSON)")
    return out


def _label(value, kind: str, labelmap, path, where) -> str:
    """A class as a lower-case name: the name itself, or a label index looked up in the labelmap."""
    if isinstance(value, str) and value.strip():
        return value.strip().lower()
    if isinstance(value, int) and not isinstance(value, bool):
        if labelmap is None:
            raise DataError(path, where, f"{kind} class {value} is a label index: give --labelmap (the benchmark's "
                                         "labelmap JSON)")
        names = labelmap.get(kind, {})
        if value not in names:
            raise DataError(path, where, f"{kind} index {value} is not in the labelmap")
        return names[value].strip().lower()
    raise DataError(path, where, f"{kind} class must be a name or a label index, got {value!r}")


def _confidence(record: dict, path, where) -> float:
    value = record.get("conf", 1.0)  # ground-truth style records carry no confidence
    try:
        value = float(value)
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value):
        raise DataError(path, where, f"'conf' must be a number, got {record.get('conf')!r}")
    return value


def _parse_sgg(key: str, record, path, where: str, labelmap, min_object_conf: float, min_relation_conf: float,
               dropped: Counter) -> SceneGraph:
    """One image's predictions; objects keep their index in the line as ``object_id``."""
    objects = _need(record, "objects", path, where)
    if not isinstance(objects, list):
        raise DataError(path, where, "'objects' must be a list")
    kept: dict[int, SGObject] = {}
    for j, o in enumerate(objects):
        at = f"{where} objects[{j}]"
        rect = _need(o, "rect", path, at)
        try:
            x1, y1, x2, y2 = (float(v) for v in rect)
        except (TypeError, ValueError):
            raise DataError(path, at, f"'rect' must be four numbers [x1, y1, x2, y2], got {rect!r}") from None
        if not all(math.isfinite(v) for v in (x1, y1, x2, y2)):
            raise DataError(path, at, f"'rect' has a non-finite coordinate {rect!r}")
        name = _label(_need(o, "class", path, at), "object", labelmap, path, at)
        attributes = o.get("attr", o.get("attributes")) or []
        if not isinstance(attributes, list):
            raise DataError(path, at, "'attr' must be a list")
        attributes = [_label(a, "attribute", labelmap, path, at) for a in attributes]
        if _confidence(o, path, at) < min_object_conf:
            dropped["objects below --min-object-conf"] += 1
        elif name in NO_LABEL:
            dropped["background objects"] += 1
        elif x2 <= x1 or y2 <= y1:
            dropped["objects with an empty box"] += 1
        else:
            attributes = [a for a in dict.fromkeys(attributes) if a not in NO_LABEL]
            kept[j] = SGObject(j, x1, y1, x2 - x1, y2 - y1, [name], attributes)
    relations = []
    for j, r in enumerate(record.get("relations") or []):
        at = f"{where} relations[{j}]"
        ends = [_need(r, "subj_id", path, at), _need(r, "obj_id", path, at)]
        for role, index in zip(("subj_id", "obj_id"), ends):
            if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(objects):
                raise DataError(path, at, f"{role} {index!r} is not an index into the {len(objects)} objects")
        predicate = _label(_need(r, "class", path, at), "predicate", labelmap, path, at)
        if _confidence(r, path, at) < min_relation_conf:
            dropped["relations below --min-relation-conf"] += 1
        elif ends[0] not in kept or ends[1] not in kept:
            dropped["relations to a removed object"] += 1
        elif predicate in NO_LABEL:
            dropped["background relations"] += 1
        else:
            relations.append(Relation(ends[0], ends[1], predicate))
    return SceneGraph(image_key_to_id(key), list(kept.values()), relations, generated=True)


NOT_UTF8 = "\x00not UTF-8\x00"  # what :func:`tsv_lines` yields for a line that is not UTF-8 text


def tsv_lines(path):
    """``(line number, text)`` of a TSV file read as UTF-8 (a leading byte-order mark dropped); a line that
    is not UTF-8 text is yielded as NOT_UTF8, so the caller names it or leaves it out."""
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            try:
                yield number, raw.decode("utf-8")
            except UnicodeDecodeError:
                yield number, NOT_UTF8


def load_sgg(path, labelmap=None, min_object_conf: float = 0.2, min_relation_conf: float = 0.1, strict: bool = True):
    """A Scene Graph Benchmark predictions TSV: ``(graphs, problems, dropped)``.

    Objects below ``min_object_conf``, and relations below ``min_relation_conf`` or to a removed
    object, are left out and counted in ``dropped``. ``labelmap`` is a path or a
    :func:`load_labelmap` table. Image sizes are not in the file (see :func:`fill_sizes`).
    ``strict`` raises at the first malformed line; otherwise ``problems`` lists ``(image id, reason)``.
    """
    if isinstance(labelmap, (str, Path)):
        labelmap = load_labelmap(labelmap)
    graphs, problems, dropped, seen = [], [], Counter(), set()
    for number, line in tsv_lines(path):
        if not line.strip():
            continue
        key, _, text = line.rstrip("\r\n").partition("\t")
        where = f"line {number} (image {key})"
        try:
            if line is NOT_UTF8:
                raise DataError(path, f"line {number}", "not UTF-8 text")
            if not text:
                raise DataError(path, f"line {number}", "expected an image key, a tab, then a JSON object")
            try:
                record = json.loads(text)
            except json.JSONDecodeError as err:
                raise DataError(path, where, f"not valid JSON ({err.msg})") from None
            left_out = Counter()
            graph = _parse_sgg(key, record, path, where, labelmap, min_object_conf, min_relation_conf, left_out)
            if graph.image_id in seen:
                raise DataError(path, where, f"image {graph.image_id} is listed twice")
        except DataError as err:
            if strict:
                raise
            problems.append((image_key_to_id(key) if key.strip() and line is not NOT_UTF8 else f"line {number}",
                             err.problem))
            continue
        dropped.update(left_out)
        seen.add(graph.image_id)
        graph.source = str(path)
        graphs.append(graph)
    return graphs, problems, dropped


def load_sizes(path) -> dict[str, tuple[float, float]]:
    """Image id -> (width, height) from the benchmark's hw TSV (key, a tab, ``[{"height", "width"}]``)
    or from VG's ``image_data.json`` (keyed by VG image id)."""
    with open(path, encoding="utf-8-sig", errors="replace") as f:  # (only sniffed here)
        head = f.read(4096).lstrip()[:1]
    if head == "[":
        return {i: (info["width"], info["height"]) for i, info in load_image_data(path).items()}
    out = {}
    for number, line in tsv_lines(path):
        if line is NOT_UTF8:
            raise DataError(path, f"line {number}", "not UTF-8 text")
        if not line.strip():
            continue
        key, _, text = line.rstrip("\r\n").partition("\t")
        try:
            value = json.loads(text)
            value = value[0] if isinstance(value, list) else value
            width, height = float(value["width"]), float(value["height"])
        except (json.JSONDecodeError, TypeError, KeyError, IndexError, ValueError):
            raise DataError(path, f"line {number} (image {key})",
                            'expected an image key, a tab, then [{"height": H, "width": W}]') from None
        if not (math.isfinite(width) and math.isfinite(height) and width > 0 and height > 0):
            raise DataError(path, f"line {number} (image {key})", f"the size must be positive, got {width:g} x {height:g}")
        if image_key_to_id(key) in out:
            raise DataError(path, f"line {number} (image {key})", f"image {image_key_to_id(key)} is listed twice")
        out[image_key_to_id(key)] = (width, height)
    return out


def fill_sizes(graphs: list[SceneGraph], sizes: dict | None = None, images=None) -> Counter:
    """Set each graph's image size: from ``sizes`` (:func:`load_sizes`), else from the image file in
    the folder ``images`` (matched by :func:`image_key_to_id` of its name), else the extent of its
    boxes. Returns how many sizes came from each source."""
    from PIL import Image

    files = {}
    if images:
        files = {image_key_to_id(p.name): p for p in sorted(Path(images).rglob("*"))
                 if p.suffix.lower() in IMAGE_SUFFIXES}
    used = Counter()
    for g in graphs:
        if sizes and g.image_id in sizes:
            (g.width, g.height), source = sizes[g.image_id], "the sizes file"
        elif g.image_id in files:
            with Image.open(files[g.image_id]) as image:  # reads the header only
                (g.width, g.height), source = image.size, "the images"
        elif g.objects:
            g.width = max(o.x + o.w for o in g.objects)
            g.height = max(o.y + o.h for o in g.objects)
            source = "the boxes' extent"
        else:
            source = "none (no objects)"
        used[source] += 1
    return used


def detect_graph_format(path) -> str:
    """"vg" (a JSON list of graphs) or "sgg" (a TSV: image key, a tab, a JSON object)."""
    with open(path, encoding="utf-8-sig", errors="replace") as f:  # (a binary file is an unknown format, not a traceback)
        head = f.read(65536).lstrip()
    if head.startswith("["):
        return "vg"
    if "\t" in head.split("\n", 1)[0]:
        return "sgg"
    raise DataError(path, None, "unknown scene-graph format (expected Visual Genome scene_graphs.json or a Scene Graph "
                                "Benchmark predictions TSV); give --graph-format")


def load_graph_files(paths, graph_format: str = "auto", image_data=None, sizes=None, images=None, labelmap=None,
                     min_object_conf: float = 0.2, min_relation_conf: float = 0.1):
    """The graphs of several files, Visual Genome files first: ``(graphs, problems, notes)``.

    VG files read their sizes and COCO ids from ``image_data``; generated graphs get theirs from
    :func:`fill_sizes` and are checked against them. VG files come first so that a caller taking
    each image from the first graph that has it takes VG's graph for a COCO image that is in VG.
    ``problems`` lists ``(image id, reason)`` of graphs left out; ``notes`` are lines to print.
    """
    kinds = [detect_graph_format(p) if graph_format == "auto" else graph_format for p in paths]
    size_table = load_sizes(sizes) if sizes else None
    label_table = load_labelmap(labelmap) if labelmap else None
    graphs, problems, notes = [], [], []
    for path, kind in sorted(zip(paths, kinds), key=lambda pk: pk[1] != "vg"):
        if kind == "vg":
            found, bad = load_scene_graphs(path, image_data, strict=False)
            for g in found:
                g.source = str(path)
            notes.append(f"{path}: Visual Genome scene graphs, {len(found)} read")
        else:
            found, bad, dropped = load_sgg(path, label_table, min_object_conf, min_relation_conf, strict=False)
            used = fill_sizes(found, size_table, images)
            named = {"the sizes file": f"the sizes file {sizes}", "the images": f"the images in {images}"}
            notes.append(f"{path}: generated scene graphs, {len(found)} read (objects conf >= {min_object_conf}, "
                         f"relations conf >= {min_relation_conf}); image sizes from "
                         + ", ".join(f"{named.get(k, k)} ({n})" for k, n in used.most_common()))
            if dropped:
                notes.append("  left out: " + ", ".join(f"{n} {reason}" for reason, n in sorted(dropped.items())))
            checked = []
            for g in found:
                problem = next((p for p in (check_box(o, g.width, g.height) for o in g.objects) if p), None)
                if problem:
                    bad.append((g.image_id, problem))
                else:
                    checked.append(g)
            found = checked
        if bad and not found:
            name = "Visual Genome JSON" if kind == "vg" else "a Scene Graph Benchmark TSV"
            raise DataError(path, None, f"no graph could be read as {name} (first problem: {bad[0][1]}); "
                                        "check --graph-format")
        graphs += found
        problems += bad
    return graphs, problems, notes
