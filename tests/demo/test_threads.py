"""One seed, one result, however many threads a stage gets: a CPU splits its float sums by torch's thread count,
so 04 at one and at two threads trains other weights. The demo recipe fixes the count (04/06: ``threads = 1`` in
recipes/demo.toml; 07 and the caption command: ``--threads 1`` from demo.sh), and these tests check that one
thread and two give the same weights, the same u and the same captions on a toy world."""
import json
import runpy
import sys

import numpy as np
import pytest
import torch
from conftest import ROOT
from toyworld import make_toy_world

from clid.base.files import read_quality
from clid.run.recipes import MODELS, flag_defaults


def run_stage(script: str, threads: int, *flags) -> None:
    """A stage in-process, entered with torch at ``threads`` threads (as OMP_NUM_THREADS would set it)."""
    torch.set_num_threads(threads)
    argv = sys.argv
    sys.argv = [script, *map(str, flags)]
    try:
        runpy.run_path(str(ROOT / script), run_name="__main__")
    except SystemExit as exit:
        assert not exit.code, exit.code
    finally:
        sys.argv = argv


def weights(folder) -> dict:
    from safetensors.torch import load_file

    return load_file(folder / "model.safetensors")


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A toy world and the demo recipe's 04 (3 steps) entered at one thread, at two, and at two with the thread
    count left to torch (--threads 0); torch's count restored afterwards."""
    before = torch.get_num_threads()
    folder = tmp_path_factory.mktemp("threads")
    captions, features = make_toy_world(folder, n_train=64, n_val=4, n_test=8, dim=64, long_every=3)
    train = ["--recipe", "demo", "--captions", captions, "--features", features, "--max-steps", "3", "--warmup", "1",
             "--batch-size", "32"]
    try:
        for name, threads, extra in (("one", 1, []), ("two", 2, []), ("unfixed", 2, ["--threads", "0"])):
            run_stage("04_train_base.py", threads, *train, "--out", folder / name, *extra)
    finally:
        torch.set_num_threads(before)
    return folder, captions, features


@pytest.mark.slow
def test_the_demo_recipes_04_trains_the_same_weights_at_one_thread_and_at_two(world):
    """The demo's model (tiny: 3 layers of 192), 3 steps: entered at one thread and at two, the same weights bit
    for bit; with the count left to torch, two threads train other weights (what the recipe's threads = 1 fixes)."""
    folder, _, _ = world
    assert same(weights(folder / "one"), weights(folder / "two"))
    assert not same(weights(folder / "one"), weights(folder / "unfixed"))


@pytest.mark.slow
def test_07_decodes_the_same_captions_at_one_thread_and_at_two_with_threads_1(world):
    """07 --threads 1 (demo.sh's) entered at one thread and at two: torch decodes on one thread and writes the same
    captions, byte for byte, at every level."""
    folder, captions, features = world
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            run_stage("07_eval.py", threads, "--refs", captions, "--features", features, "--checkpoint",
                      f"CLID={folder / 'one'}", "--threads", "1", "--spice", "off", "--out", folder / f"eval{threads}")
            assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    captions = [(folder / f"eval{threads}" / "generated" / "CLID.jsonl").read_text() for threads in (1, 2)]
    lines = [json.loads(line) for line in captions[0].splitlines()]
    assert len(lines) == 8 * 7 and len({line["level"] for line in lines}) == 7
    assert captions[0] == captions[1]


@pytest.mark.slow
def test_05_scores_the_self_generated_captions_alike_with_and_without_the_trusted_ones(world, tmp_path):
    """make demo-compare's 05 adds --include-trusted to make demo's: at two threads, the self-generated captions'
    u are the same bit for bit, because a batch never mixes the two sources (a CPU's float sums can depend on the
    other rows of a batch)."""
    folder, captions, features = world
    words = "a red dog and a blue cat in the park next to a green ball with a yellow car on the tree".split()
    rng = np.random.default_rng(0)
    selfgen = tmp_path / "selfgen.jsonl"
    with open(selfgen, "w") as f:
        for image in range(1, 33):
            for n in range(3):
                text = " ".join(rng.choice(words, size=int(rng.choice([5, 12, 25, 35]))))
                f.write(json.dumps({"id": f"{image}_{n}", "image_id": image, "caption": text}) + "\n")
    before = torch.get_num_threads()
    scores = {}
    try:
        for name, extra in (("plain", []), ("with-trusted", ["--include-trusted"])):
            out = tmp_path / f"{name}.h5"
            run_stage("05_score_quality.py", 2, "--trusted", folder / "one", "--extended", folder / "unfixed",
                      "--selfgen", selfgen, "--features", features, "--captions", captions, "--out", out,
                      "--chunk-size", "37", "--batch-size", "16", *extra)
            table = read_quality(out)
            scores[name] = {str(i): u for i, u in zip(table["id"], table["u"])}
    finally:
        torch.set_num_threads(before)
    assert len(scores["plain"]) == 96 and len(scores["with-trusted"]) == 96 + 192
    assert all(scores["with-trusted"][i] == u for i, u in scores["plain"].items())


def test_the_demo_recipe_trains_every_model_at_one_thread():
    assert all(flag_defaults("demo", model)["threads"] == 1 for model in MODELS)
