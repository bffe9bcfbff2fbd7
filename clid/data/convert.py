"""Region features from the releases users have, converted into our region-feature file.

    python -m clid.features convert --format vlp|butd|vinvl INPUT [INPUT ...] --out features.h5 \\
        [--dtype float32|float16|bfloat16] [--sizes FILE ...] [--ids auto|keep] [--bad-records error|skip] \\
        [--shard-id I --num-shards N]
    python -m clid.features convert --format clid features.h5 --dtype float16 --out features-fp16.h5

Formats (docs/formats.md has them field by field):

- ``vlp``: the release the authors' dataloader reads (VLP's COCO/Flickr30k region features). INPUTs are
  its files or folders: per-image detections in ``*_feat000.h5`` .. ``*_feat999.h5`` (fc6 features, [100,
  2048]) and ``*_cls000.h5`` .. ``*_cls999.h5`` (1,601 class probabilities), the file named by the last
  three digits of the image's key, and one box file (``coco_detection_vg_thresh0.2_feat_gvd_checkpoint_
  trainvaltest.h5``) whose rows are ``[x1, y1, x2, y2, class, confidence]`` in pixels. Keys are file-name
  stems (``COCO_val2014_000000391895``). Kind ``vlp-fc6``.
- ``butd``: the bottom-up-attention TSV, one image a line: ``image_id, image_w, image_h, num_boxes,
  boxes, features``, tab-separated, boxes and features base64 float32. Kind ``butd``.
- ``vinvl``: the Scene Graph Benchmark's (VinVL) feature TSV: an image key, a tab, a JSON object whose
  ``objects`` hold ``rect`` [x1, y1, x2, y2], ``class``, ``conf`` and ``feature`` (base64 float32). Kind
  ``vinvl``.
- ``clid``: a region-feature file of ours (one INPUT), rewritten in another ``--dtype``. Its kind is kept.

``--dtype`` stores the features and class probabilities as float16 (the default), bfloat16 (both half the
bytes; docs/scale.md measures what they change: no draw of 06) or float32. Readers get float32. A value
beyond float16's range (65,504) is refused, naming the record: give ``--dtype bfloat16`` or ``float32``.

Kept: the features, the boxes, the class probabilities (``cls_prob``, vlp) and the detector's
confidence (``confidence``, vlp and vinvl). The image size is the record's (butd, a vinvl record with
``image_w``/``image_h``), else ``--sizes`` (the benchmark's hw TSV, VG's image_data.json or a COCO
annotations JSON), else the boxes' extent (what VLP's own loader estimates). An image's id is its key
read as 02 reads keys (``--ids auto``: a COCO file name or zero-padded number gives the COCO id, so
``COCO_val2014_000000391895`` is 391895; another key loses only an image extension), or the key as it
is (``--ids keep``).

Nothing is loaded whole: the TSVs are indexed by line (one pass), then each record is read on its
own; the HDF5 files are read one image at a time. Sharded and resumable like 01/02/03/05; ``--bad-records
skip`` leaves a malformed record out (counted, listed in ``OUT.skipped.tsv``) instead of stopping.
"""
from __future__ import annotations

import base64
import binascii
import json
import math
import re
import time
from collections import Counter
from pathlib import Path

import numpy as np

from clid.base.files import DataError, check_unchanged, open_h5, read_json, read_state
from clid.data.scenegraphs import image_key_to_id, load_sizes
from clid.data.store import Regions, region_problem, write_features
from clid.run import shard
from clid.run.cli import whole_number

FORMATS = ("vlp", "butd", "vinvl", "clid")
FLOAT16_MAX = 65504.0
KINDS = {"vlp": "vlp-fc6", "butd": "butd", "vinvl": "vinvl"}
FEAT_FILE = re.compile(r"_feat(\d{3})\.h5$")
CLS_FILE = re.compile(r"_cls(\d{3})\.h5$")
PROGRESS_SECONDS = 10
KEY_BYTES = 4096  # a TSV line's first bytes, read for its key when the file is indexed
FLOAT64 = "records of float64 values, converted to float32"  # (a count of the summary)
BUTD_DIM = 2048  # the bottom-up release's feature dimension (ResNet-101 pool5), as documented



# ---------------------------------------------------------------------------------------------
# Shared pieces


