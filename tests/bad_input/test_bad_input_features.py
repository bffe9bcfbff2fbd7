"""Bad input of python -m clid.features: one row per malformed input (tests/badinput.py runs and checks them)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from badinput import (
    Row,
    Table,
    World,
    _must,
    after,
    chain_graph,
    check_row,
    copy_to,
    image_data,
    link_to,
    run_stage,
    scene_graphs,
    write,
)
from conftest import FIXTURES

table = Table()
row = table.row

# -- python -m clid.features: the encoder's boxes and the converters -------------------------------------
def vlp_release(d: Path, change=None) -> Path:
    from feature_formats import write_vlp

    write_vlp(d, regions=4, dim=16, classes=5)
    if change:
        change(d / "region_feat_gvd_wo_bgd")
    return d / "region_feat_gvd_wo_bgd"

def short_features(folder: Path) -> None:
    import h5py
    from feature_formats import PREFIX

    with h5py.File(folder / "feat_cls_1000" / f"{PREFIX}_feat895.h5", "a") as f:
        del f["COCO_val2014_000000391895"]
        f.create_dataset("COCO_val2014_000000391895", data=np.zeros((3, 16), np.float32))

def tsv(d: Path, lines) -> Path:
    return write(d, "f.tsv", "".join(line + "\n" for line in lines))

def butd_lines(change=None) -> list:
    from feature_formats import butd_line

    rng = np.random.default_rng(0)
    boxes = np.array([[1, 2, 30, 40], [5, 5, 20, 20]], np.float32)
    lines = [butd_line(i, 64, 48, boxes, rng.normal(size=(2, 16))) for i in (1, 2)]
    return change(lines) if change else lines

def vinvl_lines(objects=None, text=None) -> list:
    from feature_formats import b64

    rng = np.random.default_rng(0)
    good = [{"rect": [1, 2, 30, 40], "class": "dog", "conf": 0.9, "feature": b64(rng.normal(size=16))}]
    second = text if text is not None else json.dumps({"objects": good if objects is None else objects, "image_w": 64, "image_h": 48})
    return ["1\t" + json.dumps({"objects": good, "image_w": 64, "image_h": 48}), "2\t" + second]

def convert_args(d: Path, fmt: str, *inputs, extra=()) -> list:
    return ["convert", "--format", fmt, *inputs, "--out", d / "f.h5", *extra]

CONVERT_CASES = [  # (name, make(w, d) -> argv, fragment, kind)
    ("vlp-rows-mismatch", lambda w, d: convert_args(d, "vlp", vlp_release(d, short_features)), "do not match the 4 boxes", "error"),
    ("vlp-no-box-file", lambda w, d: convert_args(d, "vlp", vlp_release(d) / "feat_cls_1000"), "expected one box file", "error"),
    ("vlp-skip", lambda w, d: convert_args(d, "vlp", vlp_release(d, short_features), extra=["--bad-records", "skip"]),
     "skipped 1 malformed record", "skip"),
    ("butd-bad-base64", lambda w, d: convert_args(d, "butd", tsv(d, butd_lines(lambda l: [l[0], l[1][:-8] + "!!!!"]))), "line 2 (image 2): 'features' is not valid base64", "error"),
    ("butd-fields", lambda w, d: convert_args(d, "butd", tsv(d, butd_lines(lambda l: [l[0], "2\t64\t48\t2"]))), "4 tab-separated fields, expected 6", "error"),
    ("butd-width-word", lambda w, d: convert_args(d, "butd", tsv(d, butd_lines(lambda l: [l[0], l[1].replace("\t64\t", "\twide\t", 1)]))), "must be numbers", "error"),
    ("butd-box-outside", lambda w, d: convert_args(d, "butd", tsv(d, butd_lines(lambda l: [l[0], l[1].replace("\t64\t48\t", "\t10\t10\t", 1)]))), "is not inside the 10 x 10 image", "error"),
    ("vinvl-not-json", lambda w, d: convert_args(d, "vinvl", tsv(d, vinvl_lines(text="{oops"))), "line 2 (image 2): not valid json", "error"),
    ("vinvl-no-feature", lambda w, d: convert_args(d, "vinvl", tsv(d, vinvl_lines([{"rect": [1, 2, 3, 4], "class": "a", "conf": 0.5}]))), "no 'feature'", "error"),
    ("vinvl-no-objects", lambda w, d: convert_args(d, "vinvl", tsv(d, vinvl_lines([]))), "line 2 (image 2): no objects", "error"),
    ("vinvl-rect-three", lambda w, d: convert_args(d, "vinvl", tsv(d, vinvl_lines([{"rect": [1, 2, 3], "feature": ""}]))), "'rect' must be four numbers", "error"),
    ("vinvl-sizes-bad", lambda w, d: convert_args(d, "vinvl", tsv(d, vinvl_lines()), extra=["--sizes", write(d, "hw.tsv", "1\tnope\n")]), "expected an image key, a tab", "error"),
    ("missing-input", lambda w, d: convert_args(d, "butd", d / "nope.tsv"), "no such file or folder", "error"),
    ("out-not-h5", lambda w, d: ["convert", "--format", "butd", tsv(d, butd_lines()), "--out", d / "f.txt"], "--out must end with .h5", "error"),
]

for name, make, fragment, kind in CONVERT_CASES:
    row("features", f"convert-{name}", make, fragment, kind)

ENCODER_CASES = [  # (name, make(w, d) -> argv, fragment)
    ("grid-zero", lambda w, d: ["--images", w.images, "--boxes", "grid", "0", "--out", d / "f.h5"], "n must be in 1..31"),
    ("grid-word", lambda w, d: ["--images", w.images, "--boxes", "grid", "many", "--out", d / "f.h5"], "n must be a whole number"),
    ("boxes-not-grid", lambda w, d: ["--images", w.images, "--boxes", "tiles", "3", "--out", d / "f.h5"], "--boxes takes 'grid n'"),
    ("no-box-source", lambda w, d: ["--images", w.images, "--out", d / "f.h5"], "one of the arguments --scene-graphs --detections --boxes"),
    ("two-box-sources", lambda w, d: ["--images", w.images, "--boxes", "grid", "2", "--detections", d / "x.json", "--out", d / "f.h5"], "not allowed with"),
    ("images-missing", lambda w, d: ["--images", d / "nope", "--boxes", "grid", "2", "--out", d / "f.h5"], "--images: no such file or folder"),
    ("detections-short-box", lambda w, d: ["--images", w.images, "--detections", write(d, "x.json", {"1.png": [[1, 2, 3]]}), "--out", d / "f.h5"],
     "image 1.png box 0: a box must be four numbers"),
    ("detections-conf-word", lambda w, d: ["--images", w.images, "--detections", write(d, "x.json", {"1": [{"rect": [1, 2, 3, 4], "conf": "high"}]}), "--out", d / "f.h5"],
     "'conf' must be a number"),
    ("detections-coco-bbox", lambda w, d: ["--images", w.images, "--detections", write(d, "x.json", [{"image_id": 1, "bbox": "1 2 3 4"}]), "--out", d / "f.h5"],
     "'bbox' must be four numbers"),
    ("detections-no-image", lambda w, d: ["--images", w.images, "--detections", write(d, "x.json", {"9999": [[1, 2, 30, 40]]}), "--out", d / "f.h5"],
     "no image with boxes was found"),
    ("detections-tsv-fields", lambda w, d: ["--images", w.images, "--detections", write(d, "x.tsv", "1\t2\t3\n"), "--out", d / "f.h5"],
     "3 tab-separated fields"),
    ("detections-not-json", lambda w, d: ["--images", w.images, "--detections", write(d, "x.json", "{oops"), "--out", d / "f.h5"], "not valid json"),
    ("image-data-without-graphs", lambda w, d: ["--images", w.images, "--boxes", "grid", "2", "--image-data", d / "i.json", "--out", d / "f.h5"],
     "--image-data goes with --scene-graphs"),
    ("min-conf-above-one", lambda w, d: ["--images", w.images, "--detections", d / "x.json", "--min-conf", "3", "--out", d / "f.h5"],
     "argument --min-conf: must be a number in [0, 1]"),
    ("convert-chunk-size-zero", lambda w, d: convert_args(d, "butd", tsv(d, butd_lines()), extra=["--chunk-size", "0"]),
     "argument --chunk-size: must be a positive integer"),
]

for name, make, fragment in ENCODER_CASES:
    row("features", name, make, fragment)

# -- python -m clid.features, clid.captions, clid.stats: more of their inputs --------------------------------
VG_SAMPLE = FIXTURES / "vg_scene_graphs_sample.json"

row("features", "images-missing-graphs", lambda w, d: ["--images", d / "nope", "--scene-graphs", VG_SAMPLE, "--out", d / "f.h5"],
    "--images: no such file or folder")

row("features", "no-image-of-a-graph", lambda w, d: ["--images", (d / "empty").mkdir() or d / "empty", "--scene-graphs", VG_SAMPLE,
                                                      "--out", d / "f.h5"], "no image with boxes")

row("features", "graphs-missing", lambda w, d: ["--images", w.images, "--scene-graphs", d / "nope.json", "--out", d / "f.h5"],
    "no such file|not found")

row("features", "graphs-not-json", lambda w, d: ["--images", w.images, "--scene-graphs", write(d, "g.json", "[{"), "--out", d / "f.h5"],
    "not valid json")

row("features", "out-is-the-scene-graphs", lambda w, d: ["--images", w.images, "--scene-graphs", (p := scene_graphs(d, lambda g: None)),
                                                         "--out", p], "is also the input --scene-graphs")

row("features", "out-is-a-folder", lambda w, d: ["--images", w.images, "--scene-graphs", VG_SAMPLE, "--out", d], "is a folder")

row("features", "image-data-duplicate-id", lambda w, d: ["--images", w.images, "--scene-graphs", VG_SAMPLE, "--image-data",
                                                         image_data(d, lambda x: x.append(dict(x[0]))), "--out", d / "f.h5"],
    "duplicate image id")

row("features", "ids-unknown", lambda w, d: ["--images", w.images, "--boxes", "grid", "2", "--out", d / "f.h5", "--ids", "coco"],
    "invalid choice: 'coco'")

GRID = lambda w, d, out, *extra: ["--images", w.images, "--boxes", "grid", "2", "--out", out, *extra]  # noqa: E731

row("features", "out-another-feature-file", lambda w, d: GRID(w, d, copy_to(w.features, d, "features.h5")), "did not write it")

row("features", "out-another-feature-file-force", lambda w, d: GRID(w, d, copy_to(w.features, d, "features.h5"), "--force"),
    "unrecognized arguments: --force")  # (no flag replaces a file this command did not write)

def then_edited(w, d) -> list:
    """A grid run into f.h5, which the user then changed (a byte added): the row runs the grid again."""
    after("features", GRID(w, d, d / "f.h5"), [])
    with open(d / "f.h5", "ab") as f:
        f.write(b"\n")
    return GRID(w, d, d / "f.h5")

row("features", "out-its-own-edited-since", then_edited, "f.h5 was changed since python -m clid.features wrote it")

row("features", "out-its-own-killed-while-writing", lambda w, d: GRID(w, d, copy_to(w.features, d, "f.h5")) if write(
    d, "f.h5.run.json", {"command": "python -m clid.features", "output": "being written"}) else None,
    "wrote the region features of 2 images", "ok")

row("features", "out-a-text-file", lambda w, d: GRID(w, d, write(d, "f.h5", "my notes\n")), "did not write it")

row("features", "out-its-own-earlier-output", lambda w, d: after("features", GRID(w, d, d / "f.h5"), GRID(w, d, d / "f.h5")[:-3]
                                                                    + ["3", "--out", d / "f.h5"]),
    "wrote the region features of 2 images", "ok")

row("features", "out-a-converted-file", lambda w, d: after("features", convert_args(d, "butd", tsv(d, butd_lines())),
                                                           GRID(w, d, d / "f.h5")), "another command (a sharded stage, such as convert) wrote it")

row("features", "out-read-only-place", lambda w, d: GRID(w, d, "/proc/f.h5"), "/proc")

row("features", "grid-32", lambda w, d: ["--images", w.images, "--boxes", "grid", "32", "--out", d / "f.h5"], "n must be in 1..31")

row("features", "max-boxes-1000", lambda w, d: ["--images", w.images, "--detections", d / "x.json", "--max-boxes", "1000",
                                                "--out", d / "f.h5"], "argument --max-boxes")

row("features", "graph-of-1500-objects", lambda w, d: ["--images", w.images, "--scene-graphs", chain_graph(d, 1500), "--out",
                                                       d / "f.h5"], "1500 objects")

# outputs of other commands: kept, whatever the flags
row("features", "convert-out-another-feature-file", lambda w, d: convert_args(d, "butd", tsv(d, butd_lines()))
    if copy_to(w.features, d, "f.h5") else None, "this stage did not write it")

row("features", "convert-out-another-feature-file-restart", lambda w, d: convert_args(
    d, "butd", tsv(d, butd_lines()), extra=["--restart"]) if copy_to(w.features, d, "f.h5") else None,
    "this stage did not write it (it has no run record f.h5.run.json): it is kept")

row("features", "convert-out-read-only-place", lambda w, d: ["convert", "--format", "butd", tsv(d, butd_lines()), "--out",
                                                             "/proc/f.h5"], "/proc")

# a resumed run whose inputs changed inside an input folder
def vlp_stopped_then_changed(w: World, d: Path) -> list:
    """A VLP conversion stopped at its bad third image (--chunk-size 1), then the first image's features
    replaced inside feat_cls_1000/ and the bad one mended: its two chunks are stale."""
    import h5py
    from feature_formats import PREFIX

    release = vlp_release(d, short_features)
    argv = convert_args(d, "vlp", release, extra=["--chunk-size", "1"])
    assert run_stage("features", argv).code == 1
    with h5py.File(release / "feat_cls_1000" / f"{PREFIX}_feat009.h5", "a") as f:
        f["COCO_train2014_000000000009"][...] = 7.0
    with h5py.File(release / "feat_cls_1000" / f"{PREFIX}_feat895.h5", "a") as f:
        del f["COCO_val2014_000000391895"]
        f.create_dataset("COCO_val2014_000000391895", data=np.zeros((4, 16), np.float32))
    return argv

row("features", "convert-resume-after-a-file-in-an-input-folder-changed", vlp_stopped_then_changed, "the file of --inputs changed")

# float64 bottom-up features
def butd64(boxes64=False, garbage=False) -> list:
    """Two bottom-up lines whose features are base64 float64 (and their boxes too, with ``boxes64``)."""
    import base64

    def enc(a, dtype):
        return base64.b64encode(np.ascontiguousarray(a, dtype=dtype).tobytes()).decode()

    rng = np.random.default_rng(0)
    boxes = np.array([[1, 2, 30, 40], [5, 5, 20, 20]], np.float32)
    out = []
    for i in (1, 2):
        features = rng.integers(0, 256, 2 * 32, dtype=np.uint8).tobytes() if garbage else rng.normal(size=(2, 16))
        feature_text = base64.b64encode(features).decode() if garbage else enc(features, np.float64)
        out.append("\t".join([str(i), "64", "48", "2", enc(boxes, np.float64 if boxes64 else np.float32), feature_text]))
    return out

row("features", "convert-butd-float64-features", lambda w, d: convert_args(d, "butd", tsv(d, butd64())),
    "2 records of float64 values, converted to float32", "ok")

row("features", "convert-butd-float64-boxes-and-features", lambda w, d: convert_args(d, "butd", tsv(d, butd64(boxes64=True))),
    "2 records of float64 values, converted to float32", "ok")

row("features", "convert-butd-features-neither-float32-nor-float64", lambda w, d: convert_args(d, "butd", tsv(d, butd64(garbage=True))),
    "not float32 or float64 features")

row("features", "convert-vinvl-float64-feature", lambda w, d: convert_args(d, "vinvl", tsv(d, vinvl_lines([{
    "rect": [1, 2, 30, 40], "conf": 0.9, "feature": __import__("base64").b64encode(np.arange(16, dtype=np.float64).tobytes()).decode()}]))),
    "-d features, the records before", "error")

row("features", "16-bit-png", lambda w, d: ["--images", (d / "im").mkdir() or __import__("PIL.Image").Image.fromarray(
    (np.arange(48 * 64).reshape(48, 64) * 21).astype(np.uint16)).save(d / "im" / "grey.png") or d / "im", "--boxes", "grid", "2",
    "--out", d / "f.h5"], "wrote the region features of 1 images", "ok")

# one image id twice in a conversion: the same outcome whatever the chunk size
def two_tsvs(d: Path, first_key="1", second_key="2", fmt="butd") -> list:
    lines = butd_lines() if fmt == "butd" else vinvl_lines()
    a = write(d, "a.tsv", lines[0] + "\n" + lines[1] + "\n")
    b = write(d, "b.tsv", second_key + lines[1][lines[1].index("\t"):] + "\n")
    if first_key != "1":
        a.write_text(first_key + lines[0][lines[0].index("\t"):] + "\n" + lines[1] + "\n")
    return [a, b]

for chunk in ("1000", "1"):
    row("features", f"convert-butd-two-files-one-image-chunk-{chunk}",
        lambda w, d, chunk=chunk: convert_args(d, "butd", *two_tsvs(d), extra=["--chunk-size", chunk]), "image id 2 again")
    row("features", f"convert-butd-keys-9-and-000000000009-chunk-{chunk}",
        lambda w, d, chunk=chunk: convert_args(d, "butd", *two_tsvs(d, "9", "000000000009"), extra=["--chunk-size", chunk]),
        "image id 9 again")
    row("features", f"convert-vinvl-train-and-val-1-jpg-chunk-{chunk}",
        lambda w, d, chunk=chunk: convert_args(d, "vinvl", *two_tsvs(d, "train/1.jpg", "val/1.jpg", "vinvl"),
                                               extra=["--chunk-size", chunk]), "image id 1 again")
    row("features", f"convert-two-files-one-image-skip-chunk-{chunk}",
        lambda w, d, chunk=chunk: convert_args(d, "butd", *two_tsvs(d), extra=["--chunk-size", chunk, "--bad-records", "skip"]),
        "skipped 1 malformed record(s)", "skip")

row("features", "convert-butd-empty-file", lambda w, d: convert_args(d, "butd", write(d, "e.tsv", "")), "e.tsv: no records to convert")

row("features", "convert-butd-header-only", lambda w, d: convert_args(d, "butd", write(d, "h.tsv", "\t".join(
    ["image_id", "image_w", "image_h", "num_boxes", "boxes", "features"]) + "\n")), "no records to convert")

row("features", "convert-vinvl-blank-lines", lambda w, d: convert_args(d, "vinvl", write(d, "b.tsv", "\r\n\n\r\n")),
    "no records to convert")

row("features", "detections-tsv-non-utf8-line", lambda w, d: ["--images", w.images, "--detections", write(
    d, "x.tsv", (butd_lines()[0] + "\n" + butd_lines()[1].replace("2", "\xe9", 1) + "\n").encode("latin-1")), "--out", d / "f.h5"],
    "line 2: not utf-8 text")

# -- numbers as people type them, ids that collide, dtypes said, moved inputs, models not found ---------
def photos(d: Path, *names) -> Path:
    """A folder of small PNG images named ``names``."""
    from PIL import Image

    folder = d / "photos"
    folder.mkdir()
    for k, name in enumerate(names):
        Image.fromarray(np.full((32, 40, 3), 40 * k, np.uint8)).save(folder / name)
    return folder

def butd16(d: Path, dim: int = 2048) -> Path:
    """Two bottom-up lines whose features are ``dim``-d float16 (2,048-d also reads as 1,024-d float32)."""
    import base64

    boxes = np.array([[1, 2, 30, 40], [5, 5, 20, 20]], np.float32)
    features = np.abs(np.random.default_rng(0).normal(size=(2, dim))).astype(np.float16)
    return tsv(d, ["\t".join([str(i), "64", "48", "2", base64.b64encode(boxes.tobytes()).decode(),
                              base64.b64encode(features.tobytes()).decode()]) for i in (1, 2)])

GRID_2 = ["--boxes", "grid", "2"]

row("features", "ids-auto-two-photos-one-id", lambda w, d: ["--images", photos(d, "9.png", "COCO_val2014_000000000009.png"),
                                                            *GRID_2, "--out", d / "f.h5"], "gets the image id 9")

row("features", "ids-keep-two-extensions-one-id", lambda w, d: ["--images", photos(d, "a.png", "a.jpg"), *GRID_2, "--ids", "keep",
                                                                "--out", d / "f.h5"], "differ only in the extension")

row("features", "ids-auto-two-photos-one-id-detections", lambda w, d: ["--images", photos(d, "9.png", "000000000009.png"), "--detections",
                                                                       write(d, "det.json", {"9": [{"rect": [1, 2, 20, 20], "conf": 0.9}]}),
                                                                       "--out", d / "f.h5"], "gets the image id 9")

row("features", "ids-auto-two-detection-keys-one-id", lambda w, d: ["--images", photos(d, "9.png"), "--detections", write(
    d, "det.json", {"9.jpg": [{"rect": [1, 2, 20, 20], "conf": 0.9}], "COCO_val2014_000000000009.jpg": [
        {"rect": [3, 3, 20, 20], "conf": 0.8}]}), "--out", d / "f.h5"], "gets the image id 9")

row("features", "ids-auto-superscript-file-name", lambda w, d: ["--images", photos(d, "10\u00b2.png"), *GRID_2, "--out", d / "f.h5"],
    "0 of 1 images mapped from coco file names", "ok")

row("features", "ids-auto-said-out-loud", lambda w, d: ["--images", photos(d, "COCO_val2014_000000000009.png", "x.png"), *GRID_2,
                                                        "--out", d / "f.h5"], "1 of 2 images mapped from coco file names", "ok")

row("features", "grid-superscript", lambda w, d: ["--images", w.images, "--boxes", "grid", "2\u00b2", "--out", d / "f.h5"],
    "digits 0-9|whole number")

row("features", "grid-over-a-converted-file", lambda w, d: (_must(run_stage("features", convert_args(d, "butd", tsv(d, butd_lines())))),
                                                            ["--images", w.images, *GRID_2, "--out", d / "f.h5"])[1],
    "wrote it, not python -m clid.features")

row("features", "convert-butd-float16-2048", lambda w, d: convert_args(d, "butd", butd16(d)), "2048-d float16 features", "ok")

row("features", "convert-butd-float16-dim-2048", lambda w, d: convert_args(d, "butd", butd16(d), extra=["--dim", "2048"]),
    "2048-d float16 features (--dim 2048)", "ok")

row("features", "convert-butd-float16-dim-1024", lambda w, d: convert_args(d, "butd", butd16(d), extra=["--dim", "1024"]),
    "1024-d float32 features (--dim 1024)", "ok")

row("features", "convert-butd-float16-dim-wrong", lambda w, d: convert_args(d, "butd", butd16(d), extra=["--dim", "999"]),
    "not 999 float16, float32 or float64 values")

row("features", "convert-butd-float16-not-2048", lambda w, d: convert_args(d, "butd", butd16(d, 512)), "256-d float32", "ok")

row("features", "convert-butd-float32-said", lambda w, d: convert_args(d, "butd", tsv(d, butd_lines())), "16-d float32 features", "ok")

row("features", "convert-butd-float64-dim", lambda w, d: convert_args(d, "butd", tsv(d, butd64()), extra=["--dim", "16"]),
    "16-d float64 features (--dim 16)", "ok")

row("features", "convert-dim-superscript", lambda w, d: convert_args(d, "butd", tsv(d, butd_lines()), extra=["--dim", "16\u00b2"]),
    "argument --dim")

row("features", "convert-butd-num-boxes-superscript", lambda w, d: convert_args(d, "butd", tsv(d, butd_lines(
    lambda lines: [lines[0].replace("\t2\t", "\t2\u00b2\t", 1), lines[1]]))), "num_boxes must be numbers")

row("features", "convert-dtype-float8", lambda w, d: convert_args(d, "clid", w.features, extra=["--dtype", "float8"]),
    "argument --dtype: invalid choice")

row("features", "convert-clid-two-inputs", lambda w, d: convert_args(d, "clid", w.features, w.features),
    "--format clid rewrites one region-feature file")

row("features", "convert-clid-missing", lambda w, d: convert_args(d, "clid", d / "nope.h5"), "nope.h5: file not found")

row("features", "convert-clid-a-saliency-file", lambda w, d: convert_args(d, "clid", w.saliency), "no image group holds")

row("features", "convert-clid-bfloat16", lambda w, d: convert_args(d, "clid", w.features, extra=["--dtype", "bfloat16"]),
    "bfloat16", "ok")

def beyond_float16(d: Path) -> Path:
    """A bottom-up TSV whose second image has a feature of 1e5 (float32 holds it, float16 does not)."""
    from feature_formats import butd_line

    boxes = np.array([[1, 2, 30, 40], [5, 5, 20, 20]], np.float32)
    return tsv(d, [butd_line(i, 64, 48, boxes, np.full((2, 16), 1e5 if i == 2 else 1.0)) for i in (1, 2)])

row("features", "convert-float16-overflow", lambda w, d: convert_args(d, "butd", beyond_float16(d)),
    "features hold 100000, beyond float16's range (65504): give --dtype bfloat16 or float32")

row("features", "convert-float16-overflow-as-bfloat16", lambda w, d: convert_args(d, "butd", beyond_float16(d),
                                                                                  extra=["--dtype", "bfloat16"]),
    "wrote the region features of 2 images", "ok")

# -- --images: files, globs, and every file the one reader of images cannot read, accounted for ------------
def with_odd_file(w: World, d: Path, name: str, make) -> Path:
    """The world's two images and one more file, ``name``, made by ``make(path)``."""
    folder = d / "images"
    shutil.copytree(w.images, folder)
    make(folder / name)
    return folder

