"""The caption command (python -m clid.caption), its Python API (CaptionWriter) and the gallery, on a tiny
checkpoint trained on the toy world in seconds."""
from __future__ import annotations

import json
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, import_script, run_one_thread
from toyworld import make_toy_world

from clid.base.files import DataError, read_jsonl, write_h5_groups

TEST_IDS = [str(i) for i in range(45, 53)]  # the toy world's 8 test images


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The toy world (40 train, 4 val, 8 test images), an image per test image and a tiny checkpoint
    trained for 150 steps (it learns the levels 1 and 2 of the world's captions)."""
    import torch
    from PIL import Image, ImageDraw

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("caption_world")
    captions, features = make_toy_world(root, n_train=40, n_val=4, n_test=8, dim=16)
    images = root / "images"
    images.mkdir()
    rng = np.random.default_rng(0)
    for image_id in TEST_IDS:
        image = Image.new("RGB", (160, 120), tuple(int(c) for c in rng.integers(0, 255, 3)))
        ImageDraw.Draw(image).ellipse((30, 20, 110, 100), fill=tuple(int(c) for c in rng.integers(0, 255, 3)))
        image.save(images / f"{image_id}.png")
    train = import_script("04_train_base.py", "train_for_caption_tests")
    train.main(["--captions", str(captions), "--features", str(features), "--out", str(root / "ck"), "--preset", "tiny",
                "--max-steps", "150", "--warmup", "10", "--batch-size", "16", "--eval-every", "0", "--lr", "2e-3",
                "--dropout", "0", "--output-vocab", str(captions)])
    yield root
    torch.set_num_threads(threads)


def caption_main(*argv):
    from clid.caption.__main__ import main

    main([str(a) for a in argv])


def lines(path) -> list[dict]:
    return list(read_jsonl(path))


def common(world, out, *extra):
    return ["--checkpoint", world / "ck", "--features", world / "features.h5", "--out", out, "--device", "cpu", *extra]


# ---------------------------------------------------------------------------------------------
# The command


@pytest.mark.slow
def test_cli_writes_the_levels_asked_for_as_07_reads_them(world, tmp_path):
    out = tmp_path / "captions.jsonl"
    proc = run_one_thread("-m", "clid.caption", *common(world, out, "--ids", world / "captions.json", "--levels", "1", "2"))
    assert "caption: img 8/8 (100%)" in proc.stdout  # a plain progress line when the output is a file
    records = lines(out)
    assert [(r["image_id"], r["level"]) for r in records] == [(i, level) for i in TEST_IDS for level in (1, 2)]
    from clid.base.text import caption_length

    for r in records:
        assert set(r) == {"image_id", "level", "caption", "length", "in_range", "filled"}
        low, high = (1, 9) if r["level"] == 1 else (10, 19)
        assert r["length"] == caption_length(r["caption"]) - r["filled"]  # the authors' count
        assert r["in_range"] == (low <= r["length"] <= high)
    # the trained checkpoint controls these two lengths, and talks about the toy world
    assert sum(r["in_range"] for r in records) >= 14
    assert all({"a", "the", "park"} & set(r["caption"].split()) for r in records if r["level"] == 2)
    assert "level 2 (10-19 tokens)" in proc.stdout


def test_only_the_requested_levels_are_decoded(world, tmp_path, monkeypatch):
    import clid.model.decode as decode

    decoded = []
    real = decode.mask_predict

    def counting(model, feats, pos, mask, level, *args, **kwargs):
        decoded.append(level)
        return real(model, feats, pos, mask, level, *args, **kwargs)

    monkeypatch.setattr(decode, "mask_predict", counting)
    caption_main(*common(world, tmp_path / "c.jsonl", "--ids", world / "captions.json", "--levels", "3", "6",
                         "--batch-size", "4", "--decode-steps", "2"))
    assert sorted(set(decoded)) == [3, 6] and len(decoded) == 4  # 2 batches x 2 levels
    assert {r["level"] for r in lines(tmp_path / "c.jsonl")} == {3, 6}


def test_every_image_of_the_feature_file_by_default_and_levels_all(world, tmp_path):
    caption_main(*common(world, tmp_path / "all.jsonl", "--decode-steps", "1", "--limit", "5"))
    records = lines(tmp_path / "all.jsonl")
    assert [r["image_id"] for r in records[::7]] == ["1", "2", "3", "4", "5"]
    assert [r["level"] for r in records[:7]] == list(range(1, 8))


@pytest.mark.slow
def test_one_and_three_shards_give_identical_files(world, tmp_path):
    ids = tmp_path / "ids.txt"
    ids.write_text("\n".join(str(i) for i in range(1, 21)) + "\n")
    base = ["--ids", ids, "--levels", "1", "2", "4", "--decode-steps", "3"]
    caption_main(*common(world, tmp_path / "one.jsonl", *base, "--batch-size", "8"))
    for shard in (2, 0, 1):  # in any order; the last to finish merges
        caption_main(*common(world, tmp_path / "three.jsonl", *base, "--batch-size", "3", "--chunk-size", "2",
                             "--num-shards", "3", "--shard-id", shard))
    assert (tmp_path / "three.jsonl").read_bytes() == (tmp_path / "one.jsonl").read_bytes()
    assert len(lines(tmp_path / "one.jsonl")) == 60
    assert not list(tmp_path.glob("three.jsonl.part-*"))


def test_a_killed_run_resumes_and_writes_the_same_file(world, tmp_path, monkeypatch, capsys):
    from clid.caption import CaptionWriter

    base = ["--ids", world / "captions.json", "--levels", "1", "2", "--chunk-size", "3", "--decode-steps", "2"]
    caption_main(*common(world, tmp_path / "whole.jsonl", *base))
    real, calls = CaptionWriter.decode, []

    def dies_on_the_third_chunk(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt  # a kill, as far as the files are concerned
        return real(self, *args, **kwargs)

    monkeypatch.setattr(CaptionWriter, "decode", dies_on_the_third_chunk)
    out = tmp_path / "resumed.jsonl"
    with pytest.raises(KeyboardInterrupt):
        caption_main(*common(world, out, *base))
    assert not out.exists() and len(list(tmp_path.glob("resumed.jsonl.chunk-*"))) == 2
    monkeypatch.setattr(CaptionWriter, "decode", real)
    capsys.readouterr()
    caption_main(*common(world, out, *base))
    assert "resuming: 2 of 3 chunks already done" in capsys.readouterr().out
    assert out.read_bytes() == (tmp_path / "whole.jsonl").read_bytes()
    # other settings are refused, not mixed in
    with pytest.raises(DataError, match="other inputs or settings"):
        caption_main(*common(world, out, *base[:-1], "3"))


@pytest.mark.slow
def test_the_output_scores_in_07_generated(world, tmp_path):
    out = tmp_path / "captions.jsonl"
    caption_main(*common(world, out, "--ids", world / "captions.json", "--levels", "all", "--decode-steps", "3"))
    proc = run_one_thread(ROOT / "07_eval.py", "--refs", world / "captions.json", "--generated", f"mine={out}",
                          "--out", tmp_path / "eval", "--spice", "off")
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())["runs"]["mine"]["levels"]
    records = lines(out)
    for level in range(1, 8):
        at = [r for r in records if r["level"] == level and r["length"]]  # (07 counts a wordless caption apart)
        assert metrics[str(level)]["n_images"] == 8 and metrics[str(level)]["n_captions"] == len(at)
        assert metrics[str(level)]["control_precision"] == pytest.approx(sum(r["in_range"] for r in at) / 8), level
        assert metrics[str(level)]["mean_length"] == pytest.approx(np.mean([r["length"] for r in at])), level
    assert metrics["1"]["control_precision"] > 0.5 and metrics["2"]["CIDEr"] is not None
    assert "mine: 8 of 8 test images have a caption" in proc.stdout


# ---------------------------------------------------------------------------------------------
# The Python API


@pytest.mark.slow
def test_api_gives_the_commands_captions(world, tmp_path):
    from clid.caption import CaptionWriter
    from clid.data.store import FeatureStore

    out = tmp_path / "c.jsonl"
    caption_main(*common(world, out, "--ids", world / "captions.json", "--levels", "1", "3"))
    by_line = {(r["image_id"], r["level"]): r["caption"] for r in lines(out)}

    writer = CaptionWriter.from_checkpoint(world / "ck", "cpu", features=world / "features.h5")
    assert writer.levels[:2] == ((1, 9), (10, 19))
    one = writer.caption("45", levels=[1, 3])
    assert one == {1: by_line[("45", 1)], 3: by_line[("45", 3)]}
    many = writer.caption(TEST_IDS, levels=[3, 1])
    assert list(many) == TEST_IDS and all(many[i] == {1: by_line[(i, 1)], 3: by_line[(i, 3)]} for i in TEST_IDS)
    assert set(writer.caption(45)) == set(range(1, 8))  # every level by default; an int id is fine
    regions = FeatureStore(world / "features.h5").get("46")  # features held in memory: the same captions
    assert writer.caption(regions, levels=[1, 3]) == {1: by_line[("46", 1)], 3: by_line[("46", 3)]}


def test_api_bad_levels_ids_and_features(world, tmp_path):
    from clid.caption import CaptionWriter
    from clid.data.store import Regions

    writer = CaptionWriter.from_checkpoint(world / "ck", "cpu", features=world / "features.h5")
    with pytest.raises(ValueError, match="device: cuda:99: "):  # (blamed on the device, not the checkpoint)
        CaptionWriter.from_checkpoint(world / "ck", "cuda:99")
    with pytest.raises(ValueError, match=r"level 8 is not one of the levels .* 1\.\.7 \(caption: 1-9, 10-19"):
        writer.caption("45", levels=[1, 8])
    with pytest.raises(DataError, match="image nope: no region features"):
        writer.caption("nope")
    with pytest.raises(DataError, match="NaN at region 0"):
        writer.caption(Regions(np.full((2, 16), np.nan, np.float32), np.zeros((2, 4), np.float32), 10, 10))
    narrow = tmp_path / "narrow.h5"
    write_h5_groups(narrow, [("1", {"features": np.ones((2, 8), np.float32), "boxes": np.zeros((2, 4), np.float32)},
                              {"width": 10, "height": 10})])
    with pytest.raises(DataError) as err:
        writer.use_features(narrow)
    assert str(narrow) in str(err.value) and str(world / "ck") in str(err.value)
    assert "8 dimensions" in str(err.value) and "of 16" in str(err.value)


class PixelEncoder:
    """Stands in for the checkpoint's encoder (the toy checkpoint reads 16-d features): each region's
    features are its image's mean colour and size; it keeps the pictures it was given."""

    def __init__(self):
        self.pictures = []

    def __call__(self, pictures, boxes):
        self.pictures += pictures
        out = []
        for picture, image_boxes in zip(pictures, boxes):
            pixels = np.asarray(picture, np.float32) / 255.0
            row = np.resize(np.r_[pixels.mean((0, 1)), picture.width / 100, picture.height / 100], 16)
            out.append((np.tile(row, (1 + len(image_boxes), 1)).astype(np.float32),
                        np.array([[0, 0, picture.width, picture.height], *image_boxes], np.float32)))
        return out


def test_api_reads_files_pil_images_and_arrays_as_the_command_reads_them(world, tmp_path):
    from PIL import Image

    from clid.caption import CaptionWriter, image_files

    writer = CaptionWriter.from_checkpoint(world / "ck", "cpu")
    writer.encoder = encoder = PixelEncoder()
    photo = np.asarray(Image.open(world / "images" / "45.png"))
    sideways = Image.fromarray(np.ascontiguousarray(np.rot90(photo)))  # stored turned left; EXIF 6 turns it back
    exif = sideways.getexif()
    exif[0x0112] = 6
    sideways.save(tmp_path / "phone.jpg", exif=exif.tobytes(), quality=100)
    Image.fromarray(photo).save(tmp_path / "photo.png")
    from_file, from_pil, from_array, from_phone = writer.caption_images(
        [tmp_path / "photo.png", Image.fromarray(photo), photo, str(tmp_path / "phone.jpg")], levels=[1, 2])
    assert from_file == from_pil == from_array and set(from_file) == {1, 2}
    assert [p.size for p in encoder.pictures] == [(160, 120)] * 4  # the phone photo read upright
    np.testing.assert_array_equal(np.asarray(encoder.pictures[2]), photo)
    assert np.abs(np.asarray(encoder.pictures[3], np.int16) - photo).mean() < 3  # (a JPEG's loss)
    assert writer.caption_images(photo[:, :, 0], levels=1)[1].level == 1  # H x W: grey, one image
    # image_files: every image type of a folder, in order (the README's call)
    assert [p.name for p in image_files(tmp_path)] == ["phone.jpg", "photo.png"]
    for bad, named in ((5, "images: is int"), ([photo, 5], "images[1]: is int, not an image"),
                       ([photo.astype(np.float64)], "images[0]: is a NumPy array of shape (120, 160, 3) and type float64"),
                       (tmp_path / "nope.png", "nope.png: no such image file")):
        with pytest.raises(ValueError) as caught:  # (a DataError is a ValueError)
            writer.caption_images(bad, levels=[1])
        assert named in str(caught.value)
    with pytest.raises(ValueError, match="grid must be a whole number, not float 2.5"):
        writer.caption_images(photo, grid=2.5)


def test_api_accounts_for_every_file_as_the_command_does(world, tmp_path):
    """image_files lists a folder as --images does (every other entry in .skipped, with its reason, and one
    warning); caption_images refuses a file it cannot read in one ValueError naming it, and reads an animation's
    first frame with a warning."""
    import struct
    import warnings
    import zlib

    from PIL import Image

    from clid.caption import CaptionWriter, image_files

    folder = tmp_path / "odd"
    folder.mkdir()
    Image.new("RGB", (32, 24), (200, 30, 30)).save(folder / " lead.png")
    Image.new("RGB", (32, 24), (20, 30, 200)).save(folder / "..png", "PNG")
    (folder / "gone.png").symlink_to(folder / "nope.png")
    frames = [Image.new("RGB", (32, 24), (60 * k, 0, 0)) for k in range(3)]
    frames[0].save(folder / "anim.gif", save_all=True, append_images=frames[1:])

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    (folder / "huge.png").write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 30000, 30000, 8, 2, 0, 0, 0))
                                      + chunk(b"IEND", b""))
    with pytest.warns(UserWarning, match="image_files: 2 entries are not read as images"):
        found = image_files(folder)
    assert [p.name for p in found] == [" lead.png", "anim.gif", "huge.png"]
    assert [name for name, _ in found.skipped] == ["..png", "gone.png"]
    writer = CaptionWriter.from_checkpoint(world / "ck", "cpu")
    writer.encoder = PixelEncoder()
    for bad, says in ((folder / "huge.png", "huge.png: too large to read"),
                      (folder / "gone.png", "gone.png: a symbolic link that points nowhere")):
        with pytest.raises(ValueError, match=says):
            writer.caption_images(bad, levels=[1])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        captions = writer.caption_images(found[:2], levels=[1])
    assert len(captions) == 2 and any("anim.gif: animated (3 frames): its first frame taken" in str(w.message) for w in caught)


