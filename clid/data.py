"""Loaders for the caption and scene-graph datasets, all returning the same record types.

Captions:
- Karpathy JSON (``dataset_coco.json``, ``dataset_flickr30k.json``, and the files 00 writes);
- the official COCO captions JSON plus split lists (the Karpathy 5k test ids ship in ``eccv-caption``);
- the Stanford image-paragraph file (``paragraphs_v1.json`` plus its split id lists);
- our own JSONL (self-generated, paraphrased, generated captions).
Scene graphs: Visual Genome ``scene_graphs.json`` with ``image_data.json`` (sizes, VG-to-COCO ids).

Image ids are strings in memory (the dataset's own id: COCO id, VG id, or a file-name stem).
Malformed input raises :class:`clid.files.DataError` naming the file, the record and the problem.
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from .files import DataError, natural_key, read_json, read_jsonl
from .text import preprocess

# ---------------------------------------------------------------------------------------------
# Record types


@dataclass
class ImageCaptions:
    """The reference captions of one image."""

    image_id: str
    filename: str  # file name inside the image folder (may include a sub-folder)
    split: str  # train / val / test (Karpathy's "restval" is kept as written)
    captions: list[str]  # Karpathy-preprocessed text, without the final "."
    raw: list[str] = field(default_factory=list)  # the captions as written


@dataclass
class SGObject:
    object_id: int
    x: float
    y: float
    w: float
    h: float
    names: list[str]
    attributes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.names[0]

    @property
    def box(self) -> tuple[float, float, float, float]:
        """x1, y1, x2, y2 in pixels."""
        return self.x, self.y, self.x + self.w, self.y + self.h


@dataclass
class Relation:
    subject_id: int
    object_id: int
    predicate: str


@dataclass
class SceneGraph:
    image_id: str
    objects: list[SGObject]
    relations: list[Relation]
    width: float | None = None
    height: float | None = None
    coco_id: str | None = None

    def object_map(self) -> dict[int, SGObject]:
        return {o.object_id: o for o in self.objects}


def _need(record: dict, key: str, path, where: str):
    if not isinstance(record, dict):
        raise DataError(path, where, f"expected a JSON object, got {type(record).__name__}")
    if key not in record:
        raise DataError(path, where, f"missing key '{key}'")
    return record[key]


# ---------------------------------------------------------------------------------------------
# Captions


def load_karpathy(path, data=None) -> list[ImageCaptions]:
    """Karpathy JSON: ``{"images": [{"cocoid"|"image_id", "filename", "split", "sentences"}]}``.

    The image id is ``cocoid``, else ``image_id``, else the file name without its extension
    (Flickr30k's own id). Karpathy ``filepath`` (e.g. "val2014") is prefixed to the file name.
    ``data`` is the already parsed JSON, if the caller has it.
    """
    data = read_json(path) if data is None else data
    images = _need(data, "images", path, "top level")
    if not isinstance(images, list):
        raise DataError(path, "top level", "'images' must be a list")
    out = []
    for index, item in enumerate(images):
        where = f"images[{index}]"
        filename = str(_need(item, "filename", path, where))
        if "cocoid" in item:
            image_id = str(item["cocoid"])
        elif "image_id" in item:
            image_id = str(item["image_id"])
        else:
            image_id = Path(filename).stem
        where = f"images[{index}] (image {image_id})"
        split = str(_need(item, "split", path, where))
        sentences = _need(item, "sentences", path, where)
        captions, raw = [], []
        for j, sentence in enumerate(sentences):
            if not isinstance(sentence, dict) or ("raw" not in sentence and "tokens" not in sentence):
                raise DataError(path, f"{where} sentences[{j}]", "a sentence needs 'raw' or 'tokens'")
            text = sentence.get("raw") or " ".join(sentence["tokens"])
            tokens = sentence.get("tokens")
            captions.append(preprocess(" ".join(tokens)) if tokens else preprocess(text))
            raw.append(text)
        if item.get("filepath"):
            filename = f"{item['filepath']}/{filename}"
        out.append(ImageCaptions(image_id, filename, split, captions, raw))
    return out


def karpathy_test_ids() -> list[str]:
    """The 5,000 COCO image ids of the Karpathy test split (shipped in the eccv-caption package)."""
    import importlib.util

    spec = importlib.util.find_spec("eccv_caption")  # located, not imported (its import is slow)
    if spec is None:
        raise SystemExit("error: the Karpathy test ids need the 'eccv-caption' package (pip install eccv-caption)")
    path = Path(spec.submodule_search_locations[0]) / "data" / "original_image_to_caption.json"
    return sorted(read_json(path).keys(), key=natural_key)


def read_id_list(path) -> list[str]:
    """Image ids from a JSON list, a JSON ``{"ids": [...]}`` or a text file of one id a line."""
    path = Path(path)
    text = path.read_text()
    if text.lstrip().startswith(("[", "{")):
        data = read_json(path)
        if isinstance(data, dict):
            data = data.get("ids", data.get("images", list(data.keys())))
        return [str(x["id"] if isinstance(x, dict) else x) for x in data]
    return [line.split()[0] for line in text.splitlines() if line.strip()]


def load_coco_captions(path, splits: dict[str, list] | None = None, default_split: str = "train",
                       data=None) -> list[ImageCaptions]:
    """Official COCO captions JSON (``images`` + ``annotations``).

    ``splits`` maps a split name to image ids (a list, or a path to an id list); images in no
    listed split get ``default_split``. ``splits={"test": karpathy_test_ids()}`` gives the
    Karpathy test split.
    """
    data = read_json(path) if data is None else data
    images = _need(data, "images", path, "top level")
    annotations = _need(data, "annotations", path, "top level")
    split_of = {}
    for name, ids in (splits or {}).items():
        ids = read_id_list(ids) if isinstance(ids, (str, Path)) else ids
        split_of.update({str(i): name for i in ids})
    records: dict[str, ImageCaptions] = {}
    for index, image in enumerate(images):
        image_id = str(_need(image, "id", path, f"images[{index}]"))
        filename = str(_need(image, "file_name", path, f"images[{index}] (image {image_id})"))
        records[image_id] = ImageCaptions(image_id, filename, split_of.get(image_id, default_split), [], [])
    for index, ann in enumerate(annotations):
        where = f"annotations[{index}]"
        image_id = str(_need(ann, "image_id", path, where))
        caption = _need(ann, "caption", path, where)
        if image_id not in records:
            raise DataError(path, where, f"caption of image {image_id}, which is not in 'images'")
        records[image_id].raw.append(caption)
        records[image_id].captions.append(preprocess(caption))
    return sorted(records.values(), key=lambda r: natural_key(r.image_id))


def load_paragraphs(path, splits: dict[str, str | list] | None = None, default_split: str = "train",
                    data=None) -> list[ImageCaptions]:
    """Stanford image-paragraph file: a list of ``{"image_id", "paragraph", "url"}``.

    ``splits`` maps a split name to the id list (``train_split.json`` etc.). Sentence breaks are
    kept as "." tokens (paragraph levels count them).
    """
    data = read_json(path) if data is None else data
    if not isinstance(data, list):
        raise DataError(path, "top level", "expected a list of {image_id, paragraph}")
    split_of = {}
    for name, ids in (splits or {}).items():
        ids = read_id_list(ids) if isinstance(ids, (str, Path)) else ids
        split_of.update({str(i): name for i in ids})
    out = []
    for index, item in enumerate(data):
        image_id = str(_need(item, "image_id", path, f"[{index}]"))
        paragraph = _need(item, "paragraph", path, f"[{index}] (image {image_id})")
        url = str(item.get("url", ""))
        filename = url.rsplit("/", 1)[-1] if url else f"{image_id}.jpg"
        out.append(ImageCaptions(image_id, filename, split_of.get(image_id, default_split),
                                 [preprocess(paragraph, keep_sentences=True)], [paragraph]))
    return out


def load_jsonl_captions(path, split: str = "train") -> list[ImageCaptions]:
    """Our JSONL captions (``image_id``, ``caption``), grouped per image in file order."""
    by_image: dict[str, ImageCaptions] = {}
    for record in read_jsonl(path, required=("image_id", "caption")):
        image_id = str(record["image_id"])
        entry = by_image.setdefault(image_id, ImageCaptions(image_id, "", split, [], []))
        entry.raw.append(record["caption"])
        entry.captions.append(preprocess(record["caption"], keep_sentences="." in record["caption"].rstrip(". ")))
    return list(by_image.values())


def detect_format(path) -> tuple[str, object]:
    """Sniff a caption file: ("jsonl" | "karpathy" | "coco" | "paragraphs", parsed JSON or None)."""
    path = Path(path)
    if path.suffix == ".jsonl":
        return "jsonl", None
    with open(path) as f:
        first_line = f.readline()
    try:
        data = read_json(path)
    except DataError:
        if first_line.lstrip().startswith("{") and '"caption"' in first_line:
            return "jsonl", None
        raise
    if isinstance(data, list) and data and isinstance(data[0], dict) and "paragraph" in data[0]:
        return "paragraphs", data
    if isinstance(data, dict) and "images" in data:
        return ("coco" if "annotations" in data else "karpathy"), data
    raise DataError(path, None, "unknown caption format (expected Karpathy JSON, COCO captions JSON, "
                                "paragraphs JSON or JSONL)")


def load_captions(path, split_filter: str | None = None) -> list[ImageCaptions]:
    """Any supported caption file; ``split_filter`` keeps one split ("train" also takes "restval")."""
    kind, data = detect_format(path)
    if kind == "jsonl":
        records = load_jsonl_captions(path)
    else:
        loader = {"karpathy": load_karpathy, "coco": load_coco_captions, "paragraphs": load_paragraphs}[kind]
        records = loader(path, data=data)
    if split_filter is not None:
        wanted = {split_filter, "restval"} if split_filter == "train" else {split_filter}
        records = [r for r in records if r.split in wanted]
    return records


# ---------------------------------------------------------------------------------------------
# Visual Genome scene graphs


def load_image_data(path) -> dict[str, dict]:
    """VG ``image_data.json``: image id -> ``{"width", "height", "coco_id"}`` (coco_id may be None)."""
    data = read_json(path)
    if not isinstance(data, list):
        raise DataError(path, "top level", "expected a list of image records")
    out = {}
    for index, item in enumerate(data):
        where = f"[{index}]"
        if isinstance(item, dict) and "image_id" not in item and "id" in item:
            image_id = str(item["id"])  # VG 1.0 uses "id"
        else:
            image_id = str(_need(item, "image_id", path, where))
        where = f"[{index}] (image {image_id})"
        width, height = _need(item, "width", path, where), _need(item, "height", path, where)
        coco_id = item.get("coco_id")
        out[image_id] = {"width": float(width), "height": float(height),
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
    image_id = str(_need(item, "image_id", path, f"[{index}]"))
    where = f"[{index}] (image {image_id})"
    objects, seen = [], set()
    for j, o in enumerate(_need(item, "objects", path, where)):
        at = f"{where} objects[{j}]"
        oid = _need(o, "object_id", path, at)
        raw_box = [_need(o, k, path, at) for k in ("x", "y", "w", "h")]
        try:
            box = [float(v) for v in raw_box]
        except (TypeError, ValueError):
            raise DataError(path, at, "box coordinates must be numbers") from None
        names = o.get("names") or ([o["name"]] if o.get("name") else None)
        if not names or not isinstance(names, list):
            raise DataError(path, at, "missing key 'names' (a non-empty list)")
        if oid in seen:
            raise DataError(path, at, f"duplicate object_id {oid}")
        seen.add(oid)
        attributes = [str(a).strip().lower() for a in (o.get("attributes") or []) if str(a).strip()]
        objects.append(SGObject(int(oid), *box, [str(n).strip().lower() for n in names], attributes))
    relations = []
    for j, r in enumerate(item.get("relationships") or []):
        at = f"{where} relationships[{j}]"
        subject_id = r["subject"]["object_id"] if isinstance(r, dict) and isinstance(r.get("subject"), dict) \
            else _need(r, "subject_id", path, at)
        object_id = r["object"]["object_id"] if isinstance(r.get("object"), dict) else _need(r, "object_id", path, at)
        predicate = str(_need(r, "predicate", path, at)).strip().lower()
        for role, oid in (("subject", subject_id), ("object", object_id)):
            if oid not in seen:
                raise DataError(path, at, f"{role} {oid} names an object that does not exist in this graph")
        relations.append(Relation(int(subject_id), int(object_id), predicate))
    size = sizes.get(image_id, {})
    width = item.get("width", size.get("width"))
    height = item.get("height", size.get("height"))
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


def group_by_image(records) -> dict[str, list]:
    out = defaultdict(list)
    for r in records:
        out[str(r["image_id"])].append(r)
    return out
