"""Images: the image list of stage 01 (a captions JSON, a VG image_data.json or scene_graphs.json, a text
list, or a whole folder); the photos of ``clid.features``, ``clid.caption`` and its API (:func:`find_images`:
folders, files and globs, every entry captioned or skipped with its reason); and the one reader of pixels
(:func:`read_image`: upright, in 8-bit RGB as a person sees it, or refused in one line).
"""
from __future__ import annotations

import os
import re
import stat
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from clid.base import files
from clid.base.files import DataError, id_problem, natural_key, read_json
from clid.data.captions import load_captions

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".gif", ".tif", ".tiff")  # the one list of image files
IMAGE_EXTENSIONS = set(IMAGE_SUFFIXES)


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
# Image loading: one reader of pixels

WIDE_GREY = ("I;16", "I;16L", "I;16B", "I;16N", "I")  # Pillow's modes of a 16-bit greyscale image
SEE_THROUGH = ("RGBA", "LA", "PA", "P", "La", "RGBa")  # modes that may hold transparency: shown on white


def convert_image(image, mode: str):
    """``image`` (a PIL image) in ``mode`` ("RGB", "L"), its pixels as :func:`rgb_view` reads them, as
    stored (its EXIF orientation is not applied: 01's maps keep the stored pixel grid)."""
    if mode == "L" and image.mode in ("L", "1"):
        return image.convert("L")
    rgb = rgb_view(image, upright=False)
    return rgb if mode == "RGB" else rgb.convert(mode)


def rgb_view(image, where="image", upright: bool = True):
    """The 8-bit RGB view of a PIL image, as a person sees it, holding its pixels alone (no EXIF, comment or
    colour profile left): turned as its EXIF orientation says (``upright``); 16-bit greyscale ("I;16", or
    "I", as Pillow reads 16-bit PNGs and TIFFs) scaled down from 16 bits; floats ("F") read as [0, 1];
    transparency shown on white; CMYK and a colour profile converted to sRGB. What has no such view (an "I"
    image with values outside 0..65535, floats outside [0, 1]) is one DataError naming ``where``."""
    from PIL import Image, ImageOps

    if upright:
        try:
            image = ImageOps.exif_transpose(image)
        except Exception:  # an EXIF block Pillow cannot parse: the image as stored, as viewers show it
            pass
    mode = image.mode
    if mode in WIDE_GREY or mode == "F":
        pixels = np.asarray(image, dtype=np.float64)
        low, high = (float(pixels.min()), float(pixels.max())) if pixels.size else (0.0, 0.0)
        if mode == "F":
            if not (np.isfinite(pixels).all() and 0 <= low and high <= 1):
                raise DataError(where, None, f"holds floating-point pixels from {low:g} to {high:g} (mode F): "
                                             "floats are read as [0, 1], and these are not; scale them to [0, 1]")
            pixels = pixels * 255.0
        else:
            if low < 0 or high > 65535:
                raise DataError(where, None, f"holds 32-bit integer pixels from {low:.0f} to {high:.0f} (mode I): "
                                             "read as 16-bit values (0..65535), these have no 8-bit view without "
                                             "guessing their range; save it as an 8- or 16-bit image")
            pixels = pixels / 257.0  # 65535 -> 255
        image = Image.fromarray(np.clip(np.rint(pixels), 0, 255).astype(np.uint8), "L")
    elif mode in SEE_THROUGH or "transparency" in image.info:
        try:
            rgba = image.convert("RGBA")
        except ValueError:
            rgba = image.convert(mode.upper()).convert("RGBA")  # (premultiplied "La", "RGBa")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        image = Image.alpha_composite(white, rgba)
    elif mode in ("RGB", "CMYK") and image.info.get("icc_profile"):
        image = in_srgb(image)
    try:
        image = image.convert("RGB")
    except ValueError as err:
        raise DataError(where, None, f"has Pillow's mode {mode}, which has no RGB view ({err})") from None
    return Image.fromarray(np.asarray(image))  # the pixels alone: nothing of the file's metadata


def in_srgb(image):
    """An RGB or CMYK image with a colour profile, converted to sRGB (a profile Pillow cannot read: as stored)."""
    import io

    from PIL import ImageCms

    try:
        profile = ImageCms.ImageCmsProfile(io.BytesIO(image.info["icc_profile"]))
        return ImageCms.profileToProfile(image, profile, ImageCms.createProfile("sRGB"), outputMode="RGB")
    except Exception:  # (ImageCms.PyCMSError, OSError...: a broken or unusual profile)
        return image.convert("RGB")


def array_image(array: np.ndarray, where="image"):
    """An H x W x 3 or H x W uint8 NumPy array as an RGB PIL image; another shape or type is one DataError."""
    from PIL import Image

    if array.dtype != np.uint8 or not (array.ndim == 2 or (array.ndim == 3 and array.shape[2] == 3)) or not array.size:
        raise DataError(where, None, f"is a NumPy array of shape {array.shape} and type {array.dtype}: an image is "
                                     "H x W x 3 (RGB) or H x W (grey) uint8 pixels")
    return Image.fromarray(np.ascontiguousarray(array)).convert("RGB")