def test_rows_and_gallery_cards_keep_the_file_name_beside_the_id(world, tmp_path):
    """Zero-padded names are read as COCO ids (--image-ids auto, as the README states); --images takes a file
    and a glob together; each caption line and gallery card names the file."""
    import shutil

    photos = tmp_path / "photos"
    photos.mkdir()
    for image_id in ("45", "46", "47"):
        shutil.copy(world / "images" / f"{image_id}.png", photos / f"00{image_id}.png")
    (tmp_path / "ids.txt").write_text("45\n46\n47\n")
    out, page = tmp_path / "c.jsonl", tmp_path / "g.html"
    caption_main(*common(world, out, "--ids", tmp_path / "ids.txt", "--levels", "1", "--gallery", page, "--images",
                         photos / "0045.png", f"{photos}/*.png"))
    assert [(r["image_id"], r["file"]) for r in lines(out)] == [("45", "0045.png"), ("46", "0046.png"), ("47", "0047.png")]
    text = page.read_text()
    for image_id in ("45", "46", "47"):
        assert f'<div class="id">{image_id}</div><div class="file">00{image_id}.png</div>' in text
    with pytest.raises(DataError, match="image 45: no image file"):  # --image-ids keep: 0045.png is image 0045
        caption_main(*common(world, tmp_path / "k.jsonl", "--ids", tmp_path / "ids.txt", "--levels", "1", "--gallery",
                             tmp_path / "k.html", "--images", photos, "--image-ids", "keep"))
    plain = tmp_path / "plain.jsonl"  # without --images nothing names the files: no "file"
    caption_main(*common(world, plain, "--ids", tmp_path / "ids.txt", "--levels", "1"))
    assert all("file" not in r for r in lines(plain))


