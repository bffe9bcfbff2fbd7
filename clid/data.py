"""Loaders for the caption and scene-graph datasets, all returning the same record types.

Captions:
- Karpathy JSON (``dataset_coco.json``, ``dataset_flickr30k.json``, and the files 00 writes);
- the official COCO captions JSON plus split lists (the Karpathy 5k test ids ship in ``eccv-caption``),
  and its converter to a Karpathy JSON:

      python -m clid.data convert-coco --captions captions_train2014.json captions_val2014.json \
          --out karpathy.json [--karpathy dataset_coco.json]

- the Stanford image-paragraph file (``paragraphs_v1.json`` plus its split id lists);
- our own JSONL (self-generated, paraphrased, generated captions).
Split guards: :func:`training_records` never hands a test image to training.
Scene graphs: Visual Genome ``scene_graphs.json`` with ``image_data.json`` (sizes, VG-to-COCO ids),
and a scene-graph generator's predictions (the Scene Graph Benchmark's TSV); :func:`load_graph_files`
reads several files of either kind, each image from one source.

Image ids are strings in memory (the dataset's own id: COCO id, VG id, or a file-name stem).
Malformed input raises :class:`clid.files.DataError` naming the file, the record and the problem.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from .cli import HelpFormatter
from .files import DataError, check_not_input, id_problem, natural_key, read_json, read_jsonl, write_json
from .text import preprocess

# ---------------------------------------------------------------------------------------------
# Record types


@dataclass
class ImageCaptions:
    """The reference captions of one image."""

    image_id: str
    filename: str  # file name inside the image folder (may include a sub-folder)
    split: str  # train / val / test (the Karpathy split's "restval" is kept as written)
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
    source: str = ""  # the file it was read from
    generated: bool = False  # from a scene-graph generator (else Visual Genome)

    def object_map(self) -> dict[int, SGObject]:
        return {o.object_id: o for o in self.objects}


def _need(record: dict, key: str, path, where: str):
    if not isinstance(record, dict):
        raise DataError(path, where, f"expected a JSON object, got {type(record).__name__}")
    if key not in record:
        raise DataError(path, where, f"missing key '{key}'")
    return record[key]


def _show(value) -> str:
    """A short description of a wrong value for an error message."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return json.dumps(value)[:40]
    return type(value).__name__


def _string(record: dict, key: str, path, where: str) -> str:
    value = _need(record, key, path, where)
    if not isinstance(value, str):
        raise DataError(path, where, f"'{key}' must be a string, got {_show(value)}")
    return value


def _list(record: dict, key: str, path, where: str) -> list:
    value = _need(record, key, path, where)
    if not isinstance(value, list):
        raise DataError(path, where, f"'{key}' must be a list, got {_show(value)}")
    return value


def _number(record: dict, key: str, path, where: str) -> float:
    value = _need(record, key, path, where)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise DataError(path, where, f"'{key}' must be a number, got {_show(value)}")
    return float(value)


def _image_id(record: dict, key: str, path, where: str) -> str:
    value = _need(record, key, path, where)
    problem = id_problem(value)
    if problem:
        raise DataError(path, where, f"'{key}' {problem}")
    return str(value)


def _first_time(seen: dict, image_id: str, path, where: str) -> None:
    """Raise on an image id seen before: its captions would be trained on the other image's features."""
    if image_id in seen:
        raise DataError(path, where, f"duplicate image id {image_id} (also at {seen[image_id]})")
    seen[image_id] = where


def report_wordless(path, places: list[str]) -> None:
    """One warning for the captions skipped because no word is left after preprocessing (emoji-only,
    non-Latin script, punctuation), naming the first few."""
    if places:
        shown = ", ".join(places[:5]) + (", ..." if len(places) > 5 else "")
        print(f"warning: {path}: skipped {len(places)} caption(s) with no word left after preprocessing: {shown}",
              file=sys.stderr)


# ---------------------------------------------------------------------------------------------
# Captions


