"""The demo world's ground truth: 02 --clean-graphs judges every caption against the true graphs, and
python -m clid.demo.truth reports every scorer and 06 run against it."""
import argparse
import json

import numpy as np
import pytest
import torch
from conftest import run_script

from clid.base.files import read_jsonl, write_json, write_jsonl, write_quality
from clid.data.records import Relation, SceneGraph, SGObject
from clid.demo import truth


def obj(oid, name, *attributes):
    return SGObject(oid, 0, 0, 10, 10, [name], list(attributes))


def test_judge_counts_each_kind_of_error():
    true = SceneGraph("7", [obj(1, "dog", "brown"), obj(2, "ball", "red"), obj(3, "man")],
                      [Relation(3, 1, "next to"), Relation(1, 2, "on")])
    ids, nouns = [1, 2, 3, 99], ["dog", "cup", "man", "kite"]  # the walked graph: 2 mislabelled, 99 hallucinated
    # the man next to the brown dog: right; the dog next to the man: the relation is held the other way
    assert truth.judge(ids, nouns, [(2, (), None), (0, ("brown",), (2, "next to"))], true) == dict.fromkeys(truth.KINDS, 0)
    assert truth.judge(ids, nouns, [(0, ("brown",), None), (2, (), (0, "next to"))], true)["wrong_relation"] == 1
    counts = truth.judge(ids, nouns, [(0, ("black", "brown"), None), (1, ("red",), (0, "under")),
                                      (3, ("blue",), (1, "on"))], true)
    # a mislabelled object's relation and attributes are still checked; the hallucinated one counts once
    assert counts == {"hallucinated": 1, "mislabelled": 1, "wrong_attribute": 1, "wrong_relation": 1}
    assert truth.is_wrong(counts) and not truth.is_wrong(dict.fromkeys(truth.KINDS, 0))


@pytest.fixture(scope="module")
def demo_world(tmp_path_factory):
    folder = tmp_path_factory.mktemp("truth_world")
    for name, noise in (("noisy", "0.3"), ("clean", "0")):
        run_script("00_demo_data.py", "--out", folder / name, "--small", "--skip-features", "--workers", "1",
                   "--graph-noise", noise, "--n-train", "30", "--n-val", "0", "--n-test", "0")
    return folder


def captions_of(world, tmp_path):
    out = tmp_path / "selfgen.jsonl"
    run_script("02_scenegraph_captions.py", "--scene-graphs", world / "scene_graphs.json", "--image-data",
               world / "image_data.json", "--saliency", "none", "--out", out,
               "--clean-graphs", world / "scene_graphs_clean.json")
    return list(read_jsonl(out))


@pytest.mark.slow
def test_02_records_the_truth_of_every_caption(demo_world, tmp_path):
    clean = captions_of(demo_world / "clean", tmp_path / "c")
    assert clean and all(r["truth"] == dict.fromkeys(truth.KINDS, 0) for r in clean)  # true graphs: nothing wrong
    noisy = captions_of(demo_world / "noisy", tmp_path / "n")
    # counted independently from the two graph files: objects not in the image, and objects named wrongly
    graphs = {g["image_id"] - 1_000_000: g for g in json.loads((demo_world / "noisy" / "scene_graphs.json").read_text())}
    true = {g["image_id"] - 1_000_000: g for g in json.loads((demo_world / "noisy" / "scene_graphs_clean.json").read_text())}
    for r in noisy:
        real = {o["object_id"]: o["names"][0] for o in true[int(r["image_id"])]["objects"]}
        named = {o["object_id"]: o["names"][0] for o in graphs[int(r["image_id"])]["objects"]}
        assert r["truth"]["hallucinated"] == sum(o not in real for o in r["objects"])
        assert r["truth"]["mislabelled"] == sum(o in real and named[o] != real[o] for o in r["objects"])
    for kind in truth.KINDS:
        assert any(r["truth"][kind] for r in noisy), kind
    assert 0.1 < np.mean([truth.is_wrong(r["truth"]) for r in noisy]) < 0.9


