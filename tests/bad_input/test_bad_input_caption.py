"""Bad input of python -m clid.caption: one row per malformed input (tests/badinput.py runs and checks them)."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from badinput import (
    BINARY,
    CHECKPOINT_CASES,
    FEATURE_CASES,
    Row,
    Table,
    World,
    _must,
    after,
    big_endian,
    check_row,
    copy_to,
    first,
    first_group,
    h5_changed,
    image_folder,
    jsonl_lines,
    karpathy,
    link_to,
    poke,
    run_stage,
    write,
)

table = Table()
row = table.row

row("caption", "features-big-endian", lambda w, d: w.caption_args(d, "--features", big_endian(w, d)), "", "ok")

# -- python -m clid.caption: image ids, levels, features, the gallery's images ----------------------------
def ids_file(d: Path, content) -> list:
    return ["--ids", write(d, "ids.txt" if isinstance(content, (str, bytes)) else "ids.json", content)]

def narrow_features(d: Path) -> Path:
    """A feature file of 8-dimensional regions (the checkpoints read 16)."""
    from clid.base.files import write_h5_groups

    path = d / "narrow.h5"
    write_h5_groups(path, [(str(i), {"features": np.ones((2, 8), np.float32), "boxes": np.array([[0, 0, 5, 5]] * 2, np.float32)},
                            {"width": 10.0, "height": 10.0}) for i in (1, 2)])
    return path

CAPTION_ROWS = [
    ("unknown-image-id", lambda w, d: ids_file(d, "11\nnope\n"), "image nope: no region features in"),
    ("empty-id-list", lambda w, d: ids_file(d, ""), "no image id to caption"),
    ("blank-id-list", lambda w, d: ids_file(d, "\n \n"), "no image id to caption"),
    ("empty-json-id-list", lambda w, d: ids_file(d, []), "no image id to caption"),
    ("id-null", lambda w, d: ids_file(d, [11, None]), "[1]: an image id must be"),
    ("ids-object", lambda w, d: ids_file(d, {"ids": 5}), "expected a list of image ids"),
    ("ids-binary", lambda w, d: ids_file(d, BINARY), "utf-8"),
    ("ids-missing", lambda w, d: ["--ids", d / "nope.txt"], "no such file"),
    ("ids-captions-no-test-image", lambda w, d: ["--ids", karpathy(w, d, lambda x: [im.update(split="train") for im in x["images"]])],
     "holds no image of split 'test'"),
    ("level-outside", lambda w, d: ["--levels", "8"], "level 8 is not one of the levels of the checkpoint"),
    ("level-zero", lambda w, d: ["--levels", "0"], "takes level numbers from 1"),
    ("level-word", lambda w, d: ["--levels", "two"], "takes level numbers from 1"),
    ("level-all-and-number", lambda w, d: ["--levels", "all", "2"], "takes level numbers from 1"),
    ("features-other-dimension", lambda w, d: ["--features", narrow_features(d)], "8 dimensions, but the checkpoint"),
    ("decode-steps-count", lambda w, d: ["--decode-steps", "1", "2"], "one number per level (7)"),
    ("limit-zero", lambda w, d: ["--limit", "0"], "argument --limit: must be a positive integer"),
    ("out-not-jsonl", lambda w, d: ["--out", d / "captions.txt"], "must end in .jsonl"),
    ("gallery-is-out", lambda w, d: ["--gallery", d / "captions.jsonl"], "is both --out and --gallery"),
    ("images-without-gallery", lambda w, d: ["--images", w.images], "give --gallery"),
    ("gallery-no-image-folder", lambda w, d: ["--ids", write(d, "ids.txt", "1\n"), "--gallery", d / "g.html", "--images", d / "nope"],
     "--images: no such file or folder"),
    ("gallery-image-missing", lambda w, d: ["--ids", write(d, "ids.txt", "1\n2\n"), "--gallery", d / "g.html", "--images", w.images],
     "image 2: no image file"),
    ("gallery-image-unreadable", lambda w, d: ["--ids", write(d, "ids.txt", "1\n"), "--gallery", d / "g.html",
                                               "--images", image_folder(d, w, {"1.png": b"\x89PNG not really"})],
     "image 1: cannot be read as an image"),
    ("gallery-image-empty", lambda w, d: ["--ids", write(d, "ids.txt", "1\n"), "--gallery", d / "g.html",
                                          "--images", image_folder(d, w, {"1.png": b""})], "cannot be read as an image"),
    ("compare-not-name-file", lambda w, d: ["--gallery", d / "g.html", "--compare", w.generated], "expected NAME=FILE"),
    ("compare-missing", lambda w, d: ["--gallery", d / "g.html", "--compare", f"base={d / 'nope.jsonl'}"], "no such file"),
    ("compare-bad-line", lambda w, d: ["--gallery", d / "g.html", "--compare", f"base={jsonl_lines(w.generated, d, lambda r: r + ['{'])}"],
     "not valid json"),
    ("compare-level-outside", lambda w, d: ["--gallery", d / "g.html", "--compare", f"base={jsonl_lines(w.generated, d, first(level=9))}"],
     "outside 1..7"),
]

for name, make, fragment in CAPTION_ROWS:
    row("caption", name, lambda w, d, make=make: w.caption_args(d, *make(w, d)), fragment)

for name, make, fragment, kind, needs in FEATURE_CASES[:5] + FEATURE_CASES[11:12]:
    row("caption", f"features-{name}", lambda w, d, make=make: w.caption_args(d, "--features", make(w, d)), fragment, kind, needs)

for name, make, fragment in CHECKPOINT_CASES:
    row("caption", f"checkpoint-{name}", lambda w, d, make=make: w.caption_args(d, "--checkpoint", make(w, d)), fragment)

row("caption", "features-nan-skipped", lambda w, d: w.caption_args(d, "--bad-features", "skip", "--levels", "1", "--features",
                                                                    h5_changed(w.features, d, first_group(poke("features", (0, 0), np.nan)))),
    "skipped 1 image(s) with bad region features", "skip")

row("caption", "empty-shard", lambda w, d: w.caption_args(d, "--ids", write(d, "ids.txt", "11\n"), "--num-shards", "3", "--shard-id", "2"),
    "", "ok")

row("caption", "features-a-folder", lambda w, d: w.caption_args(d, "--features", w.images),
    "is a folder, not a region-feature file")

row("caption", "checkpoint-folder-missing", lambda w, d: w.caption_args(d, "--checkpoint", d / "runs" / "clid"),
    "no such checkpoint folder")

row("caption", "precision-bf16", lambda w, d: w.caption_args(d, "--precision", "bf16", "--levels", "1"), "captions of", "ok")

row("caption", "out-unrelated-captions", lambda w, d: w.caption_args(d) if copy_to(w.generated, d, "captions.jsonl") else None,
    "this stage did not write it")

row("caption", "out-unrelated-captions-restart", lambda w, d: w.caption_args(d, "--restart")
    if copy_to(w.generated, d, "captions.jsonl") else None, "captions.jsonl: this stage did not write it (it has no run "
    "record captions.jsonl.run.json): it is kept")

row("caption", "gallery-unrelated-page", lambda w, d: w.caption_args(d, "--gallery", write(d, "g.html", "<html>mine</html>")),
    "is not a gallery this command wrote")

row("caption", "gallery-its-own-page", lambda w, d: after("caption", w.caption_args(d, "--gallery", d / "g.html"), w.caption_args(
    d, "--gallery", d / "g.html")), "gallery:", "ok")

row("caption", "gallery-a-folder", lambda w, d: w.caption_args(d, "--gallery", d), "is a folder")

row("caption", "ids-with-a-space", lambda w, d: w.caption_args(d, "--ids", write(d, "ids.txt", "my photo\n"), "--features", h5_changed(
    w.features, d, lambda f: f.copy(f["11"], "my photo"))), "captions of 1 images", "ok")

row("caption", "levels-L1", lambda w, d: w.caption_args(d, "--levels", "L1"), "captions of", "ok")

row("caption", "levels-comma-list", lambda w, d: w.caption_args(d, "--levels", "1,1"), "captions of", "ok")

row("caption", "levels-superscript", lambda w, d: w.caption_args(d, "--levels", "1\u00b2"), "digits 0-9")

row("caption", "levels-zero", lambda w, d: w.caption_args(d, "--levels", "L0"), "level numbers from 1")

row("caption", "limit-superscript", lambda w, d: w.caption_args(d, "--limit", "3\u00b2"), "argument --limit")

# -- captions of images without a feature file (--images, --grid), n-gram blocking (--block-ngram) -----------
def no_features(w, d, *extra) -> list:
    """The caption command's flags without --features."""
    args = w.caption_args(d, *extra)
    at = args.index("--features")
    return args[:at] + args[at + 2:]

