"""The region-feature file: checked reads (FeatureStore), writes, the model's region inputs (RegionCache),
and the check that a checkpoint reads the kind of features it was trained on (check_features_match).

The file records what its features are as two root attributes: ``feature_kind`` (a short name:
``clid-encoder`` for ``python -m clid.features`` and the demo, ``vlp-fc6``, ``butd``, ``vinvl`` for
the converted releases) and ``feature_dim``. A file written before they existed has neither and is
read as before; only its dimension can then be checked.

The features and class probabilities are stored as float32, float16 (HDF5's own half type) or bfloat16,
which HDF5 lacks: a bfloat16 dataset is uint16 (the upper half of each float32's bits) with the attribute
``dtype`` = ``bfloat16``. A third root attribute, ``feature_dtype``, names the one used. Every reader gets
float32 (:meth:`FeatureStore.get`); :class:`RegionCache` keeps the features in the stored type, so a half
file also halves what the cache holds of them.
"""
from __future__ import annotations

import argparse
import math
import numbers
import os
import re
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import h5py
import numpy as np

from clid.base.files import (
    DataError,
    check_image_groups,
    check_unchanged,
    name_problem,
    natural_key,
    open_h5,
    read_state,
    write_h5_groups,
)
from clid.data.region_inputs import region_inputs

if TYPE_CHECKING:  # (torch is imported where it is used: importing this module leaves it out, for --help)
    import torch

FEATURE_DTYPES = ("float32", "float16", "bfloat16")  # how the features and class probabilities may be stored


def torch_dtype(name: str):
    """The torch dtype of a stored features dtype (one of FEATURE_DTYPES)."""
    import torch

    return getattr(torch, name)


def encode_values(values: np.ndarray, dtype: str) -> tuple[np.ndarray, dict]:
    """(array to store, its dataset attributes) of float values in ``dtype`` (one of FEATURE_DTYPES); bfloat16
    is rounded to the nearest (ties to even) and stored as uint16 with the attribute dtype = bfloat16."""
    values = np.asarray(values, np.float32)
    if dtype == "bfloat16":
        bits = values.view(np.uint32).astype(np.uint64)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        return rounded.astype(np.uint16), {"dtype": "bfloat16"}
    return values.astype(dtype), {}


def stored_dtype(dataset) -> str:
    """The FEATURE_DTYPES name of a features dataset as stored (float32 for float64 and other types)."""
    dtype = dataset.dtype.newbyteorder("=")  # (either byte order)
    if dtype == np.uint16 and dataset.attrs.get("dtype") in ("bfloat16", b"bfloat16"):
        return "bfloat16"
    return "float16" if dtype == np.float16 else "float32"


def native(values: np.ndarray) -> np.ndarray:
    """The array in this machine's byte order (a file written big-endian is read as any other)."""
    return values if values.dtype.isnative else values.astype(values.dtype.newbyteorder("="))


def decode_values(dataset, path, where: str) -> np.ndarray:
    """A stored features or class-probabilities dataset as float32 (a bfloat16 one decoded)."""
    values = native(dataset[()])
    tag = dataset.attrs.get("dtype")
    if tag is not None:
        tag = tag.decode() if isinstance(tag, bytes) else str(tag)
        if tag != "bfloat16" or values.dtype != np.uint16:
            raise DataError(path, where, f"'{dataset.name.rsplit('/', 1)[-1]}' is {values.dtype} with the attribute "
                                         f"dtype = {tag!r}: only bfloat16, stored as uint16, is known")
        return (values.astype(np.uint32) << 16).view(np.float32)
    if values.dtype == np.float16:  # (exact either way; torch's conversion is vectorised, numpy's is not: 10x)
        import torch

        return torch.from_numpy(values).float().numpy()
    return values.astype(np.float32) if values.dtype == np.float64 else values


def pad_regions(items: list[tuple[torch.Tensor, torch.Tensor]], dtype=None):
    """Stack per-image (features [R, D], box inputs [R, 6+C]) into padded [B, Rmax, .] + mask [B, Rmax]
    (``dtype``: float32 unless given)."""
    import torch

    dtype = dtype or torch.float32
    R = max(f.shape[0] for f, _ in items)
    B = len(items)
    feats = torch.empty(B, R, items[0][0].shape[1], dtype=dtype)  # (written once: each row's regions, then zeros)
    pos = torch.empty(B, R, items[0][1].shape[1], dtype=dtype)
    mask = torch.zeros(B, R, dtype=torch.bool)
    for i, (f, p) in enumerate(items):
        n = f.shape[0]
        feats[i, :n], pos[i, :n] = f, p
        feats[i, n:], pos[i, n:] = 0, 0
        mask[i, :n] = True
    return feats, pos, mask


