"""Small releases of region features in the formats `python -m clid.features convert` reads, written
from their documented layouts (three images each), with the arrays they hold for the tests to compare.

- VLP (the authors' dataloader, LaBERT's ``dataset.py``): ``feat_cls_1000/coco_detection_vg_100dets_gvd_
  checkpoint_trainval_feat{NNN}.h5`` and ``..._cls{NNN}.h5`` hold one dataset per image key (the file-name
  stem, NNN its last three digits): [R, 2048] fc6 features and [R, 1601] class probabilities; the box file
  ``coco_detection_vg_thresh0.2_feat_gvd_checkpoint_trainvaltest.h5`` holds [R, 6] rows x1, y1, x2, y2,
  class, confidence (pixels) per key, also for images without features (COCO test2014).
- bottom-up-attention TSV: image_id, image_w, image_h, num_boxes, boxes, features; tab-separated, no
  header, boxes and features base64 of float32 arrays.
- Scene Graph Benchmark / VinVL: an image key, a tab, a JSON object with ``objects`` (rect, class, conf,
  feature: base64 float32), sizes in the benchmark's hw TSV (key, tab, [{"height", "width"}]).
"""
from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np

VLP_KEYS = ["COCO_val2014_000000391895", "COCO_train2014_000000000009", "COCO_val2014_000000522418"]
PREFIX = "coco_detection_vg_100dets_gvd_checkpoint_trainval"
BOX_FILE = "coco_detection_vg_thresh0.2_feat_gvd_checkpoint_trainvaltest.h5"


def detections(rng, n: int, width: float, height: float) -> np.ndarray:
    """[n, 6] rows x1, y1, x2, y2, class, confidence inside a width x height image."""
    x1 = rng.uniform(0, width / 2, n)
    y1 = rng.uniform(0, height / 2, n)
    x2 = x1 + rng.uniform(5, width / 2, n)
    y2 = y1 + rng.uniform(5, height / 2, n)
    rows = np.stack([x1, y1, x2, y2, rng.integers(1, 1601, n), rng.uniform(0.2, 1.0, n)], axis=1)
    rows[0, 2], rows[1, 3] = width, height  # boxes that reach the right and the bottom edge
    return rows.astype(np.float32)


def write_vlp(root: Path, regions: int = 10, dim: int = 2048, classes: int = 1601, seed: int = 0) -> dict:
    """The VLP layout under ``root`` (``region_feat_gvd_wo_bgd/``); returns key -> (features, cls, rows)."""
    import h5py

    rng = np.random.default_rng(seed)
    folder = root / "region_feat_gvd_wo_bgd"
    (folder / "feat_cls_1000").mkdir(parents=True, exist_ok=True)
    truth = {}
    for n, key in enumerate(VLP_KEYS):
        rows = detections(rng, regions, 640.0 - 40 * n, 480.0 - 20 * n)
        features = rng.normal(size=(regions, dim)).astype(np.float32)
        cls = rng.dirichlet(np.ones(classes), size=regions).astype(np.float32)
        truth[key] = (features, cls, rows)
        for kind, value in (("feat", features), ("cls", cls)):
            with h5py.File(folder / "feat_cls_1000" / f"{PREFIX}_{kind}{key[-3:]}.h5", "a") as f:
                f.create_dataset(key, data=value)
    with h5py.File(folder / BOX_FILE, "w") as f:
        for key, (_, _, rows) in truth.items():
            f.create_dataset(key, data=rows)
        f.create_dataset("COCO_test2014_000000000001", data=detections(rng, regions, 640.0, 480.0))
    return truth


def b64(array: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(array, dtype=np.float32).tobytes()).decode("ascii")


BUTD_IDS = [391895, 9, 522418]


def butd_line(image_id, width, height, boxes, features) -> str:
    return "\t".join([str(image_id), str(width), str(height), str(len(boxes)), b64(boxes), b64(features)])


def write_butd(path: Path, dim: int = 2048, seed: int = 1) -> dict:
    """A bottom-up TSV of three images (36, 10 and 12 boxes); returns id -> (width, height, boxes, features)."""
    rng = np.random.default_rng(seed)
    truth, lines = {}, []
    for image_id, count, (width, height) in zip(BUTD_IDS, (36, 10, 12), ((640, 480), (500, 375), (427, 640))):
        boxes = detections(rng, count, width, height)[:, :4]
        features = rng.normal(size=(count, dim)).astype(np.float32)
        truth[str(image_id)] = (width, height, boxes, features)
        lines.append(butd_line(image_id, width, height, boxes, features))
    lines[1] = lines[1].replace("\t" + b64(truth["9"][2]), "\tb'" + b64(truth["9"][2]) + "'")  # a Python 3 port's str(bytes)
    path.write_text("\n".join(lines) + "\n")
    return truth


VINVL_KEYS = ["COCO_val2014_000000391895.jpg", "flickr/1000092795.jpg", "000000522418"]


def vinvl_line(key: str, boxes, classes, conf, features, size=None) -> str:
    objects = [{"rect": [float(v) for v in b], "class": c, "conf": float(s), "feature": b64(f)}
               for b, c, s, f in zip(boxes, classes, conf, features)]
    record = {"objects": objects}
    if size:
        record["image_w"], record["image_h"] = size
    return key + "\t" + json.dumps(record)


def write_vinvl(path: Path, hw: Path, dim: int = 2048, seed: int = 2) -> dict:
    """A VinVL feature TSV of three images and the hw TSV of two of them (the third carries its size);
    returns id -> (width, height, boxes, confidence, features)."""
    rng = np.random.default_rng(seed)
    truth, lines, sizes = {}, [], []
    for n, (key, image_id) in enumerate(zip(VINVL_KEYS, ["391895", "1000092795", "522418"])):
        width, height = (640, 480) if n != 1 else (500, 333)
        rows = detections(rng, 5 + n, width, height)
        features = rng.normal(size=(len(rows), dim)).astype(np.float32)
        truth[image_id] = (width, height, rows[:, :4], rows[:, 5], features)
        classes = ["dog", "man", "shirt", "tree", "car", "sky", "road"][: len(rows)]
        lines.append(vinvl_line(key, rows[:, :4], classes, rows[:, 5], features, (width, height) if n == 2 else None))
        if n != 2:
            sizes.append(key + "\t" + json.dumps([{"height": height, "width": width}]))
    path.write_text("\n".join(lines) + "\n")
    hw.write_text("\n".join(sizes) + "\n")
    return truth
