"""Captions of an exact length: ``--length N`` of the caption command and ``length=`` of the API
(``caption``, ``caption_images``, ``decode``), on a tiny checkpoint trained on the toy world."""
from __future__ import annotations

import json

import pytest
import torch
from conftest import import_script
from toyworld import make_toy_world

from clid.base.files import DataError, read_jsonl
from clid.base.text import caption_length, eos_id

TEST_IDS = [str(i) for i in range(45, 53)]  # the toy world's 8 test images


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The toy world and a tiny checkpoint trained 60 steps on it (its captions are levels 1 and 2)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("exact_length")
    captions, features = make_toy_world(root, n_train=40, n_val=4, n_test=8, dim=16)
    train = import_script("04_train_base.py", "train_for_exact_length")
    train.main(["--captions", str(captions), "--features", str(features), "--out", str(root / "ck"), "--preset", "tiny",
                "--max-steps", "60", "--warmup", "10", "--batch-size", "16", "--eval-every", "0", "--lr", "2e-3",
                "--dropout", "0", "--output-vocab", str(captions)])
    yield root
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def writer(world):
    from clid.caption import CaptionWriter

    return CaptionWriter.from_checkpoint(world / "ck", "cpu", features=world / "features.h5", batch_size=8)


def caption_main(*argv):
    from clid.caption.__main__ import main

    main([str(a) for a in argv])


@pytest.mark.slow
@pytest.mark.parametrize("block", [3, 0])
def test_api_gives_captions_of_exactly_n_tokens_from_1_to_the_longest(writer, block):
    from clid.model.decode import exact_level

    writer.block_ngram = block
    assert writer.longest == 69
    for n in (1, 2, 5, 9, 10, 25, 40, 69):
        captions = writer.caption(TEST_IDS, length=n)
        assert set(captions) == set(TEST_IDS)
        for image_id, caption in captions.items():
            # counted again here, as 07 counts a caption: WordPiece tokens of the preprocessed text and the "."
            assert caption_length(str(caption)) == n == caption.length == caption.asked, (n, image_id, caption)
            assert caption.level == exact_level(writer.levels, n) and not caption.filled
            words = str(caption).split()
            assert all(a != b for a, b in zip(words, words[1:])), caption  # (no word doubled)
    assert writer.caption(TEST_IDS[0], length=1) == ""  # the "." alone
    writer.block_ngram = 3


def test_decoding_holds_the_final_stop_at_position_n_minus_1_and_no_stop_before(writer):
    from clid.data.store import load_regions, pad_regions
    from clid.model.decode import mask_predict

    model = writer.model
    regions = pad_regions([load_regions(writer.features, i, model.config.num_classes, model.config.box_input)
                           for i in TEST_IDS[:3]])
    end = eos_id(model.tokenizer)
    for n, level in ((1, 1), (7, 1), (12, 2)):
        ids = mask_predict(model, *regions, level, 4, length=n)
        high = model.levels[level - 1][1]
        assert ids.shape == (3, high)
        assert (ids[:, n - 1:] == end).all() and not (ids[:, :n - 1] == end).any()
        assert not (ids == model.tokenizer.mask_token_id).any()
    with pytest.raises(ValueError, match="does not fit level 1"):
        mask_predict(model, *regions, 1, 4, length=12)


def test_api_refuses_a_length_outside_the_checkpoint_and_with_levels(writer):
    for bad in (0, 70, -3, 2.5, True, "5"):
        with pytest.raises(ValueError, match=r"outside 1\.\.69"):
            writer.caption(TEST_IDS[0], length=bad)
    with pytest.raises(ValueError, match="levels or length, not both"):
        writer.caption(TEST_IDS[0], levels=[1], length=5)
    with pytest.raises(ValueError, match="levels or length, not both"):
        writer.decode(TEST_IDS[:1], levels=[2], length=12)
    with pytest.raises(ValueError, match=r"outside 1\.\.69"):
        writer.caption_images([], length=80)  # checked before any image is read


def test_cli_length_rows_say_the_length_asked_and_got_with_ngram_blocking(world, tmp_path, capsys):
    out = tmp_path / "exact.jsonl"
    caption_main("--checkpoint", world / "ck", "--features", world / "features.h5", "--out", out, "--device", "cpu",
                 "--length", "12", "--block-ngram", "2", "--gallery", tmp_path / "g.html")
    rows = list(read_jsonl(out))
    assert [r["image_id"] for r in rows] == [str(i) for i in range(1, 53)]  # every image of the feature file
    assert all(r["length_asked"] == 12 and r["length"] == 12 and r["level"] == 2 and r["in_range"] for r in rows)
    assert all(caption_length(r["caption"]) == 12 for r in rows)
    for r in rows:  # no 2-gram twice
        words = r["caption"].split()
        assert len(set(zip(words, words[1:]))) == len(words) - 1, r["caption"]
    text = capsys.readouterr().out
    assert "at exactly 12 tokens (level 2 of" in text and "52 of 52 captions have exactly 12 tokens" in text
    record = json.loads((tmp_path / "exact.jsonl.run.json").read_text())
    assert record["settings"]["--length"] == 12
    page = (tmp_path / "g.html").read_text()
    assert "Captions of exactly 12 tokens" in page and page.count('class="len in"') >= 52 and page.count('class="len out"') == 1  # (1: the legend)
    # another length is another run: refused on the same --out without --restart
    with pytest.raises(DataError, match="--length 12 then, 5 now"):
        caption_main("--checkpoint", world / "ck", "--features", world / "features.h5", "--out", out, "--device", "cpu",
                     "--length", "5")


def test_cli_levels_stay_the_default(world, tmp_path):
    out = tmp_path / "levels.jsonl"
    caption_main("--checkpoint", world / "ck", "--features", world / "features.h5", "--out", out, "--device", "cpu",
                 "--limit", "1", "--decode-steps", "2")
    rows = list(read_jsonl(out))  # without --length nor --levels: every level of the checkpoint
    assert [(r["image_id"], r["level"]) for r in rows] == [("1", level) for level in range(1, 8)]
    assert all("length_asked" not in r for r in rows)


@pytest.mark.slow
def test_the_bench_prints_the_hit_rate_per_n_beside_the_levels_control_precision(world, capsys):
    bench = import_script("bench/bench_length.py", "bench_length_for_tests")
    bench.main(["--checkpoint", str(world / "ck"), "--demo", str(world), "--lengths", "5", "12", "25", "40", "80"])
    text = capsys.readouterr().out
    assert "on 8 test images of" in text
    rows = {line.split(" | ")[0].strip("| "): line for line in text.splitlines() if line.startswith("| ")}
    for n, level in (("5", "L1 (1-9)"), ("12", "L2 (10-19)"), ("25", "L3 (20-29)"), ("40", "L5 (40-49)")):
        assert rows[n].startswith(f"| {n} | {level} | 100.0% (8 of 8) | "), rows[n]
    assert "above the longest level (69 tokens)" in rows["80"]
    # the level's control precision, as the caption command counts it at that level
    from clid.caption import CaptionWriter

    writer = CaptionWriter.from_checkpoint(world / "ck", "cpu", features=world / "features.h5")
    at_level_2 = writer.caption(TEST_IDS, levels=[2])
    share = sum(c[2].in_range for c in at_level_2.values()) / len(TEST_IDS)
    assert rows["12"].split(" | ")[3] == f"{share:.1%}"
