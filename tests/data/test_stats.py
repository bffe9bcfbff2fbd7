import json

import pytest
from conftest import run_script

from clid.data.stats import length_stats


def test_length_stats_levels():
    s = length_stats([5, 12, 12, 25, 70], "caption")
    assert s["n"] == 5 and s["above"] == 1
    assert [r["count"] for r in s["levels"]] == [1, 2, 1, 0, 0, 0, 0]
    assert s["levels"][1] == {"level": 2, "low": 10, "high": 19, "count": 2, "pct": 40.0}
    assert abs(s["mean"] - 24.8) < 1e-9


@pytest.mark.slow
def test_stats_cli_on_fixture_files(fixtures):
    for name, n in (("dataset_coco_sample.json", 20), ("captions_val2014_sample.json", 20),
                    ("paragraphs_v1_sample.json", 3), ("dataset_flickr30k_sample.json", 3)):
        out = run_script("-m", "clid.stats", fixtures / name, "--json").stdout
        stats = json.loads(out.strip().splitlines()[-1])
        assert stats["n"] == n
        assert set(stats) >= {"n", "mean", "std", "levels"}
        assert sum(r["count"] for r in stats["levels"]) + stats["above"] + stats["below"] == n


def test_stats_on_paragraph_levels(fixtures):
    out = run_script("-m", "clid.stats", fixtures / "paragraphs_v1_sample.json", "--levels", "paragraph", "--json").stdout
    stats = json.loads(out.strip().splitlines()[-1])
    assert len(stats["levels"]) == 13 and stats["min"] > 20  # sentence breaks counted


def test_paragraph_bands_beside_the_papers_shares(fixtures, capsys):
    from clid.base.text import caption_lengths
    from clid.data.captions import load_captions
    from clid.stats import main

    path = fixtures / "stanford_paragraphs" / "paragraphs_v1.json"
    main([str(path), "--levels", "paragraph", "--json"])
    out = capsys.readouterr().out
    assert "paragraph bands" in out
    bands = json.loads(out.strip().splitlines()[-1])["bands"]
    assert [(b["low"], b["high"], b["paper_pct"]) for b in bands] == [(1, 29, 2.0), (30, 59, 32.0), (60, 89, 52.0),
                                                                     (90, 129, 14.0)]
    lengths = caption_lengths([c for r in load_captions(path) for c in r.captions], keep_sentences=True)
    for band in bands:
        expected = sum(band["low"] <= n <= band["high"] for n in lengths)
        assert band["count"] == expected and band["pct"] == round(100 * expected / len(lengths), 3)
    assert sum(b["count"] for b in bands) == len(lengths) == 5


@pytest.mark.slow
def test_stats_on_real_coco_train2014(coco_annotations):
    """The real 414k COCO train captions: the paper's level table (level 2 holds ~87%)."""
    proc = run_script("-m", "clid.stats", coco_annotations / "captions_train2014.json", "--json")
    print(proc.stdout)
    stats = json.loads(proc.stdout.strip().splitlines()[-1])
    assert stats["n"] == 414113
    assert 11.8 < stats["mean"] < 12.1
    pct = {r["level"]: r["pct"] for r in stats["levels"]}
    assert 86.0 < pct[2] < 87.5 and 11.0 < pct[1] < 12.5 and pct[3] < 2.0 and pct[7] == 0.0
    assert "   2    10-19" in proc.stdout  # the printed table


def test_stats_bad_file_is_one_clear_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    proc = run_script("-m", "clid.stats", bad, check=False)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1].startswith(f"error: {bad}: line 1 column 2: not valid JSON")


def test_split_of_a_paragraph_file_comes_from_its_split_files(fixtures, tmp_path, capsys):
    """--split on paragraphs_v1.json reads the split files beside it; without them it is one clear error."""
    import shutil

    from clid.base.files import DataError
    from clid.base.text import caption_lengths
    from clid.data.captions import load_captions
    from clid.data.stats import file_lengths

    path = fixtures / "stanford_paragraphs" / "paragraphs_v1.json"
    train = [c for r in load_captions(path, "train") for c in r.captions]
    assert 0 < len(train) < len([c for r in load_captions(path) for c in r.captions])
    assert file_lengths(path, "train") == caption_lengths(train, keep_sentences=True)
    alone = tmp_path / "paragraphs_v1.json"
    shutil.copy(path, alone)
    with pytest.raises(DataError, match="has no splits.*train_split.json"):
        file_lengths(alone, "train")
