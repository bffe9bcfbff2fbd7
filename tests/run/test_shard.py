import numpy as np
import pytest
from conftest import run_script

from clid.base import files
from clid.base.rng import item_rng, item_seed
from clid.run import runs, shard


def run(items, out, spec, chunk_size, process, record=None, restart=False):
    """Run ``process(chunk items, chunk path)`` as a sharded job."""
    job = shard.Job(out, spec, chunk_size, record or {}, restart)
    return job.run(items, lambda chunk: process(chunk.items, chunk.path), "toy", "item")


def toy_stage(items, out, shard_spec, chunk_size=3, fail_after=None, **kwargs):
    """A per-item stage: a few random captions per image, randomness keyed by (seed, image id)."""
    done = []

    def process(chunk, path):
        if fail_after is not None and len(done) >= fail_after:
            raise KeyboardInterrupt("killed")
        records = []
        for image_id in chunk:
            rng = item_rng(7, image_id)
            for n in range(int(rng.integers(0, 3))):  # some images give no record at all
                records.append({"id": f"{image_id}_{n}", "image_id": image_id, "caption": f"x {rng.random():.6f}"})
        files.write_jsonl(path, records)
        done.append(path)

    return run(items, out, shard_spec, chunk_size, process, **kwargs), done


ITEMS = [str(i) for i in (5, 3, 12, 1, 40, 2, 8, 100, 7, 6, 11)]


def test_one_shard_equals_three_shards(tmp_path):
    one, _ = toy_stage(ITEMS, tmp_path / "one.jsonl", shard.Shard(0, 1))
    outs = [toy_stage(ITEMS, tmp_path / "three.jsonl", shard.Shard(i, 3))[0] for i in range(3)]
    assert outs[:2] == [None, None] and outs[2] == tmp_path / "three.jsonl"  # the last shard merges
    assert (tmp_path / "one.jsonl").read_bytes() == (tmp_path / "three.jsonl").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one.jsonl", "one.jsonl.run.json", "three.jsonl",
                                                         "three.jsonl.run.json"]  # parts cleaned up
    recs = list(files.read_jsonl(tmp_path / "one.jsonl"))
    assert len(recs) > 0 and [r["image_id"] for r in recs] == sorted((r["image_id"] for r in recs), key=int)


def test_item_goes_to_shard_i_mod_n():
    assert shard.Shard(1, 3).select(list("abcdefg")) == ["b", "e"]
    with pytest.raises(files.DataError, match="shard id 3 is outside 0..2"):
        shard.Shard(3, 3)


@pytest.mark.parametrize("name", ["o.jsonl", "o[1]*?.jsonl"])  # (a name that reads as a glob pattern)
def test_resume_after_kill_skips_finished_chunks(tmp_path, name):
    out = tmp_path / name
    with pytest.raises(KeyboardInterrupt):
        toy_stage(ITEMS, out, shard.Shard(0, 1), fail_after=2, record={"settings": {"n": 1}})
    assert len([p for p in tmp_path.iterdir() if p.name.startswith(name + ".chunk-")]) == 2 and not out.exists()
    with pytest.raises(files.DataError, match="add --restart"):  # its chunks are found: other settings never mix in
        toy_stage(ITEMS, out, shard.Shard(0, 1), record={"settings": {"n": 2}})
    result, done = toy_stage(ITEMS, out, shard.Shard(0, 1), record={"settings": {"n": 1}})
    assert result == out and len(done) == 2  # 4 chunks of 3 items; 2 were already on disk
    reference, _ = toy_stage(ITEMS, tmp_path / "ref.jsonl", shard.Shard(0, 1))
    assert out.read_bytes() == reference.read_bytes()
    # a finished output is not recomputed
    assert toy_stage(ITEMS, out, shard.Shard(0, 1), record={"settings": {"n": 1}})[1] == []