def decode_base64(text, path, where, what: str) -> bytes:
    """The bytes of a base64 string (a Python 3 port's ``b'...'`` wrapper tolerated)."""
    if isinstance(text, bytes):
        text = text.decode("ascii", "replace")
    if not isinstance(text, str):
        raise DataError(path, where, f"'{what}' must be a base64 string, got {type(text).__name__}")
    text = text.strip()
    if text[:2] in ("b'", 'b"') and text[-1:] == text[1]:
        text = text[2:-1]
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise DataError(path, where, f"'{what}' is not valid base64") from None


def implausible(values: np.ndarray) -> bool:
    """Over a tenth of the values non-finite or beyond 1e6: the float32 reading of float64 bytes (the low
    half of each value reads as a float32 of random exponent); detectors' features stay far below."""
    with np.errstate(invalid="ignore", over="ignore"):
        return values.size > 0 and float(np.mean(~(np.abs(values) <= 1e6))) > 0.1


def float_rows(raw: bytes, rows: int, path, where, what: str, width: int | None = None) -> tuple[np.ndarray, str]:
    """``([rows, D] float32, "float32" | "float64")``: ``rows`` rows of values written as float32 or
    float64 (converted). With ``width`` (D) known the byte count tells which. Otherwise float32,
    unless that reading is :func:`implausible` and the float64 one is not; neither is a DataError."""
    if width is not None:
        for dtype in ("float32", "float64"):
            if len(raw) == rows * width * np.dtype(dtype).itemsize:
                return np.frombuffer(raw, dtype).astype(np.float32).reshape(rows, width), dtype
        raise DataError(path, where, f"'{what}' holds {len(raw)} bytes: not {width} float32 or float64 values for "
                                     f"each of {rows} rows")
    if len(raw) % (4 * rows):
        raise DataError(path, where, f"'{what}' holds {len(raw)} bytes, not a whole number of float32 values for "
                                     f"each of {rows} rows")
    values = np.frombuffer(raw, np.float32)
    if not implausible(values):
        return values.reshape(rows, -1), "float32"
    if len(raw) % (8 * rows) == 0:
        wide = np.frombuffer(raw, np.float64)
        if np.isfinite(wide).all() and not implausible(wide):
            return wide.astype(np.float32).reshape(rows, -1), "float64"
    raise DataError(path, where, f"'{what}' read as float32 holds values like {values[~(np.abs(values) <= 1e6)][0]:g}, "
                                 "and as float64 no plausible values either: not float32 or float64 features")


def butd_feature_rows(raw: bytes, rows: int, path, where, dim: int | None) -> tuple[np.ndarray, str]:
    """``([rows, D] float32, dtype)`` of a bottom-up record's features, written as float16, float32 or float64.
    With ``dim`` (--dim) the byte count says which. Otherwise :func:`float_rows` reads float32 or float64, and a
    payload that also reads as finite float16 values of the release's dimension (:data:`BUTD_DIM`) is float16:
    its float32 reading, of half that width, looks as plausible."""
    readings = {dtype: len(raw) // (rows * np.dtype(dtype).itemsize) for dtype in ("float16", "float32", "float64")
                if len(raw) % (rows * np.dtype(dtype).itemsize) == 0}
    if dim is not None:
        dtype = next((t for t, d in readings.items() if d == dim), None)
        if dtype is None:
            raise DataError(path, where, f"'features' holds {len(raw)} bytes: not {dim} float16, float32 or float64 "
                                         f"values (--dim {dim}) for each of {rows} rows")
        values = np.frombuffer(raw, dtype)
        if not np.isfinite(values).all() or implausible(values):
            raise DataError(path, where, f"'features' read as {dim}-d {dtype} (--dim {dim}) holds values that no "
                                         "detector writes (NaN, inf or beyond 1e6): is --dim right?")
        return values.astype(np.float32).reshape(rows, dim), dtype
    half = np.frombuffer(raw, np.float16) if readings.get("float16") == BUTD_DIM else None
    if half is not None and np.isfinite(half).all() and not implausible(half):
        return half.astype(np.float32).reshape(rows, BUTD_DIM), "float16"
    return float_rows(raw, rows, path, where, "features")


