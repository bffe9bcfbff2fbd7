"""07 --combine's intervals and claims (clid.evaluation.intervals) on synthetic per-image values whose answer is
known: a clear win, a clear loss and a tie; the bootstrap's width where it can be computed by hand; the pairing."""
import numpy as np
import pytest

from clid.base.files import read_json, write_json
from clid.evaluation.intervals import SeedValues, method_intervals
from clid.evaluation.report import combine, write_per_image
from clid.evaluation.tables import markdown

LEVELS = [(1, 9), (10, 19), (20, 29), (30, 39), (40, 49), (50, 59), (60, 69)]


def seed_values(name, n, rng, methods: dict) -> SeedValues:
    """``methods``: name -> {level: (share in range, mean CIDEr, mean long CIDEr or None)}; per-image values drawn
    around them (in range: Bernoulli; CIDEr: normal, sd 0.2, on the in-range images)."""
    values = SeedValues(name, n)
    for method, rows in methods.items():
        for level in range(1, 8):
            share, cider, long = rows.get(level, (0.0, None, None))
            hits = rng.random(n) < share
            values.add(method, level, hits,
                       [float(rng.normal(cider, 0.2)) if h and cider is not None else None for h in hits],
                       [float(rng.normal(long, 0.2)) if h and long is not None else None for h in hits])
    return values


def world(seed, clid, trusted, extended):
    rng = np.random.default_rng(seed)
    return [seed_values(f"seed{k}", 200, rng, {"trusted-only": trusted, "extended-only (06 --strategy none)": extended,
                                               "CLID": clid}) for k in range(5)]


TRUSTED = {1: (1.0, 0.75, None), 2: (0.98, 0.74, None), 3: (0.15, 0.1, 0.12)}
EXTENDED = {1: (1.0, 0.1, None), 2: (1.0, 0.6, None), **{n: (0.8, 0.01, 0.20) for n in (3, 4, 5, 6)}}


def by_claim(result):
    return {c["claim"]: c for c in result["claims"]}


def test_a_clear_win_a_clear_loss_and_a_tie():
    """CLID reaches L4-L6 where trusted-only never does (a: held), keeps half its L1-L2 CIDEr (b: not held), and
    scores extended-only's long-reference CIDEr exactly on average (c: undecided)."""
    clid = {1: (1.0, 0.37, None), 2: (1.0, 0.37, None), **{n: (0.8, 0.01, 0.20) for n in (3, 4, 5, 6)}}
    claims = by_claim(method_intervals(world(1, clid, TRUSTED, EXTENDED), LEVELS, resamples=500))
    assert claims["a"]["verdict"] == "held" and claims["a"]["interval"]["low"] > 0.7
    assert claims["b"]["verdict"] == "not held"
    assert all(iv["high"] < 0.9 for iv in claims["b"]["levels"].values())
    assert claims["c"]["verdict"] == "undecided" and claims["c"]["against"] == "extended-only (06 --strategy none)"
    assert claims["c"]["interval"]["low"] < 0 < claims["c"]["interval"]["high"]


def test_the_other_way_round():
    """CLID hardly reaches L4-L6, where trusted-only does (a: not held), keeps trusted-only's short-level CIDEr (b:
    held), and its few long captions beat extended-only's on the long references (c: held)."""
    clid = {1: (1.0, 0.75, None), 2: (0.98, 0.74, None), **{n: (0.05, 0.01, 0.30) for n in (3, 4, 5, 6)}}
    trusted = {**TRUSTED, **{n: (0.9, 0.0, 0.1) for n in (4, 5, 6)}}
    claims = by_claim(method_intervals(world(2, clid, trusted, EXTENDED), LEVELS, resamples=500))
    assert claims["a"]["verdict"] == "not held" and claims["a"]["interval"]["high"] < 0
    assert claims["b"]["verdict"] == "held"
    assert all(0.9 < iv["low"] < 1.0 < iv["high"] < 1.1 for iv in claims["b"]["levels"].values())
    assert claims["c"]["verdict"] == "held" and claims["c"]["interval"]["low"] > 0