# ---------------------------------------------------------------------------------------------
# The gallery


class Page(HTMLParser):
    """The gallery's figures: image id -> {"src": the image's src, "levels": {level: [cell texts]}}."""

    def __init__(self):
        super().__init__()
        self.figures, self.columns, self._figure, self._level, self._cell, self._head = {}, [], None, None, None, False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "section":
            self._figure = self.figures.setdefault(attrs["data-image-id"], {"src": None, "levels": {}})
        elif tag == "img" and self._figure is not None:
            self._figure["src"] = attrs["src"]
        elif tag == "thead":
            self._head = True
        elif tag == "tr" and "data-level" in attrs:
            self._level = self._figure["levels"].setdefault(int(attrs["data-level"]), [])
        elif tag == "td" and self._level is not None:
            self._cell = []
        elif tag == "th" and self._head and len(self.figures) == 1:  # the column names, once
            self._cell = []

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            self._level.append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "th" and self._head and self._cell is not None:
            self.columns.append("".join(self._cell))
            self._cell = None
        elif tag == "thead":
            self._head = False

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


@pytest.mark.parametrize("grid", [0, 100, -1, 2.5, True, "4"])
def test_api_grid_is_checked_as_the_flag_before_any_work(world, grid):
    from clid.caption import CaptionWriter

    writer = CaptionWriter.from_checkpoint(world / "ck", "cpu", features=world / "features.h5")
    with pytest.raises(ValueError, match=r"grid must be (in 1\.\.31|a whole number)"):
        writer.caption_images(world / "nope.png", grid=grid)  # (the grid is refused before the file is read)