def load_size_table(path) -> dict[str, tuple[float, float]]:
    """Image id -> (width, height) from the benchmark's hw TSV, VG's image_data.json, or a COCO
    annotations JSON (``images`` with ``id``, ``width``, ``height``)."""
    with open(path, encoding="utf-8-sig", errors="replace") as f:
        head = f.read(4096).lstrip()[:1]
    if head != "{":
        return load_sizes(path)
    data = read_json(path)
    images = data.get("images") if isinstance(data, dict) else None
    if not isinstance(images, list):
        raise DataError(path, None, "a JSON object without an 'images' list (expected a COCO annotations file)")
    out = {}
    for n, image in enumerate(images):
        try:
            out[str(image["id"])] = (float(image["width"]), float(image["height"]))
        except (TypeError, KeyError, ValueError):
            raise DataError(path, f"images[{n}]", "expected 'id', 'width' and 'height'") from None
    return out


def box_extent(boxes: np.ndarray) -> tuple[float, float]:
    """The image size VLP's loader estimates: the largest x and the largest y of any box."""
    return float(np.max(boxes[:, [0, 2]])), float(np.max(boxes[:, [1, 3]]))


class Converter:
    """What every format shares: ids, image sizes, the checks of a record, the chunk writer."""

    kind = ""

    def __init__(self, args):
        self.args = args
        self.again = {}  # item -> why it is left out (--bad-records skip): its image id came before
        self.sizes = {}
        for path in args.sizes or []:
            self.sizes.update(load_size_table(path))

    def image_id(self, key: str) -> str:
        return str(key) if self.args.ids == "keep" else image_key_to_id(str(key))

    def size(self, image_id: str, boxes: np.ndarray, given=None) -> tuple[tuple[float, float], str]:
        """(width, height) and where they came from."""
        if given is not None:
            return given, "the records"
        if image_id in self.sizes:
            return self.sizes[image_id], "--sizes"
        return box_extent(boxes), "the boxes' extent"

    def regions(self, path, where, key, features, boxes, cls_prob=None, confidence=None, given_size=None,
                notes=()):
        """``(image id, checked Regions, what to count)``: the record's counts are where its size came from and
        ``notes``; a problem is a DataError naming the record."""
        image_id = self.image_id(key)
        if not image_id:
            raise DataError(path, where, "an empty image key")
        if "/" in image_id:  # an HDF5 group name cannot hold it
            raise DataError(path, where, f"the image id {image_id!r} holds a '/' (--ids auto keeps only the file name)")
        if len(boxes) == 0:
            raise DataError(path, where, "no regions")
        (width, height), source = self.size(image_id, boxes, given_size)
        regions = Regions(features, boxes, width, height, cls_prob, confidence)
        problem = region_problem(regions)
        if problem:
            raise DataError(path, where, problem)
        if self.args.dtype == "float16":
            for name, values in (("features", regions.features), ("cls_prob", regions.cls_prob)):
                if values is not None and float(np.abs(values).max()) > FLOAT16_MAX:
                    raise DataError(path, where, f"{name} hold {float(np.abs(values).max()):g}, beyond float16's "
                                                 f"range ({FLOAT16_MAX:g}): give --dtype bfloat16 or float32")
        return image_id, regions, [f"image sizes from {source}", *notes]

    def index(self) -> list:
        """Every record as a small item (its file's number and key, and where in the file it is), each
        image id once (:meth:`unique`)."""
        raise NotImplementedError

    def place(self, item) -> tuple[Path, str, str]:
        """(file, record, key) of an item of the index."""
        raise NotImplementedError

    def read(self, items: list):
        """``thunk`` per item, in order: ``thunk()`` gives ``(image_id, Regions, what to count)`` or raises
        a DataError naming the file and the record."""
        raise NotImplementedError

    def unique(self, items: list) -> list:
        """The items, refused (a DataError naming both records) when two give one image id (keys ``9``
        and ``000000000009``, ``train/1.jpg`` and ``val/1.jpg``); with ``--bad-records skip`` the later
        ones are left out where their chunk is converted, counted. Decided on the whole index, so the
        outcome does not depend on the chunks or shards."""
        first = {}
        for item in items:
            path, where, key = self.place(item)
            image_id = self.image_id(key)
            if not image_id or "/" in image_id:  # (refused by itself when it is converted)
                continue
            if image_id not in first:
                first[image_id] = f"{path}: {where}"
                continue
            problem = f"image id {image_id} again (also {first[image_id]}): an image is converted once"
            if self.args.bad_records == "error":
                raise DataError(path, where, problem + "; leave one record out, or give --bad-records skip")
            self.again[item] = problem
        return items

    def process(self, chunk: shard.Chunk) -> None:
        """Convert one chunk of records into the chunk's features file and side tables, an image at a time."""
        skipped, counts, example, dim = [], Counter(), None, None

        def converted():
            nonlocal example, dim
            for item, make in zip(chunk.items, self.read(chunk.items)):
                chunk.progress(1)
                path, record, key = self.place(item)
                try:
                    if item in self.again:
                        raise DataError(path, record, self.again[item])
                    image_id, regions, notes = make()
                    if dim is not None and regions.features.shape[1] != dim:
                        raise DataError(path, record, f"{regions.features.shape[1]}-d features, the records before {dim}-d")
                except DataError as err:
                    if self.args.bad_records == "error":
                        raise
                    skipped.append((err.path, err.record, err.problem))
                    continue
                dim = regions.features.shape[1]
                counts.update(notes)
                if image_id != str(key):
                    counts["ids mapped from their keys"] += 1
                    example = example or f"{key} -> {image_id}"
                else:
                    counts["ids kept as the keys"] += 1
                yield image_id, regions
            # the side tables go before the chunk's data file appears (it marks the chunk as done)
            rows = sorted(counts.items()) + ([(f"example: {example}", 1)] if example else [])
            shard.write_table(chunk.table("skipped.tsv"), ("file", "record", "problem"), skipped)
            shard.write_table(chunk.table("counts.tsv"), ("what", "count"), rows)

        write_features(chunk.path, converted(), self.kind, self.args.dtype)


