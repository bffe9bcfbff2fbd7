"""An input file rewritten while a stage reads it is refused in one line, before the stage writes anything it
computed from it: 02's saliency maps (per chunk), 04's features (at each checkpoint), 05's features (per chunk)
and the features clid.caption decodes from. Each stage runs in-process, as in tests/bad_input/; the
file is rewritten (its modification time moves, as a rewrite in place moves it) while the stage works."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from badinput import World, run_stage, sg_args

REWRITTEN = "was rewritten while it was read"


def rewrite_once(path: Path, wrapped):
    """``wrapped`` that, on its first call, moves ``path``'s modification time by a second first."""
    calls = []

    def call(*args, **kwargs):
        if not calls:
            stat = path.stat()
            os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
        calls.append(1)
        return wrapped(*args, **kwargs)
    return call


def refused(outcome, path: Path) -> str:
    """The outcome's one error line; it names ``path`` and says it was rewritten."""
    assert outcome.code not in (0, None, "traceback"), outcome.text[-2000:] + outcome.error
    assert "Traceback" not in outcome.text, outcome.text[-2000:]
    lines = [line for line in outcome.text.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and str(path) in lines[0] and REWRITTEN in lines[0], outcome.text[-2000:]
    return lines[0]


def copy(path: Path, folder: Path) -> Path:
    shutil.copy(path, folder / path.name)
    return folder / path.name


def test_05_refuses_a_feature_file_rewritten_while_it_scores(world: World, tmp_path, monkeypatch):
    import clid.selection.quality as quality

    features = copy(world.features, tmp_path)
    monkeypatch.setattr(quality, "eq1_quality", rewrite_once(features, quality.eq1_quality))
    argv = [a if a != world.features else features for a in world.score_args(tmp_path / "quality.h5")]
    refused(run_stage("05", argv), features)
    assert not (tmp_path / "quality.h5").exists()


def test_05_scores_when_nothing_changes(world: World, tmp_path):
    """The check itself passes on an unchanged file (the other tests' refusals come from the rewrite)."""
    features = copy(world.features, tmp_path)
    argv = [a if a != world.features else features for a in world.score_args(tmp_path / "quality.h5")]
    outcome = run_stage("05", argv)
    assert outcome.code == 0, outcome.text[-2000:] + outcome.error
    assert (tmp_path / "quality.h5").exists()


def test_04_saves_no_checkpoint_from_a_feature_file_rewritten_while_it_trains(world: World, tmp_path, monkeypatch):
    from clid.training.loop import Trainer

    features = copy(world.features, tmp_path)
    monkeypatch.setattr(Trainer, "train_step", rewrite_once(features, Trainer.train_step))
    out = tmp_path / "model"
    argv = [a if a != world.features else features for a in world.train_args(out)]
    refused(run_stage("04", argv), features)
    assert not (out / "model.safetensors").exists()


def test_caption_writes_nothing_from_a_feature_file_rewritten_while_it_decodes(world: World, tmp_path, monkeypatch):
    import clid.model.decode as decode

    features = copy(world.features, tmp_path)
    monkeypatch.setattr(decode, "mask_predict", rewrite_once(features, decode.mask_predict))
    argv = [a if a != world.features else features for a in world.caption_args(tmp_path)]
    refused(run_stage("caption", argv), features)
    assert not (tmp_path / "captions.jsonl").exists()


def test_02_refuses_a_saliency_file_rewritten_while_it_walks(world: World, tmp_path, monkeypatch):
    import clid.selfgen.graphs as graphs

    saliency = copy(world.saliency, tmp_path)
    monkeypatch.setattr(graphs, "prepare", rewrite_once(saliency, graphs.prepare))
    refused(run_stage("02", sg_args(world, tmp_path, saliency=saliency)), saliency)
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize("how", ["replaced", "removed"])
def test_a_feature_store_names_how_its_file_changed(world: World, tmp_path, how):
    from clid.base.files import DataError
    from clid.data.store import FeatureStore

    features = copy(world.features, tmp_path)
    store = FeatureStore(features)
    store.check_unchanged()
    if how == "replaced":
        shutil.copy(world.features, tmp_path / "new.h5")
        os.replace(tmp_path / "new.h5", features)
    else:
        features.unlink()
    with pytest.raises(DataError, match=f"the file was {how} while it was read"):
        store.check_unchanged()