SPLITS = ("train", "restval", "val", "test")  # the Karpathy split's names


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
    out, seen, wordless = [], {}, []
    for index, item in enumerate(images):
        where = f"images[{index}]"
        filename = _string(item, "filename", path, where)
        if "cocoid" in item:
            image_id = _image_id(item, "cocoid", path, where)
        elif "image_id" in item:
            image_id = _image_id(item, "image_id", path, where)
        else:
            image_id = Path(filename).stem
        _first_time(seen, image_id, path, where)
        where = f"images[{index}] (image {image_id})"
        split = _string(item, "split", path, where)
        if split not in SPLITS:
            raise DataError(path, where, f"unknown split {split!r} (expected one of {', '.join(SPLITS)}: "
                                         "split names are lower case)")
        sentences = _list(item, "sentences", path, where)
        captions, raw = [], []
        for j, sentence in enumerate(sentences):
            at = f"{where} sentences[{j}]"
            if not isinstance(sentence, dict) or ("raw" not in sentence and "tokens" not in sentence):
                raise DataError(path, at, "a sentence needs 'raw' or 'tokens'")
            tokens = sentence.get("tokens")
            if tokens is not None and not (isinstance(tokens, list) and all(isinstance(t, str) for t in tokens)):
                raise DataError(path, at, f"'tokens' must be a list of words (strings), got {_show(tokens)}")
            if "raw" in sentence and not isinstance(sentence["raw"], str):
                raise DataError(path, at, f"'raw' must be a string, got {_show(sentence['raw'])}")
            text = sentence.get("raw") or " ".join(tokens or [])
            caption = preprocess(" ".join(tokens)) if tokens else preprocess(text)
            if not caption:
                wordless.append(at)
                continue
            captions.append(caption)
            raw.append(text)
        if item.get("filepath"):
            filename = f"{item['filepath']}/{filename}"
        out.append(ImageCaptions(image_id, filename, split, captions, raw))
    report_wordless(path, wordless)
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
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as err:
        raise DataError(path, f"byte {err.start}", "not UTF-8 text (expected image ids, one a line, or a JSON list)") from None
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
    images = _list(data, "images", path, "top level")
    annotations = _list(data, "annotations", path, "top level")
    split_of = {}
    for name, ids in (splits or {}).items():
        ids = read_id_list(ids) if isinstance(ids, (str, Path)) else ids
        split_of.update({str(i): name for i in ids})
    records: dict[str, ImageCaptions] = {}
    seen, wordless = {}, []
    for index, image in enumerate(images):
        image_id = _image_id(image, "id", path, f"images[{index}]")
        _first_time(seen, image_id, path, f"images[{index}]")
        filename = _string(image, "file_name", path, f"images[{index}] (image {image_id})")
        records[image_id] = ImageCaptions(image_id, filename, split_of.get(image_id, default_split), [], [])
    for index, ann in enumerate(annotations):
        where = f"annotations[{index}]"
        image_id = _image_id(ann, "image_id", path, where)
        caption = _string(ann, "caption", path, where)
        if image_id not in records:
            raise DataError(path, where, f"caption of image {image_id}, which is not in 'images'")
        if not preprocess(caption):
            wordless.append(f"{where} (image {image_id})")
            continue
        records[image_id].raw.append(caption)
        records[image_id].captions.append(preprocess(caption))
    report_wordless(path, wordless)
    return sorted(records.values(), key=lambda r: natural_key(r.image_id))


PARAGRAPH_SPLIT_FILES = {"train": "train_split.json", "val": "val_split.json", "test": "test_split.json"}


def paragraph_split_files(path) -> dict[str, Path]:
    """The split id lists the Stanford paragraphs ship beside ``paragraphs_v1.json``, if present."""
    folder = Path(path).parent
    return {name: folder / file for name, file in PARAGRAPH_SPLIT_FILES.items() if (folder / file).exists()}