def make_gallery(world, folder: Path, *extra) -> Path:
    """Two runs side by side: a baseline at levels 1-3, then the checkpoint with --compare."""
    base = ["--ids", world / "captions.json", "--levels", "1", "2", "3", "--decode-steps", "3"]
    caption_main(*common(world, folder / "base.jsonl", *base, "--eos-decay", "0.5"))
    caption_main(*common(world, folder / "mine.jsonl", *base, "--gallery", folder / "gallery.html", "--images",
                         world / "images", "--name", "CLID", "--compare", f"baseline={folder / 'base.jsonl'}", *extra))
    return folder / "gallery.html"


def test_gallery_has_every_image_at_every_level_in_both_columns(world, tmp_path):
    import base64
    import io

    from PIL import Image

    page = make_gallery(world, tmp_path)
    parsed = Page()
    parsed.feed(page.read_text())
    assert list(parsed.figures) == TEST_IDS
    assert parsed.columns[:3] == ["level", "baseline", "CLID"]
    mine = {(r["image_id"], r["level"]): r for r in lines(tmp_path / "mine.jsonl")}
    base = {(r["image_id"], r["level"]): r for r in lines(tmp_path / "base.jsonl")}
    for image_id, figure in parsed.figures.items():
        assert sorted(figure["levels"]) == [1, 2, 3]
        for level, cells in figure["levels"].items():
            assert cells == [f"{r['caption']} {r['length']}" for r in (base[(image_id, level)], mine[(image_id, level)])]
        assert figure["src"].startswith("data:image/jpeg;base64,")  # embedded: the page is one file
        thumb = Image.open(io.BytesIO(base64.b64decode(figure["src"].split(",", 1)[1])))
        assert thumb.size == (160, 120)  # smaller than --thumbnail: kept as it is
    assert "http" not in page.read_text()  # nothing is fetched from elsewhere