row("caption", "neither-features-nor-images", lambda w, d: no_features(w, d), "give --features")

row("caption", "images-of-a-checkpoint-on-foreign-features", lambda w, d: no_features(w, d, "--images", w.images),
    "cannot compute from an image")  # the toy world's features: no kind an image encoder here computes

row("caption", "images-sharded-without-features", lambda w, d: no_features(w, d, "--images", w.images, "--num-shards", "2"),
    "a sharded run reads one feature file")

row("caption", "images-missing-folder", lambda w, d: no_features(w, d, "--images", d / "nope"), "--images: no such file or folder")

row("caption", "gallery-over-the-computed-features", lambda w, d: no_features(
    w, d, "--images", w.images, "--gallery", d / "captions.features.h5"), "is both --gallery and (the features file this run computes")

def linked(link: Path, target: Path) -> Path:
    link.symlink_to(target)
    return link

row("caption", "gallery-a-link-to-the-computed-features", lambda w, d: no_features(
    w, d, "--images", w.images, "--gallery", linked(d / "g.html", d / "captions.features.h5")), "is both --gallery and (the features file this run computes")

for value in ("0", "32", "x"):
    row("caption", f"grid-{value}", lambda w, d, value=value: no_features(w, d, "--images", w.images, "--grid", value),
        "argument --grid")

