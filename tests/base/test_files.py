import json

import numpy as np
import pytest

from clid.base import files
from clid.data.store import FeatureStore


def test_atomic_write_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "out.jsonl"

    def records():
        yield {"a": 1}
        raise RuntimeError("crash in the middle")

    with pytest.raises(RuntimeError):
        files.write_jsonl(target, records())
    assert not target.exists()
    assert list(tmp_path.iterdir()) == []


def test_atomic_write_keeps_the_old_file_on_failure(tmp_path):
    target = tmp_path / "out.jsonl"
    files.write_jsonl(target, [{"a": 1}])
    with pytest.raises(TypeError):
        files.write_jsonl(target, [{"a": object()}])
    assert list(files.read_jsonl(target)) == [{"a": 1}]


def test_jsonl_round_trip_and_errors(tmp_path):
    path = tmp_path / "c.jsonl"
    recs = [{"id": "1_0", "image_id": "1", "caption": "a dog ."}, {"id": "1_1", "image_id": "1", "caption": "café"}]
    assert files.write_jsonl(path, recs) == 2
    assert list(files.read_jsonl(path, required=("id", "caption"))) == recs
    path.write_text(json.dumps(recs[0]) + "\n{broken\n")
    with pytest.raises(files.DataError, match=r"c.jsonl: line 2: not valid JSON"):
        list(files.read_jsonl(path))
    path.write_text(json.dumps({"id": "x"}) + "\n")
    with pytest.raises(files.DataError, match=r"line 1: missing key\(s\) \['caption'\]"):
        list(files.read_jsonl(path, required=("id", "caption")))


def test_h5_groups_and_feature_store(tmp_path):
    path = tmp_path / "features.h5"
    groups = [(str(i), {"features": np.full((3, 8), i, np.float32),
                        "boxes": np.array([[0, 0, 10, 10]] * 3, np.float32)},
               {"width": 100, "height": 80}) for i in (2, 10, 1)]
    assert files.write_h5_groups(path, groups) == 3
    store = FeatureStore(path)
    assert store.ids() == ["1", "2", "10"]
    regions = store.get(10)
    assert regions.features.shape == (3, 8) and regions.features[0, 0] == 10
    assert (regions.width, regions.height) == (100.0, 80.0) and regions.cls_prob is None
    with pytest.raises(files.DataError, match="image 7: no region features"):
        store.get("7")
    assert store.num_classes() == 0
    files.write_h5_groups(path, [("1", {"features": np.zeros((3, 8), np.float32), "boxes": np.zeros((3, 4), np.float32),
                                         "cls_prob": np.full((3, 5), 0.2, np.float32)}, {"width": 10, "height": 10}),
                                 ("2", {"features": np.zeros((3, 8), np.float32), "boxes": np.zeros((3, 4), np.float32),
                                        "cls_prob": np.full((2, 5), 0.2, np.float32)}, {"width": 10, "height": 10})])
    store = FeatureStore(path)
    assert store.num_classes() == 5 and store.get("1").cls_prob.shape == (3, 5)
    with pytest.raises(files.DataError, match=r"image 2: cls_prob \(2, 5\) does not match features \(3, 8\)"):
        store.get("2")


def test_quality_round_trip(tmp_path):
    path = tmp_path / "q.h5"
    files.write_quality(path, ["a", "b"], [-1.0, -2.0], [-1.5, -1.0], [0.5, -1.0])
    q = files.read_quality(path)
    assert list(q["id"]) == ["a", "b"]
    np.testing.assert_allclose(q["u"], [0.5, -1.0])


def test_natural_order():
    assert sorted(["img10", "img2", "1", "b"], key=files.natural_key) == ["1", "b", "img2", "img10"]


@pytest.mark.parametrize("name, problem", [("../x", "path separator"), ("a/b", "path separator"), ("a\\b", "path separator"),
                                           (".", "names a folder"), ("..", "names a folder"), ("", "is empty"),
                                           ("x\ny", "control character"), ("x\x85y", "control character"),
                                           ("n" * 201, "longer than 200 bytes")])
def test_a_name_that_leaves_its_folder_is_named_as_such(name, problem):
    assert problem in files.name_problem(name)


@pytest.mark.parametrize("name", ["1", "v1.2", "..x", "a b", "room101\u00b2", "caf\u00e9", "n" * 200])
def test_a_name_of_its_own_is_kept(name):
    assert files.name_problem(name) is None


@pytest.mark.parametrize("image_id", ["../x", "a/b", ".", "..", ""])
def test_h5_groups_are_never_nested_by_an_id(tmp_path, image_id):
    """The writer of per-image HDF5 groups refuses an id that HDF5 would read as a path; the feature store looks
    such an id up as absent, never as the root group or a nested one."""
    import h5py

    with pytest.raises(files.DataError, match="image id"):
        files.write_h5_groups(tmp_path / "bad.h5", [("1", {"map": np.zeros((2, 2))}, {}),
                                                    (image_id, {"map": np.zeros((2, 2))}, {})])
    assert not (tmp_path / "bad.h5").exists()
    good = tmp_path / "good.h5"
    with h5py.File(good, "w") as f:  # a file written elsewhere, with a nested group
        for key in ("1", "a/b", "x"):
            group = f.create_group(key)
            group.create_dataset("features", data=np.ones((2, 4), np.float32))
            group.create_dataset("boxes", data=np.array([[0, 0, 1, 1]] * 2, np.float32))
            group.attrs.update(width=2.0, height=2.0)
    store = FeatureStore(good, bad="skip")
    assert image_id not in store and not store.holds(image_id)
    assert "1" in store
    with pytest.raises(files.DataError, match="no region features"):
        store.get(image_id)


def test_natural_order_of_digits_that_are_no_numbers():
    """Numbers are ASCII digits: a superscript digit (a digit to str.isdigit, no number to int()) and other
    scripts' digits sort as text."""
    names = ["room101\u00b2", "room2", "room10", "\u0661\u0662"]
    assert sorted(names, key=files.natural_key) == ["room2", "room10", "room101\u00b2", "\u0661\u0662"]


def test_an_output_is_never_an_input_or_another_output_by_any_name(tmp_path):
    """check_outputs follows links: two spellings, a symbolic link, a hard link and a linked folder name one file."""
    import os

    data = tmp_path / "data.json"
    data.write_text("{}")
    (tmp_path / "sub").mkdir()
    (tmp_path / "link.json").symlink_to(data)
    os.link(data, tmp_path / "hard.json")
    (tmp_path / "folder").symlink_to(tmp_path)
    for out in (data, tmp_path / "sub" / ".." / "data.json", tmp_path / "link.json", tmp_path / "hard.json",
                tmp_path / "folder" / "data.json"):
        with pytest.raises(files.DataError, match=f"--out {out} is also the input --in"):
            files.check_outputs({"--out": out}, {"--in": [tmp_path / "other.json", data]})
    with pytest.raises(files.DataError, match="is both --out and --side"):
        files.check_outputs({"--out": tmp_path / "new.h5", "--side": tmp_path / "sub" / ".." / "new.h5"}, {"--in": data})
    files.check_outputs({"--out": tmp_path / "new.h5", "--side": tmp_path / "new.h5.run.json", "unused": None},
                        {"--in": [data, None], "--none": None})  # (nothing shared: no refusal)
