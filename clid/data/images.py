"""The images of stage 01: the image list (a captions JSON, a VG image_data.json or
scene_graphs.json, a text list, or a whole folder) and image loading.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from clid.base.files import DataError, id_problem, natural_key, read_json
from clid.data.captions import load_captions

IMAGE_EXTENSIONS = {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".gif", ".tif", ".tiff"}


# ---------------------------------------------------------------------------------------------
# The image list

@dataclass
class Item:
    image_id: str
    path: Path
    attrs: dict = field(default_factory=dict)  # extra HDF5 attrs (vg_image_id, coco_id)


def folder_images(images: Path) -> dict[str, Path]:
    """File-name stem -> path for every image under the folder; two files with one stem is an error."""
    found: dict[str, Path] = {}
    for path in sorted(images.rglob("*")):
        if path.suffix.lower() in IMAGE_EXTENSIONS and path.is_file():
            if path.stem in found:
                raise DataError(images, None, f"two images with the id '{path.stem}': {found[path.stem]} and {path}")
            found[path.stem] = path
    return found


def list_items(images: Path, list_path: str | None) -> list[Item]:
    """The images to process, in list order (see the module docstring for the list formats)."""
    if list_path is None:
        return [Item(i, p) for i, p in sorted(folder_images(images).items(), key=lambda kv: natural_key(kv[0]))]
    list_path = Path(list_path)
    if not list_path.exists():
        raise DataError(list_path, None, "image list not found")
    by_stem = None

    def resolve(name: str) -> Path:
        nonlocal by_stem
        if Path(name).suffix.lower() in IMAGE_EXTENSIONS:
            return images / name
        by_stem = folder_images(images) if by_stem is None else by_stem
        return by_stem.get(name, images / name)  # a missing one fails later, by path

    try:
        text = list_path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise DataError(list_path, None, "not UTF-8 text (expected a JSON list or a text file of file names)") from None
    if not text.lstrip().startswith(("[", "{")):  # a text file: one file name (or id) a line
        names = [line.strip() for line in text.splitlines() if line.strip()]
        return [Item(Path(n).stem, resolve(n)) for n in names]
    data = read_json(list_path)
    if isinstance(data, dict) and "images" in data or (isinstance(data, list) and data and isinstance(data[0], dict)
                                                       and "paragraph" in data[0]):
        return [Item(r.image_id, images / r.filename) for r in load_captions(list_path)]
    if not isinstance(data, list) or not all(isinstance(x, dict) for x in data):
        raise DataError(list_path, "top level", "not a captions JSON, VG image_data.json, scene_graphs.json or text list")
    items = []
    for index, record in enumerate(data):
        if "objects" in record:  # scene_graphs.json: ids only, files found by stem
            problem = id_problem(record.get("image_id"))
            if problem:
                raise DataError(list_path, f"[{index}]", f"'image_id' {problem}")
            image_id = str(record["image_id"])
            items.append(Item(image_id, resolve(image_id), {"vg_image_id": image_id}))
            continue
        image_id = record.get("image_id", record.get("id"))
        if image_id is None:
            raise DataError(list_path, f"[{index}]", "no 'image_id' (expected a VG image_data.json record)")
        if problem := id_problem(image_id):
            raise DataError(list_path, f"[{index}]", f"'image_id' {problem}")
        image_id = str(image_id)
        name = record.get("file_name") or record.get("filename") or (record.get("url") or "").rsplit("/", 1)[-1]
        attrs = {"vg_image_id": image_id}
        if record.get("coco_id") is not None:
            attrs["coco_id"] = str(record["coco_id"])
        items.append(Item(image_id, resolve(name) if name else resolve(image_id), attrs))
    return items


def unique_items(items: list[Item]) -> list[Item]:
    """Drop exact repeats (counted); one id naming two different files is an error."""
    seen: dict[str, Item] = {}
    repeated = []
    for item in items:
        if item.image_id in seen and seen[item.image_id].path != item.path:
            raise DataError(None, None, f"image id {item.image_id} names two files: {seen[item.image_id].path} and "
                                        f"{item.path}")
        if item.image_id in seen:
            repeated.append(item.image_id)
        seen.setdefault(item.image_id, item)
    if repeated:
        shown = ", ".join(repeated[:5]) + (", ..." if len(repeated) > 5 else "")
        print(f"note: {len(repeated)} repeated entries of the image list are processed once (image {shown})")
    return list(seen.values())


# ---------------------------------------------------------------------------------------------
# Image loading

WIDE_GREY = ("I;16", "I;16L", "I;16B", "I;16N", "I")  # Pillow's modes of a 16-bit greyscale image


def convert_image(image, mode: str):
    """``image`` (a PIL image) in ``mode`` ("RGB", "L"). A 16-bit greyscale image (Pillow's "I;16", or
    "I", as older Pillows read a 16-bit PNG) is scaled to 8 bits first: Pillow's own conversion clips
    it, and a 16-bit PNG would turn white."""
    from PIL import Image

    if image.mode in WIDE_GREY:
        pixels = np.asarray(image, dtype=np.float64) / 257.0  # 65535 -> 255
        image = Image.fromarray(np.clip(np.rint(pixels), 0, 255).astype(np.uint8), "L")
    return image.convert(mode)


def load_image(path: Path, mode: str, size: tuple[int, int]):
    """``(array [H, W] or [H, W, 3] float32 in [0, 1] at ``size`` (h, w), original (width, height))``.
    Large JPEGs are decoded at reduced scale directly (PIL draft mode)."""
    from PIL import Image

    with Image.open(path) as img:
        original = img.size
        img.draft(mode, (size[1] * 2, size[0] * 2))  # JPEG only: decode at >= 2x the target size
        img = convert_image(img, mode).resize((size[1], size[0]), Image.BILINEAR)
        return np.asarray(img, dtype=np.float32) / 255.0, original


def try_load(item: Item, mode: str, size: tuple[int, int]):
    try:
        return load_image(item.path, mode, size), None
    except FileNotFoundError:
        return None, "missing"
    except Exception as err:  # PIL raises many kinds: UnidentifiedImageError, OSError, SyntaxError...
        return None, f"unreadable ({type(err).__name__}: {err})"