def load_paragraphs(path, splits: dict[str, str | list] | None = None, data=None) -> list[ImageCaptions]:
    """Stanford image-paragraph file: a list of ``{"url", "image_id", "paragraph"}``.

    ``splits`` maps a split name to its id list (a list, or a path to ``train_split.json`` etc.);
    by default the three split files are read from beside the paragraphs file. Without any split
    file every image's split is None (no split information: training refuses such a file). With
    split files, an image in none of them is left out and counted. The real file repeats a few
    image ids with the same paragraph: the first is kept and the repeats are counted. Sentence
    breaks are kept as "." tokens (paragraph levels count them).
    """
    import sys

    data = read_json(path) if data is None else data
    if not isinstance(data, list):
        raise DataError(path, "top level", "expected a list of {image_id, paragraph}")
    splits = paragraph_split_files(path) if splits is None else splits
    split_of = {}
    for name, ids in splits.items():
        ids = read_id_list(ids) if isinstance(ids, (str, Path)) else ids
        split_of.update({str(i): name for i in ids})
    out, seen, repeats, unlisted, wordless = [], set(), 0, 0, []
    for index, item in enumerate(data):
        image_id = _image_id(item, "image_id", path, f"[{index}]")
        paragraph = _string(item, "paragraph", path, f"[{index}] (image {image_id})")
        if image_id in seen:
            repeats += 1
            continue
        seen.add(image_id)
        if split_of and image_id not in split_of:
            unlisted += 1
            continue
        text = preprocess(paragraph, keep_sentences=True)
        if not text:
            wordless.append(f"[{index}] (image {image_id})")
            continue
        url = str(item.get("url", ""))
        filename = url.rsplit("/", 1)[-1] if url else f"{image_id}.jpg"
        out.append(ImageCaptions(image_id, filename, split_of.get(image_id), [text], [paragraph]))
    if repeats or unlisted:
        print(f"{path}: left out {repeats} repeated image id(s) and {unlisted} image(s) in no split file",
              file=sys.stderr)
    report_wordless(path, wordless)
    return out


def load_jsonl_captions(path, split: str = "train") -> list[ImageCaptions]:
    """Our JSONL captions (``image_id``, ``caption``), grouped per image in file order."""
    by_image: dict[str, ImageCaptions] = {}
    wordless = []
    for number, record in enumerate(read_jsonl(path, required=("image_id", "caption")), 1):
        image_id = str(record["image_id"])
        entry = by_image.setdefault(image_id, ImageCaptions(image_id, "", split, [], []))
        text = preprocess(record["caption"], keep_sentences="." in record["caption"].rstrip(". "))
        if not text:
            wordless.append(f"caption {record.get('id', f'#{number}')} (image {image_id})")
            continue
        entry.raw.append(record["caption"])
        entry.captions.append(text)
    report_wordless(path, wordless)
    return list(by_image.values())


def detect_format(path) -> tuple[str, object]:
    """Sniff a caption file: ("jsonl" | "karpathy" | "coco" | "paragraphs", parsed JSON or None)."""
    path = Path(path)
    if path.suffix == ".jsonl":
        return "jsonl", None
    with open(path, encoding="utf-8-sig", errors="replace") as f:  # (only sniffed here; read_json names a non-UTF-8 file)
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


def load_any(path) -> tuple[str, object, list[ImageCaptions]]:
    """Any supported caption file: (its format, the parsed JSON or None, the records)."""
    kind, data = detect_format(path)
    if kind == "jsonl":
        return kind, None, load_jsonl_captions(path)
    loader = {"karpathy": load_karpathy, "coco": load_coco_captions, "paragraphs": load_paragraphs}[kind]
    return kind, data, loader(path, data=data)


def load_captions(path, split_filter: str | None = None) -> list[ImageCaptions]:
    """Any supported caption file; ``split_filter`` keeps one split ("train" also takes "restval")."""
    records = load_any(path)[2]
    if split_filter is not None:
        wanted = {split_filter, "restval"} if split_filter == "train" else {split_filter}
        records = [r for r in records if r.split in wanted]
    return records


# ---------------------------------------------------------------------------------------------
# Splits: the official COCO files converted, and no test image ever trained on

KARPATHY_SIZES = (113_287, 5_000, 5_000)  # the Karpathy split's train (with restval), val and test images
COCO_FILE_NAME = re.compile(r"COCO_([a-z]+\d{4})_(\d+)")
FORMAT_NAMES = {"coco": "official COCO captions", "jsonl": "JSONL captions", "paragraphs": "paragraphs",
                "karpathy": "Karpathy"}
