"""Bad input, one row per malformed file: every stage ends in one clear line or a counted skip.

Each row names the stage, how its bad file is made from small valid inputs, the command line, and
what must come out: ``error`` (a non-zero exit whose ``error:`` line holds the fragment, no
traceback, no new output file), ``skip`` (exit 0 and the fragment in the report: a counted skip) or
``ok`` (exit 0). Stages run in-process through their ``__main__`` block, exactly as from the shell.
Grow the table whenever a new bad input is found.

Set ``CLID_BAD_INPUT_REPORT=FILE`` to append each row's outcome (clear / traceback / silent) to FILE.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import runpy
import shutil
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from conftest import FIXTURES, ROOT
from toyworld import make_toy_world

SCRIPTS = {"00": "00_demo_data.py", "01": "01_saliency.py", "02": "02_scenegraph_captions.py",
           "03": "03_paraphrase.py", "04": "04_train_base.py", "05": "05_score_quality.py",
           "06": "06_train_selection.py", "07": "07_eval.py", "stats": "clid.data.stats", "data": "clid.data",
           "shard": "clid.run.shard", "features": "clid.features", "emlnet": "clid.method.emlnet",
           "caption": "clid.caption", "truth": "clid.demo.truth"}
NEEDS = {"stages": "needs h-stages", "ops": "needs h-ops"}


# ---------------------------------------------------------------------------------------------
# Running a stage in-process


@dataclass
class Outcome:
    code: int | str  # exit status, or "traceback"
    text: str  # stdout + stderr + the SystemExit message
    error: str  # the exception, for a traceback


def run_stage(stage: str, argv: list) -> Outcome:
    """Run a stage's ``__main__`` block with ``argv``; a leaked exception is reported, not raised."""
    out, err = io.StringIO(), io.StringIO()
    old_argv = sys.argv
    sys.argv = [SCRIPTS[stage]] + [str(a) for a in argv]
    code, error = 0, ""
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if SCRIPTS[stage].startswith("clid."):
                runpy.run_module(SCRIPTS[stage], run_name="__main__")
            else:
                runpy.run_path(str(ROOT / SCRIPTS[stage]), run_name="__main__")
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            code = 1
            err.write(str(exc.code) + "\n")
    except BaseException as exc:  # noqa: BLE001 - this is what the row looks for
        code, error = "traceback", f"{type(exc).__name__}: {exc}"
    finally:
        sys.argv = old_argv
    return Outcome(code, out.getvalue() + err.getvalue(), error)


# ---------------------------------------------------------------------------------------------
# The shared valid inputs: one toy world, tiny trained checkpoints, images, scene graphs


@dataclass
class World:
    root: Path
    captions: Path
    features: Path
    selfgen: Path
    generated: Path
    quality: Path
    images: Path
    saliency: Path
    trusted: Path
    extended: Path
    selection: Path

    def train_args(self, out, *extra) -> list:
        return ["--captions", self.captions, "--features", self.features, "--out", out, "--preset", "tiny",
                "--max-steps", "2", "--warmup", "1", "--batch-size", "4", "--eval-every", "0", *extra]

    def selection_args(self, out, *extra) -> list:
        return ["--captions", self.captions, "--selfgen", self.selfgen, "--quality", self.quality,
                "--features", self.features, "--out", out, "--preset", "tiny", "--max-steps", "2", "--eta", "1",
                "--warmup", "1", "--batch-size", "4", "--eval-every", "0", *extra]

    def score_args(self, out, *extra) -> list:
        return ["--trusted", self.trusted, "--extended", self.extended, "--selfgen", self.selfgen,
                "--features", self.features, "--out", out, "--batch-size", "8", "--mode", "onepass", *extra]

    def caption_args(self, d, *extra) -> list:
        return ["--checkpoint", self.trusted, "--features", self.features, "--out", d / "captions.jsonl",
                "--device", "cpu", "--decode-steps", "1", *extra]

    def eval_args(self, out, *extra) -> list:
        return ["--refs", self.captions, "--generated", self.generated, "--out", out, "--spice", "off", *extra]


def _must(outcome: Outcome) -> None:
    assert outcome.code == 0, outcome.text[-2000:] + outcome.error


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> World:
    import torch
    from PIL import Image

    from clid.base.files import write_h5_groups, write_jsonl, write_quality
    from clid.method.quality import eq1_quality

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("bad_input_world")
    captions, features = make_toy_world(root, n_train=8, n_val=2, n_test=3, dim=16)
    data = json.loads(captions.read_text())
    selfgen = root / "selfgen.jsonl"
    records = [{"id": f"{im['cocoid']}-{k}", "image_id": im["cocoid"], "caption": f"a dog and a {word} ball",
                "objects": [1, 2], "n_tokens": 6, "level": 1, "seed": 0}
               for im in data["images"] if im["split"] == "train" for k, word in enumerate(["red", "big"])]
    write_jsonl(selfgen, records)
    generated = root / "generated.jsonl"
    write_jsonl(generated, [{"image_id": im["cocoid"], "level": 1, "caption": "a red dog"}
                            for im in data["images"] if im["split"] == "test"])
    quality = root / "quality.h5"
    logp = np.linspace(-2, -1, len(records)), np.full(len(records), -1.5)
    write_quality(quality, [r["id"] for r in records], *logp, eq1_quality(*logp))
    images = root / "images"
    images.mkdir()
    rng = np.random.default_rng(0)
    for name in ("1", "107899"):  # the ids of the VG sample graphs
        Image.fromarray(rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)).save(images / f"{name}.png")
    saliency = root / "saliency.h5"
    write_h5_groups(saliency, [(i, {"map": np.full((6, 8), 0.5, np.float16)}, {"width": 800.0, "height": 600.0})
                               for i in ("1", "107899")])
    w = World(root, captions, features, selfgen, generated, quality, images, saliency,
              root / "trusted", root / "extended", root / "selection")
    _must(run_stage("04", w.train_args(w.trusted)))
    _must(run_stage("04", w.train_args(w.extended, "--data", "extended", "--selfgen", selfgen)))
    _must(run_stage("06", w.selection_args(w.selection)))
    yield w
    torch.set_num_threads(threads)


# ---------------------------------------------------------------------------------------------
# Making bad files


def write(folder: Path, name: str, content) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str):
        path.write_text(content)
    else:
        path.write_text(json.dumps(content))
    return path


def karpathy(w: World, d: Path, change: Callable[[dict], None], name="captions.json") -> Path:
    """The toy world's captions with ``change`` applied to the parsed JSON (images[0] is a train image,
    images[-1] a test image)."""
    data = json.loads(w.captions.read_text())
    change(data)
    return write(d, name, data)


def set_in(index: int, **fields):
    """A change setting fields of images[index] (None deletes a field given as the string "DELETE")."""
    def change(data):
        for key, value in fields.items():
            if value == "DELETE":
                del data["images"][index][key]
            else:
                data["images"][index][key] = value
    return change


def sentence(index: int, value):
    def change(data):
        data["images"][index]["sentences"][0] = value
    return change


def coco_captions(w: World, d: Path, caption) -> Path:
    """The toy world in the official COCO captions format, the first annotation's caption replaced."""
    data = json.loads(w.captions.read_text())
    images = [{"id": im["cocoid"], "file_name": im["filename"]} for im in data["images"]]
    annotations = [{"id": n, "image_id": im["cocoid"], "caption": s["raw"]}
                   for n, im in enumerate(data["images"]) for s in im["sentences"]]
    annotations[0]["caption"] = caption
    return write(d, "coco.json", {"images": images, "annotations": annotations})


