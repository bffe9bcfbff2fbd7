"""Scene graphs from a generator (the Scene Graph Benchmark's predictions TSV), and 02 reading them
together with Visual Genome graphs."""
import json

import pytest
from conftest import run_one_thread

from clid.base import files
from clid.base.files import DataError
from clid.data.captions import load_karpathy
from clid.data.scenegraphs import detect_graph_format, fill_sizes, load_labelmap, load_sgg, load_sizes


def by_image(graphs):
    return {g.image_id: g for g in graphs}


def test_loader_on_the_fixture(fixtures):
    graphs, problems, dropped = load_sgg(fixtures / "sgg_predictions.tsv", fixtures / "sgg_labelmap.json",
                                              min_object_conf=0.2, min_relation_conf=0.1)
    assert problems == []
    g = by_image(graphs)
    assert list(g) == ["391895", "522418", "318219", "184613"]  # zero-padded keys and COCO file names -> COCO ids
    bike = g["391895"]
    # duplicated labels stay separate objects; the 0.12 helmet is gone; object ids are the line's indices
    assert [(o.object_id, o.name) for o in bike.objects] == [(0, "man"), (1, "bike"), (2, "man"), (3, "road"), (5, "tree")]
    assert bike.objects[3].attributes == ["dirt", "brown"]  # a repeated attribute once
    assert bike.objects[0].box == pytest.approx((290.53, 89.21, 413.84, 299.62))
    # kept: riding, on, the second man on the bike; dropped: wearing (the helmet), near 0.04, on 0.05
    assert [(r.subject_id, r.object_id, r.predicate) for r in bike.relations] == [(0, 1, "riding"), (1, 3, "on"), (2, 1, "on")]
    assert bike.generated and bike.source == str(fixtures / "sgg_predictions.tsv") and bike.width is None
    # label indices through the labelmap: objects, attributes and predicates
    cake = g["522418"]
    assert [(o.object_id, o.name, o.attributes) for o in cake.objects] == [
        (0, "woman", ["smiling"]), (1, "cake", ["white"]), (2, "knife", ["silver"]), (3, "table", ["wooden"]),
        (5, "cake", ["white"])]
    assert [(r.subject_id, r.object_id, r.predicate) for r in cake.relations] == [(0, 2, "holding"), (1, 3, "on"), (5, 3, "on")]
    assert dropped == {"objects below --min-object-conf": 2, "relations below --min-relation-conf": 4,
                       "relations to a removed object": 2}
    # the thresholds are the flags': objects at 0.35 lose the second cake and its relation too
    strict = by_image(load_sgg(fixtures / "sgg_predictions.tsv", fixtures / "sgg_labelmap.json", 0.35, 0.1)[0])
    assert [o.object_id for o in strict["522418"].objects] == [0, 1, 2, 3]
    assert [(r.subject_id, r.object_id) for r in strict["522418"].relations] == [(0, 2), (1, 3)]


def test_sizes_from_the_hw_file_the_images_or_the_boxes(fixtures, tmp_path):
    from PIL import Image

    graphs, _, _ = load_sgg(fixtures / "sgg_predictions.tsv", fixtures / "sgg_labelmap.json")
    used = fill_sizes(graphs, load_sizes(fixtures / "sgg_hw.tsv"))
    assert used == {"the sizes file": 3, "the boxes' extent": 1}
    g = by_image(graphs)
    assert (g["391895"].width, g["391895"].height) == (640, 360)
    assert (g["184613"].width, g["184613"].height) == pytest.approx((470.62, 336.0))  # the boxes' extent
    images = tmp_path / "val2014"
    images.mkdir()
    Image.new("RGB", (500, 336)).save(images / "COCO_val2014_000000184613.jpg")
    used = fill_sizes(graphs, load_sizes(fixtures / "sgg_hw.tsv"), tmp_path)
    assert used == {"the sizes file": 3, "the images": 1} and (g["184613"].width, g["184613"].height) == (500, 336)
    # VG's image_data.json is a sizes file too (keyed by VG id)
    assert load_sizes(fixtures / "vg_image_data_sample.json")["107899"] == (500.0, 375.0)


def test_label_indices_need_the_labelmap(fixtures):
    with pytest.raises(DataError, match=r"sgg_predictions.tsv: line 2 \(image 000000522418\) objects\[0\]: object "
                                        r"class 5 is a label index: give --labelmap"):
        load_sgg(fixtures / "sgg_predictions.tsv")


