"""Bad input of 01_saliency.py: one row per malformed input (tests/badinput.py runs and checks them)."""
from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import pytest
from badinput import (
    BINARY,
    Payload,
    Row,
    Table,
    World,
    _must,
    check_row,
    copy_to,
    graph,
    image_folder,
    karpathy,
    link_to,
    run_stage,
    scene_graphs,
    set_in,
    write,
)

table = Table()
row = table.row

# -- 01 saliency ------------------------------------------------------------------------------------------
row("01", "no-image-folder", lambda w, d: ["--images", d / "nope", "--out", d / "out.h5"], "image folder not found")

row("01", "list-missing", lambda w, d: ["--images", w.images, "--list", d / "nope.json", "--out", d / "out.h5"], "image list not found")

row("01", "list-not-json", lambda w, d: ["--images", w.images, "--list", write(d, "l.json", "[1,"), "--out", d / "out.h5"], "not valid json")

row("01", "list-of-ints", lambda w, d: ["--images", w.images, "--list", write(d, "l.json", [1, 2]), "--out", d / "out.h5"], "not a captions json")

row("01", "list-binary", lambda w, d: ["--images", w.images, "--list", write(d, "l.txt", BINARY), "--out", d / "out.h5"], "utf-8")

row("01", "image-data-no-id", lambda w, d: ["--images", w.images, "--list", write(d, "l.json", [{"width": 5}]), "--out", d / "out.h5"], "no 'image_id'")

row("01", "image-data-id-null", lambda w, d: ["--images", w.images, "--list", write(d, "l.json", [{"image_id": None, "width": 5}]), "--out", d / "out.h5"], "no 'image_id'")

row("01", "list-split-null", lambda w, d: ["--images", w.images, "--list", karpathy(w, d, set_in(0, split=None)), "--out", d / "out.h5"], "'split' must be a string")

row("01", "list-duplicate-cocoid", lambda w, d: ["--images", w.images, "--list", karpathy(w, d, set_in(1, cocoid=1)), "--out", d / "out.h5"], "duplicate image id 1")

row("01", "list-scene-graph-id-null", lambda w, d: ["--images", w.images, "--list", scene_graphs(d, graph(image_id=None)), "--out", d / "out.h5"], "'image_id' must be")

row("01", "corrupt-image", lambda w, d: ["--images", image_folder(d, w, {"bad.jpg": b"\xff\xd8 not a jpeg"}), "--out", d / "out.h5"],
    "1 image(s) failed", leaves_output=True)

row("01", "empty-image", lambda w, d: ["--images", image_folder(d, w, {"bad.png": b""}), "--out", d / "out.h5"],
    "1 image(s) failed", leaves_output=True)

row("01", "text-as-image", lambda w, d: ["--images", image_folder(d, w, {"bad.png": "hello"}), "--out", d / "out.h5"],
    "1 image(s) failed", leaves_output=True)

row("01", "listed-image-missing", lambda w, d: ["--images", w.images, "--list", write(d, "l.txt", "1.png\nnope.png\n"), "--out", d / "out.h5"],
    "1 image(s) failed", leaves_output=True)

row("01", "two-files-one-id", lambda w, d: ["--images", image_folder(d, w, {"1.jpg": (w.images / "1.png").read_bytes()}), "--out", d / "out.h5"],
    "two images with the id")

row("01", "emlnet-weights-missing", lambda w, d: ["--images", w.images, "--out", d / "out.h5", "--method", "emlnet", "--weights", d / "nope.pth"],
    "weights not found")

row("01", "emlnet-weights-garbage", lambda w, d: ["--images", w.images, "--out", d / "out.h5", "--method", "emlnet", "--weights", write(d, "w.pth", BINARY)],
    "w.pth")

row("01", "emlnet-weights-pickle-payload", lambda w, d: ["--images", w.images, "--out", d / "out.h5", "--method", "emlnet",
                                                          "--weights", write(d, "w.pth", pickle.dumps(Payload(d / "pwned")))],
    "w.pth")