# ---------------------------------------------------------------------------------------------
# The VLP release (HDF5): the authors' features


class VLP(Converter):
    """The images are those of the feature files; each one's boxes come from the box file and its
    class probabilities from the class file of the same three digits."""

    kind = KINDS["vlp"]

    def __init__(self, args):
        super().__init__(args)
        files = []
        for name in args.inputs:
            path = Path(name)
            if path.is_dir():
                files += sorted(p for p in path.rglob("*.h5") if p.is_file())
            elif path.is_file():
                files.append(path)
            else:
                raise DataError(path, None, "no such file or folder")
        self.feat, self.cls, boxes = [], {}, []
        for path in files:
            if FEAT_FILE.search(path.name):
                self.feat.append(path)
            elif m := CLS_FILE.search(path.name):
                self.cls.setdefault(m.group(1), []).append(path)
            else:
                boxes.append(path)
        if len(boxes) != 1:
            found = ", ".join(map(str, boxes)) or "none"
            raise DataError(args.inputs[0], None, f"expected one box file (coco_detection_vg_thresh0.2_feat_gvd_"
                                                  f"checkpoint_trainvaltest.h5) among the inputs, found {found}")
        if not self.feat:
            raise DataError(args.inputs[0], None, "no feature files (*_feat000.h5 .. *_feat999.h5) among the inputs")
        self.feat.sort(key=lambda p: (FEAT_FILE.search(p.name).group(1), str(p)))
        self.box_file = boxes[0]
        self.notes = [f"box file {self.box_file}; {len(self.feat)} feature files, "
                      f"{sum(map(len, self.cls.values()))} class-probability files"
                      + ("" if self.cls else " (none given: no class probabilities)")]

    def index(self) -> list:
        """(feature file number, key) of every image of the feature files (a key in two files: the first)."""
        items, seen, again = [], set(), 0
        for n, path in enumerate(self.feat):
            with open_h5(path, "feature file") as f:
                keys = sorted(f.keys())
            again += sum(key in seen for key in keys)
            items += [(n, key) for key in keys if key not in seen]
            seen.update(keys)
        if again:
            self.notes.append(f"{again} image(s) are in two feature files: read from the first")
        return self.unique(items)

    def place(self, item) -> tuple[Path, str, str]:
        n, key = item
        return self.feat[n], f"image {key}", key

    def read(self, items: list):
        handles = {}

        def opened(path, what):
            if path not in handles:
                handles[path] = open_h5(path, what)
            return handles[path]

        try:
            boxes_file = opened(self.box_file, "box file")
            for n, key in items:
                yield lambda n=n, key=key: self._one(opened, boxes_file, n, key, f"image {key}")
        finally:
            for handle in handles.values():
                handle.close()

    def _one(self, opened, boxes_file, n: int, key: str, where: str):
        if key not in boxes_file:
            raise DataError(self.box_file, where, f"no boxes for this image (its features are in {self.feat[n]})")
        rows = boxes_file[key][()]
        if rows.ndim != 2 or rows.shape[1] != 6 or not np.issubdtype(rows.dtype, np.number):
            raise DataError(self.box_file, where, f"box rows {rows.shape} {rows.dtype}: expected [R, 6] numbers "
                                                  "(x1, y1, x2, y2, class, confidence)")
        features = opened(self.feat[n], "feature file")[key][()]
        if features.ndim != 2 or features.shape[0] != len(rows) or not np.issubdtype(features.dtype, np.number):
            raise DataError(self.feat[n], where, f"features {features.shape} {features.dtype} do not match the "
                                                 f"{len(rows)} boxes of {self.box_file} as [R, D] numbers")
        cls_prob = None
        if self.cls:
            for path in self.cls.get(key[-3:], []):
                if key in opened(path, "class file"):
                    cls_prob = opened(path, "class file")[key][()]
                    break
            else:
                names = ", ".join(map(str, self.cls.get(key[-3:], []))) or f"no *_cls{key[-3:]}.h5 among the inputs"
                raise DataError(self.feat[n], where, f"no class probabilities for this image in {names}")
            if cls_prob.ndim != 2 or cls_prob.shape[0] != len(rows) or not np.issubdtype(cls_prob.dtype, np.number):
                raise DataError(path, where, f"class probabilities {cls_prob.shape} do not match the {len(rows)} "
                                             "boxes as [R, C] numbers")
        features = features if features.dtype in (np.float16, np.float32) else features.astype(np.float32)
        return self.regions(self.feat[n], where, key, features, rows[:, :4].astype(np.float32), cls_prob,
                            rows[:, 5].astype(np.float32))


