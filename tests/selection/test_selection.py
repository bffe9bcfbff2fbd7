"""06_train_selection.py: the schedule, the ablations, resume and DDP draws."""
import argparse
import json

import numpy as np
import pytest
import torch
from conftest import import_script, kill_after_checkpoint, run_script
from toyworld import make_toy_world

from clid.base.files import write_quality
from clid.selection import schedule as selection_module

selection = import_script("06_train_selection.py", "selection")


def plan_args(**kw):
    base = dict(c=2.0, s=1.0, eta=1200, full_epochs=False, schedule="smooth", strategy="clid", max_steps=100_000,
                batch_size=64, seed=0)
    base.update(kw)
    return argparse.Namespace(**base)


def test_plan_follows_the_paper_schedule():
    rng = np.random.default_rng(0)
    u = torch.from_numpy(rng.normal(size=1003).astype(np.float32))
    lengths, levels = rng.integers(3, 60, 1003), rng.integers(1, 8, 1003)
    plan = selection_module.make_plan(u, 500, lengths, levels, 7, plan_args())
    draws = [p for p in plan if p["drawn"]]
    assert len(draws) == 50  # c*i < 100 for i = 0..49
    for p in draws:
        i = p["iteration"]
        assert p["drawn"] == int(1003 * (1 - 2 * i / 100) + 1e-9)  # the authors' int(M * (1 - c*i/100))
        assert p["threshold"] == pytest.approx(float(np.percentile(u.numpy(), 2 * i)), abs=1e-6)
        assert (p["start"], p["end"]) == (1200 * i, 1200 * (i + 1))
        assert sum(p["levels"]) == p["drawn"]
    assert plan[-1] == {**plan[-1], "start": 60_000, "end": 100_000, "drawn": 0, "trusted_only": True}
    # the mean u of the draw rises as the threshold rises
    means = [p["mean_u"] for p in draws]
    assert means[-1] > means[len(means) // 2] > means[0]


def test_eta_is_the_papers_for_the_task():
    base = ["--captions", "c.json", "--selfgen", "s.jsonl", "--quality", "q.h5", "--features", "f.h5", "--out", "o"]
    assert selection.parse_args(base).eta == 1200
    assert selection.parse_args(base + ["--levels", "paragraph"]).eta == 200
    assert selection.parse_args(base + ["--levels", "paragraph", "--eta", "50"]).eta == 50


def test_draws_prefer_high_u_and_are_reproducible():
    u = torch.linspace(-3, 3, 2000)
    args = plan_args()
    drawn, threshold = selection_module.draw(u, 25, args)  # T = median, half the pool
    assert len(drawn) == 1000 and abs(threshold) < 1e-2
    assert (u[drawn] > 0).float().mean() > 0.75  # weighted towards u above T
    assert np.array_equal(drawn, selection_module.draw(u, 25, args)[0])
    assert not np.array_equal(drawn, selection_module.draw(u, 25, plan_args(seed=1))[0])
    hard, _ = selection_module.draw(u, 25, plan_args(schedule="hard"))
    assert (u[hard] >= threshold).all()  # s -> 0: a step at T
    constant, _ = selection_module.draw(u, 25, plan_args(schedule="constant"))
    assert 0.4 < (u[constant] > 0).float().mean() < 0.6  # every caption equally likely


def test_full_epochs_and_none_schedules():
    u = torch.zeros(100)
    lengths, levels = np.full(100, 12), np.full(100, 2)
    plan = selection_module.make_plan(u, 60, lengths, levels, 7, plan_args(full_epochs=True, batch_size=16, c=25))
    assert [p["end"] - p["start"] for p in plan if p["drawn"]] == [10, 9, 7, 6]  # ceil((60 + k) / 16)
    none = selection_module.make_plan(u, 60, lengths, levels, 7, plan_args(schedule="none", max_steps=50))
    assert none == [{"iteration": 0, "start": 0, "end": 50, "threshold": None, "drawn": 100, "pool": 100,
                     "digest": "all"}]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sel")
    captions, features = make_toy_world(folder, n_train=20, n_val=4, n_test=4)
    selfgen = folder / "selfgen.jsonl"
    texts = ["a red dog", "a blue ball and a green tree in the park",
             "a yellow car next to a red boat and a blue cat on the grass in the park with a tree"]
    ids = []
    with open(selfgen, "w") as f:
        for i in range(1, 29):
            for n, text in enumerate(texts):
                f.write(json.dumps({"id": f"{i}_{n}", "image_id": i, "caption": text}) + "\n")
                if i <= 20:
                    ids.append(f"{i}_{n}")
    quality = folder / "quality.h5"
    u = np.random.default_rng(0).normal(size=len(ids))
    write_quality(quality, ids, u, np.zeros(len(ids)), u)
    return captions, features, selfgen, quality


def cmd(world, out, *extra):
    captions, features, selfgen, quality = world
    return ["06_train_selection.py", "--captions", captions, "--features", features, "--selfgen", selfgen,
            "--quality", quality, "--out", out, "--preset", "tiny", "--c", "25", "--eta", "3", "--max-steps", "16",
            "--batch-size", "8", "--lr", "1e-3", "--warmup", "2", "--eval-every", "0", "--log-every", "1",
            "--save-every", "2", *extra]


def weights(folder):
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


@pytest.mark.slow
def test_selection_run_log_and_resume_after_kill(tmp_path, world):
    proc = run_script(*cmd(world, tmp_path / "straight"))
    log = [json.loads(line) for line in (tmp_path / "straight" / "selection_log.jsonl").read_text().splitlines()]
    assert [p["drawn"] for p in log] == [60, 45, 30, 15, 0]
    assert all(set(p) >= {"threshold", "drawn", "start", "end"} for p in log)
    assert "iteration 3: T=" in proc.stdout and "mean length" in proc.stdout
    # kill in the middle of an iteration, start again: the same weights as the uninterrupted run
    state = tmp_path / "killed" / "train_state.json"
    kill_after_checkpoint(cmd(world, tmp_path / "killed"), state, min_step=4)
    assert json.loads(state.read_text())["step"] < 16
    resumed = run_script(*cmd(world, tmp_path / "killed"))
    assert "resumed from" in resumed.stdout
    a, b = weights(tmp_path / "straight"), weights(tmp_path / "killed")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads(state.read_text())["iteration"] == 4


@pytest.mark.slow
def test_missing_scores_are_an_error(tmp_path, world):
    captions, features, selfgen, _ = world
    partial = tmp_path / "partial.h5"
    write_quality(partial, ["1_0", "1_1"], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0])
    proc = run_script(*cmd((captions, features, selfgen, partial), tmp_path / "x"), check=False)
    assert proc.returncode != 0 and "58 self-generated captions have no quality score" in proc.stderr