def test_the_image_level_interval_is_the_binomial_one():
    """One seed, 400 images, half of them in range: the interval is 0.5 ± 1.96 * sqrt(0.25 / 400) = ± 0.049."""
    values = SeedValues("only", 400)
    values.add("CLID", 1, [k % 2 == 0 for k in range(400)], [None] * 400, [None] * 400)
    iv = method_intervals([values], LEVELS[:1], resamples=4000)["methods"]["CLID"]["cp"][1]
    assert iv["value"] == 0.5
    assert iv["low"] == pytest.approx(0.451, abs=0.006) and iv["high"] == pytest.approx(0.549, abs=0.006)


def test_seeds_are_resampled_and_differences_are_paired():
    """Two seeds whose images are all alike within a seed (none in range, all in range): images alone would give no
    width, the seeds give it (a draw of seed 0 twice: 0; of seed 1 twice: 1). A method whose per-image CIDEr is
    CLID's plus 0.1 differs by exactly 0.1 in every resample: paired by seed and image."""
    seeds = []
    for k, share in enumerate((0.0, 1.0)):
        values = SeedValues(f"seed{k}", 100)
        hits = np.arange(100) < 100 * share
        cider = [0.5 + 0.01 * i if h else None for i, h in enumerate(hits)]
        values.add("CLID", 1, hits, cider, [None] * 100)
        values.add("shifted", 1, hits, [None if c is None else c + 0.1 for c in cider], [None] * 100)
        seeds.append(values)
    result = method_intervals(seeds, LEVELS[:1], resamples=1000)
    cp = result["methods"]["CLID"]["cp"][1]
    assert cp["value"] == pytest.approx(0.5) and cp["low"] == 0.0 and cp["high"] == 1.0
    difference = result["differences"]["shifted"]["cider"][1]
    assert difference["low"] == pytest.approx(0.1) and difference["high"] == pytest.approx(0.1)
    assert result["differences"]["shifted"]["cp"][1]["low"] == 0 == result["differences"]["shifted"]["cp"][1]["high"]
    # the same resamples at every run: a fixed bootstrap seed
    assert method_intervals(seeds, LEVELS[:1], resamples=1000) == result


def eval_folder(folder, methods: dict, rng, n=60):
    """A 07 folder as 07 writes it (metrics.json and per_image.jsonl) for runs with the given per-level shares
    in range and mean CIDEr."""
    image_ids = [str(i) for i in range(n)]
    results, runs = {}, {}
    for method, rows in methods.items():
        lengths, per_image, long_images, levels = {}, {}, {}, {}
        for level, (low, high) in enumerate(LEVELS, 1):
            share, cider, long = rows.get(level, (0.0, None, None))
            hits = rng.random(n) < share
            lengths[level] = {i: (low if h else high + 5) for i, h in zip(image_ids, hits)}
            per_image[level] = {i: float(rng.normal(cider, 0.1)) for i, h in zip(image_ids, hits) if h and cider}
            long_images[level] = {i: float(rng.normal(long, 0.1)) for i, h in zip(image_ids, hits) if h and long}
            levels[level] = {"control_precision": float(hits.mean()), "n_images": n, "n_scored": len(per_image[level]),
                             "CIDEr": float(np.mean(list(per_image[level].values()))) if per_image[level] else None}
        results[method] = {"lengths": lengths, "per_image": {"levels": per_image, "long_refs": long_images}}
        runs[method] = {"method": method, "source": "synthetic", "skipped": {},
                        "levels": {str(k): v for k, v in levels.items()}, "long_refs": {}}
    folder.mkdir()
    write_per_image(folder / "per_image.jsonl", results, image_ids, LEVELS)
    write_json(folder / "metrics.json", {"refs": "captions.json", "evaluated": "split 'test'", "n_test_images": n,
                                         "level_set": "caption", "levels": [list(v) for v in LEVELS],
                                         "length_count": "authors", "score_captions": "in-range", "spice": "n/a",
                                         "long_refs": None, "skipped": {}, "runs": runs,
                                         "methods": {m: {"runs": [m]} for m in methods}})


