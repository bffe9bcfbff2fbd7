"""The files passed between stages (../shared/DESIGN.md, "Data between the stages").

Every write goes to a temporary file in the destination folder and is renamed into place when it
is complete, so a crash never leaves a half-written file behind.

- JSONL: one JSON object a line (self-generated and paraphrased captions, generated captions).
- HDF5 with one group per image id: region features (``features`` [R, D], ``boxes`` [R, 4] in
  pixels as x1, y1, x2, y2, attrs ``width``/``height``, optional ``cls_prob`` [R, C]) and saliency
  (``map`` [h, w] float16 in [0, 1], attrs ``width``/``height``).
- HDF5 of flat arrays with one row per caption: quality scores (``id``, ``logp_trusted``,
  ``logp_extended``, ``u``).
"""
from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np


class DataError(ValueError):
    """Malformed input: the message names the file, the record and what is wrong."""

    def __init__(self, path, record, problem: str):
        self.path, self.record, self.problem = str(path), record, problem
        where = f"{path}" + (f": {record}" if record not in (None, "") else "")
        super().__init__(f"{where}: {problem}")


# ---------------------------------------------------------------------------------------------
# Atomic writes

@contextlib.contextmanager
def atomic_path(path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_json(path, obj, indent: int | None = None) -> None:
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        json.dump(obj, f, indent=indent)


def read_json(path):
    """Parse a JSON file; a syntax error names the file, line and column."""
    try:
        with open(path) as f:
            return json.load(f)
    except json.JSONDecodeError as err:
        raise DataError(path, f"line {err.lineno} column {err.colno}", f"not valid JSON ({err.msg})") from None


# ---------------------------------------------------------------------------------------------
# JSONL

def read_jsonl(path, required: Iterable[str] = ()) -> Iterator[dict]:
    """Yield the records of a JSONL file; a bad line or a missing key names the file and line."""
    required = tuple(required)
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(path, f"line {number}", f"not valid JSON ({err.msg})") from None
            if not isinstance(record, dict):
                raise DataError(path, f"line {number}", "expected a JSON object")
            missing = [key for key in required if key not in record]
            if missing:
                raise DataError(path, f"line {number}", f"missing key(s) {missing}")
            yield record


def write_jsonl(path, records: Iterable[dict]) -> int:
    """Write records atomically, one JSON object a line. Returns the number written."""
    count = 0
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
            count += 1
    return count


# ---------------------------------------------------------------------------------------------
# Ordering shared by the writers and the shard merge, so 1 shard and N shards give equal files.

def natural_key(value) -> tuple:
    """Sort key that orders "img2" before "img10" and numbers numerically."""
    parts = re.split(r"(\d+)", str(value))
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in parts if p != "")


def jsonl_order_key(record: dict) -> tuple:
    """Canonical record order: natural order of image id, then of record id (if any)."""
    return natural_key(record.get("image_id", "")), natural_key(record.get("id", ""))


# ---------------------------------------------------------------------------------------------
# HDF5, one group per image id

def write_h5_groups(path, groups: Iterable[tuple[str, dict, dict]], compression: str | None = None) -> int:
    """Write ``(image_id, datasets, attrs)`` triples atomically as one group per image id."""
    import h5py

    count = 0
    with atomic_path(path) as tmp:
        with h5py.File(tmp, "w") as f:
            for image_id, datasets, attrs in groups:
                group = f.create_group(str(image_id))
                for name, value in datasets.items():
                    group.create_dataset(name, data=np.asarray(value), compression=compression)
                for name, value in attrs.items():
                    group.attrs[name] = value
                count += 1
    return count


def h5_group_ids(path) -> list[str]:
    import h5py

    with h5py.File(path, "r") as f:
        return sorted(f.keys(), key=natural_key)


@dataclass
class Regions:
    """Region features of one image. ``boxes`` are x1, y1, x2, y2 in pixels."""

    features: np.ndarray  # [R, D] float
    boxes: np.ndarray  # [R, 4] float
    width: float
    height: float
    cls_prob: np.ndarray | None = None  # [R, C] or None


