"""The one reader of photos (clid.data.images): folders, files and globs (find_images), each image read upright
in 8-bit RGB as a person sees it (read_image), and the rule that turns a file name into an image id."""
from __future__ import annotations

import os

import numpy as np
import pytest
from PIL import Image

from clid.base.files import DataError
from clid.data.images import IMAGE_SUFFIXES, auto_key, find_images, keep_key, read_image, skip_summary

HALVES = np.zeros((20, 40, 3), np.uint8)  # 40 wide, 20 high: the left half red, the right half black
HALVES[:, :20] = (255, 0, 0)


def pixels(source) -> np.ndarray:
    picture, note = read_image(source)
    assert picture.mode == "RGB" and note is None
    return np.asarray(picture)


# ---------------------------------------------------------------------------------------------
# Pixels as a person sees them


def test_exif_orientation_is_applied(tmp_path):
    """A phone photo stored sideways with EXIF orientation 6 (turn 90 degrees clockwise) is read upright."""
    image = Image.fromarray(HALVES)
    exif = image.getexif()
    exif[0x0112] = 6
    image.save(tmp_path / "phone.jpg", exif=exif.tobytes(), quality=95)
    upright = pixels(tmp_path / "phone.jpg")
    assert upright.shape == (40, 20, 3)  # 20 wide, 40 high
    assert (upright[:18, :, 0] > 200).all() and (upright[22:, :, 0] < 50).all()  # the left half is now on top
    Image.fromarray(HALVES).save(tmp_path / "plain.jpg", quality=95)
    assert pixels(tmp_path / "plain.jpg").shape == (20, 40, 3)  # no EXIF: as stored


@pytest.mark.parametrize("mode, values, grey", [
    ("F", np.full((8, 6), 0.5, np.float32), 128),  # floats read as [0, 1]
    ("I", np.full((8, 6), 257 * 100, np.int32), 100),  # 32-bit integers read as 16-bit values
    ("I;16", np.full((8, 6), 257 * 200, np.uint16), 200),
])
def test_wide_and_float_modes_give_their_8_bit_view(mode, values, grey):
    image = Image.fromarray(values) if mode == "I;16" else Image.fromarray(values, mode)
    assert image.mode == mode
    seen = pixels(image)
    assert seen.shape == (8, 6, 3) and (seen == grey).all()


@pytest.mark.parametrize("mode, values, problem", [
    ("F", np.full((4, 4), 3.0, np.float32), "holds floating-point pixels from 3 to 3 (mode F)"),
    ("F", np.full((4, 4), np.nan, np.float32), "(mode F)"),
    ("I", np.full((4, 4), 70000, np.int32), "holds 32-bit integer pixels from 70000 to 70000 (mode I)"),
    ("I", np.full((4, 4), -5, np.int32), "from -5 to -5 (mode I)"),
])
def test_pixels_without_an_8_bit_view_are_refused_in_one_line(mode, values, problem):
    with pytest.raises(DataError) as caught:
        read_image(Image.fromarray(values, mode), "photo.tif")
    assert str(caught.value).startswith("photo.tif: ") and problem in str(caught.value)
    assert "\n" not in str(caught.value)


def test_palette_transparency_cmyk_and_16_bit_png(tmp_path):
    assert (pixels(Image.fromarray(HALVES).convert("P"))[0, 0] == (255, 0, 0)).all()
    see_through = np.zeros((4, 4, 2), np.uint8)  # LA: black, fully transparent on the left, opaque on the right
    see_through[:, 2:, 1] = 255
    la = pixels(Image.fromarray(see_through, "LA"))
    assert (la[:, :2] == 255).all() and (la[:, 2:] == 0).all()  # transparency shown on white
    assert (pixels(Image.fromarray(HALVES).convert("CMYK"))[0, 0] == (255, 0, 0)).all()
    Image.fromarray(np.full((6, 5), 65535, np.uint16)).save(tmp_path / "wide.png")
    Image.fromarray(np.full((6, 5), 257 * 64, np.uint16)).save(tmp_path / "dark.png")
    with Image.open(tmp_path / "wide.png") as image:
        assert image.mode == "I;16"  # Pillow's own conversion would clip it: white, whatever it holds
    assert (pixels(tmp_path / "wide.png") == 255).all() and (pixels(tmp_path / "dark.png") == 64).all()


def test_numpy_arrays_are_images_and_anything_else_a_value_error_naming_its_type(tmp_path):
    Image.fromarray(HALVES).save(tmp_path / "halves.png")
    np.testing.assert_array_equal(pixels(HALVES), pixels(tmp_path / "halves.png"))
    np.testing.assert_array_equal(pixels(HALVES[:, :, 0]), np.repeat(HALVES[:, :, :1], 3, axis=2))  # H x W: grey
    assert pixels(HALVES[:, ::2]).shape == (20, 20, 3)  # a strided view
    for bad, named in ((HALVES.astype(np.float32), "type float32"), (np.zeros((3, 3, 4), np.uint8), "shape (3, 3, 4)"),
                       (np.zeros((0, 3, 3), np.uint8), "shape (0, 3, 3)"), (5, "is int"), (None, "is NoneType"),
                       (b"photo.png", "is bytes")):
        with pytest.raises(ValueError, match="^image: ") as caught:
            read_image(bad)
        assert named in str(caught.value)