# -- the report ------------------------------------------------------------------------------------------


def test_auc_and_draw_shares():
    right = np.array([True] * 60 + [False] * 40)
    assert truth.auc(right.astype(float), right) == 1.0
    assert truth.auc(-right.astype(float), right) == 0.0
    assert truth.auc(np.zeros(100), right) == 0.5
    assert truth.auc(np.arange(100.0), np.arange(100) >= 50) == 1.0
    assert truth.auc(np.arange(4.0), np.array([True, False, True, False])) == 0.25  # right 0, 2; wrong 1, 3: only 2 > 1
    assert truth.auc(np.ones(3), np.ones(3, bool)) is None
    score = np.where(right, 1.0, -1.0) + np.random.default_rng(0).normal(0, 0.1, 100)
    drawn = truth.clid_draw(score, 50, seed=0)
    assert len(drawn) == 50 and (~right[drawn]).mean() < 0.1  # the schedule draws the right captions


@pytest.fixture()
def scored_pool(tmp_path):
    """100 self-generated captions (the first 30 wrong) and 20 trusted ones with known scores."""
    rng = np.random.default_rng(1)
    records, ids = [], []
    for k in range(100):
        wrong = k < 30
        records.append({"id": f"{k}_0", "image_id": k, "caption": "a dog", "objects": [1, 2] if wrong else [1],
                        "n_tokens": 10 + (k % 7), "level": 2,
                        "truth": {"hallucinated": int(wrong and k % 2 == 0), "mislabelled": 0,
                                  "wrong_attribute": int(wrong and k % 2 == 1), "wrong_relation": 0}})
        ids.append(f"{k}_0")
    selfgen = tmp_path / "selfgen.jsonl"
    write_jsonl(selfgen, records + [{"id": "x_0", "image_id": 999, "caption": "not scored", "truth": {}}])
    u = np.where(np.arange(100) < 30, -5.0, 5.0) + rng.normal(0, 0.05, 100)  # u separates them, by far
    trusted = np.concatenate([np.full(18, 0.2), np.full(2, -0.1)])
    quality = tmp_path / "quality.h5"
    write_quality(quality, ids + [f"trusted:{k}#0" for k in range(20)], np.concatenate([u, trusted]),
                  np.zeros(120), np.concatenate([u, trusted]), ["selfgen"] * 100 + ["trusted"] * 20)
    return selfgen, quality, u


def test_every_scorer_on_the_same_pool(scored_pool, tmp_path):
    selfgen, quality, u = scored_pool
    results = truth.measure(selfgen, quality, seed=0)
    assert results["pool"]["n"] == 100 and results["pool"]["wrong"] == 0.3
    assert results["pool"]["hallucinated"] == 0.15 and results["pool"]["wrong_attribute"] == 0.15
    rows = results["scorers"]
    assert rows["u"]["auc"] == 1.0 and rows["log p, M_theta~"]["auc"] == 0.5  # logp_extended is constant here
    assert rows["u"]["wrong_at_80"] == 0.0 and rows["u"]["wrong_at_20"] < 0.3
    assert results["fig4"] == {"trusted_u_positive": 0.9, "selfgen_u_negative": 0.3, "n_trusted": 20,
                               "n_selfgen": 100}
    q = results["quartiles"]
    assert [r["n"] for r in q] == [25, 25, 25, 25] and q[0]["wrong"] == 1.0 and q[3]["wrong"] == 0.0


def fake_run(folder, args: dict, rows: list, difficulty=None):
    folder.mkdir()
    write_json(folder / "config.json", {"train": args})
    write_jsonl(folder / "selection_log.jsonl", rows)
    if difficulty is not None:
        from clid.base.files import write_arrays

        write_arrays(folder / "difficulty.h5", {"id": np.asarray(difficulty[0], dtype=object),
                                                "difficulty": np.asarray(difficulty[1])})


