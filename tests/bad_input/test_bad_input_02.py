"""Bad input of 02_scenegraph_captions.py: one row per malformed input (tests/badinput.py runs and checks them)."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from badinput import (
    BINARY,
    Row,
    Table,
    World,
    _must,
    chain_graph,
    check_row,
    copy_to,
    first_group,
    graph,
    group_as_dataset_at,
    h5_changed,
    image_data,
    poke,
    replace_dataset,
    run_stage,
    scene_graphs,
    set_attr,
    sg_args,
    truncated,
    write,
)
from conftest import FIXTURES

table = Table()
row = table.row

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

# -- the demo world's ground truth: 02 --clean-graphs, python -m clid.demo.truth --------------------------
row("02", "clean-graphs-missing", lambda w, d: sg_args(w, d, None, None, "none", "--clean-graphs", d / "nope.json"),
    "no such file|not found")

row("02", "clean-graphs-not-json", lambda w, d: sg_args(w, d, None, None, "none", "--clean-graphs", write(d, "c.json", "[{")),
    "not valid json")

row("02", "clean-graphs-object-no-id",
    lambda w, d: sg_args(w, d, None, None, "none", "--clean-graphs", scene_graphs(d, obj(object_id="DELETE"), "c.json")),
    "--clean-graphs")

row("02", "image-data-duplicate-id", lambda w, d: sg_args(w, d, data=image_data(d, lambda x: x.append(dict(x[0])))), "duplicate image id")

row("02", "image-data-id-7-and-string-7", lambda w, d: sg_args(w, d, data=image_data(d, lambda x: x.append(dict(x[0], image_id=str(x[0]["image_id"]))))),
    "duplicate image id")

row("02", "image-data-id-null", lambda w, d: sg_args(w, d, data=image_data(d, lambda x: x[0].update(image_id=None))), "'image_id' must be")

row("02", "image-data-id-list", lambda w, d: sg_args(w, d, data=image_data(d, lambda x: x[0].update(image_id=[1]))), "'image_id' must be")

row("02", "image-data-width-zero", lambda w, d: sg_args(w, d, data=image_data(d, lambda x: x[0].update(width=0))), "positive numbers")

row("02", "image-data-height-negative", lambda w, d: sg_args(w, d, data=image_data(d, lambda x: x[0].update(height=-5))), "positive numbers")

row("02", "image-data-coco-id-list", lambda w, d: sg_args(w, d, data=image_data(d, lambda x: x[0].update(coco_id=[1, 2]))), "'coco_id' must be")

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

row("02", "out-unrelated-file", lambda w, d: sg_args(w, d) if copy_to(w.selfgen, d, "out.jsonl") else None, "did not write it")

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


@pytest.mark.parametrize("row", table.params())
def test_bad_input(row: Row, world: World, tmp_path):
    check_row(row, world, tmp_path)