def test_gallery_thumbnails_are_resized_and_captions_escaped(world, tmp_path):
    from clid.caption.gallery import write_gallery

    page = make_gallery(world, tmp_path, "--thumbnail", "64")
    assert 'alt="image 45"' in page.read_text()
    parsed = Page()
    parsed.feed(page.read_text())
    import base64
    import io

    from PIL import Image

    src = parsed.figures["45"]["src"]
    assert Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1]))).size == (64, 48)
    odd = tmp_path / "odd.html"
    write_gallery(odd, ["<b>"], [("run", {("<b>", 1): {"caption": "a <script>x</script> & y"}})], ((1, 9),), [1])
    assert "<script>x" not in odd.read_text() and "&lt;script&gt;" in odd.read_text()


def test_the_page_holds_no_folder_of_this_machine_and_no_photos_metadata(world, tmp_path):
    """The paths in the page's header are relative to it, or names alone; a thumbnail is the photo's pixels alone,
    without its JPEG comment, EXIF or ICC profile."""
    import base64
    import io

    from PIL import Image

    from clid.caption.gallery import thumbnail

    page = make_gallery(world, tmp_path).read_bytes()
    assert str(tmp_path).encode() not in page and str(world).encode() not in page
    assert b"<p>baseline: base.jsonl</p>" in page and b"<p>CLID: ck</p>" in page
    photo = tmp_path / "photo.jpg"
    exif = Image.Exif()
    exif[0x010E] = "private description"  # ImageDescription
    Image.new("RGB", (300, 200), (10, 200, 30)).save(photo, comment=b"private comment", exif=exif.tobytes(),
                                                     icc_profile=b"\0" * 128)
    assert {"comment", "exif", "icc_profile"} <= set(Image.open(photo).info)
    data = base64.b64decode(thumbnail(photo, "1").split(",", 1)[1])
    assert b"private" not in data and not {"comment", "exif", "icc_profile"} & set(Image.open(io.BytesIO(data)).info)