def animated_gif(path: Path) -> None:
    from PIL import Image

    frames = [Image.new("RGB", (16, 12), colour) for colour in ("red", "blue")]
    frames[0].save(path, save_all=True, append_images=frames[1:])

def image_of(mode: str, value):
    def make(path: Path) -> None:
        from PIL import Image

        Image.fromarray(np.full((12, 16), value, np.float32 if mode == "F" else np.int32), mode).save(path)
    return make

def odd_grid(w, d, name, make, *extra) -> list:
    return ["--images", with_odd_file(w, d, name, make), *GRID_2, "--out", d / "f.h5", *extra]

row("features", "images-a-file", lambda w, d: ["--images", w.images / "1.png", *GRID_2, "--out", d / "f.h5"],
    "wrote the region features of 1 images", "ok")

row("features", "images-a-file-and-a-glob", lambda w, d: ["--images", w.images / "1.png", f"{w.images}/*.png", *GRID_2,
                                                          "--out", d / "f.h5"], "wrote the region features of 2 images", "ok")

row("features", "images-glob-matches-nothing", lambda w, d: ["--images", f"{w.images}/*.jpg", *GRID_2, "--out", d / "f.h5"],
    "no file or folder matches this pattern")

row("features", "images-broken-link", lambda w, d: odd_grid(w, d, "3.png", lambda p: p.symlink_to(d / "gone.png")),
    "skipped 3.png: a symbolic link that points nowhere", "skip")