@pytest.mark.slow
def test_ddp_ranks_draw_the_same_captions(tmp_path, world):
    run_script("-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29533",
               *cmd(world, tmp_path / "ddp", "--max-steps", "8", "--dropout", "0"), env={"OMP_NUM_THREADS": "1"})
    run_script(*cmd(world, tmp_path / "one", "--max-steps", "8", "--dropout", "0"))

    def losses(folder):
        return [r["loss"] for r in map(json.loads, (folder / "train_log.jsonl").read_text().splitlines()) if "loss" in r]

    np.testing.assert_allclose(losses(tmp_path / "ddp"), losses(tmp_path / "one"), rtol=1e-5)


def test_the_selection_stage_starts_as_the_authors_code():
    """Where the paper is silent, 06 follows the authors' configuration: a random initialisation, a
    fresh cosine over 300,000 steps of which the stage trains 100,000 (the rate ends at 75% of its
    peak), eta = 1200 steps of a batch of 64."""
    from clid.training.flags import settings_from_args
    from clid.training.loss import learning_rate

    args = selection.parse_args(["--captions", "c.json", "--selfgen", "s.jsonl", "--quality", "q.h5",
                                 "--features", "f.h5", "--out", "o"])
    assert (args.init, args.eta, args.batch_size, args.max_steps, args.full_epochs) == ("random", 1200, 64, 100_000, False)
    s = settings_from_args(args)
    last = learning_rate(s.max_steps - 1, s.lr, s.warmup, s.lr_horizon or s.max_steps)
    assert last / s.lr == pytest.approx(0.753, abs=0.001)



def test_the_numpy_reference_of_the_schedule_draws_what_06_draws():
    """clid.selection.reference.schedule_draw, the schedule in a few NumPy lines, equals 06's draw (the kernels)."""
    from types import SimpleNamespace

    import numpy as np
    import torch

    from clid.selection.reference import schedule_draw
    from clid.selection.schedule import draw

    u = np.random.default_rng(3).normal(size=5003).astype(np.float32)
    for iteration in (0, 1, 7, 33, 49):
        args = SimpleNamespace(c=2.0, s=1.0, seed=11, schedule="smooth")
        drawn, _ = draw(torch.from_numpy(u), iteration, args)
        expected = schedule_draw(u, iteration, c=2.0, s=1.0, seed=11)
        assert len(expected) == int(5003 * (100 - 2 * iteration) / 100 + 1e-9)
        np.testing.assert_array_equal(np.sort(drawn), expected)