def load_regions(features: FeatureStore, image_id, num_classes: int = 0, box_input: str = "authors",
                 dtype=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(features [R, D] in ``dtype``, region position inputs [R, 6 + num_classes]) of one image, the box input
    built as ``box_input`` says (:func:`clid.data.region_inputs.region_inputs`); ``num_classes`` > 0 appends the
    file's ``cls_prob``, which must be that wide."""
    r = features.get(image_id)
    if num_classes and (r.cls_prob is None or r.cls_prob.shape[1] != num_classes):
        found = "no cls_prob" if r.cls_prob is None else f"cls_prob of {r.cls_prob.shape[1]} classes"
        raise DataError(features.path, f"image {image_id}",
                        f"{found}, but the model reads {num_classes} class probabilities per region")
    pos = region_inputs(r.boxes, r.width, r.height, r.cls_prob if num_classes else None, r.confidence, box_input)
    import torch

    return torch.as_tensor(r.features).to(dtype or torch.float32), pos


class RegionCache:
    """Region inputs (features, 6-d boxes plus ``num_classes`` class probabilities) per image id, read
    from the HDF5 and the latest ``max_bytes`` of them kept in memory, the least recently used given up
    first (``cache=False``: read every time). ``for_model`` takes the first two settings from a model's
    config. The features are kept as the file stores them (float16 or bfloat16: half the bytes) and come out
    of :meth:`batch` as float32; ``reads`` counts the images read from the file.
    """

    MAX_BYTES = 4 << 30  # about 2,900 images of the VLP release (100 regions of 2,048 + 6 + 1,601 floats)

    def __init__(self, features: FeatureStore, num_classes: int = 0, box_input: str = "authors", cache: bool = True,
                 max_bytes: int = MAX_BYTES):
        self.features = features
        self.num_classes = num_classes
        self.box_input = box_input
        self.cache = cache
        self.max_bytes = max_bytes
        self._cache: OrderedDict[str, tuple[torch.Tensor, torch.Tensor]] = OrderedDict()
        self._bytes = 0
        self.reads = 0
        self.dtype = torch_dtype(features.dtype)
        self.complete = False  # every image a run reads is kept (:meth:`preload`)

    @classmethod
    def for_model(cls, features: FeatureStore, config, max_bytes: int = MAX_BYTES) -> "RegionCache":
        """The region inputs a model of this :class:`CaptionerConfig` reads."""
        return cls(features, config.num_classes, config.box_input, max_bytes=max_bytes)

    def get(self, image_id: str):
        item = self._cache.get(image_id)
        if item is not None:
            self._cache.move_to_end(image_id)
            return item
        item = load_regions(self.features, image_id, self.num_classes, self.box_input, self.dtype)
        self.reads += 1
        if self.cache:
            self._cache[image_id] = item
            self._bytes += _nbytes(item)
            while self._bytes > self.max_bytes and len(self._cache) > 1:
                _, dropped = self._cache.popitem(last=False)
                self._bytes -= _nbytes(dropped)
        return item

    def batch(self, image_ids: list[str]):
        return pad_regions([self.get(i) for i in image_ids])

    def estimate(self, image_ids, sample: int = 16) -> int:
        """Bytes the region inputs of ``image_ids`` would take here (from a few of them, read and kept)."""
        ids = sorted(set(map(str, image_ids)))
        if not ids:
            return 0
        some = [ids[k] for k in np.linspace(0, len(ids) - 1, min(sample, len(ids))).astype(int)]
        return int(np.mean([_nbytes(self.get(i)) for i in some]) * len(ids))

    def preload(self, image_ids) -> bool:
        """Read every image of ``image_ids`` now, if their estimate fits in ``max_bytes``: then the cache is
        complete, and loader processes forked after it read from its memory (shared until written), not from
        the file. Returns whether it did."""
        ids = sorted(set(map(str, image_ids)))
        if not self.cache or self.estimate(ids) > self.max_bytes:
            return False
        for image_id in ids:
            self.get(image_id)
        self.complete = all(image_id in self._cache for image_id in ids)
        return self.complete

    def describe(self) -> str:
        """One line: what the cache holds and may hold."""
        return (f"region cache: {len(self._cache)} images, {self._bytes / (1 << 30):.2f} of {self.max_bytes / (1 << 30):.2f} "
                f"GiB ({self.features.dtype} features); {self.reads} reads from {self.features.path}")


# ---------------------------------------------------------------------------------------------
# --region-cache: how much memory the region inputs may keep

CACHE_SHARE = 0.5  # auto: this share of the memory the node (or the job's cgroup) has free, split over its ranks
SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def memory_bytes() -> tuple[int, int]:
    """(the memory this process may still use, the node's total): MemAvailable and MemTotal, bounded by the
    job's cgroup limit (what SLURM gives a job) where there is one."""
    info = {}
    with open("/proc/meminfo") as f:
        for line in f:
            name, value = line.split(":", 1)
            info[name] = int(value.split()[0]) * 1024
    available, total = info.get("MemAvailable", info["MemFree"]), info["MemTotal"]
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text())
        if limit != "max":
            available, total = min(available, int(limit) - used), min(total, int(limit))
    except (OSError, ValueError):
        pass
    return max(0, available), total


