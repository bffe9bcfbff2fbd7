"""Ground truth of the demo world's self-generated captions: which ones state something false.

00 writes the true scene graphs (``scene_graphs_clean.json``) beside the noisy ones 02 walks
(``scene_graphs.json``, corrupted by :func:`clid.demo.graphs.corrupt_graph`). The two share object
ids, so every fact a caption states can be checked: 02 ``--clean-graphs`` records, per caption, the
count of each kind of error among its mentions (after the final cut):

- ``hallucinated``: a mentioned object that is not in the image (its id is not in the true graph);
- ``mislabelled``: a mentioned object named with another category than its true one;
- ``wrong_attribute``: an attribute given to a real object that the true graph does not give it;
- ``wrong_relation``: a predicate between two real objects that the true graph does not hold
  (in that direction).

A caption is *wrong* when any count is above 0. Errors of 03's paraphrases are not counted (the
rule-based paraphraser rewords, it does not add facts).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from clid.base.files import DataError
from clid.data.records import SceneGraph
from clid.run.cli import non_negative_int

KINDS = ("hallucinated", "mislabelled", "wrong_attribute", "wrong_relation")


class TrueGraphs:
    """The true graphs by graph id (the VG image id), read with the loader 02 uses."""

    def __init__(self, path):
        from clid.data.scenegraphs import load_scene_graphs

        self.path = path
        self.graphs: dict[str, SceneGraph] = {g.image_id: g for g in load_scene_graphs(path)}

    def get(self, graph_id: str) -> SceneGraph | None:
        return self.graphs.get(str(graph_id))


def judge(object_ids: list[int], nouns: list[str], mentions, truth: SceneGraph) -> dict[str, int]:
    """Error counts of one caption. ``mentions``: ``(object index, attributes, relation)`` per mention,
    ``relation`` = (index of the object it hangs from, predicate) or None; indices into ``object_ids``
    and ``nouns`` (the walked graph's objects)."""
    objects = truth.object_map()
    held = {(r.subject_id, r.predicate, r.object_id) for r in truth.relations}
    counts = dict.fromkeys(KINDS, 0)
    for index, attributes, relation in mentions:
        real = objects.get(object_ids[index])
        if real is None:
            counts["hallucinated"] += 1
            continue
        if nouns[index] != real.name:
            counts["mislabelled"] += 1
        counts["wrong_attribute"] += sum(a not in real.attributes for a in attributes)
        if relation is not None:
            parent, predicate = relation
            if object_ids[parent] in objects and (object_ids[parent], predicate, object_ids[index]) not in held:
                counts["wrong_relation"] += 1
    return counts


def is_wrong(truth: dict) -> bool:
    return any(truth.get(kind, 0) for kind in KINDS)


# ---------------------------------------------------------------------------------------------
# The report: every scorer on the same pool (python -m clid.demo.truth)

SCHEDULE_POINTS = (20, 50, 80)  # percent of CLID's schedule (c * i) / of a run's steps


@dataclass
class Pool:
    """The scored self-generated captions, in the order 06 trains on them, with their truth."""

    ids: list[str]
    wrong: np.ndarray  # bool
    kinds: dict[str, np.ndarray]  # kind -> error count per caption
    n_tokens: np.ndarray
    n_mentions: np.ndarray
    image_ids: np.ndarray
    scores: dict[str, np.ndarray]  # scorer -> score, higher = kept first


def read_pool(selfgen, quality, difficulty=None) -> Pool:
    """The captions of ``selfgen`` that 05 scored (quality rows of source selfgen), in file order."""
    from clid.base.files import read_jsonl, read_quality

    q = read_quality(quality)
    sources = q["source"] if "source" in q else np.full(len(q["id"]), "selfgen", dtype=object)
    row = {i: k for k, (i, s) in enumerate(zip(q["id"], sources)) if s == "selfgen"}
    records = [r for r in read_jsonl(selfgen, required=("id", "image_id", "caption")) if str(r["id"]) in row]
    if not records:
        raise DataError(quality, None, f"scores none of the captions of {selfgen}")
    missing = [r["id"] for r in records if not isinstance(r.get("truth"), dict)]
    if missing:
        raise DataError(selfgen, f"caption {missing[0]}", f"no 'truth' ({len(missing)} captions): run 02 with "
                                                          "--clean-graphs (the demo world's true graphs)")
    ids = [str(r["id"]) for r in records]
    at = np.array([row[i] for i in ids])
    kinds = {k: np.array([int(r["truth"].get(k, 0)) for r in records]) for k in KINDS}
    scores = {"u": q["u"][at].astype(np.float64),
              "log p, scoring model M_theta": q["logp_trusted"][at].astype(np.float64),
              "log p, M_theta~": q["logp_extended"][at].astype(np.float64)}
    if difficulty is not None:
        from clid.base.files import read_arrays

        d = read_arrays(difficulty)
        by_id = dict(zip(d["id"], d["difficulty"]))
        lost = [i for i in ids if i not in by_id]
        if lost:
            raise DataError(difficulty, None, f"no difficulty for {len(lost)} pool captions (first: {lost[0]})")
        scores["log p, bootstrap model (-difficulty)"] = -np.array([by_id[i] for i in ids], dtype=np.float64)
    n_tokens = np.array([int(r.get("n_tokens") or 0) for r in records])
    scores["caption length (longer first)"] = n_tokens.astype(np.float64)
    return Pool(ids, np.array([any(r["truth"].get(k, 0) for k in KINDS) for r in records]), kinds, n_tokens,
                np.array([len(r.get("objects") or []) for r in records]), np.array([str(r["image_id"]) for r in records]),
                scores)


def auc(score: np.ndarray, right: np.ndarray) -> float | None:
    """P(score of a right caption > score of a wrong one), ties counting half (ROC AUC); None without both."""
    from scipy.stats import rankdata

    right = np.asarray(right, bool)
    n_right, n_wrong = int(right.sum()), int((~right).sum())
    if not n_right or not n_wrong:
        return None
    ranks = rankdata(score)
    return float((ranks[right].sum() - n_right * (n_right + 1) / 2) / (n_right * n_wrong))


def clid_draw(score: np.ndarray, percent: float, seed: int, s: float = 1.0, scale: float | None = None) -> np.ndarray:
    """CLID's draw at the iteration where c * i = ``percent``, with ``score`` as u (rescaled to ``scale``
    standard deviations when given, so every scorer has u's smoothness)."""
    import torch

    from clid import ops

    score = np.asarray(score, dtype=np.float64)
    if scale is not None and score.std() > 0:
        score = (score - score.mean()) / score.std() * scale
    u = torch.from_numpy(score.astype(np.float32))
    k = int(np.floor(len(u) * (100.0 - percent) / 100.0 + 1e-9))
    threshold = float(ops.percentile_threshold(u, percent))
    return ops.smoothstep_sample(u, threshold, s, k, seed, int(round(percent / 2))).cpu().numpy()


def scorer_rows(pool: Pool, seed: int) -> dict[str, dict]:
    """Per scorer: AUC and the share of wrong captions drawn at 20/50/80% of CLID's schedule (c = 2)."""
    scale = float(pool.scores["u"].std())
    rows = {}
    for name, score in pool.scores.items():
        row = {"auc": auc(score, ~pool.wrong),
               "auc_hallucinated": auc(score, pool.kinds["hallucinated"] == 0)}
        for percent in SCHEDULE_POINTS:
            drawn = clid_draw(score, percent, seed, scale=scale)
            row[f"wrong_at_{percent}"] = float(pool.wrong[drawn].mean()) if len(drawn) else None
        rows[name] = row
    return rows


def quartile_rows(pool: Pool) -> list[dict]:
    """Per quartile of u: captions, shares hallucinated and wrong, mean mentions and tokens."""
    u = pool.scores["u"]
    edges = np.quantile(u, [0.25, 0.5, 0.75])
    quartile = np.searchsorted(edges, u, side="right")
    rows = []
    for q in range(4):
        m = quartile == q
        rows.append({"quartile": q + 1, "n": int(m.sum()), "u_mean": float(u[m].mean()),
                     "hallucinated": float((pool.kinds["hallucinated"][m] > 0).mean()),
                     "wrong": float(pool.wrong[m].mean()), "mentions": float(pool.n_mentions[m].mean()),
                     "tokens": float(pool.n_tokens[m].mean())})
    return rows


def hallucination_split(pool: Pool) -> dict:
    """Where the rise of hallucinated captions with u comes from: image or caption.

    ``within``: u of a hallucinated caption minus u of the right captions of the same image with the same
    number of mentions (mean over such groups, and its standard error); ``between``: u of the right captions
    of images that have a hallucinated caption minus u of the right captions of images that have none,
    same number of mentions (weighted by the smaller side). Also for the two models' log p."""
    hallucinated = pool.kinds["hallucinated"] > 0
    right = ~pool.wrong
    with_fake = {i for i, h in zip(pool.image_ids, hallucinated) if h}
    names = {"u": "u", "log p, scoring model M_theta": "logp_trusted", "log p, M_theta~": "logp_extended"}
    out = {}
    for name, key in names.items():
        score = pool.scores[name]
        groups: dict = {}
        for k in range(len(score)):
            groups.setdefault((pool.image_ids[k], pool.n_mentions[k]), []).append(k)
        diffs = [score[[k for k in g if hallucinated[k]]].mean() - score[[k for k in g if right[k]]].mean()
                 for g in groups.values() if hallucinated[g].any() and right[g].any()]
        between, weights = [], []
        for m in np.unique(pool.n_mentions):
            a = [k for k in np.flatnonzero(right & (pool.n_mentions == m)) if pool.image_ids[k] in with_fake]
            b = [k for k in np.flatnonzero(right & (pool.n_mentions == m)) if pool.image_ids[k] not in with_fake]
            if a and b:
                between.append(score[a].mean() - score[b].mean())
                weights.append(min(len(a), len(b)))
        out[key] = {"within": float(np.mean(diffs)) if diffs else None,
                    "within_se": float(np.std(diffs, ddof=1) / np.sqrt(len(diffs))) if len(diffs) > 1 else None,
                    "within_groups": len(diffs),
                    "between": float(np.average(between, weights=weights)) if between else None}
    return out


def fig4(quality) -> dict:
    """The paper's Fig. 4: the share of trusted captions with u > 0 and of self-generated ones with u < 0."""
    from clid.base.files import read_quality

    q = read_quality(quality)
    if "source" not in q or not (q["source"] == "trusted").any():
        return {}
    trusted, selfgen = q["u"][q["source"] == "trusted"], q["u"][q["source"] == "selfgen"]
    return {"trusted_u_positive": float((trusted > 0).mean()), "selfgen_u_negative": float((selfgen < 0).mean()),
            "n_trusted": int(len(trusted)), "n_selfgen": int(len(selfgen))}


def run_shares(folder, pool: Pool) -> dict:
    """What one 06 run trained on, replayed from its selection log: per point (20/50/80% of its steps) the
    number of self-generated samples in the training set and the share of them that are wrong; and the
    seconds its selection cost (curations, evaluations, difficulty)."""
    import argparse

    from clid.base.files import read_arrays, read_json, read_jsonl
    from clid.selection.peers import difficulty_buckets
    from clid.selection.schedule import digest, draw

    folder = Path(folder)
    args = read_json(folder / "config.json")["train"]
    rows = list(read_jsonl(folder / "selection_log.jsonl"))
    strategy = args.get("strategy", "clid")
    index = {c: k for k, c in enumerate(pool.ids)}
    out = {"strategy": strategy, "seconds": round(sum(float(r.get("seconds") or 0) + float(r.get("difficulty_seconds") or 0)
                                                     for r in rows), 1), "exact": True}
    order = None
    if strategy == "curriculum":
        d = read_arrays(folder / "difficulty.h5")
        order = difficulty_buckets(np.asarray(d["difficulty"], dtype=np.float64), int(args["buckets"]))
        order_ids = list(d["id"])
    for percent in SCHEDULE_POINTS:
        step = int(args["max_steps"] * percent / 100)
        if strategy in ("clid", "none"):
            row = next(r for r in rows if r["start"] <= step < r["end"])
            if row["digest"] == "all":
                members = np.arange(len(pool.ids))
            elif not row["drawn"]:
                members = np.zeros(0, dtype=np.int64)
            else:
                members, _ = draw(_torch(pool.scores["u"]), row["iteration"], argparse.Namespace(**args))
                out["exact"] &= digest(members) == row["digest"]
        else:
            done = [r for r in rows if r["start"] <= step]
            if strategy == "curriculum":
                ids = [order_ids[i] for b in order[:done[-1]["buckets"]] for i in b]
                members = np.array([index[c] for c in ids if c in index], dtype=np.int64)
            else:
                counts = Counter(pool.ids)
                for r in done[1:]:
                    for old in r.get("removed", []):
                        counts[old] -= 1
                    for old, new in r.get("replaced", []):
                        counts[old] -= 1
                        counts[new] += 1
                members = np.array([index[c] for c, n in counts.items() if c in index for _ in range(max(n, 0))],
                                   dtype=np.int64)
        out[f"pool_at_{percent}"] = int(len(members))
        out[f"wrong_at_{percent}"] = float(pool.wrong[members].mean()) if len(members) else None
    return out


def _torch(values):
    import torch

    return torch.from_numpy(np.asarray(values, dtype=np.float32))


def measure(selfgen, quality, difficulty=None, runs=(), seed: int = 0) -> dict:
    """Every number of the report, for one world (seed)."""
    pool = read_pool(selfgen, quality, difficulty)
    n = len(pool.ids)
    return {"pool": {"n": n, "wrong": float(pool.wrong.mean()),
                     **{k: float((v > 0).mean()) for k, v in pool.kinds.items()}},
            "scorers": scorer_rows(pool, seed),
            "runs": {name: run_shares(folder, pool) for name, folder in runs},
            "fig4": fig4(quality),
            "quartiles": quartile_rows(pool),
            "hallucination_split": hallucination_split(pool)}


def summarise(results: list):
    """The same structure with each number replaced by [mean, sample std] over the results (std None for one)."""
    first = results[0]
    if isinstance(first, dict):
        return {k: summarise([r[k] for r in results if k in r]) for k in first}
    if isinstance(first, list):
        return [summarise([r[i] for r in results]) for i in range(len(first))]
    if isinstance(first, bool) or not isinstance(first, (int, float)):
        return first
    values = [float(v) for v in results if v is not None]
    if not values:
        return None
    return [float(np.mean(values)), float(np.std(values, ddof=1)) if len(values) > 1 else None]


def cell(value, scale: float = 100.0, digits: int = 1) -> str:
    """A number (x scale), or ``mean ± std`` of a summarised one."""
    if value is None:
        return "–"
    if isinstance(value, list):
        mean, std = value
        return f"{mean * scale:.{digits}f}" + ("" if std is None else f" ± {std * scale:.{digits}f}")
    return f"{value * scale:.{digits}f}"


def report_text(results: dict, title: str) -> str:
    """truth.md: the scorers, the runs, the paper's Fig. 4 and u's quartiles."""
    pool = results["pool"]
    n = pool["n"][0] if isinstance(pool["n"], list) else pool["n"]
    lines = [f"# {title}\n",
             f"The self-generated captions 05 scored ({n:.0f} per world), judged against the world's true scene graphs "
             f"(clid/demo/truth.py). Wrong: {cell(pool['wrong'])}% (a hallucinated object {cell(pool['hallucinated'])}%, "
             f"a mislabelled one {cell(pool['mislabelled'])}%, a wrong attribute {cell(pool['wrong_attribute'])}%, "
             f"a wrong relation {cell(pool['wrong_relation'])}%; a caption may have several).\n",
             "## Scorers\n",
             "AUC: the probability that a right caption scores above a wrong one (0.5: no better than chance; below "
             "0.5: the scorer prefers wrong captions). Drawn at X%: the share of wrong captions among those CLID's "
             "schedule draws at iteration i with c * i = X (c = 2, s = 1), this scorer in place of u (rescaled to u's "
             "standard deviation). All numbers in %.\n",
             "| scorer | AUC, wrong | AUC, hallucinated | wrong drawn at 20% | at 50% | at 80% |",
             "|---|---:|---:|---:|---:|---:|",
             f"| (no selection) | | | {cell(pool['wrong'])} | {cell(pool['wrong'])} | {cell(pool['wrong'])} |"]
    for name, row in results["scorers"].items():
        lines.append(f"| {name} | {cell(row['auc'])} | {cell(row['auc_hallucinated'])} | "
                     + " | ".join(cell(row[f"wrong_at_{p}"]) for p in SCHEDULE_POINTS) + " |")
    if results["runs"]:
        lines += ["\n## What each 06 run trained on\n",
                  "Self-generated samples in its training set at 20 / 50 / 80% of its steps, the share of them that "
                  "are wrong (%), and the seconds its selection cost (curations, validation evaluations, difficulty).\n",
                  "| run | strategy | samples at 20% | 50% | 80% | wrong at 20% | 50% | 80% | selection (s) |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
        for name, row in results["runs"].items():
            lines.append(f"| {name} | {row['strategy']} | "
                         + " | ".join(cell(row[f"pool_at_{p}"], 1, 0) for p in SCHEDULE_POINTS) + " | "
                         + " | ".join(cell(row[f"wrong_at_{p}"]) for p in SCHEDULE_POINTS)
                         + f" | {cell(row['seconds'], 1, 0)} |")
    if results["fig4"]:
        f = results["fig4"]
        lines += ["\n## The paper's Fig. 4\n", "| share (%) | here | paper |", "|---|---:|---:|",
                  f"| trusted captions with u > 0 | {cell(f['trusted_u_positive'])} | 90 |",
                  f"| self-generated captions with u < 0 | {cell(f['selfgen_u_negative'])} | 99 |"]
    lines += ["\n## u's quartiles\n", "| quartile | mean u | hallucinated (%) | wrong (%) | mentions | tokens |",
              "|---:|---:|---:|---:|---:|---:|"]
    for row in results["quartiles"]:
        q = row["quartile"][0] if isinstance(row["quartile"], list) else row["quartile"]
        lines.append(f"| {q:.0f} | {cell(row['u_mean'], 1, 3)} | {cell(row['hallucinated'])} | {cell(row['wrong'])} | "
                     f"{cell(row['mentions'], 1, 2)} | {cell(row['tokens'], 1, 1)} |")
    if results.get("hallucination_split"):
        lines += ["\n## Hallucinated captions: the caption or its image?\n",
                  "Within: a hallucinated caption minus the right captions of the same image with as many mentions "
                  "(± its standard error; groups: such image and mention-count groups). Between: the right captions "
                  "of images that have a hallucinated caption minus those of images that have none, as many "
                  "mentions. Nats.\n",
                  "| score | within | groups | between |", "|---|---:|---:|---:|"]
        for key, row in results["hallucination_split"].items():
            se = row["within_se"]
            se = se[0] if isinstance(se, list) else se
            lines.append(f"| {key} | {cell(row['within'], 1, 3)}" + (f" (± {se:.3f})" if se is not None else "")
                         + f" | {cell(row['within_groups'], 1, 0)} | {cell(row['between'], 1, 3)} |")
    return "\n".join(lines) + "\n"


def write_report(out, results: dict, title: str) -> None:
    from clid.base.files import atomic_path, write_json

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "truth.json", results, indent=1)
    with atomic_path(out / "truth.md") as tmp:
        tmp.write_text(report_text(results, title))


def main(argv=None) -> None:
    import argparse

    from clid.base.files import check_output_folder, read_json
    from clid.run.cli import HelpFormatter

    p = argparse.ArgumentParser(prog="python -m clid.demo.truth", formatter_class=HelpFormatter,
                                description="The demo world's ground truth: every scorer (u, the two models' log p, "
                                            "a bootstrap difficulty, caption length) and every 06 run against the "
                                            "captions known to be wrong; writes OUT/truth.md and OUT/truth.json.")
    p.add_argument("--selfgen", help="the self-generated captions 06 trained on, with 02's 'truth' (02 --clean-graphs)")
    p.add_argument("--quality", help="05's quality file of those captions (with --include-trusted: Fig. 4 too)")
    p.add_argument("--difficulty", help="a curriculum run's difficulty.h5 (06 --difficulty bootstrap:CKPT)")
    p.add_argument("--run", action="append", default=[], metavar="NAME=DIR", help="a 06 run to replay (repeatable)")
    p.add_argument("--seed", type=non_negative_int, default=0, help="the seed of the draws (06's --seed)")
    p.add_argument("--combine", nargs="+", metavar="DIR", help="instead: report several truth folders (seeds) as mean ± std")
    p.add_argument("--out", required=True, help="output folder: truth.md and truth.json")
    args = p.parse_args(argv)
    out = Path(args.out)
    check_output_folder(out, {"truth.md", "truth.json"}, False, writes=("truth.md", "truth.json"))
    if args.combine:
        results = summarise([read_json(Path(d) / "truth.json") for d in args.combine])
        return write_report(out, results, f"Ground truth on the demo world: {len(args.combine)} worlds, mean ± std")
    if not args.selfgen or not args.quality:
        p.error("--selfgen and --quality are required (or --combine DIR ...)")
    runs = []
    for entry in args.run:
        name, sep, folder = entry.partition("=")
        if not sep or not Path(folder).is_dir():
            p.error(f"--run must be NAME=DIR with a 06 checkpoint folder, not {entry!r}")
        runs.append((name, folder))
    results = measure(args.selfgen, args.quality, args.difficulty, runs, args.seed)
    write_report(out, results, "Ground truth on the demo world")
    print(report_text(results, "Ground truth on the demo world"))
    print(f"wrote {out / 'truth.md'} and {out / 'truth.json'}")


if __name__ == "__main__":
    from clid.run.cli import run_main

    run_main(main)
