"""The record types every loader returns, and the field checks that name the file and the record."""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field

from clid.base.files import DataError, id_problem


@dataclass
class ImageCaptions:
    """The reference captions of one image."""

    image_id: str
    filename: str  # file name inside the image folder (may include a sub-folder)
    split: str  # train / val / test (the Karpathy split's "restval" is kept as written)
    captions: list[str]  # Karpathy-preprocessed text, without the final "."
    raw: list[str] = field(default_factory=list)  # the captions as written
    wordless: int = 0  # captions left out: no word left after preprocessing


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
