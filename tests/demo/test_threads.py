"""One seed, one model, however many threads: a CPU splits its float sums by torch's thread count, so 04 at one
and at two threads trains other weights; ``--threads`` (the demo recipe: 1) fixes the count and the weights."""
import runpy
import sys

import pytest
import torch
from conftest import ROOT
from toyworld import make_toy_world

from clid.run.recipes import MODELS, flag_defaults


def train(captions, features, out, threads: int, flag: int) -> dict:
    """04 in-process with torch at ``threads`` threads and ``--threads flag``: its weights."""
    from safetensors.torch import load_file

    torch.set_num_threads(threads)
    argv = sys.argv
    sys.argv = ["04_train_base.py", "--captions", str(captions), "--features", str(features), "--out", str(out),
                "--preset", "tiny", "--max-steps", "3", "--warmup", "1", "--batch-size", "32", "--eval-every", "0",
                "--threads", str(flag)]
    try:
        runpy.run_path(str(ROOT / "04_train_base.py"), run_name="__main__")
    except SystemExit as exit:
        assert not exit.code, exit.code
    finally:
        sys.argv = argv
    return load_file(out / "model.safetensors")


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_one_and_two_threads_train_the_same_weights_under_threads_1(tmp_path):
    """The demo's model size (tiny: 3 layers of 192) on a toy world, 3 steps: at one thread and at two the weights
    differ, which is why the recipe fixes the count; with --threads 1 entered from two threads they are the first
    run's, bit for bit."""
    before = torch.get_num_threads()
    try:
        captions, features = make_toy_world(tmp_path, n_train=64, n_val=4, n_test=4, dim=64, long_every=3)
        one = train(captions, features, tmp_path / "one", 1, 0)
        two = train(captions, features, tmp_path / "two", 2, 0)
        fixed = train(captions, features, tmp_path / "fixed", 2, 1)
    finally:
        torch.set_num_threads(before)
    assert not same(one, two)
    assert same(one, fixed)


def test_the_demo_recipe_trains_every_model_at_one_thread():
    assert all(flag_defaults("demo", model)["threads"] == 1 for model in MODELS)