class FeatureStore:
    """Read-only access to the region-feature HDF5 (one group per image id)."""

    def __init__(self, path):
        import h5py

        self.path = str(path)
        if not Path(self.path).exists():
            raise FileNotFoundError(f"{self.path}: feature file not found")
        self._file = h5py.File(self.path, "r")

    def __contains__(self, image_id) -> bool:
        return str(image_id) in self._file

    def __len__(self) -> int:
        return len(self._file)

    def ids(self) -> list[str]:
        return sorted(self._file.keys(), key=natural_key)

    def feature_dim(self) -> int:
        first = next(iter(self._file.values()))
        return int(first["features"].shape[1])

    def num_classes(self) -> int:
        """Width of the per-region class probabilities ``cls_prob`` (0 when the file has none)."""
        first = next(iter(self._file.values()))
        return int(first["cls_prob"].shape[1]) if "cls_prob" in first else 0

    def get(self, image_id) -> Regions:
        key = str(image_id)
        if key not in self._file:
            raise DataError(self.path, f"image {key}", "no region features for this image")
        group = self._file[key]
        for name in ("features", "boxes"):
            if name not in group:
                raise DataError(self.path, f"image {key}", f"missing dataset '{name}'")
        features, boxes = group["features"][()], group["boxes"][()]
        if features.ndim != 2 or boxes.shape != (features.shape[0], 4):
            raise DataError(self.path, f"image {key}",
                            f"features {features.shape} and boxes {boxes.shape} do not match as [R, D], [R, 4]")
        try:
            width, height = float(group.attrs["width"]), float(group.attrs["height"])
        except KeyError as err:
            raise DataError(self.path, f"image {key}", f"missing attribute {err}") from None
        cls_prob = group["cls_prob"][()] if "cls_prob" in group else None
        if cls_prob is not None and (cls_prob.ndim != 2 or cls_prob.shape[0] != features.shape[0]):
            raise DataError(self.path, f"image {key}",
                            f"cls_prob {cls_prob.shape} does not match features {features.shape} as [R, C]")
        return Regions(features, boxes.astype(np.float32), width, height, cls_prob)

    def close(self) -> None:
        self._file.close()


# ---------------------------------------------------------------------------------------------
# Saliency maps

def read_saliency(path) -> dict[str, np.ndarray]:
    """All saliency maps of a file as float32 arrays, keyed by image id."""
    import h5py

    out = {}
    with h5py.File(path, "r") as f:
        for key, group in f.items():
            if "map" not in group:
                raise DataError(path, f"image {key}", "missing dataset 'map'")
            out[key] = group["map"][()].astype(np.float32)
    return out


# ---------------------------------------------------------------------------------------------
# Quality scores: flat arrays, one row per caption

QUALITY_FIELDS = ("logp_trusted", "logp_extended", "u")


def write_quality(path, ids: list[str], logp_trusted, logp_extended) -> None:
    """Write the quality file; ``u = logp_trusted - logp_extended`` (Eq. 1)."""
    write_arrays(path, {
        "id": np.asarray([str(i) for i in ids], dtype=object),
        "logp_trusted": np.asarray(logp_trusted, dtype=np.float32),
        "logp_extended": np.asarray(logp_extended, dtype=np.float32),
        "u": (np.asarray(logp_trusted, np.float32) - np.asarray(logp_extended, np.float32)),
    })


def read_quality(path) -> dict[str, np.ndarray]:
    arrays = read_arrays(path)
    for name in ("id",) + QUALITY_FIELDS:
        if name not in arrays:
            raise DataError(path, None, f"missing dataset '{name}'")
    return arrays


def write_arrays(path, arrays: dict[str, np.ndarray]) -> None:
    """Write equal-length 1-d arrays (strings allowed) atomically as HDF5 datasets."""
    import h5py

    lengths = {name: len(a) for name, a in arrays.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"arrays differ in length: {lengths}")
    with atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
        for name, array in arrays.items():
            array = np.asarray(array)
            if array.dtype == object or array.dtype.kind in "US":
                f.create_dataset(name, data=[str(x) for x in array], dtype=h5py.string_dtype())
            else:
                f.create_dataset(name, data=array)


def read_arrays(path) -> dict[str, np.ndarray]:
    import h5py

    out = {}
    with h5py.File(path, "r") as f:
        for name, ds in f.items():
            if ds.dtype.kind == "O" or h5py.check_string_dtype(ds.dtype):
                out[name] = np.asarray(ds.asstr()[()], dtype=object)
            else:
                out[name] = ds[()]
    return out