def test_the_page_bytes_hold_nothing_private(world, tmp_path):
    """Every path given absolute (an unfinished --checkpoint, --features, --ids, --compare, --images and the page
    itself), photos holding a JPEG comment, EXIF (a GPS position), XMP, an ICC profile and PNG text: the page's
    bytes hold none of them, nor any folder of this machine; its thumbnails are pixels alone."""
    import base64
    import io
    import json
    import re
    import shutil

    from PIL import Image, PngImagePlugin

    checkpoint = tmp_path / "my runs" / "ck"
    shutil.copytree(world / "ck", checkpoint)
    state = json.loads((checkpoint / "train_state.json").read_text())
    (checkpoint / "train_state.json").write_text(json.dumps(dict(state, step=1)))  # unfinished: a warning in the page
    photos = tmp_path / "photos"
    photos.mkdir()
    exif = Image.Exif()
    exif[0x010E] = "SECRET-EXIF"  # ImageDescription
    exif[0x8825] = {1: "N", 2: (51.0, 30.0, 0.0)}  # GPS
    Image.open(world / "images" / "45.png").convert("RGB").save(
        photos / "45.jpg", comment=b"SECRET-COMMENT", exif=exif.tobytes(), icc_profile=b"SECRET-ICC" + b"\0" * 128,
        xmp=b"<x:xmpmeta>SECRET-XMP</x:xmpmeta>")
    text = PngImagePlugin.PngInfo()
    text.add_text("Comment", "SECRET-PNG-TEXT")
    Image.open(world / "images" / "46.png").save(photos / "46.png", pnginfo=text)
    (tmp_path / "ids.txt").write_text("45\n46\n")
    base = tmp_path / "earlier" / "base.jsonl"
    base.parent.mkdir()
    caption_main(*common(world, base, "--ids", tmp_path / "ids.txt", "--levels", "1"))
    page = tmp_path / "pages" / "g.html"
    caption_main("--checkpoint", checkpoint.resolve(), "--features", (world / "features.h5").resolve(), "--device", "cpu",
                 "--out", tmp_path / "pages" / "c.jsonl", "--ids", (tmp_path / "ids.txt").resolve(), "--levels", "1",
                 "--gallery", page.resolve(), "--images", (photos / "45.jpg").resolve(), f"{photos.resolve()}/*.png",
                 "--compare", f"earlier={base.resolve()}")
    data = page.read_bytes()
    assert b"SECRET" not in data and b"is unfinished" in data
    for folder in (tmp_path, tmp_path.resolve(), world, Path.home()):
        assert str(folder).encode() not in data, folder
    assert b"<p>earlier: base.jsonl</p>" in data and b"warning: ck is unfinished" in data
    thumbnails = re.findall(rb'src="data:image/jpeg;base64,([^"]+)"', data)
    assert len(thumbnails) == 2
    for encoded in thumbnails:
        raw = base64.b64decode(encoded)
        assert b"SECRET" not in raw and not {"comment", "exif", "icc_profile", "xmp"} & set(Image.open(io.BytesIO(raw)).info)