def write_tsv(tmp_path, lines):
    path = tmp_path / "predictions.tsv"
    path.write_text("".join(f"{key}\t{json.dumps(value) if not isinstance(value, str) else value}\n"
                            for key, value in lines))
    return path


def test_bad_lines_are_named_and_left_out(tmp_path):
    obj = {"rect": [0, 0, 10, 10], "class": "dog", "conf": 0.9}
    path = write_tsv(tmp_path, [
        ("000000000001", {"objects": [obj], "relations": [{"subj_id": 0, "obj_id": 3, "class": "on", "conf": 0.9}]}),
        ("000000000002", {"objects": [dict(obj, rect=[0, 0, "x", 10])]}),
        ("000000000003", "{not json"),
        ("000000000004", {"objects": [obj, dict(obj, conf="high")]}),
        ("000000000005", {"objects": [obj]}),
        ("000000000005", {"objects": [obj]}),
    ])
    graphs, problems, _ = load_sgg(path, strict=False)
    assert [g.image_id for g in graphs] == ["5"]
    assert problems == [("1", "obj_id 3 is not an index into the 1 objects"),
                        ("2", "'rect' must be four numbers [x1, y1, x2, y2], got [0, 0, 'x', 10]"),
                        ("3", "not valid JSON (Expecting property name enclosed in double quotes)"),
                        ("4", "'conf' must be a number, got 'high'"),
                        ("5", "image 5 is listed twice")]
    with pytest.raises(DataError, match=r"predictions.tsv: line 1 \(image 000000000001\) relations\[0\]: obj_id 3"):
        load_sgg(path)


def test_format_detection(fixtures, tmp_path):
    assert detect_graph_format(fixtures / "vg_scene_graphs_sample.json") == "vg"
    assert detect_graph_format(fixtures / "sgg_predictions.tsv") == "sgg"
    other = tmp_path / "graphs.txt"
    other.write_text("dog on grass\n")
    with pytest.raises(DataError, match="unknown scene-graph format .* give --graph-format"):
        detect_graph_format(other)


