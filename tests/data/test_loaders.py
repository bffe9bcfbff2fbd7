import json

import numpy as np
import pytest

from clid.base.files import DataError
from clid.data.captions import detect_format, load_captions, load_coco_captions, load_karpathy, load_paragraphs
from clid.data.scenegraphs import load_image_data, load_scene_graphs, vg_to_coco_ids
from clid.data.splits import karpathy_test_ids


def test_karpathy_coco(fixtures):
    records = load_karpathy(fixtures / "dataset_coco_sample.json")
    assert [r.image_id for r in records] == ["184613", "318219", "391895", "522418"]
    first = records[0]
    assert first.filename == "val2014/COCO_val2014_000000184613.jpg"
    assert first.split == "train" and len(first.captions) == 5
    assert first.captions[0] == "a child holding a flowered umbrella and petting a yak"
    assert {r.split for r in records} == {"train", "val", "test", "restval"}
    train = load_captions(fixtures / "dataset_coco_sample.json", split_filter="train")
    assert {r.split for r in train} == {"train", "restval"}


def test_karpathy_flickr_uses_filename_stem(fixtures):
    records = load_karpathy(fixtures / "dataset_flickr30k_sample.json")
    assert [r.image_id for r in records] == ["1000092795", "10002456"]
    assert records[0].captions[1] == "two young white males are outside near many bushes"


def test_official_coco_with_split_list(fixtures):
    path = fixtures / "captions_val2014_sample.json"
    records = load_coco_captions(path, splits={"test": fixtures / "test_ids.txt"})
    by_id = {r.image_id: r for r in records}
    assert by_id["391895"].split == "test" and by_id["184613"].split == "train"
    assert by_id["391895"].filename == "COCO_val2014_000000391895.jpg"
    # same captions as the Karpathy file made from the same images
    karpathy = {r.image_id: r for r in load_karpathy(fixtures / "dataset_coco_sample.json")}
    assert by_id["391895"].captions == karpathy["391895"].captions
    assert detect_format(path)[0] == "coco"


def test_karpathy_test_ids_ship_offline():
    ids = karpathy_test_ids()
    assert len(ids) == 5000 and len(set(ids)) == 5000
    assert "391895" in ids  # a well-known Karpathy test image


def test_scene_graphs_with_image_data(fixtures):
    graphs = load_scene_graphs(fixtures / "vg_scene_graphs_sample.json", fixtures / "vg_image_data_sample.json")
    assert [g.image_id for g in graphs] == ["1", "107899"]
    g = graphs[0]
    assert (g.width, g.height) == (800.0, 600.0) and g.coco_id is None
    assert len(g.objects) == 5 and g.objects[0].attributes == ["green", "tall"]
    assert g.objects[1].attributes == []
    assert g.relations[0].predicate == "on"
    assert g.objects[4].name == "lamp post"
    assert graphs[1].coco_id == "318219"
    assert vg_to_coco_ids(load_image_data(fixtures / "vg_image_data_sample.json")) == {"107899": "318219"}


def test_paragraphs_with_splits(fixtures):
    splits = {s: fixtures / f"paragraphs_{s}_split.json" for s in ("train", "val", "test")}
    records = load_paragraphs(fixtures / "paragraphs_v1_sample.json", splits)
    by_id = {r.image_id: r for r in records}
    assert by_id["2317429"].split == "test" and by_id["2356347"].split == "val"
    assert by_id["2388350"].captions[0].startswith("on a white plate is a salad . the salad")
    assert by_id["2388350"].filename == "2388350.jpg"
    assert detect_format(fixtures / "paragraphs_v1_sample.json")[0] == "paragraphs"


def test_stanford_paragraphs_in_their_real_layout(fixtures, tmp_path, capsys):
    # paragraphs_v1.json with train_split.json, val_split.json and test_split.json beside it, as shipped
    folder = fixtures / "stanford_paragraphs"
    records = load_captions(folder / "paragraphs_v1.json")
    assert "left out 1 repeated image id(s) (2356347: the first of each kept) and 1 image(s) in no split file" in capsys.readouterr().err
    by_id = {r.image_id: r for r in records}
    assert sorted(by_id) == ["2317429", "2356347", "2365817", "2407999", "2414610"]   # 2384567: no split
    assert [by_id[i].split for i in ("2356347", "2414610", "2407999")] == ["train", "val", "test"]
    assert by_id["2356347"].filename == "2356347.jpg"
    # every sentence survives preprocessing, with a "." token between sentences and none at the end
    assert by_id["2365817"].captions[0].count(" . ") == 4
    assert by_id["2414610"].captions[0] == ("a woman is standing on a tennis court . she is holding a racket "
                                            "in her right hand . her shirt is white and her skirt is blue")
    assert [r.image_id for r in load_captions(folder / "paragraphs_v1.json", "test")] == ["2407999"]
    # without the split files there is no split information: every split is None
    alone = tmp_path / "paragraphs_v1.json"
    alone.write_text((folder / "paragraphs_v1.json").read_text())
    assert {r.split for r in load_captions(alone)} == {None}


