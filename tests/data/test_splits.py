"""Real data in, nothing leaked: the COCO converter, the split guards of 04/05/06, python -m clid.stats --split
and 07's coverage lines, on the real COCO 2014 caption files where it matters."""
import json

import pytest
from conftest import ROOT, run_script
from toyworld import make_toy_world

from clid.base.files import DataError
from clid.base.text import karpathy_tokens
from clid.data.captions import load_karpathy
from clid.data.inputs import training_items
from clid.data.splits import SPLIT_FIX, convert_coco, karpathy_test_ids, training_records, val_rank


@pytest.fixture(scope="module")
def converted(coco_annotations, tmp_path_factory):
    """The real train2014 + val2014 caption files converted by ``python -m clid.captions convert-coco``."""
    out = tmp_path_factory.mktemp("converted") / "karpathy.json"
    proc = run_script("-m", "clid.captions", "convert-coco", "--captions", coco_annotations / "captions_train2014.json",
                      coco_annotations / "captions_val2014.json", "--out", out)
    return out, proc.stdout


@pytest.mark.slow
def test_converter_on_the_real_coco_files_gives_karpathy_splits(converted):
    out, stdout = converted
    assert "splits: train 113,287 / val 5,000 / test 5,000 images" in stdout
    records = load_karpathy(out)
    by_split = {}
    for r in records:
        by_split.setdefault(r.split, set()).add(r.image_id)
    assert {k: len(v) for k, v in by_split.items()} == {"train": 113287, "val": 5000, "test": 5000}
    assert by_split["test"] == set(karpathy_test_ids())
    assert not by_split["test"] & (by_split["train"] | by_split["val"])
    # val is drawn from val2014 only; train holds all of train2014 and the rest of val2014
    folders = {r.image_id: r.filename.split("/")[0] for r in records}
    assert {folders[i] for i in by_split["val"]} == {"val2014"}
    assert sum(folders[i] == "train2014" for i in by_split["train"]) == 82783
    # the documented rule: the 5,000 non-test val2014 images with the smallest SHA-1 of their id
    candidates = sorted((i for i, f in folders.items() if f == "val2014" and i not in by_split["test"]),
                        key=val_rank)
    assert set(candidates[:5000]) == by_split["val"]
    # Karpathy fields, and captions equal to those of the official file
    with open(out) as f:
        head = f.read(4000)
    first, _ = json.JSONDecoder().raw_decode(head, head.index("[") + 1)
    assert set(first) == {"cocoid", "filepath", "filename", "split", "sentences"}
    assert first["filename"] == f"COCO_{first['filepath']}_{first['cocoid']:012d}.jpg"
    assert all(s["tokens"] == karpathy_tokens(s["raw"]) for s in first["sentences"])
    assert sum(len(r.captions) for r in records) == 414113 + 202654
    # and it trains: the guard accepts it, the test images stay out
    items = training_items(out)
    assert len(set(items.trusted.image_ids)) == 113287 and len(items.val_ids) == 5000


def test_converter_takes_val_and_restval_from_a_karpathy_file(fixtures, tmp_path):
    out = tmp_path / "k.json"
    proc = run_script("-m", "clid.captions", "convert-coco", "--captions", fixtures / "captions_val2014_sample.json",
                      "--karpathy", fixtures / "dataset_coco_sample.json", "--out", out)
    given = {r.image_id: r.split for r in load_karpathy(fixtures / "dataset_coco_sample.json")}
    converted = {r.image_id: r for r in load_karpathy(out)}
    assert {i: r.split for i, r in converted.items()} == given  # train, val, test and restval as in the Karpathy split file
    assert converted["391895"].filename == "val2014/COCO_val2014_000000391895.jpg"
    assert "warning: 4999 of the 5000 Karpathy test images are not in the captions files" in proc.stdout


def test_converter_val_draw_does_not_depend_on_file_order(fixtures, tmp_path):
    """Without --karpathy: val is the smallest SHA-1 ids among non-test val2014 images, whatever the order."""
    sample = json.loads((fixtures / "captions_val2014_sample.json").read_text())
    halves = []
    for k, images in enumerate((sample["images"][:2], sample["images"][2:])):
        ids = {im["id"] for im in images}
        part = dict(sample, images=images, annotations=[a for a in sample["annotations"] if a["image_id"] in ids])
        halves.append(tmp_path / f"part{k}.json")
        halves[-1].write_text(json.dumps(part))
    one, _ = convert_coco(halves, val_size=1)
    two, notes = convert_coco(halves[::-1], val_size=1)
    assert one == two
    splits = {im["cocoid"]: im["split"] for im in one["images"]}
    non_test = sorted((str(i) for i, s in splits.items() if s != "test"), key=val_rank)
    assert splits[391895] == "test" and [i for i, s in splits.items() if s == "val"] == [int(non_test[0])]
    assert any(line.startswith("splits: train 2 / val 1 / test 1") for line in notes)