row("01", "empty-shard", lambda w, d: ["--images", w.images, "--out", d / "out.h5", "--num-shards", "5", "--shard-id", "4"],
    "", kind="ok")

row("01", "preview-graphs-not-json", lambda w, d: ["--images", w.images, "--out", d / "out.h5", "--preview", "1",
                                                    "--scene-graphs", write(d, "sg.json", "[{")], "not valid json")

row("01", "image-data-id-object", lambda w, d: ["--images", w.images, "--list", write(d, "l.json", [{"image_id": {"a": 1}, "width": 5}]),
                                                "--out", d / "out.h5"], "'image_id' must be")

row("01", "list-repeated-names-counted", lambda w, d: ["--images", w.images, "--list", write(d, "l.txt", "1.png\n1.png\n107899.png\n"),
                                                       "--out", d / "out.h5"], "1 repeated entries of the image list are processed once (image 1)", "skip")

row("01", "list-text-bom", lambda w, d: ["--images", w.images, "--list", write(d, "l.txt", "\ufeff1.png\n107899.png\n"),
                                         "--out", d / "out.h5"], "2 images have a map", "ok")

row("01", "out-unrelated-file", lambda w, d: ["--images", w.images, "--out", copy_to(w.saliency, d, "s.h5")], "did not write it")

row("01", "out-unrelated-file-restart", lambda w, d: ["--images", w.images, "--out", copy_to(w.saliency, d, "s.h5"), "--restart"],
    "s.h5: this stage did not write it (it has no run record s.h5.run.json): it is kept")  # (--restart discards its own work only)

def images_changed_in_a_subfolder(w: World, d: Path) -> list:
    """01 over a folder whose images are in a subfolder, done; then one image is redrawn."""
    from PIL import Image

    shutil.copytree(w.images, d / "images" / "sub")
    argv = ["--images", d / "images", "--out", d / "s.h5"]
    _must(run_stage("01", argv))
    Image.new("RGB", (64, 48), "red").save(d / "images" / "sub" / "1.png")
    return argv

row("01", "rerun-after-an-image-in-a-subfolder-changed", images_changed_in_a_subfolder, "the file of --images changed")

# -- image ids that are paths: an id names its HDF5 group ("a/b" would be a group b in a group a) and its preview file
ID_PATHS = {"up-one": "../x", "up-two": "../../escaped", "slash": "a/b", "backslash": "a\\b", "dot-dot": "..",
            "dot": ".", "control": "x\x01y", "newline": "x\ny", "nul": "x\x00y", "backslash-up": "..\\x"}

for which, image_id in ID_PATHS.items():
    row("01", f"image-data-id-{which}", lambda w, d, image_id=image_id: [
        "--images", w.images, "--list", write(d, "l.json", [{"image_id": 1, "file_name": "1.png"},
                                                          {"image_id": image_id, "file_name": "107899.png"}]),
        "--out", d / "out.h5", "--preview", "2"], "the image id")

row("01", "image-data-id-absolute", lambda w, d: [
    "--images", w.images, "--list", write(d, "l.json", [{"image_id": str(d / "abs"), "file_name": "1.png"}]),
    "--out", d / "out.h5"], "the image id")

for which in ("up-one", "slash", "dot-dot"):
    row("01", f"captions-cocoid-{which}", lambda w, d, which=which: [
        "--images", w.images, "--list", karpathy(w, d, set_in(0, cocoid=ID_PATHS[which], filename="1.png")),
        "--out", d / "out.h5"], "the image id")

for name, which in (("..png", "dot"), ("...png", "dot-dot")):  # the stem of "..png" is ".", of "...png" ".."
    row("01", f"image-file-named-{which}-png", lambda w, d, name=name: [
        "--images", image_folder(d, w, {name: (w.images / "1.png").read_bytes()}), "--out", d / "out.h5"], "the image id")


