"""07_eval.py and clid.evaluation.metrics on real COCO captions: the numbers equal pycocoevalcap's own, the
control precision counts every test image, the checkpoint path generates, caches and reports."""
import os
import time
from collections import defaultdict

import numpy as np
import pytest
from conftest import ROOT, import_script, run_script

from clid.base.files import DataError, read_json, write_h5_groups, write_json, write_jsonl
from clid.base.text import LEVEL_SETS, caption_length, caption_lengths
from clid.caption.cached import generate_cached
from clid.data.store import FeatureStore
from clid.evaluation import metrics
from clid.evaluation.report import run_ids, run_list
from clid.model.captioner import CaptionerConfig, build_model
from clid.model.checkpoints import load_checkpoint, save_model

QUALITY = ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr")


def coco_val_captions(coco_annotations) -> dict[int, list[str]]:
    data = read_json(coco_annotations / "captions_val2014.json")
    captions = defaultdict(list)
    for ann in data["annotations"]:
        captions[ann["image_id"]].append(ann["caption"].strip())
    return data, captions


def joined(a: str, b: str) -> str:
    """Two captions as one longer one: "A dog on a bed and a cat next to it"."""
    return f"{a.rstrip(' .')} and {b[0].lower()}{b[1:]}"


def pycocoevalcap_direct(refs: dict, hyps: dict, meteor) -> dict:
    """What COCOEvalCap.evaluate computes, called the way it calls the scorers."""
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.rouge.rouge import Rouge
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    tokenizer = PTBTokenizer()
    gts = tokenizer.tokenize({i: [{"caption": c} for c in refs[i]] for i in hyps})
    res = tokenizer.tokenize({i: [{"caption": hyps[i]}] for i in hyps})
    bleu, _ = Bleu(4).compute_score(gts, res)
    out = dict(zip(QUALITY[:4], bleu))
    out["METEOR"] = meteor.compute_score(gts, res)[0]
    out["ROUGE_L"] = Rouge().compute_score(gts, res)[0]
    out["CIDEr"] = Cider().compute_score(gts, res)[0]
    return out


# ---------------------------------------------------------------------------------------------
# --generated equals pycocoevalcap called directly


@pytest.mark.slow
def test_generated_equals_pycocoevalcap_on_real_coco(coco_annotations, tmp_path):
    """120 real COCO val images: the shortest caption is the level-1 "generation", the longest the
    level-2 one, the two joined the level-3 one; the other captions are the references."""
    data, captions = coco_val_captions(coco_annotations)
    chosen = sorted(captions)[::250][:150]
    test_ids, other_ids = chosen[:120], chosen[120:]
    generated, used = [], defaultdict(set)
    for n, image_id in enumerate(test_ids):
        ordered = sorted(captions[image_id], key=len)
        short, long = ordered[0], ordered[-1]
        used[image_id] |= {short, long}
        generated.append({"image_id": image_id, "level": 1, "caption": "" if n == 7 else short})
        if n >= 5:  # the first five images get no level-2 caption: misses
            generated.append({"image_id": image_id, "level": 2, "caption": long})
        generated.append({"image_id": image_id, "level": 3, "caption": joined(short, long)})
    generated.append({"image_id": other_ids[0], "level": 1, "caption": captions[other_ids[0]][0]})
    keep = set(chosen)
    coco = {"images": [im for im in data["images"] if im["id"] in keep],
            "annotations": [a for a in data["annotations"]
                            if a["image_id"] in keep and a["caption"].strip() not in used[a["image_id"]]]}
    write_json(tmp_path / "captions.json", coco)
    (tmp_path / "test_ids.txt").write_text("\n".join(map(str, test_ids + [1, 2])) + "\n")
    write_jsonl(tmp_path / "mine.jsonl", generated)

    out = tmp_path / "eval"
    run_script(ROOT / "07_eval.py", "--refs", tmp_path / "captions.json", "--test-ids", tmp_path / "test_ids.txt",
               "--generated", tmp_path / "mine.jsonl", "--out", out, "--spice", "off")
    result = read_json(out / "metrics.json")
    assert result["n_test_images"] == 120 and result["skipped"]["test ids without an image in --refs"] == 2
    run = result["runs"]["mine"]
    assert run["skipped"]["captions of images outside the test images"] == 1

    from pycocoevalcap.meteor.meteor import Meteor

    refs = defaultdict(list)
    for a in coco["annotations"]:
        refs[str(a["image_id"])].append(a["caption"])
    meteor = Meteor()
    for level, (low, high) in enumerate(LEVEL_SETS["caption"][:3], 1):
        given = {str(g["image_id"]): g["caption"] for g in generated
                 if g["level"] == level and g["image_id"] in test_ids and g["caption"]}
        lengths = dict(zip(given, caption_lengths(list(given.values()))))
        in_range = {i: c for i, c in given.items() if low <= lengths[i] <= high}
        row = run["levels"][str(level)]
        assert row["n_images"] == 120 and row["n_in_range"] == len(in_range) > 10
        assert row["control_precision"] == pytest.approx(len(in_range) / 120)  # all images in the denominator
        assert row["n_missing"] == 120 - len(given)
        assert row["length_error"] == pytest.approx(
            np.mean([max(low - n, 0, n - high) for n in lengths.values()]))
        expected = pycocoevalcap_direct(refs, in_range, meteor)
        for name in QUALITY:
            assert row[name] == pytest.approx(expected[name], rel=1e-9, abs=1e-12), (level, name)
    assert run["levels"]["1"]["n_empty"] == 1 and run["levels"]["2"]["n_missing"] == 5
    assert 0 < run["levels"]["3"]["control_precision"] < 1  # some joined captions overshoot 29 tokens
    assert run["levels"]["4"]["n_captions"] == 0 and run["levels"]["4"]["CIDEr"] is None
    assert result["spice"].startswith("n/a")
    del meteor