def test_converter_rejects_an_image_in_two_files(fixtures, tmp_path):
    path = fixtures / "captions_val2014_sample.json"
    proc = run_script("-m", "clid.captions", "convert-coco", "--captions", path, path, "--out", tmp_path / "k.json",
                      check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == f"error: {path}: image 184613: is also in {path}"
    assert not (tmp_path / "k.json").exists()


# ---- split guards ---------------------------------------------------------------------------

@pytest.mark.slow
def test_04_refuses_the_official_val2014_file(coco_annotations, tmp_path):
    _, features = make_toy_world(tmp_path)
    proc = run_script("04_train_base.py", "--captions", coco_annotations / "captions_val2014.json",
                      "--features", features, "--out", tmp_path / "run", "--preset", "tiny", "--max-steps", "1",
                      "--warmup", "0", check=False, env={"OMP_NUM_THREADS": "1"})
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"error: {coco_annotations / 'captions_val2014.json'}: this official COCO captions file "
                               "has no train/val/test split, so training would use test images; convert it with "
                               "`python -m clid.captions convert-coco")
    assert "--test-ids FILE" in lines[0] and "--no-split-check" in lines[0]
    assert not (tmp_path / "run" / "model.safetensors").exists()


@pytest.mark.slow
def test_test_ids_hold_the_karpathy_test_images_out(coco_annotations):
    items = training_items(coco_annotations / "captions_val2014.json", test_ids="karpathy")
    trained = set(items.trusted.image_ids)
    assert len(trained) == 40504 - 5000 and not trained & set(karpathy_test_ids())
    assert items.notes == ["held out of training and validation: 5000 images of --test-ids karpathy"]
    everything = training_items(coco_annotations / "captions_val2014.json", split_check=False)
    assert len(set(everything.trusted.image_ids)) == 40504


def leaky_karpathy(fixtures, tmp_path, **extra):
    """The Karpathy sample with its test image 391895 relabelled as train."""
    sample = json.loads((fixtures / "dataset_coco_sample.json").read_text())
    for image in sample["images"]:
        if image["cocoid"] == 391895:
            image["split"] = "train"
    sample.update(extra)
    path = tmp_path / "leaky.json"
    path.write_text(json.dumps(sample))
    return path


def test_coco_training_images_must_not_be_karpathy_test_images(fixtures, tmp_path):
    path = leaky_karpathy(fixtures, tmp_path)
    with pytest.raises(DataError, match=r"leaky.json: 1 training images are Karpathy test images \(first: 391895\); "
                                        r"convert it with"):
        training_items(path)
    items = training_items(path, test_ids=fixtures / "test_ids.txt")  # 391895 held out
    assert "391895" not in items.trusted.image_ids
    assert "391895" in training_items(path, split_check=False).trusted.image_ids
    # the same ids in a non-COCO dataset (no "dataset": "coco", no COCO file names) are not COCO ids
    sample = json.loads(path.read_text())
    for image in sample["images"]:
        image["filename"] = f"{image['cocoid']}.jpg"
    other = tmp_path / "other.json"
    other.write_text(json.dumps(dict(sample, dataset="mine")))
    assert "391895" in training_items(other).trusted.image_ids


def test_jsonl_captions_have_no_splits(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text('{"image_id": "7", "caption": "a dog"}\n')
    with pytest.raises(DataError, match="this JSONL captions file has no train/val/test split"):
        training_items(path)


@pytest.mark.slow
def test_06_refuses_a_leaky_file_with_one_line(fixtures, tmp_path):
    _, features = make_toy_world(tmp_path)
    selfgen = tmp_path / "selfgen.jsonl"
    selfgen.write_text('{"id": "391895_0", "image_id": "391895", "caption": "a dog"}\n')
    proc = run_script("06_train_selection.py", "--captions", leaky_karpathy(fixtures, tmp_path), "--selfgen", selfgen,
                      "--quality", tmp_path / "none.h5", "--features", features, "--out", tmp_path / "run",
                      "--preset", "tiny", check=False, env={"OMP_NUM_THREADS": "1"})
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'leaky.json'}: 1 training images are Karpathy test images (first: 391895); "
        + SPLIT_FIX]