def test_merge_command_and_h5_parts(tmp_path):
    out = tmp_path / "q.h5"
    for i, ids in enumerate((["b10", "b2"], ["a"])):
        files.write_quality(shard.part_path(out, i, 2), ids, np.zeros(len(ids)), np.ones(len(ids)), -np.ones(len(ids)))
    run_script("-m", "clid.shard", "merge", out, "--num-shards", 2)
    assert list(files.read_quality(out)["id"]) == ["a", "b2", "b10"]
    # grouped HDF5 (saliency / features): groups of all parts
    gout = tmp_path / "s.h5"
    for i in range(2):
        files.write_h5_groups(shard.part_path(gout, i, 2), [(str(i), {"map": np.zeros((2, 2), np.float16)}, {"width": 2, "height": 2})])
    shard.merge(gout, 2)
    assert files.h5_group_ids(gout) == ["0", "1"]
    missing = run_script("-m", "clid.shard", "merge", tmp_path / "none.jsonl", "--num-shards", 2, check=False)
    assert missing.returncode != 0 and "2 parts missing" in missing.stderr


def test_slurm_defaults(monkeypatch):
    import argparse

    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "4")
    monkeypatch.setenv("SLURM_ARRAY_TASK_COUNT", "8")
    parser = argparse.ArgumentParser()
    shard.add_shard_args(parser)
    args = parser.parse_args([])
    assert shard.Shard.from_args(args) == shard.Shard(4, 8)
    assert shard.Shard.from_args(parser.parse_args(["--shard-id", "0", "--num-shards", "1"])) == shard.Shard(0, 1)


def test_keyed_randomness_is_stable():
    assert item_seed(1, "391895") == item_seed(1, "391895")
    assert item_seed(1, "391895") != item_seed(2, "391895") != item_seed(1, "391896")
    a, b = item_rng(0, "img", "walk").random(4), item_rng(0, "img", "walk").random(4)
    assert np.array_equal(a, b)


def test_empty_shards_write_empty_parts_and_the_merge_completes(tmp_path):
    """More shards than items: the empty shards write empty parts (JSONL, image groups, flat arrays)."""
    items = ["7", "3"]

    def jsonl(chunk, path):
        files.write_jsonl(path, [{"id": f"{i}_0", "image_id": i, "caption": "a dog"} for i in chunk])

    def groups(chunk, path):
        files.write_h5_groups(path, [(i, {"map": np.full((2, 2), int(i), np.float16)}, {"width": 2, "height": 2})
                                     for i in chunk])

    def arrays(chunk, path):
        files.write_quality(path, [f"{i}_0" for i in chunk], np.zeros(len(chunk)), np.ones(len(chunk)), -np.ones(len(chunk)))

    for name, process in (("c.jsonl", jsonl), ("s.h5", groups), ("q.h5", arrays)):
        out = tmp_path / name
        finals = [run(items, out, shard.Shard(i, 4), 5, process) for i in (2, 3, 0, 1)]
        assert finals[:3] == [None] * 3 and finals[3] == out  # the last shard to finish merged
        assert sorted(p.name for p in tmp_path.glob(name + "*")) == [name, name + ".run.json"]
    assert [r["image_id"] for r in files.read_jsonl(tmp_path / "c.jsonl")] == ["3", "7"]
    assert files.h5_group_ids(tmp_path / "s.h5") == ["3", "7"]
    assert list(files.read_quality(tmp_path / "q.h5")["id"]) == ["3_0", "7_0"]
    # an empty item list: one empty output
    assert run([], tmp_path / "e.h5", shard.Shard(0, 1), 5, groups) == tmp_path / "e.h5"
    assert files.h5_group_ids(tmp_path / "e.h5") == []


def test_the_run_record_refuses_other_settings_and_inputs_unless_restart(tmp_path, monkeypatch):
    import argparse

    source = tmp_path / "in.txt"
    source.write_text("x")

    def record(n, path):
        return runs.run_record(argparse.Namespace(inp=str(path), n=n), inputs=("inp",), settings=("inp", "n"))

    out = tmp_path / "o.jsonl"
    with pytest.raises(KeyboardInterrupt):
        toy_stage(ITEMS, out, shard.Shard(0, 1), fail_after=1, record=record(1, source))
    with pytest.raises(files.DataError, match=r"\(--n 1 then, 2 now\); .* add --restart"):
        toy_stage(ITEMS, out, shard.Shard(0, 1), record=record(2, source))
    source.write_text("changed")
    with pytest.raises(files.DataError, match="the file of --inp changed"):
        toy_stage(ITEMS, out, shard.Shard(0, 1), record=record(1, source))
    # --restart: what the earlier run left goes, the run starts over
    result, done = toy_stage(ITEMS, out, shard.Shard(0, 1), record=record(1, source), restart=True)
    assert result == out and len(done) == 4
    # the same file spelled another way is the same input
    monkeypatch.chdir(tmp_path)
    assert toy_stage(ITEMS, out, shard.Shard(0, 1), record=record(1, "in.txt"))[1] == []
    with pytest.raises(files.DataError, match="left this output here"):
        toy_stage(ITEMS, out, shard.Shard(0, 1), record=record(3, "in.txt"))