CHROMIUM = Path("/usr/bin/chromium")


@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed")
def test_gallery_renders_in_a_real_browser(world, tmp_path):
    """Headless Chromium loads the page: its DOM holds every figure and every image decodes."""
    from PIL import Image

    page = make_gallery(world, tmp_path)
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}"]
    shot = tmp_path / "shot.png"
    subprocess.run([str(CHROMIUM), *flags, f"--screenshot={shot}", "--window-size=1200,1600", page.as_uri()],
                   capture_output=True, timeout=120, check=True)
    pixels = np.asarray(Image.open(shot).convert("RGB"), dtype=np.float32)
    assert pixels.shape[:2] == (1600, 1200) and pixels.std() > 20  # not a blank page
    # the JS-evaluated DOM: every image loaded (a broken data URI has naturalWidth 0)
    probe = tmp_path / "probe.html"
    probe.write_text(page.read_text().replace(
        "</body>", "<script>window.onload = () => { document.title = [...document.images]"
                   ".map(i => i.naturalWidth).join(','); };</script></body>"))
    dom = subprocess.run([str(CHROMIUM), *flags, "--dump-dom", "--virtual-time-budget=5000", probe.as_uri()],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    widths = dom.split("<title>", 1)[1].split("</title>", 1)[0].split(",")
    assert widths == ["160"] * 8
    assert dom.count('class="figure"') == 8 and dom.count("data-level=") == 24


# ---------------------------------------------------------------------------------------------
# Bad input the command meets (the bad-input table has more rows)


def test_bad_input_leaves_no_output(world, tmp_path):
    out = tmp_path / "c.jsonl"
    cases = [
        (["--ids", tmp_path / "ids.txt"], "ids.txt: image nope: no region features in"),
        (["--levels", "8"], "--levels: level 8 is not one of the levels"),
        (["--gallery", tmp_path / "g.html", "--images", tmp_path / "empty"], "--images: no such file or folder"),
    ]
    (tmp_path / "ids.txt").write_text("45\nnope\n")
    for extra, message in cases:
        with pytest.raises(DataError, match=message):
            caption_main(*common(world, out, *extra))
        assert not out.exists() and not (tmp_path / "g.html").exists()


def test_help_says_the_device_default(capsys):
    with pytest.raises(SystemExit):
        caption_main("--help")
    shown = " ".join(capsys.readouterr().out.split())
    assert "(default: cuda if available, else cpu)" in shown and "--gallery HTML" in shown


def test_images_never_replace_a_feature_file_unasked(tmp_path, monkeypatch):
    """--images without --features computes OUT.features.h5; one already there that is not what this run would
    compute (a file the user made with other settings, or images changed since) is refused before anything is
    written, unless --restart."""
    import argparse

    from PIL import Image

    import clid.caption
    import clid.model.checkpoints
    from clid.caption.__main__ import compute_features
    from clid.data.images import find_images

    monkeypatch.setattr(clid.caption, "encoder_settings", lambda config, path: {"colour_bins": 4})
    monkeypatch.setattr(clid.model.checkpoints, "read_config", lambda path: {})
    images = tmp_path / "photos"
    images.mkdir()
    Image.new("RGB", (32, 24), (200, 30, 30)).save(images / "1.png")
    mine = tmp_path / "c.features.h5"
    mine.write_bytes(b"the user's grid-2 features")
    args = argparse.Namespace(images=[str(images)], out=str(tmp_path / "c.jsonl"), grid=4, restart=False,
                              checkpoint="ck", num_shards=1, shard_id=0, image_ids="auto", device=None)
    with pytest.raises(DataError, match="c.features.h5: exists and this command did not write it"):
        compute_features(args, find_images(args.images), mine)
    assert mine.read_bytes() == b"the user's grid-2 features"
