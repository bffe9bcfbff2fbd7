"""06's strategies resume after a kill with the same training sets: the same weights and the same
selection log as a run that was never interrupted (in-process, killed right after a checkpoint)."""
import json

import numpy as np
import pytest
import torch
from conftest import import_script
from toyworld import make_toy_world

from clid.base.files import write_quality
from clid.training.loop import Trainer

stage = import_script("06_train_selection.py", "selection_resume_stage")


class Killed(Exception):
    pass


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    folder = tmp_path_factory.mktemp("resume")
    captions, features = make_toy_world(folder, n_train=10, n_val=3, n_test=2, dim=16)
    selfgen = folder / "selfgen.jsonl"
    texts = ["a red dog", "a blue ball and a green tree in the park", "a yellow car next to a red boat on the grass"]
    with open(selfgen, "w") as f:
        for i in range(1, 11):
            for n, text in enumerate(texts):
                f.write(json.dumps({"id": f"{i}_{n}", "image_id": i, "caption": text}) + "\n")
    ids = [f"{i}_{n}" for i in range(1, 11) for n in range(3)]
    ids += [f"trusted:{i}#{n}" for i in range(1, 11) for n in range(3)]
    u = np.random.default_rng(0).normal(size=len(ids))
    write_quality(folder / "quality.h5", ids, u, np.zeros(len(ids)), u)
    return folder, captions, features, selfgen


def argv(world, out, *extra):
    folder, captions, features, selfgen = world
    return ["--captions", str(captions), "--features", str(features), "--selfgen", str(selfgen),
            "--quality", str(folder / "quality.h5"), "--out", str(out), "--preset", "tiny", "--eta", "3",
            "--max-steps", "10", "--batch-size", "6", "--lr", "1e-3", "--warmup", "2", "--eval-every", "0",
            "--log-every", "1", "--save-every", "2", "--dropout", "0", *extra]


def run(world, out, extra, kill_at=None, monkeypatch=None):
    """06's main; with ``kill_at`` it stops right after the checkpoint of that step, as a SIGKILL would."""
    if kill_at is not None:
        save = Trainer.save

        def save_then_die(self, extra_state=None):
            save(self, extra_state)
            if self.step == kill_at:
                raise Killed

        monkeypatch.setattr(Trainer, "save", save_then_die)
        with pytest.raises(Killed):
            stage.main(argv(world, out, *extra))
        monkeypatch.undo()
    else:
        stage.main(argv(world, out, *extra))


def log_without_times(folder):
    rows = [json.loads(line) for line in (folder / "selection_log.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if "seconds" not in k} for r in rows]


STRATEGIES = {
    "loss-remove": ["--strategy", "loss-remove", "--curate-ratio", "0.1"],
    "loss-replacecap": ["--strategy", "loss-replacecap", "--curate-ratio", "0.2"],
    # no evaluation improves by more than 10 nats: each one after the first is flat
    "curriculum": ["--strategy", "curriculum", "--difficulty", "u", "--buckets", "3", "--patience", "1",
                   "--min-improvement", "10"],
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_a_killed_strategy_resumes_with_the_same_draws(name, world, tmp_path, monkeypatch):
    from safetensors.torch import load_file

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    extra = STRATEGIES[name]
    run(world, tmp_path / "straight", extra)
    # killed inside a round (step 4: after the curation at step 3) and at a round's end (step 6: before the
    # curation at step 6), then resumed
    for kill_at in (4, 6):
        out = tmp_path / f"killed{kill_at}"
        run(world, out, extra, kill_at, monkeypatch)
        assert json.loads((out / "train_state.json").read_text())["step"] == kill_at
        run(world, out, extra)
        a, b = load_file(str(tmp_path / "straight" / "model.safetensors")), load_file(str(out / "model.safetensors"))
        assert all(torch.equal(a[k], b[k]) for k in a), kill_at
        assert log_without_times(out) == log_without_times(tmp_path / "straight")
    log = log_without_times(tmp_path / "straight")
    assert len(log) == 4  # rounds starting at steps 0, 3, 6, 9
    if name == "curriculum":
        assert [r["buckets"] for r in log] == [1, 1, 2, 2]  # the first evaluation sets the best, the second adds
    else:
        assert all(r.get("flagged", 1) >= 1 for r in log)
        sizes = [r["size"] for r in log]
        assert sizes == ([60] * 4 if name == "loss-replacecap" else sorted(sizes, reverse=True))
    torch.set_num_threads(threads)