def read_image(source, where: str | None = None):
    """``(image, note)``: ``source`` (an image file's path, a PIL image, or a NumPy array of H x W x 3 or H x W
    uint8 pixels) as an upright 8-bit RGB PIL image of its pixels alone (:func:`rgb_view`), and a note (an
    animated file, GIF or APNG: "animated (N frames): its first frame taken") or None. What cannot be read
    (anything else, an unreadable or too large file, a mode without an RGB view) is one DataError naming
    ``where`` (default: the path)."""
    import warnings

    from PIL import Image

    if isinstance(source, np.ndarray):
        return array_image(source, where or "image"), None
    if isinstance(source, Image.Image):
        return rgb_view(source, where or "image"), None
    if not isinstance(source, (str, os.PathLike)):
        raise DataError(where or "image", None, f"is {type(source).__name__}, not an image: give an image file's "
                                                "path, a PIL image or a NumPy array of uint8 pixels")
    path = Path(source)
    where = where or str(path)
    frames = 1
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # (under the limit: read)
            with Image.open(path) as image:
                if getattr(image, "is_animated", False):
                    frames = image.n_frames
                    image.seek(0)
                picture = rgb_view(image, where)
    except DataError:
        raise
    except Image.DecompressionBombError as err:
        raise DataError(where, None, f"too large to read: {err_text(err)}") from None
    except FileNotFoundError:
        gone = "a symbolic link that points nowhere" if path.is_symlink() else "no such image file"
        raise DataError(where, None, gone) from None
    except IsADirectoryError:
        raise DataError(where, None, "is a folder, not an image file") from None
    except Exception as err:  # PIL raises many kinds: UnidentifiedImageError, OSError, SyntaxError...
        raise DataError(where, None, f"cannot be read as an image ({type(err).__name__}: {err_text(err)})") from None
    return picture, (f"animated ({frames} frames): its first frame taken" if frames > 1 else None)


def err_text(err: Exception) -> str:
    """An exception's message on one short line."""
    return shown(str(err).splitlines()[0][:200] if str(err) else "")


def shown(text: str) -> str:
    """``text`` on one line: control characters and bytes of a file name that are not UTF-8 escaped."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape", "backslashreplace").decode("ascii")
                   for c in str(text))


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


# ---------------------------------------------------------------------------------------------
# Photos: folders, files and globs, every entry read or skipped with its reason

HIDDEN = "hidden (its name starts with '.'): name it on its own to read it"
MAGIC = re.compile(r"[*?[]")


@dataclass(frozen=True)
class ImageFile:
    """An image file :func:`find_images` found: its ``path`` and its ``name``, the path below the folder (or
    the glob's folder) it was found in, or its file name, shown in summaries, caption rows and the gallery."""

    path: Path
    name: str


@dataclass
class ImageList:
    """What :func:`find_images` found: the image ``files`` in order, and each other entry as ``(name, reason)``."""

    files: list[ImageFile] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)

    def state(self) -> dict:
        """What identifies these images for a run record: each file's name, size and modification time."""
        out = {}
        for f in self.files:
            try:
                info = os.stat(f.path)
                out[f.name] = {"size": info.st_size, "mtime_ns": info.st_mtime_ns}
            except OSError:
                out[f.name] = {"missing": True}
        return out


def find_images(sources, flag: str = "--images") -> ImageList:
    """The image files of ``sources`` (a path or a list of them: folders, searched recursively; files; globs
    that the shell did not expand, ``photos/*.png``, ``photos/**/*.jpg``), each file once, in order (a
    folder's in natural order of their names). Every other entry of a folder is skipped with its reason:
    hidden (a name starting with "."; named on its own, or by a glob that starts with ".", it is read), not
    an image by its name (the suffixes :data:`IMAGE_SUFFIXES`), a symbolic link that points nowhere or in a
    loop, a linked folder (not entered, as the run records do not enter it), not a regular file. A source
    that does not exist, or a glob that matches nothing, is one DataError."""
    found = ImageList()
    seen: set = set()
    for source in [sources] if isinstance(sources, (str, os.PathLike)) else list(sources):
        if not isinstance(source, (str, os.PathLike)):
            raise DataError(flag, None, f"expected paths of image files or folders, got {type(source).__name__}")
        text = os.fspath(source)
        path = Path(text)
        if path.is_symlink() or path.exists():
            _add(found, seen, path, path.name or text, top=True, root=True)
        elif MAGIC.search(text):
            import glob

            matches = sorted(glob.glob(text, recursive=True), key=natural_key)
            if not matches:
                raise DataError(text, None, f"{flag}: no file or folder matches this pattern")
            base = Path(MAGIC.split(text, 1)[0] + "x").parent  # the folder before the first wildcard
            for match in matches:
                _add(found, seen, Path(match), _below(Path(match), base), top=True)
        else:
            raise DataError(text, None, f"{flag}: no such file or folder")
    return found


def _below(path: Path, base: Path) -> str:
    try:
        return path.relative_to(base).as_posix()
    except ValueError:
        return path.name


