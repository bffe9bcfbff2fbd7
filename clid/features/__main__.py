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
- ``--boxes grid N``: an N x N grid of boxes over every image; an image's id comes from its file name:
  ``--ids auto`` (a COCO file name or a zero-padded number gives the COCO id, as ``convert-coco`` keys
  the captions: ``0042.png`` -> ``42``) or ``keep`` (the file name without its extension). One line says
  how many were mapped.

``--images`` takes folders (searched recursively), files and globs (``'photos/*.png'``, quoted or not). Each
image is read upright (its EXIF orientation applied) in 8-bit RGB as a person sees it
(``clid.data.images.read_image``: 16-bit, float, palette, CMYK and transparent images converted; an
animated GIF or PNG: its first frame). Every file is encoded or skipped, named with its reason in the
summary: hidden (a name starting with "."; named on its own it is read), not an image by its name, a
symbolic link that points nowhere, unreadable, too large (Pillow's guard against decompression bombs), or a
name that cannot be an id. Two files with one id are refused.
Out: the region-feature file, one HDF5 group per image id with ``features`` [R, D] float32, ``boxes``
[R, 4] float32 (x1, y1, x2, y2 pixels), attrs ``width`` and ``height`` (and ``confidence`` [R] with
detections: 1 for the whole image); root attributes ``feature_kind`` = ``clid-encoder`` and
``feature_dim``. Its run record ``OUT.run.json`` also holds each image's file name (``images``: id -> name)
and the files skipped with their reasons. Row 0 is the whole image, then one row per box. In Python, :class:`RegionFeatures`
turns images and their boxes into those arrays and :func:`write_features` writes the file;
``00_demo_data.py`` uses both.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from clid.base.files import DataError, check_outputs
from clid.data.encoder import (
    MAX_GRID,
    RegionFeatures,
    add_encoder_size_args,
    auto_key,
    detection_regions,
    graph_regions,
    grid_boxes,
    grid_regions,
    keep_key,
)
from clid.data.images import ImageList, find_images, read_image, shown, skip_summary
from clid.data.store import MAX_REGIONS, Regions, write_features
from clid.run import runs
from clid.run.cli import HelpFormatter, number, positive_int, run_main, unit_interval, whole_number

KIND = "clid-encoder"  # the feature_kind of the files this command writes
COMMAND = "python -m clid.features"  # the writer its run record names
CHUNK = 16  # images read and encoded together
__all__ = ["COMMAND", "KIND", "MAX_GRID", "compute", "features_record", "grid_problem", "parse_args", "up_to_date"]


def grid_problem(n, name: str = "N") -> str | None:
    """Why ``n`` is not the ``name`` of a ``name`` x ``name`` grid of boxes (a whole number in 1..MAX_GRID), or None:
    the rule of ``--boxes grid N``, ``clid.caption --grid`` and ``CaptionWriter.caption_images(grid=)``."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        return f"{name} must be a whole number, not {type(n).__name__} {n!r}"
    if not 1 <= n <= MAX_GRID:
        return (f"{name} must be in 1..{MAX_GRID} ({name} x {name} boxes an image and the whole image: at most "
                f"{MAX_REGIONS} regions are read), not {n}")
    return None


def grid_size(text: str) -> int:
    """argparse type of N in ``--boxes grid N``: a whole number in 1..MAX_GRID."""
    try:
        n = whole_number(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"N must be a whole number, not {text!r}") from None
    if problem := grid_problem(n):
        raise argparse.ArgumentTypeError(problem)
    return n


def parse_args(argv=None) -> argparse.Namespace:
    from clid.run import runtime

    p = argparse.ArgumentParser(prog="python -m clid.features", description=__doc__.split("\n\n")[0],
                                epilog="python -m clid.features convert --help: the converters of released features",
                                formatter_class=HelpFormatter)
    inputs = p.add_argument_group("input", "the images and where their boxes come from (one of three)")
    inputs.add_argument("--images", required=True, nargs="+", metavar="PATH",
                        help="image folders (searched recursively), files or globs ('photos/*.png')")
    source = inputs.add_mutually_exclusive_group(required=True)
    source.add_argument("--scene-graphs", help="Visual Genome scene_graphs.json: the boxes")
    source.add_argument("--detections", help="a detector's boxes: JSON (image -> boxes, or COCO results) or a TSV "
                                             "that convert reads")
    source.add_argument("--boxes", nargs=2, metavar=("grid", "N"), help="an N x N grid of boxes on every image")
    inputs.add_argument("--image-data", default=None, help="VG image_data.json: file names (url), sizes, COCO ids")
    inputs.add_argument("--ids", choices=["auto", "keep"], default="auto",
                        help="--boxes and --detections: how a file name (or a detection's key) becomes an image id: "
                             "auto: a COCO file name or a zero-padded number gives the COCO id "
                             "(COCO_val2014_000000000042.jpg, 0042.png -> 42), as convert-coco keys its captions; keep: "
                             "the file name without its extension. (--scene-graphs: the graphs' ids)")
    inputs.add_argument("--min-conf", type=unit_interval, default=0.2,
                        help="--detections: boxes under this confidence are left out")
    inputs.add_argument("--max-boxes", default=100,
                        type=number(int, low=1, high=MAX_REGIONS - 1, what=f"an integer in 1..{MAX_REGIONS - 1}"),
                        help=f"--detections: the most confident boxes kept (with the whole image, at most "
                             f"{MAX_REGIONS} regions are read)")
    output = p.add_argument_group("output", "the region-feature file")
    output.add_argument("--out", required=True, help="the region-feature HDF5 to write")
    encoder = p.add_argument_group("encoder", "what each region becomes (a checkpoint reads the settings it was "
                                              "trained on)")
    add_encoder_size_args(encoder, "boxes are resized to crop x crop for the encoder")
    encoder.add_argument("--colour-bins", type=number(int, low=0, high=16, what="an integer in 0..16"), default=4,
                         help="colour histogram bins per channel (0: none)")
    encoder.add_argument("--chunk", type=positive_int, default=CHUNK, help="images encoded together")
    runtime.add_device_arg(encoder)
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


def regions_of(args, listing: ImageList) -> tuple[list, list, str]:
    """``(image id, file, boxes, confidences)`` of every image, ``(name, reason)`` of what was left out, and
    where the boxes came from."""
    where = " ".join(str(i) for i in args.images)
    files = listing.files
    to_id = auto_key if args.ids == "auto" else keep_key
    if args.scene_graphs:
        items, skipped = graph_regions(args.scene_graphs, args.image_data, files, where)
        return items, skipped, f"the scene graphs of {args.scene_graphs}"
    if args.detections:
        items, skipped = detection_regions(args.detections, files, where, args.min_conf, args.max_boxes, to_id)
        return items, skipped, f"the detections of {args.detections}"
    items, skipped = grid_regions(files, args.grid, to_id)
    return items, listing.skipped + skipped, f"a {args.grid} x {args.grid} grid on the images of {where}"


def features_record(args, listing: ImageList) -> dict:
    """The run record of a features file: its inputs (the image files by name, size and modification time)
    and the settings that change what it holds."""
    record = runs.run_record(args, inputs=("scene_graphs", "image_data", "detections"), settings=(
        "boxes", "ids", "min_conf", "max_boxes", "crop", "whole", "colour_bins"))
    record["inputs"]["--images"] = listing.state()
    return record


def read_record(out) -> dict | None:
    """The run record beside a features file, or None."""
    from clid.base.files import read_json

    try:
        record = read_json(runs.record_path(out))
    except (OSError, DataError):
        return None
    return record if isinstance(record, dict) else None


def up_to_date(args, listing: ImageList, writers=(COMMAND,)) -> bool:
    """True when ``--out`` holds what these flags would write: one of ``writers`` wrote it from the same images
    and settings."""
    record = read_record(args.out)
    fresh = features_record(args, listing)
    return (Path(args.out).is_file() and record is not None and record.get("command") in writers
            and not runs.changed_since(record, args.out)
            and all(record.get(key) == fresh[key] for key in ("inputs", "settings")))


def check_paths(args, listing: ImageList) -> None:
    """Refuse, before any work, an output (--out, its run record) that is an input (an image, --images, the boxes'
    files) or the other output, links followed."""
    check_outputs({"--out": args.out, "(the run record of --out)": runs.record_path(args.out)},
                  {"--images": [*args.images, *(f.path for f in listing.files)], "--scene-graphs": args.scene_graphs,
                   "--image-data": args.image_data, "--detections": args.detections})


def id_line(items, ids: str) -> str:
    """One line: how many images' ids were mapped from COCO file names (``--ids auto``), with an example."""
    mapped = [(image_id, path) for image_id, path, _, _ in items if image_id != keep_key(path.name)]
    example = f" (e.g. {shown(mapped[0][1].name)} -> {shown(mapped[0][0])})" if mapped else ""
    return (f"ids (--ids {ids}): {len(mapped)} of {len(items)} images mapped from COCO file names to COCO ids"
            f"{example}, {len(items) - len(mapped)} named by their file names")


def compute(args, listing: ImageList, writer: str = COMMAND) -> dict:
    """Write the features file ``args.out`` of ``listing``'s images and its run record, naming ``writer``; print
    what was written and every file skipped, with its reason. Returns the record: with the inputs and
    settings, ``images`` (image id -> file name), ``skipped`` and ``notes`` (``[name, reason]``)."""
    from clid.base.progress import Progress
    from clid.run import runtime

    record = features_record(args, listing)
    items, skipped, source = regions_of(args, listing)
    noun = "files" if args.boxes else "images"
    total = len(items) + len(skipped)
    if not items:
        first = f" (first: {shown(skipped[0][0])}: {shown(skipped[0][1])})" if skipped else ""
        raise DataError(" ".join(map(str, args.images)), None, f"no image with boxes was found ({source}){first}")
    if not args.scene_graphs:
        print(id_line(items, args.ids))
    names = {f.path: f.name for f in listing.files}
    device = args.device or str(runtime.default_device())
    extractor = RegionFeatures(args.crop, args.whole, args.colour_bins, args.batch_size, device)
    written, notes = {}, []

    def regions():
        with Progress(len(items), "region features", "img") as bar:
            for start in range(0, len(items), args.chunk):
                part, images = [], []
                for image_id, path, boxes, conf in items[start:start + args.chunk]:
                    name = names.get(path, str(image_id))
                    try:
                        image, note = read_image(path, name)
                    except DataError as err:  # unreadable, too large, a mode without an RGB view: counted
                        skipped.append((name, err.problem))
                        continue
                    if note:
                        notes.append((name, note))
                    if isinstance(boxes, tuple):  # ("grid", n): cells of the image's own size
                        boxes = grid_boxes(image.width, image.height, boxes[1])
                    images.append(image)
                    part.append((image_id, boxes, conf, name))
                for (image_id, _, conf, name), image, (features, boxes) in zip(
                        part, images, extractor(images, [b for _, b, _, _ in part])):
                    confidence = None if conf is None else np.asarray([1.0] + list(conf), np.float32)
                    written[str(image_id)] = name
                    yield image_id, Regions(features, boxes, image.width, image.height, confidence=confidence)
                bar.update(min(args.chunk, len(items) - start))

    runs.claim_output(args.out, writer)
    count = write_features(args.out, regions(), KIND)
    record.update(images=written, skipped=[list(s) for s in skipped], notes=[list(n) for n in notes])
    runs.write_own_record(args.out, record, writer)
    for line in skip_summary(skipped, total, noun=noun, listed_in=runs.record_path(args.out)):
        print(line)
    for name, note in notes:
        print(f"note: {shown(name)}: {note}")
    print(f"wrote the region features of {count} images to {args.out} (boxes: {source})")
    if not count:  # every image was unreadable: the file this run wrote is empty
        Path(args.out).unlink(missing_ok=True)
        runs.record_path(args.out).unlink(missing_ok=True)
        raise DataError(" ".join(map(str, args.images)), None,
                        f"none of the {len(items)} images with boxes could be read ({source})")
    return record


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["convert"]:
        from clid.features.convert import main as convert_main

        return convert_main(argv[1:])
    args = parse_args(argv)
    listing = find_images(args.images)
    check_paths(args, listing)
    runs.check_own_output(args.out, COMMAND)
    compute(args, listing)


if __name__ == "__main__":
    run_main(main)
