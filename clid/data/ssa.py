"""Structured semantic augmentation (SSA) captions of CIC-BART-SSA (ECCV 2024) as self-generated captions.

The released SSA data is one JSON file per image, ``<image id>.json``, in an ASG-style layout: an
object whose keys are region ids, each region one generated caption with its visual grounding::

    {"0": {"objects": [{"object_id": 123, "name": "dog", "attributes": [],
                        "xmin": 1, "ymin": 2, "xmax": 30, "ymax": 40}, ...],
           "relationships": [{"relationship_id": 0, "name": "sit-01", ...}, ...],
           "phrase": "a dog sitting on a couch", "region_id": 0, "image_id": 123456}, ...}

An object's ``object_id`` may also be ``"scene"`` (the whole image) or ``"unknown"`` (a node their
grounding could not place); their own loader leaves out a caption with an ``"unknown"`` object, and
so does :func:`load_ssa`. The ``image_id`` is the file name's (``region_id`` and ``image_id`` inside
a record, when present, must agree with the key and the file).

:func:`load_ssa` turns the files into our self-generated JSONL records (``id`` "<image id>_ssa<region
id>", ``image_id``, ``caption``, ``objects``: the objects' ids in order, ``n_tokens``, ``level``,
``source`` "ssa"), which 05 scores and 06 selects like 02's scene-graph walks. A malformed record is
left out, counted by reason and shown (file, record, problem); a file that is not a JSON object is
an error.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

from clid.base.files import DataError, natural_key, read_json
from clid.base.text import caption_lengths, length_to_level, preprocess

SOURCE = "ssa"


def ssa_files(paths, notes: list | None = None) -> list[Path]:
    """The SSA JSON files of ``paths`` (files, or folders of ``*.json`` in any case), each once, in natural
    order of their names within a folder. A file given twice is read once and files of a folder that are
    not JSON are left out, both said in ``notes``; two files of one image id (``1.json`` in two folders)
    are a DataError."""
    files, others, again, image_of, read = [], [], 0, {}, set()
    for path in map(Path, paths):
        if path.is_dir():
            entries = sorted((p for p in path.iterdir() if not p.name.startswith(".")),
                             key=lambda f: natural_key(f.stem))
            json_file = [p.suffix.lower() == ".json" and p.is_file() for p in entries]
            found = [p for p, is_json in zip(entries, json_file) if is_json]
            others += [p for p, is_json in zip(entries, json_file) if not is_json]
            if not found:
                raise DataError(path, None, "holds no .json file")
        elif path.is_file():
            found = [path]
        else:
            raise DataError(path, None, "no such file or folder")
        for file in found:
            if file.resolve() in read:
                again += 1
                continue
            if file.stem in image_of:
                raise DataError(file, None, f"a second file of image {file.stem} (also {image_of[file.stem]}): an "
                                            "image's SSA captions come from one file")
            image_of[file.stem] = file
            read.add(file.resolve())
            files.append(file)
    if notes is not None and again:
        notes.append(f"{again} file(s) given twice, read once")
    if notes is not None and others:
        notes.append(f"left out {len(others)} file(s) that are not .json: "
                     + ", ".join(p.name + "/" * p.is_dir() for p in others[:3])
                     + (", ..." if len(others) > 3 else ""))
    return files


def region_problem(key: str, region, image_id: str) -> str | None:
    """Why one region record cannot be used, or None."""
    if not isinstance(region, dict):
        return f"expected a JSON object, got {type(region).__name__}"
    phrase = region.get("phrase")
    if not isinstance(phrase, str):
        return "'phrase' must be a string" if "phrase" in region else "missing key 'phrase'"
    objects = region.get("objects", [])
    if not isinstance(objects, list) or not all(isinstance(o, dict) for o in objects):
        return "'objects' must be a list of objects"
    if any("object_id" not in o for o in objects):
        return "an object has no 'object_id'"
    if not isinstance(region.get("relationships", []), list):
        return "'relationships' must be a list"
    if "region_id" in region and str(region["region_id"]) != key:
        return f"'region_id' {region['region_id']!r} differs from its key {key!r}"
    if "image_id" in region and str(region["image_id"]) != image_id:
        return f"'image_id' {region['image_id']!r} differs from the file's {image_id!r}"
    return None


class Regions(dict):
    """A JSON object as read, its ``pairs`` (key, value) in order with repeated keys kept (json keeps the last)."""

    def __init__(self, pairs):
        super().__init__(pairs)
        self.pairs = pairs


def load_ssa(paths, levels="caption", tokenizer=None, notes: list | None = None
             ) -> tuple[list[dict], Counter, list[str]]:
    """(records, skip counts by reason, "FILE: region KEY: problem" lines of the malformed ones); ``notes``
    gets what :func:`ssa_files` says. A region key repeated in a file keeps its first region (counted)."""
    records, skipped, problems = [], Counter(), []
    for path in ssa_files(paths, notes):
        data = read_json(path, object_pairs_hook=Regions)
        if not isinstance(data, dict):
            raise DataError(path, "top level", f"expected an object of regions keyed by region id, got "
                                               f"{type(data).__name__}")
        image_id, seen = path.stem, set()
        for key, region in data.pairs:
            if key in seen:
                skipped["a repeated region key (its first region kept)"] += 1
                problems.append(f"{path}: region {key}: the key appears again; its first region is kept")
                continue
            seen.add(key)
            problem = region_problem(key, region, image_id)
            if problem:
                skipped["malformed region"] += 1
                problems.append(f"{path}: region {key}: {problem}")
                continue
            ids = [o["object_id"] for o in region.get("objects", [])]
            if "unknown" in ids:
                skipped["an object not grounded ('unknown')"] += 1
                continue
            if not preprocess(region["phrase"]):
                skipped["no word left after preprocessing"] += 1
                continue
            records.append({"id": f"{image_id}_ssa{key}", "image_id": image_id, "caption": region["phrase"].strip(),
                            "objects": ids, "source": SOURCE})
    lengths = caption_lengths([r["caption"] for r in records], tokenizer)
    for record, n in zip(records, lengths):
        record.update(n_tokens=n, level=length_to_level(n, levels))
    return records, skipped, problems