def region_cache_size(text: str):
    """argparse type of --region-cache: "auto", or a size such as 512M, 4G (K, M, G, T: powers of 1024; a
    plain number is bytes), at least 1M and at most the node's memory."""
    if text == "auto":
        return text
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?", text.strip(), re.I)
    if not match:
        raise argparse.ArgumentTypeError(f"must be auto or a size such as 512M or 4G, got {text!r}")
    size = int(float(match.group(1)) * SIZE_UNITS[match.group(2).upper()])
    if size < SIZE_UNITS["M"]:
        raise argparse.ArgumentTypeError(f"must be at least 1M (a cache that holds no image reads every one from the "
                                         f"file), got {text!r}")
    total = memory_bytes()[1]
    if size > total:
        raise argparse.ArgumentTypeError(f"{text} is more than this node's memory ({total / (1 << 30):.1f} GiB)")
    return size


def cache_bytes(setting) -> int:
    """The bytes a RegionCache may keep for --region-cache ``setting``: the size given, or (auto)
    :data:`CACHE_SHARE` of the free memory, split over the node's ranks (``LOCAL_WORLD_SIZE``)."""
    if setting != "auto":
        return int(setting)
    ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
    return max(SIZE_UNITS["M"], int(CACHE_SHARE * memory_bytes()[0] / ranks))


def add_region_cache_arg(parser) -> None:
    """The ``--region-cache`` flag of the stages that read region features many times (04, 05, 06)."""
    parser.add_argument("--region-cache", type=region_cache_size, default="auto", metavar="auto|SIZE",
                        help="memory for the region inputs read from --features (K, M, G, T; e.g. 512M, 16G): "
                             f"auto: {CACHE_SHARE * 100:.0f}%% of the memory the node or the job has free, split over the "
                             "node's processes. When the features fit, each image is read from the file once")


def _nbytes(tensors) -> int:
    return sum(t.element_size() * t.nelement() for t in tensors)


def write_features(path, items, kind: str, dtype: str = "float32") -> int:
    """Write ``(image_id, Regions)`` pairs as the region-feature file (atomically), with the root
    attributes ``feature_kind`` = ``kind``, ``feature_dim`` (the features' width, the same for
    every image) and ``feature_dtype`` = ``dtype``, the type the features and class probabilities are
    stored in (:data:`FEATURE_DTYPES`). Returns the number of images written."""
    if dtype not in FEATURE_DTYPES:
        raise ValueError(f"dtype must be one of {FEATURE_DTYPES}, got {dtype!r}")
    root = {"feature_kind": kind, "feature_dim": None, "feature_dtype": dtype}

    def groups():
        for image_id, r in items:
            dim = int(np.shape(r.features)[1])
            if root["feature_dim"] is None:
                root["feature_dim"] = dim
            elif dim != root["feature_dim"]:
                raise ValueError(f"image {image_id}: {dim}-d features, the images before {root['feature_dim']}-d")
            datasets = {"features": encode_values(r.features, dtype), "boxes": r.boxes}  # ((array, attributes))
            if r.cls_prob is not None:
                datasets["cls_prob"] = encode_values(r.cls_prob, dtype)
            if r.confidence is not None:
                datasets["confidence"] = r.confidence
            yield str(image_id), datasets, {"width": r.width, "height": r.height}

    return write_h5_groups(path, groups(), root_attrs=root)


