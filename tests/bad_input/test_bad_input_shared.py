"""Bad input of several commands at once: an input they read alike (feature kinds, self-generated captions, checkpoints, numbers in flags, repeated ids, output suffixes, --precision and --batch-size, token caches, --device): one row per malformed input (tests/badinput.py runs and checks them)."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from badinput import (
    CHECKPOINT_CASES,
    SELFGEN_CASES,
    SHARE,
    Row,
    Table,
    World,
    check_row,
    checkpoint_copy,
    coco_captions,
    corrupt,
    edit_config,
    first_group,
    group_as_dataset_at,
    h5_changed,
    jsonl_lines,
    many_regions,
    other_kind,
    para_args,
    poke,
    set_attr,
    sg_args,
    unfinished,
    write,
)
from conftest import FIXTURES
from toyworld import make_toy_world

table = Table()
row = table.row

def other_dim(w: World, d: Path) -> Path:
    (d / "w8").mkdir()
    return make_toy_world(d / "w8", n_train=8, n_val=2, n_test=3, dim=8)[1]

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

for name, make, fragment, kind in SELFGEN_CASES:
    share = SHARE if kind == "skip" else []
    row("04", f"selfgen-{name}", lambda w, d, make=make, share=share: w.train_args(d / "out", "--data", "extended", "--selfgen", make(w, d), *share),
        fragment, kind)
    row("05", f"selfgen-{name}", lambda w, d, make=make, share=share: w.score_args(d / "out.h5", "--selfgen", make(w, d), *share), fragment, kind)

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

for name, make, fragment in CHECKPOINT_CASES:
    row("05", f"checkpoint-{name}", lambda w, d, make=make: w.score_args(d / "out.h5", "--trusted", make(w, d)), fragment)
    row("07", f"checkpoint-{name}", lambda w, d, make=make: ["--refs", w.captions, "--features", w.features, "--checkpoint", make(w, d),
                                                            "--out", d / "out", "--spice", "off"], fragment)

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

def features_a_group(group):
    del group["features"]
    group.create_group("features")

def in_test_image(change):
    """A change of image 11, a test image of the toy world (07 reads only test images)."""
    def apply(f):
        change(f["11"])
    return apply

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

CONFIG_EDITS = [("num-heads", {"num_heads": 2}), ("layer-norm-eps", {"layer_norm_eps": 1e-5}),
                ("region-norm", {"region_norm": "standardize"})]

for name, fields in CONFIG_EDITS:
    fragment = "does not describe the weights"
    row("05", f"checkpoint-config-{name}-edited", lambda w, d, f=fields: w.score_args(
        d / "out.h5", "--extended", checkpoint_copy(w.extended, d, edit_config(**f), "ck")), fragment)
    row("07", f"checkpoint-config-{name}-edited", lambda w, d, f=fields: [
        "--refs", w.captions, "--features", w.features, "--checkpoint", checkpoint_copy(w.trusted, d, edit_config(**f), "ck"),
        "--out", d / "out", "--spice", "off"], fragment)

# -- crashes after the work is done, and in the middle of it ---------------------------------------------
for stage, valid, good in [("01", lambda w, d, out: ["--images", w.images, "--out", out], ".h5"),
                           ("02", lambda w, d, out: sg_args(w, d)[:-1] + [out], ".jsonl"),
                           ("03", lambda w, d, out: ["--in", w.selfgen, "--out", out, "--model", "rules"], ".jsonl"),
                           ("05", lambda w, d, out: w.score_args(out), ".h5")]:
    for name in ("selfgen.json", "quality", "saliency.hdf", "out.txt", "out.jsonl" if good == ".h5" else "out.h5"):
        row(stage, f"out-suffix-{name}", lambda w, d, valid=valid, name=name: valid(w, d, d / name), "must end in")
    row(stage, "out-is-a-folder", lambda w, d, valid=valid, good=good: valid(w, d, (d / f"x{good}").mkdir() or d / f"x{good}"),
        "is a folder")

# -- --precision and --batch-size auto on the stages that run a model ---------------------------
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

for stage in ("04", "06"):
    for value in ("-1", "x", "1.5", ""):
        row(stage, f"workers={value}", lambda w, d, stage=stage, value=value:
            [*PRECISION_STAGES[stage](w, d), f"--workers={value}"], "argument --workers")

# -- the token cache beside the self-generated captions, and the captions 05 scored -------
def cached_selfgen(w: World, d: Path, damage: Callable[[Path], None], levels="caption") -> Path:
    """A copy of the self-generated captions with its token cache (--token-cache) built, then ``damage`` done
    to the cache file."""
    from clid.base.text import load_tokenizer
    from clid.data.inputs import CaptionFiles
    from clid.data.token_cache import cache_path

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

# --device checked where it is parsed; an id list's lines are whole ids
for stage, valid in [("caption", lambda w, d: w.caption_args(d)[:-4]), ("01", lambda w, d: ["--images", w.images, "--out", d / "s.h5"]),
                     ("03", lambda w, d: ["--in", w.selfgen, "--out", d / "p.jsonl", "--model", "rules"]),
                     ("05", lambda w, d: w.score_args(d / "q.h5")), ("07", lambda w, d: w.eval_args(d / "out"))]:
    for value in ("cuda:99", "gpu"):
        row(stage, f"device-{value.replace(':', '')}", lambda w, d, valid=valid, value=value: valid(w, d) + ["--device", value],
            "argument --device")

for stage, valid in [("caption", lambda w, d: w.caption_args(d)), ("shard", lambda w, d: ["merge", d / "o.jsonl"])]:
    for flag, value in [("--num-shards", "2\u00b2"), ("--num-shards", "\uff12"), ("--shard-id", "\u0661")][:3 if stage == "caption" else 2]:
        row(stage, f"{flag[2:]}-{value.encode('unicode_escape').decode()}",
            lambda w, d, valid=valid, flag=flag, value=value: valid(w, d) + [flag, value], f"argument {flag}")

for value in ("-1", "9", "two"):
    row("caption", f"block-ngram-{value}", lambda w, d, value=value: w.caption_args(d, "--block-ngram", value),
        "argument --block-ngram")
    row("07", f"block-ngram-{value}", lambda w, d, value=value: w.eval_args(d / "out", "--block-ngram", value),
        "argument --block-ngram")

for stage, args in (("04", lambda w, d, *x: w.train_args(d / "out", *x)), ("05", lambda w, d, *x: w.score_args(d / "q.h5", *x)),
                    ("06", lambda w, d, *x: w.selection_args(d / "out", *x))):
    for value, fragment in (("0", "must be at least 1m"), ("-1", "must be auto or a size"), ("12XB", "must be auto or a size"),
                            ("1.5", "must be at least 1m"), ("100T", "100t is more than this node's memory"),
                            ("", "an empty value")):
        row(stage, f"region-cache-{value or 'empty'}", lambda w, d, args=args, value=value: args(w, d, "--region-cache", value),
            f"argument --region-cache: {fragment}")


# -- an empty value is never a path, a name or a number: argparse would read it as a flag not given (no gallery,
# the default preview folder, no --captions filter, without a word) or as the path ''
EMPTY = [
    ("01", lambda w, d: ["--images", w.images, "--out", d / "out.h5", "--preview", "1", "--preview-dir", ""], "--preview-dir"),
    ("caption", lambda w, d: w.caption_args(d, "--gallery", ""), "--gallery"),
    ("caption", lambda w, d: w.caption_args(d, "--gallery=  "), "--gallery"),
    ("05", lambda w, d: w.score_args(d / "q.h5", "--captions", ""), "--captions"),
    ("07", lambda w, d: ["--combine", d, "", "--out", d / "out"], "--combine"),
    ("features", lambda w, d: ["--images", w.images, "", "--boxes", "grid", "2", "--out", d / "f.h5"], "--images"),
    ("04", lambda w, d: w.train_args(d / "out", "--recipe="), "--recipe"),
]
for number, (stage, make, flag) in enumerate(EMPTY):
    row(stage, f"empty-value-{number}{flag}", make, f"argument {flag}: an empty value")


# -- every file under --images captioned or counted and named with its reason (clid.features, clid.caption --images) --
def encoder_checkpoint(w: World) -> Path:
    """A checkpoint trained (2 steps) on features this package computes from pixels (the demo world's), so that
    clid.caption --images computes them: made once per pytest worker, beside its world."""
    folder = w.root / "encoder-world"
    if not (folder / "ck" / "config.json").exists():
        from badinput import _must, run_stage

        _must(run_stage("00", ["--out", folder / "demo", "--n-train", "8", "--n-val", "2", "--n-test", "2",
                               "--workers", "1"]))
        _must(run_stage("04", ["--captions", folder / "demo" / "captions.json", "--features", folder / "demo" / "features.h5",
                               "--out", folder / "ck", "--preset", "tiny", "--max-steps", "2", "--warmup", "1",
                               "--batch-size", "4", "--eval-every", "0"]))
    return folder / "ck"

def odd_folder(d: Path, *names, make=None) -> Path:
    """A folder of small PNG photos: 1.png and ``names``; ``make(folder)`` adds what else it holds."""
    from PIL import Image

    folder = d / "photos"
    folder.mkdir()
    for k, name in enumerate(["1.png", *names]):
        Image.fromarray(np.full((24, 32, 3), 30 * k, np.uint8)).save(folder / name)
    if make:
        make(folder)
    return folder

def an_animation(folder: Path) -> None:
    from PIL import Image

    frames = [Image.new("RGB", (40, 32), (60 * k, 0, 0)) for k in range(3)]
    frames[0].save(folder / "anim.gif", save_all=True, append_images=frames[1:], duration=100)

def a_bomb(folder: Path) -> None:
    """A PNG whose header says 30,000 x 30,000 pixels (more than Pillow opens), in a few bytes."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    (folder / "huge.png").write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 30000, 30000, 8, 2, 0, 0, 0))
                                      + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b""))