# -- outputs over inputs: the previews are written as ID.png, over the photo of that name in --images ------------
def previews_into(w: World, d: Path, where) -> list:
    """01's arguments with previews written into ``where(images)``, a copy of the world's images at d/images."""
    images = image_folder(d, w, {})
    return ["--images", images, "--out", d / "out.h5", "--preview", "2", "--preview-dir", where(images)]

row("01", "preview-dir-is-images", lambda w, d: previews_into(w, d, lambda i: i), "is inside --images")

row("01", "preview-dir-is-images-another-spelling", lambda w, d: previews_into(w, d, lambda i: i / ".." / "images"),
    "is inside --images")

row("01", "preview-dir-a-link-to-images", lambda w, d: previews_into(w, d, lambda i: link_to(d, "link", i)), "is inside --images")

row("01", "preview-dir-inside-images", lambda w, d: previews_into(w, d, lambda i: i / "previews"), "is inside --images")

# -- a preview folder that holds files: 01 replaces only the previews it wrote, unchanged since ---------------
def previews_again(w: World, d: Path, change=None) -> list:
    """01 run once with two previews in d/previews; ``change`` (of the folder) applied; the row runs again into
    another --out and the same folder."""
    _must(run_stage("01", ["--images", w.images, "--out", d / "first.h5", "--preview", "2", "--preview-dir", d / "previews"]))
    if change:
        change(d / "previews")
    return ["--images", w.images, "--out", d / "out.h5", "--preview", "2", "--preview-dir", d / "previews"]

def repainted(folder: Path) -> None:
    """The user's edit of a preview: one pixel painted black, its PNG text (the digest) kept."""
    from PIL import Image

    with Image.open(folder / "1.png") as img:
        img.load()
        text = dict(img.text)
    img.putpixel((0, 0), (0, 0, 0))
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    for key, value in text.items():
        info.add_text(key, value)
    img.save(folder / "1.png", pnginfo=info)

row("01", "preview-dir-its-own-previews", lambda w, d: previews_again(w, d), "previews in", "ok")

row("01", "preview-dir-a-preview-edited-since", lambda w, d: previews_again(w, d, repainted),
    "1.png: is not a preview this stage wrote (or was changed since): it is kept")

row("01", "preview-dir-holds-the-users-1.png", lambda w, d: ["--images", w.images, "--out", d / "out.h5", "--preview", "2",
                                                               "--preview-dir", image_folder(d, w, {})],
    "1.png: is not a preview this stage wrote")

row("01", "out-a-hard-link-to-an-image", lambda w, d: ["--images", (i := image_folder(d, w, {})), "--out",
                                                       link_to(d, "out.h5", i / "1.png", hard=True)], "is also the input --images")

row("01", "out-a-link-to-the-list", lambda w, d: ["--images", w.images, "--list", (lst := write(d, "l.json", [{"image_id": 1, "file_name": "1.png"}])),
                                                  "--out", link_to(d, "out.h5", lst)], "is also the input --list")

row("01", "out-the-run-record-of-itself", lambda w, d: ["--images", w.images, "--list", write(d, "l.h5.run.json", [{"image_id": 1, "file_name": "1.png"}]),
                                                        "--out", d / "l.h5"], "is also the input --list")


row("01", "preview-dir-a-file", lambda w, d: ["--images", w.images, "--out", d / "out.h5", "--preview", "2",
                                                    "--preview-dir", write(d, "pf", "x")], "is a file, not a folder")
row("01", "preview-dir-under-a-file", lambda w, d: ["--images", w.images, "--out", d / "out.h5", "--preview", "2",
                                                          "--preview-dir", write(d, "pf", "x") / "sub"], "which is a file, not a folder")


@pytest.mark.parametrize("row", table.params())
def test_bad_input(row: Row, world: World, tmp_path):
    check_row(row, world, tmp_path)