row("features", "images-text-file", lambda w, d: odd_grid(w, d, "notes.txt", lambda p: p.write_text("hi")),
    "skipped notes.txt: not an image by its name (.txt", "skip")

row("features", "images-hidden-file", lambda w, d: odd_grid(w, d, ".3.png", lambda p: shutil.copy(w.images / "1.png", p)),
    "skipped .3.png: hidden", "skip")

row("features", "images-not-an-image", lambda w, d: odd_grid(w, d, "3.png", lambda p: p.write_bytes(b"\x89PNG not really")),
    "skipped 3.png: cannot be read as an image", "skip")

row("features", "images-animated-gif", lambda w, d: odd_grid(w, d, "3.gif", animated_gif),
    "note: 3.gif: animated (2 frames): its first frame taken", "ok")

row("features", "images-floats-beyond-one", lambda w, d: odd_grid(w, d, "3.tif", image_of("F", 300.0)),
    "skipped 3.tif: holds floating-point pixels from 300 to 300 (mode f)", "skip")

row("features", "images-floats-in-range", lambda w, d: odd_grid(w, d, "3.tif", image_of("F", 0.5)),
    "wrote the region features of 3 images", "ok")

row("features", "images-32-bit-beyond-16", lambda w, d: odd_grid(w, d, "3.tif", image_of("I", 70000)),
    "skipped 3.tif: holds 32-bit integer pixels from 70000 to 70000 (mode i)", "skip")