@pytest.mark.slow
def test_02_on_vg_and_generated_graphs_together(fixtures, tmp_path):
    out = tmp_path / "selfgen.jsonl"
    sgg = fixtures / "sgg_predictions.tsv"
    vg = fixtures / "vg_scene_graphs_sample.json"
    proc = run_one_thread("02_scenegraph_captions.py", "--scene-graphs", sgg, vg,  # VG wins whatever the order
                          "--image-data", fixtures / "vg_image_data_sample.json", "--labelmap",
                          fixtures / "sgg_labelmap.json", "--sizes", fixtures / "sgg_hw.tsv",
                          "--saliency", "none", "--per-image", "3", "--out", out)
    records = list(files.read_jsonl(out))
    assert {r["image_id"] for r in records} == {"318219", "391895", "522418", "184613"}
    assert len(records) == 4 * 3
    # 318219 is in VG (VG image 107899) and in the generated file: it is captioned from its VG graph
    assert {o for r in records if r["image_id"] == "318219" for o in r["objects"]} <= {3001, 3002}
    assert {o for r in records if r["image_id"] == "391895" for o in r["objects"]} <= {0, 1, 2, 3, 5}
    assert f"images from {vg}: 1\n" in proc.stdout  # VG image 1 has no COCO id
    assert f"images from {sgg}: 3 (1 more are taken from an earlier file)" in proc.stdout
    assert (f"{sgg}: generated scene graphs, 4 read (objects conf >= 0.2, relations conf >= 0.1); image sizes from "
            f"the sizes file {fixtures / 'sgg_hw.tsv'} (3), the boxes' extent (1)") in proc.stdout
    assert "left out: 2 objects below --min-object-conf, 4 relations below --min-relation-conf, " \
           "2 relations to a removed object" in proc.stdout
    problems = (tmp_path / "selfgen.jsonl.problems.tsv").read_text()
    assert "1\tskipped\tno COCO id" in problems and "318219" not in problems

    # with the saliency maps of 01 run on the COCO images (keyed by COCO id), for both graph sources
    import h5py
    import numpy as np

    sizes = {"318219": (556, 640), "391895": (640, 360), "522418": (640, 480), "184613": (500, 336)}
    with h5py.File(tmp_path / "saliency.h5", "w") as f:
        for image_id, (width, height) in sizes.items():
            group = f.create_group(image_id)
            group.create_dataset("map", data=np.random.default_rng(0).random((height // 8, width // 8)).astype(np.float16))
            group.attrs.update(width=width, height=height)
    run_one_thread("02_scenegraph_captions.py", "--scene-graphs", vg, sgg, "--image-data",
                   fixtures / "vg_image_data_sample.json", "--labelmap", fixtures / "sgg_labelmap.json",
                   "--sizes", fixtures / "sgg_hw.tsv", "--saliency", tmp_path / "saliency.h5", "--per-image", "3",
                   "--out", tmp_path / "with_maps.jsonl")
    assert {r["image_id"] for r in files.read_jsonl(tmp_path / "with_maps.jsonl")} == set(sizes)
    assert "no saliency map" not in (tmp_path / "with_maps.jsonl.problems.tsv").read_text()


def test_02_with_a_forced_wrong_format_is_one_clear_line(fixtures, tmp_path):
    proc = run_one_thread("02_scenegraph_captions.py", "--scene-graphs", fixtures / "vg_scene_graphs_sample.json",
                          "--graph-format", "sgg", "--saliency", "none", "--out", tmp_path / "s.jsonl", check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "expected an image key, a tab, then a JSON object" in proc.stdout + proc.stderr


def test_flickr30k_with_generated_graphs_only(fixtures, tmp_path):
    """The Flickr30k recipe: the Karpathy split file dataset_flickr30k.json (ids are file-name stems) and generated
    graphs keyed by file name; the self-generated captions reach training for the train images only."""
    from clid.data.inputs import training_items

    karpathy = fixtures / "dataset_flickr30k_sample.json"
    splits = {r.image_id: r.split for r in load_karpathy(karpathy)}
    assert splits == {"1000092795": "train", "10002456": "test"}
    man = {"rect": [120.5, 40.2, 260.8, 330.0], "class": "man", "conf": 0.91, "attr": ["young"]}
    bush = {"rect": [0.0, 150.3, 500.0, 333.0], "class": "bush", "conf": 0.64, "attr": ["green"]}
    hat = {"rect": [140.0, 20.1, 190.6, 60.4], "class": "hat", "conf": 0.72, "attr": ["orange"]}
    tsv = write_tsv(tmp_path, [("1000092795.jpg", {"objects": [man, dict(man, rect=[270.1, 50.0, 380.2, 320.5]), bush],
                                                   "relations": [{"subj_id": 0, "obj_id": 2, "class": "near", "conf": 0.4}]}),
                               ("10002456.jpg", {"objects": [man, hat],
                                                 "relations": [{"subj_id": 0, "obj_id": 1, "class": "wearing", "conf": 0.6}]})])
    out = tmp_path / "selfgen.jsonl"
    proc = run_one_thread("02_scenegraph_captions.py", "--scene-graphs", tsv, "--saliency", "none", "--out", out)
    assert "image sizes from the boxes' extent (2)" in proc.stdout
    records = list(files.read_jsonl(out))
    assert {r["image_id"] for r in records} == set(splits)
    items = training_items(karpathy, out)
    assert set(items.selfgen.image_ids) == {"1000092795"}
    assert items.skipped == {"selfgen: image not in the training split": 5}


def test_bad_labelmap_and_sizes_files(fixtures, tmp_path):
    bad = tmp_path / "labelmap.json"
    bad.write_text(json.dumps({"labels": ["woman", "cake"]}))
    with pytest.raises(DataError, match=r"labelmap.json: top level: expected 'label_to_idx' or 'idx_to_label'"):
        load_labelmap(bad)
    small = tmp_path / "small.json"
    small.write_text(json.dumps({"label_to_idx": {"woman": 5}, "attribute_to_idx": {"smiling": 2}}))
    graphs, problems, _ = load_sgg(fixtures / "sgg_predictions.tsv", small, strict=False)
    assert problems == [("522418", "object index 1 is not in the labelmap")]
    assert [g.image_id for g in graphs] == ["391895", "318219", "184613"]  # the lines with names still load
    hw = tmp_path / "hw.tsv"
    hw.write_text('000000391895\t[{"height": 360, "width": 640}]\n000000000001\t[{"height": 10}]\n')
    with pytest.raises(DataError, match=r'hw.tsv: line 2 \(image 000000000001\): expected an image key, a tab, '
                                        r'then \[\{"height": H, "width": W\}\]'):
        load_sizes(hw)