# ---------------------------------------------------------------------------------------------
# The TSV formats: indexed by line, each line read on its own


def tsv_files(inputs) -> list[Path]:
    files = []
    for name in inputs:
        path = Path(name)
        if path.is_dir():
            files += sorted(p for p in path.iterdir() if p.is_file() and ".tsv" in p.name and not p.name.startswith("."))
        elif path.is_file():
            files.append(path)
        else:
            raise DataError(path, None, "no such file or folder")
    if not files:
        raise DataError(inputs[0], None, "no TSV file among the inputs")
    return files


def line_index(path: Path, block: int = 1 << 24) -> list[tuple[int, int]]:
    """``(byte offset, line number)`` of every non-empty line, in one streaming pass with progress lines."""
    size, out, started, shown = path.stat().st_size, [], time.time(), time.time()
    with open(path, "rb") as f:
        start, line, offset, carry = 0, 1, 0, False  # carry: the current line already has bytes
        while chunk := f.read(block):
            ends = np.flatnonzero(np.frombuffer(chunk, np.uint8) == 10) + offset
            for end in ends.tolist():
                if end > start or carry:
                    out.append((start, line))
                start, line, carry = end + 1, line + 1, False
            carry = carry or (start < offset + len(chunk))
            offset += len(chunk)
            if time.time() - shown > PROGRESS_SECONDS:
                shown = time.time()
                print(f"indexing {path}: {offset / 1e9:.1f} of {size / 1e9:.1f} GB, {len(out)} lines "
                      f"({shown - started:.0f}s)", flush=True)
        if start < offset:
            out.append((start, line))
    return out


