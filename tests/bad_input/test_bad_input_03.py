"""Bad input of 03_paraphrase.py: one row per malformed input (tests/badinput.py runs and checks them)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from badinput import (
    BINARY,
    Row,
    Table,
    World,
    _must,
    check_row,
    copy_to,
    first,
    jsonl_lines,
    para_args,
    run_stage,
    write,
)

table = Table()
row = table.row

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

row("03", "out-unrelated-file", lambda w, d: ["--in", w.selfgen, "--out", copy_to(w.generated, d, "p.jsonl"), "--model", "rules"],
    "did not write it")

row("03", "engine-unknown", lambda w, d: para_args(w, d, w.selfgen, "--engine", "onnx"), "argument --engine")

row("03", "engine-ctranslate2-model-not-found", lambda w, d: ["--in", w.selfgen, "--out", d / "out.jsonl", "--model",
                                                              d / "no-model", "--engine", "ctranslate2"], "rules")

def moved_inputs(w: World, d: Path) -> list:
    """03 (rules) run on inputs in d/a, then the folder moved to d/b: the same command in the new place."""
    (d / "a").mkdir()
    shutil.copy(w.selfgen, d / "a" / "s.jsonl")
    _must(run_stage("03", ["--in", d / "a" / "s.jsonl", "--out", d / "a" / "p.jsonl", "--model", "rules"]))
    (d / "a").rename(d / "b")
    return ["--in", d / "b" / "s.jsonl", "--out", d / "b" / "p.jsonl", "--model", "rules"]

row("03", "model-folder-empty", lambda w, d: ["--in", w.selfgen, "--out", d / "p.jsonl", "--model", (d / "e").mkdir() or d / "e"],
    "is empty. use --model rules")

row("03", "model-folder-not-found", lambda w, d: ["--in", w.selfgen, "--out", d / "p.jsonl", "--model", d / "nope"],
    "tuner007/pegasus_paraphrase on the hugging face hub")

row("03", "model-hub-name-offline", lambda w, d: ["--in", w.selfgen, "--out", d / "p.jsonl", "--model", "some-org/some-model"],
    "not on disk, and this run is offline")

row("03", "inputs-moved-with-the-checkout", moved_inputs, "nothing to do|already", "ok")


@pytest.mark.parametrize("row", table.params())
def test_bad_input(row: Row, world: World, tmp_path):
    check_row(row, world, tmp_path)
