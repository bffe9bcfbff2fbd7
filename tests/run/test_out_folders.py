"""A stage writes only its own files: an --out holding the user's files is refused, and with --force
the stage writes beside them without deleting or replacing any of them."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from badinput import World, _must, run_stage, user_folder


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_04_force_writes_beside_the_users_files_and_restart_removes_only_its_own(world: World, tmp_path):
    data = user_folder(tmp_path, world)
    before = snapshot(data)
    refused = run_stage("04", world.train_args(data))
    assert refused.code != 0 and "did not write" in refused.text
    assert snapshot(data) == before

    _must(run_stage("04", world.train_args(data, "--force")))
    after = snapshot(data)
    assert {name: after[name] for name in before} == before  # nothing of the user's changed
    state = json.loads((data / "train_state.json").read_text())
    assert state["step"] == 2 and "model.safetensors" in state["files"] and "images" not in state["files"]
    assert set(after) - set(before) == set(state["files"])

    again = run_stage("04", world.train_args(data, "--force"))
    assert again.code == 0 and "already trained" in again.text

    _must(run_stage("04", world.train_args(data, "--force", "--restart", "--max-steps", "3")))
    assert {name: data.joinpath(name).read_bytes() for name in before} == before
    assert json.loads((data / "train_state.json").read_text())["step"] == 3


def test_04_out_over_the_parent_of_runs_is_refused_and_the_runs_survive(world: World, tmp_path):
    runs = tmp_path / "runs"
    _must(run_stage("04", world.train_args(runs / "trusted")))
    before = snapshot(runs)
    outcome = run_stage("04", world.train_args(runs))
    assert outcome.code != 0 and "holds files this stage did not write (trusted/)" in outcome.text
    assert snapshot(runs) == before


def test_06_force_keeps_the_users_files(world: World, tmp_path):
    data = user_folder(tmp_path, world)
    before = snapshot(data)
    _must(run_stage("06", world.selection_args(data, "--force")))
    after = snapshot(data)
    assert {name: after[name] for name in before} == before
    assert "selection_log.jsonl" in after and "model.safetensors" in after
    resumed = run_stage("06", world.selection_args(data, "--force"))
    assert resumed.code == 0 and "already trained" in resumed.text


@pytest.mark.slow
def test_07_refuses_a_users_folder_and_with_force_writes_beside_it(world: World, tmp_path):
    data = user_folder(tmp_path, world)
    before = snapshot(data)
    refused = run_stage("07", world.eval_args(data))
    assert refused.code != 0 and "did not write" in refused.text and snapshot(data) == before
    _must(run_stage("07", world.eval_args(data, "--force")))
    after = snapshot(data)
    assert {name: after[name] for name in before} == before and "metrics.json" in after
    _must(run_stage("07", world.eval_args(data, "--force")))  # its own outputs are replaced, a re-run is fine
    out = tmp_path / "eval"
    _must(run_stage("07", world.eval_args(out)))
    _must(run_stage("07", world.eval_args(out)))  # its own folder needs no --force


def test_a_test_id_list_saved_with_a_bom_keeps_its_first_id(tmp_path):
    from clid.data.captions import read_id_list

    path = tmp_path / "test_ids.txt"
    path.write_bytes("\ufeff391895\n522418\n".encode("utf-8"))
    assert read_id_list(path) == ["391895", "522418"]
    path.write_bytes("\ufeff[391895, 522418]".encode("utf-8"))
    assert read_id_list(path) == ["391895", "522418"]