def test_unreadable_files_are_one_data_error_each(tmp_path):
    (tmp_path / "fake.png").write_bytes(b"\x89PNG not really")
    (tmp_path / "folder.png").mkdir()
    os.symlink(tmp_path / "gone.png", tmp_path / "dangling.png")
    for name, problem in (("fake.png", "cannot be read as an image"), ("folder.png", "is a folder"),
                          ("dangling.png", "a symbolic link that points nowhere"), ("nope.png", "no such image file")):
        with pytest.raises(DataError, match=problem) as caught:
            read_image(tmp_path / name)
        assert str(caught.value).startswith(str(tmp_path / name))


def test_an_animated_gif_gives_its_first_frame_said_so(tmp_path):
    frames = [Image.new("RGB", (8, 8), colour) for colour in ((255, 0, 0), (0, 0, 255))]
    frames[0].save(tmp_path / "two.gif", save_all=True, append_images=frames[1:])
    picture, note = read_image(tmp_path / "two.gif")
    assert note == "animated (2 frames): its first frame taken"
    assert tuple(np.asarray(picture)[0, 0]) == (255, 0, 0)


# ---------------------------------------------------------------------------------------------
# Folders, files and globs


@pytest.fixture
def photos(tmp_path):
    """photos/: a PNG, a JPEG, a nested one, a hidden one, a text file and a link that points nowhere."""
    folder = tmp_path / "photos"
    (folder / "trip").mkdir(parents=True)
    for name in ("b10.png", "b2.JPG", "trip/c.webp", ".hidden.png"):
        Image.fromarray(HALVES).save(folder / name, format="WEBP" if name.endswith("webp") else None)
    (folder / "notes.txt").write_text("not a photo")
    os.symlink(folder / "gone.jpg", folder / "broken.jpg")
    return folder


def names(found) -> list[str]:
    return [f.name for f in found.files]


def test_a_folder_every_image_in_natural_order_and_every_other_entry_skipped_with_why(photos):
    found = find_images(photos)
    assert names(found) == ["b2.JPG", "b10.png", "trip/c.webp"]
    assert dict(found.skipped) == {
        ".hidden.png": "hidden (its name starts with '.'): name it on its own to read it",
        "broken.jpg": "a symbolic link that points nowhere",
        "notes.txt": f"not an image by its name (.txt; images end in {', '.join(IMAGE_SUFFIXES)})"}
    lines = skip_summary(found.skipped, 6)
    assert lines[-1] == "skipped 3 of 6 files: 1 hidden; 1 a symbolic link that points nowhere; 1 not an image by its name"
    floats = [(f"{k}.tif", f"holds floating-point pixels from {k} to {k} (mode F): scale them") for k in (2, 3)]
    lines = skip_summary(floats + found.skipped, 9, shown_first=1)
    assert lines == ["skipped 2.tif: holds floating-point pixels from 2 to 2 (mode F): scale them",
                     "skipped 5 of 9 files (the first above): 2 holds floating-point pixels; 1 hidden; 1 a symbolic link "
                     "that points nowhere; 1 not an image by its name"]


def test_files_several_sources_and_globs(photos, tmp_path):
    assert names(find_images(photos / "b10.png")) == ["b10.png"]
    assert names(find_images(photos / ".hidden.png")) == [".hidden.png"]  # named on its own: read
    assert names(find_images([photos / "b10.png", photos / "trip"])) == ["b10.png", "c.webp"]
    assert names(find_images([photos / "b10.png", photos])) == ["b10.png", "b2.JPG", "trip/c.webp"]  # each file once
    assert names(find_images(f"{photos}/*.png")) == ["b10.png"]
    assert names(find_images(f"{photos}/**/*.webp")) == ["trip/c.webp"]
    with pytest.raises(DataError, match=r"--images: no file or folder matches this pattern"):
        find_images(f"{photos}/*.gif")
    with pytest.raises(DataError, match=r"nope.png: --images: no such file or folder"):
        find_images([photos, tmp_path / "nope.png"])
    with pytest.raises(DataError, match="expected paths of image files or folders, got int"):
        find_images([photos, 3])


def test_the_one_list_of_suffixes():
    from clid import caption
    from clid.data import encoder

    assert caption.IMAGE_SUFFIXES is IMAGE_SUFFIXES and encoder.IMAGE_SUFFIXES is IMAGE_SUFFIXES
    assert {".jpg", ".jpeg", ".png", ".webp", ".tif", ".tiff", ".bmp", ".gif"} == set(IMAGE_SUFFIXES)


# ---------------------------------------------------------------------------------------------
# Image ids from file names (--ids auto, as the README states it)


@pytest.mark.parametrize("name, auto, keep", [
    ("0042.png", "42", "0042"),  # a zero-padded number: the COCO id
    ("COCO_val2014_000000391895.jpg", "391895", "COCO_val2014_000000391895"),
    ("000000391895.jpg", "391895", "000000391895"),  # COCO 2017's names
    ("astronaut.png", "astronaut", "astronaut"),
    ("room101\u00b2.png", "room101\u00b2", "room101\u00b2"),  # not ASCII digits: a name
    ("notes.txt", "notes.txt", "notes.txt"),  # not an image suffix: kept whole
])
def test_ids_auto_and_keep(name, auto, keep):
    assert (auto_key(name), keep_key(name)) == (auto, keep)