SPLIT_FIX = ("convert it with `python -m clid.data convert-coco --captions FILE [FILE ...] --out karpathy.json`, "
             "give --test-ids FILE (image ids to hold out; 'karpathy' for the Karpathy 5k COCO test ids), "
             "or --no-split-check")
PARAGRAPH_SPLIT_FIX = "put train_split.json, val_split.json and test_split.json beside it"


def coco_folder(filename: str) -> str:
    """The COCO image folder named in a file name ("COCO_val2014_000000391895.jpg" -> "val2014"), or ""."""
    match = COCO_FILE_NAME.match(Path(filename).name)
    return match.group(1) if match else ""


def val_rank(image_id: str) -> str:
    """The converter's order of validation candidates: the SHA-1 of the image id (decimal COCO id)."""
    return hashlib.sha1(image_id.encode()).hexdigest()


def convert_coco(caption_paths, karpathy_path=None, val_size: int = 5000) -> tuple[dict, list[str]]:
    """A Karpathy-style JSON ``{"dataset": "coco", "images": [...]}`` from official COCO captions files.

    - test: the Karpathy 5k test images (their ids ship offline in eccv-caption);
    - val: with ``karpathy_path`` (the Karpathy split file ``dataset_coco.json``), that file's val split, and its
      restval images stay "restval"; otherwise the ``val_size`` val2014 images outside the test split
      whose SHA-1 of the COCO id (as a decimal string) is smallest: a fixed pseudo-random draw that
      needs no seed and does not depend on the order of the files;
    - train: every other image.
    Each image keeps the Karpathy split's fields: ``cocoid``, ``filepath`` (train2014 / val2014), ``filename``,
    ``split`` and ``sentences`` (``raw`` and Karpathy ``tokens``). Returns the JSON and lines to print.
    """
    records: dict[str, ImageCaptions] = {}
    source: dict[str, str] = {}
    for path in caption_paths:
        for r in load_coco_captions(path):
            if r.image_id in records:
                raise DataError(path, f"image {r.image_id}", f"is also in {source[r.image_id]}")
            records[r.image_id], source[r.image_id] = r, str(path)
    test_ids = set(karpathy_test_ids())
    notes = [f"images: {len(records)} from {len(caption_paths)} captions file(s)"]
    if karpathy_path:
        given = {r.image_id: r.split for r in load_karpathy(karpathy_path)}
        split_of = {i: "test" if i in test_ids else given.get(i, "train") for i in records}
        absent = sum(1 for i in records if i not in given and i not in test_ids)
        if absent:
            notes.append(f"warning: {absent} images are not in {karpathy_path}; they go to train")
        moved = sum(1 for i in records if given.get(i) == "test" and i not in test_ids)
        if moved:
            notes.append(f"warning: {moved} images are test in {karpathy_path} but not Karpathy test ids; "
                         "they go to train (the test split is the Karpathy test ids)")
            split_of.update({i: "train" for i in records if given.get(i) == "test" and i not in test_ids})
    else:
        outside_test = [i for i in records if i not in test_ids]
        candidates = [i for i in outside_test if coco_folder(records[i].filename) == "val2014"]
        if not candidates:
            notes.append("warning: no val2014 image outside the test split: val is drawn from all non-test images")
            candidates = outside_test
        val = set(sorted(candidates, key=val_rank)[:val_size])
        split_of = {i: "test" if i in test_ids else "val" if i in val else "train" for i in records}
    images = []
    for image_id in sorted(records, key=natural_key):
        r = records[image_id]
        images.append({"cocoid": int(image_id) if image_id.isdigit() else image_id,
                       "filepath": coco_folder(r.filename), "filename": Path(r.filename).name,
                       "split": split_of[image_id],
                       "sentences": [{"raw": raw, "tokens": text.split()} for raw, text in zip(r.raw, r.captions)]})
    sizes = Counter(split_of.values())
    train = sizes["train"] + sizes["restval"]
    restval = f" (restval {sizes['restval']:,})" if sizes["restval"] else ""
    notes.append(f"splits: train {train:,}{restval} / val {sizes['val']:,} / test {sizes['test']:,} images "
                 f"(the Karpathy split: {' / '.join(f'{n:,}' for n in KARPATHY_SIZES)})")
    missing = len(test_ids - records.keys())
    if missing:
        notes.append(f"warning: {missing} of the {len(test_ids)} Karpathy test images are not in the captions files "
                     "(give captions_val2014.json)")
    return {"dataset": "coco", "images": images}, notes


