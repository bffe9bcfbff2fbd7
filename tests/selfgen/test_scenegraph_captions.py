"""Stage 02: object saliency, the saliency-guided walk, surface text, bad graphs, sharding."""
import json
import os
import re
from collections import Counter

import numpy as np
import pytest
from conftest import import_script, run_one_thread

from clid.base import files
from clid.base.text import caption_lengths, length_to_level
from clid.data.scenegraphs import load_scene_graphs
from clid.selfgen import graphs as scenegraph
from clid.selfgen.walk import render, walk

stage02 = import_script("02_scenegraph_captions.py", "stage02")

NAMES = ["man", "woman", "dog", "horse", "apple", "umbrella", "trees", "grass", "table", "bench", "kite", "shirt",
         "hat", "car", "glasses", "bus", "elephant", "sky"]
ATTRIBUTES = ["red", "large", "striped", "wooden", "small", "white", "spotted", "tall", "blue", "metal"]
PREDICATES = ["riding", "ON", "next to", "wears", "has", "is holding", "behind", "sitting on", "left of", "in front of"]


def random_graph(rng, image_id, width=320, height=240, n_objects=None):
    """A Visual Genome record: objects with boxes inside the image, attributes and relationships."""
    n = int(rng.integers(4, 13)) if n_objects is None else n_objects
    objects = []
    for k in range(n):
        w, h = int(rng.integers(10, width // 2)), int(rng.integers(10, height // 2))
        objects.append({"object_id": image_id * 100 + k, "x": int(rng.integers(0, width - w)),
                        "y": int(rng.integers(0, height - h)), "w": w, "h": h,
                        "names": [str(rng.choice(NAMES))],
                        "attributes": [str(a) for a in rng.choice(ATTRIBUTES, size=int(rng.integers(0, 5)),
                                                                  replace=False)]})
    relationships = []
    for r in range(int(rng.integers(n // 2, 2 * n))):
        a, b = rng.choice(n, size=2, replace=False)
        relationships.append({"relationship_id": r, "predicate": str(rng.choice(PREDICATES)),
                              "subject_id": objects[a]["object_id"], "object_id": objects[b]["object_id"]})
    return {"image_id": image_id, "objects": objects, "relationships": relationships}


def write_world(folder, n_images=30, seed=0):
    """scene_graphs.json (VG ids 5000+i), image_data.json (COCO ids 10+i) and a saliency HDF5
    keyed by COCO id with smooth random maps at 24 x 32 cells."""
    rng = np.random.default_rng(seed)
    graphs = [random_graph(rng, 5000 + i) for i in range(n_images)]
    image_data = [{"image_id": 5000 + i, "width": 320, "height": 240, "coco_id": 10 + i, "url": f"x/{5000 + i}.jpg"}
                  for i in range(n_images)]
    (folder / "scene_graphs.json").write_text(json.dumps(graphs))
    (folder / "image_data.json").write_text(json.dumps(image_data))
    groups = []
    for i in range(n_images):
        field = rng.random((6, 8))
        smap = np.kron(field, np.ones((4, 4)))  # 24 x 32
        groups.append((str(10 + i), {"map": smap.astype(np.float16)}, {"width": 320, "height": 240}))
    files.write_h5_groups(folder / "saliency.h5", groups)
    return graphs


def prepared(nouns, children, saliency, attributes=None):
    n = len(nouns)
    return scenegraph.Prepared(image_id="1", graph_id="1", nouns=nouns, attributes=attributes or [[] for _ in range(n)],
                            object_ids=list(range(100, 100 + n)), children=children,
                            saliency=np.asarray(saliency, dtype=float) / np.sum(saliency))


# ---------------------------------------------------------------------------------------------
# Object saliency

def test_box_saliency_is_the_exact_integral_of_the_map():
    rng = np.random.default_rng(1)
    smap = rng.random((12, 16))
    width, height = 160.0, 120.0  # 10 image pixels per map cell
    boxes = np.array([[0, 0, 160, 120], [20, 30, 70, 90], [15, 0, 25, 10], [150, 110, 400, 300]])
    got = scenegraph.box_saliency(smap, boxes, width, height)
    assert got[0] == pytest.approx(smap.sum())
    assert got[1] == pytest.approx(smap[3:9, 2:7].sum())
    # half of cell (0, 1) and half of cell (0, 2)
    assert got[2] == pytest.approx(0.5 * smap[0, 1] + 0.5 * smap[0, 2])
    assert got[3] == pytest.approx(smap[11, 15])  # clipped to the image


def test_prior_prefers_large_and_central_objects():
    boxes = np.array([[140, 100, 180, 140], [0, 0, 40, 40], [120, 80, 200, 160]], dtype=float)
    central, corner, large = scenegraph.prior_saliency(boxes, 320, 240)
    assert central > 3 * corner and large > 2 * central


# ---------------------------------------------------------------------------------------------
# The walk

def test_first_object_is_drawn_in_proportion_to_saliency():
    g = prepared(["man", "dog", "kite", "car"], [[], [], [], []], [0.5, 0.3, 0.15, 0.05])
    starts = Counter(walk(g, np.random.default_rng(s), k=2, t_sal=0.0, n_attr=0, paragraph=False)[0].index
                     for s in range(3000))
    for i, p in enumerate(g.saliency):
        assert starts[i] / 3000 == pytest.approx(p, abs=0.03)


def test_at_most_k_children_drawn_by_saliency():
    # a star: the man (almost all the saliency) relates to four objects
    kids = [(i, ["next to"]) for i in range(1, 5)]
    g = prepared(["man", "dog", "kite", "car", "bench"], [kids, [], [], [], []], [100, 0.6, 0.3, 0.05, 0.05])
    picked, walks = Counter(), 0
    for s in range(600):
        mentions = walk(g, np.random.default_rng(s), k=2, t_sal=0.0, n_attr=0, paragraph=False)
        if mentions[0].index != 0:  # the man starts 99% of the walks
            continue
        walks += 1
        assert len(mentions) == 3
        assert mentions[1].connector == ["next", "to"] and mentions[2].connector == ["and", "next", "to"]
        picked.update(m.index for m in mentions[1:])
    assert picked[1] > picked[2] > picked[3] and picked[1] > picked[4]
    assert walks > 550 and picked[1] >= 0.8 * walks  # the dog holds 60% of the children's saliency


def test_revisit_says_the_and_does_not_propagate():
    # man -> horse -> man (a cycle) and horse -> hat: the walk from the man never loops
    g = prepared(["man", "horse", "hat"], [[(1, ["riding"])], [(0, ["under"]), (2, ["next to"])], []], [10, 1, 1])
    for s in range(50):
        mentions = walk(g, np.random.default_rng(s), k=2, t_sal=1.0, n_attr=0, paragraph=False)
        if mentions[0].index != 0:
            continue
        text = render(mentions)
        assert text.startswith("A man riding a horse")
        assert "under the man" in text
        assert [m.index for m in mentions].count(0) == 2 and len(mentions) == 4  # man, horse, the man, hat


def test_jumps_until_t_sal_is_covered():
    rng = np.random.default_rng(3)
    for t_sal in (0.2, 0.5, 0.8, 1.0):
        for s in range(40):
            n = int(rng.integers(3, 10))
            kids = [[(int(j), ["near"])] for j in rng.integers(0, n, size=n)]
            kids = [[c for c in ks if c[0] != i] for i, ks in enumerate(kids)]
            g = prepared([NAMES[i] for i in range(n)], kids, rng.random(n) + 0.01)
            mentions = walk(g, np.random.default_rng(s), k=2, t_sal=t_sal, n_attr=0, paragraph=False)
            seen = sorted({m.index for m in mentions})
            covered = g.saliency[seen].sum()
            assert covered >= t_sal - 1e-9 or len(seen) == n
            # without the last jump the walk had not covered t_sal yet
            jumps = [k for k, m in enumerate(mentions) if m.connector == ["and"]]
            if jumps:
                before = sorted({m.index for m in mentions[:jumps[-1]]})
                assert g.saliency[before].sum() < t_sal


def test_paragraph_mode_starts_a_sentence_at_each_jump():
    g = prepared(["dog", "kite", "car"], [[], [], []], [1, 1, 1])
    text = render(walk(g, np.random.default_rng(0), k=2, t_sal=1.0, n_attr=0, paragraph=True))
    assert re.fullmatch(r"An? \w+\. An? \w+\. An? \w+\.", text), text


def test_paragraph_levels_are_one_switch_for_the_paragraph_task():
    base = ["--scene-graphs", "g.json", "--saliency", "none", "--out", "o.jsonl"]
    args = stage02.parse_args(base + ["--levels", "paragraph"])
    assert args.paragraph and args.levels == "paragraph"
    args = stage02.parse_args(base + ["--paragraph"])
    assert args.paragraph and args.levels == "paragraph"
    args = stage02.parse_args(base)
    assert not args.paragraph and args.levels == "caption"


# ---------------------------------------------------------------------------------------------
# Surface text

def test_surface_text_reads_as_english():
    objects = [("man", ["tall"]), ("horse", ["brown", "spotted", "large"]), ("apple", ["red"]),
               ("trees", ["green"]), ("umbrella", []), ("grass", ["green"])]
    graph = {"image_id": 7, "objects": [
        {"object_id": i, "x": 10 * i, "y": 5, "w": 40, "h": 30, "names": [n], "attributes": a}
        for i, (n, a) in enumerate(objects)],
        "relationships": [{"subject_id": 0, "object_id": 1, "predicate": "rides"},
                          {"subject_id": 1, "object_id": 5, "predicate": "is standing on"},
                          {"subject_id": 0, "object_id": 4, "predicate": "has"},
                          {"subject_id": 2, "object_id": 3, "predicate": "under"}]}
    (g,), _ = load_scene_graphs_from([graph])
    p = scenegraph.prepare(g, "7", None, [])
    texts = set()
    for s in range(300):
        texts.add(render(walk(p, np.random.default_rng(s), k=2, t_sal=1.0, n_attr=4, paragraph=False)))
    joined = " ".join(texts)
    assert "riding a" in joined and "standing on" in joined and "with an umbrella" in joined
    assert re.search(r"\ban apple\b", joined.lower()) and "a red apple" in joined.lower()
    assert not re.search(r"\ba (trees|grass|green trees|green grass)\b", joined.lower())
    assert not re.search(r"\ban [^aeiou\s]", joined.lower()) and not re.search(r"\ba [aeiou]", joined.lower())
    assert "large brown spotted horse" in joined  # size, then colour, then the rest
    for t in texts:
        assert not re.search(r"\b(\w+) \1\b", t.lower()), t
        assert t[0].isupper() and t.endswith(".") and "  " not in t


def load_scene_graphs_from(graphs, tmp_name="graphs.json"):
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / tmp_name
        path.write_text(json.dumps(graphs))
        return load_scene_graphs(path, strict=False)


# ---------------------------------------------------------------------------------------------
# The stage from the shell

def test_records_bad_graphs_and_coco_ids(tmp_path):
    graphs = write_world(tmp_path, n_images=6)
    rng = np.random.default_rng(9)
    bad = {
        "cycle": random_graph(rng, 7001, n_objects=3),
        "self_loop": random_graph(rng, 7002, n_objects=3),
        "missing": random_graph(rng, 7003, n_objects=3),
        "empty": {"image_id": 7004, "objects": [], "relationships": []},
        "outside": random_graph(rng, 7005, n_objects=3),
        "nan": random_graph(rng, 7006, n_objects=3),
        "no_map": random_graph(rng, 7007, n_objects=3),
        "no_coco": random_graph(rng, 7008, n_objects=3),
    }
    o = [x["object_id"] for x in bad["cycle"]["objects"]]
    bad["cycle"]["relationships"] = [{"subject_id": o[0], "object_id": o[1], "predicate": "near"},
                                     {"subject_id": o[1], "object_id": o[2], "predicate": "near"},
                                     {"subject_id": o[2], "object_id": o[0], "predicate": "near"}]
    o = bad["self_loop"]["objects"][0]["object_id"]
    bad["self_loop"]["relationships"].append({"subject_id": o, "object_id": o, "predicate": "on"})
    bad["missing"]["relationships"].append({"subject_id": 99999999, "object_id": o, "predicate": "on"})
    bad["outside"]["objects"][1]["x"] = 300
    bad["outside"]["objects"][1]["w"] = 200
    image_data = json.loads((tmp_path / "image_data.json").read_text())
    image_data += [{"image_id": 7000 + i, "width": 320, "height": 240, "coco_id": 900 + i} for i in range(1, 8)]
    image_data += [{"image_id": 7008, "width": 320, "height": 240, "coco_id": None}]
    (tmp_path / "image_data.json").write_text(json.dumps(image_data))
    (tmp_path / "scene_graphs.json").write_text(json.dumps(graphs + list(bad.values())))
    maps = [(str(900 + i), {"map": np.full((24, 32), np.nan if i == 6 else 0.5, np.float16)},
             {"width": 320, "height": 240}) for i in range(1, 7)]
    import h5py

    with h5py.File(tmp_path / "saliency.h5", "a") as f:
        for key, data, attrs in maps:
            f.create_group(key).create_dataset("map", data=data["map"])
            f[key].attrs.update(attrs)

    out = tmp_path / "selfgen.jsonl"
    proc = run_one_thread("02_scenegraph_captions.py", "--scene-graphs", tmp_path / "scene_graphs.json",
               "--image-data", tmp_path / "image_data.json", "--saliency", tmp_path / "saliency.h5",
               "--out", out, "--per-image", "3")
    rows = [line.split("\t") for line in (tmp_path / "selfgen.jsonl.problems.tsv").read_text().splitlines()[1:]]
    by_image = {}
    for image_id, action, kind, _ in rows:
        by_image.setdefault(image_id, set()).add((action, kind))
    assert ("noted", "cycle (the walk does not loop)") in by_image["901"]
    assert ("repaired", "self-loop removed") in by_image["902"]
    assert ("skipped", "relationship names a missing object") in by_image["7003"]
    assert ("skipped", "empty graph") in by_image["904"]
    assert ("skipped", "box outside the image") in by_image["7005"]
    assert ("skipped", "NaN saliency") in by_image["906"]
    assert ("skipped", "no saliency map") in by_image["907"]
    assert ("skipped", "no COCO id") in by_image["7008"]
    assert "skipped:" in proc.stdout and "no COCO id" in proc.stdout and "NaN saliency" in proc.stdout
    # with shards, the problems of every shard are merged beside the output with the parts
    for shard_id in (2, 0, 1):
        stage02.main([str(x) for x in ("--scene-graphs", tmp_path / "scene_graphs.json", "--image-data",
                                       tmp_path / "image_data.json", "--saliency", tmp_path / "saliency.h5", "--out",
                                       tmp_path / "three.jsonl", "--per-image", 3, "--chunk-size", 2,
                                       "--shard-id", shard_id, "--num-shards", 3)])
    merged = [line.split("\t") for line in (tmp_path / "three.jsonl.problems.tsv").read_text().splitlines()[1:]]
    assert sorted(merged) == sorted(rows) and len(rows) >= 8
    assert sorted(p.name for p in tmp_path.glob("three.jsonl*")) == [
        "three.jsonl", "three.jsonl.problems.tsv", "three.jsonl.run.json"]
    assert (tmp_path / "three.jsonl").read_bytes() == out.read_bytes()

    records = list(files.read_jsonl(out))
    captioned = {r["image_id"] for r in records}
    assert captioned == {str(10 + i) for i in range(6)} | {"901", "902"}  # COCO ids, the repaired ones too
    assert len({r["id"] for r in records}) == len(records) == 3 * len(captioned)
    assert "captions:" in proc.stdout and "60-69" in proc.stdout  # the clid.data.stats table
    lengths = caption_lengths([r["caption"] for r in records])
    object_ids = {str(10 + i): {o["object_id"] for o in g["objects"]} for i, g in enumerate(graphs)}
    object_ids.update({"901": {o["object_id"] for o in bad["cycle"]["objects"]},
                       "902": {o["object_id"] for o in bad["self_loop"]["objects"]}})
    for r, n in zip(records, lengths):
        assert r["n_tokens"] == n and r["level"] == length_to_level(n) and r["seed"] == 0
        assert r["objects"] and set(r["objects"]) <= object_ids[r["image_id"]]


@pytest.mark.slow
def test_one_shard_equals_three_resume_and_t_sal_raises_length(tmp_path, monkeypatch, capsys):
    write_world(tmp_path, n_images=40)
    mtime = (tmp_path / "scene_graphs.json").stat().st_mtime_ns
    common = ["--scene-graphs", tmp_path / "scene_graphs.json", "--image-data", tmp_path / "image_data.json",
              "--saliency", tmp_path / "saliency.h5", "--chunk-size", "4", "--levels", "labert"]
    run_one_thread("02_scenegraph_captions.py", *common, "--out", tmp_path / "one.jsonl")
    for shard_id in range(3):
        run_one_thread("02_scenegraph_captions.py", *common, "--out", tmp_path / "three.jsonl",
            "--shard-id", shard_id, "--num-shards", 3)
    assert (tmp_path / "one.jsonl").read_bytes() == (tmp_path / "three.jsonl").read_bytes()
    # resume: the chunks of a killed run are kept, the missing ones written
    again = tmp_path / "again.jsonl"
    argv = [str(x) for x in common] + ["--out", str(again)]
    real, calls = stage02.caption_image, []

    def killed_in_the_third_chunk(*args):
        calls.append(1)
        if len(calls) > 8:  # chunks of 4 graphs: two chunks are done
            raise KeyboardInterrupt("killed")
        return real(*args)

    monkeypatch.setattr(stage02, "caption_image", killed_in_the_third_chunk)
    with pytest.raises(KeyboardInterrupt):
        stage02.main(argv)
    monkeypatch.setattr(stage02, "caption_image", real)
    assert not again.exists() and len(list(tmp_path.glob("again.jsonl.chunk-*[0-9]"))) == 2
    marker = {"id": "x0", "image_id": "0", "caption": "Kept.", "objects": [1], "n_tokens": 2, "level": 1, "seed": 0}
    files.write_jsonl(tmp_path / "again.jsonl.chunk-000000", [marker])  # shows the chunk is not computed again
    # other settings than the killed run's are refused, not mixed into its output
    with pytest.raises(files.DataError) as refused:
        stage02.main(argv + ["--per-image", "2"])
    assert "--per-image 5 then, 2 now" in str(refused.value) and "--restart" in str(refused.value)
    assert not again.exists() and len(list(tmp_path.glob("again.jsonl.chunk-*[0-9]"))) == 2
    (tmp_path / "scene_graphs.json").touch()  # so is a changed input file
    with pytest.raises(files.DataError, match="the file of --scene-graphs changed"):
        stage02.main(argv)
    os.utime(tmp_path / "scene_graphs.json", ns=(mtime, mtime))  # the old time back: resumed
    capsys.readouterr()
    stage02.main(argv)
    assert "resuming: 2 of 10 chunks already done" in capsys.readouterr().out
    resumed = list(files.read_jsonl(again))
    kept = {str(10 + i) for i in range(4)}  # the images of chunk 0
    assert resumed[0]["id"] == "x0" and resumed[1:] == [r for r in files.read_jsonl(tmp_path / "one.jsonl")
                                                        if r["image_id"] not in kept]
    # a finished output with other settings: refused too, and replaced with --restart
    with pytest.raises(files.DataError, match="--per-image 5 then, 2 now"):
        stage02.main(argv + ["--per-image", "2"])
    stage02.main(argv + ["--per-image", "2", "--restart"])
    restarted = list(files.read_jsonl(again))
    assert len(restarted) == 2 * 40 and {r["id"].rsplit("_", 1)[1] for r in restarted} == {"0", "1"}
    records = list(files.read_jsonl(tmp_path / "one.jsonl"))
    assert any(r["level"] is None for r in records)  # longer than 25 tokens: kept, level null
    assert all(r["level"] is None for r in records if r["n_tokens"] > 25)

    means = {}
    for t_sal in ("0.2", "0.8"):
        out = tmp_path / f"tsal{t_sal}.jsonl"
        run_one_thread("02_scenegraph_captions.py", *common[:4], "--saliency", "none", "--out", out, "--t-sal", t_sal)
        means[t_sal] = np.mean([r["n_tokens"] for r in files.read_jsonl(out)])
    assert means["0.8"] > 1.3 * means["0.2"]