@dataclass
class Regions:
    """Region features of one image. ``boxes`` are x1, y1, x2, y2 in pixels."""

    features: np.ndarray  # [R, D] float
    boxes: np.ndarray  # [R, 4] float
    width: float
    height: float
    cls_prob: np.ndarray | None = None  # [R, C] or None
    confidence: np.ndarray | None = None  # [R] the detector's confidence per region, or None

    def __post_init__(self):
        """Lists (or tensors) of numbers become float32 arrays, the sides floats; anything else is a
        TypeError naming the field."""
        for name in ("width", "height"):
            value = getattr(self, name)
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
                raise TypeError(f"Regions.{name} must be a number of pixels, got {type(value).__name__}")
            setattr(self, name, float(value))
        for name in ("features", "boxes", "cls_prob", "confidence"):
            value = getattr(self, name)
            if value is None or isinstance(value, np.ndarray):
                continue
            try:
                setattr(self, name, np.asarray(value, dtype=np.float32))
            except (TypeError, ValueError):
                raise TypeError(f"Regions.{name} must be an array (or nested lists) of numbers, got "
                                f"{type(value).__name__}") from None


BAD_FEATURES = ("error", "skip")

# The most regions one image may have. Bottom-up features have 10-100 per image and a VG graph a few
# dozen boxes; every attention layer costs (regions + text) squared, so an image with thousands of
# regions would hold up a whole batch for minutes (05 scores each caption in one pass per token).
MAX_REGIONS = 1000


NEGATIVE_TOLERANCE = 0.5  # pixels a coordinate may lie below 0 (rounding); detectors clip boxes at 0


def box_tolerance(side: float) -> float:
    """How far (pixels) a box may reach past the image's edge: 1 pixel plus 1% of the side, for
    detectors that round or clip boxes to ``side`` instead of ``side - 1``."""
    return 1.0 + 0.01 * side


def _first_nonfinite(values: np.ndarray) -> str | None:
    """'NaN at region r (column c)' / 'inf at ...' for the first non-finite entry of an [R, .] array."""
    bad = ~np.isfinite(values)
    if not bad.any():
        return None
    r, c = (int(i) for i in np.argwhere(bad)[0])
    return f"{'NaN' if np.isnan(values[r, c]) else 'inf'} at region {r} (column {c})"