def split_info(path) -> tuple[list[ImageCaptions], str, bool]:
    """(records, format, whether the images are COCO images). A Karpathy JSON carries splits, and a
    paragraphs file has them when its split files are beside it."""
    kind, data, records = load_any(path)
    coco = kind == "coco" or (kind == "karpathy" and (data.get("dataset") == "coco"
                                                      or any(coco_folder(r.filename) for r in records)))
    return records, kind, coco


def has_splits(kind: str, records) -> bool:
    """Whether a loaded file says which images are train, val and test: a Karpathy JSON does, and a
    paragraphs file does when its split files are beside it (other formats only guess "train")."""
    return kind == "karpathy" or (kind == "paragraphs" and any(r.split is not None for r in records))


def add_split_args(parser) -> None:
    """--test-ids and --no-split-check, for the stages that read training captions (04, 05, 06)."""
    parser.add_argument("--test-ids", default=None, metavar="FILE",
                        help="image ids never trained on (a JSON list or one id a line; 'karpathy': the Karpathy "
                             "5k COCO test ids); needed for a captions file without splits")
    parser.add_argument("--no-split-check", action="store_true",
                        help="train even on a captions file without splits, or whose training images include "
                             "Karpathy test images")


def training_records(path, test_ids=None, split_check: bool = True):
    """(train records (Karpathy "restval" included), val records, lines to print) of a captions file.

    Never hands a test image to training: raises :class:`DataError` (naming what to do) when the
    file has no train/val/test split (the official COCO JSON, JSONL, paragraphs without their split
    files) and no ``test_ids`` were given, or when COCO training images include Karpathy test ids.
    ``test_ids`` (a file, or "karpathy") are held out of train and val. ``split_check=False`` skips both checks.
    """
    records, kind, coco = split_info(path)
    held = set()
    if test_ids:
        held = set(karpathy_test_ids() if test_ids == "karpathy" else read_id_list(test_ids))
    if split_check and not has_splits(kind, records) and not held:
        fix = f"{PARAGRAPH_SPLIT_FIX}, give --test-ids FILE, or --no-split-check" if kind == "paragraphs" else SPLIT_FIX
        raise DataError(path, None, f"this {FORMAT_NAMES[kind]} file has no train/val/test split, so training "
                                    f"would use test images; {fix}")
    train = [r for r in records if r.split in ("train", "restval") and r.image_id not in held]
    val = [r for r in records if r.split == "val" and r.image_id not in held]
    if split_check and coco:
        test = set(karpathy_test_ids())
        leaked = sorted((r.image_id for r in train if r.image_id in test), key=natural_key)
        if leaked:
            raise DataError(path, None, f"{len(leaked)} training images are Karpathy test images (first: {leaked[0]}); "
                                        f"{SPLIT_FIX}")
    notes = []
    if held:
        removed = sum(1 for r in records if r.image_id in held and r.split in ("train", "restval", "val"))
        notes.append(f"held out of training and validation: {removed} images of --test-ids {test_ids}")
    return train, val, notes


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
        width, height = _number(item, "width", path, where), _number(item, "height", path, where)
        coco_id = item.get("coco_id")
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