@pytest.mark.parametrize("num_shards", [1, 2])
def test_restart_removes_only_what_the_stage_wrote(tmp_path, num_shards):
    """--restart discards the earlier run's output, parts, chunks, side tables and records, and nothing else: the
    user's o.jsonl.bak, o.jsonl.notes.tsv and o.jsonl.part-mine beside them stay."""
    import argparse

    def record(n):
        return runs.run_record(argparse.Namespace(n=n), inputs=(), settings=("n",))

    out = tmp_path / "o.jsonl"
    for i in range(num_shards):
        toy_stage(ITEMS, out, shard.Shard(i, num_shards), record=record(1))
    with pytest.raises(KeyboardInterrupt):  # a second run, killed: chunks and a part-to-be of its own
        toy_stage(ITEMS, tmp_path / "p.jsonl", shard.Shard(0, num_shards), fail_after=1, record=record(1))
    shard.write_table(shard.side_path(out, "skipped.tsv"), ("reason", "count"), [("x", 1)])
    mine = {name: f"mine {name}\n" for name in ("o.jsonl.bak", "o.jsonl.notes.tsv", "o.jsonl.part-mine",
                                                 "p.jsonl.bak", "p.jsonl.notes.tsv")}
    for name, text in mine.items():
        (tmp_path / name).write_text(text)
    for i in range(num_shards):
        toy_stage(ITEMS, out, shard.Shard(i, num_shards), record=record(2), restart=True)
    toy_stage(ITEMS, tmp_path / "p.jsonl", shard.Shard(0, num_shards), record=record(2), restart=True)
    assert {name: (tmp_path / name).read_text() for name in mine} == mine
    assert not shard.side_path(out, "skipped.tsv").exists()  # (the stage's own side table went with its output)
    assert list(files.read_jsonl(out)) and sorted(p.name for p in tmp_path.glob("p.jsonl.chunk-*")) == []


def test_the_run_record_holds_the_files_of_input_subfolders(tmp_path):
    import argparse

    folder = tmp_path / "release"
    (folder / "feat_cls_1000").mkdir(parents=True)
    (folder / "feat_cls_1000" / "a_feat009.h5").write_text("x")
    (folder / "link").symlink_to(folder)  # (a linked folder is not entered: the stages' searches do not)
    state = runs.file_state(folder)
    assert set(state) == {"feat_cls_1000"} and set(state["feat_cls_1000"]) == {"a_feat009.h5"}

    def record(path):
        return runs.run_record(argparse.Namespace(inputs=[str(path)]), inputs=("inputs",), settings=("inputs",))

    before = record(folder)
    (folder / "feat_cls_1000" / "a_feat009.h5").write_text("changed")
    assert runs.record_differences(before, record(folder)) == ["the file of --inputs changed"]
    # an earlier version recorded the flag as a setting alone: its files are not compared, its value is
    old = {"settings": {"--inputs": [str(folder)]}, "inputs": {}}
    assert runs.record_differences(old, record(folder)) == []
    assert runs.record_differences({"settings": {}, "inputs": {}}, record(folder)) == ["--inputs new now"]
    # the output written inside an input folder is not an input
    out = folder / "feat_cls_1000" / "features.h5"
    ns = argparse.Namespace(inputs=[str(folder)], out=str(out))
    before = runs.run_record(ns, inputs=("inputs",))
    for name in ("features.h5", "features.h5.run.json", "features.h5.chunk-000001", ".features.h5.lock"):
        (out.parent / name).write_text("x")
    assert runs.record_differences(before, runs.run_record(ns, inputs=("inputs",))) == []