def test_jsonl_captions(tmp_path):
    path = tmp_path / "selfgen.jsonl"
    path.write_text('{"id": "5_0", "image_id": 5, "caption": "A red ball."}\n{"id": "5_1", "image_id": 5, "caption": "a dog"}\n')
    records = load_captions(path)
    assert len(records) == 1 and records[0].captions == ["a red ball", "a dog"]


# ---- bad input: every error names the file, the record and the problem -----------------------

def write(tmp_path, name, obj):
    path = tmp_path / name
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return path


def test_wrong_json_names_file_and_position(tmp_path):
    path = write(tmp_path, "bad.json", '{"images": [\n  {"filename": }\n]}')
    with pytest.raises(DataError, match=r"bad.json: line 2 column \d+: not valid JSON"):
        load_karpathy(path)


def test_missing_key_names_the_record(tmp_path):
    path = write(tmp_path, "k.json", {"images": [{"cocoid": 7, "filename": "a.jpg", "sentences": []}]})
    with pytest.raises(DataError, match=r"k.json: images\[0\] \(image 7\): missing key 'split'"):
        load_karpathy(path)
    path = write(tmp_path, "c.json", {"images": [{"id": 1, "file_name": "x.jpg"}], "annotations": [{"image_id": 1}]})
    with pytest.raises(DataError, match=r"annotations\[0\]: missing key 'caption'"):
        load_coco_captions(path)
    path = write(tmp_path, "c2.json", {"images": [], "annotations": [{"image_id": 3, "caption": "x"}]})
    with pytest.raises(DataError, match="caption of image 3, which is not in 'images'"):
        load_coco_captions(path)


def vg(objects, relationships, image_id=9):
    return [{"image_id": image_id, "objects": objects, "relationships": relationships}]


OBJ = [{"object_id": 1, "x": 0, "y": 0, "w": 10, "h": 10, "names": ["dog"]},
       {"object_id": 2, "x": 5, "y": 5, "w": 10, "h": 10, "names": ["ball"]}]


def test_relationship_to_missing_object(tmp_path):
    path = write(tmp_path, "sg.json", vg(OBJ, [{"subject_id": 1, "object_id": 77, "predicate": "chasing"}]))
    with pytest.raises(DataError, match=r"sg.json: \[0\] \(image 9\) relationships\[0\]: object 77 names an object that does not exist"):
        load_scene_graphs(path)


def test_box_outside_its_image(tmp_path):
    path = write(tmp_path, "sg.json", vg(OBJ, []))
    sizes = write(tmp_path, "image_data.json", [{"image_id": 9, "width": 12, "height": 40, "coco_id": None}])
    with pytest.raises(DataError, match=r"\(image 9\): object 2 box .* outside the 12x40 image"):
        load_scene_graphs(path, sizes)


def test_missing_object_key(tmp_path):
    path = write(tmp_path, "sg.json", vg([{"object_id": 1, "x": 0, "y": 0, "w": 10, "names": ["dog"]}], []))
    with pytest.raises(DataError, match=r"objects\[0\]: missing key 'h'"):
        load_scene_graphs(path)


def test_lenient_mode_collects_problems(tmp_path):
    graphs = vg(OBJ, []) + vg(OBJ, [{"subject_id": 1, "object_id": 5, "predicate": "on"}], image_id=10)
    path = write(tmp_path, "sg.json", graphs)
    good, problems = load_scene_graphs(path, strict=False)
    assert [g.image_id for g in good] == ["9"]
    assert problems == [("10", "object 5 names an object that does not exist in this graph")]


def test_large_caption_files_show_progress_while_read(tmp_path, monkeypatch, capsys):
    """From clid.base.progress.LARGE records on (COCO: 414,113 captions), both loaders print plain progress
    lines (no terminal here) and read every caption; smaller files stay silent."""
    from clid.base.progress import LARGE

    monkeypatch.setenv("CLID_PROGRESS_SECONDS", "0")
    n_images = LARGE // 5
    images = [{"id": i, "file_name": f"COCO_train2014_{i:012d}.jpg"} for i in range(n_images)]
    annotations = [{"id": k, "image_id": k % n_images, "caption": f"A dog number {k} on the grass."} for k in range(LARGE)]
    coco = tmp_path / "captions_train2014.json"
    coco.write_text(json.dumps({"images": images, "annotations": annotations}))
    records = load_coco_captions(coco)
    assert sum(len(r.captions) for r in records) == LARGE and records[1].captions[0] == "a dog number 1 on the grass"
    lines = capsys.readouterr().out.splitlines()
    assert lines and lines[-1].startswith(f"reading captions_train2014.json: caption {LARGE}/{LARGE} (100%)")

    karpathy = tmp_path / "dataset_coco.json"
    karpathy.write_text(json.dumps({"images": [{"filename": f"{i}.jpg", "cocoid": i, "split": "train", "sentences": [
        {"raw": "A dog."}]} for i in range(LARGE)]}))
    assert len(load_karpathy(karpathy)) == LARGE
    assert capsys.readouterr().out.splitlines()[-1].startswith(f"reading dataset_coco.json: image {LARGE}/{LARGE} (100%)")
    karpathy.write_text(json.dumps({"images": [{"filename": "1.jpg", "cocoid": 1, "split": "train", "sentences": [
        {"raw": "A dog."}]}]}))
    load_karpathy(karpathy)
    assert capsys.readouterr().out == ""


