"""The model card beside a checkpoint: written at every save, marked unfinished until the run's last step, and
never written over a card the stage did not write (a user's own, or one edited since)."""
from __future__ import annotations

import json

import pytest
from badinput import World, _must, run_stage

from clid.model import checkpoints
from clid.model.checkpoints import CARD_NAME, checkpoint_state, own_card

USERS_CARD = "# My model\n\nNotes of my own.\n"


def manifest(folder) -> list[str]:
    return json.loads((folder / "train_state.json").read_text())["files"]


def test_the_card_is_written_at_every_save_and_unfinished_until_the_last(world: World, tmp_path, monkeypatch):
    import clid.training.loop as loop

    cards = []

    def saving(folder, *args, **kwargs):
        checkpoints.save_checkpoint(folder, *args, **kwargs)
        cards.append((folder / CARD_NAME).read_text())

    monkeypatch.setattr(loop, "save_checkpoint", saving)
    out = tmp_path / "ck"
    _must(run_stage("04", world.train_args(out, "--max-steps", "3", "--save-every", "1")))
    assert len(cards) == 3
    for step, card in enumerate(cards, 1):
        assert card.startswith(f"# Model card: ck\n\n**step {step} of 3: {'finished' if step == 3 else 'unfinished'}**")
        assert f"Steps trained: {step} of --max-steps 3" in card
        assert ("(unfinished)" in card) == (step < 3)
    assert (out / CARD_NAME).read_text() == cards[-1] and own_card(out / CARD_NAME)
    assert CARD_NAME in manifest(out)
    state = checkpoint_state(out)
    assert (state.step, state.planned, state.card, state.unfinished) == (3, 3, True, False)


@pytest.mark.slow
def test_a_users_card_is_kept_and_named_once(world: World, tmp_path):
    out = tmp_path / "ck"
    out.mkdir()
    (out / CARD_NAME).write_text(USERS_CARD)
    outcome = run_stage("04", world.train_args(out, "--save-every", "1"))
    _must(outcome)
    assert (out / CARD_NAME).read_text() == USERS_CARD
    notes = [line for line in outcome.text.splitlines() if CARD_NAME in line]
    assert notes == [f"note: {out / CARD_NAME} was not written by a training stage (or was edited since): it is kept, "
                     "and the model card is not written"]
    assert CARD_NAME not in manifest(out) and not own_card(out / CARD_NAME)
    _must(run_stage("04", world.train_args(out, "--restart", "--max-steps", "3")))  # --restart removes only its own
    assert (out / CARD_NAME).read_text() == USERS_CARD


def test_an_edited_card_is_never_written_over(world: World, tmp_path):
    out = tmp_path / "ck"
    _must(run_stage("04", world.train_args(out)))
    card = out / CARD_NAME
    assert own_card(card)
    edited = card.read_text().replace("## What it cannot do", "## What it cannot do\n\n- My own note.")
    card.write_text(edited)
    assert not own_card(card)
    outcome = run_stage("04", world.train_args(out, "--restart", "--max-steps", "3"))
    _must(outcome)
    assert card.read_text() == edited
    assert sum(CARD_NAME in line for line in outcome.text.splitlines()) == 1


def test_a_card_of_an_earlier_version_is_the_stages_own(world: World, tmp_path):
    out = tmp_path / "ck"
    _must(run_stage("04", world.train_args(out)))
    card = out / CARD_NAME
    card.write_text("# Model card: ck\n\nWritten by 04_train_base.py when it finished training this checkpoint.\n")
    assert own_card(card)
    _must(run_stage("04", world.train_args(out, "--restart", "--max-steps", "3")))
    assert "**step 3 of 3: finished**" in card.read_text() and own_card(card)