def region_problem(regions: Regions, dim: int | None = None, num_classes: int | None = None) -> str | None:
    """What is wrong with one image's regions, or None. Checked: shapes ([R, D] features with R >= 1
    and D = ``dim``, [R, 4] boxes, [R, C] cls_prob with C = ``num_classes``), every value finite, a
    positive width and height, at most MAX_REGIONS regions, and every box inside the image (x1 <= x2,
    y1 <= y2, coordinates >= 0 up to rounding, up to :func:`box_tolerance` past the far edges): a NaN,
    an inf or a zero width would poison a whole run, and a reversed or negative box says the file's
    boxes are not x1, y1, x2, y2 in pixels."""
    features, boxes, cls_prob, confidence = regions.features, regions.boxes, regions.cls_prob, regions.confidence
    for name, array in (("features", features), ("boxes", boxes), ("cls_prob", cls_prob), ("confidence", confidence)):
        if array is not None and not (np.issubdtype(array.dtype, np.number) or array.dtype == bool):
            return f"'{name}' holds {array.dtype}, not numbers"
    if features.ndim != 2 or features.shape[0] < 1 or features.shape[1] < 1:
        return f"features {features.shape} is not [R, D] with at least one region"
    if features.shape[0] > MAX_REGIONS:
        return f"{features.shape[0]} regions; at most {MAX_REGIONS} per image are read (bottom-up features have 10-100)"
    if dim is not None and features.shape[1] != dim:
        return f"features {features.shape} have {features.shape[1]} columns, the file's other images {dim}"
    if boxes.shape != (features.shape[0], 4):
        return f"features {features.shape} and boxes {boxes.shape} do not match as [R, D], [R, 4]"
    if cls_prob is not None:
        if cls_prob.ndim != 2 or cls_prob.shape[0] != features.shape[0]:
            return f"cls_prob {cls_prob.shape} does not match features {features.shape} as [R, C]"
        if num_classes and cls_prob.shape[1] != num_classes:
            return f"cls_prob {cls_prob.shape} has {cls_prob.shape[1]} classes, the file's other images {num_classes}"
    if confidence is not None and confidence.shape != (features.shape[0],):
        return f"confidence {confidence.shape} does not match features {features.shape} as [R]"
    for name, array in (("features", features), ("boxes", boxes), ("cls_prob", cls_prob),
                        ("confidence", None if confidence is None else confidence[:, None])):
        where = None if array is None else _first_nonfinite(np.asarray(array))
        if where:
            return f"{name}: {where}"
    for name, side in (("width", regions.width), ("height", regions.height)):
        if not (math.isfinite(side) and side > 0):
            return f"{name} is {side}; it must be a positive number of pixels"
    tx, ty = box_tolerance(regions.width), box_tolerance(regions.height)
    x1, y1, x2, y2 = (boxes[:, k].astype(np.float64) for k in range(4))
    reversed_ = (x2 < x1) | (y2 < y1)
    if reversed_.any():
        r = int(np.argmax(reversed_))
        box = ", ".join(f"{v:g}" for v in boxes[r])
        return (f"box of region {r} (x1, y1, x2, y2 = {box}) ends before it starts: boxes are x1, y1, x2, y2 "
                "in pixels (are these x, y, width, height?)")
    outside = ((x1 < -NEGATIVE_TOLERANCE) | (y1 < -NEGATIVE_TOLERANCE) | (x2 > regions.width + tx)
               | (y2 > regions.height + ty))
    if outside.any():
        r = int(np.argmax(outside))
        box = ", ".join(f"{v:g}" for v in boxes[r])
        return (f"box of region {r} (x1, y1, x2, y2 = {box}) is not inside the "
                f"{regions.width:g} x {regions.height:g} image")
    return None


def add_bad_features_arg(parser) -> None:
    """The ``--bad-features`` flag of the stages that read region features (04, 05, 06, 07)."""
    parser.add_argument("--bad-features", choices=BAD_FEATURES, default="error",
                        help="an image whose region features hold NaN/inf, a box outside the image, a width or "
                             "height of 0 or mismatched shapes: error (stop, naming the file and the image) or "
                             "skip (leave the image out, counted and reported)")


NOT_A_GROUP = "is a dataset, not a group (features, boxes, width, height)"