def test_a_loader_process_refuses_a_feature_file_replaced_since_the_run_opened_it(tmp_path):
    """A loader process opens the feature file again (FeatureStore.reopened): the same file opens, one replaced
    or rewritten meanwhile is one DataError, so that a run never reads two files as one."""
    import os
    import shutil

    import pytest
    from toyworld import make_toy_world

    from clid.base.files import DataError
    from clid.data.store import FeatureStore

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _, features = make_toy_world(tmp_path / "a", n_train=4, n_val=1, n_test=1)
    _, other = make_toy_world(tmp_path / "b", n_train=5, n_val=1, n_test=1, seed=1)
    store = FeatureStore(features)
    again = store.reopened()
    assert again.path == store.path and again.ids() == store.ids()
    shutil.copy(other, tmp_path / "new.h5")
    os.replace(tmp_path / "new.h5", features)  # (as a rerun of a writer replaces its output)
    with pytest.raises(DataError, match="the file was replaced while it was read"):
        store.reopened()
    replaced = FeatureStore(features)
    with open(features, "r+b") as f:  # (rewritten in place: same inode, another size or time)
        f.seek(0, os.SEEK_END)
        f.write(b"\0" * 16)
    with pytest.raises(DataError, match="the file was rewritten while it was read"):
        replaced.reopened()


def test_float16_values_decode_to_float32_exactly(tmp_path):
    """decode_values converts float16 with torch (vectorised): the same float32 bits as numpy's conversion,
    subnormals, the largest value, infinities and NaN included."""
    import h5py

    from clid.data.store import decode_values

    values = np.random.default_rng(0).standard_normal((7, 300)).astype(np.float16)
    values[0, :6] = [6e-8, -6e-8, 65504, -65504, np.inf, np.nan]
    with h5py.File(tmp_path / "f.h5", "w") as f:
        f["x"] = values
        decoded = decode_values(f["x"], tmp_path / "f.h5", "image 1")
    assert decoded.dtype == np.float32 and decoded.flags.writeable
    assert np.array_equal(decoded.view(np.uint32), values.astype(np.float32).view(np.uint32))


def copy_features(source, target, arrays) -> None:
    """A copy of a feature file, its attributes kept and each image's datasets ``arrays(group)``."""
    import h5py

    with h5py.File(source) as src, h5py.File(target, "w") as dst:
        dst.attrs.update(src.attrs)
        for key, group in src.items():
            out = dst.create_group(key)
            out.attrs.update(group.attrs)
            for name, values in arrays(group).items():
                out[name] = values


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_feature_file_written_big_endian_reads_as_the_native_one(tmp_path, dtype):
    """Every array of a feature file stored big-endian (features, boxes, class probabilities, confidences)
    reads as the same file in this machine's byte order: the same regions, the same stored dtype."""
    import torch
    from toyworld import make_toy_world

    from clid.data.store import FeatureStore, load_regions

    _, features = make_toy_world(tmp_path, n_train=4, n_val=1, n_test=1)
    swapped, native = tmp_path / "big.h5", tmp_path / "native.h5"
    copy_features(features, swapped, lambda group: {
        "features": group["features"][()].astype(">f2" if dtype == "float16" else ">f4"),
        "boxes": group["boxes"][()].astype(">f8"),
        "cls_prob": np.full((len(group["boxes"]), 5), 0.2, ">f4"),
        "confidence": np.linspace(0.1, 0.9, len(group["boxes"])).astype(">f4")})
    copy_features(swapped, native, lambda group: {
        name: group[name][()].astype(group[name].dtype.newbyteorder("=")) for name in group})
    big, little = FeatureStore(swapped), FeatureStore(native)
    assert big.dtype == little.dtype == dtype and big.ids() == little.ids()
    for image_id in big.ids():
        assert big.problem(image_id) is None
        for a, b in zip(load_regions(big, image_id, 5), load_regions(little, image_id, 5)):
            assert a.dtype == b.dtype and torch.equal(a, b)
