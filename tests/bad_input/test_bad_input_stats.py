"""Bad input of python -m clid.stats: one row per malformed input (tests/badinput.py runs and checks them)."""
from __future__ import annotations

import pytest
from badinput import (
    BINARY,
    CAPTION_CASES,
    Row,
    Table,
    World,
    check_row,
    coco_annotations,
    coco_captions,
    first,
    jsonl_lines,
    karpathy,
    paragraphs,
    set_in,
    write,
)

table = Table()
row = table.row

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

row("stats", "split-unknown", lambda w, d: [karpathy(w, d, set_in(0, split="validation"))], "unknown split 'validation'")

row("stats", "karpathy-cocoid-7-and-string-7", lambda w, d: [karpathy(w, d, set_in(1, cocoid="1"))], "duplicate image id 1")

row("stats", "coco-image-7-and-string-7", lambda w, d: [write(d, "c.json", {"images": [IMG1, {"id": "1", "file_name": "b.jpg"}],
                                                                             "annotations": []})], "duplicate image id 1")

row("stats", "paragraph-repeated-named", lambda w, d: write(d, "p.json", [PARA1, PARA1, {"image_id": 2, "paragraph": "A cat."},
                                                                         {"image_id": "2", "paragraph": "A cat."}]) and
    [d / "p.json"], "2 repeated image id(s) (1, 2", "skip")

row("stats", "paragraphs-above-the-last-level", lambda w, d: [paragraphs(w, d)], "give --levels paragraph", "skip")

row("stats", "paragraphs-with-levels-paragraph", lambda w, d: [paragraphs(w, d), "--levels", "paragraph"], "paragraph bands", "ok")

row("stats", "split-on-a-coco-file", lambda w, d: [coco_captions(w, d, "a dog"), "--split", "test"], "has no splits")

row("stats", "split-without-captions", lambda w, d: [w.captions, "--split", "restval"], "no caption of split")

row("stats", "jsonl-bom", lambda w, d: [write(d, "s.jsonl", b"\xef\xbb\xbf" + w.selfgen.read_bytes())], "captions: 16", "ok")

row("stats", "karpathy-bom", lambda w, d: [write(d, "c.json", b"\xef\xbb\xbf" + w.captions.read_bytes())], "captions:", "ok")

row("stats", "tokenizer-not-on-disk-offline", lambda w, d: [w.captions, "--tokenizer", "no-such-org/no-such-tokenizer"],
    "cannot load the tokenizer 'no-such-org/no-such-tokenizer'")

row("stats", "coco-annotation-repeated", lambda w, d: [coco_annotations(w, d, lambda a: a.append(dict(a[1])))],
    "1 annotation(s) repeat an earlier one", "ok")


@pytest.mark.parametrize("row", table.params())
def test_bad_input(row: Row, world: World, tmp_path):
    check_row(row, world, tmp_path)