def _add(found: ImageList, seen: set, path: Path, name: str, top: bool, root: bool = False) -> None:
    """One entry: a file, a folder (searched; ``root``: its entries named from it), or a skip with its reason.
    ``top``: named by a source (a link is followed), not found in a folder."""
    import errno

    try:
        info = os.stat(path)  # (through a link)
    except OSError as err:
        if err.errno == errno.ELOOP:
            reason = "a symbolic link in a loop"
        elif isinstance(err, FileNotFoundError):
            reason = "a symbolic link that points nowhere" if path.is_symlink() else "removed while the folder was read"
        else:
            reason = f"cannot be read ({err.strerror})"
        found.skipped.append((name, reason))
        return
    if stat.S_ISDIR(info.st_mode):
        if not top and path.is_symlink():
            found.skipped.append((name + "/", "a linked folder: not entered (name it on its own to read it)"))
        else:
            _walk(found, seen, path, "" if root else name + "/")
    elif not stat.S_ISREG(info.st_mode):
        found.skipped.append((name, "not a regular file"))
    elif not name.lower().endswith(IMAGE_SUFFIXES):
        suffix = Path(name).suffix
        found.skipped.append((name, f"not an image by its name ({suffix or 'no extension'}; images end in "
                                    f"{', '.join(IMAGE_SUFFIXES)})"))
    elif (info.st_dev, info.st_ino) not in seen:  # (one file named twice: read once)
        seen.add((info.st_dev, info.st_ino))
        found.files.append(ImageFile(path, name))


def _walk(found: ImageList, seen: set, folder: Path, prefix: str) -> None:
    try:
        entries = sorted(os.scandir(folder), key=lambda e: natural_key(e.name))
    except OSError as err:
        found.skipped.append((prefix or str(folder), f"a folder that cannot be read ({err.strerror})"))
        return
    for entry in entries:
        name = prefix + entry.name
        if entry.name.startswith("."):
            found.skipped.append((name + ("/" if entry.is_dir(follow_symlinks=False) else ""), HIDDEN))
        else:
            _add(found, seen, Path(entry.path), name, top=False)


def skip_summary(skipped: list[tuple[str, str]], total: int, shown_first: int = 10, noun: str = "files",
                 listed_in=None) -> list[str]:
    """The lines that account for skipped entries: the first ``shown_first`` with their reasons, then how many
    of the ``total`` ``noun`` were skipped, by reason (each name and reason on one line), and the file that
    names them all (``listed_in``), where more were skipped than shown."""
    if not skipped:
        return []
    lines = [f"skipped {shown(name)}: {shown(reason)}" for name, reason in skipped[:shown_first]]
    kinds: dict[str, int] = {}
    for _, reason in skipped:
        kind = re.split(r" \(|:| from ", reason, maxsplit=1)[0]  # (the reason without its particulars)
        kinds[kind] = kinds.get(kind, 0) + 1
    more = ""
    if len(skipped) > shown_first:
        more = f" (the first above{f'; all in {shown(listed_in)}' if listed_in else ''})"
    lines.append(f"skipped {len(skipped)} of {total} {noun}{more}: "
                 + "; ".join(f"{count} {kind}" for kind, count in kinds.items()))
    return lines


# ---------------------------------------------------------------------------------------------
# Image ids from file names

def keep_key(key: str) -> str:
    """An image key as it is (``--ids keep``): a file name loses only its image extension (and the spaces
    around it)."""
    key = str(key).strip()
    return key.rsplit(".", 1)[0] if key.lower().endswith(IMAGE_SUFFIXES) else key


def auto_key(key: str) -> str:
    """An image key as ``--ids auto`` reads it (as 02 and convert-coco key COCO images): a COCO file name or a
    zero-padded number gives the COCO id ("COCO_val2014_000000391895.jpg", "0042.png" -> "391895", "42");
    another key only loses its folder and image extension ("flickr/1000092795.jpg" -> "1000092795")."""
    from clid.data.splits import COCO_FILE_NAME

    stem = keep_key(str(key).strip().replace("\\", "/").rsplit("/", 1)[-1])
    match = COCO_FILE_NAME.fullmatch(stem)
    if match:
        return str(int(match.group(2)))
    return str(int(stem)) if stem.isascii() and stem.isdigit() else stem


def name_problem(image_id: str) -> str | None:
    """Why the id a file name gives cannot be an image id, or None."""
    if not image_id:
        return "a name that cannot be an id: nothing is left of it without its extension"
    if image_id in (".", ".."):
        return f"a name that cannot be an id: its id would be '{image_id}', which names a folder in a feature file"
    for c in image_id:
        if unicodedata.category(c) in ("Cc", "Cs"):
            what = "bytes that are not UTF-8" if unicodedata.category(c) == "Cs" else f"a control character ({shown(c)})"
            return f"a name that cannot be an id: it holds {what}; rename the file"
    if problem := files.name_problem(image_id):  # (the checks every name of a file or HDF5 group passes)
        return f"a name that cannot be an id: the id {problem}"
    return None
