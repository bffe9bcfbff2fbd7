"""The bad-input table's shared part: running a stage in-process, the shared valid inputs (one toy world with tiny
trained checkpoints: the ``world`` fixture, which tests/conftest.py makes available everywhere), the helpers that
make bad files from them, and the rows' check. The rows themselves live in tests/bad_input/, one file a command.

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
           "06": "06_train_selection.py", "07": "07_eval.py", "stats": "clid.stats", "data": "clid.captions",
           "shard": "clid.shard", "features": "clid.features", "emlnet": "clid.emlnet",
           "caption": "clid.caption", "truth": "clid.demo.truth", "tables": "clid.tables"}


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


@pytest.fixture(scope="session")
def world(tmp_path_factory) -> World:
    import torch
    from PIL import Image

    from clid.base.files import write_h5_groups, write_jsonl, write_quality
    from clid.selection.quality import eq1_quality

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


class Table:
    """The rows of one test file: ``table.row(...)`` adds one, ``table.params()`` parametrizes its test."""

    def __init__(self):
        self.rows: list[Row] = []

    def row(self, stage, name, make, expect="", kind="error", needs=None, leaves_output=False):
        self.rows.append(Row(stage, name, make, expect, kind, needs, leaves_output))

    def params(self) -> list:
        return [_param(r) for r in self.rows]


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


def image_folder(d: Path, w: World, extra: dict) -> Path:
    folder = d / "images"
    shutil.copytree(w.images, folder)
    for name, content in extra.items():
        write(folder, name, content)
    return folder


# -- 02 scene-graph captions ----------------------------------------------------------------------------


def sg_args(w: World, d: Path, graphs=None, data=None, saliency="none", *extra) -> list:
    """02's command line; with a saliency file, no image_data.json (its maps are keyed by VG id)."""
    data = [] if saliency != "none" else ["--image-data", data or FIXTURES / "vg_image_data_sample.json"]
    return ["--scene-graphs", graphs or FIXTURES / "vg_scene_graphs_sample.json", *data, "--saliency", saliency,
            "--out", d / "out.jsonl", *extra]


# -- 03 paraphrase --------------------------------------------------------------------------------------


def para_args(w: World, d: Path, inp, *extra) -> list:
    return ["--in", inp, "--out", d / "out.jsonl", "--model", "rules", *extra]


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


def big_endian(w: World, d: Path) -> Path:
    """The feature file with every array stored big-endian (read as the native one: test_loaders)."""
    def swap(f):
        for group in f.values():
            for name in list(group):
                values = group[name][()]
                del group[name]
                group[name] = values.astype(values.dtype.newbyteorder(">"))
    return h5_changed(w.features, d, swap, "big-endian.h5")


# -- features of another kind or dimension than a checkpoint's (04 --init-from, 05, 07) ------------------
def other_kind(w: World, d: Path) -> Path:
    return h5_changed(w.features, d, lambda f: f.attrs.__setitem__("feature_kind", "butd"), "butd.h5")


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


# -- 06 quality file -------------------------------------------------------------------------------------
def first_rows(n: int):
    """A change keeping the first ``n`` rows of every dataset of a flat HDF5 file."""
    def change(f):
        for name in list(f.keys()):
            values = f[name][()][:n]
            del f[name]
            f.create_dataset(name, data=values)
    return change


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


# -- features, checkpoints and scores that are wrong but readable -----------------------------------------
def many_regions(n):
    def change(group):
        for name, width in (("features", 16), ("boxes", 4)):
            del group[name]
            group.create_dataset(name, data=np.full((n, width), 1.0, np.float32))
    return change


def group_as_dataset_at(key):
    def change(f):
        del f[key]
        f.create_dataset(key, data=np.zeros((3, 16), np.float32))
    return change


def edit_config(**fields):
    """A change of a checkpoint's config.json: model fields set as the weights were not trained."""
    def change(folder):
        config = json.loads((folder / "config.json").read_text())
        config["model"].update(fields)
        (folder / "config.json").write_text(json.dumps(config))
    return change


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


SELFGEN_RECORDS = lambda w: [json.loads(line) for line in w.selfgen.read_text().splitlines()]  # noqa: E731


def chain_graph(d: Path, n: int) -> Path:
    """One VG graph whose ``n`` objects form a chain (each related to the next), in a 10,000 x 10,000 image."""
    objects = [{"object_id": k, "x": k % 9000, "y": k % 9000, "w": 10, "h": 10, "names": ["dog" if k % 2 else "ball"]}
               for k in range(n)]
    relations = [{"predicate": "next to", "subject_id": k, "object_id": k + 1} for k in range(n - 1)]
    return write(d, "chain.json", [{"image_id": 1, "width": 10000, "height": 10000, "objects": objects,
                                    "relationships": relations}])


# -- outputs a command did not write, resume over changed inputs, the newer commands --
def copy_to(source: Path, d: Path, name: str) -> Path:
    """A copy of ``source`` at ``d/name``: an existing file the command did not write."""
    return Path(shutil.copy(source, d / name))


def after(stage: str, argv: list, then: list) -> list:
    """Run ``stage`` with ``argv`` first (it must succeed), then the row runs ``then``."""
    _must(run_stage(stage, argv))
    return then


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


# convert-coco: annotation ids
def coco_annotations(w: World, d: Path, change) -> Path:
    """The toy world as COCO captions, each annotation with its own id, then ``change`` of the annotations."""
    data = json.loads(coco_captions(w, d, "a dog").read_text())
    for k, annotation in enumerate(data["annotations"]):
        annotation["id"] = k
    change(data["annotations"])
    return write(d, "coco.json", data)


# one file by another name: a symbolic link, or a hard link (one inode, two names)
def link_to(d: Path, name: str, target: Path, hard: bool = False) -> Path:
    """``d/name``, a link to ``target``."""
    link = d / name
    link.parent.mkdir(parents=True, exist_ok=True)
    if hard:
        os.link(target, link)
    else:
        link.symlink_to(Path(target).resolve())
    return link


# symlink loops, 00's --out a file, a feature group that is a dataset
def loop(d: Path, name: str) -> Path:
    (d / name).symlink_to(d / name)
    return d / name


# -- 03's --engine, bench/bench_gpu.py's flags, bench/gpu_check.sh's arguments ------------------
SCRIPTS["bench_gpu"] = "bench/bench_gpu.py"


def late_bad_byte(w: World, d: Path, at: int = 1500) -> Path:
    """The self-generated captions, repeated to 2,000 lines (new ids), with a byte that is not UTF-8 on line ``at``."""
    records = SELFGEN_RECORDS(w)
    lines = [json.dumps(dict(records[k % len(records)], id=f"x{k}")).encode() for k in range(2000)]
    lines[at - 1] = lines[at - 1].replace(b"a dog", b"a d\xe9g")
    return write(d, "s.jsonl", b"\n".join(lines) + b"\n")


DATASET_12 = lambda f: (f.__delitem__("12"), f.create_dataset("12", data=np.zeros((3, 16), np.float32)))  # noqa: E731


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
    """A row as a test, marked slow: each row runs its command against the world every pytest worker builds
    first (about a minute), so the table runs in ``make test``, not ``make test-fast``."""
    marks = [pytest.mark.slow] + ([pytest.mark.xfail(reason=NEEDS[r.needs], strict=False)] if r.needs else [])
    return pytest.param(r, id=r.id, marks=marks)


def check_row(row: Row, world: World, tmp_path: Path) -> None:
    """Make the row's input, run its stage, and check the outcome the row expects."""
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
