"""A checkpoint saved before its training finished says so: the caption command's one warning line, its run
record (OUT.run.json), its gallery's header and the API's ``unfinished``; a finished one says nothing."""
from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import torch
from conftest import import_script, kill_after_checkpoint
from toyworld import make_toy_world

PLANNED = 2000


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The toy world, a tiny checkpoint trained to its end (4 steps) and one stopped by SIGTERM after step 2 of
    2,000 (saved every step)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("unfinished")
    captions, features = make_toy_world(root, n_train=16, n_val=2, n_test=4, dim=16)
    common = ["--captions", captions, "--features", features, "--preset", "tiny", "--warmup", "1", "--batch-size", "4",
              "--eval-every", "0", "--save-every", "1"]
    train = import_script("04_train_base.py", "train_for_unfinished_tests")
    train.main([str(a) for a in common + ["--out", root / "finished", "--max-steps", "4"]])
    kill_after_checkpoint(["04_train_base.py", *common, "--out", root / "stopped", "--max-steps", PLANNED],
                          root / "stopped" / "train_state.json", 2, sig=signal.SIGTERM)
    yield root
    torch.set_num_threads(threads)


def stopped_step(world) -> int:
    step = json.loads((world / "stopped" / "train_state.json").read_text())["step"]
    assert 2 <= step < PLANNED
    return step


def caption(world, checkpoint: str, out: Path, capsys) -> str:
    from clid.caption.__main__ import main

    main([str(a) for a in ("--checkpoint", world / checkpoint, "--features", world / "features.h5", "--out", out,
                           "--device", "cpu", "--levels", "1", "--decode-steps", "2", "--gallery", out.with_suffix(".html"))])
    captured = capsys.readouterr()
    return captured.out + captured.err


@pytest.mark.slow
def test_an_unfinished_checkpoint_is_captioned_with_one_warning_line(world, tmp_path, capsys):
    step = stopped_step(world)
    out = tmp_path / "captions.jsonl"
    text = caption(world, "stopped", out, capsys)
    line = (f"warning: {world / 'stopped'} is unfinished: step {step:,} of {PLANNED:,}; the same training command "
            "resumes it")
    assert text.count("is unfinished") == 1 and line in text.splitlines()
    meta = json.loads((tmp_path / "captions.jsonl.run.json").read_text())
    assert meta["checkpoint"] == {"step": step, "planned_steps": PLANNED, "unfinished": True}
    page = out.with_suffix(".html").read_text()
    header = page[:page.index("</header>")]
    assert f"is unfinished: step {step:,} of {PLANNED:,}" in header
    # the model card, written at the save, says it too
    card = (world / "stopped" / "MODEL_CARD.md").read_text()
    assert f"step {step:,} of {PLANNED:,}: unfinished" in card


def test_a_finished_checkpoint_has_no_warning(world, tmp_path, capsys):
    out = tmp_path / "captions.jsonl"
    text = caption(world, "finished", out, capsys)
    assert "is unfinished" not in text and "warning" not in text  # (the folders' own names hold "unfinished")
    meta = json.loads((tmp_path / "captions.jsonl.run.json").read_text())
    assert meta["checkpoint"] == {"step": 4, "planned_steps": 4, "unfinished": False}
    page = out.with_suffix(".html").read_text()
    assert "is unfinished" not in page and ": unfinished" not in page and "warning" not in page
    assert "step 4 of 4: finished" in (world / "finished" / "MODEL_CARD.md").read_text()


def test_the_api_says_it(world, capsys):
    from clid.caption import CaptionWriter

    step = stopped_step(world)
    writer = CaptionWriter.from_checkpoint(world / "stopped", "cpu")
    assert writer.unfinished and writer.checkpoint_state.step == step and writer.checkpoint_state.planned == PLANNED
    assert capsys.readouterr().err.count("is unfinished") == 1
    quiet = CaptionWriter.from_checkpoint(world / "stopped", "cpu", warn=False)
    assert quiet.unfinished and capsys.readouterr().err == ""
    assert not CaptionWriter.from_checkpoint(world / "finished", "cpu").unfinished
    assert capsys.readouterr().err == ""


def test_the_quick_checkpoint_names_make_checkpoint(tmp_path):
    from clid.model.checkpoints import CheckpointState

    quick = CheckpointState(str(tmp_path / "runs" / "quick" / "model"), 711, 2000, True)
    assert quick.unfinished and quick.warning().endswith("is unfinished: step 711 of 2,000; `make checkpoint` resumes it")
    other = CheckpointState("runs/clid", 711, 2000, True)
    assert other.warning() == "runs/clid is unfinished: step 711 of 2,000; the same training command resumes it"
    assert not CheckpointState("runs/clid", 2000, 2000, True).unfinished
    # an earlier version's checkpoint: no planned steps recorded, a model card only once finished
    assert CheckpointState("runs/old", 711, None, False).unfinished
    assert not CheckpointState("runs/old", 711, None, True).unfinished
    assert not CheckpointState("model", None, None, False).unfinished  # a model saved without a training state