# ---------------------------------------------------------------------------------------------
# Scene graphs from a generator: the Scene Graph Benchmark's predictions TSV
#
# One line per image: the image key, a tab, then a JSON object with
#   "objects":   [{"rect": [x1, y1, x2, y2], "class", "conf", optional "attr"/"attributes"}, ...]
#   "relations": [{"subj_id", "obj_id" (indices into "objects"), "class", "conf"}, ...]
# Classes are names, or label indices resolved with the benchmark's labelmap JSON (label_to_idx,
# predicate_to_idx, attribute_to_idx, or their idx_to_* inverses).

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
NO_LABEL = {"__background__", "__no_attribute__", "__no_relation__"}  # the labelmaps' index 0


def image_key_to_id(key: str) -> str:
    """A TSV image key as our image id: a COCO file name or a zero-padded number gives the COCO id
    ("COCO_val2014_000000391895.jpg", "000000391895" -> "391895"); another key only loses an image
    extension and its folder ("flickr/1000092795.jpg" -> "1000092795")."""
    stem = key.strip().replace("\\", "/").rsplit("/", 1)[-1]
    if stem.lower().endswith(IMAGE_SUFFIXES):
        stem = stem.rsplit(".", 1)[0]
    match = COCO_FILE_NAME.fullmatch(stem)
    if match:
        return str(int(match.group(2)))
    return str(int(stem)) if stem.isdigit() else stem


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
    with open(path, encoding="utf-8-sig") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            key, _, text = line.rstrip("\n").partition("\t")
            where = f"line {number} (image {key})"
            try:
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
                problems.append((image_key_to_id(key) if key.strip() else f"line {number}", err.problem))
                continue
            dropped.update(left_out)
            seen.add(graph.image_id)
            graph.source = str(path)
            graphs.append(graph)
    return graphs, problems, dropped


def load_sizes(path) -> dict[str, tuple[float, float]]:
    """Image id -> (width, height) from the benchmark's hw TSV (key, a tab, ``[{"height", "width"}]``)
    or from VG's ``image_data.json`` (keyed by VG image id)."""
    with open(path, encoding="utf-8-sig") as f:
        head = f.read(4096).lstrip()[:1]
    if head == "[":
        return {i: (info["width"], info["height"]) for i, info in load_image_data(path).items()}
    out = {}
    with open(path, encoding="utf-8-sig") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            key, _, text = line.rstrip("\n").partition("\t")
            try:
                value = json.loads(text)
                value = value[0] if isinstance(value, list) else value
                out[image_key_to_id(key)] = (float(value["width"]), float(value["height"]))
            except (json.JSONDecodeError, TypeError, KeyError, IndexError, ValueError):
                raise DataError(path, f"line {number} (image {key})",
                                'expected an image key, a tab, then [{"height": H, "width": W}]') from None
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


# ---------------------------------------------------------------------------------------------
# Command line


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m clid.data", description="Caption-file tools.",
                                     formatter_class=HelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    convert = commands.add_parser(
        "convert-coco", help="official COCO captions JSONs -> a Karpathy-style JSON",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,  # (its description is wrapped)
        description="Official COCO captions JSONs -> a Karpathy-style JSON with train, val and test. test: the "
                    "Karpathy 5k test images (ids from eccv-caption); val: --karpathy's val (and its restval), else "
                    "the 5,000 val2014 images outside test with the smallest SHA-1 of their COCO id; train: the rest. "
                    "Prints the split sizes (the Karpathy split: 113,287 / 5,000 / 5,000).")
    convert.add_argument("--captions", nargs="+", required=True, metavar="FILE",
                         help="official COCO captions JSONs (captions_train2014.json captions_val2014.json)")
    convert.add_argument("--out", required=True, help="the Karpathy-style JSON to write")
    convert.add_argument("--karpathy", default=None, metavar="dataset_coco.json",
                         help="take val (and restval) from the Karpathy split file; default: the 5,000 val2014 images "
                              "outside the test split with the smallest SHA-1 of their COCO id")
    convert.add_argument("--val-size", type=int, default=5000, help="validation images without --karpathy")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    check_not_input(args.out, {"--captions": args.captions, "--karpathy": args.karpathy})
    try:
        data, notes = convert_coco(args.captions, args.karpathy, args.val_size)
    except (DataError, FileNotFoundError) as err:
        sys.exit(f"error: {err}")
    write_json(args.out, data)
    print("\n".join(notes))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