class TSV(Converter):
    header = None  # the first field of a header line, if the format has one

    def __init__(self, args):
        super().__init__(args)
        self.files = tsv_files(args.inputs)
        self.notes = [f"{len(self.files)} TSV file(s): " + ", ".join(map(str, self.files))]

    def index(self) -> list:
        """(file number, byte offset, line number, key) of every record (not blank lines or a header)."""
        items, self.states = [], {}
        for n, path in enumerate(self.files):
            self.states[n] = read_state(path)  # (each chunk's read checks that the file is still this one)
            with open(path, "rb") as f:
                for offset, line in line_index(path):
                    f.seek(offset)
                    head = f.read(KEY_BYTES).split(b"\n", 1)[0]
                    if not head.strip():  # a blank line of a CRLF file
                        continue
                    key = head.split(b"\t", 1)[0].decode("utf-8", "replace").strip()
                    if key != self.header:
                        items.append((n, offset, line, key))
        return self.unique(items)

    def place(self, item) -> tuple[Path, str, str]:
        n, _, line, key = item
        return self.files[n], f"line {line} (image {key})" if key else f"line {line}", key

    def read(self, items: list):
        handles = {}
        try:
            for item in items:
                n, offset = item[:2]
                if n not in handles:
                    handles[n] = open(self.files[n], "rb")
                    check_unchanged(self.files[n], self.states[n])
                handles[n].seek(offset)
                text = handles[n].readline().rstrip(b"\r\n")
                path, where, _ = self.place(item)
                yield lambda path=path, where=where, text=text: self.parse(path, where, text)
        finally:
            for handle in handles.values():
                handle.close()

    def parse(self, path, where, text: bytes):
        raise NotImplementedError


class BUTD(TSV):
    """image_id, image_w, image_h, num_boxes, boxes, features (tab-separated; base64 float32)."""

    kind = KINDS["butd"]
    FIELDS = ("image_id", "image_w", "image_h", "num_boxes", "boxes", "features")
    header = FIELDS[0]

    def parse(self, path, where, text: bytes):
        fields = text.decode("utf-8", "replace").split("\t")
        if len(fields) != len(self.FIELDS):
            raise DataError(path, where, f"{len(fields)} tab-separated fields, expected {len(self.FIELDS)}: "
                                         + ", ".join(self.FIELDS))
        key = fields[0].strip()
        try:
            width, height, count = float(fields[1]), float(fields[2]), whole_number(fields[3])
        except ValueError:
            raise DataError(path, where, f"image_w, image_h, num_boxes must be numbers, got {fields[1:4]}") from None
        raw_boxes = decode_base64(fields[4], path, where, "boxes")
        raw_features = decode_base64(fields[5], path, where, "features")
        if count < 1 or len(raw_boxes) not in (16 * count, 32 * count):  # 4 float32 or float64 values a box
            raise DataError(path, where, f"num_boxes {count}, but 'boxes' holds {len(raw_boxes) // 4} values (4 a box)")
        boxes, box_type = float_rows(raw_boxes, count, path, where, "boxes", width=4)
        features, feature_type = butd_feature_rows(raw_features, count, path, where, self.args.dim)
        notes = [FLOAT64] if "float64" in (box_type, feature_type) else []
        notes.append(f"records of {features.shape[1]}-d {feature_type} features"
                     + (f" (--dim {self.args.dim})" if self.args.dim else " (the dtype read from the values and the "
                        "byte count; --dim D says it)"))
        return self.regions(path, where, key, features, boxes, given_size=(width, height), notes=notes)


class VinVL(TSV):
    """An image key, a tab, a JSON object whose ``objects`` hold rect, class, conf and a base64 feature."""

    kind = KINDS["vinvl"]

    def parse(self, path, where, text: bytes):
        key, _, body = text.decode("utf-8", "replace").partition("\t")
        if not body:
            raise DataError(path, where, "expected an image key, a tab, then a JSON object")
        try:
            record = json.loads(body)
        except json.JSONDecodeError as err:
            raise DataError(path, where, f"not valid JSON ({err.msg})") from None
        objects = record.get("objects") if isinstance(record, dict) else None
        if not isinstance(objects, list):
            raise DataError(path, where, "expected a JSON object with an 'objects' list")
        boxes, features, confidence = [], [], []
        for j, o in enumerate(objects):
            at = f"{where} objects[{j}]"
            if not isinstance(o, dict):
                raise DataError(path, at, "an object must be a JSON object")
            rect = o.get("rect")
            try:
                boxes.append([float(v) for v in rect])
                if len(boxes[-1]) != 4:
                    raise ValueError
            except (TypeError, ValueError):
                raise DataError(path, at, f"'rect' must be four numbers [x1, y1, x2, y2], got {rect!r}") from None
            if "feature" not in o:
                raise DataError(path, at, "no 'feature' (the benchmark writes it with TEST.OUTPUT_FEATURE True)")
            features.append(decode_base64(o["feature"], path, at, "feature"))
            if len(features[-1]) != len(features[0]):
                raise DataError(path, at, f"a {len(features[-1]) // 4}-d feature, objects[0]'s is "
                                          f"{len(features[0]) // 4}-d (as float32)")
            conf = o.get("conf", 1.0)
            if isinstance(conf, bool) or not isinstance(conf, (int, float)) or not math.isfinite(conf):
                raise DataError(path, at, f"'conf' must be a number, got {conf!r}")
            confidence.append(float(conf))
        given = None
        if isinstance(record.get("image_w"), (int, float)) and isinstance(record.get("image_h"), (int, float)):
            given = (float(record["image_w"]), float(record["image_h"]))
        if not objects:
            raise DataError(path, where, "no objects")
        values, value_type = float_rows(b"".join(features), len(features), path, where, "feature")
        return self.regions(path, where, key, values, np.asarray(boxes, np.float32), confidence=np.asarray(confidence,
                            np.float32), given_size=given, notes=[FLOAT64] * (value_type == "float64"))


