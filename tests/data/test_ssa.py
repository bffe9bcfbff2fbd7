"""CIC-BART-SSA's captions as a source (clid/data/ssa.py, python -m clid.captions convert-ssa) and their
word-count levels as an evaluation level set (07 --levels ssa)."""
import json

import pytest
from conftest import FIXTURES, ROOT, run_script
from toyworld import make_toy_world

from clid.base.files import DataError, read_jsonl, write_jsonl
from clid.data.ssa import load_ssa
from clid.evaluation import metrics

SSA = FIXTURES / "ssa"  # two images written from the released layout, with bad regions


def test_the_loader_reads_the_fixture_and_counts_what_it_leaves_out():
    records, skipped, problems = load_ssa([SSA])
    assert [r["id"] for r in records] == ["1_ssa0", "1_ssa1", "2_ssa0"]
    first = records[0]
    assert first == {"id": "1_ssa0", "image_id": "1", "caption": "a dog sitting on the grass", "objects": [12205688],
                     "source": "ssa", "n_tokens": 7, "level": 1}
    assert records[1]["objects"] == [12205688, "scene"] and records[1]["level"] == 3  # 22 tokens
    assert records[2]["objects"] == [30406070, 5060140150]
    assert skipped == {"malformed region": 2, "an object not grounded ('unknown')": 1,
                       "no word left after preprocessing": 1}
    assert problems == [f"{SSA / '2.json'}: region 1: 'phrase' must be a string",
                        f"{SSA / '2.json'}: region 2: an object has no 'object_id'"]


@pytest.mark.parametrize("content, problem", [
    ([{"phrase": "a dog"}], "expected an object of regions"),
    ("{not json", "not valid JSON"),
])
def test_a_file_that_is_not_an_object_of_regions_is_an_error(tmp_path, content, problem):
    path = tmp_path / "5.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(DataError, match=problem) as err:
        load_ssa([path])
    assert str(path) in str(err.value)


def test_records_that_disagree_with_their_file_are_left_out(tmp_path):
    (tmp_path / "7.json").write_text(json.dumps({
        "0": {"objects": [], "relationships": [], "phrase": "a cat", "region_id": 0, "image_id": 8},
        "1": {"objects": [], "relationships": [], "phrase": "a cat on a mat", "region_id": 5, "image_id": 7},
        "2": {"objects": "dog", "phrase": "a dog"},
        "3": "a dog",
        "4": {"objects": [], "relationships": [], "phrase": "a brown cat", "image_id": 7}}))
    records, skipped, problems = load_ssa([tmp_path])
    assert [r["caption"] for r in records] == ["a brown cat"]
    assert skipped["malformed region"] == 4
    assert [p.split(": ", 2)[2] for p in problems] == ["'image_id' 8 differs from the file's '7'",
                                                       "'region_id' 5 differs from its key '1'",
                                                       "'objects' must be a list of objects",
                                                       "expected a JSON object, got str"]
    with pytest.raises(DataError, match="no such file or folder"):
        load_ssa([tmp_path / "missing"])


def test_convert_ssa_writes_self_generated_captions_for_05_and_06(tmp_path):
    from clid.data.inputs import training_items

    out = tmp_path / "ssa.jsonl"
    proc = run_script("-m", "clid.captions", "convert-ssa", "--ssa", SSA / "1.json", SSA / "2.json", "--out", out)
    assert "left out 2: malformed region" in proc.stdout and "2.json: region 1: 'phrase' must be a string" in proc.stdout
    assert "wrote 3 captions of 2 images" in proc.stdout
    rows = list(read_jsonl(out, required=("id", "image_id", "caption", "objects", "n_tokens", "level")))
    assert len(rows) == 3
    # the stages' loader takes them as self-generated captions of the training images
    captions, _ = make_toy_world(tmp_path, n_train=3, n_val=1, n_test=1)
    items = training_items(captions, out)
    assert items.selfgen.caption_ids == ["1_ssa0", "1_ssa1", "2_ssa0"]
    import shutil

    copy = shutil.copytree(SSA, tmp_path / "ssa")
    before = (copy / "1.json").read_text()
    again = run_script("-m", "clid.captions", "convert-ssa", "--ssa", copy, "--out", copy / "1.json", check=False)
    assert again.returncode != 0 and "is also the input --ssa" in again.stderr  # a file inside a folder given
    assert (copy / "1.json").read_text() == before


# -- the SSA level set in 07 -----------------------------------------------------------------------------


def test_ssa_levels_map_onto_the_model_levels():
    assert metrics.ssa_requests("caption") == [1, 2, 3, 4, 5]
    assert metrics.ssa_requests("labert") == [1, 2, 4, 4, 4]  # (7-9, 10-14, 15-19, 20-25): the nearest
    generated = {1: {"a": "a dog"}, 2: {"a": "x " * 12}, 5: {"a": "y " * 45}, 6: {"a": "z"}}
    remapped, filled = metrics.to_ssa_levels(generated, {5: {"a"}}, "caption")
    assert sorted(remapped) == [1, 2, 3, 4, 5] and remapped[5] == {"a": "y " * 45} and filled[5] == {"a"}
    with pytest.raises(DataError, match="level 6 is outside the 5 SSA levels"):
        metrics.to_ssa_levels(generated, {}, "caption", kind="generated", path="g.jsonl")


def test_ssa_levels_count_words():
    generated = {1: {"1": "a dog on a bed", "2": "a b c d e f g h i j"}, 5: {"1": "w " * 40, "2": "w " * 39}}
    control = metrics.length_control(generated, ["1", "2"], metrics.SSA_LEVELS, words=True)
    assert control[1].lengths == {"1": 5, "2": 10} and control[1].in_range == ["1"]
    assert control[5].lengths == {"1": 40, "2": 39} and control[5].in_range == ["1"]
    assert control[3].summary()["control_precision"] == 0.0  # no caption: a miss


@pytest.mark.slow
def test_07_evaluates_generated_captions_on_the_ssa_levels(tmp_path, fixtures):
    refs = fixtures / "dataset_coco_sample.json"
    test_ids = [str(im["cocoid"]) for im in json.loads(refs.read_text())["images"] if im["split"] == "test"]
    rows = [{"image_id": i, "level": 1, "caption": "a man riding a horse"} for i in test_ids]
    rows += [{"image_id": i, "level": 3, "caption": " ".join(["word"] * 25)} for i in test_ids[:1]]
    write_jsonl(tmp_path / "g.jsonl", rows)
    run_script(ROOT / "07_eval.py", "--refs", refs, "--generated", f"cic={tmp_path / 'g.jsonl'}", "--levels", "ssa",
               "--out", tmp_path / "out", "--spice", "off")
    result = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert result["level_set"] == "ssa" and result["levels"][4] == [40, 100000]
    levels = result["runs"]["cic"]["levels"]
    assert levels["1"]["control_precision"] == 1.0
    assert levels["3"]["control_precision"] == pytest.approx(1 / len(test_ids))