# ---------------------------------------------------------------------------------------------
# The checkpoint path, with a stand-in captioner


def load_eval_script():
    return import_script("07_eval.py", "eval_script_07")


class FakeCaptioner:
    """Stands in for a trained model: 'trusted' answers every level with one COCO caption,
    'clid' joins captions until it reaches the requested length."""

    levels = LEVEL_SETS["caption"]
    config = CaptionerConfig(region_dim=8)  # what it reads: the 8-d features of demo_like_world

    def __init__(self, path, pool):
        self.name, self.pool, self.tokenizer = os.path.basename(path), pool, None

    def caption(self, image_id, level) -> str:
        pool = self.pool[image_id]
        text = pool[0]
        if self.name == "trusted":
            return text
        low = self.levels[level - 1][0]
        for extra in pool[1:]:
            if caption_length(text) >= low:
                break
            text = joined(text, extra)
        return text


@pytest.fixture
def demo_like_world(coco_annotations, tmp_path):
    """Karpathy refs (30 test, 10 train images), long refs, features for 28 test images, a
    self-generated file, and two checkpoint folders."""
    _, captions = coco_val_captions(coco_annotations)
    ids = [i for i in sorted(captions) if len(captions[i]) >= 5][1::400][:40]
    images, pool, long_images = [], {}, []
    for n, image_id in enumerate(ids):
        caps = captions[image_id]
        split = "test" if n < 30 else "train"
        images.append({"cocoid": image_id, "filename": f"{image_id}.jpg", "split": split,
                       "sentences": [{"raw": c, "tokens": c.lower().split()} for c in caps[:3]]})
        pool[str(image_id)] = caps[3:] + caps[:3]
        if split == "test":
            sentences = []
            for a, b, c in ((0, 1, 2), (1, 2, 0), (2, 0, 1)):
                for text in (joined(caps[a], caps[b]), joined(joined(caps[a], caps[b]), caps[c])):
                    level = (caption_length(text) // 10) + 1
                    if level in (3, 4):
                        sentences.append({"raw": text, "level": level})
            long_images.append({"cocoid": image_id, "filename": f"{image_id}.jpg", "split": "test",
                                "sentences": sentences})
    write_json(tmp_path / "captions.json", {"images": images})
    write_json(tmp_path / "long_refs.json", {"images": long_images})
    rng = np.random.default_rng(0)
    test_ids = [str(i) for i in ids[:30]]
    write_h5_groups(tmp_path / "features.h5",
                    [(i, {"features": rng.normal(size=(4, 8)).astype(np.float32),
                          "boxes": np.array([[0, 0, 10, 10]] * 4, np.float32)}, {"width": 64, "height": 48})
                     for i in test_ids[2:]])  # two test images have no features
    write_jsonl(tmp_path / "selfgen.jsonl", [{"id": f"{i}-0", "image_id": i, "caption": joined(*pool[i][:2])}
                                             for i in test_ids])
    for name in ("trusted", "clid"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_bytes(name.encode())
    return tmp_path, test_ids, pool


def install_fake_captioner(monkeypatch, pool, calls):
    def generate_captions(model, features, image_ids, levels, batch_size=64, device="cpu", steps=None,
                          eos_decay=1.0, labert_average=True, progress=False, return_filled=False, precision="fp32",
                          block_ngram=0, length=None):
        assert isinstance(features, FeatureStore) and progress and return_filled
        assert precision == "fp32"  # (--precision auto on the CPU)
        assert block_ngram == 0  # 07 decodes as the authors do
        calls.append((model.name, list(image_ids), list(levels), batch_size, device, steps, eos_decay, labert_average))
        captions = {level: {i: model.caption(i, level) for i in image_ids if features.get(i) is not None}
                    for level in levels}
        return captions, {level: set() for level in levels}

    monkeypatch.setattr("clid.model.checkpoints.load_checkpoint", lambda path, device="cpu": FakeCaptioner(path, pool))
    monkeypatch.setattr("clid.model.checkpoints.read_config", lambda path: {"model": {}})  # (no kind: not checked)
    monkeypatch.setattr("clid.model.decode.generate_captions", generate_captions)


@pytest.mark.slow
def test_checkpoint_runs_generate_cache_and_report(demo_like_world, monkeypatch):
    world, test_ids, pool = demo_like_world
    calls = []
    install_fake_captioner(monkeypatch, pool, calls)
    script = load_eval_script()
    out = world / "eval"
    argv = ["--refs", str(world / "captions.json"), "--features", str(world / "features.h5"),
            "--checkpoint", str(world / "trusted"), "--checkpoint", str(world / "clid"),
            "--long-refs", str(world / "long_refs.json"), "--selfgen", str(world / "selfgen.jsonl"),
            "--out", str(out), "--batch-size", "16"]
    script.main(argv)

    assert [c[0] for c in calls] == ["trusted", "clid"]
    assert calls[0][1] == test_ids[2:] and calls[0][2] == list(range(1, 8))
    assert calls[0][3:] == (16, "cpu", None, 1.0, True)  # the authors' decoding unless told otherwise
    result = read_json(out / "metrics.json")
    assert list(result["runs"]) == ["trusted", "clid"] and result["level_set"] == "caption"
    for name in ("trusted", "clid"):
        run = result["runs"][name]
        assert run["skipped"]["test images without region features (counted as misses)"] == 2
        model = FakeCaptioner(name, pool)
        for level, (low, high) in enumerate(LEVEL_SETS["caption"], 1):
            hits = sum(low <= caption_length(model.caption(i, level)) <= high for i in test_ids[2:])
            row = run["levels"][str(level)]
            assert row["n_images"] == 30 and row["n_missing"] == 2
            assert row["control_precision"] == pytest.approx(hits / 30)
    trusted, clid = result["runs"]["trusted"]["levels"], result["runs"]["clid"]["levels"]
    assert trusted["3"]["control_precision"] < 0.1 and clid["3"]["control_precision"] > 0.5
    assert clid["2"]["CIDEr"] > 0.5 and trusted["4"]["n_in_range"] == 0 and trusted["4"]["CIDEr"] is None

    long_refs = read_json(world / "long_refs.json")["images"]
    for level in ("3", "4"):
        with_refs = sum(any(s["level"] == int(level) for s in im["sentences"]) for im in long_refs)
        row = result["runs"]["clid"]["long_refs"][level]
        assert row["n_images"] == with_refs > 0 and row["n_scored"] <= with_refs
    assert result["runs"]["clid"]["long_refs"]["3"]["n_scored"] > 0
    assert result["runs"]["clid"]["long_refs"]["3"]["CIDEr"] > 0

    report = (out / "report.md").read_text()
    for text in ("Control precision (%)", "| trusted |", "| clid |", "Against the long references",
                 "### Image", "long reference, level 3", "![control_precision.png]", "SPICE"):
        assert text in report, text
    for png in ("control_precision.png", "quality_vs_control.png", "length_histograms.png"):
        blob = (out / png).read_bytes()
        assert blob.startswith(b"\x89PNG") and len(blob) > 10_000
    cached = metrics.read_generated(out / "generated" / "clid.jsonl")
    assert cached[3][test_ids[5]] == FakeCaptioner("clid", pool).caption(test_ids[5], 3)

    # a re-run reuses the generated captions and gives the same numbers
    script.main(argv)
    assert len(calls) == 2 and read_json(out / "metrics.json") == result
    # a changed checkpoint is generated again, the other one is not
    os.utime(world / "clid" / "model.safetensors", ns=(time.time_ns(), time.time_ns() + 10**9))
    args, features = script.parse_args(argv), FeatureStore(world / "features.h5")
    for name in ("trusted", "clid"):
        levels, again, _, _ = generate_cached(world / name, out / "generated" / f"{name}.jsonl", args,
                                              test_ids, features, None)
        assert levels == LEVEL_SETS["caption"]
        assert again[3][test_ids[5]] == FakeCaptioner(name, pool).caption(test_ids[5], 3)
    features.close()
    assert [c[0] for c in calls] == ["trusted", "clid", "clid"]
    # other decoding settings generate again, and reach the decoder
    script.main(argv + ["--decode-steps", "3", "--eos-decay", "0.9", "--no-labert-average"])
    assert [c[0] for c in calls[3:]] == ["trusted", "clid"] and calls[3][5:] == ((3,) * 7, 0.9, False)
    script.main(argv + ["--decode-steps", *map(str, range(1, 8))])
    assert len(calls) == 7 and calls[5][5:] == (tuple(range(1, 8)), 1.0, True)
    with pytest.raises(DataError, match="one number per level"):
        script.main(argv + ["--decode-steps", "2", "3"])

    with pytest.raises(DataError, match="trained with levels caption, not --levels labert"):
        script.main(argv[:-2] + ["--out", str(world / "eval2"), "--levels", "labert"])
    # the cached captions of the same checkpoints are checked too
    with pytest.raises(DataError, match="trained with levels caption, not --levels paragraph"):
        script.main(argv + ["--levels", "paragraph"])


# ---------------------------------------------------------------------------------------------
# Bad input, SPICE, the metric definitions


@pytest.mark.slow
def test_bad_generated_file_is_one_clear_line(fixtures, tmp_path):
    bad = tmp_path / "bad.jsonl"
    write_jsonl(bad, [{"image_id": 391895, "level": 1, "caption": "A bus on a street."},
                      {"image_id": 391895, "level": 9, "caption": "A red bus."}])
    proc = run_script(ROOT / "07_eval.py", "--refs", fixtures / "dataset_coco_sample.json", "--generated", bad,
                      "--out", tmp_path / "out", check=False)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1] == f"error: {bad}: record 2 (image 391895): level 9 is outside 1..7"
    assert not (tmp_path / "out" / "metrics.json").exists()


@pytest.mark.parametrize("record, problem", [
    ({"image_id": 1, "level": "two", "caption": "a dog"}, "'level' must be a level number"),
    ({"image_id": 1, "level": 1, "caption": None}, "'caption' must be a string"),
    ({"image_id": 1, "level": 1, "caption": "a cat"}, "a second caption for image 1 at level 1"),
    ({"image_id": 1, "caption": "a cat"}, "missing key(s) ['level']"),
])
def test_read_generated_rejects_bad_records(tmp_path, record, problem):
    path = tmp_path / "gen.jsonl"
    write_jsonl(path, [{"image_id": 1, "level": 1, "caption": "a dog on a bed"}, record])
    with pytest.raises(DataError, match="2") as err:
        metrics.read_generated(path, 7)
    assert problem in str(err.value) and str(path) in str(err.value)


def test_long_refs_need_a_level_per_sentence(tmp_path):
    path = tmp_path / "long.json"
    write_json(path, {"images": [{"cocoid": 5, "filename": "5.jpg", "split": "test",
                                  "sentences": [{"raw": "a long description", "level": 3}, {"raw": "no level"}]}]})
    with pytest.raises(DataError, match=r"images\[0\] \(image 5\) sentences\[1\]: needs an integer 'level'"):
        metrics.load_long_refs(path)


def test_spice_without_corenlp_is_na_and_fast(monkeypatch, tmp_path):
    start = time.time()
    ok, reason = metrics.spice_status(probe_timeout=2.0)
    assert time.time() - start < 5 and (reason.startswith("ok") if ok else reason.startswith("n/a: "))

    monkeypatch.setattr(metrics, "_spice_lib", lambda: tmp_path)  # no CoreNLP jars here
    monkeypatch.setattr(metrics, "_reachable", lambda host, port, timeout: (False, "no route to host"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # offline (every command's default): nothing is probed or downloaded
    ok, reason = metrics.spice_status()
    assert not ok and "this run is offline" in reason and "no route" not in reason
    monkeypatch.delenv("HF_HUB_OFFLINE")  # downloads allowed: the host is probed
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    ok, reason = metrics.spice_status()
    assert not ok and "stanford-corenlp-3.6.0.jar" in reason and "no route to host" in reason
    scorer = metrics.CocoScorer(spice="auto")
    assert scorer.spice_reason == reason
    assert scorer._score_spice({"1": ["a dog"]}, {"1": ["a dog"]}) is None


def test_spice_failure_is_reported_not_raised(monkeypatch):
    import subprocess

    import pycocoevalcap.spice.spice as spice_module

    class BrokenSpice:
        def compute_score(self, gts, res):
            raise subprocess.CalledProcessError(1, ["java", "-jar", "spice-1.0.jar"])

    monkeypatch.setattr(spice_module, "Spice", BrokenSpice)
    scorer = metrics.CocoScorer(spice="off")
    scorer.spice_ok = True
    assert scorer._score_spice({"1": ["a dog"]}, {"1": ["a dog"]}) is None
    assert scorer.spice_reason.startswith("n/a: SPICE failed (CalledProcessError")
    assert not scorer.spice_ok


def test_length_control_counts_every_image():
    generated = {1: {"1": "A dog.", "2": "A man riding a wave on top of a board.", "3": "...",
                     "9": "not a test image"},
                 2: {"1": "A brown dog lying on a blue couch next to a sleeping cat."}}
    control = metrics.length_control(generated, ["1", "2", "3", "4"], "caption")
    one, two = control[1].summary(), control[2].summary()
    assert control[1].lengths == {"1": 3, "2": 11}  # "..." has no word: a miss, like image 4's
    assert one["n_in_range"] == 1 and one["control_precision"] == 0.25
    assert one["n_empty"] == 1 and one["n_missing"] == 2 and one["length_error"] == 1.0  # (0 + 2) / 2
    assert two["control_precision"] == 0.25 and two["length_error"] == 0 and two["mean_length"] == 14
    assert control[3].summary()["control_precision"] == 0 and control[3].summary()["length_error"] is None
    assert metrics.control_precision(generated, ["1", "2", "3", "4"]) == {
        n: control[n].summary()["control_precision"] for n in range(1, 8)}


def test_paragraph_levels_count_sentence_breaks():
    paragraph = "A man stands on a beach. He holds a surfboard. The sky is blue."
    words = caption_length(paragraph)  # 14 words + "."
    assert metrics.counts_sentences("paragraph") and not metrics.counts_sentences("caption")
    control = metrics.length_control({2: {"p": paragraph}}, ["p"], "paragraph")
    assert control[2].lengths["p"] == words + 2  # two sentence breaks inside count as "." tokens


def test_distinct_n_and_length_error():
    captions = ["a dog on a bed", "a dog on a couch"]
    # unigrams: a, dog, on, bed, couch = 5 unique of 10; bigrams: 5 unique of 8
    assert metrics.distinct_n(captions, 1) == 0.5
    assert metrics.distinct_n(captions, 2) == 5 / 8
    assert metrics.distinct_n(["dog"], 2) is None
    assert [metrics.length_error(n, 10, 19) for n in (3, 10, 19, 25)] == [7, 0, 0, 6]


def test_run_names(tmp_path):
    script = load_eval_script()
    args = script.parse_args(["--refs", "r.json", "--out", "o", "--checkpoint", "runs/clid/",
                              "--generated", "other/clid.jsonl"])
    with pytest.raises(DataError, match="several runs are named"):
        run_list(args)
    args = script.parse_args(["--refs", "r.json", "--out", "o", "--checkpoint", "CLID=runs/s0/clid",
                              "--checkpoint", "runs/trusted", "--checkpoint", "CLID=runs/s1/clid",
                              "--generated", "mine=a/b.jsonl"])
    runs = run_list(args)
    assert runs == [("CLID", "checkpoint", "runs/s0/clid"), ("trusted", "checkpoint", "runs/trusted"),
                    ("CLID", "checkpoint", "runs/s1/clid"), ("mine", "generated", "a/b.jsonl")]
    assert run_ids(runs) == ["CLID-run1", "trusted", "CLID-run2", "mine"]
    args = script.parse_args(["--refs", "r.json", "--out", "o", "--checkpoint", "runs/clid/",
                              "--generated", "other/clid.jsonl"])
    args.name = ["ours", "theirs"]
    assert run_list(args) == [("ours", "checkpoint", "runs/clid/"), ("theirs", "generated", "other/clid.jsonl")]
    args.name = ["ours"]
    with pytest.raises(DataError, match="1 --name for 2 runs"):
        run_list(args)


@pytest.mark.parametrize("entry", ["/", ".", "..", "./", "sub/.."])
def test_a_bare_path_is_named_after_its_folder_or_refused(tmp_path, monkeypatch, entry):
    """A bare --checkpoint of ".", ".." is named after the folder it stands for, "/" refused: never "", "." or "..",
    which would name files outside --out."""
    (tmp_path / "ck" / "sub").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "ck")
    args = type("Args", (), {"checkpoint": [entry], "generated": [], "name": []})()
    if entry == "/":  # (the root has no name)
        with pytest.raises(DataError, match="is empty; .* name the run"):
            run_list(args)
        return
    assert run_list(args)[0][0] == (tmp_path.name if entry == ".." else "ck")


# ---------------------------------------------------------------------------------------------
# The authors' length count, and methods of several runs


@pytest.mark.slow
def test_a_caption_filling_its_level_without_a_period_counts_as_the_authors_count_it(demo_like_world, monkeypatch):
    """A real (untrained) checkpoint decoded through clid.model.decode, whose mask-predict is replaced by a
    fixed sequence: at level 2 it fills all 19 positions with words and no "."; elsewhere it says
    "a dog .". The authors' count makes the level-2 caption 19 tokens long (a hit); --length-count
    strict counts the final "." too (20: a miss); the generated JSONL records the counted length."""
    import clid.model.decode as D

    world, test_ids, _ = demo_like_world
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    config = CaptionerConfig(region_dim=8, levels=LEVEL_SETS["caption"], dropout=0.0, hidden_size=32,
                               num_layers=1, num_heads=2, intermediate_size=64, region_hidden=32)
    save_model(build_model(config), world / "filling")
    tokenizer = load_checkpoint(world / "filling").tokenizer
    words = tokenizer("a man in a red shirt is riding a brown horse on a dirt road next to a fence",
                      add_special_tokens=False)["input_ids"]
    dot = tokenizer.convert_tokens_to_ids(".")
    short = tokenizer("a dog", add_special_tokens=False)["input_ids"]
    assert len(words) == 19 and dot not in words
    decoded = []

    def fixed_mask_predict(model, feats, pos, mask, level, steps, eos_decay, labert_average, block_ngram=0, length=None):
        high = model.levels[level - 1][1]
        row = words if level == 2 else short + [dot] * (high - len(short))
        decoded.append(level)
        return torch.tensor([row] * feats.shape[0])

    monkeypatch.setattr(D, "mask_predict", fixed_mask_predict)
    script = load_eval_script()
    argv = ["--refs", str(world / "captions.json"), "--features", str(world / "features.h5"),
            "--checkpoint", f"filling={world / 'filling'}", "--out", str(world / "eval"), "--spice", "off"]
    script.main(argv)
    levels = read_json(world / "eval" / "metrics.json")["runs"]["filling"]["levels"]
    assert levels["2"]["control_precision"] == pytest.approx(28 / 30)  # 28 test images have features
    assert levels["2"]["mean_length"] == 19 and levels["1"]["mean_length"] == 3
    lines = {(r["level"], r["image_id"]): r for r in read_jsonl_rows(world / "eval" / "generated" / "filling.jsonl")}
    assert lines[(2, test_ids[2])]["filled"] is True and lines[(2, test_ids[2])]["length"] == 19
    assert lines[(1, test_ids[2])]["filled"] is False and lines[(1, test_ids[2])]["length"] == 3

    n_decoded = len(decoded)
    script.main(argv + ["--length-count", "strict"])
    assert len(decoded) == n_decoded  # the captions are reused: only the count changed
    levels = read_json(world / "eval" / "metrics.json")["runs"]["filling"]["levels"]
    assert levels["2"]["control_precision"] == 0 and levels["2"]["mean_length"] == 20
    assert levels["1"]["control_precision"] == pytest.approx(28 / 30)
    lines = {(r["level"], r["image_id"]): r for r in read_jsonl_rows(world / "eval" / "generated" / "filling.jsonl")}
    assert lines[(2, test_ids[2])]["length"] == 20 and lines[(1, test_ids[2])]["length"] == 3


def read_jsonl_rows(path):
    from clid.base.files import read_jsonl

    return list(read_jsonl(path))


@pytest.mark.slow
def test_two_runs_of_one_method_give_mean_and_std(demo_like_world):
    """Two --generated files named "joined" are runs of one method: metrics.json holds each run and
    the method's mean and standard deviation per level, report.md writes "mean ± std"; a method of
    one run keeps its value, and the paper's COCO numbers (Table 1) stand beside the caption levels, for reference."""
    import statistics

    world, test_ids, pool = demo_like_world
    model = FakeCaptioner("clid", pool)
    for run, drop in (("a", 0), ("b", 10)):  # run b leaves the first 10 images without a level-3/4 caption
        write_jsonl(world / f"{run}.jsonl", [{"image_id": i, "level": level, "caption": model.caption(i, level)}
                                             for k, i in enumerate(test_ids) for level in (1, 2, 3, 4)
                                             if level < 3 or k >= drop])
    write_jsonl(world / "once.jsonl", [{"image_id": i, "level": 1, "caption": pool[i][0]} for i in test_ids])
    out = world / "eval"
    run_script(ROOT / "07_eval.py", "--refs", world / "captions.json", "--generated", f"joined={world / 'a.jsonl'}",
               "--generated", f"joined={world / 'b.jsonl'}", "--generated", world / "once.jsonl",
               "--out", out, "--spice", "off")
    result = read_json(out / "metrics.json")
    assert list(result["runs"]) == ["joined-run1", "joined-run2", "once"]
    assert result["methods"]["joined"]["runs"] == ["joined-run1", "joined-run2"]
    for level in ("3", "4"):
        values = [result["runs"][run]["levels"][level]["control_precision"] for run in ("joined-run1", "joined-run2")]
        row = result["methods"]["joined"]["levels"][level]
        assert values[0] > values[1] > 0
        assert row["control_precision"] == pytest.approx(statistics.fmean(values))
        assert row["control_precision_std"] == pytest.approx(statistics.stdev(values))
        assert row["n_runs"] == 2 and row["CIDEr_std"] >= 0
    once = result["methods"]["once"]["levels"]["1"]
    assert once == result["runs"]["once"]["levels"]["1"] and "control_precision_std" not in once
    # per_image.jsonl (--combine's intervals): every run and level over the test images; its shares in range and
    # its per-image CIDEr average to metrics.json's control precision and corpus CIDEr
    lines, n_checked = read_jsonl_rows(out / "per_image.jsonl"), 0
    assert [(r["run"], r["level"]) for r in lines] == [(run, n) for run in result["runs"] for n in range(1, 8)]
    for r in lines:
        numbers = result["runs"][r["run"]]["levels"].get(str(r["level"]))
        assert sorted(r["image_ids"]) == sorted(test_ids)
        if numbers is None:
            assert not any(r["in_range"]) and set(r["CIDEr"]) == {None}
            continue
        assert statistics.fmean(r["in_range"]) == pytest.approx(numbers["control_precision"])
        scored = [c for c in r["CIDEr"] if c is not None]
        assert len(scored) == numbers["n_scored"]
        if scored:
            n_checked += 1
            assert statistics.fmean(scored) == pytest.approx(numbers["CIDEr"])
    assert n_checked >= 5

    report = (out / "report.md").read_text()
    table = report[report.index("**Control precision (%)**"):].split("\n\n")[1]
    joined_row = next(line for line in table.splitlines() if line.startswith("| joined |"))
    mean3, std3 = 100 * row["control_precision"], 100 * row["control_precision_std"]
    assert f"{mean3:.1f} ± {std3:.1f}" in joined_row.split(" | ")[4]
    assert "±" not in next(line for line in table.splitlines() if line.startswith("| once |"))
    assert ("| CLID (the paper's COCO numbers, for reference) | 100.00 | 98.64 | 92.60 | 84.17 | 76.99 | 69.18 | 22.13 | "
            "77.67 |") in report and "with the paper's COCO numbers for reference**" in report
    assert "length penalty" in report

    # two evaluations (e.g. two seeds, each on its own world) combined: every run counts once
    other = world / "eval-seed1"
    other.mkdir()
    changed = read_json(out / "metrics.json")
    changed["runs"]["once"]["levels"]["1"]["control_precision"] = 0.5
    write_json(other / "metrics.json", changed)
    script = load_eval_script()
    script.main(["--combine", str(out), str(other), "--out", str(world / "combined")])
    combined = read_json(world / "combined" / "metrics.json")
    assert combined["methods"]["joined"]["runs"] == [f"{out}:joined-run1", f"{out}:joined-run2",
                                                     f"{other}:joined-run1", f"{other}:joined-run2"]
    values = [result["runs"]["once"]["levels"]["1"]["control_precision"], 0.5]
    once = combined["methods"]["once"]["levels"]["1"]
    assert once["control_precision"] == pytest.approx(statistics.fmean(values))
    assert once["control_precision_std"] == pytest.approx(statistics.stdev(values))
    assert "| once |" in (world / "combined" / "report.md").read_text()

    # the per-level quality plot reads SPICE when SPICE ran (as the paper's Figure 5), CIDEr otherwise
    from clid.evaluation.report import quality_metric

    assert quality_metric(result["methods"]) == "CIDEr"
    assert quality_metric({"m": {"levels": {1: {"SPICE": None}, 2: {"SPICE": 0.12}}}}) == "SPICE"


def test_a_level_with_a_scored_caption_of_score_0_is_plotted_not_called_empty(tmp_path, monkeypatch):
    """quality_vs_control.png agrees with the table: a level whose one scored caption has CIDEr 0 shows its point;
    only a level without any scored caption says so."""
    import matplotlib
    from matplotlib.axes import Axes

    from clid.evaluation.report import plot_quality_vs_control

    matplotlib.use("Agg")
    said = []
    real = Axes.text
    monkeypatch.setattr(Axes, "text", lambda self, x, y, s, *a, **k: said.append(s) or real(self, x, y, s, *a, **k))
    results = {"CLID": {"levels": {1: {"control_precision": 0.004, "n_scored": 1, "CIDEr": 0.0},
                                   2: {"control_precision": 0.0, "n_scored": 0, "CIDEr": None}},
                        "long_refs": {}}}
    plot_quality_vs_control(tmp_path / "q.png", results, ((1, 9), (10, 19)))
    assert said == ["no scored caption"] and (tmp_path / "q.png").exists()


def test_side_by_side_puts_every_method_in_one_row():
    from clid.evaluation.report import side_by_side

    def row(cp, cider=None, std=None):
        return {"control_precision": cp, "CIDEr": cider, **({"control_precision_std": std} if std else {})}

    levels = ((1, 9), (10, 19), (20, 29))
    methods = {"CLID": {"levels": {1: row(1.0, 0.7, 0.01), 2: row(0.9, 0.8), 3: row(0.5, 0.1)}, "long_refs": {3: row(None, 0.3)}},
               "loss-remove": {"levels": {1: row(0.8, 0.6), 2: row(0.7, 0.5), 3: row(0.0)}, "long_refs": {}}}
    text = side_by_side(methods, levels)
    assert "| method | CP L1 | CP L2 | CP L3 | CIDEr L1 | CIDEr L2 | CIDEr long L3 |" in text
    assert "| CLID | 100.0 ± 1.0 | 90.0 | 50.0 | 70.0 | 80.0 | 30.0 |" in text
    assert "| loss-remove | 80.0 | 70.0 | 0.0 | 60.0 | 50.0 | – |" in text