row("caption", "block-ngram-0", lambda w, d: w.caption_args(d, "--block-ngram", "0", "--levels", "1"), "captions of", "ok")

row("caption", "block-ngram-2", lambda w, d: w.caption_args(d, "--block-ngram", "2", "--levels", "2"), "captions of", "ok")

# -- the gallery's --images: files, globs, and what the one reader of images cannot read ----------------------
def gallery_of(w, d, images, ids="1\n") -> list:
    return w.caption_args(d, "--ids", write(d, "ids.txt", ids), "--levels", "1", "--gallery", d / "g.html", "--images",
                          *images)

def odd_images(d: Path, **files) -> Path:
    """A folder of images made by ``files``: name -> a function of the path that writes it."""
    folder = d / "odd"
    folder.mkdir()
    for name, make in files.items():
        make(folder / name.replace("_", "."))
    return folder

def gif(path: Path) -> None:
    from PIL import Image

    frames = [Image.new("RGB", (16, 12), colour) for colour in ("red", "blue")]
    frames[0].save(path, save_all=True, append_images=frames[1:])

def float_tiff(path: Path) -> None:
    from PIL import Image

    Image.fromarray(np.full((12, 16), 300.0, np.float32), "F").save(path)

row("caption", "gallery-image-a-file", lambda w, d: gallery_of(w, d, [w.images / "1.png"]), "gallery:", "ok")

row("caption", "gallery-images-file-and-glob", lambda w, d: gallery_of(w, d, [w.images / "1.png", f"{w.images}/*.png"]),
    "gallery:", "ok")

row("caption", "gallery-images-glob-matches-nothing", lambda w, d: gallery_of(w, d, [f"{w.images}/*.gif"]),
    "no file or folder matches this pattern")

row("caption", "gallery-image-animated-gif", lambda w, d: gallery_of(w, d, [odd_images(d, **{"1_gif": gif})]), "gallery:", "ok")

row("caption", "gallery-image-broken-link", lambda w, d: gallery_of(w, d, [odd_images(d, **{"1_png": lambda p: p.symlink_to(
    d / "gone.png")})]), "image 1: no image file: 1.jpg, 1.png, ... (an image's id is its file name without extension); "
                         "1.png was skipped: a symbolic link that points nowhere")

row("caption", "gallery-image-backslash-name",  # "0\\1.png" is no image 1: the backslash is no folder here
    lambda w, d: gallery_of(w, d, [odd_images(d, **{"0\\1_png": lambda p: copy_to(w.images / "1.png", p.parent, p.name)})]),
    "image 1: no image file: 1.jpg, 1.png, ... (an image's id is its file name without extension); 0\\1.png was skipped: "
    "a name that cannot be an id")

row("caption", "gallery-image-text-file", lambda w, d: gallery_of(w, d, [odd_images(d, **{"1_txt": lambda p: p.write_text("hi")})]),
    "1.txt was skipped: not an image by its name")

row("caption", "gallery-image-floats-beyond-one", lambda w, d: gallery_of(w, d, [odd_images(d, **{"1_tif": float_tiff})]),
    "image 1: holds floating-point pixels from 300 to 300 (mode f)")

row("caption", "gallery-image-unreadable-permissions", lambda w, d: gallery_of(w, d, [odd_images(d, **{"1_png": lambda p: (
    copy_to(w.images / "1.png", p.parent, "1.png"), p.chmod(0))})]), "image 1: cannot be read as an image|gallery:",
    "error" if os.geteuid() else "ok")

# -- captions of an exact length (--length N), and a checkpoint whose training did not finish ------------------
for value, fragment in (("0", "argument --length"), ("five", "argument --length"), ("5\u00b2", "argument --length"),
                        ("70", "--length: length 70 is outside 1..69")):
    row("caption", f"length-{value}", lambda w, d, value=value: w.caption_args(d, "--length", value), fragment)