def test_runs_are_replayed_from_their_logs(scored_pool, tmp_path):
    from clid.selection.schedule import make_plan

    selfgen, quality, u = scored_pool
    pool = truth.read_pool(selfgen, quality)
    base = {"max_steps": 100, "seed": 0, "c": 25.0, "s": 1.0, "schedule": "smooth", "eta": 20, "full_epochs": False,
            "batch_size": 4}
    plan = make_plan(torch.tensor(u, dtype=torch.float32), 5, np.full(100, 10), np.full(100, 2), 7,
                     argparse.Namespace(strategy="clid", **base))
    fake_run(tmp_path / "clid", dict(base, strategy="clid"), plan)
    clid = truth.run_shares(tmp_path / "clid", pool)
    assert clid["exact"] and clid["pool_at_20"] == 75 and clid["pool_at_50"] == 50 and clid["pool_at_80"] == 0
    assert clid["wrong_at_50"] == 0.0  # the 50 drawn at c * i = 50 are right (u separates them)
    removed = [f"{k}_0" for k in range(10)]
    fake_run(tmp_path / "remove", dict(base, strategy="loss-remove"),
             [{"round": 0, "start": 0}, {"round": 1, "start": 30, "removed": removed + ["0#1"], "seconds": 2.5}])
    remove = truth.run_shares(tmp_path / "remove", pool)
    assert (remove["pool_at_20"], remove["pool_at_50"]) == (100, 90)
    assert remove["wrong_at_50"] == pytest.approx(20 / 90) and remove["seconds"] == 2.5
    fake_run(tmp_path / "replace", dict(base, strategy="loss-replacecap"),
             [{"round": 0, "start": 0}, {"round": 1, "start": 10, "replaced": [["0_0", "50_0"], ["1_0", "0#2"]]}])
    replace = truth.run_shares(tmp_path / "replace", pool)
    assert replace["pool_at_20"] == 99 and replace["wrong_at_20"] == pytest.approx(28 / 99)
    order = [f"{k}_0" for k in range(100)][::-1] + ["1#0"]  # the right captions are the easiest
    fake_run(tmp_path / "curriculum", dict(base, strategy="curriculum", buckets=2),
             [{"round": 0, "start": 0, "buckets": 1, "difficulty_seconds": 4.0}, {"round": 1, "start": 60, "buckets": 2}],
             (order, np.arange(101.0)))
    curriculum = truth.run_shares(tmp_path / "curriculum", pool)
    assert curriculum["pool_at_20"] == 51 and curriculum["wrong_at_20"] == 0.0 and curriculum["pool_at_80"] == 100


@pytest.mark.slow
def test_the_report_and_its_combination(scored_pool, tmp_path):
    selfgen, quality, _ = scored_pool
    for seed in (0, 1):
        run_script("-m", "clid.demo.truth", "--selfgen", selfgen, "--quality", quality, "--seed", seed,
                   "--out", tmp_path / f"t{seed}")
    text = (tmp_path / "t0" / "truth.md").read_text()
    assert "| u | 100.0 | 92.3 |" in text and "| trusted captions with u > 0 | 90.0 | 90 |" in text
    run_script("-m", "clid.demo.truth", "--combine", tmp_path / "t0", tmp_path / "t1", "--out", tmp_path / "all")
    combined = json.loads((tmp_path / "all" / "truth.json").read_text())
    assert combined["scorers"]["u"]["auc"] == [1.0, 0.0]
    assert "2 worlds, mean ± std" in (tmp_path / "all" / "truth.md").read_text()
    no_truth = tmp_path / "bare.jsonl"
    write_jsonl(no_truth, [{k: v for k, v in r.items() if k != "truth"} for r in read_jsonl(selfgen)])
    proc = run_script("-m", "clid.demo.truth", "--selfgen", no_truth, "--quality", quality, "--out", tmp_path / "x",
                      check=False)
    assert proc.returncode == 1 and "no 'truth'" in proc.stderr and "--clean-graphs" in proc.stderr