class FeatureStore:
    """Read-only access to the region-feature HDF5 (one group per image id).

    Every image is checked the first time it is read, and the verdict kept (:func:`region_problem`:
    shapes, finite values, a positive image size, boxes inside the image). ``bad="error"`` (the
    default): reading a bad image raises a DataError naming the file and the image. ``bad="skip"``:
    a bad image counts as absent (``image_id in store`` reads and checks it and is False) and is
    recorded in :attr:`bad_images`, which :meth:`skip_report` sums up.
    """

    def __init__(self, path, bad: str = "error"):
        if bad not in BAD_FEATURES:
            raise ValueError(f"bad must be one of {BAD_FEATURES}, got {bad!r}")
        self.path = str(path)
        self.bad = bad
        if not Path(self.path).exists():
            raise FileNotFoundError(f"{self.path}: feature file not found")
        if Path(self.path).is_dir():
            raise DataError(self.path, None, "is a folder, not a region-feature file: python -m clid.features --images "
                                             f"{self.path} --boxes grid 4 --out FILE.h5 makes one of its images")
        self.state = read_state(self.path)  # (a process that opens the file again reads this very file: reopened)
        self._file = open_h5(self.path, "feature file")
        if not len(self._file):
            raise DataError(self.path, None, "holds no image (expected one group per image id)")
        check_image_groups(self._file, self.path, "region-feature")
        self._verdicts: dict[str, str | None] = {}  # image id -> its problem (None: good)
        for key in self.entries_not_groups():  # (found now, not when the image is first read, hours in)
            if bad == "error":
                raise DataError(self.path, f"image {key}", f"{NOT_A_GROUP}: the file's layout is wrong for this "
                                                           "image; rewrite it, or give --bad-features skip")
            self._verdicts[key] = NOT_A_GROUP
        self._shape: tuple[int, int] | None = None  # (D, C) of the file's first well-formed image
        self._dtype = "float32"  # how that image's features are stored (FEATURE_DTYPES)
        kind = self._file.attrs.get("feature_kind")
        #: what the features are (``feature_kind``), or None for a file written before it was recorded
        self.kind = (kind.decode() if isinstance(kind, bytes) else str(kind)) if kind is not None else None
        dim = self._file.attrs.get("feature_dim")
        try:
            self._recorded_dim = None if dim is None else int(dim)
        except (TypeError, ValueError):
            raise DataError(self.path, "attribute 'feature_dim'", f"{dim!r} is not a whole number") from None
        self._file_shape()  # (a file with no features at all is refused now)


    def reopened(self) -> "FeatureStore":
        """The same file opened again (by a loader process: an HDF5 handle must not cross a fork); a file
        replaced or rewritten since this one was opened is refused, so that a run never mixes two files."""
        self.check_unchanged()
        return FeatureStore(self.path, bad=self.bad)

    def check_unchanged(self) -> None:
        """Refuse the file (a DataError) when it was replaced or rewritten since it was opened: called before
        a stage writes what it computed from the features (a chunk, a checkpoint, captions)."""
        check_unchanged(self.path, self.state)

    def entries_not_groups(self) -> list[str]:
        """The file's top-level entries that are not groups (one link lookup each, no object opened: about a
        second for COCO's 123,287 images)."""
        root = self._file.id
        return [name for name in self._file.keys() if h5py.h5g.get_objinfo(root, name.encode()).type != h5py.h5g.GROUP]

    def __contains__(self, image_id) -> bool:
        key = str(image_id)
        if not self.holds(key):
            return False
        return self.bad == "error" or self.problem(key) is None

    def __len__(self) -> int:
        return len(self._file)

    def holds(self, image_id) -> bool:
        """Whether the file has a group for this image (not read or checked: see ``in``). An id that is no group
        name of its own ("a/b", ".", "..": clid.base.files.name_problem) has none: HDF5 would read it as a path."""
        return name_problem(image_id) is None and str(image_id) in self._file

    def ids(self) -> list[str]:
        return sorted(self._file.keys(), key=natural_key)

    def _file_shape(self) -> tuple[int, int]:
        """(D, C) of the first image whose features are [R, D] (C = 0 without cls_prob): what every
        other image must match. Only shapes are read."""
        if self._shape is None:
            for key, group in self._file.items():
                f = group.get("features") if isinstance(group, h5py.Group) else None
                if isinstance(f, h5py.Dataset) and len(f.shape) == 2 and f.shape[0] >= 1 and f.shape[1] >= 1:
                    c = group.get("cls_prob")
                    c = c if isinstance(c, h5py.Dataset) else None
                    self._shape = (int(f.shape[1]), int(c.shape[1]) if c is not None and len(c.shape) == 2 else 0)
                    self._dtype = stored_dtype(f)
                    break
            else:
                maps = any(isinstance(g, h5py.Group) and "map" in g for g in self._file.values())
                raise DataError(self.path, None, "no image group holds a [R, D] 'features' dataset"
                                + (" (its groups hold 'map': a saliency file?)" if maps else ""))
            if self._recorded_dim is not None and self._recorded_dim != self._shape[0]:
                raise DataError(self.path, "attribute 'feature_dim'", f"says {self._recorded_dim}, but the features "
                                                                      f"of image {key} are {self._shape[0]}-d")
        return self._shape

    def feature_dim(self) -> int:
        return self._file_shape()[0]

    @property
    def dtype(self) -> str:
        """How the features are stored: float32, float16 or bfloat16 (:data:`FEATURE_DTYPES`); read as float32."""
        self._file_shape()
        return self._dtype

    def num_classes(self) -> int:
        """Width of the per-region class probabilities ``cls_prob`` (0 when the file has none)."""
        return self._file_shape()[1]

    def _read(self, key: str) -> Regions:
        """The stored arrays of one image; a missing dataset or attribute is a DataError."""
        group = self._file[key]
        if not isinstance(group, h5py.Group):
            raise DataError(self.path, f"image {key}", NOT_A_GROUP)
        where = f"image {key}"
        found = {}  # (each dataset looked up once: a lookup costs about as much as a small read)
        for name in ("features", "boxes", "cls_prob", "confidence"):
            found[name] = group.get(name)
            if found[name] is None:
                if name in ("cls_prob", "confidence"):
                    continue
                raise DataError(self.path, where, f"missing dataset '{name}'")
            if not isinstance(found[name], h5py.Dataset):
                raise DataError(self.path, where, f"'{name}' is a group, not a dataset")
        sides = []
        for name in ("width", "height"):
            value = group.attrs.get(name)
            if value is None:
                raise DataError(self.path, where, f"missing attribute '{name}'")
            try:
                if np.ndim(value) != 0 or isinstance(value, (str, bytes)):
                    raise TypeError
                sides.append(float(value))
            except (TypeError, ValueError):
                raise DataError(self.path, where, f"{name} {value!r} is not a number") from None
        cls_prob = None if found["cls_prob"] is None else decode_values(found["cls_prob"], self.path, where)
        confidence = None if found["confidence"] is None else native(found["confidence"][()])
        return Regions(decode_values(found["features"], self.path, where), native(found["boxes"][()]), sides[0], sides[1],
                       cls_prob, confidence)

    def problem(self, image_id) -> str | None:
        """What is wrong with this image's regions (None if nothing); checked once, then remembered."""
        key = str(image_id)
        if key not in self._verdicts:
            try:
                self._verdicts[key] = region_problem(self._read(key), *self._file_shape())
            except DataError as err:
                self._verdicts[key] = err.problem
        return self._verdicts[key]

    @property
    def bad_images(self) -> dict[str, str]:
        """The images found bad so far: image id -> what is wrong."""
        return {key: problem for key, problem in self._verdicts.items() if problem is not None}

    def skip_report(self) -> str | None:
        """One line on the images skipped as bad (``bad="skip"``), or None if there were none."""
        bad = self.bad_images
        if self.bad != "skip" or not bad:
            return None
        first = min(bad, key=natural_key)
        return (f"{self.path}: skipped {len(bad)} image(s) with bad region features (--bad-features skip); "
                f"first: image {first}: {bad[first]}")

    def get(self, image_id) -> Regions:
        key = str(image_id)
        if not self.holds(key):
            raise DataError(self.path, f"image {key}", "no region features for this image")
        regions = self._read(key)
        if key not in self._verdicts:
            self._verdicts[key] = region_problem(regions, *self._file_shape())
        if self._verdicts[key] is not None:
            raise DataError(self.path, f"image {key}", self._verdicts[key])
        regions.boxes = regions.boxes.astype(np.float32)
        return regions

    def close(self) -> None:
        self._file.close()


