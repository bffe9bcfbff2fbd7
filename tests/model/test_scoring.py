"""Eq. 2 scoring (clid.model.scoring) and 05_score_quality.py."""
import json

import numpy as np
import pytest
import torch
from conftest import import_script, run_script
from toyworld import make_toy_world

from clid.base.files import read_quality
from clid.base.text import eos_id, get_levels
from clid.data.inputs import make_examples
from clid.data.store import FeatureStore, RegionCache
from clid.model import scoring
from clid.model.captioner import Captioner, CaptionerConfig, build_model
from clid.model.checkpoints import save_model
from clid.model.scoring import caption_logprobs, caption_logprobs_eager

TINY = dict(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128, region_hidden=64)
CAPTIONS = ["a red dog", "a blue ball and a green tree", "a dog",
            "a yellow car next to a red boat and a blue cat sitting on the grass in the park with a small tree",
            "a green boat", "a red cat and a yellow ball on the grass"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    folder = tmp_path_factory.mktemp("score")
    captions, features = make_toy_world(folder, n_train=12, n_val=2, n_test=2)
    torch.manual_seed(0)
    model = build_model(CaptionerConfig(region_dim=32, levels=get_levels("caption"), dropout=0.0, **TINY)).eval()
    store = FeatureStore(features)
    items = [(f"{i}_{n}", str(i), text) for i in range(1, 13) for n, text in enumerate(CAPTIONS) if (i + n) % 2 == 0]
    examples, skipped = make_examples(items, model.tokenizer, model.levels, "selfgen", store)
    assert not skipped and len(set(examples.levels)) >= 3
    return folder, captions, features, model, examples, RegionCache(store)


@torch.no_grad()
def brute_force_prefix(model, examples, regions, i, count_padding=False):
    """Eq. 2 for one caption, alone, by the definition: one pass per position, full log-softmax."""
    tok = model.tokenizer
    level = examples.levels[i]
    high = model.levels[level - 1][1]
    target = examples.tokens[i] + [eos_id(tok)] * (high - len(examples.tokens[i]))
    m = high if count_padding else len(examples.tokens[i])
    f, p, r = regions.batch([examples.image_ids[i]])
    total = 0.0
    for t in range(m):
        ids = torch.tensor([target[:t] + [tok.mask_token_id] * (high - t)])
        states = model.encode(f.double(), p.double(), r, ids, torch.tensor([level]))
        logits = model.logits_from_hidden(model.hidden(states[:, t]))
        total += float(logits.log_softmax(-1)[0, target[t]])
    return total / m


@pytest.mark.parametrize("count_padding", [False, True])
def test_prefix_scores_equal_the_definition(setup, count_padding):
    _, _, _, model, examples, regions = setup
    fast = caption_logprobs(model, examples, regions, "prefix", batch_size=5, count_padding=count_padding)
    reference_model = Captioner(model.config).double().eval()
    reference_model.load_state_dict(model.state_dict())
    reference_model.tokenizer = model.tokenizer
    for i in range(0, len(examples), 3):
        expected = brute_force_prefix(reference_model, examples, regions, i, count_padding)
        # float32 model and kernels against a float64 reference: ~1e-6 relative on logp ~ -10
        assert abs(fast[i] - expected) < 1e-4, (i, fast[i], expected)


@pytest.mark.slow
def test_fast_prefix_equals_the_authors_loop(setup):
    _, _, _, model, examples, regions = setup
    fast = caption_logprobs(model, examples, regions, "prefix", batch_size=4, count_padding=False)
    eager = caption_logprobs_eager(model, examples, regions, batch_size=7, count_padding=False)
    np.testing.assert_allclose(fast, eager, atol=1e-4)
    fast_padding = caption_logprobs(model, examples, regions, "prefix", batch_size=4, count_padding=True)
    eager_padding = caption_logprobs_eager(model, examples, regions, batch_size=7, count_padding=True)
    np.testing.assert_allclose(fast_padding, eager_padding, atol=1e-4)
    assert not np.allclose(fast, fast_padding)
    # the default is the authors' count (measure_noise.py divides by every non-pad position)
    np.testing.assert_array_equal(caption_logprobs(model, examples, regions, "prefix", batch_size=4), fast_padding)


def test_a_batch_never_mixes_sources(setup):
    """05 --include-trusted appends the trusted captions: the self-generated ones keep the batches they have without
    them (so their u stay bit for bit: tests/demo/test_threads.py), and no batch holds both sources."""
    _, _, features, model, examples, _ = setup
    items = [(f"t{i}_{n}", str(i), text) for i in range(1, 13) for n, text in enumerate(CAPTIONS) if (i + n) % 2]
    trusted, _ = make_examples(items, model.tokenizer, model.levels, "trusted", FeatureStore(features))
    alone = [list(chunk) for chunk, _ in scoring._batches(examples, model, 4, True)]
    both = [list(chunk) for chunk, _ in scoring._batches(examples + trusted, model, 4, True)]
    assert all(len({(examples + trusted).sources[i] for i in chunk}) == 1 for chunk in both)
    assert [chunk for chunk in both if chunk[0] < len(examples)] == alone
    assert sorted(i for chunk in both for i in chunk) == list(range(len(examples) + len(trusted)))


def test_05_counts_m_as_the_authors_by_default():
    score = import_script("05_score_quality.py", "score_quality_count")
    args = score.parse_args(["--trusted", "t", "--extended", "e", "--selfgen", "s", "--features", "f", "--out", "q.h5"])
    assert args.count == "level"
    assert score.parse_args(["--trusted", "t", "--extended", "e", "--selfgen", "s", "--features", "f", "--out", "q.h5",
                             "--count", "caption"]).count == "caption"


def test_approximate_modes(setup):
    _, _, _, model, examples, regions = setup
    prefix = caption_logprobs(model, examples, regions, "prefix")
    for mode in ("pseudo", "onepass"):
        approx = caption_logprobs(model, examples, regions, mode, batch_size=3)
        assert approx.shape == prefix.shape and np.isfinite(approx).all()
        assert not np.allclose(approx, prefix)
    # onepass: every position read from the all-[MASK] input in one pass
    i = 0
    f, p, r = regions.batch([examples.image_ids[i]])
    level = examples.levels[i]
    high = model.levels[level - 1][1]
    with torch.no_grad():
        states = model.encode(f, p, r, torch.full((1, high), model.tokenizer.mask_token_id), torch.tensor([level]))
        logp = model.logits_from_hidden(model.hidden(states[0])).log_softmax(-1)
    m = len(examples.tokens[i])
    expected = float(np.mean([float(logp[t, examples.tokens[i][t]]) for t in range(m)]))
    assert abs(caption_logprobs(model, examples.subset([i]), regions, "onepass", count_padding=False)[0] - expected) < 1e-5


def save_two_models(model, folder) -> None:
    """``folder/trusted`` and ``folder/extended``: the model, and a copy that scores "." differently (05
    refuses one model given twice)."""
    import copy

    save_model(model, folder / "trusted")
    other = copy.deepcopy(model)
    with torch.no_grad():
        other.head.bias[int(model.to_output(torch.tensor(eos_id(model.tokenizer))))] += 1.0
    save_model(other, folder / "extended")


@pytest.mark.slow
def test_score_stage_end_to_end(setup, tmp_path):
    folder, captions, features, model, _, _ = setup
    save_two_models(model, tmp_path)
    selfgen = tmp_path / "selfgen.jsonl"
    with open(selfgen, "w") as f:
        for i in range(1, 17):  # images 13-16 are val/test images
            for n, text in enumerate(CAPTIONS[:3]):
                f.write(json.dumps({"id": f"{i}_{n}", "image_id": i, "caption": text}) + "\n")
    out = tmp_path / "quality.h5"
    proc = run_script("05_score_quality.py", "--trusted", tmp_path / "trusted", "--extended", tmp_path / "extended",
                      "--selfgen", selfgen, "--features", features, "--out", out, "--captions", captions,
                      "--include-trusted", "--chunk-size", "20")
    q = read_quality(out)
    assert "not scored 12: selfgen: image not in the training split" in proc.stdout
    assert len(q["id"]) == 12 * 3 + 12 * 3  # self-generated of train images + the trusted captions
    np.testing.assert_allclose(q["u"], q["logp_trusted"] - q["logp_extended"], atol=1e-5)  # (u: in float64, then stored)
    assert np.all(q["u"] != 0)  # the extended model scores "." differently
    # Eq. 2 as the authors count m (every position of the level, the "." padding included)
    row_of = {c: k for k, c in enumerate(q["id"])}
    items = [(f"{i}_{n}", str(i), text) for i in range(1, 13) for n, text in enumerate(CAPTIONS[:3])]
    store = FeatureStore(features)
    scored, _ = make_examples(items, model.tokenizer, model.levels, "selfgen", store)
    want = caption_logprobs(model, scored, RegionCache(store), count_padding=True)
    np.testing.assert_allclose(q["logp_trusted"][[row_of[c] for c in scored.caption_ids]], want, atol=2e-5)
    assert (tmp_path / "quality_histogram.png").exists() and "positive u" in proc.stdout
    # two shards give the same scores as one
    for k in range(2):
        run_script("05_score_quality.py", "--trusted", tmp_path / "trusted", "--extended", tmp_path / "extended",
                   "--selfgen", selfgen, "--features", features, "--out", tmp_path / "q2.h5", "--captions", captions,
                   "--shard-id", k, "--num-shards", 2)
    q2 = read_quality(tmp_path / "q2.h5")
    selfgen_rows = q["source"] == "selfgen"
    assert list(q2["id"]) == list(q["id"][selfgen_rows])
    np.testing.assert_allclose(q2["logp_trusted"], q["logp_trusted"][selfgen_rows], atol=1e-5)
    # a trusted model that reads class probabilities and an extended one that does not: one clear error
    torch.manual_seed(0)
    reads_classes = build_model(CaptionerConfig(region_dim=32, levels=get_levels("caption"), num_classes=6, **TINY))
    save_model(reads_classes, tmp_path / "trusted_cls")
    proc = run_script("05_score_quality.py", "--trusted", tmp_path / "trusted_cls", "--extended", tmp_path / "extended",
                      "--selfgen", selfgen, "--features", features, "--out", tmp_path / "q3.h5", "--captions", captions,
                      check=False)
    assert proc.returncode != 0 and "different length levels, output vocabularies, region class counts or box inputs" in proc.stderr
    assert not (tmp_path / "q3.h5").exists()


def test_a_resumed_score_stage_keeps_the_skip_counts_of_earlier_chunks(setup, tmp_path, monkeypatch, capsys):
    _, captions, features, model, _, _ = setup
    save_two_models(model, tmp_path)
    too_long = " ".join(["a red dog next to a blue ball"] * 12)  # beyond the last level: not scored
    selfgen = tmp_path / "selfgen.jsonl"
    with open(selfgen, "w") as f:
        for i in range(1, 13):
            for n, text in enumerate([CAPTIONS[0], too_long]):
                f.write(json.dumps({"id": f"{i}_{n}", "image_id": i, "caption": text}) + "\n")
    out = tmp_path / "quality.h5"
    argv = [str(x) for x in ("--trusted", tmp_path / "trusted", "--extended", tmp_path / "extended", "--selfgen",
                             selfgen, "--features", features, "--out", out, "--chunk-size", 6)]
    stage05 = import_script("05_score_quality.py", "stage05")
    real, calls = scoring.caption_logprobs, []  # (05 imports it from clid.model.scoring once its flags are read)

    def killed_in_the_second_chunk(*args, **kwargs):
        calls.append(1)
        if len(calls) > 2:  # two models a chunk: the first chunk is done
            raise KeyboardInterrupt("killed")
        return real(*args, **kwargs)

    monkeypatch.setattr(scoring, "caption_logprobs", killed_in_the_second_chunk)
    with pytest.raises(KeyboardInterrupt):
        stage05.main(argv)
    monkeypatch.setattr(scoring, "caption_logprobs", real)
    capsys.readouterr()
    stage05.main(argv)
    printed = capsys.readouterr().out
    assert "resuming: 1 of 4 chunks already done" in printed
    assert "not scored 12: selfgen: a length outside the levels (tokens: captions) 97: 12" in printed  # 3 in chunk 1
    assert len(read_quality(out)["id"]) == 12
    assert [line.split("\t") for line in (tmp_path / "quality.h5.skipped.tsv").read_text().splitlines()][1:] == \
        [["selfgen: length 97 outside the levels", "3"]] * 4