row("features", "images-none-readable", lambda w, d: ["--images", with_odd_file(w, d, "3.png", lambda p: p.write_bytes(b"")) / "3.png",
                                                      *GRID_2, "--out", d / "f.h5"], "none of the 1 images with boxes could be read")

row("features", "images-out-is-an-image", lambda w, d: ["--images", with_odd_file(w, d, "3.txt", lambda p: None), *GRID_2, "--out",
                                                        d / "images" / "1.png"], "is also the input --images")

row("features", "images-device-unknown", lambda w, d: [*GRID(w, d, d / "f.h5"), "--device", "tpu"], "--device")

# -- every file under --images captioned or counted and named: links to nothing, names that are no id, bombs ------
def huge_png(folder: Path, name: str, side: int = 30_000) -> None:
    """A PNG whose header says side x side pixels (more than PIL opens), in a few bytes: only its header is read."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)
    (folder / name).write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64))
                                + chunk(b"IEND", b""))

def with_extra(d: Path, add) -> Path:
    folder = photos(d, "1.png", "2.png")
    add(folder)
    return folder

row("features", "images-a-link-that-points-nowhere", lambda w, d: ["--images", with_extra(
    d, lambda f: (f / "gone.png").symlink_to(f / "nope.png")), *GRID_2, "--out", d / "f.h5"],
    "skipped gone.png: a symbolic link that points nowhere", "skip")

for name in ("..png", "...png"):
    row("features", f"images-named-{name}", lambda w, d, name=name: ["--images", with_extra(
        d, lambda f: (f / name).write_bytes((f / "1.png").read_bytes())), *GRID_2, "--out", d / "f.h5"],
        f"skipped {name}: hidden", "skip")

def only_dot_png(d: Path) -> Path:
    folder = photos(d, "1.png")
    (folder / "1.png").rename(folder / "..png")
    return folder

row("features", "images-only-names-that-are-no-id", lambda w, d: ["--images", only_dot_png(d), *GRID_2, "--out", d / "f.h5"],
    "no image with boxes was found")

def animated_gif_in(folder: Path) -> None:
    from PIL import Image

    frames = [Image.new("RGB", (40, 32), (40 * k, 0, 0)) for k in range(3)]
    frames[0].save(folder / "anim.gif", save_all=True, append_images=frames[1:], duration=100)

row("features", "images-an-animated-gif", lambda w, d: ["--images", with_extra(d, animated_gif_in), *GRID_2, "--out", d / "f.h5"],
    "note: anim.gif: animated (3 frames): its first frame taken", "ok")

row("features", "images-a-decompression-bomb", lambda w, d: ["--images", with_extra(d, lambda f: huge_png(f, "huge.png")),
                                                             *GRID_2, "--out", d / "f.h5"], "huge.png: too large", "skip")


# -- an --out that is an input by another name: a hard link, a symbolic link, another spelling, the run record ------
row("features", "out-a-hard-link-to-an-image", lambda w, d: ["--images", with_odd_file(w, d, "3.txt", lambda p: None), *GRID_2,
                                                            "--out", link_to(d, "f.h5", d / "images" / "1.png", hard=True)],
    "is also the input --images")

row("features", "out-a-link-to-the-scene-graphs", lambda w, d: ["--images", w.images, "--scene-graphs", (p := scene_graphs(
    d, lambda g: None)), "--out", link_to(d, "f.h5", p)], "is also the input --scene-graphs")

row("features", "out-the-scene-graphs-another-spelling", lambda w, d: ["--images", w.images, "--scene-graphs", (p := scene_graphs(
    d, lambda g: None)), "--out", d / "." / "sub" / ".." / p.name], "is also the input --scene-graphs")

row("features", "out-record-is-the-image-data", lambda w, d: ["--images", w.images, "--scene-graphs", VG_SAMPLE, "--image-data",
                                                              image_data(d, lambda x: None).replace(d / "f.h5.run.json"), "--out", d / "f.h5"],
    "is also the input --image-data")


row("features", "out-run-record-a-folder", lambda w, d: GRID(w, d, d / "f.h5") if (d / "f.h5.run.json").mkdir() is None else None,
    "f.h5.run.json, is a folder")


@pytest.mark.parametrize("row", table.params())
def test_bad_input(row: Row, world: World, tmp_path):
    check_row(row, world, tmp_path)