def describe_features(kind: str | None, dim) -> str:
    """"'butd' features of 2048 dimensions", or "features of unrecorded kind of ..." for older files."""
    what = f"'{kind}' features" if kind else "features of unrecorded kind"
    return f"{what} of {dim if dim is not None else 'unrecorded'} dimensions"


def check_features_match(config: dict, store: FeatureStore, checkpoint_path) -> None:
    """Raise a DataError when ``store`` holds another kind or dimension of features than the
    checkpoint at ``checkpoint_path`` was trained on, naming both kinds and both dimensions.

    ``config`` is the checkpoint's ``config.json`` as a dict (``clid.model.checkpoints.read_config``):
    the kind and dimension it records at its top level as ``feature_kind``/``feature_dim``, else the
    model's ``region_dim`` (its ``model`` part alone works too). A checkpoint or features file written
    before kinds were recorded is checked on the dimension only.
    """
    model = config.get("model") if isinstance(config.get("model"), dict) else config
    want_kind = config.get("feature_kind", model.get("feature_kind"))
    want_dim = config.get("feature_dim", model.get("region_dim"))
    have_kind, have_dim = store.kind, store.feature_dim()
    if isinstance(want_dim, bool) or not isinstance(want_dim, int):
        want_dim = None  # (a damaged config: loading the checkpoint says what is wrong)
    other_kind = bool(want_kind and have_kind and want_kind != have_kind)
    other_dim = want_dim is not None and want_dim != have_dim
    if other_kind or other_dim:
        raise DataError(store.path, None, f"holds {describe_features(have_kind, have_dim)}, but the checkpoint "
                                          f"{checkpoint_path} was trained on {describe_features(want_kind, want_dim)}; "
                                          "give the features it was trained on (or a checkpoint trained on these)")
