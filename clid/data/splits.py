"""Splits: the Karpathy test ids, the official COCO files converted to a Karpathy JSON, and the
guard (:func:`training_records`) that never hands a test image to training."""
from __future__ import annotations

import hashlib
import re
from collections import Counter
from pathlib import Path

from clid.base.files import DataError, natural_key, read_json
from clid.data.captions import load_any, load_coco_captions, load_karpathy, read_id_list
from clid.data.records import ImageCaptions
from clid.run.cli import is_whole_number

KARPATHY_SIZES = (113_287, 5_000, 5_000)  # the Karpathy split's train (with restval), val and test images


COCO_FILE_NAME = re.compile(r"COCO_([a-z]+\d{4})_(\d+)")


FORMAT_NAMES = {"coco": "official COCO captions", "jsonl": "JSONL captions", "paragraphs": "paragraphs",
                "karpathy": "Karpathy"}


SPLIT_FIX = ("convert it with `python -m clid.captions convert-coco --captions FILE [FILE ...] --out karpathy.json`, "
             "give --test-ids FILE (image ids to hold out; 'karpathy' for the Karpathy 5k COCO test ids), "
             "or --no-split-check")


PARAGRAPH_SPLIT_FIX = "put train_split.json, val_split.json and test_split.json beside it"


def karpathy_test_ids() -> list[str]:
    """The 5,000 COCO image ids of the Karpathy test split (shipped in the eccv-caption package)."""
    import importlib.util

    spec = importlib.util.find_spec("eccv_caption")  # located, not imported (its import is slow)
    if spec is None:
        raise DataError(None, None, "the Karpathy test ids need the 'eccv-caption' package (pip install eccv-caption)")
    path = Path(spec.submodule_search_locations[0]) / "data" / "original_image_to_caption.json"
    return sorted(read_json(path).keys(), key=natural_key)


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
        images.append({"cocoid": int(image_id) if is_whole_number(image_id) and image_id.isdigit() else image_id,
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


def training_records(path, test_ids=None, split_check: bool = True, info=None):
    """(train records (Karpathy "restval" included), val records, lines to print) of a captions file.

    Never hands a test image to training: raises :class:`DataError` (naming what to do) when the
    file has no train/val/test split (the official COCO JSON, JSONL, paragraphs without their split
    files) and no ``test_ids`` were given, or when COCO training images include Karpathy test ids.
    ``test_ids`` (a file, or "karpathy") are held out of train and val. ``split_check=False`` skips both checks.
    ``info``: :func:`split_info` of the file, if the caller has read it.
    """
    records, kind, coco = info or split_info(path)
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