class OwnFile(Converter):
    """A region-feature file of ours, image by image (its ids, sizes and kind kept): another ``--dtype``."""

    def __init__(self, args):
        from clid.data.store import FeatureStore

        super().__init__(args)
        args.ids = "keep"
        try:
            self.store = FeatureStore(args.inputs[0])
        except FileNotFoundError:
            raise DataError(args.inputs[0], None, "file not found") from None
        self.kind = self.store.kind or "unrecorded"
        self.notes = [f"{args.inputs[0]}: '{self.kind}' features, {self.store.feature_dim()}-d, stored as "
                      f"{self.store.dtype}; rewritten as {args.dtype}"]

    def index(self) -> list:
        return self.store.ids()

    def place(self, item) -> tuple[Path, str, str]:
        return Path(self.store.path), f"image {item}", item

    def read(self, items: list):
        return [lambda item=item: self.one(item) for item in items]

    def one(self, image_id: str):
        r = self.store.get(image_id)
        return self.regions(self.store.path, f"image {image_id}", image_id, r.features, r.boxes, r.cls_prob,
                            r.confidence, given_size=(r.width, r.height))


CONVERTERS = {"vlp": VLP, "butd": BUTD, "vinvl": VinVL, "clid": OwnFile}


# ---------------------------------------------------------------------------------------------
# The command


def summary(out: Path) -> list[str]:
    """What the finished file holds, how ids were mapped and where sizes came from (from its side tables)."""
    from clid.data.store import FeatureStore

    counts = Counter()
    for what, count in shard.read_table(shard.side_path(out, "counts.tsv")):
        counts[what] += int(count)
    store = FeatureStore(out)
    classes = store.num_classes()
    lines = [f"wrote the region features of {len(store)} images to {out}: '{store.kind}', {store.feature_dim()}-d, {store.dtype}"
             + (f", class probabilities of {classes} classes" if classes else "")]
    store.close()
    examples = [what.split(": ", 1)[1] for what in sorted(counts) if what.startswith("example: ")]
    mapped, kept = counts["ids mapped from their keys"], counts["ids kept as the keys"]
    lines.append(f"ids: {mapped} mapped from their keys" + (f" (e.g. {examples[0]})" if examples else "")
                 + f", {kept} kept as the keys")
    sources = [f"{what[len('image sizes from '):]} ({n})" for what, n in sorted(counts.items())
               if what.startswith("image sizes from ")]
    lines.append("image sizes from " + ", ".join(sources))
    if counts[FLOAT64]:
        lines.append(f"{counts[FLOAT64]} {FLOAT64}")
    lines += [f"{n} {what}" for what, n in sorted(counts.items()) if what.startswith("records of ") and what != FLOAT64]
    skipped = shard.read_table(shard.side_path(out, "skipped.tsv"))
    if skipped:
        lines.append(f"skipped {len(skipped)} malformed record(s), listed in {shard.side_path(out, 'skipped.tsv')}; "
                     f"first: {skipped[0][0]}: {skipped[0][1]}: {skipped[0][2]}")
    return lines