def copy_of_1(name: str):
    return lambda folder: (folder / name).write_bytes((folder / "1.png").read_bytes())

IMAGE_FOLDER_CASES = [  # (name, folder(d) -> the --images path, fragment, kind)
    ("animated-gif", lambda d: odd_folder(d, make=an_animation), "note: anim.gif: animated (3 frames): its first frame taken", "ok"),
    ("link-that-points-nowhere", lambda d: odd_folder(d, make=lambda f: (f / "gone.png").symlink_to(f / "nope.png")),
     "skipped gone.png: a symbolic link that points nowhere", "skip"),
    ("link-in-a-loop", lambda d: odd_folder(d, make=lambda f: (f / "loop.png").symlink_to(f / "loop.png")),
     "skipped loop.png: a symbolic link in a loop", "skip"),
    ("a-fifo", lambda d: odd_folder(d, make=lambda f: os.mkfifo(f / "pipe.png")), "skipped pipe.png: not a regular file", "skip"),
    ("decompression-bomb", lambda d: odd_folder(d, make=a_bomb), "skipped huge.png: too large to read", "skip"),
    ("cut-short", lambda d: odd_folder(d, make=lambda f: (f / "cut.png").write_bytes((f / "1.png").read_bytes()[:40])),
     "skipped cut.png: cannot be read as an image", "skip"),
    ("leading-space", lambda d: odd_folder(d, " lead.png"), "2 of 2 files read|region features of 2 images", "ok"),
    ("trailing-space", lambda d: odd_folder(d, "x .png"), "2 of 2 files read|region features of 2 images", "ok"),
    ("one-id-by-spaces", lambda d: odd_folder(d, " 1.png"), "their names differ only in the extension or the spaces", "error"),
    ("dot-dot-png", lambda d: odd_folder(d, make=copy_of_1("..png")), "skipped ..png: hidden", "skip"),
    ("dot-dot-dot-png", lambda d: odd_folder(d, make=copy_of_1("...png")), "skipped ...png: hidden", "skip"),
    ("dot-dot-png-named-alone", lambda d: odd_folder(d, make=copy_of_1("..png")) / "..png",
     "..png: a name that cannot be an id: its id would be '.'", "error"),
    ("hidden-glob", lambda d: str(odd_folder(d, make=copy_of_1("...png"))) + "/.*.png",
     "...png: a name that cannot be an id: its id would be '..'", "error"),
    ("superscript-digits", lambda d: odd_folder(d, "room101\u00b2.png"), "2 of 2 files read|region features of 2 images", "ok"),
    ("unicode-name", lambda d: odd_folder(d, "\u65e5\u672c.jpg", "\u00fcn\u00ef.png"), "3 of 3 files read|region features of 3 images", "ok"),
    ("decomposed-unicode-name", lambda d: odd_folder(d, "u\u0308n.png"), "2 of 2 files read|region features of 2 images", "ok"),
    ("control-character", lambda d: odd_folder(d, "a\x01b.png"),
     "skipped a\\x01b.png: a name that cannot be an id: it holds a control character", "skip"),
    ("newline-in-name", lambda d: odd_folder(d, "a\nb.png"), "skipped a\\nb.png: a name that cannot be an id", "skip"),
    ("tab-in-name", lambda d: odd_folder(d, "a\tb.png"), "skipped a\\tb.png: a name that cannot be an id", "skip"),
    ("backslash-in-name", lambda d: odd_folder(d, "a\\b.png"), "the id 'a\\\\b' holds a path separator", "skip"),
    ("name-too-long", lambda d: odd_folder(d, "\u00e9" * 120 + ".png"), "the id is longer than 200 bytes", "skip"),
    ("name-not-utf8", lambda d: odd_folder(d, make=lambda f: (Path(os.fsdecode(bytes(f) + b"/caf\xe9.png"))).write_bytes(
        (f / "1.png").read_bytes())), "skipped caf\\udce9.png: a name that cannot be an id: it holds bytes that are not utf-8", "skip"),
    ("more-skipped-than-shown", lambda d: odd_folder(d, make=lambda f: [(f / f"note{k}.txt").write_text("x") for k in range(12)]),
     "skipped 12 of 13 files (the first above; all in ", "skip"),
]

IMAGE_READERS = {  # stage -> its command line of an --images path
    "features": lambda w, d, images: ["--images", images, "--boxes", "grid", "2", "--out", d / "f.h5", "--device", "cpu"],
    "caption": lambda w, d, images: ["--checkpoint", encoder_checkpoint(w), "--images", images, "--out", d / "c.jsonl",
                                     "--device", "cpu", "--decode-steps", "1", "--levels", "1", "--grid", "2"],
}

for stage, args in IMAGE_READERS.items():
    for name, folder, fragment, kind in IMAGE_FOLDER_CASES:
        row(stage, f"images-folder-{name}", lambda w, d, args=args, folder=folder: args(w, d, folder(d)), fragment, kind)


@pytest.mark.parametrize("row", table.params())
def test_bad_input(row: Row, world: World, tmp_path):
    check_row(row, world, tmp_path)
