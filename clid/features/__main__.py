"""Region features of any images: a pretrained ImageNet EfficientNet-Lite0 applied to the pixels of each
region, then colour histograms; or (``convert``) the features of a released detector, converted.

    python -m clid.features --images DIR --out features.h5 \\
        (--scene-graphs scene_graphs.json [--image-data image_data.json] | --detections FILE | --boxes grid N)
    python -m clid.features convert --format vlp|butd|vinvl INPUT [INPUT ...] --out features.h5   (--help there)

In: a folder of images and where each image's boxes come from, one of:
- ``--scene-graphs``: Visual Genome scene graphs, each graph's object boxes. With ``image_data.json`` an
  image is the file its ``url`` names and its id is its COCO id (graphs without one are skipped, as 02
  skips them); without it, the file named after the VG id, and the VG id;
- ``--detections``: a detector's output: a JSON object of image -> boxes (``[x1, y1, x2, y2]`` or
  ``{"rect": [...], "conf": c, "class": name}``), a JSON list of COCO detection results (``image_id``,
  ``bbox`` [x, y, w, h], ``score``), or a TSV that ``convert`` reads (bottom-up, Scene Graph Benchmark /
  VinVL). An image's key is read as 02 reads keys (a COCO file name or zero-padded number gives the COCO
  id); boxes under ``--min-conf`` are left out and at most ``--max-boxes`` kept, the most confident;
- ``--boxes grid N``: an N x N grid of boxes over every image in the folder; an image's id comes from
  its file name: ``--ids auto`` (a COCO file name gives the COCO id, as ``convert-coco`` keys the
  captions) or ``keep`` (the file name without its extension). One line says how many were mapped.
Out: the region-feature file, one HDF5 group per image id with ``features`` [R, D] float32, ``boxes``
[R, 4] float32 (x1, y1, x2, y2 pixels), attrs ``width`` and ``height`` (and ``confidence`` [R] with
detections: 1 for the whole image); root attributes ``feature_kind`` = ``clid-encoder`` and
``feature_dim``. Row 0 is the whole image, then one row per box. In Python, :class:`RegionFeatures`
turns images and their boxes into those arrays and :func:`write_features` writes the file;
``00_demo_data.py`` uses both.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from clid.base.files import DataError
from clid.data.encoder import (
    RegionFeatures,
    add_encoder_size_args,
    detection_regions,
    graph_regions,
    grid_boxes,
    grid_regions,
    keep_key,
)
from clid.data.images import convert_image
from clid.data.scenegraphs import image_key_to_id
from clid.data.store import MAX_REGIONS, Regions, write_features
from clid.run import runs
from clid.run.cli import HelpFormatter, number, positive_int, run_main, unit_interval, whole_number

KIND = "clid-encoder"  # the feature_kind of the files this command writes
COMMAND = "python -m clid.features"  # the writer its run record names
MAX_GRID = math.isqrt(MAX_REGIONS - 1)  # N x N boxes and the whole image: at most MAX_REGIONS regions


def grid_size(text: str) -> int:
    """argparse type of N in ``--boxes grid N``: a whole number in 1..MAX_GRID."""
    try:
        n = whole_number(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"N must be a whole number, not {text!r}") from None
    if not 1 <= n <= MAX_GRID:
        raise argparse.ArgumentTypeError(f"N must be in 1..{MAX_GRID} (N x N boxes an image and the whole image: at "
                                         f"most {MAX_REGIONS} regions are read), not {n}")
    return n


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m clid.features", description=__doc__.split("\n\n")[0],
                                epilog="python -m clid.features convert --help: the converters of released features",
                                formatter_class=HelpFormatter)
    inputs = p.add_argument_group("input", "the images and where their boxes come from (one of three)")
    inputs.add_argument("--images", required=True, help="image folder (searched recursively)")
    source = inputs.add_mutually_exclusive_group(required=True)
    source.add_argument("--scene-graphs", help="Visual Genome scene_graphs.json: the boxes")
    source.add_argument("--detections", help="a detector's boxes: JSON (image -> boxes, or COCO results) or a TSV "
                                             "that convert reads")
    source.add_argument("--boxes", nargs=2, metavar=("grid", "N"), help="an N x N grid of boxes on every image")
    inputs.add_argument("--image-data", default=None, help="VG image_data.json: file names (url), sizes, COCO ids")
    inputs.add_argument("--ids", choices=["auto", "keep"], default="auto",
                        help="--boxes and --detections: how a file name (or a detection's key) becomes an image id: "
                             "auto: a COCO file name or a zero-padded number gives the COCO id "
                             "(COCO_val2014_000000000042.jpg -> 42), as convert-coco keys its captions; keep: the file "
                             "name without its extension. (--scene-graphs: the graphs' ids)")
    inputs.add_argument("--min-conf", type=unit_interval, default=0.2,
                        help="--detections: boxes under this confidence are left out")
    inputs.add_argument("--max-boxes", default=100,
                        type=number(int, low=1, high=MAX_REGIONS - 1, what=f"an integer in 1..{MAX_REGIONS - 1}"),
                        help=f"--detections: the most confident boxes kept (with the whole image, at most "
                             f"{MAX_REGIONS} regions are read)")
    output = p.add_argument_group("output", "the region-feature file")
    output.add_argument("--out", required=True, help="the region-feature HDF5 to write")
    runs.add_force_arg(output)
    encoder = p.add_argument_group("encoder", "what each region becomes (a checkpoint reads the settings it was "
                                              "trained on)")
    add_encoder_size_args(encoder, "boxes are resized to crop x crop for the encoder")
    encoder.add_argument("--colour-bins", type=number(int, low=0, high=16, what="an integer in 0..16"), default=4,
                         help="colour histogram bins per channel (0: none)")
    encoder.add_argument("--chunk", type=positive_int, default=16, help="images encoded together")
    args = p.parse_args(argv)
    if args.image_data and not args.scene_graphs:
        p.error("--image-data goes with --scene-graphs")
    if args.boxes:
        if args.boxes[0] != "grid":
            p.error(f"--boxes takes 'grid N', not {' '.join(args.boxes)!r}")
        try:
            args.grid = grid_size(args.boxes[1])
        except argparse.ArgumentTypeError as err:
            p.error(f"--boxes grid: {err}")
    return args


def regions_of(args) -> tuple[list, list, str]:
    """``(image id, file, boxes, confidences)`` of every image, the images left out, and where the boxes came from."""
    images = Path(args.images)
    if not images.is_dir():
        raise DataError(images, None, "no such image folder")
    to_id = image_key_to_id if args.ids == "auto" else keep_key
    if args.scene_graphs:
        items, skipped = graph_regions(args.scene_graphs, args.image_data, images)
        return items, skipped, f"the scene graphs of {args.scene_graphs}"
    if args.detections:
        items, skipped = detection_regions(args.detections, images, args.min_conf, args.max_boxes, to_id)
        return items, skipped, f"the detections of {args.detections}"
    items, skipped = grid_regions(images, args.grid, to_id)
    return items, skipped, f"a {args.grid} x {args.grid} grid on the images of {images}"


def features_record(args) -> dict:
    """The run record of a features file: its inputs and the settings that change what it holds."""
    return runs.run_record(args, inputs=("images", "scene_graphs", "image_data", "detections"), settings=(
        "boxes", "ids", "min_conf", "max_boxes", "crop", "whole", "colour_bins"))


def up_to_date(args) -> bool:
    """True when ``--out`` holds what these flags would write (this command wrote it, from the same inputs)."""
    from clid.base.files import read_json

    try:
        return Path(args.out).is_file() and read_json(runs.record_path(args.out)) == {"command": COMMAND,
                                                                                      **features_record(args)}
    except (OSError, DataError):
        return False


def id_line(items, ids: str) -> str:
    """One line: how many images' ids were mapped from COCO file names (``--ids auto``), with an example."""
    mapped = [(image_id, path) for image_id, path, _, _ in items if image_id != keep_key(path.name)]
    example = f" (e.g. {mapped[0][1].name} -> {mapped[0][0]})" if mapped else ""
    return (f"ids (--ids {ids}): {len(mapped)} of {len(items)} images mapped from COCO file names to COCO ids"
            f"{example}, {len(items) - len(mapped)} named by their file names")


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["convert"]:
        from clid.features.convert import run

        return run(argv[1:])
    from clid.base.progress import Progress

    args = parse_args(argv)
    record = features_record(args)
    runs.check_own_output(args.out, COMMAND, args.force)
    items, skipped, source = regions_of(args)
    if not items:
        first = f" (first: {skipped[0][0]}: {skipped[0][1]})" if skipped else ""
        sys.exit(f"error: {args.images}: no image with boxes was found ({source}){first}")
    if not args.scene_graphs:
        print(id_line(items, args.ids))
    extractor = RegionFeatures(args.crop, args.whole, args.colour_bins, args.batch_size)

    animated = []  # images of several frames: the first is encoded

    def regions():
        with Progress(len(items), "region features", "img") as bar:
            for start in range(0, len(items), args.chunk):
                part, images = [], []
                for image_id, path, boxes, conf in items[start:start + args.chunk]:
                    try:
                        with Image.open(path) as image:
                            if getattr(image, "n_frames", 1) > 1:  # (an animated GIF, PNG or WebP: said below)
                                animated.append(image_id)
                            images.append(convert_image(image, "RGB"))
                    except (OSError, ValueError) as err:  # an unreadable or truncated image file
                        skipped.append((image_id, f"{path}: {err}"))
                        continue
                    except Image.DecompressionBombError as err:  # (more pixels than PIL opens: a decompression bomb?)
                        skipped.append((image_id, f"{path}: too large: {str(err).split(' could be ')[0].rstrip(', ')}"))
                        continue
                    if isinstance(boxes, tuple):  # ("grid", n): cells of the image's own size
                        boxes = grid_boxes(images[-1].width, images[-1].height, boxes[1])
                    part.append((image_id, boxes, conf))
                for (image_id, _, conf), image, (features, boxes) in zip(part, images,
                                                                          extractor(images, [b for _, b, _ in part])):
                    confidence = None if conf is None else np.asarray([1.0] + list(conf), np.float32)
                    yield image_id, Regions(features, boxes, image.width, image.height, confidence=confidence)
                bar.update(min(args.chunk, len(items) - start))

    written = write_features(args.out, regions(), KIND)
    runs.write_own_record(args.out, record, COMMAND)
    if animated:
        print(f"{len(animated)} animated images: the first frame of each was encoded (first: {animated[0]})")
    for image_id, reason in skipped[:10]:
        print(f"skipped {image_id}: {reason}")
    if skipped:
        print(f"skipped {len(skipped)} of {len(skipped) + written} images (the first reasons above)")
    print(f"wrote the region features of {written} images to {args.out} (boxes: {source})")
    if not written:  # every image was unreadable: the file this run wrote is empty
        Path(args.out).unlink(missing_ok=True)
        runs.record_path(args.out).unlink(missing_ok=True)
        sys.exit(f"error: {args.images}: none of the {len(items)} images with boxes could be read ({source})")


if __name__ == "__main__":
    run_main(main)
