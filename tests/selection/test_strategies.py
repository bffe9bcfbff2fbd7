"""clid/selection/schedule.py: the plan and draws of every 06 strategy on tiny pools with known losses, the
difficulties of the curriculum (u, a bootstrap checkpoint, a tiny random CLIP) and their flags."""
import argparse

import numpy as np
import pytest
import torch
from conftest import import_script
from toyworld import make_toy_world

from clid.selection import peers
from clid.selection import schedule as sel

SCRIPT = import_script("06_train_selection.py", "selection_stage")


def args_for(**kw):
    base = dict(strategy="loss-remove", c=2.0, s=1.0, eta=3, full_epochs=False, schedule="smooth", max_steps=12,
                batch_size=4, seed=0, curate_every=3, curate_ratio=0.1, curate_std=None, buckets=3, patience=2,
                difficulty=None, loss_mode="onepass", min_improvement=0.0, captions=None, selfgen=None)
    base.update(kw)
    return argparse.Namespace(**base)


def tiny_pool(n_trusted=4, n_pool=6, images=None):
    n = n_trusted + n_pool
    images = images or [str(i // 2) for i in range(n)]  # two captions per image
    return sel.Pool(images, [f"c{i}" for i in range(n)], n_trusted, np.arange(n_pool) + 3,
                    np.ones(n_pool, dtype=np.int64), 7)


def drive(strategy, step=0, state=None):
    """The rounds a strategy yields when training runs straight through (as 06's loop does)."""
    return list(strategy.rounds(step, state or {}))


# -- loss-remove, loss-replacecap ------------------------------------------------------------------------


def test_remove_flags_exactly_the_top_ratio():
    loss = np.array([0.5, 3.0, 1.0, 9.0, 2.0, 9.0, 0.1, 4.0, 5.0, 6.0])
    assert list(peers.flag_high_loss(loss, ratio=0.2)) == [3, 5]  # round(10 * 0.2) = 2, ties: earlier first
    assert list(peers.flag_high_loss(loss, ratio=0.3)) == [3, 5, 9]
    assert len(peers.flag_high_loss(loss, ratio=0.01)) == 0  # round(0.1) = 0, as their code rounds
    assert list(peers.flag_high_loss(np.arange(200.0), ratio=0.01)) == [199, 198]


def test_remove_flags_exactly_the_two_std_set():
    loss = np.concatenate([np.full(50, 1.0), [1.5, 8.0, 2.0, 9.0]])
    cut = loss.mean() + 2 * loss.std(ddof=1)  # pandas' std, as their --dynamic
    flagged = peers.flag_high_loss(loss, n_std=2)
    assert set(flagged) == set(np.flatnonzero(loss > cut)) == {51, 53}
    assert list(flagged) == [53, 51]  # highest loss first
    assert len(peers.flag_high_loss(np.ones(20), n_std=2)) == 0


def test_loss_remove_rounds_drop_the_highest_losses_for_good():
    pool = tiny_pool()
    losses = np.array([1.0, 2.0, 3.0, 9.0, 0.5, 8.0, 1.5, 7.0, 0.2, 0.3])  # fixed per example
    seen = []

    def logp(indices):
        seen.append(list(indices))
        return -losses[indices]

    strategy = peers.LossCuration(pool, args_for(curate_ratio=0.2), logp)
    rounds = drive(strategy)
    assert [(r.start, r.end) for r in rounds] == [(0, 3), (3, 6), (6, 9), (9, 12)]
    assert list(rounds[0].members) == list(range(10))
    assert list(rounds[1].members) == [0, 1, 2, 4, 6, 7, 8, 9]  # 3 and 5 (losses 9, 8) removed
    assert list(rounds[2].members) == [0, 1, 4, 6, 8, 9]  # round(8 * 0.2) = 2 more: 7 and 2 (losses 7, 3)
    assert list(rounds[3].members) == [0, 4, 6, 8, 9]  # round(6 * 0.2) = 1: 1 (loss 2)
    assert seen[1] == [0, 1, 2, 4, 6, 7, 8, 9]  # the current set is scored, not the whole pool
    assert [e["flagged"] for e in strategy.history] == [2, 2, 1]
    # the log names the removed captions; its rows rebuild every round's set
    rows = strategy.log_rows()
    assert rows[1]["removed"] == ["c3", "c5"] and (rows[1]["trusted"], rows[1]["pool"]) == (3, 5)  # 3 is trusted
    assert [r["digest"] for r in rows] == [sel.digest(r.members) for r in rounds]


def test_loss_replacecap_keeps_the_sample_count_and_the_image():
    images = ["a", "a", "a", "b", "b", "c", "c", "c", "d", "d"]
    pool = tiny_pool(images=images)
    losses = np.array([0.1, 0.2, 5.0, 6.0, 0.3, 7.0, 0.4, 0.5, 8.0, 0.6])
    strategy = peers.LossCuration(pool, args_for(strategy="loss-replacecap", curate_ratio=0.2, max_steps=30),
                                lambda indices: -losses[indices])
    rounds = drive(strategy)
    flagged_ever = set()
    for before, after, entry in zip(rounds, rounds[1:], strategy.history):
        assert len(after.members) == len(before.members) == 10  # the sample count is kept
        for position, old, new in entry["replaced"]:
            assert before.members[position] == old and after.members[position] == new
            assert images[new] == images[old]  # another caption of the same image
            flagged_ever.add(old)
            assert new not in flagged_ever or new == old  # a flagged caption is never drawn again
    # first curation: 8 (loss 8) and 5 (loss 7); image d has one other caption, 9
    assert strategy.history[0]["replaced"][0] == [8, 8, 9]
    # image d runs out of captions once both were flagged: the sample keeps its caption
    assert any(old == new for e in strategy.history for _, old, new in e["replaced"])


def test_loss_curation_resumes_from_its_saved_history():
    pool = tiny_pool()
    losses = np.linspace(0, 1, 10)
    args = args_for(curate_ratio=0.2)
    straight = drive(peers.LossCuration(pool, args, lambda i: -losses[i]))
    state = straight[2].state  # what a checkpoint in round 2 holds
    calls = []
    resumed = drive(peers.LossCuration(pool, args, lambda i: calls.append(1) or -losses[i]), step=7, state=state)
    assert [r.start for r in resumed] == [6, 9]
    assert all(np.array_equal(a.members, b.members) for a, b in zip(straight[2:], resumed))
    assert len(calls) == 1  # only the curation at step 9 is computed again


# -- curriculum ------------------------------------------------------------------------------------------


def test_baby_step_adds_a_bucket_after_patience_flat_evaluations():
    assert peers.baby_step([1.0, 2.0, 3.0, 4.0], patience=2, n_buckets=3) == [1, 1, 1, 1]  # still improving
    assert peers.baby_step([1.0, 2.0, 2.0, 1.5], patience=2, n_buckets=3) == [1, 1, 1, 2]
    # after a bucket is added the best starts over: the next evaluation sets it
    assert peers.baby_step([1.0, 0.9, 0.5, 0.6, 0.6, 0.6, 0.6], patience=2, n_buckets=3) == [1, 1, 2, 2, 2, 3, 3]
    assert peers.baby_step([1.0] * 8, patience=1, n_buckets=3) == [1, 2, 2, 3, 3, 3, 3, 3]
    # an improvement counts only above --min-improvement
    assert peers.baby_step([1.0, 1.05, 1.1, 1.3], patience=2, n_buckets=3, min_improvement=0.1) == [1, 1, 2, 2]


def test_curriculum_buckets_follow_the_difficulty():
    difficulty = np.array([5.0, 1.0, 3.0, 0.0, 4.0, 2.0, 1.0, 9.0, 8.0])
    buckets = peers.difficulty_buckets(difficulty, 3)
    assert [list(b) for b in buckets] == [[1, 3, 6], [2, 4, 5], [0, 7, 8]]  # easiest first, ties by index


def test_curriculum_rounds_grow_the_set_after_flat_evaluations():
    pool = tiny_pool(n_trusted=3, n_pool=6)
    difficulty = np.arange(9.0)[::-1]  # the last example is the easiest
    scores = iter([1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0])
    strategy = peers.BabyStep(pool, difficulty, args_for(strategy="curriculum", max_steps=30, patience=2),
                            lambda: next(scores))
    rounds = drive(strategy)
    assert [len(r.members) for r in rounds] == [3, 3, 3, 6, 6, 6, 9, 9, 9, 9]
    assert list(rounds[0].members) == [6, 7, 8]
    rows = strategy.log_rows()
    assert [r["buckets"] for r in rows] == [1, 1, 1, 2, 2, 2, 3, 3, 3, 3]
    # a resumed run rebuilds the buckets in use from the saved evaluations
    resumed = drive(peers.BabyStep(pool, difficulty, strategy.args, lambda: 2.0), step=12, state=rounds[4].state)
    assert [len(r.members) for r in resumed] == [6, 6, 9, 9, 9, 9]


# -- clid and none ---------------------------------------------------------------------------------------


def test_clid_and_none_rounds():
    pool = tiny_pool(n_trusted=4, n_pool=100)
    u = torch.linspace(-2, 2, 100)
    rounds = drive(sel.Schedule(pool, u, args_for(strategy="clid", c=25, max_steps=20)))
    assert [(r.start, r.end, len(r.members)) for r in rounds] == [(0, 3, 104), (3, 6, 79), (6, 9, 54), (9, 12, 29),
                                                                   (12, 20, 4)]
    assert all(list(r.members[:4]) == [0, 1, 2, 3] for r in rounds)  # the trusted captions always
    assert rounds[2].members[4:].min() >= 4 and np.mean(rounds[3].members[4:]) > np.mean(rounds[1].members[4:])
    none = drive(sel.Schedule(pool, None, args_for(strategy="none", max_steps=20)))
    assert [(r.start, r.end, len(r.members)) for r in none] == [(0, 20, 104)]


# -- difficulty ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    from clid.base.text import get_levels
    from clid.data.inputs import training_items, usable
    from clid.data.store import FeatureStore, RegionCache
    from clid.model.captioner import CaptionerConfig, build_model
    from clid.model.checkpoints import save_model

    folder = tmp_path_factory.mktemp("strategies")
    captions, features = make_toy_world(folder, n_train=6, n_val=2, n_test=2, dim=16)
    torch.manual_seed(0)
    model = build_model(CaptionerConfig(region_dim=16, levels=get_levels("caption"), dropout=0.0, hidden_size=32,
                                        num_layers=1, num_heads=2, intermediate_size=64, region_hidden=32)).eval()
    save_model(model, folder / "boot")
    store = FeatureStore(features)
    items = training_items(captions)
    examples, _ = usable(items.trusted, model.levels, "trusted", store)
    return folder, captions, model, examples, RegionCache(store), items


def test_bootstrap_difficulty_is_the_checkpoints_loss(toy, tmp_path):
    from clid.model.scoring import caption_logprobs

    folder, captions, model, examples, regions, items = toy
    pool = sel.Pool(examples.image_ids, examples.caption_ids, len(examples), np.zeros(0), np.zeros(0, np.int64), 7)
    args = args_for(strategy="curriculum", difficulty=f"bootstrap:{folder / 'boot'}")
    difficulty, _ = peers.example_difficulty(args, pool, examples, [], {}, regions, "cpu", tmp_path, model.levels)
    expected = -caption_logprobs(model, examples, regions, "onepass", 64, "cpu")
    np.testing.assert_allclose(difficulty, expected, rtol=1e-6)
    assert (tmp_path / "difficulty.h5").is_file()  # cached for a resumed run
    again, _ = peers.example_difficulty(argparse.Namespace(difficulty="bootstrap:/nowhere"), pool, examples, [], {},
                                      regions, "cpu", tmp_path, model.levels)
    np.testing.assert_array_equal(again, difficulty)


def test_u_difficulty_needs_the_trusted_scores(toy, tmp_path):
    from clid.base.files import DataError, write_quality

    _, _, _, examples, regions, _ = toy
    pool = sel.Pool(examples.image_ids, examples.caption_ids, 3, np.zeros(0), np.zeros(0, np.int64), 7)
    ids = [f"trusted:{c}" if k < 3 else c for k, c in enumerate(examples.caption_ids)]
    u = np.linspace(-1, 1, len(ids))
    write_quality(tmp_path / "q.h5", ids, u, np.zeros(len(ids)), u)
    args = args_for(strategy="curriculum", difficulty="u", quality=tmp_path / "q.h5")
    difficulty, _ = peers.example_difficulty(args, pool, examples, [], {}, regions, "cpu", tmp_path, None, write=False)
    np.testing.assert_allclose(difficulty, -u, rtol=1e-6)
    write_quality(tmp_path / "q2.h5", ids[3:], u[3:], np.zeros(len(ids) - 3), u[3:])
    with pytest.raises(DataError, match="3 trusted captions have no quality score.*--include-trusted"):
        peers.example_difficulty(args_for(strategy="curriculum", difficulty="u", quality=tmp_path / "q2.h5"), pool,
                               examples, [], {}, regions, "cpu", tmp_path, None, write=False)


def tiny_clip(folder):
    """A randomly initialised CLIP with a letter-level tokenizer, saved as a transformers folder."""
    import json
    import string

    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor, CLIPTokenizer

    letters = list(string.ascii_lowercase + string.digits)
    vocab = {t: k for k, t in enumerate(["<|startoftext|>", "<|endoftext|>"] + letters + [c + "</w>" for c in letters])}
    (folder / "vocab.json").parent.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    tokenizer = CLIPTokenizer(vocab=str(folder / "vocab.json"), merges=str(folder / "merges.txt"))
    config = CLIPConfig(text_config=dict(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, max_position_embeddings=77,
                                         bos_token_id=0, eos_token_id=1, pad_token_id=1),
                        vision_config=dict(image_size=32, patch_size=8, hidden_size=32, intermediate_size=64,
                                           num_hidden_layers=1, num_attention_heads=2), projection_dim=16)
    torch.manual_seed(0)
    model = CLIPModel(config).eval()
    model.save_pretrained(str(folder))
    processor = CLIPProcessor(image_processor=CLIPImageProcessor(size={"shortest_edge": 32},
                                                                 crop_size={"height": 32, "width": 32}),
                              tokenizer=tokenizer)
    processor.save_pretrained(str(folder))
    return model, processor


def test_clip_difficulty_from_a_local_folder(tmp_path):
    from PIL import Image

    model, processor = tiny_clip(tmp_path / "clip")
    images = tmp_path / "images"
    images.mkdir()
    rng = np.random.default_rng(0)
    for name in ("1.png", "2.png"):
        Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(images / name)
    texts, image_ids = ["a red dog", "a blue ball", "a red dog"], ["1", "1", "2"]
    sim = peers.clip_similarity(tmp_path / "clip", images, texts, image_ids, {"1": "1.png", "2": "2.png"})
    with torch.no_grad():  # the definition: cosine of the projected embeddings
        pixels = processor(images=[Image.open(images / f"{i}.png").convert("RGB") for i in image_ids],
                           return_tensors="pt")["pixel_values"]
        tokens = processor(text=texts, return_tensors="pt", padding=True)
        a = model.get_image_features(pixel_values=pixels)
        b = model.get_text_features(input_ids=tokens["input_ids"], attention_mask=tokens["attention_mask"])
        a, b = (getattr(x, "pooler_output", x) for x in (a, b))
        expected = torch.nn.functional.cosine_similarity(a, b).numpy()
    np.testing.assert_allclose(sim, expected, atol=1e-5)
    assert sim[0] != sim[1] and np.all(np.abs(sim) <= 1)
    from clid.base.files import DataError

    with pytest.raises(DataError, match="cannot read the image"):
        (images / "3.png").write_text("not an image")
        peers.clip_similarity(tmp_path / "clip", images, ["a dog"], ["3"], {"3": "3.png"})


# -- flags -----------------------------------------------------------------------------------------------

BASE = ["--captions", "c.json", "--selfgen", "s.jsonl", "--features", "f.h5", "--out", "o"]


@pytest.mark.parametrize("extra, message", [
    (["--strategy", "curriculum"], "needs --difficulty"),
    (["--strategy", "curriculum", "--difficulty", "loss"], "--difficulty must be"),
    (["--strategy", "curriculum", "--difficulty", "bootstrap:/no/such/dir"], "is not a folder"),
    (["--strategy", "curriculum", "--difficulty", "u"], "needs --quality"),
    (["--strategy", "clid"], "needs --quality"),
    (["--strategy", "loss-remove", "--curate-ratio", "0"], "argument --curate-ratio: must be"),
    (["--strategy", "loss-remove", "--curate-ratio", "1.5"], "argument --curate-ratio: must be"),
    (["--strategy", "loss-remove", "--curate-std", "-2"], "argument --curate-std: must be a positive"),
    (["--strategy", "loss-remove", "--curate-std", "nan"], "argument --curate-std: must be a positive"),
    (["--strategy", "loss-remove", "--curate-every", "0"], "argument --curate-every: must be a positive integer"),
    (["--strategy", "curriculum", "--difficulty", "u", "--quality", "q.h5", "--buckets", "0"], "--buckets"),
    (["--strategy", "curriculum", "--difficulty", "u", "--quality", "q.h5", "--patience", "0"], "--patience"),
    (["--strategy", "curriculum", "--difficulty", "u", "--quality", "q.h5", "--min-improvement", "-1"],
     "--min-improvement"),
])
def test_strategy_flags_are_checked_where_parsed(extra, message, capsys):
    with pytest.raises(SystemExit):
        SCRIPT.parse_args(BASE + extra)
    assert message in capsys.readouterr().err


def test_clip_difficulty_needs_the_image_folder(tmp_path, capsys):
    with pytest.raises(SystemExit):
        SCRIPT.parse_args(BASE + ["--strategy", "curriculum", "--difficulty", f"clip:{tmp_path}"])
    assert "needs --images" in capsys.readouterr().err
    args = SCRIPT.parse_args(BASE + ["--strategy", "loss-remove", "--eta", "7"])
    assert (args.curate_every, args.curate_ratio, args.curate_std, args.loss_mode) == (7, 0.01, None, "onepass")
