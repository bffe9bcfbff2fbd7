"""Region features of any images with boxes: a pretrained ImageNet EfficientNet-Lite0 applied to the pixels
of each region, then colour histograms.

    python -m clid.features --images DIR --scene-graphs scene_graphs.json [--image-data image_data.json] \
        --out features.h5

In: a folder of images and Visual Genome scene graphs; each graph's object boxes are its regions. With
``image_data.json`` an image is the file its ``url`` names and its id is its COCO id (graphs without one
are skipped, as 02 skips them); without it, the file named after the VG id, and the VG id.
Out: the region-feature file, one HDF5 group per image id with ``features`` [R, D] float32, ``boxes``
[R, 4] float32 (x1, y1, x2, y2 pixels), attrs ``width`` and ``height``. Row 0 is the whole image, then
one row per box. In Python, :class:`RegionFeatures` turns images and their boxes into those arrays and
:func:`write_features` writes the file; ``00_demo_data.py`` uses both.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from PIL import Image

from clid.cli import HelpFormatter, non_negative_int, positive_int
from clid.features.encoder import RegionFeatures, graph_regions
from clid.features.store import write_features
from clid.files import DataError, check_not_input


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m clid.features", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("--images", required=True, help="image folder (searched recursively)")
    p.add_argument("--scene-graphs", required=True, help="Visual Genome scene_graphs.json: the boxes")
    p.add_argument("--image-data", default=None, help="VG image_data.json: file names (url), sizes, COCO ids")
    p.add_argument("--out", required=True, help="the region-feature HDF5 to write")
    p.add_argument("--crop", type=positive_int, default=64, help="boxes are resized to crop x crop for the encoder")
    p.add_argument("--whole", type=positive_int, default=128, help="the whole image is resized to whole x whole")
    p.add_argument("--colour-bins", type=non_negative_int, default=4, help="colour histogram bins per channel (0: none)")
    p.add_argument("--batch-size", type=positive_int, default=256, help="encoder batch size")
    p.add_argument("--chunk", type=positive_int, default=16, help="images encoded together")
    args = p.parse_args(argv)
    return args


def main(argv=None) -> None:
    from clid.progress import Progress

    args = parse_args(argv)
    check_not_input(args.out, {"--scene-graphs": args.scene_graphs, "--image-data": args.image_data})
    if not Path(args.images).is_dir():
        sys.exit(f"error: {args.images}: image folder not found")
    if Path(args.out).is_dir():
        sys.exit(f"error: --out {args.out} is a folder; give the HDF5 file to write")
    try:
        items, skipped = graph_regions(args.scene_graphs, args.image_data, Path(args.images))
    except (DataError, FileNotFoundError) as err:
        sys.exit(f"error: {err}")
    if not items:
        first = f" (first: {skipped[0][0]}: {skipped[0][1]})" if skipped else ""
        sys.exit(f"error: {args.scene_graphs}: no image with a scene graph was found in {args.images}{first}")
    extractor = RegionFeatures(args.crop, args.whole, args.colour_bins, args.batch_size)

    def groups():
        with Progress(len(items), "region features", "img") as bar:
            for start in range(0, len(items), args.chunk):
                part, images = [], []
                for image_id, path, boxes in items[start:start + args.chunk]:
                    try:
                        with Image.open(path) as image:
                            images.append(image.convert("RGB"))
                        part.append((image_id, boxes))
                    except (OSError, ValueError) as err:  # an unreadable or truncated image file
                        skipped.append((image_id, f"{path}: {err}"))
                for (image_id, _), image, (features, boxes) in zip(part, images,
                                                                   extractor(images, [b for _, b in part])):
                    yield image_id, features, boxes, image.width, image.height
                bar.update(min(args.chunk, len(items) - start))

    written = write_features(args.out, groups())
    for graph_id, reason in skipped[:10]:
        print(f"skipped {graph_id}: {reason}")
    if skipped:
        print(f"skipped {len(skipped)} of {len(skipped) + written} scene graphs (the first reasons above)")
    print(f"wrote the region features of {written} images to {args.out}")
    if not written:
        sys.exit(f"error: {args.scene_graphs}: no image with a scene graph was found in {args.images}")


if __name__ == "__main__":
    main()