# ---- python -m clid.stats --split ---------------------------------------------------------------------

def test_stats_split_on_a_file_without_splits_is_an_error(fixtures):
    path = fixtures / "captions_val2014_sample.json"
    proc = run_script("-m", "clid.stats", path, "--split", "test", check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == (f"error: {path}: this official COCO captions file has no splits, so --split test "
                                   "selects nothing; convert it with `python -m clid.captions convert-coco`, or leave out --split")


def test_stats_split_without_captions_is_an_error(fixtures):
    path = fixtures / "dataset_coco_sample.json"
    proc = run_script("-m", "clid.stats", path, "--split", "tset", check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip() == f"error: {path}: no caption of split 'tset' (splits here: ['restval', 'test', 'train', 'val'])"
    test = json.loads(run_script("-m", "clid.stats", path, "--split", "test", "--json").stdout.splitlines()[-1])
    assert test["n"] == 5


# ---- 07: which test images have a caption ---------------------------------------------------

def write_generated(path, rows):
    path.write_text("".join(json.dumps(dict(zip(("image_id", "level", "caption"), row))) + "\n" for row in rows))
    return path


@pytest.mark.slow
def test_07_fails_when_no_caption_is_of_a_test_image(fixtures, tmp_path):
    mine = write_generated(tmp_path / "mine.jsonl", [("COCO_val2014_000000391895", 2, "a man on a bike"),
                                                     ("COCO_val2014_000000522418", 2, "a woman with a cake")])
    proc = run_script(ROOT / "07_eval.py", "--refs", fixtures / "dataset_coco_sample.json", "--generated", mine,
                      "--out", tmp_path / "eval", "--spice", "off", check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: {mine}: none of its captions is of a test image (first unmatched image id: "
        "'COCO_val2014_000000391895'; test image ids look like '391895')")
    assert not (tmp_path / "eval" / "metrics.json").exists()


@pytest.mark.slow
def test_07_prints_how_many_test_images_have_a_caption(fixtures, tmp_path):
    refs = tmp_path / "refs.json"
    sample = json.loads((fixtures / "dataset_coco_sample.json").read_text())
    for image in sample["images"]:
        image["split"] = "test"  # four test images
    refs.write_text(json.dumps(sample))
    bike = "a man with a red helmet riding a bike down a dirt road next to a field of tall green grass"
    rows = [("391895", n, " ".join(bike.split()[:4 + 5 * n])) for n in range(1, 5)]  # every level
    mine = write_generated(tmp_path / "mine.jsonl", rows + [("522418", 1, "a woman cutting a cake")])
    proc = run_script(ROOT / "07_eval.py", "--refs", refs, "--generated", mine, "--levels", "labert",
                      "--out", tmp_path / "eval", "--spice", "off")
    assert ("mine: 2 of 4 test images have a caption, 1 at each of the 4 levels it holds (L1, L2, L3, L4); 2 have "
            "none (they count as misses)") in proc.stdout


@pytest.mark.slow
def test_07_fails_on_an_empty_generated_file(fixtures, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    proc = run_script(ROOT / "07_eval.py", "--refs", fixtures / "dataset_coco_sample.json", "--generated", empty,
                      "--out", tmp_path / "eval", "--spice", "off", check=False)
    assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1] == f"error: {empty}: holds no captions"


def test_paragraphs_train_on_their_split_files_only(fixtures, tmp_path):
    """The Stanford paragraphs take their splits from the split files beside them; without the files
    training is refused (the file alone says nothing about which images are test images)."""
    import shutil

    folder = fixtures / "stanford_paragraphs"
    train, val, _ = training_records(folder / "paragraphs_v1.json")
    expected = {str(i) for i in json.loads((folder / "train_split.json").read_text())}
    assert {r.image_id for r in train} == expected and {r.split for r in train} == {"train"}
    test = {str(i) for i in json.loads((folder / "test_split.json").read_text())}
    assert not test & ({r.image_id for r in train} | {r.image_id for r in val})
    shutil.copy(folder / "paragraphs_v1.json", tmp_path / "paragraphs_v1.json")
    with pytest.raises(DataError, match="no train/val/test split.*train_split.json"):
        training_records(tmp_path / "paragraphs_v1.json")