def jsonl_lines(path: Path, d: Path, change: Callable[[list], list], name="bad.jsonl") -> Path:
    """A JSONL file's records, changed by ``change`` (which returns records or raw lines)."""
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = change(records)
    return write(d, name, "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))


def first(**fields):
    """A change setting fields of the first JSONL record ("DELETE" removes one)."""
    def change(records):
        for key, value in fields.items():
            if value == "DELETE":
                del records[0][key]
            else:
                records[0][key] = value
        return records
    return change


def h5_changed(path: Path, d: Path, change: Callable, name="bad.h5") -> Path:
    import h5py

    target = d / name
    shutil.copy(path, target)
    with h5py.File(target, "a") as f:
        change(f)
    return target


def first_group(change):
    """A change of the first image group of a per-image HDF5 file."""
    def apply(f):
        change(f[sorted(f.keys())[0]])
    return apply


def replace_dataset(name, value):
    def change(group):
        del group[name]
        group.create_dataset(name, data=value)
    return change


def set_attr(name, value):
    def change(group):
        if value is None:
            del group.attrs[name]
        else:
            group.attrs[name] = value
    return change


def poke(array_name, index, value):
    def change(group):
        data = group[array_name][()]
        data[index] = value
        group[array_name][...] = data
    return change


def truncated(path: Path, d: Path, name="truncated.h5") -> Path:
    return write(d, name, path.read_bytes()[: path.stat().st_size // 2])


def checkpoint_copy(source: Path, d: Path, change: Callable[[Path], None] | None = None, name="out") -> Path:
    target = d / name
    shutil.copytree(source, target)
    if change:
        change(target)
    return target


def corrupt(filename, content=b"\x00garbage\x00" * 8):
    def change(folder):
        (folder / filename).write_bytes(content)
    return change


def unfinished(change=None):
    """A checkpoint whose train_state says step 1 (so a re-run resumes), then ``change``."""
    def apply(folder):
        state = json.loads((folder / "train_state.json").read_text())
        (folder / "train_state.json").write_text(json.dumps(dict(state, step=1)))
        if change:
            change(folder)
    return apply


def scene_graphs(d: Path, change: Callable[[list], None], name="scene_graphs.json") -> Path:
    data = json.loads((FIXTURES / "vg_scene_graphs_sample.json").read_text())
    change(data)
    return write(d, name, data)


def obj(**fields):
    """A change of the first object of the first graph."""
    def change(graphs):
        for key, value in fields.items():
            if value == "DELETE":
                del graphs[0]["objects"][0][key]
            else:
                graphs[0]["objects"][0][key] = value
    return change


def rel(**fields):
    def change(graphs):
        graphs[0]["relationships"][0].update(fields)
    return change


def graph(**fields):
    def change(graphs):
        for key, value in fields.items():
            if value == "DELETE":
                del graphs[0][key]
            else:
                graphs[0][key] = value
    return change


def image_data(d: Path, change: Callable[[list], None]) -> Path:
    data = json.loads((FIXTURES / "vg_image_data_sample.json").read_text())
    change(data)
    return write(d, "image_data.json", data)


class Payload:
    """A pickle that, when loaded, writes a file: loading must never run it."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (Path.write_text, (Path(self.marker), "pwned"))


# ---------------------------------------------------------------------------------------------
# The table


@dataclass
class Row:
    stage: str
    name: str
    make: Callable[[World, Path], list]  # -> argv
    expect: str = ""  # fragment of the error line, or of the report for a skip
    kind: str = "error"  # error | skip | ok
    needs: str | None = None  # another helper's branch ("stages", "ops")
    leaves_output: bool = False  # an error that still writes the good part (01's failed images)

    @property
    def id(self):
        return f"{self.stage}-{self.name}"


ROWS: list[Row] = []


def row(stage, name, make, expect="", kind="error", needs=None, leaves_output=False):
    ROWS.append(Row(stage, name, make, expect, kind, needs, leaves_output))


BINARY = b"\x89\xff\xfe\x00\x01binary\xc3\x28 junk"

# -- caption files: the loaders every caption-reading stage shares (stats, 04, 06, 07, 01 --list) ---------
CAPTION_CASES = [  # (name, make(w, d) -> path, fragment, kind)
    ("missing", lambda w, d: d / "nope.json", "no such file|not found", "error"),
    ("empty", lambda w, d: write(d, "c.json", ""), "not valid json", "error"),
    ("truncated", lambda w, d: write(d, "c.json", w.captions.read_text()[:300]), "not valid json", "error"),
    ("binary", lambda w, d: write(d, "c.json", BINARY), "utf-8", "error"),
    ("directory", lambda w, d: (d / "dir.json").mkdir() or d / "dir.json", "directory", "error"),
    ("list-of-ints", lambda w, d: write(d, "c.json", [1, 2]), "unknown caption format", "error"),
    ("images-not-list", lambda w, d: write(d, "c.json", {"images": 5}), "'images' must be a list", "error"),
    ("image-not-object", lambda w, d: karpathy(w, d, lambda x: x["images"].__setitem__(0, 5)), "expected a json object", "error"),
    ("no-filename", lambda w, d: karpathy(w, d, set_in(0, filename="DELETE")), "missing key 'filename'", "error"),
    ("filename-null", lambda w, d: karpathy(w, d, set_in(0, filename=None)), "'filename' must be a string", "error"),
    ("no-split", lambda w, d: karpathy(w, d, set_in(0, split="DELETE")), "missing key 'split'", "error"),
    ("split-null", lambda w, d: karpathy(w, d, set_in(0, split=None)), "'split' must be a string", "error"),
    ("split-int", lambda w, d: karpathy(w, d, set_in(0, split=3)), "'split' must be a string", "error"),
    ("cocoid-null", lambda w, d: karpathy(w, d, set_in(0, cocoid=None)), "'cocoid' must be", "error"),
    ("cocoid-object", lambda w, d: karpathy(w, d, set_in(0, cocoid={"a": 1})), "'cocoid' must be", "error"),
    ("duplicate-cocoid", lambda w, d: karpathy(w, d, set_in(1, cocoid=1)), "duplicate image id 1", "error"),
    ("sentences-null", lambda w, d: karpathy(w, d, set_in(0, sentences=None)), "'sentences' must be a list", "error"),
    ("sentences-string", lambda w, d: karpathy(w, d, set_in(0, sentences="a dog")), "'sentences' must be a list", "error"),
    ("sentence-int", lambda w, d: karpathy(w, d, sentence(0, 7)), "needs 'raw' or 'tokens'", "error"),
    ("tokens-string", lambda w, d: karpathy(w, d, sentence(0, {"tokens": "a dog"})), "'tokens' must be a list", "error"),
    ("tokens-ints", lambda w, d: karpathy(w, d, sentence(0, {"tokens": [1, 2]})), "'tokens' must be a list", "error"),
    ("raw-int", lambda w, d: karpathy(w, d, sentence(0, {"raw": 5})), "'raw' must be a string", "error"),
    ("raw-null", lambda w, d: karpathy(w, d, sentence(0, {"raw": None})), "'raw' must be a string", "error"),
    ("emoji-caption", lambda w, d: karpathy(w, d, sentence(0, {"raw": "\U0001F600\U0001F436"})), "no word left", "skip"),
    ("chinese-caption", lambda w, d: karpathy(w, d, sentence(0, {"raw": "一只狗在草地上"})), "no word left", "skip"),
    ("empty-caption", lambda w, d: karpathy(w, d, sentence(0, {"raw": "", "tokens": []})), "no word left", "skip"),
    ("coco-caption-int", lambda w, d: coco_captions(w, d, 7), "'caption' must be a string", "error"),
    ("coco-caption-null", lambda w, d: coco_captions(w, d, None), "'caption' must be a string", "error"),
    ("coco-caption-emoji", lambda w, d: coco_captions(w, d, "\U0001F600"), "no word left", "skip"),
]
# COCO captions JSON and the other formats (stats reads every one)
IMG1 = {"id": 1, "file_name": "1.jpg"}
PARA1 = {"image_id": 1, "paragraph": "A dog."}
OTHER_CAPTION_CASES = [
    ("coco-images-not-list", lambda w, d: write(d, "c.json", {"images": 3, "annotations": []}), "'images' must be a list", "error"),
    ("coco-annotations-null", lambda w, d: write(d, "c.json", {"images": [], "annotations": None}), "'annotations' must be a list", "error"),
    ("coco-unknown-image", lambda w, d: write(d, "c.json", {"images": [IMG1], "annotations": [{"image_id": 2, "caption": "a dog"}]}),
     "not in 'images'", "error"),
    ("coco-duplicate-image", lambda w, d: write(d, "c.json", {"images": [IMG1, dict(IMG1, file_name="2.jpg")], "annotations": []}),
     "duplicate image id 1", "error"),
    ("coco-annotation-not-object", lambda w, d: write(d, "c.json", {"images": [IMG1], "annotations": ["a dog"]}),
     "expected a json object", "error"),
    ("paragraph-int", lambda w, d: write(d, "p.json", [{"image_id": 1, "paragraph": 5}]), "'paragraph' must be a string", "error"),
    ("paragraph-null", lambda w, d: write(d, "p.json", [PARA1, {"image_id": 2, "paragraph": None}]), "'paragraph' must be a string", "error"),
    ("paragraph-repeated", lambda w, d: write(d, "p.json", [PARA1, dict(PARA1, paragraph="A cat.")]), "1 repeated image id", "skip"),
    ("paragraph-no-word", lambda w, d: write(d, "p.json", [PARA1, {"image_id": 2, "paragraph": "?!"}]), "no word left", "skip"),
    ("jsonl-bad-line", lambda w, d: jsonl_lines(w.selfgen, d, lambda r: r[:1] + ["{not json"]), "not valid json", "error"),
    ("jsonl-caption-int", lambda w, d: jsonl_lines(w.selfgen, d, first(caption=3)), "'caption' must be a string", "error"),
    ("jsonl-caption-null", lambda w, d: jsonl_lines(w.selfgen, d, first(caption=None)), "'caption' must be a string", "error"),
    ("jsonl-no-image-id", lambda w, d: jsonl_lines(w.selfgen, d, first(image_id="DELETE")), "missing key", "error"),
    ("jsonl-image-id-null", lambda w, d: jsonl_lines(w.selfgen, d, first(image_id=None)), "'image_id' must be", "error"),
    ("jsonl-list-line", lambda w, d: jsonl_lines(w.selfgen, d, lambda r: r + ["[1, 2]"]), "expected a json object", "error"),
    ("jsonl-emoji", lambda w, d: jsonl_lines(w.selfgen, d, first(caption="\U0001F600")), "no word left", "skip"),
    ("jsonl-binary", lambda w, d: write(d, "b.jsonl", BINARY), "utf-8", "error"),
]

for name, make, fragment, kind in CAPTION_CASES + OTHER_CAPTION_CASES:
    row("stats", name, lambda w, d, make=make: [make(w, d)], fragment, kind)

# 04 reads the train split; 07 the test split (the last image); 06 the same loader as 04
for name, make, fragment, kind in CAPTION_CASES:
    if name.startswith("coco-") and kind == "skip":
        continue
    row("04", f"captions-{name}", lambda w, d, make=make: w.train_args(d / "out", "--captions", make(w, d)),
        fragment, kind)
for name in ("missing", "binary", "split-null", "tokens-string", "raw-int", "duplicate-cocoid", "emoji-caption"):
    make, fragment, kind = next((m, f, k) for n, m, f, k in CAPTION_CASES if n == name)
    row("06", f"captions-{name}", lambda w, d, make=make: w.selection_args(d / "out", "--captions", make(w, d)),
        fragment, kind)
TEST_IMAGE = -1
REFS_CASES = [
    ("missing", lambda w, d: d / "nope.json", "no such file|not found"),
    ("not-json", lambda w, d: write(d, "r.json", "{"), "not valid json"),
    ("binary", lambda w, d: write(d, "r.json", BINARY), "utf-8"),
    ("split-null", lambda w, d: karpathy(w, d, set_in(TEST_IMAGE, split=None)), "'split' must be a string"),
    ("tokens-string", lambda w, d: karpathy(w, d, sentence(TEST_IMAGE, {"tokens": "a dog"})), "'tokens' must be a list"),
    ("raw-int", lambda w, d: karpathy(w, d, sentence(TEST_IMAGE, {"raw": 3})), "'raw' must be a string"),
    ("raw-null", lambda w, d: karpathy(w, d, sentence(TEST_IMAGE, {"raw": None})), "'raw' must be a string"),
    ("cocoid-null", lambda w, d: karpathy(w, d, set_in(TEST_IMAGE, cocoid=None)), "'cocoid' must be"),
    ("duplicate-cocoid", lambda w, d: karpathy(w, d, set_in(TEST_IMAGE, cocoid=1)), "duplicate image id 1"),
    ("sentences-null", lambda w, d: karpathy(w, d, set_in(TEST_IMAGE, sentences=None)), "'sentences' must be a list"),
    ("coco-caption-int", lambda w, d: coco_captions(w, d, 7), "'caption' must be a string"),
    ("no-test-split", lambda w, d: karpathy(w, d, lambda x: [im.update(split="train") for im in x["images"]]), "no image of split"),
]
for name, make, fragment in REFS_CASES:
    row("07", f"refs-{name}", lambda w, d, make=make: w.eval_args(d / "out", "--refs", make(w, d)), fragment)

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


def image_folder(d: Path, w: World, extra: dict) -> Path:
    folder = d / "images"
    shutil.copytree(w.images, folder)
    for name, content in extra.items():
        write(folder, name, content)
    return folder


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

# -- 02 scene-graph captions ----------------------------------------------------------------------------


def sg_args(w: World, d: Path, graphs=None, data=None, saliency="none", *extra) -> list:
    """02's command line; with a saliency file, no image_data.json (its maps are keyed by VG id)."""
    data = [] if saliency != "none" else ["--image-data", data or FIXTURES / "vg_image_data_sample.json"]
    return ["--scene-graphs", graphs or FIXTURES / "vg_scene_graphs_sample.json", *data, "--saliency", saliency,
            "--out", d / "out.jsonl", *extra]


SG_ERRORS = [
    ("graphs-missing", lambda d: d / "nope.json", "no such file|not found"),
    ("graphs-not-json", lambda d: write(d, "sg.json", "[{"), "not valid json"),
    ("graphs-binary", lambda d: write(d, "sg.json", BINARY), "utf-8|unknown scene-graph format"),
    ("graphs-top-object", lambda d: write(d, "sg.json", {"a": 1}), "unknown scene-graph format"),
]
for name, make, fragment in SG_ERRORS:
    row("02", name, lambda w, d, make=make: sg_args(w, d, make(d)), fragment)
SG_SKIPS = [  # a malformed graph is left out, counted and listed in problems.tsv
    ("objects-null", graph(objects=None), "malformed graph"),
    ("objects-string", graph(objects="abc"), "malformed graph"),
    ("object-not-object", lambda g: g[0]["objects"].__setitem__(0, 5), "malformed graph"),
    ("object-id-string", obj(object_id="abc"), "malformed graph"),
    ("object-id-null", obj(object_id=None), "malformed graph"),
    ("object-id-missing", obj(object_id="DELETE"), "malformed graph"),
    ("x-string", obj(x="abc"), "invalid box"),
    ("w-null", obj(w=None), "invalid box"),
    ("box-nan", obj(x=float("nan")), "invalid box"),
    ("box-negative-size", obj(w=-5), "invalid box"),
    ("box-outside", obj(x=5000), "box outside the image"),
    ("names-missing", obj(names="DELETE"), "malformed graph"),
    ("names-empty", obj(names=[]), "malformed graph"),
    ("names-null-entry", obj(names=[None]), "malformed graph"),
    ("names-string", obj(names="tree"), "malformed graph"),
    ("names-emoji", obj(names=["\U0001F333"]), "malformed graph"),
    ("attributes-null-entry", obj(attributes=[None]), "malformed graph"),
    ("attributes-string", obj(attributes="green"), "malformed graph"),
    ("attributes-int", obj(attributes=[5]), "malformed graph"),
    ("relationships-string", graph(relationships="abc"), "malformed graph"),
    ("relationship-not-object", lambda g: g[0]["relationships"].__setitem__(0, 3), "malformed graph"),
    ("relationship-unknown-subject", rel(subject_id=999), "relationship names a missing object"),
    ("relationship-subject-string", rel(subject_id="abc"), "relationship names a missing object"),
    ("predicate-null", rel(predicate=None), "malformed graph"),
    ("predicate-int", rel(predicate=5), "malformed graph"),
    ("graph-id-missing", graph(image_id="DELETE"), "malformed graph"),
    ("graph-width-string", graph(width="abc"), "malformed graph"),
    ("duplicate-graph", lambda g: g.append(dict(g[1])), "duplicate image id"),
]
for name, change, fragment in SG_SKIPS:
    row("02", name, lambda w, d, change=change: sg_args(w, d, scene_graphs(d, change)), fragment, "skip")
row("02", "image-data-missing", lambda w, d: sg_args(w, d, data=d / "nope.json"), "no such file|not found")
row("02", "image-data-not-list", lambda w, d: sg_args(w, d, data=write(d, "i.json", {"a": 1})), "expected a list of image records")
row("02", "image-data-width-string", lambda w, d: sg_args(w, d, data=image_data(d, lambda x: x[0].update(width="abc"))), "'width' must be a number")
row("02", "image-data-width-null", lambda w, d: sg_args(w, d, data=image_data(d, lambda x: x[0].update(width=None))), "'width' must be a number")
row("02", "image-data-no-height", lambda w, d: sg_args(w, d, data=image_data(d, lambda x: x[0].pop("height"))), "missing key 'height'")
row("02", "image-data-record-int", lambda w, d: sg_args(w, d, data=image_data(d, lambda x: x.__setitem__(0, 4))), "expected a json object")
SAL_CASES = [
    ("saliency-missing", lambda w, d: d / "nope.h5", "saliency file not found"),
    ("saliency-not-hdf5", lambda w, d: write(d, "s.h5", "not hdf5"), "not an hdf5 file"),
    ("saliency-empty", lambda w, d: write(d, "s.h5", b""), "not an hdf5 file"),
    ("saliency-truncated", lambda w, d: truncated(w.saliency, d), "not an hdf5 file"),
    ("map-missing", lambda w, d: h5_changed(w.saliency, d, first_group(lambda g: g.__delitem__("map"))), "missing dataset 'map'"),
    ("map-1d", lambda w, d: h5_changed(w.saliency, d, first_group(replace_dataset("map", np.ones(5, np.float16)))), "map"),
    ("map-nan", lambda w, d: h5_changed(w.saliency, d, first_group(replace_dataset("map", np.full((6, 8), np.nan, np.float16)))), "nan saliency"),
    ("map-no-width", lambda w, d: h5_changed(w.saliency, d, first_group(set_attr("width", None))), "missing attribute 'width'"),
    ("map-width-string", lambda w, d: h5_changed(w.saliency, d, first_group(set_attr("width", "abc"))), "'width' must be a number"),
    ("map-width-zero", lambda w, d: h5_changed(w.saliency, d, first_group(set_attr("width", 0.0))), "'width' must be"),
]
for name, make, fragment in SAL_CASES:
    row("02", name, lambda w, d, make=make: sg_args(w, d, saliency=make(w, d)), fragment,
        "skip" if name == "map-nan" else "error")
row("02", "empty-shard", lambda w, d: sg_args(w, d, None, None, "none", "--num-shards", "5", "--shard-id", "4"), "", "ok")


def changed_per_image(w: World, d: Path) -> list:
    """Shard 0 of 2 done at --per-image 5; shard 1 then asked for --per-image 2: the merge must refuse."""
    _must(run_stage("02", sg_args(w, d, None, None, "none", "--num-shards", "2", "--shard-id", "0")))
    return sg_args(w, d, None, None, "none", "--num-shards", "2", "--shard-id", "1", "--per-image", "2")


row("02", "resume-changed-per-image", changed_per_image, "other inputs or settings", leaves_output=True)

# -- 03 paraphrase --------------------------------------------------------------------------------------


def para_args(w: World, d: Path, inp, *extra) -> list:
    return ["--in", inp, "--out", d / "out.jsonl", "--model", "rules", *extra]


PARA_CASES = [
    ("in-missing", lambda w, d: d / "nope.jsonl", "no such file|not found", "error"),
    ("bad-line", lambda w, d: jsonl_lines(w.selfgen, d, lambda r: r + ["{oops"]), "not valid json", "error"),
    ("binary", lambda w, d: write(d, "b.jsonl", BINARY), "utf-8", "error"),
    ("list-line", lambda w, d: jsonl_lines(w.selfgen, d, lambda r: r + ["[]"]), "expected a json object", "error"),
    ("no-caption", lambda w, d: jsonl_lines(w.selfgen, d, first(caption="DELETE")), "missing key", "error"),
    ("caption-int", lambda w, d: jsonl_lines(w.selfgen, d, first(caption=5)), "'caption' must be a string", "error"),
    ("caption-null", lambda w, d: jsonl_lines(w.selfgen, d, first(caption=None)), "'caption' must be a string", "error"),
    ("caption-list", lambda w, d: jsonl_lines(w.selfgen, d, first(caption=["a", "dog"])), "'caption' must be a string", "error"),
    ("id-null", lambda w, d: jsonl_lines(w.selfgen, d, first(id=None)), "'id' must be", "error"),
    ("image-id-null", lambda w, d: jsonl_lines(w.selfgen, d, first(image_id=None)), "'image_id' must be", "error"),
    ("duplicate-id", lambda w, d: jsonl_lines(w.selfgen, d, lambda r: r + [r[0]]), "appears twice", "error"),
    ("caption-no-word", lambda w, d: jsonl_lines(w.selfgen, d, first(caption="?! \U0001F600")), "no word left", "skip"),
]
for name, make, fragment, kind in PARA_CASES:
    row("03", name, lambda w, d, make=make: para_args(w, d, make(w, d)), fragment, kind)
row("03", "model-not-found", lambda w, d: ["--in", w.selfgen, "--out", d / "out.jsonl", "--model", d / "no-model"], "rules")
row("03", "model-sentences-after-rules", lambda w, d: (run_stage("03", para_args(w, d, w.selfgen)) and None)
    or ["--in", w.selfgen, "--out", d / "out.jsonl", "--model", "sentences"], "--model rules then, sentences now",
    leaves_output=True)
row("03", "model-sentences-capitalised", lambda w, d: ["--in", w.selfgen, "--out", d / "out.jsonl", "--model", "Sentences"],
    "use --model rules or sentences")
row("03", "model-sentences-only-punctuation", lambda w, d: ["--in", jsonl_lines(w.selfgen, d, first(caption="and . and , .")),
                                                           "--out", d / "out.jsonl", "--model", "sentences"], "paraphrased by sentences", "ok")
row("03", "empty-shard", lambda w, d: para_args(w, d, w.selfgen, "--num-shards", "40", "--shard-id", "39"), "", "ok")

# -- region features: 04, 05, 07 read the same file ----------------------------------------------------
FEATURE_CASES = [  # (name, make, fragment, kind, needs)
    ("missing", lambda w, d: d / "nope.h5", "no such file|not found", "error", None),
    ("not-hdf5", lambda w, d: write(d, "f.h5", "not hdf5"), "not an hdf5 file", "error", None),
    ("empty", lambda w, d: write(d, "f.h5", b""), "not an hdf5 file", "error", None),
    ("truncated", lambda w, d: truncated(w.features, d), "not an hdf5 file", "error", None),
    ("no-groups", lambda w, d: h5_changed(w.features, d, lambda f: [f.__delitem__(k) for k in list(f.keys())]), "holds no image|no image group", "error", None),
    ("no-features-dataset", lambda w, d: h5_changed(w.features, d, first_group(lambda g: g.__delitem__("features"))), "missing dataset 'features'", "error", None),
    ("features-1d", lambda w, d: h5_changed(w.features, d, first_group(replace_dataset("features", np.ones(16, np.float32)))), "features", "error", None),
    ("boxes-wrong-shape", lambda w, d: h5_changed(w.features, d, first_group(replace_dataset("boxes", np.ones((2, 3), np.float32)))), "do not match", "error", None),
    ("no-width", lambda w, d: h5_changed(w.features, d, first_group(set_attr("width", None))), "missing attribute 'width'", "error", None),
    ("width-string", lambda w, d: h5_changed(w.features, d, first_group(set_attr("width", "abc"))), "width 'abc' is not a number", "error", None),
    ("features-strings", lambda w, d: h5_changed(w.features, d, first_group(replace_dataset("features", np.array([["a"] * 16] * 2, dtype="S1")))), "features", "error", None),
    ("nan-feature", lambda w, d: h5_changed(w.features, d, first_group(poke("features", (0, 0), np.nan))), "nan at region", "error", None),
    ("inf-feature", lambda w, d: h5_changed(w.features, d, first_group(poke("features", (0, 1), np.inf))), "inf at region", "error", None),
    ("nan-box", lambda w, d: h5_changed(w.features, d, first_group(poke("boxes", (0, 0), np.nan))), "boxes: nan", "error", None),
    ("width-zero", lambda w, d: h5_changed(w.features, d, first_group(set_attr("width", 0.0))), "must be a positive number", "error", None),
    ("confidence-a-group", lambda w, d: h5_changed(w.features, d, first_group(lambda g: g.create_group("confidence"))), "'confidence' is a group, not a dataset", "error", None),
    ("cls-prob-a-group", lambda w, d: h5_changed(w.features, d, first_group(lambda g: g.create_group("cls_prob"))), "'cls_prob' is a group, not a dataset", "error", None),
]
for name, make, fragment, kind, needs in FEATURE_CASES:
    row("04", f"features-{name}", lambda w, d, make=make: w.train_args(d / "out", "--features", make(w, d)), fragment, kind, needs)
for name, make, fragment, kind, needs in FEATURE_CASES[:5] + FEATURE_CASES[9:10] + FEATURE_CASES[11:12]:
    row("05", f"features-{name}", lambda w, d, make=make: w.score_args(d / "out.h5", "--features", make(w, d)), fragment, kind, needs)
for name, make, fragment, kind, needs in FEATURE_CASES[:4]:
    row("06", f"features-{name}", lambda w, d, make=make: w.selection_args(d / "out", "--features", make(w, d)), fragment, kind, needs)
def big_endian(w: World, d: Path) -> Path:
    """The feature file with every array stored big-endian (read as the native one: test_loaders)."""
    def swap(f):
        for group in f.values():
            for name in list(group):
                values = group[name][()]
                del group[name]
                group[name] = values.astype(values.dtype.newbyteorder(">"))
    return h5_changed(w.features, d, swap, "big-endian.h5")


row("04", "features-big-endian", lambda w, d: w.train_args(d / "out", "--features", big_endian(w, d)), "", "ok")
row("05", "features-big-endian", lambda w, d: w.score_args(d / "out.h5", "--features", big_endian(w, d)), "", "ok")
row("caption", "features-big-endian", lambda w, d: w.caption_args(d, "--features", big_endian(w, d)), "", "ok")
row("04", "features-image-missing", lambda w, d: w.train_args(d / "out", "--max-left-out", "0.2", "--features",
                                                              h5_changed(w.features, d, lambda f: f.__delitem__("1"))),
    "no region features for the image", "skip")

# -- features of another kind or dimension than a checkpoint's (04 --init-from, 05, 07) ------------------
def other_kind(w: World, d: Path) -> Path:
    return h5_changed(w.features, d, lambda f: f.attrs.__setitem__("feature_kind", "butd"), "butd.h5")


def other_dim(w: World, d: Path) -> Path:
    (d / "w8").mkdir()
    return make_toy_world(d / "w8", n_train=8, n_val=2, n_test=3, dim=8)[1]


def without_feature_kind(folder: Path) -> None:
    """A checkpoint written before config.json recorded the features' kind."""
    config = json.loads((folder / "config.json").read_text())
    del config["feature_kind"], config["feature_dim"]
    (folder / "config.json").write_text(json.dumps(config))


KIND_CASES = [  # (name, make features, fragment)
    ("other-kind", other_kind, "holds 'butd' features of 16 dimensions, but the checkpoint"),
    ("other-dimension", other_dim, "holds 'toy' features of 8 dimensions, but the checkpoint"),
]
for name, make, fragment in KIND_CASES:
    row("05", f"features-{name}", lambda w, d, make=make: w.score_args(d / "out.h5", "--features", make(w, d)),
        fragment + "|trained on 'toy' features of 16 dimensions")
    row("07", f"features-{name}", lambda w, d, make=make: ["--refs", w.captions, "--features", make(w, d), "--checkpoint",
                                                            w.trusted, "--out", d / "out", "--spice", "off"], fragment)
    row("04", f"init-from-features-{name}", lambda w, d, make=make: w.train_args(d / "out", "--init-from", w.trusted,
                                                                                 "--features", make(w, d)), fragment)
row("05", "features-other-kind-older-checkpoint",  # no kind recorded: checked on the dimension only
    lambda w, d: w.score_args(d / "out.h5", "--features", other_kind(w, d),
                              "--trusted", checkpoint_copy(w.trusted, d, without_feature_kind, "old"),
                              "--extended", checkpoint_copy(w.extended, d, without_feature_kind, "old_ext")), "scored", "ok")
row("05", "features-dim-attribute-wrong",
    lambda w, d: w.score_args(d / "out.h5", "--features", h5_changed(w.features, d, lambda f: f.attrs.__setitem__("feature_dim", 99))),
    "attribute 'feature_dim': says 99, but the features of image")

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
    ("images-missing", lambda w, d: ["--images", d / "nope", "--boxes", "grid", "2", "--out", d / "f.h5"], "no such image folder"),
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
row("04", "adam-eps-zero", lambda w, d: w.train_args(d / "out", "--adam-eps", "0"), "argument --adam-eps: must be a positive")
row("04", "region-init-with-init-from", lambda w, d: w.train_args(d / "out", "--init-from", w.trusted, "--region-init", d / "fc.pt"),
    "--region-init sets a new model's first region layer")
row("04", "region-init-not-a-state-dict", lambda w, d: w.train_args(d / "out", "--region-init", write(d, "fc.pt", BINARY)),
    "not a safetensors file or a plain state dict")
for name, make, fragment in ENCODER_CASES:
    row("features", name, make, fragment)

# -- self-generated captions JSONL: 04 extended, 05, 06 --------------------------------------------------
SELFGEN_CASES = [
    ("missing", lambda w, d: d / "nope.jsonl", "no such file|not found", "error"),
    ("bad-line", lambda w, d: jsonl_lines(w.selfgen, d, lambda r: r + ["{oops"]), "not valid json", "error"),
    ("binary", lambda w, d: write(d, "b.jsonl", BINARY), "utf-8", "error"),
    ("no-id", lambda w, d: jsonl_lines(w.selfgen, d, first(id="DELETE")), "missing key", "error"),
    ("id-null", lambda w, d: jsonl_lines(w.selfgen, d, first(id=None)), "'id' must be", "error"),
    ("caption-int", lambda w, d: jsonl_lines(w.selfgen, d, first(caption=4)), "'caption' must be a string", "error"),
    ("caption-null", lambda w, d: jsonl_lines(w.selfgen, d, first(caption=None)), "'caption' must be a string", "error"),
    ("caption-no-word", lambda w, d: jsonl_lines(w.selfgen, d, first(caption="\U0001F600 !!")), "no word left", "skip"),
]
SHARE = ["--max-left-out", "0.2"]  # (one caption of the toy world is more than the default 5%)
for name, make, fragment, kind in SELFGEN_CASES:
    share = SHARE if kind == "skip" else []
    row("04", f"selfgen-{name}", lambda w, d, make=make, share=share: w.train_args(d / "out", "--data", "extended", "--selfgen", make(w, d), *share),
        fragment, kind)
    row("05", f"selfgen-{name}", lambda w, d, make=make, share=share: w.score_args(d / "out.h5", "--selfgen", make(w, d), *share), fragment, kind)
for name, make, fragment, kind in SELFGEN_CASES[:1] + SELFGEN_CASES[4:6]:
    row("06", f"selfgen-{name}", lambda w, d, make=make: w.selection_args(d / "out", "--selfgen", make(w, d)), fragment, kind)

# -- 04 training: other inputs, corrupt checkpoints, resume with changed inputs -------------------------
row("04", "output-vocab-missing", lambda w, d: w.train_args(d / "out", "--output-vocab", d / "nope.json"), "no such file|not found")
row("04", "output-vocab-not-json", lambda w, d: w.train_args(d / "out", "--output-vocab", write(d, "v.json", "{")), "not valid json")
row("04", "init-from-missing", lambda w, d: w.train_args(d / "out", "--init-from", d / "nope"), "no such checkpoint folder")
row("04", "init-from-bad-config", lambda w, d: w.train_args(d / "out", "--init-from", checkpoint_copy(w.trusted, d, corrupt("config.json", b"{"), "init")), "not valid json")
row("04", "init-from-other-levels", lambda w, d: w.train_args(d / "out", "--init-from", w.trusted, "--levels", "paragraph"),
    "trained with levels caption, not this run's --levels paragraph")
row("04", "continue-from-other-levels",
    lambda w, d: w.train_args(d / "out", "--continue-from", w.trusted, "--levels", "paragraph", "--max-steps", "1000"),
    "trained with levels caption, not this run's --levels paragraph")
row("04", "init-from-bad-weights", lambda w, d: w.train_args(d / "out", "--init-from", checkpoint_copy(w.trusted, d, corrupt("model.safetensors"), "init")), "model.safetensors")
CORRUPT_CHECKPOINT = [  # (name, change of an unfinished copy, fragment)
    ("train-state-garbage", corrupt("train_state.json", b"{step"), "train_state.json"),
    ("train-state-no-step", corrupt("train_state.json", b"{}"), "train_state.json"),
    ("train-state-step-string", corrupt("train_state.json", b'{"step": "x"}'), "train_state.json"),
    ("optimizer-garbage", corrupt("optimizer.pt"), "optimizer.pt"),
    ("optimizer-missing", lambda f: (f / "optimizer.pt").unlink(), "optimizer.pt"),
    ("weights-garbage", corrupt("model.safetensors"), "model.safetensors"),
    ("weights-empty", corrupt("model.safetensors", b""), "model.safetensors"),
    ("config-garbage", corrupt("config.json", b"{"), "config.json"),
]
for name, change, fragment in CORRUPT_CHECKPOINT:
    row("04", f"resume-{name}", lambda w, d, change=change: w.train_args(checkpoint_copy(w.trusted, d, unfinished(change))), fragment)
    row("06", f"resume-{name}", lambda w, d, change=change: w.selection_args(checkpoint_copy(w.selection, d, unfinished(change))), fragment)
RESUME_CHANGES_04 = [
    ("lr", lambda w, d: ["--lr", "1e-2"], "--lr"),
    ("batch-size", lambda w, d: ["--batch-size", "8"], "--batch-size"),
    ("data", lambda w, d: ["--data", "extended", "--selfgen", w.selfgen], "--data"),
    ("max-steps", lambda w, d: ["--max-steps", "3"], "--max-steps"),
    ("seed", lambda w, d: ["--seed", "3"], "--seed"),
    ("levels", lambda w, d: ["--levels", "labert"], "--levels"),
    ("captions-file", lambda w, d: ["--captions", karpathy(w, d, sentence(0, {"raw": "a different caption"}))], "--captions"),
    ("features-file", lambda w, d: ["--features", h5_changed(w.features, d, lambda f: f.__delitem__("1"))], "--features"),
]
for name, extra, fragment in RESUME_CHANGES_04:
    row("04", f"resume-changed-{name}", lambda w, d, extra=extra: w.train_args(checkpoint_copy(w.trusted, d), *extra(w, d)), fragment)
def without_run_record(folder: Path) -> None:
    """A checkpoint as written before input files were recorded: its flags only under "train"."""
    config = json.loads((folder / "config.json").read_text())
    del config["run"]
    (folder / "config.json").write_text(json.dumps(config))


row("04", "resume-old-checkpoint-changed-lr",
    lambda w, d: w.train_args(checkpoint_copy(w.trusted, d, without_run_record), "--lr", "1e-2"), "--lr")
row("04", "resume-changed-log-every-is-fine", lambda w, d: w.train_args(checkpoint_copy(w.trusted, d), "--log-every", "7"),
    "already trained", "ok")
row("04", "resume-changed-lr-restart", lambda w, d: w.train_args(checkpoint_copy(w.trusted, d), "--lr", "1e-2", "--restart"),
    "checkpoint:", "ok")
RESUME_CHANGES_06 = [
    ("c", lambda w, d: ["--c", "5"], "--c"),
    ("eta", lambda w, d: ["--eta", "2"], "--eta"),
    ("schedule", lambda w, d: ["--schedule", "constant"], "--schedule"),
    ("quality-file", lambda w, d: ["--quality", h5_changed(w.quality, d, lambda f: f["u"].__setitem__(0, 9.0))], "--quality"),
]
for name, extra, fragment in RESUME_CHANGES_06:
    row("06", f"resume-changed-{name}", lambda w, d, extra=extra: w.selection_args(checkpoint_copy(w.selection, d), *extra(w, d)), fragment)

# -- 05 scoring: checkpoints ------------------------------------------------------------------------------
def narrower(folder: Path) -> None:
    """config.json of a narrower model than the weights in model.safetensors."""
    config = folder / "config.json"
    config.write_text(config.read_text().replace('"hidden_size": 192', '"hidden_size": 96'))


CHECKPOINT_CASES = [
    ("missing", lambda w, d: d / "nope", "no such checkpoint folder|checkpoint not found"),
    ("config-garbage", lambda w, d: checkpoint_copy(w.trusted, d, corrupt("config.json", b"{"), "ck"), "not valid json"),
    ("config-no-model", lambda w, d: checkpoint_copy(w.trusted, d, corrupt("config.json", b"{}"), "ck"), "config.json"),
    ("config-unknown-field", lambda w, d: checkpoint_copy(w.trusted, d, lambda f: (f / "config.json").write_text(json.dumps({"model": {"wings": 2}})), "ck"), "config.json"),
    ("weights-garbage", lambda w, d: checkpoint_copy(w.trusted, d, corrupt("model.safetensors"), "ck"), "model.safetensors"),
    ("weights-empty", lambda w, d: checkpoint_copy(w.trusted, d, corrupt("model.safetensors", b""), "ck"), "model.safetensors"),
    ("weights-of-another-model", lambda w, d: checkpoint_copy(w.trusted, d, narrower, "ck"), "does not describe the weights"),
]
for name, make, fragment in CHECKPOINT_CASES:
    row("05", f"checkpoint-{name}", lambda w, d, make=make: w.score_args(d / "out.h5", "--trusted", make(w, d)), fragment)
    row("07", f"checkpoint-{name}", lambda w, d, make=make: ["--refs", w.captions, "--features", w.features, "--checkpoint", make(w, d),
                                                            "--out", d / "out", "--spice", "off"], fragment)
row("05", "include-trusted-no-captions", lambda w, d: w.score_args(d / "out.h5", "--include-trusted"), "needs --captions")
row("05", "captions-split-null", lambda w, d: w.score_args(d / "out.h5", "--captions", karpathy(w, d, set_in(0, split=None))), "'split' must be a string")
row("05", "features-image-missing", lambda w, d: w.score_args(d / "out.h5", "--max-left-out", "0.2", "--features",
                                                              h5_changed(w.features, d, lambda f: f.__delitem__("1"))),
    "no region features for the image", "skip")
row("05", "empty-shard", lambda w, d: w.score_args(d / "out.h5", "--num-shards", "40", "--shard-id", "39"), "", "ok")

# -- 06 quality file -------------------------------------------------------------------------------------
def first_rows(n: int):
    """A change keeping the first ``n`` rows of every dataset of a flat HDF5 file."""
    def change(f):
        for name in list(f.keys()):
            values = f[name][()][:n]
            del f[name]
            f.create_dataset(name, data=values)
    return change


QUALITY_CASES = [
    ("missing", lambda w, d: d / "nope.h5", "no such file|not found", None),
    ("not-hdf5", lambda w, d: write(d, "q.h5", "nope"), "not an hdf5 file", None),
    ("empty", lambda w, d: write(d, "q.h5", b""), "not an hdf5 file", None),
    ("truncated", lambda w, d: truncated(w.quality, d), "not an hdf5 file", None),
    ("no-u", lambda w, d: h5_changed(w.quality, d, lambda f: f.__delitem__("u")), "missing dataset 'u'", None),
    ("u-nan", lambda w, d: h5_changed(w.quality, d, lambda f: f["u"].__setitem__(0, np.nan)), "u is nan", None),
    ("u-inf", lambda w, d: h5_changed(w.quality, d, lambda f: f["u"].__setitem__(0, np.inf)), "u is inf", None),
    ("missing-scores", lambda w, d: h5_changed(w.quality, d, first_rows(3)), "have no quality score", None),
    ("ragged", lambda w, d: h5_changed(w.quality, d, lambda f: f.__delitem__("u") or f.create_dataset("u", data=np.zeros(3, np.float32))), "lengths", None),
]
for name, make, fragment, needs in QUALITY_CASES:
    row("06", f"quality-{name}", lambda w, d, make=make: w.selection_args(d / "out", "--quality", make(w, d)), fragment, "error", needs)
row("06", "init-other-levels", lambda w, d: w.selection_args(d / "out", "--init", w.trusted, "--levels", "paragraph"),
    "trained with levels caption, not this run's --levels paragraph")
row("06", "init-not-a-folder", lambda w, d: w.selection_args(d / "out", "--init", d / "nope"), "--init must be")

# -- 06 selection strategies (clid/method/selection.py) ---------------------------------------------------------
STRATEGY_FLAG_CASES = [
    ("curriculum-no-difficulty", ["--strategy", "curriculum"], "needs --difficulty"),
    ("difficulty-unknown", ["--strategy", "curriculum", "--difficulty", "loss"], "--difficulty must be"),
    ("difficulty-bootstrap-missing", ["--strategy", "curriculum", "--difficulty", "bootstrap:/no/such/ckpt"], "is not a folder"),
    ("difficulty-clip-no-images", ["--strategy", "curriculum", "--difficulty", "clip:."], "needs --images"),
    ("curate-ratio-zero", ["--strategy", "loss-remove", "--curate-ratio", "0"], "argument --curate-ratio: must be"),
    ("curate-ratio-one", ["--strategy", "loss-remove", "--curate-ratio", "1"], "argument --curate-ratio: must be"),
    ("curate-std-negative", ["--strategy", "loss-remove", "--curate-std", "-2"], "argument --curate-std: must be a positive"),
    ("curate-std-inf", ["--strategy", "loss-remove", "--curate-std", "inf"], "argument --curate-std: must be a positive"),
    ("curate-every-zero", ["--strategy", "loss-remove", "--curate-every", "0"], "argument --curate-every: must be a positive integer"),
    ("buckets-zero", ["--strategy", "curriculum", "--difficulty", "u", "--buckets", "0"], "argument --buckets: must be a positive integer"),
    ("patience-zero", ["--strategy", "curriculum", "--difficulty", "u", "--patience", "0"], "argument --patience: must be a positive integer"),
    ("min-improvement-nan", ["--strategy", "curriculum", "--difficulty", "u", "--min-improvement", "nan"],
     "argument --min-improvement: must be"),
]


def without(args: list, flag: str) -> list:
    """An argument list of flag-value pairs without ``flag``."""
    return [x for pair in zip(args[::2], args[1::2]) if pair[0] != flag for x in pair]


for name, extra, fragment in STRATEGY_FLAG_CASES:
    row("06", name, lambda w, d, extra=extra: w.selection_args(d / "out", *extra), fragment)
row("06", "strategy-clid-no-quality", lambda w, d: without(w.selection_args(d / "out"), "--quality"), "needs --quality")
row("06", "difficulty-u-no-trusted-scores", lambda w, d: w.selection_args(d / "out", "--strategy", "curriculum",
                                                                           "--difficulty", "u"),
    "trusted captions have no quality score")
row("06", "difficulty-bootstrap-other-levels",
    lambda w, d: w.selection_args(d / "out", "--strategy", "curriculum", "--difficulty", f"bootstrap:{w.trusted}",
                                  "--levels", "paragraph"), "trained with levels caption")
row("06", "difficulty-bootstrap-not-a-checkpoint",
    lambda w, d: w.selection_args(d / "out", "--strategy", "curriculum", "--difficulty", f"bootstrap:{w.images}"),
    "is not a checkpoint")
row("06", "difficulty-clip-not-a-model",
    lambda w, d: w.selection_args(d / "out", "--strategy", "curriculum", "--difficulty", f"clip:{w.images}",
                                  "--images", w.images), "not a transformers clip model folder")


# -- the demo world's ground truth: 02 --clean-graphs, python -m clid.demo.truth --------------------------
row("02", "clean-graphs-missing", lambda w, d: sg_args(w, d, None, None, "none", "--clean-graphs", d / "nope.json"),
    "no such file|not found")
row("02", "clean-graphs-not-json", lambda w, d: sg_args(w, d, None, None, "none", "--clean-graphs", write(d, "c.json", "[{")),
    "not valid json")
row("02", "clean-graphs-object-no-id",
    lambda w, d: sg_args(w, d, None, None, "none", "--clean-graphs", scene_graphs(d, obj(object_id="DELETE"), "c.json")),
    "--clean-graphs")


def truth_args(w: World, d: Path, selfgen=None, *extra) -> list:
    return ["--selfgen", selfgen or jsonl_lines(w.selfgen, d, lambda rows: [dict(r, truth={"hallucinated": 0})
                                                                             for r in rows], "t.jsonl"),
            "--quality", w.quality, "--out", d / "truth", *extra]


row("truth", "selfgen-without-truth", lambda w, d: truth_args(w, d, w.selfgen), "no 'truth'")
row("truth", "quality-missing", lambda w, d: truth_args(w, d, None, "--quality", d / "nope.h5"), "no such file|not found")
row("truth", "quality-of-other-captions",
    lambda w, d: truth_args(w, d, None, "--quality", h5_changed(w.quality, d, first_rows(0))), "scores none of the captions")
row("truth", "run-not-a-folder", lambda w, d: truth_args(w, d, None, "--run", f"CLID={d / 'nope'}"), "--run must be")
row("truth", "run-without-log", lambda w, d: truth_args(w, d, None, "--run", f"CLID={w.trusted}"),
    "selection_log.jsonl")
row("truth", "difficulty-of-other-captions",
    lambda w, d: truth_args(w, d, None, "--difficulty", write_difficulty(d)), "no difficulty for")
row("truth", "combine-missing", lambda w, d: ["--combine", d / "nope", "--out", d / "all"], "no such file|not found")
row("truth", "no-inputs", lambda w, d: ["--out", d / "t"], "are required")


def write_difficulty(d: Path) -> Path:
    from clid.base.files import write_arrays

    write_arrays(d / "difficulty.h5", {"id": np.asarray(["someone_else"], dtype=object), "difficulty": np.zeros(1)})
    return d / "difficulty.h5"


# -- CIC-BART-SSA's captions: python -m clid.data convert-ssa ---------------------------------------------
def ssa_folder(d: Path, files: dict) -> Path:
    folder = d / "ssa"
    folder.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        write(folder, name, content)
    return folder


GOOD_REGION = {"objects": [{"object_id": 5, "name": "dog"}], "relationships": [], "phrase": "a dog on the grass"}
row("data", "convert-ssa-missing", lambda w, d: ["convert-ssa", "--ssa", d / "nope", "--out", d / "o.jsonl"],
    "no such file or folder")
row("data", "convert-ssa-empty-folder", lambda w, d: ["convert-ssa", "--ssa", ssa_folder(d, {}), "--out", d / "o.jsonl"],
    "holds no .json file")
row("data", "convert-ssa-not-json", lambda w, d: ["convert-ssa", "--ssa", ssa_folder(d, {"1.json": "{"}), "--out", d / "o.jsonl"],
    "not valid json")
row("data", "convert-ssa-top-level-list",
    lambda w, d: ["convert-ssa", "--ssa", ssa_folder(d, {"1.json": [GOOD_REGION]}), "--out", d / "o.jsonl"],
    "expected an object of regions")
row("data", "convert-ssa-binary", lambda w, d: ["convert-ssa", "--ssa", ssa_folder(d, {"1.json": BINARY}), "--out", d / "o.jsonl"],
    "utf-8")
row("data", "convert-ssa-out-is-input",
    lambda w, d: ["convert-ssa", "--ssa", (f := ssa_folder(d, {"1.json": {"0": GOOD_REGION}})), "--out", f / "1.json"],
    "is also the input --ssa")
SSA_SKIPS = [
    ("phrase-int", dict(GOOD_REGION, phrase=4), "malformed region"),
    ("phrase-missing", {"objects": []}, "malformed region"),
    ("objects-string", dict(GOOD_REGION, objects="dog"), "malformed region"),
    ("object-without-id", dict(GOOD_REGION, objects=[{"name": "dog"}]), "malformed region"),
    ("region-a-string", "a dog", "malformed region"),
    ("image-id-of-another-file", dict(GOOD_REGION, image_id=2), "malformed region"),
    ("ungrounded-object", dict(GOOD_REGION, objects=[{"object_id": "unknown"}]), "not grounded"),
    ("phrase-no-word", dict(GOOD_REGION, phrase="?!"), "no word left"),
]
for name, region, fragment in SSA_SKIPS:
    row("data", f"convert-ssa-{name}",
        lambda w, d, region=region: ["convert-ssa", "--ssa", ssa_folder(d, {"1.json": {"0": GOOD_REGION, "1": region}}),
                                     "--out", d / "o.jsonl"], fragment, "skip")
row("07", "levels-ssa-generated-level-6",
    lambda w, d: w.eval_args(d / "out", "--levels", "ssa", "--generated",
                             jsonl_lines(w.generated, d, first(level=6), "g.jsonl")), "outside the 5 ssa levels")


# -- 07 evaluation: generated captions, features, long references, other files --------------------------
GENERATED_CASES = [
    ("missing", lambda w, d: d / "nope.jsonl", "no such file|not found"),
    ("empty", lambda w, d: write(d, "g.jsonl", ""), "no captions"),
    ("blank-lines", lambda w, d: write(d, "g.jsonl", "\n\n"), "no captions"),
    ("bad-line", lambda w, d: jsonl_lines(w.generated, d, lambda r: r + ["{"], "g.jsonl"), "not valid json"),
    ("binary", lambda w, d: write(d, "g.jsonl", BINARY), "utf-8"),
    ("level-word", lambda w, d: jsonl_lines(w.generated, d, first(level="two"), "g.jsonl"), "'level' must be a level number"),
    ("level-99", lambda w, d: jsonl_lines(w.generated, d, first(level=99), "g.jsonl"), "outside 1..7"),
    ("level-0", lambda w, d: jsonl_lines(w.generated, d, first(level=0), "g.jsonl"), "outside 1..7"),
    ("caption-int", lambda w, d: jsonl_lines(w.generated, d, first(caption=4), "g.jsonl"), "'caption' must be a string"),
    ("caption-null", lambda w, d: jsonl_lines(w.generated, d, first(caption=None), "g.jsonl"), "'caption' must be a string"),
    ("image-id-null", lambda w, d: jsonl_lines(w.generated, d, first(image_id=None), "g.jsonl"), "'image_id' must be"),
    ("duplicate", lambda w, d: jsonl_lines(w.generated, d, lambda r: r + [r[0]], "g.jsonl"), "a second caption"),
    ("no-level", lambda w, d: jsonl_lines(w.generated, d, first(level="DELETE"), "g.jsonl"), "missing key"),
]
for name, make, fragment in GENERATED_CASES:
    row("07", f"generated-{name}", lambda w, d, make=make: w.eval_args(d / "out", "--generated", make(w, d)), fragment)
row("07", "checkpoint-without-features", lambda w, d: ["--refs", w.captions, "--checkpoint", w.trusted, "--out", d / "out"], "needs --features")
row("07", "features-test-image-width-string",
    lambda w, d: ["--refs", w.captions, "--checkpoint", w.trusted, "--out", d / "out", "--spice", "off", "--features",
                  h5_changed(w.features, d, lambda f: f["11"].attrs.__setitem__("width", "abc"))],
    "width 'abc' is not a number")
for name, make, fragment, kind, needs in FEATURE_CASES[:4]:
    row("07", f"features-{name}", lambda w, d, make=make: ["--refs", w.captions, "--features", make(w, d), "--checkpoint", w.trusted,
                                                            "--out", d / "out", "--spice", "off"], fragment, kind, needs)


def long_refs(w: World, d: Path, level) -> Path:
    data = json.loads(w.captions.read_text())
    test = [im for im in data["images"] if im["split"] == "test"]
    for im in test:
        for s in im["sentences"]:
            s["level"] = 3
    test[0]["sentences"][0]["level"] = level
    return write(d, "long.json", {"images": test})


row("07", "long-refs-missing", lambda w, d: w.eval_args(d / "out", "--long-refs", d / "nope.json"), "no such file|not found")
row("07", "long-refs-not-json", lambda w, d: w.eval_args(d / "out", "--long-refs", write(d, "long.json", "{")), "not valid json")
row("07", "long-refs-level-string", lambda w, d: w.eval_args(d / "out", "--long-refs", long_refs(w, d, "3")), "needs an integer 'level'")
row("07", "long-refs-level-outside", lambda w, d: w.eval_args(d / "out", "--long-refs", long_refs(w, d, 12)), "outside the level set")
row("07", "long-refs-level-zero", lambda w, d: w.eval_args(d / "out", "--long-refs", long_refs(w, d, 0)), "outside the level set")
row("07", "long-refs-raw-int", lambda w, d: w.eval_args(d / "out", "--long-refs", karpathy(w, d, sentence(TEST_IMAGE, {"raw": 3, "level": 3}))), "'raw' must be a string")
row("07", "test-ids-missing", lambda w, d: w.eval_args(d / "out", "--test-ids", d / "nope.txt"), "no such file|not found")
row("07", "selfgen-missing", lambda w, d: w.eval_args(d / "out", "--selfgen", d / "nope.jsonl"), "no such file|not found")
row("07", "selfgen-caption-int", lambda w, d: w.eval_args(d / "out", "--selfgen", jsonl_lines(w.selfgen, d, first(caption=4))), "'caption' must be a string")
row("07", "selfgen-bad-line", lambda w, d: w.eval_args(d / "out", "--selfgen", jsonl_lines(w.selfgen, d, lambda r: r + ["{"])), "not valid json")


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
    ("gallery-is-out", lambda w, d: ["--gallery", d / "captions.jsonl"], "is also the input --out"),
    ("images-without-gallery", lambda w, d: ["--images", w.images], "give --gallery"),
    ("gallery-no-image-folder", lambda w, d: ["--ids", write(d, "ids.txt", "1\n"), "--gallery", d / "g.html", "--images", d / "nope"],
     "no such folder"),
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


# -- output folders and files: a stage never deletes or replaces what it did not write --------------------
def user_folder(d: Path, w: World, name="data") -> Path:
    """A folder of the user's: images, a captions file and another run's checkpoint."""
    folder = d / name
    shutil.copytree(w.images, folder / "images")
    shutil.copy(w.captions, folder / "captions.json")
    shutil.copytree(w.trusted, folder / "trusted")
    return folder


def user_file(folder: Path, name: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text("the user's\n")
    return folder


row("04", "out-data-folder", lambda w, d: w.train_args(user_folder(d, w)), "did not write")
row("04", "out-parent-of-runs", lambda w, d: w.train_args(checkpoint_copy(w.trusted, d, name="runs/trusted").parent), "did not write")
row("04", "out-is-a-file", lambda w, d: w.train_args(write(d, "out", "x")), "is a file, not a folder")
row("04", "out-force-would-replace-users-config", lambda w, d: w.train_args(user_file(d / "out", "config.json"), "--force"),
    "would replace")
row("04", "out-is-continue-from", lambda w, d: w.train_args((ck := checkpoint_copy(w.trusted, d)), "--continue-from", ck, "--max-steps", "4"),
    "is also the input --continue-from")
row("04", "out-is-init-from", lambda w, d: w.train_args((ck := checkpoint_copy(w.trusted, d)), "--init-from", ck),
    "is also the input --init-from")
row("04", "restart-in-data-folder", lambda w, d: w.train_args(user_folder(d, w), "--restart"), "did not write")
row("06", "out-data-folder", lambda w, d: w.selection_args(user_folder(d, w)), "did not write")
row("06", "out-parent-of-runs", lambda w, d: w.selection_args(checkpoint_copy(w.selection, d, name="runs/clid").parent), "did not write")
row("06", "out-is-init", lambda w, d: w.selection_args((ck := checkpoint_copy(w.trusted, d)), "--init", ck), "is also the input --init")
row("07", "out-data-folder", lambda w, d: w.eval_args(user_folder(d, w)), "did not write")
row("07", "out-users-report", lambda w, d: w.eval_args(user_file(d / "out", "report.md"), "--force"), "would replace")
row("07", "out-is-a-file", lambda w, d: w.eval_args(write(d, "out", "x")), "is a file, not a folder")
row("05", "out-is-selfgen", lambda w, d: w.score_args((p := write(d, "s.jsonl", w.selfgen.read_text())), "--selfgen", p),
    "is also the input --selfgen")
row("data", "convert-coco-out-is-input", lambda w, d: ["convert-coco", "--captions", (p := coco_captions(w, d, "a dog")),
                                                      "--out", p], "is also the input --captions")
row("04", "split-capitalised", lambda w, d: w.train_args(d / "out", "--captions", karpathy(w, d, set_in(0, split="Train"))),
    "unknown split 'train'")
row("stats", "split-unknown", lambda w, d: [karpathy(w, d, set_in(0, split="validation"))], "unknown split 'validation'")
row("04", "test-ids-binary", lambda w, d: w.train_args(d / "out", "--test-ids", write(d, "ids.txt", BINARY)), "utf-8")


# -- numbers checked where they are parsed: argparse's one line, naming the flag --------------------------
NUMBERS = {  # stage -> (the flags of a valid run, [(flag, bad values)])
    "04": (lambda w, d: w.train_args(d / "out"),
           [("--lr", ["0", "-1e-4", "nan", "inf"]), ("--weight-decay", ["-0.1", "nan"]), ("--warmup", ["-1", "1.5"]),
            ("--max-steps", ["0", "-5"]), ("--lr-horizon", ["-1"]), ("--batch-size", ["0", "-4"]),
            ("--grad-clip", ["-1", "nan"]), ("--label-smoothing", ["2", "1", "-0.1"]), ("--eos-weight", ["0", "nan"]),
            ("--dropout", ["1.5", "1", "-0.1"]), ("--save-every", ["0", "-1"]), ("--eval-every", ["-1"]),
            ("--eval-images", ["0"]), ("--log-every", ["0", "-3"]), ("--seed", ["-1", "x"])]),
    "06": (lambda w, d: w.selection_args(d / "out"),
           [("--c", ["0", "-2", "101", "nan"]), ("--s", ["0", "-1", "inf"]), ("--eta", ["0", "-1"]),
            ("--lr", ["nan", "0"]), ("--batch-size", ["0"]), ("--max-steps", ["0", "-1"]), ("--save-every", ["0"]),
            ("--log-every", ["0"]), ("--label-smoothing", ["2"]), ("--dropout", ["1.5"]), ("--warmup", ["-1"])]),
    "05": (lambda w, d: w.score_args(d / "out.h5"),
           [("--batch-size", ["0", "-1", "x"]), ("--chunk-size", ["0"]), ("--shard-id", ["-1"]),
            ("--num-shards", ["0", "-2"]), ("--seed", ["-1"])]),
    "07": (lambda w, d: ["--refs", w.captions, "--features", w.features, "--checkpoint", w.trusted, "--out", d / "out",
                         "--spice", "off"],
           [("--batch-size", ["0", "-1"]), ("--examples", ["-1"]), ("--decode-steps", ["0", "-2"]),
            ("--eos-decay", ["0", "1.5", "nan"])]),
    "01": (lambda w, d: ["--images", w.images, "--out", d / "out.h5"],
           [("--map-side", ["0"]), ("--batch-size", ["0"]), ("--workers", ["0"]), ("--chunk-size", ["0", "-1"]),
            ("--sigma", ["-1", "nan"]), ("--emlnet-size", ["0"]), ("--preview", ["-1"]), ("--num-shards", ["0"]),
            ("--shard-id", ["-1"])]),
    "02": (lambda w, d: sg_args(w, d),
           [("--k", ["0", "-1"]), ("--per-image", ["0"]), ("--n-attr", ["-1"]), ("--t-sal", ["1.5", "nan", "-0.1"]),
            ("--min-object-conf", ["2", "nan"]), ("--min-relation-conf", ["-0.5"]), ("--chunk-size", ["0"]),
            ("--seed", ["-1"]), ("--num-shards", ["0"])]),
    "03": (lambda w, d: para_args(w, d, w.selfgen),
           [("--num-beams", ["0"]), ("--batch-size", ["0"]), ("--max-length", ["0"]), ("--piece-tokens", ["0"]),
            ("--min-ratio", ["-1", "nan"]), ("--chunk-size", ["0"]), ("--shard-id", ["-2"])]),
    "00": (lambda w, d: ["--out", d / "demo", "--small", "--skip-features"],
           [("--size", ["10", "x"]), ("--n-train", ["-1"]), ("--graph-noise", ["2", "nan"]),
            ("--captions-per-image", ["0"]), ("--refs-per-level", ["-1"]), ("--crop", ["0"]), ("--workers", ["0"]),
            ("--chunk", ["0"]), ("--colour-bins", ["-1"]), ("--preview", ["-1"]), ("--seed", ["-1"]),
            ("--long-levels", ["3,x", "9", ""])]),
    "features": (lambda w, d: ["--images", w.images, "--scene-graphs", FIXTURES / "vg_scene_graphs_sample.json",
                               "--out", d / "f.h5"],
                 [("--crop", ["0"]), ("--whole", ["-1"]), ("--colour-bins", ["-1"]), ("--batch-size", ["0"]),
                  ("--chunk", ["0"])]),
    "data": (lambda w, d: ["convert-coco", "--captions", coco_captions(w, d, "a dog"), "--out", d / "k.json"],
             [("--val-size", ["-1", "x"])]),
    "shard": (lambda w, d: ["merge", d / "out.jsonl"], [("--num-shards", ["0", "-1", "x"])]),
}
for stage, (valid, flags) in NUMBERS.items():
    for flag, values in flags:
        for value in values:
            row(stage, f"number{flag}={value}", lambda w, d, valid=valid, flag=flag, value=value: [*valid(w, d), f"{flag}={value}"],
                f"argument {flag}")
row("04", "lr-horizon-below-max-steps", lambda w, d: w.train_args(d / "out", "--lr-horizon", "1"), "--lr-horizon 1 is below --max-steps 2")
row("06", "lr-horizon-below-max-steps", lambda w, d: w.selection_args(d / "out", "--lr-horizon", "1"), "--lr-horizon 1 is below --max-steps 2")
row("06", "c-0-eta-0", lambda w, d: w.selection_args(d / "out", "--c", "0", "--eta", "0"), "argument --c")
row("emlnet", "source-missing", lambda w, d: ["convert", d / "nope.pth", "--out", d / "w.safetensors"], "not found")
row("emlnet", "source-folder", lambda w, d: ["convert", d, "--out", d / "w.safetensors"], "a folder")
row("emlnet", "source-garbage", lambda w, d: ["convert", write(d, "w.pth", BINARY), "--out", d / "w.safetensors"], "cannot read")
row("emlnet", "source-pickle-payload", lambda w, d: ["convert", write(d, "w.pth", pickle.dumps(Payload(d / "pwned"))),
                                                      "--out", d / "w.safetensors"], "--trust-pickle")
row("emlnet", "out-is-source", lambda w, d: ["convert", (p := write(d, "w.pth", BINARY)), "--out", p], "is also the input")
row("emlnet", "out-is-a-folder", lambda w, d: ["convert", write(d, "w.pth", BINARY), "--out", d], "is a folder")
row("00", "all-splits-empty", lambda w, d: ["--out", d / "demo", "--n-train", "0", "--n-val", "0", "--n-test", "0"], "must not all be 0")


# -- repeated ids: one clear line, or a counted skip naming them -----------------------------------------
def twice(records):
    return records + records


def seven_and_seven(records):
    """The first two records' ids made 7 and "7" (one id as an integer and as a string)."""
    records[0]["id"], records[1]["id"] = 7, "7"
    return records


for name, change, fragment in [("every-line-twice", twice, "appears twice"),
                               ("ids-7-and-string-7", seven_and_seven, 'id "7" appears twice (also at line 1 (written 7))')]:
    row("04", f"selfgen-{name}", lambda w, d, c=change: w.train_args(d / "out", "--data", "extended", "--selfgen",
                                                                     jsonl_lines(w.selfgen, d, c)), fragment)
    row("05", f"selfgen-{name}", lambda w, d, c=change: w.score_args(d / "out.h5", "--selfgen", jsonl_lines(w.selfgen, d, c)), fragment)
    row("05", f"selfgen-{name}-with-captions", lambda w, d, c=change: w.score_args(d / "out.h5", "--captions", w.captions,
                                                                                  "--selfgen", jsonl_lines(w.selfgen, d, c)), fragment)
    row("06", f"selfgen-{name}", lambda w, d, c=change: w.selection_args(d / "out", "--selfgen", jsonl_lines(w.selfgen, d, c)), fragment)
    row("07", f"selfgen-{name}", lambda w, d, c=change: w.eval_args(d / "out", "--selfgen", jsonl_lines(w.selfgen, d, c)), fragment)
    row("03", f"{name}", lambda w, d, c=change: para_args(w, d, jsonl_lines(w.selfgen, d, c)), fragment)
    row("stats", f"jsonl-{name}", lambda w, d, c=change: [jsonl_lines(w.selfgen, d, c)], fragment)


def repeated_quality_ids(f):
    ids = f["id"].asstr()[()].tolist()
    ids[1] = ids[0]
    del f["id"]
    f.create_dataset("id", data=ids)


row("06", "quality-repeated-ids", lambda w, d: w.selection_args(d / "out", "--quality", h5_changed(w.quality, d, repeated_quality_ids)),
    "have more than one score")
row("06", "quality-u-strings", lambda w, d: w.selection_args(d / "out", "--quality", h5_changed(
    w.quality, d, lambda f: f.__delitem__("u") or f.create_dataset("u", data=np.array([b"x"] * len(f["id"]))))), "not numbers")
row("06", "quality-u-2d", lambda w, d: w.selection_args(d / "out", "--quality", h5_changed(
    w.quality, d, lambda f: f.__delitem__("u") or f.create_dataset("u", data=np.zeros((len(f["id"]), 2), np.float32)))),
    "not one value per row")
row("07", "generated-ids-7-and-string-7", lambda w, d: w.eval_args(d / "out", "--generated", write(
    d, "g.jsonl", '{"image_id": 11, "level": 1, "caption": "a dog"}\n{"image_id": "11", "level": 1, "caption": "a cat"}\n')),
    "a second caption for image 11")
row("stats", "karpathy-cocoid-7-and-string-7", lambda w, d: [karpathy(w, d, set_in(1, cocoid="1"))], "duplicate image id 1")
row("stats", "coco-image-7-and-string-7", lambda w, d: [write(d, "c.json", {"images": [IMG1, {"id": "1", "file_name": "b.jpg"}],
                                                                             "annotations": []})], "duplicate image id 1")
row("stats", "paragraph-repeated-named", lambda w, d: write(d, "p.json", [PARA1, PARA1, {"image_id": 2, "paragraph": "A cat."},
                                                                         {"image_id": "2", "paragraph": "A cat."}]) and
    [d / "p.json"], "2 repeated image id(s) (1, 2", "skip")
row("02", "image-data-duplicate-id", lambda w, d: sg_args(w, d, data=image_data(d, lambda x: x.append(dict(x[0])))), "duplicate image id")
row("02", "image-data-id-7-and-string-7", lambda w, d: sg_args(w, d, data=image_data(d, lambda x: x.append(dict(x[0], image_id=str(x[0]["image_id"]))))),
    "duplicate image id")
row("02", "image-data-id-null", lambda w, d: sg_args(w, d, data=image_data(d, lambda x: x[0].update(image_id=None))), "'image_id' must be")
row("02", "image-data-id-list", lambda w, d: sg_args(w, d, data=image_data(d, lambda x: x[0].update(image_id=[1]))), "'image_id' must be")
row("02", "image-data-width-zero", lambda w, d: sg_args(w, d, data=image_data(d, lambda x: x[0].update(width=0))), "positive numbers")
row("02", "image-data-height-negative", lambda w, d: sg_args(w, d, data=image_data(d, lambda x: x[0].update(height=-5))), "positive numbers")
row("02", "image-data-coco-id-list", lambda w, d: sg_args(w, d, data=image_data(d, lambda x: x[0].update(coco_id=[1, 2]))), "'coco_id' must be")
row("01", "image-data-id-object", lambda w, d: ["--images", w.images, "--list", write(d, "l.json", [{"image_id": {"a": 1}, "width": 5}]),
                                                "--out", d / "out.h5"], "'image_id' must be")
row("01", "list-repeated-names-counted", lambda w, d: ["--images", w.images, "--list", write(d, "l.txt", "1.png\n1.png\n107899.png\n"),
                                                       "--out", d / "out.h5"], "1 repeated entries of the image list are processed once (image 1)", "skip")


# -- features, checkpoints and scores that are wrong but readable -----------------------------------------
def many_regions(n):
    def change(group):
        for name, width in (("features", 16), ("boxes", 4)):
            del group[name]
            group.create_dataset(name, data=np.full((n, width), 1.0, np.float32))
    return change


def features_a_group(group):
    del group["features"]
    group.create_group("features")


def in_test_image(change):
    """A change of image 11, a test image of the toy world (07 reads only test images)."""
    def apply(f):
        change(f["11"])
    return apply


def group_as_dataset_at(key):
    def change(f):
        del f[key]
        f.create_dataset(key, data=np.zeros((3, 16), np.float32))
    return change


FEATURE_CASES_2 = [  # (name, make(w, d, pick), fragment): pick is first_group (a train image) or in_test_image
    ("zero-regions", lambda w, d, pick: h5_changed(w.features, d, pick(many_regions(0))), "at least one region"),
    ("x2-below-x1", lambda w, d, pick: h5_changed(w.features, d, pick(poke("boxes", (0, 2), 0.5))), "ends before it starts"),
    ("y2-below-y1", lambda w, d, pick: h5_changed(w.features, d, pick(poke("boxes", (0, 3), 0.5))), "ends before it starts"),
    ("negative-x1", lambda w, d, pick: h5_changed(w.features, d, pick(poke("boxes", (0, 0), -20.0))), "is not inside"),
    ("negative-y1-small", lambda w, d, pick: h5_changed(w.features, d, pick(poke("boxes", (0, 1), -3.0))), "is not inside"),
    ("width-array", lambda w, d, pick: h5_changed(w.features, d, pick(set_attr("width", np.array([160.0, 160.0])))), "is not a number"),
    ("width-array-of-one", lambda w, d, pick: h5_changed(w.features, d, pick(set_attr("width", np.array([160.0])))), "is not a number"),
    ("height-bytes", lambda w, d, pick: h5_changed(w.features, d, pick(set_attr("height", b"160"))), "is not a number"),
    ("group-is-a-dataset", lambda w, d, pick: h5_changed(w.features, d, group_as_dataset_at("1" if pick is first_group else "11")),
     "is a dataset, not a group"),
    ("features-is-a-group", lambda w, d, pick: h5_changed(w.features, d, pick(features_a_group)), "'features' is a group"),
    ("quality-file", lambda w, d, pick: w.quality, "flat arrays"),
    ("saliency-file", lambda w, d, pick: w.saliency, "a saliency file?"),
    ("10000-regions", lambda w, d, pick: h5_changed(w.features, d, pick(many_regions(10_000))), "at most 1000 per image"),
]
for name, make, fragment in FEATURE_CASES_2:
    row("04", f"features-{name}", lambda w, d, make=make: w.train_args(d / "out", "--features", make(w, d, first_group)), fragment)
    row("05", f"features-{name}", lambda w, d, make=make: w.score_args(d / "out.h5", "--features", make(w, d, first_group)), fragment)
    row("07", f"features-{name}", lambda w, d, make=make: ["--refs", w.captions, "--features", make(w, d, in_test_image), "--checkpoint",
                                                            w.trusted, "--out", d / "out", "--spice", "off"], fragment)
row("06", "features-quality-file", lambda w, d: w.selection_args(d / "out", "--features", w.quality), "flat arrays")
row("04", "features-10000-regions-skipped-over-the-share", lambda w, d: w.train_args(d / "out", "--bad-features", "skip", "--features",
                                                                                     h5_changed(w.features, d, first_group(many_regions(10_000)))),
    "1 image(s) have bad region features (--bad-features skip), e.g. image 1: 10000 regions")
row("04", "features-10000-regions-skipped", lambda w, d: w.train_args(d / "out", "--bad-features", "skip", *SHARE, "--features",
                                                                      h5_changed(w.features, d, first_group(many_regions(10_000)))),
    "at most 1000 per image", "skip")
row("06", "quality-is-a-feature-file", lambda w, d: w.selection_args(d / "out", "--quality", w.features), "holds groups")
row("06", "quality-is-a-saliency-file", lambda w, d: w.selection_args(d / "out", "--quality", w.saliency), "holds groups")
row("02", "saliency-is-a-feature-file", lambda w, d: sg_args(w, d, saliency=w.features), "a region-feature file?")
row("02", "saliency-is-a-quality-file", lambda w, d: sg_args(w, d, saliency=w.quality), "flat arrays")
row("02", "saliency-group-is-a-dataset", lambda w, d: sg_args(w, d, saliency=h5_changed(w.saliency, d, group_as_dataset_at("1"))),
    "is a dataset, not a group")
row("02", "saliency-width-array", lambda w, d: sg_args(w, d, saliency=h5_changed(w.saliency, d, first_group(set_attr("width", np.array([1.0, 2.0]))))),
    "'width' must be a number")
row("02", "saliency-negative", lambda w, d: sg_args(w, d, saliency=h5_changed(
    w.saliency, d, first_group(replace_dataset("map", np.full((6, 8), -0.5, np.float16))))), "negative saliency", "skip")
row("02", "saliency-partly-negative", lambda w, d: sg_args(w, d, saliency=h5_changed(
    w.saliency, d, first_group(poke("map", (0, 0), -1.0)))), "negative saliency", "skip")


def edit_config(**fields):
    """A change of a checkpoint's config.json: model fields set as the weights were not trained."""
    def change(folder):
        config = json.loads((folder / "config.json").read_text())
        config["model"].update(fields)
        (folder / "config.json").write_text(json.dumps(config))
    return change


CONFIG_EDITS = [("num-heads", {"num_heads": 2}), ("layer-norm-eps", {"layer_norm_eps": 1e-5}),
                ("region-norm", {"region_norm": "standardize"})]
for name, fields in CONFIG_EDITS:
    fragment = "does not describe the weights"
    row("05", f"checkpoint-config-{name}-edited", lambda w, d, f=fields: w.score_args(
        d / "out.h5", "--extended", checkpoint_copy(w.extended, d, edit_config(**f), "ck")), fragment)
    row("07", f"checkpoint-config-{name}-edited", lambda w, d, f=fields: [
        "--refs", w.captions, "--features", w.features, "--checkpoint", checkpoint_copy(w.trusted, d, edit_config(**f), "ck"),
        "--out", d / "out", "--spice", "off"], fragment)
row("04", "init-from-config-edited", lambda w, d: w.train_args(d / "out", "--init-from", checkpoint_copy(
    w.trusted, d, edit_config(num_heads=2), "init")), "does not describe the weights")
row("04", "resume-config-edited", lambda w, d: w.train_args(checkpoint_copy(w.trusted, d, unfinished(edit_config(layer_norm_eps=1e-6)))),
    "does not describe the weights")
row("06", "resume-config-edited", lambda w, d: w.selection_args(checkpoint_copy(w.selection, d, unfinished(edit_config(num_heads=2)))),
    "does not describe the weights")
row("05", "same-checkpoint-twice", lambda w, d: w.score_args(d / "out.h5", "--extended", w.trusted), "hold the same weights")
row("05", "copy-of-the-same-checkpoint", lambda w, d: w.score_args(d / "out.h5", "--extended", checkpoint_copy(w.trusted, d, name="copy")),
    "hold the same weights")


# -- a fraction of the data left out: more than --max-left-out (5%) stops with how many, why, a likely cause --
def features_of(w: World, d: Path, keep: set, rename=None) -> Path:
    """The toy world's features holding only the images ``keep`` (``rename``: id -> the id it is stored under)."""
    def change(f):
        for key in list(f.keys()):
            if key not in keep:
                del f[key]
            elif rename:
                f.move(key, rename(key))
    return h5_changed(w.features, d, change, "f.h5")


def paragraphs(w: World, d: Path, sentences: int = 6) -> Path:
    """The toy world's images as Stanford paragraphs (its split files beside it), each ``sentences`` long."""
    data = json.loads(w.captions.read_text())
    text = " ".join(["A red dog sits on the green grass next to a small tree in the big park."] * sentences)
    folder = d / "paragraphs"
    for split in ("train", "val", "test"):
        write(folder, f"{split}_split.json", [im["cocoid"] for im in data["images"] if im["split"] == split])
    return write(folder, "paragraphs_v1.json", [{"image_id": im["cocoid"], "paragraph": text} for im in data["images"]])


MOSTLY_MISSING = {"1", "11", "12", "13"}  # one train image and the test images
OTHER_SCHEME = lambda key: f"COCO_train2014_{int(key):012d}"  # noqa: E731
row("04", "features-of-most-images-missing", lambda w, d: w.train_args(d / "out", "--features", features_of(w, d, MOSTLY_MISSING)),
    "21 of 24 trusted captions (88%) would be left out (21 no region features for the image)")
row("04", "features-another-id-scheme", lambda w, d: w.train_args(d / "out", "--features", features_of(
    w, d, {str(i) for i in range(1, 14)}, OTHER_SCHEME)), "its images are named 1, 2, 3, the feature file's coco_train2014_000000000001")
row("04", "features-another-id-scheme-selfgen", lambda w, d: w.train_args(d / "out", "--data", "extended", "--selfgen", w.selfgen,
                                                                          "--max-left-out", "1", "--features", features_of(w, d, {"1", "2", "3"})),
    "", "ok")
row("04", "selfgen-of-most-images-missing", lambda w, d: w.train_args(
    d / "out", "--data", "extended", "--max-left-out", "0.2", "--features", features_of(w, d, set(map(str, range(1, 14))) - {"8"}),
    "--selfgen", jsonl_lines(w.selfgen, d, lambda r: [dict(x, image_id=8) for x in r])), "16 of 16 selfgen captions (100%)")
row("04", "features-image-missing-over-the-share", lambda w, d: w.train_args(d / "out", "--features", h5_changed(
    w.features, d, lambda f: f.__delitem__("1"))), "3 of 24 trusted captions (12%) would be left out")
row("04", "max-left-out-1-goes-on", lambda w, d: w.train_args(d / "out", "--max-left-out", "1", "--features", features_of(w, d, MOSTLY_MISSING)),
    "skipped 21: trusted: no region features for the image", "skip")
row("04", "paragraphs-without-levels-paragraph", lambda w, d: w.train_args(d / "out", "--captions", paragraphs(w, d)),
    "give --levels paragraph")
row("06", "paragraphs-without-levels-paragraph", lambda w, d: w.selection_args(d / "out", "--captions", paragraphs(w, d)),
    "give --levels paragraph")
row("06", "features-of-most-images-missing", lambda w, d: w.selection_args(d / "out", "--features", features_of(w, d, MOSTLY_MISSING)),
    "would be left out (21 no region features")
row("06", "features-another-id-scheme", lambda w, d: w.selection_args(d / "out", "--features", features_of(
    w, d, {str(i) for i in range(1, 14)}, OTHER_SCHEME)), "one id scheme")
row("05", "features-of-most-images-missing", lambda w, d: w.score_args(d / "out.h5", "--features", features_of(w, d, MOSTLY_MISSING)),
    "14 of 16 selfgen captions (88%) would be left out")
row("05", "features-another-id-scheme", lambda w, d: w.score_args(d / "out.h5", "--features", features_of(
    w, d, {str(i) for i in range(1, 14)}, OTHER_SCHEME)), "one id scheme")
row("05", "include-trusted-features-missing", lambda w, d: w.score_args(
    d / "out.h5", "--captions", w.captions, "--include-trusted", "--max-left-out", "0.2", "--features",
    features_of(w, d, set(map(str, range(1, 14))) - {"2", "3"})), "4 of 16 selfgen captions (25%)")
row("04", "trusted-mostly-another-script", lambda w, d: w.train_args(d / "out", "--captions", karpathy(
    w, d, lambda x: [s.update(raw="一只狗", tokens=["一只狗"]) for im in x["images"][:4] for s in im["sentences"]])),
    "no word left|another script")
row("stats", "paragraphs-above-the-last-level", lambda w, d: [paragraphs(w, d)], "give --levels paragraph", "skip")
row("stats", "paragraphs-with-levels-paragraph", lambda w, d: [paragraphs(w, d), "--levels", "paragraph"], "paragraph bands", "ok")
row("04", "number--max-left-out=1.5", lambda w, d: w.train_args(d / "out", "--max-left-out=1.5"), "argument --max-left-out")
row("05", "number--max-left-out=-0.1", lambda w, d: w.score_args(d / "out.h5", "--max-left-out=-0.1"), "argument --max-left-out")
row("06", "number--max-left-out=nan", lambda w, d: w.selection_args(d / "out", "--max-left-out=nan"), "argument --max-left-out")


# -- crashes after the work is done, and in the middle of it ---------------------------------------------
for stage, valid, good in [("01", lambda w, d, out: ["--images", w.images, "--out", out], ".h5"),
                           ("02", lambda w, d, out: sg_args(w, d)[:-1] + [out], ".jsonl"),
                           ("03", lambda w, d, out: ["--in", w.selfgen, "--out", out, "--model", "rules"], ".jsonl"),
                           ("05", lambda w, d, out: w.score_args(out), ".h5")]:
    for name in ("selfgen.json", "quality", "saliency.hdf", "out.txt", "out.jsonl" if good == ".h5" else "out.h5"):
        row(stage, f"out-suffix-{name}", lambda w, d, valid=valid, name=name: valid(w, d, d / name), "must end in")
    row(stage, "out-is-a-folder", lambda w, d, valid=valid, good=good: valid(w, d, (d / f"x{good}").mkdir() or d / f"x{good}"),
        "is a folder")
for name in ("quality", "selfgen.json", "x.hdf"):
    row("shard", f"merge-out-suffix-{name}", lambda w, d, name=name: ["merge", d / name, "--num-shards", "2"], "must end in")


def parts(w: World, d: Path, records_of: list) -> Path:
    """Two part files of ``out.jsonl`` (2 shards) holding ``records_of[k]``; returns the output path."""
    out = d / "out.jsonl"
    from clid.base.files import write_jsonl
    for k, records in enumerate(records_of):
        write_jsonl(out.with_name(f"out.jsonl.part-{k:05d}-of-{len(records_of):05d}"), records)
    return out


def h5_parts(w: World, d: Path, source: Path, name="out.h5") -> Path:
    """Two part files of OUT (2 shards), both copies of ``source``: every record in both."""
    out = d / name
    for k in range(2):
        shutil.copy(source, out.with_name(f"{name}.part-{k:05d}-of-00002"))
    return out


SELFGEN_RECORDS = lambda w: [json.loads(line) for line in w.selfgen.read_text().splitlines()]  # noqa: E731
row("shard", "merge-duplicate-across-jsonl-parts", lambda w, d: ["merge", parts(w, d, [SELFGEN_RECORDS(w)[:3], SELFGEN_RECORDS(w)[2:5]]),
                                                                  "--num-shards", "2"], "appears in two parts", leaves_output=True)
row("shard", "merge-two-copies-of-a-shard", lambda w, d: ["merge", parts(w, d, [SELFGEN_RECORDS(w), SELFGEN_RECORDS(w)]),
                                                           "--num-shards", "2"], "appears in two parts", leaves_output=True)
row("shard", "merge-duplicate-quality-rows", lambda w, d: ["merge", h5_parts(w, d, w.quality), "--num-shards", "2"],
    "appears in two parts", leaves_output=True)
row("shard", "merge-duplicate-image-groups", lambda w, d: ["merge", h5_parts(w, d, w.saliency), "--num-shards", "2"],
    "appears in two parts", leaves_output=True)
row("shard", "merge-a-part-missing", lambda w, d: ["merge", parts(w, d, [SELFGEN_RECORDS(w)[:2]]).with_name("x.jsonl"),
                                                    "--num-shards", "3"], "parts missing", leaves_output=True)
row("shard", "merge-part-not-jsonl", lambda w, d: ["merge", (parts(w, d, [SELFGEN_RECORDS(w)[:2], []]), write(
    d, "out.jsonl.part-00001-of-00002", "{oops\n"))[0], "--num-shards", "2"], "not valid json", leaves_output=True)
row("shard", "merge-part-not-hdf5", lambda w, d: ["merge", (h5_parts(w, d, w.quality), write(
    d, "out.h5.part-00001-of-00002", "oops"))[0], "--num-shards", "2"], "not an hdf5 file", leaves_output=True)
row("shard", "merge-parts-mix-groups-and-arrays", lambda w, d: ["merge", (shutil.copy(w.quality, d / "out.h5.part-00000-of-00002"),
                                                                          shutil.copy(w.saliency, d / "out.h5.part-00001-of-00002"))
                                                                 and d / "out.h5", "--num-shards", "2"], "mix image groups",
    leaves_output=True)
row("shard", "merge-nothing-to-do", lambda w, d: ["merge", w.selfgen, "--num-shards", "2"], "already exists", "ok")


def chain_graph(d: Path, n: int) -> Path:
    """One VG graph whose ``n`` objects form a chain (each related to the next), in a 10,000 x 10,000 image."""
    objects = [{"object_id": k, "x": k % 9000, "y": k % 9000, "w": 10, "h": 10, "names": ["dog" if k % 2 else "ball"]}
               for k in range(n)]
    relations = [{"predicate": "next to", "subject_id": k, "object_id": k + 1} for k in range(n - 1)]
    return write(d, "chain.json", [{"image_id": 1, "width": 10000, "height": 10000, "objects": objects,
                                    "relationships": relations}])


row("02", "chain-of-1500-objects", lambda w, d: ["--scene-graphs", chain_graph(d, 1500), "--saliency", "none", "--out",
                                                 d / "out.jsonl", "--k", "1", "--per-image", "2"], "1 captioned", "ok")
SGG = ["--labelmap", FIXTURES / "sgg_labelmap.json", "--sizes", FIXTURES / "sgg_hw.tsv", "--saliency", "none"]


def sgg_changed(d: Path, change: Callable[[bytes], bytes], name="predictions.tsv") -> Path:
    return write(d, name, change((FIXTURES / "sgg_predictions.tsv").read_bytes()))


row("02", "sgg-bom", lambda w, d: ["--scene-graphs", sgg_changed(d, lambda b: b"\xef\xbb\xbf" + b), *SGG, "--out", d / "out.jsonl"],
    "captioned", "ok")
row("02", "sgg-non-utf8-line", lambda w, d: ["--scene-graphs", sgg_changed(d, lambda b: b.replace(b'"man"', b'"m\xe9n"', 1)), *SGG,
                                             "--out", d / "out.jsonl"], "not utf-8 text", "skip")
row("02", "sgg-crlf-lines", lambda w, d: ["--scene-graphs", sgg_changed(d, lambda b: b.replace(b"\n", b"\r\n")), *SGG,
                                          "--out", d / "out.jsonl"], "captioned", "ok")
row("02", "sgg-all-lines-non-utf8", lambda w, d: ["--scene-graphs", write(d, "p.tsv", b"1\t{\xff}\n2\t{\xfe}\n"), *SGG,
                                                  "--out", d / "out.jsonl"], "no graph could be read")
row("02", "hw-non-utf8", lambda w, d: ["--scene-graphs", FIXTURES / "sgg_predictions.tsv", *SGG[:2], "--sizes",
                                       write(d, "hw.tsv", (FIXTURES / "sgg_hw.tsv").read_bytes() + b"\xff\xfe\t[]\n"),
                                       *SGG[4:], "--out", d / "out.jsonl"], "not utf-8 text")
row("02", "hw-bom", lambda w, d: ["--scene-graphs", FIXTURES / "sgg_predictions.tsv", *SGG[:2], "--sizes",
                                  write(d, "hw.tsv", b"\xef\xbb\xbf" + (FIXTURES / "sgg_hw.tsv").read_bytes()),
                                  *SGG[4:], "--out", d / "out.jsonl"], "the sizes file", "ok")
row("02", "hw-size-zero", lambda w, d: ["--scene-graphs", FIXTURES / "sgg_predictions.tsv", *SGG[:2], "--sizes",
                                        write(d, "hw.tsv", '000000391895\t[{"height": 0, "width": 640}]\n'),
                                        *SGG[4:], "--out", d / "out.jsonl"], "must be positive")
row("02", "hw-listed-twice", lambda w, d: ["--scene-graphs", FIXTURES / "sgg_predictions.tsv", *SGG[:2], "--sizes",
                                           write(d, "hw.tsv", (FIXTURES / "sgg_hw.tsv").read_text() * 2), *SGG[4:],
                                           "--out", d / "out.jsonl"], "is listed twice")
row("02", "labelmap-binary", lambda w, d: ["--scene-graphs", FIXTURES / "sgg_predictions.tsv", "--labelmap", write(d, "l.json", BINARY),
                                           *SGG[2:], "--out", d / "out.jsonl"], "utf-8")
row("02", "labelmap-bom", lambda w, d: ["--scene-graphs", FIXTURES / "sgg_predictions.tsv", "--labelmap",
                                        write(d, "l.json", b"\xef\xbb\xbf" + (FIXTURES / "sgg_labelmap.json").read_bytes()),
                                        *SGG[2:], "--out", d / "out.jsonl"], "captioned", "ok")
row("01", "list-text-bom", lambda w, d: ["--images", w.images, "--list", write(d, "l.txt", "\ufeff1.png\n107899.png\n"),
                                         "--out", d / "out.h5"], "2 images have a map", "ok")
row("04", "test-ids-bom-holds-out-the-first-id", lambda w, d: w.train_args(d / "out", "--test-ids", write(d, "ids.txt", "\ufeff1\n2\n")),
    "held out of training and validation: 2 images", "ok")


# -- python -m clid.features, clid.data, clid.data.stats: more of their inputs --------------------------------
VG_SAMPLE = FIXTURES / "vg_scene_graphs_sample.json"
row("features", "images-missing-graphs", lambda w, d: ["--images", d / "nope", "--scene-graphs", VG_SAMPLE, "--out", d / "f.h5"],
    "no such image folder")
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
row("data", "convert-coco-captions-missing", lambda w, d: ["convert-coco", "--captions", d / "nope.json", "--out", d / "k.json"],
    "no such file|not found")
row("data", "convert-coco-not-coco", lambda w, d: ["convert-coco", "--captions", w.captions, "--out", d / "k.json"], "'annotations'")
row("data", "convert-coco-caption-int", lambda w, d: ["convert-coco", "--captions", coco_captions(w, d, 7), "--out", d / "k.json"],
    "'caption' must be a string")
row("data", "convert-coco-karpathy-missing", lambda w, d: ["convert-coco", "--captions", coco_captions(w, d, "a dog"), "--karpathy",
                                                           d / "nope.json", "--out", d / "k.json"], "no such file|not found")
row("data", "convert-coco-out-is-karpathy", lambda w, d: ["convert-coco", "--captions", coco_captions(w, d, "a dog"), "--karpathy",
                                                          (p := write(d, "k.json", w.captions.read_text())), "--out", p],
    "is also the input --karpathy")
row("data", "convert-coco-same-file-twice", lambda w, d: ["convert-coco", "--captions", (p := coco_captions(w, d, "a dog")), p,
                                                          "--out", d / "k.json"], "is also in")
row("stats", "split-on-a-coco-file", lambda w, d: [coco_captions(w, d, "a dog"), "--split", "test"], "has no splits")
row("stats", "split-without-captions", lambda w, d: [w.captions, "--split", "restval"], "no caption of split")
row("stats", "jsonl-bom", lambda w, d: [write(d, "s.jsonl", b"\xef\xbb\xbf" + w.selfgen.read_bytes())], "captions: 16", "ok")
row("stats", "karpathy-bom", lambda w, d: [write(d, "c.json", b"\xef\xbb\xbf" + w.captions.read_bytes())], "captions:", "ok")

for name, change, fragment in [("config-garbage", corrupt("config.json", b"{"), "not valid json"),
                               ("config-a-list", corrupt("config.json", b"[]"), "no model config"),
                               ("config-bom", lambda f: (f / "config.json").write_bytes(b"\xef\xbb\xbf" + (f / "config.json").read_bytes()),
                                "its learning rate reached 0 at step 2"),  # (read through its BOM: the schedule's end)
                               ("train-state-garbage", corrupt("train_state.json", b"{"), "train_state.json")]:
    row("04", f"continue-from-{name}", lambda w, d, change=change: w.train_args(d / "out", "--continue-from", checkpoint_copy(
        w.trusted, d, change, "ck"), "--max-steps", "3"), fragment)


# -- a researcher's first hour (issue 40): --recipe, --allow-download, --ids, 07 without --refs, the misleads ------
row("04", "recipe-unknown", lambda w, d: w.train_args(d / "out", "--recipe", "fast"), "invalid choice: 'fast'")
row("06", "recipe-unknown", lambda w, d: w.selection_args(d / "out", "--recipe", "paperish"), "invalid choice: 'paperish'")
row("04", "recipe-file-missing", lambda w, d: w.train_args(d / "out", "--recipe", d / "mine.toml"), "no recipe ")
row("04", "recipe-file-not-toml", lambda w, d: w.train_args(d / "out", "--recipe", write(d, "mine.toml", "lr = [")),
    "mine.toml is not TOML")
row("06", "recipe-sets-no-flag", lambda w, d: w.selection_args(d / "out", "--recipe", write(d, "mine.toml", "[train]\nrate = 1")),
    "mine.toml sets rate, not a flag of this stage")
row("05", "allow-download-not-taken", lambda w, d: w.score_args(d / "out.h5", "--allow-download"),
    "unrecognized arguments: --allow-download")
row("stats", "tokenizer-not-on-disk-offline", lambda w, d: [w.captions, "--tokenizer", "no-such-org/no-such-tokenizer"],
    "cannot load the tokenizer 'no-such-org/no-such-tokenizer'")
row("features", "ids-unknown", lambda w, d: ["--images", w.images, "--boxes", "grid", "2", "--out", d / "f.h5", "--ids", "coco"],
    "invalid choice: 'coco'")
row("07", "no-refs-long-refs", lambda w, d: ["--generated", w.generated, "--out", d / "out", "--long-refs", w.captions],
    "--long-refs needs --refs")
row("07", "no-refs-test-ids", lambda w, d: ["--generated", w.generated, "--out", d / "out", "--test-ids", "karpathy"],
    "--test-ids needs --refs")
row("07", "no-refs-nothing-to-evaluate", lambda w, d: ["--out", d / "out"], "nothing to evaluate")
row("07", "no-refs-generated-missing", lambda w, d: ["--generated", d / "nope.jsonl", "--out", d / "out"], "no such file")
row("07", "no-refs-generated-empty", lambda w, d: ["--generated", write(d, "g.jsonl", ""), "--out", d / "out"], "holds no captions")
row("07", "no-refs-generated-bad-line", lambda w, d: ["--generated", write(d, "g.jsonl", '{"image_id": 1, "level": 1}\n'),
                                                     "--out", d / "out"], "caption")
row("07", "no-refs-generated-level-zero", lambda w, d: ["--generated", jsonl_lines(w.generated, d, first(level=0)),
                                                       "--out", d / "out"], "level 0 is outside")
row("07", "no-refs-checkpoint-without-features", lambda w, d: ["--checkpoint", w.trusted, "--out", d / "out"],
    "--checkpoint needs --features")
row("caption", "features-a-folder", lambda w, d: w.caption_args(d, "--features", w.images),
    "is a folder, not a region-feature file")
row("caption", "checkpoint-folder-missing", lambda w, d: w.caption_args(d, "--checkpoint", d / "runs" / "clid"),
    "no such checkpoint folder")

# -- issue 42: --precision and --batch-size auto on the stages that run a model ---------------------------
PRECISION_STAGES = {  # stage -> the flags of a valid run
    "03": lambda w, d: para_args(w, d, w.selfgen),
    "04": lambda w, d: w.train_args(d / "out"),
    "05": lambda w, d: w.score_args(d / "out.h5"),
    "06": lambda w, d: w.selection_args(d / "out"),
    "07": lambda w, d: ["--refs", w.captions, "--features", w.features, "--checkpoint", w.trusted, "--out", d / "out",
                        "--spice", "off", "--decode-steps", "1"],
    "caption": lambda w, d: w.caption_args(d),
}
for stage, valid in PRECISION_STAGES.items():
    for value in ("fp16", "BF16", ""):
        row(stage, f"precision={value}", lambda w, d, valid=valid, value=value: [*valid(w, d), f"--precision={value}"],
            "argument --precision")
for stage in ("03", "05", "07", "caption"):
    for value in ("0", "-2", "x", "auto2", "1.5"):
        row(stage, f"batch-size-auto-flag={value}", lambda w, d, stage=stage, value=value:
            [*PRECISION_STAGES[stage](w, d), f"--batch-size={value}"], "argument --batch-size")
row("05", "precision-bf16-batch-auto", lambda w, d: w.score_args(d / "out.h5", "--precision", "bf16", "--batch-size", "auto"),
    "scored captions", "ok")
row("caption", "precision-bf16", lambda w, d: w.caption_args(d, "--precision", "bf16", "--levels", "1"), "captions of", "ok")
row("04", "amp-with-precision-fp32", lambda w, d: w.train_args(d / "out", "--amp", "--precision", "fp32"),
    "--amp is --precision bf16")
for stage in ("04", "06"):
    for value in ("-1", "x", "1.5", ""):
        row(stage, f"workers={value}", lambda w, d, stage=stage, value=value:
            [*PRECISION_STAGES[stage](w, d), f"--workers={value}"], "argument --workers")
row("04", "workers-2", lambda w, d: w.train_args(d / "out", "--workers", "2"), "checkpoint:", "ok")


# -- the token cache beside the self-generated captions, and the captions 05 scored (issues 39, 41) -------
def cached_selfgen(w: World, d: Path, damage: Callable[[Path], None], levels="caption") -> Path:
    """A copy of the self-generated captions with its token cache (--token-cache) built, then ``damage`` done
    to the cache file."""
    from clid.data.inputs import CaptionFiles
    from clid.data.token_cache import cache_path
    from clid.base.text import load_tokenizer

    path = write(d, "selfgen.jsonl", w.selfgen.read_text())
    CaptionFiles(levels, cache=True).selfgen_table(path, load_tokenizer())
    damage(cache_path(path, levels))
    return path


def cache_header(**fields):
    def damage(cache: Path) -> None:
        with np.load(cache) as f:
            arrays = dict(f)
        arrays["header"] = np.frombuffer(json.dumps({**json.loads(arrays["header"].tobytes()), **fields}).encode(), np.uint8)
        np.savez(cache, **arrays)
    return damage


def cache_array(name, change):
    def damage(cache: Path) -> None:
        with np.load(cache) as f:
            arrays = dict(f)
        arrays[name] = change(arrays[name])
        np.savez(cache, **arrays)
    return damage


def cache_stale(cache: Path) -> None:  # the captions changed after the cache was built
    source = cache.with_name("selfgen.jsonl")
    source.write_text(source.read_text().replace("red ball", "blue ball", 1))


def cache_a_folder(cache: Path) -> None:
    cache.unlink()
    cache.mkdir()


TOKEN_CACHE_CASES = [  # (stage, name, damage, fragment)
    ("04", "stale", cache_stale, "built from other content of the file; rebuilding it"),
    ("05", "another-tokenizer", cache_header(tokenizer="0" * 32), "built from another tokenizer; rebuilding it"),
    ("06", "truncated", lambda c: c.write_bytes(c.read_bytes()[:300]), "the token cache is unreadable"),
    ("04", "offsets-past-the-tokens", cache_array("offsets", lambda a: a + 1), "the token cache is corrupt"),
    ("05", "token-id-outside-the-vocabulary", cache_array("token_ids", lambda a: a + 40_000), "a token id outside the vocabulary"),
    ("06", "a-folder", cache_a_folder, "cannot keep the token cache"),
]
for stage, name, damage, fragment in TOKEN_CACHE_CASES:
    args = {"04": lambda w, d, p: w.train_args(d / "out", "--data", "extended", "--selfgen", p, "--token-cache"),
            "05": lambda w, d, p: w.score_args(d / "out.h5", "--selfgen", p, "--token-cache"),
            "06": lambda w, d, p: w.selection_args(d / "out", "--selfgen", p, "--token-cache")}[stage]
    row(stage, f"token-cache-{name}", lambda w, d, args=args, damage=damage: args(w, d, cached_selfgen(w, d, damage)),
        fragment, "skip")


def scored_quality(w: World, d: Path, trusted: bool = False) -> Path:
    """A quality file as 05 writes it now: u and the digest of each scored caption's text (with ``trusted``,
    the trusted captions' too, as ``trusted:ID``)."""
    from clid.data.captions import load_karpathy
    from clid.base.files import read_jsonl, write_quality
    from clid.data.examples import text_digest
    from clid.method.quality import eq1_quality

    records = list(read_jsonl(w.selfgen))
    ids, texts = [r["id"] for r in records], [r["caption"] for r in records]
    if trusted:  # (05 scores a trusted caption's preprocessed text)
        for r in load_karpathy(w.captions):
            if r.split in ("train", "restval"):
                ids += [f"trusted:{r.image_id}#{j}" for j in range(len(r.captions))]
                texts += r.captions
    u = np.linspace(-2, -1, len(ids))
    path = d / "scored.h5"
    logp = u, np.full(len(ids), -1.5)
    write_quality(path, ids, *logp, eq1_quality(*logp), text_digest=[text_digest(t) for t in texts])
    return path


def one_caption_changed(w: World, d: Path) -> Path:
    return jsonl_lines(w.selfgen, d, lambda records: [dict(records[0], caption="a cat on a red ball")] + records[1:])


row("06", "selfgen-differs-from-the-scored-captions", lambda w, d: w.selection_args(
    d / "out", "--quality", scored_quality(w, d), "--selfgen", one_caption_changed(w, d)),
    "caption 1-0: its text is not the one")
row("06", "selfgen-differs-from-the-scored-captions-curriculum-u", lambda w, d: w.selection_args(
    d / "out", "--quality", scored_quality(w, d, trusted=True), "--selfgen", one_caption_changed(w, d),
    "--strategy", "curriculum", "--difficulty", "u", "--eval-every", "0"), "caption 1-0: its text is not the one")
row("06", "quality-without-caption-digests", lambda w, d: w.selection_args(d / "out"), "records no digest of the captions", "skip")
row("06", "quality-text-digest-not-uint64", lambda w, d: w.selection_args(d / "out", "--quality", h5_changed(
    scored_quality(w, d), d, lambda f: (f.__delitem__("text_digest"), f.create_dataset("text_digest", data=np.zeros(16))))),
    "dataset 'text_digest'")


# -- fourth round (issue 41): outputs a command did not write, resume over changed inputs, the newer commands --
def copy_to(source: Path, d: Path, name: str) -> Path:
    """A copy of ``source`` at ``d/name``: an existing file the command did not write."""
    return Path(shutil.copy(source, d / name))


def after(stage: str, argv: list, then: list) -> list:
    """Run ``stage`` with ``argv`` first (it must succeed), then the row runs ``then``."""
    _must(run_stage(stage, argv))
    return then


GRID = lambda w, d, out, *extra: ["--images", w.images, "--boxes", "grid", "2", "--out", out, *extra]  # noqa: E731
row("features", "out-another-feature-file", lambda w, d: GRID(w, d, copy_to(w.features, d, "features.h5")), "did not write it")
row("features", "out-another-feature-file-force", lambda w, d: GRID(w, d, copy_to(w.features, d, "features.h5"), "--force"),
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
# outputs of other commands: the sharded stages and convert say --restart, the others --force
row("features", "convert-out-another-feature-file", lambda w, d: convert_args(d, "butd", tsv(d, butd_lines()))
    if copy_to(w.features, d, "f.h5") else None, "this stage did not write it")
row("features", "convert-out-another-feature-file-restart", lambda w, d: convert_args(
    d, "butd", tsv(d, butd_lines()), extra=["--restart"]) if copy_to(w.features, d, "f.h5") else None,
    "wrote the region features of 2 images", "ok")
row("features", "convert-out-read-only-place", lambda w, d: ["convert", "--format", "butd", tsv(d, butd_lines()), "--out",
                                                             "/proc/f.h5"], "/proc")
row("caption", "out-unrelated-captions", lambda w, d: w.caption_args(d) if copy_to(w.generated, d, "captions.jsonl") else None,
    "this stage did not write it")
row("caption", "out-unrelated-captions-restart", lambda w, d: w.caption_args(d, "--restart")
    if copy_to(w.generated, d, "captions.jsonl") else None, "captions of 13 images", "ok")
row("caption", "gallery-unrelated-page", lambda w, d: w.caption_args(d, "--gallery", write(d, "g.html", "<html>mine</html>")),
    "is not a gallery this command wrote")
row("caption", "gallery-its-own-page", lambda w, d: after("caption", w.caption_args(d, "--gallery", d / "g.html"), w.caption_args(
    d, "--gallery", d / "g.html")), "gallery:", "ok")
row("caption", "gallery-a-folder", lambda w, d: w.caption_args(d, "--gallery", d), "is a folder")
row("01", "out-unrelated-file", lambda w, d: ["--images", w.images, "--out", copy_to(w.saliency, d, "s.h5")], "did not write it")
row("01", "out-unrelated-file-restart", lambda w, d: ["--images", w.images, "--out", copy_to(w.saliency, d, "s.h5"), "--restart"],
    "2 images have a map", "ok")
row("02", "out-unrelated-file", lambda w, d: sg_args(w, d) if copy_to(w.selfgen, d, "out.jsonl") else None, "did not write it")
row("03", "out-unrelated-file", lambda w, d: ["--in", w.selfgen, "--out", copy_to(w.generated, d, "p.jsonl"), "--model", "rules"],
    "did not write it")
row("05", "out-unrelated-file", lambda w, d: w.score_args(copy_to(w.quality, d, "q.h5")), "did not write it")
row("data", "convert-coco-out-not-its-own", lambda w, d: ["convert-coco", "--captions", coco_captions(w, d, "a dog"), "--out",
                                                          copy_to(w.captions, d, "k.json")], "did not write it")
row("data", "convert-coco-out-not-its-own-force", lambda w, d: ["convert-coco", "--captions", coco_captions(w, d, "a dog"), "--out",
                                                                copy_to(w.captions, d, "k.json"), "--force"], "wrote", "ok")
row("data", "convert-coco-out-a-folder", lambda w, d: ["convert-coco", "--captions", coco_captions(w, d, "a dog"), "--out", d],
    "is a folder")
row("data", "convert-coco-out-its-own", lambda w, d: after("data", ["convert-coco", "--captions", coco_captions(w, d, "a dog"),
                                                                    "--out", d / "k.json"], ["convert-coco", "--captions",
                                                                    d / "coco.json", "--out", d / "k.json"]), "wrote", "ok")
SSA_ONE = {"1.json": {"0": GOOD_REGION}}
row("data", "convert-ssa-out-not-its-own", lambda w, d: ["convert-ssa", "--ssa", ssa_folder(d, SSA_ONE), "--out",
                                                         copy_to(w.selfgen, d, "o.jsonl")], "did not write it")
row("data", "convert-ssa-out-not-its-own-force", lambda w, d: ["convert-ssa", "--ssa", ssa_folder(d, SSA_ONE), "--out",
                                                               copy_to(w.selfgen, d, "o.jsonl"), "--force"], "wrote 1 captions", "ok")
row("data", "convert-ssa-out-a-folder", lambda w, d: ["convert-ssa", "--ssa", ssa_folder(d, SSA_ONE), "--out", d], "is a folder")

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


def images_changed_in_a_subfolder(w: World, d: Path) -> list:
    """01 over a folder whose images are in a subfolder, done; then one image is redrawn."""
    from PIL import Image

    shutil.copytree(w.images, d / "images" / "sub")
    argv = ["--images", d / "images", "--out", d / "s.h5"]
    _must(run_stage("01", argv))
    Image.new("RGB", (64, 48), "red").save(d / "images" / "sub" / "1.png")
    return argv


row("01", "rerun-after-an-image-in-a-subfolder-changed", images_changed_in_a_subfolder, "the file of --images changed")

# two training runs on one --out: the second stops at the first's lock
def held(out: Path) -> Path:
    """``out``, locked by another process (a sleeping child holding the sharded stages' lock) for this row."""
    import subprocess

    from clid.run.shard import ShardLock

    code = ("import fcntl, os, socket, sys; f = open(sys.argv[1], 'a+'); fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB); "
            "f.write(f'{socket.gethostname()} {os.getpid()}\\n'); f.flush(); print(True, flush=True); sys.stdin.read()")
    child = subprocess.Popen([sys.executable, "-c", code, str(ShardLock(out.resolve()).path)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "True"
    HOLDERS.append(child)  # (its stdin closes, and it ends, when the test process does)
    return out


HOLDERS: list = []
row("06", "out-held-by-another-run", lambda w, d: w.selection_args(held(d / "out")), "is training into this folder")
row("04", "out-held-by-another-run", lambda w, d: w.train_args(held(d / "out")), "is training into this folder")

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

# curating every caption away
row("06", "loss-remove-curates-every-caption-away", lambda w, d: w.selection_args(
    d / "out", "--strategy", "loss-remove", "--curate-ratio", "0.99", "--curate-every", "1"), "removes every one of the 40 captions")

# convert-ssa: files left out, repeated keys, one image in two files
row("data", "convert-ssa-upper-case-extension", lambda w, d: ["convert-ssa", "--ssa", ssa_folder(
    d, {"1.json": {"0": GOOD_REGION}, "2.JSON": {"0": GOOD_REGION}}), "--out", d / "o.jsonl"], "wrote 2 captions of 2 images", "ok")
row("data", "convert-ssa-other-files-in-the-folder", lambda w, d: ["convert-ssa", "--ssa", ssa_folder(
    d, {"1.json": {"0": GOOD_REGION}, "README.txt": "notes"}), "--out", d / "o.jsonl"], "left out 1 file(s) that are not .json", "ok")
row("data", "convert-ssa-repeated-region-key", lambda w, d: ["convert-ssa", "--ssa", ssa_folder(d, {"1.json": '{"0": ' + json.dumps(
    GOOD_REGION) + ', "0": ' + json.dumps(dict(GOOD_REGION, phrase="a cat")) + "}"}), "--out", d / "o.jsonl"],
    "left out 1: a repeated region key", "skip")
row("data", "convert-ssa-same-file-twice", lambda w, d: ["convert-ssa", "--ssa", (f := ssa_folder(d, SSA_ONE)) / "1.json", f,
                                                         "--out", d / "o.jsonl"], "given twice, read once", "ok")
row("data", "convert-ssa-a-subfolder", lambda w, d: ["convert-ssa", "--ssa", write(ssa_folder(d, SSA_ONE) / "more", "2.json", SSA_ONE[
    "1.json"]).parent.parent, "--out", d / "o.jsonl"], "left out 1 file(s) that are not .json: more/", "ok")
row("emlnet", "out-not-its-own", lambda w, d: ["convert", write(d, "w.pth", BINARY), "--out", write(d, "w.safetensors", "mine")],
    "did not write it")
row("data", "convert-ssa-one-image-in-two-folders", lambda w, d: ["convert-ssa", "--ssa", ssa_folder(d, SSA_ONE), (
    d / "more").mkdir() or write(d / "more", "1.json", SSA_ONE["1.json"]).parent, "--out", d / "o.jsonl"], "a second file of image 1")

# convert-coco: annotation ids
def coco_annotations(w: World, d: Path, change) -> Path:
    """The toy world as COCO captions, each annotation with its own id, then ``change`` of the annotations."""
    data = json.loads(coco_captions(w, d, "a dog").read_text())
    for k, annotation in enumerate(data["annotations"]):
        annotation["id"] = k
    change(data["annotations"])
    return write(d, "coco.json", data)


row("data", "convert-coco-annotation-repeated", lambda w, d: ["convert-coco", "--captions", coco_annotations(
    w, d, lambda a: a.append(dict(a[0]))), "--out", d / "k.json"], "1 annotation(s) repeat an earlier one", "ok")
row("data", "convert-coco-annotation-id-reused", lambda w, d: ["convert-coco", "--captions", coco_annotations(
    w, d, lambda a: a.append(dict(a[0], caption="a cat on a mat"))), "--out", d / "k.json"],
    "1 annotation(s) reuse the id of another caption (both kept)", "ok")
row("stats", "coco-annotation-repeated", lambda w, d: [coco_annotations(w, d, lambda a: a.append(dict(a[1])))],
    "1 annotation(s) repeat an earlier one", "ok")

# 02: predicates without a word
row("02", "predicate-empty", lambda w, d: sg_args(w, d, scene_graphs(d, lambda g: [r.update(predicate="") for x in g
                                                                             for r in x["relationships"]])),
    "relation without a word removed", "skip")
row("02", "predicate-emoji", lambda w, d: sg_args(w, d, scene_graphs(d, lambda g: [r.update(predicate="\U0001F600") for x in g
                                                                             for r in x["relationships"]])),
    "relation without a word removed", "skip")
row("02", "sgg-non-utf8-later-line", lambda w, d: ["--scene-graphs", sgg_changed(d, lambda b: b.replace(b"000000318219",
                                                                                                     b"0000003182\xe919")),
                                                   *SGG, "--out", d / "out.jsonl"], "not utf-8 text", "skip")

# symlink loops, 00's --out a file, a feature group that is a dataset
def loop(d: Path, name: str) -> Path:
    (d / name).symlink_to(d / name)
    return d / name


row("04", "captions-a-symlink-loop", lambda w, d: w.train_args(d / "out", "--captions", loop(d, "c.json")), "c.json")
row("04", "features-a-symlink-loop", lambda w, d: w.train_args(d / "out", "--features", loop(d, "f.h5")), "f.h5")
row("05", "selfgen-a-symlink-loop", lambda w, d: w.score_args(d / "q.h5", "--selfgen", loop(d, "s.jsonl")), "s.jsonl")
row("05", "features-a-symlink-loop", lambda w, d: w.score_args(d / "q.h5", "--features", loop(d, "f.h5")), "f.h5")
row("00", "out-a-file", lambda w, d: ["--out", write(d, "demo", "x"), "--small", "--skip-features"], "is a file")
row("04", "features-group-a-dataset", lambda w, d: w.train_args(d / "out", "--features", h5_changed(
    w.features, d, lambda f: (f.__delitem__("2"), f.create_dataset("2", data=np.zeros((3, 16), np.float32))))), "image 2")

# --device checked where it is parsed; an id list's lines are whole ids
for stage, valid in [("caption", lambda w, d: w.caption_args(d)[:-4]), ("01", lambda w, d: ["--images", w.images, "--out", d / "s.h5"]),
                     ("03", lambda w, d: ["--in", w.selfgen, "--out", d / "p.jsonl", "--model", "rules"]),
                     ("05", lambda w, d: w.score_args(d / "q.h5")), ("07", lambda w, d: w.eval_args(d / "out"))]:
    for value in ("cuda:99", "gpu"):
        row(stage, f"device-{value.replace(':', '')}", lambda w, d, valid=valid, value=value: valid(w, d) + ["--device", value],
            "argument --device")
row("caption", "ids-with-a-space", lambda w, d: w.caption_args(d, "--ids", write(d, "ids.txt", "my photo\n"), "--features", h5_changed(
    w.features, d, lambda f: f.copy(f["11"], "my photo"))), "captions of 1 images", "ok")

# -- issue 49: 03's --engine, bench/bench_gpu.py's flags, bench/gpu_check.sh's arguments ------------------
SCRIPTS["bench_gpu"] = "bench/bench_gpu.py"
row("03", "engine-unknown", lambda w, d: para_args(w, d, w.selfgen, "--engine", "onnx"), "argument --engine")
row("03", "engine-ctranslate2-model-not-found", lambda w, d: ["--in", w.selfgen, "--out", d / "out.jsonl", "--model",
                                                              d / "no-model", "--engine", "ctranslate2"], "rules")
row("bench_gpu", "repeats-zero", lambda w, d: ["--smoke", "--repeats", "0"], "argument --repeats")
row("bench_gpu", "repeats-text", lambda w, d: ["--smoke", "--repeats", "five"], "argument --repeats")
row("bench_gpu", "budget-negative", lambda w, d: ["--smoke", "--budget", "-5"], "--budget must be a positive")
row("bench_gpu", "budget-text", lambda w, d: ["--smoke", "--budget", "soon"], "argument --budget")
row("bench_gpu", "section-unknown", lambda w, d: ["--smoke", "--sections", "train05"], "argument --sections")
row("bench_gpu", "cuda-without-a-gpu", lambda w, d: ["--device", "cuda", "--budget", "-1"], "no gpu here|--budget must be")


@pytest.mark.parametrize("args,message", [
    (["--cpu-dry-run", "OUT", "soon"], "SECONDS must be a whole number of seconds, at least 60, not 'soon'"),
    (["OUT", "30"], "SECONDS must be a whole number of seconds, at least 60, not '30'"),
    (["--cpu-dry-run"], "usage: bash bench/gpu_check.sh [--cpu-dry-run] OUTDIR [SECONDS]"),
])
def test_gpu_check_arguments(tmp_path, args, message):
    """bench/gpu_check.sh refuses a bad time budget or a missing OUTDIR in one line, before it writes anything."""
    import subprocess

    argv = [str(tmp_path / a) if a == "OUT" else a for a in args]
    proc = subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh"), *argv], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode != 0 and message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "OUT").exists()


# -- issue 47: numbers as people type them, ids that collide, dtypes said, moved inputs, models not found ---------
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


def late_bad_byte(w: World, d: Path, at: int = 1500) -> Path:
    """The self-generated captions, repeated to 2,000 lines (new ids), with a byte that is not UTF-8 on line ``at``."""
    records = SELFGEN_RECORDS(w)
    lines = [json.dumps(dict(records[k % len(records)], id=f"x{k}")).encode() for k in range(2000)]
    lines[at - 1] = lines[at - 1].replace(b"a dog", b"a d\xe9g")
    return write(d, "s.jsonl", b"\n".join(lines) + b"\n")


def trained_then(w: World, d: Path, *extra) -> list:
    """04's arguments of a run already trained into d/out, given again with ``extra``."""
    _must(run_stage("04", w.train_args(d / "out")))
    return w.train_args(d / "out", *extra)


def moved_inputs(w: World, d: Path) -> list:
    """03 (rules) run on inputs in d/a, then the folder moved to d/b: the same command in the new place."""
    (d / "a").mkdir()
    shutil.copy(w.selfgen, d / "a" / "s.jsonl")
    _must(run_stage("03", ["--in", d / "a" / "s.jsonl", "--out", d / "a" / "p.jsonl", "--model", "rules"]))
    (d / "a").rename(d / "b")
    return ["--in", d / "b" / "s.jsonl", "--out", d / "b" / "p.jsonl", "--model", "rules"]


def demo_then_smaller(w: World, d: Path) -> list:
    _must(run_stage("00", ["--out", d / "demo", "--skip-features", "--n-train", "6", "--n-val", "2", "--n-test", "2",
                           "--size", "96", "--workers", "1"]))
    return ["--out", d / "demo", "--skip-features", "--n-train", "3", "--n-val", "1", "--n-test", "1", "--size", "96",
            "--workers", "1"]


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
row("07", "generated-level-superscript", lambda w, d: w.eval_args(d / "out", "--generated", jsonl_lines(
    w.generated, d, first(level="1\u00b2"), "g.jsonl")), "'level' must be a level number")
row("07", "generated-level-arabic-indic", lambda w, d: w.eval_args(d / "out", "--generated", jsonl_lines(
    w.generated, d, first(level="\u0661"), "g.jsonl")), "'level' must be a level number")
row("07", "generated-image-id-superscript", lambda w, d: w.eval_args(d / "out", "--generated", jsonl_lines(
    w.generated, d, first(image_id="11\u00b2"), "g.jsonl")), "left out 1 captions of images that are not test images", "ok")
for stage, valid in [("caption", lambda w, d: w.caption_args(d)), ("shard", lambda w, d: ["merge", d / "o.jsonl"])]:
    for flag, value in [("--num-shards", "2\u00b2"), ("--num-shards", "\uff12"), ("--shard-id", "\u0661")][:3 if stage == "caption" else 2]:
        row(stage, f"{flag[2:]}-{value.encode('unicode_escape').decode()}",
            lambda w, d, valid=valid, flag=flag, value=value: valid(w, d) + [flag, value], f"argument {flag}")
row("caption", "levels-L1", lambda w, d: w.caption_args(d, "--levels", "L1"), "captions of", "ok")
row("caption", "levels-comma-list", lambda w, d: w.caption_args(d, "--levels", "1,1"), "captions of", "ok")
row("caption", "levels-superscript", lambda w, d: w.caption_args(d, "--levels", "1\u00b2"), "digits 0-9")
row("caption", "levels-zero", lambda w, d: w.caption_args(d, "--levels", "L0"), "level numbers from 1")
row("caption", "limit-superscript", lambda w, d: w.caption_args(d, "--limit", "3\u00b2"), "argument --limit")
row("04", "max-steps-fullwidth", lambda w, d: w.train_args(d / "out", "--max-steps", "\uff12"), "argument --max-steps")
row("04", "batch-size-superscript", lambda w, d: w.train_args(d / "out", "--batch-size", "4\u00b2"), "argument --batch-size")
row("04", "workers-above-the-cores", lambda w, d: w.train_args(d / "out", "--workers", "4096"), "argument --workers")
row("06", "workers-above-the-cores", lambda w, d: w.selection_args(d / "out", "--workers", "4096"), "argument --workers")
row("04", "resume-precision-fp32-after-auto", lambda w, d: trained_then(w, d, "--precision", "fp32"), "already trained", "ok")
row("04", "dropout-draws-unknown", lambda w, d: w.train_args(d / "out", "--dropout-draws", "batch"), "argument --dropout-draws")
row("06", "dropout-draws-unknown", lambda w, d: w.selection_args(d / "out", "--dropout-draws", "Example"), "argument --dropout-draws")
row("04", "resume-dropout-draws-changed", lambda w, d: trained_then(w, d, "--dropout-draws", "rank"),
    "--dropout-draws example then, rank now", leaves_output=True)
row("04", "bert-folder-not-found", lambda w, d: w.train_args(d / "out", "--preset", "labert", "--bert", d / "nope"),
    "not found: there is no folder")
row("04", "bert-folder-empty", lambda w, d: w.train_args(d / "out", "--preset", "minilm", "--bert", (d / "e").mkdir() or d / "e"),
    "is empty")
row("03", "model-folder-empty", lambda w, d: ["--in", w.selfgen, "--out", d / "p.jsonl", "--model", (d / "e").mkdir() or d / "e"],
    "is empty. use --model rules")
row("03", "model-folder-not-found", lambda w, d: ["--in", w.selfgen, "--out", d / "p.jsonl", "--model", d / "nope"],
    "tuner007/pegasus_paraphrase on the hugging face hub")
row("03", "model-hub-name-offline", lambda w, d: ["--in", w.selfgen, "--out", d / "p.jsonl", "--model", "some-org/some-model"],
    "not on disk, and this run is offline")
row("03", "inputs-moved-with-the-checkout", moved_inputs, "nothing to do|already", "ok")
row("05", "selfgen-non-utf8-on-line-1500", lambda w, d: w.score_args(d / "q.h5", "--selfgen", late_bad_byte(w, d)),
    "line 1500: not utf-8")
row("04", "selfgen-non-utf8-on-line-1500", lambda w, d: w.train_args(d / "out", "--data", "extended", "--selfgen", late_bad_byte(w, d)),
    "line 1500: not utf-8")
row("04", "token-cache-name-too-long", lambda w, d: w.train_args(d / "out", "--data", "extended", "--token-cache", "--selfgen", write(
    d, "s" * 236 + ".jsonl", w.selfgen.read_text())), "going on without it", "ok")
row("00", "rebuilt-smaller-in-the-same-folder", demo_then_smaller, "removed 5 images of an earlier, larger world", "ok")
DATASET_12 = lambda f: (f.__delitem__("12"), f.create_dataset("12", data=np.zeros((3, 16), np.float32)))  # noqa: E731
row("04", "features-test-image-a-dataset-found-at-open", lambda w, d: w.train_args(d / "out", "--features", h5_changed(
    w.features, d, DATASET_12)), "image 12: is a dataset, not a group")
row("07", "features-test-image-a-dataset-found-at-open", lambda w, d: ["--refs", w.captions, "--checkpoint", w.trusted, "--out", d / "out",
                                                                      "--spice", "off", "--features", h5_changed(w.features, d, DATASET_12)],
    "image 12: is a dataset, not a group")
row("04", "features-test-image-a-dataset-skipped", lambda w, d: w.train_args(d / "out", "--bad-features", "skip", "--features", h5_changed(
    w.features, d, DATASET_12)), "bad region features", "skip")

# -- issue 50: captions of images without a feature file (--images, --grid), n-gram blocking (--block-ngram) -----------
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
row("caption", "images-missing-folder", lambda w, d: no_features(w, d, "--images", d / "nope"), "cannot compute|no such image folder")
for value in ("0", "32", "x"):
    row("caption", f"grid-{value}", lambda w, d, value=value: no_features(w, d, "--images", w.images, "--grid", value),
        "argument --grid")
for value in ("-1", "9", "two"):
    row("caption", f"block-ngram-{value}", lambda w, d, value=value: w.caption_args(d, "--block-ngram", value),
        "argument --block-ngram")
    row("07", f"block-ngram-{value}", lambda w, d, value=value: w.eval_args(d / "out", "--block-ngram", value),
        "argument --block-ngram")
row("caption", "block-ngram-0", lambda w, d: w.caption_args(d, "--block-ngram", "0", "--levels", "1"), "captions of", "ok")
row("caption", "block-ngram-2", lambda w, d: w.caption_args(d, "--block-ngram", "2", "--levels", "2"), "captions of", "ok")


# -- issue 48 (training and features at cluster scale): --region-cache, --dist-timeout, convert --dtype ------------
def bf16_tag(value):
    """A features dataset whose dtype attribute says ``value`` (bfloat16 is known, and only over uint16)."""
    def change(group):
        group["features"].attrs["dtype"] = value
    return first_group(change)


for stage, args in (("04", lambda w, d, *x: w.train_args(d / "out", *x)), ("05", lambda w, d, *x: w.score_args(d / "q.h5", *x)),
                    ("06", lambda w, d, *x: w.selection_args(d / "out", *x))):
    for value, fragment in (("0", "must be at least 1m"), ("-1", "must be auto or a size"), ("12XB", "must be auto or a size"),
                            ("1.5", "must be at least 1m"), ("100T", "100t is more than this node's memory"),
                            ("", "must be auto or a size")):
        row(stage, f"region-cache-{value or 'empty'}", lambda w, d, args=args, value=value: args(w, d, "--region-cache", value),
            f"argument --region-cache: {fragment}")
row("04", "region-cache-512M", lambda w, d: w.train_args(d / "out", "--region-cache", "512M"), "checkpoint:", "ok")
row("05", "region-cache-auto", lambda w, d: w.score_args(d / "q.h5", "--region-cache", "auto"), "16 scored captions", "ok")
row("04", "dist-timeout-0", lambda w, d: w.train_args(d / "out", "--dist-timeout", "0"), "argument --dist-timeout")
row("06", "dist-timeout-nan", lambda w, d: w.selection_args(d / "out", "--dist-timeout", "nan"), "argument --dist-timeout")
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
row("04", "features-unknown-dtype-tag", lambda w, d: w.train_args(d / "out", "--features", h5_changed(
    w.features, d, bf16_tag("float8"))), "dtype = 'float8': only bfloat16")
row("04", "features-bfloat16-tag-on-float32", lambda w, d: w.train_args(d / "out", "--features", h5_changed(
    w.features, d, bf16_tag("bfloat16"))), "is float32 with the attribute dtype = 'bfloat16'")


# ---------------------------------------------------------------------------------------------
# The test


def classify(row: Row, outcome: Outcome) -> str:
    """clear (an error line or a reported skip, as the row expects) / traceback / silent."""
    if outcome.code == "traceback" or "Traceback (most recent call last)" in outcome.text:
        return "traceback"
    if row.kind == "error":
        return "clear" if outcome.code != 0 and "error" in outcome.text.lower() else "silent"
    if outcome.code != 0:
        return "clear" if row.kind == "skip" else "failed"  # a refusal where a skip was expected still names it
    found = any(alt in outcome.text.lower() for alt in row.expect.lower().split("|"))
    return "clear" if found else "silent"


def _param(r: Row):
    marks = [pytest.mark.xfail(reason=NEEDS[r.needs], strict=False)] if r.needs else []
    return pytest.param(r, id=r.id, marks=marks)


def test_the_table_is_large_and_covers_every_stage():
    assert len(ROWS) >= 150
    assert {r.stage for r in ROWS} == set(SCRIPTS)
    assert len({r.id for r in ROWS}) == len(ROWS)


@pytest.mark.parametrize("row", [_param(r) for r in ROWS])
def test_bad_input(row: Row, world: World, tmp_path):
    d = tmp_path / "row"
    d.mkdir()
    argv = row.make(world, d)
    before = {p for p in d.rglob("*")}
    outcome = run_stage(row.stage, argv)
    verdict = classify(row, outcome)
    if os.environ.get("CLID_BAD_INPUT_REPORT"):
        last = (outcome.error.splitlines() or [""])[0] or (outcome.text.strip().splitlines() or [""])[-1]
        with open(os.environ["CLID_BAD_INPUT_REPORT"], "a") as f:
            f.write(f"{row.id}\t{verdict}\t{outcome.code}\t{last[:300]}\n")
    detail = f"{row.id}: exit {outcome.code}; {outcome.error}\n{outcome.text[-1500:]}"
    assert "Traceback" not in outcome.text and outcome.code != "traceback", detail
    if row.kind == "error":
        assert outcome.code not in (0, None), detail
        lines = [line.lower() for line in outcome.text.splitlines() if "error:" in line.lower()]
        assert any(alt in line for line in lines for alt in row.expect.lower().split("|")), detail
        if not row.leaves_output:
            # (a sharded stage's run record, ``OUT.run.json``, is resume bookkeeping, not output)
            left = sorted(str(p.relative_to(d)) for p in set(d.rglob("*")) - before if not p.name.endswith(".run.json"))
            assert not left, f"{detail}\nleft behind: {left}"
    else:
        assert outcome.code == 0, detail
        assert any(alt in outcome.text.lower() for alt in row.expect.lower().split("|")), detail
    assert not (d / "pwned").exists(), "a pickle in the input ran code"


def test_07_cache_is_keyed_by_the_features_file(world: World, tmp_path, capsys):
    """Captions generated from one feature file are not reused after --features changes."""
    from conftest import import_script

    from clid.caption.cached import generate_cached
    from clid.data.store import FeatureStore

    script = import_script("07_eval.py", "eval_cache_by_features")
    data = json.loads(world.captions.read_text())
    image_ids = [str(im["cocoid"]) for im in data["images"] if im["split"] == "test"]
    other = h5_changed(world.features, tmp_path, first_group(poke("features", (0, 0), 5.0)), "other.h5")
    cache = tmp_path / "generated" / "trusted.jsonl"
    for features, expected in ((world.features, "generating"), (world.features, "reusing"), (other, "generating")):
        args = script.parse_args(["--refs", str(world.captions), "--features", str(features),
                                  "--checkpoint", str(world.trusted), "--out", str(tmp_path), "--decode-steps", "1"])
        store = FeatureStore(features)
        generate_cached(world.trusted, cache, args, image_ids, store, None)
        store.close()
        assert expected in capsys.readouterr().out