row("caption", "length-and-levels", lambda w, d: w.caption_args(d, "--length", "5", "--levels", "1"),
    "--length and --levels exclude each other")

for value in ("1", "69"):
    row("caption", f"length-{value}-ok", lambda w, d, value=value: w.caption_args(d, "--length", value),
        f"have exactly {value} tokens", "ok")

def unfinished_checkpoint(w: World, d: Path) -> Path:
    """A copy of the trusted checkpoint (2 steps) whose training state says step 1."""
    import json
    import shutil

    folder = Path(shutil.copytree(w.trusted, d / "stopped"))
    state = json.loads((folder / "train_state.json").read_text())
    (folder / "train_state.json").write_text(json.dumps({**state, "step": 1}))
    return folder

row("caption", "checkpoint-unfinished", lambda w, d: w.caption_args(d, "--levels", "1", "--checkpoint",
                                                                      unfinished_checkpoint(w, d)),
    "is unfinished: step 1 of 2; the same training command resumes it", "ok")


# -- the features --images computes beside --out: one the user made, or of photos changed since, is never replaced -
def grid_checkpoint(d: Path) -> Path:
    """An untrained tiny checkpoint on the features clid.features computes (4 colour bins), whose captions do not
    matter here: the caption command computes the features of --images for it."""
    import torch

    from clid.data.encoder import RegionEncoder
    from clid.features.__main__ import KIND
    from clid.model.captioner import build_model, preset_config
    from clid.model.checkpoints import save_model

    torch.manual_seed(0)
    dim = RegionEncoder.dim + 2 * 4 ** 3
    save_model(build_model(preset_config("tiny", region_dim=dim)), d / "ck", {"feature_kind": KIND, "feature_dim": dim})
    return d / "ck"

def of_photos(d: Path, images: Path, *extra) -> list:
    return ["--checkpoint", grid_checkpoint(d) if not (d / "ck").exists() else d / "ck", "--images", images,
            "--out", d / "c.jsonl", "--device", "cpu", "--decode-steps", "1", "--levels", "1", *extra]

row("caption", "images-beside-grid-2-features-the-user-made", lambda w, d: after(
    "features", ["--images", w.images, "--boxes", "grid", "2", "--out", d / "c.features.h5"], of_photos(d, w.images)),
    "c.features.h5: exists and this command did not write it (python -m clid.features wrote it, and it differs: --boxes")

def photo_added_since(w: World, d: Path) -> list:
    """The caption command's arguments for a folder of photos captioned once, then given one more photo."""
    images = image_folder(d, w, {})
    _must(run_stage("caption", of_photos(d, images)))
    write(images, "3.png", (images / "1.png").read_bytes())
    return of_photos(d, images)

row("caption", "images-a-photo-added-since-the-features", photo_added_since, "images 1 added (3.png)")

def features_edited_since(w: World, d: Path) -> list:
    """Photos captioned once, then the features file that run computed changed by the user (a byte added), and a
    photo added: the second run would compute the features again, over the user's file."""
    images = image_folder(d, w, {})
    _must(run_stage("caption", of_photos(d, images)))
    with open(d / "c.features.h5", "ab") as f:
        f.write(b"\n")
    write(images, "3.png", (images / "1.png").read_bytes())
    return of_photos(d, images, "--restart")

row("caption", "images-features-edited-since", features_edited_since,
    "c.features.h5: was changed since this command wrote it (its size or modification time is not the one its run "
    "record c.features.h5.run.json holds): it is kept")

row("caption", "gallery-unrelated-page-restart", lambda w, d: w.caption_args(d, "--gallery", write(d, "g.html", "<html>mine</html>"),
                                                                              "--restart"), "is not a gallery this command wrote: it is kept")

row("caption", "gallery-a-hard-link-to-an-image", lambda w, d: of_photos(d, (i := image_folder(d, w, {})), "--gallery",
                                                                         link_to(d, "g.html", i / "1.png", hard=True)),
    "is also the input --images")

row("caption", "out-a-link-to-the-ids", lambda w, d: w.caption_args(d, "--ids", (ids := write(d, "ids.txt", "11\n")), "--out",
                                                                    link_to(d, "c.jsonl", ids)), "is also the input --ids")

row("caption", "gallery-the-run-record-of-out", lambda w, d: w.caption_args(d, "--gallery", d / "captions.jsonl.run.json"),
    "is both (the run record of --out) and --gallery|is both --gallery and (the run record of --out)")


@pytest.mark.parametrize("row", table.params())
def test_bad_input(row: Row, world: World, tmp_path):
    check_row(row, world, tmp_path)
