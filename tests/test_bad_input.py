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

SCRIPTS = {"01": "01_saliency.py", "02": "02_scenegraph_captions.py", "03": "03_paraphrase.py",
           "04": "04_train_base.py", "05": "05_score_quality.py", "06": "06_train_selection.py",
           "07": "07_eval.py", "stats": "clid.stats", "data": "clid.data", "truth": "clid.demo.truth"}
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

    def eval_args(self, out, *extra) -> list:
        return ["--refs", self.captions, "--generated", self.generated, "--out", out, "--spice", "off", *extra]


def _must(outcome: Outcome) -> None:
    assert outcome.code == 0, outcome.text[-2000:] + outcome.error


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> World:
    import torch
    from PIL import Image

    from clid.files import write_h5_groups, write_jsonl, write_quality

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
    write_quality(quality, [r["id"] for r in records], np.linspace(-2, -1, len(records)), np.full(len(records), -1.5))
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
]
for name, make, fragment, kind, needs in FEATURE_CASES:
    row("04", f"features-{name}", lambda w, d, make=make: w.train_args(d / "out", "--features", make(w, d)), fragment, kind, needs)
for name, make, fragment, kind, needs in FEATURE_CASES[:5] + FEATURE_CASES[9:10] + FEATURE_CASES[11:12]:
    row("05", f"features-{name}", lambda w, d, make=make: w.score_args(d / "out.h5", "--features", make(w, d)), fragment, kind, needs)
for name, make, fragment, kind, needs in FEATURE_CASES[:4]:
    row("06", f"features-{name}", lambda w, d, make=make: w.selection_args(d / "out", "--features", make(w, d)), fragment, kind, needs)
row("04", "features-image-missing", lambda w, d: w.train_args(d / "out", "--features", h5_changed(w.features, d, lambda f: f.__delitem__("1"))),
    "no region features for the image", "skip")

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
for name, make, fragment, kind in SELFGEN_CASES:
    row("04", f"selfgen-{name}", lambda w, d, make=make: w.train_args(d / "out", "--data", "extended", "--selfgen", make(w, d)), fragment, kind)
    row("05", f"selfgen-{name}", lambda w, d, make=make: w.score_args(d / "out.h5", "--selfgen", make(w, d)), fragment, kind)
for name, make, fragment, kind in SELFGEN_CASES[:1] + SELFGEN_CASES[4:6]:
    row("06", f"selfgen-{name}", lambda w, d, make=make: w.selection_args(d / "out", "--selfgen", make(w, d)), fragment, kind)

# -- 04 training: other inputs, corrupt checkpoints, resume with changed inputs -------------------------
row("04", "output-vocab-missing", lambda w, d: w.train_args(d / "out", "--output-vocab", d / "nope.json"), "no such file|not found")
row("04", "output-vocab-not-json", lambda w, d: w.train_args(d / "out", "--output-vocab", write(d, "v.json", "{")), "not valid json")
row("04", "init-from-missing", lambda w, d: w.train_args(d / "out", "--init-from", d / "nope"), "is not a checkpoint")
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
    ("missing", lambda w, d: d / "nope", "is not a checkpoint|checkpoint not found"),
    ("config-garbage", lambda w, d: checkpoint_copy(w.trusted, d, corrupt("config.json", b"{"), "ck"), "not valid json"),
    ("config-no-model", lambda w, d: checkpoint_copy(w.trusted, d, corrupt("config.json", b"{}"), "ck"), "config.json"),
    ("config-unknown-field", lambda w, d: checkpoint_copy(w.trusted, d, lambda f: (f / "config.json").write_text(json.dumps({"model": {"wings": 2}})), "ck"), "config.json"),
    ("weights-garbage", lambda w, d: checkpoint_copy(w.trusted, d, corrupt("model.safetensors"), "ck"), "model.safetensors"),
    ("weights-empty", lambda w, d: checkpoint_copy(w.trusted, d, corrupt("model.safetensors", b""), "ck"), "model.safetensors"),
    ("weights-of-another-model", lambda w, d: checkpoint_copy(w.trusted, d, narrower, "ck"), "model.safetensors"),
]
for name, make, fragment in CHECKPOINT_CASES:
    row("05", f"checkpoint-{name}", lambda w, d, make=make: w.score_args(d / "out.h5", "--trusted", make(w, d)), fragment)
    row("07", f"checkpoint-{name}", lambda w, d, make=make: ["--refs", w.captions, "--features", w.features, "--checkpoint", make(w, d),
                                                            "--out", d / "out", "--spice", "off"], fragment)
row("05", "include-trusted-no-captions", lambda w, d: w.score_args(d / "out.h5", "--include-trusted"), "needs --captions")
row("05", "captions-split-null", lambda w, d: w.score_args(d / "out.h5", "--captions", karpathy(w, d, set_in(0, split=None))), "'split' must be a string")
row("05", "features-image-missing", lambda w, d: w.score_args(d / "out.h5", "--features", h5_changed(w.features, d, lambda f: f.__delitem__("1"))),
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

# -- 06 selection strategies (clid/selection.py) ---------------------------------------------------------
STRATEGY_FLAG_CASES = [
    ("curriculum-no-difficulty", ["--strategy", "curriculum"], "needs --difficulty"),
    ("difficulty-unknown", ["--strategy", "curriculum", "--difficulty", "loss"], "--difficulty must be"),
    ("difficulty-bootstrap-missing", ["--strategy", "curriculum", "--difficulty", "bootstrap:/no/such/ckpt"], "is not a folder"),
    ("difficulty-clip-no-images", ["--strategy", "curriculum", "--difficulty", "clip:."], "needs --images"),
    ("curate-ratio-zero", ["--strategy", "loss-remove", "--curate-ratio", "0"], "--curate-ratio must be in"),
    ("curate-ratio-one", ["--strategy", "loss-remove", "--curate-ratio", "1"], "--curate-ratio must be in"),
    ("curate-std-negative", ["--strategy", "loss-remove", "--curate-std", "-2"], "--curate-std must be a positive"),
    ("curate-std-inf", ["--strategy", "loss-remove", "--curate-std", "inf"], "--curate-std must be a positive"),
    ("curate-every-zero", ["--strategy", "loss-remove", "--curate-every", "0"], "--curate-every must be at least 1"),
    ("buckets-zero", ["--strategy", "curriculum", "--difficulty", "u", "--buckets", "0"], "--buckets must be at least 1"),
    ("patience-zero", ["--strategy", "curriculum", "--difficulty", "u", "--patience", "0"], "--patience must be at least 1"),
    ("min-improvement-nan", ["--strategy", "curriculum", "--difficulty", "u", "--min-improvement", "nan"],
     "--min-improvement must be"),
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
    from clid.files import write_arrays

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

    from clid.features.store import FeatureStore

    script = import_script("07_eval.py", "eval_cache_by_features")
    data = json.loads(world.captions.read_text())
    image_ids = [str(im["cocoid"]) for im in data["images"] if im["split"] == "test"]
    other = h5_changed(world.features, tmp_path, first_group(poke("features", (0, 0), 5.0)), "other.h5")
    cache = tmp_path / "generated" / "trusted.jsonl"
    for features, expected in ((world.features, "generating"), (world.features, "reusing"), (other, "generating")):
        args = script.parse_args(["--refs", str(world.captions), "--features", str(features),
                                  "--checkpoint", str(world.trusted), "--out", str(tmp_path), "--decode-steps", "1"])
        store = FeatureStore(features)
        script.generate_run(world.trusted, cache, args, image_ids, store, None)
        store.close()
        assert expected in capsys.readouterr().out