@pytest.mark.slow
def test_combine_reports_intervals_and_claims(tmp_path):
    """07 --combine of three folders: metrics.json holds each method's intervals, the differences against CLID and
    the claims; report.md says how the bootstrap drew, the verdicts and the tables. A folder of an earlier 07,
    without per_image.jsonl, gives the mean ± std and says why there is no interval."""
    import matplotlib

    matplotlib.use("Agg")
    rng = np.random.default_rng(3)
    clid = {1: (1.0, 0.7, None), 2: (1.0, 0.7, None), **{n: (0.9, 0.01, 0.25) for n in (3, 4, 5, 6)}}
    trusted = {1: (1.0, 0.72, None), 2: (1.0, 0.71, None), 3: (0.1, 0.1, 0.1)}
    folders = []
    for k in range(3):
        folders.append(tmp_path / f"seed{k}")
        eval_folder(folders[-1], {"trusted-only": trusted, "CLID": clid}, rng)
    combine(folders, tmp_path / "combined")
    metrics = read_json(tmp_path / "combined" / "metrics.json")
    intervals = metrics["intervals"]
    assert intervals["bootstrap"]["resamples"] == 2000 and intervals["bootstrap"]["seed"] == 0
    assert set(intervals["methods"]) == {"trusted-only", "CLID"} and set(intervals["differences"]) == {"trusted-only"}
    cp = intervals["methods"]["CLID"]["cp"]["4"]
    assert metrics["methods"]["CLID"]["levels"]["4"]["control_precision"] == pytest.approx(cp["value"])
    assert cp["low"] < cp["value"] < cp["high"]
    verdicts = {c["claim"]: c["verdict"] for c in intervals["claims"]}
    assert verdicts == {"a": "held", "b": "held"}  # (no extended-only: no claim c)
    report = (tmp_path / "combined" / "report.md").read_text()
    assert "bootstrap of 2000 resamples (numpy seed 0)" in report and "- **(a) held**: control at the long levels" in report
    assert "### Each method minus CLID, paired by seed and image" in report
    row = next(line for line in report.splitlines() if line.startswith("| CLID | 100.0 [100.0, 100.0] |"))
    assert row.count("[") == 7 + 1 + 2 + 4

    # the README's tables as files (--tables), printed back as Markdown with one row a model
    combine(folders, tmp_path / "combined", tables=tmp_path / "tables")
    assert sorted(p.name for p in (tmp_path / "tables").iterdir()) == ["claims.csv", "intervals.csv", "results.csv", "written.json"]
    printed = markdown(tmp_path / "tables")
    average = metrics["methods"]["CLID"]["average"]
    assert ("| CLID | 100.0 ± 0.0 | 100.0 ± 0.0 | " in printed
            and f"| {100 * average['control_precision']:.1f} ± {100 * average['control_precision_std']:.1f} |" in printed)
    assert f"| CLID | {100 * intervals['methods']['CLID']['cp_average']['value']:.1f} [" in printed
    assert "| (a) control at the long levels" in printed and "| trusted-only | held |" in printed
    assert [line.split(" | ")[0] for line in printed.splitlines() if line.startswith("| CLID")] == ["| CLID"] * 2

    (folders[2] / "per_image.jsonl").unlink()
    combine(folders, tmp_path / "combined")
    metrics = read_json(tmp_path / "combined" / "metrics.json")
    assert metrics["intervals"] is None and "per_image.jsonl" in metrics["no_intervals"]
    assert "No intervals: no per_image.jsonl in" in (tmp_path / "combined" / "report.md").read_text()
