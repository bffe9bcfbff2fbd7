"""Bad input of python -m clid.captions: one row per malformed input (tests/badinput.py runs and checks them)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from badinput import BINARY, Row, Table, World, after, check_row, coco_annotations, coco_captions, copy_to, write

table = Table()
row = table.row

# -- CIC-BART-SSA's captions: python -m clid.captions convert-ssa ---------------------------------------------
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

row("data", "convert-coco-out-is-input", lambda w, d: ["convert-coco", "--captions", (p := coco_captions(w, d, "a dog")),
                                                      "--out", p], "is also the input --captions")

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

row("data", "convert-coco-out-not-its-own", lambda w, d: ["convert-coco", "--captions", coco_captions(w, d, "a dog"), "--out",
                                                          copy_to(w.captions, d, "k.json")], "did not write it")

row("data", "convert-coco-out-not-its-own-force", lambda w, d: ["convert-coco", "--captions", coco_captions(w, d, "a dog"), "--out",
                                                                copy_to(w.captions, d, "k.json"), "--force"],
    "unrecognized arguments: --force")

def coco_then_edited(w, d) -> list:
    """convert-coco into k.json, which the user then rewrote: the row converts again."""
    args = ["convert-coco", "--captions", coco_captions(w, d, "a dog"), "--out", d / "k.json"]
    after("data", args, [])
    write(d, "k.json", "{}")
    return args

row("data", "convert-coco-out-its-own-edited-since", coco_then_edited,
    "k.json was changed since python -m clid.captions convert-coco wrote it")

row("data", "convert-coco-out-of-its-former-name", lambda w, d: ["convert-coco", "--captions", coco_captions(w, d, "a dog"),
    "--out", copy_to(w.captions, d, "k.json")] if write(d, "k.json.run.json", {"command": "python -m clid.data convert-coco"})
    else None, "wrote", "ok")

row("data", "convert-coco-out-a-folder", lambda w, d: ["convert-coco", "--captions", coco_captions(w, d, "a dog"), "--out", d],
    "is a folder")

row("data", "convert-coco-out-its-own", lambda w, d: after("data", ["convert-coco", "--captions", coco_captions(w, d, "a dog"),
                                                                    "--out", d / "k.json"], ["convert-coco", "--captions",
                                                                    d / "coco.json", "--out", d / "k.json"]), "wrote", "ok")

SSA_ONE = {"1.json": {"0": GOOD_REGION}}

row("data", "convert-ssa-out-not-its-own", lambda w, d: ["convert-ssa", "--ssa", ssa_folder(d, SSA_ONE), "--out",
                                                         copy_to(w.selfgen, d, "o.jsonl")], "did not write it")

row("data", "convert-ssa-out-not-its-own-force", lambda w, d: ["convert-ssa", "--ssa", ssa_folder(d, SSA_ONE), "--out",
                                                               copy_to(w.selfgen, d, "o.jsonl"), "--force"],
    "unrecognized arguments: --force")

row("data", "convert-ssa-out-a-folder", lambda w, d: ["convert-ssa", "--ssa", ssa_folder(d, SSA_ONE), "--out", d], "is a folder")

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

row("data", "convert-ssa-one-image-in-two-folders", lambda w, d: ["convert-ssa", "--ssa", ssa_folder(d, SSA_ONE), (
    d / "more").mkdir() or write(d / "more", "1.json", SSA_ONE["1.json"]).parent, "--out", d / "o.jsonl"], "a second file of image 1")

row("data", "convert-coco-annotation-repeated", lambda w, d: ["convert-coco", "--captions", coco_annotations(
    w, d, lambda a: a.append(dict(a[0]))), "--out", d / "k.json"], "1 annotation(s) repeat an earlier one", "ok")

row("data", "convert-coco-annotation-id-reused", lambda w, d: ["convert-coco", "--captions", coco_annotations(
    w, d, lambda a: a.append(dict(a[0], caption="a cat on a mat"))), "--out", d / "k.json"],
    "1 annotation(s) reuse the id of another caption (both kept)", "ok")


@pytest.mark.parametrize("row", table.params())
def test_bad_input(row: Row, world: World, tmp_path):
    check_row(row, world, tmp_path)
