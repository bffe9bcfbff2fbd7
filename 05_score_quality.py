"""Stage 05: score every self-generated caption with the two base models (Eq. 1 and Eq. 2).

    python 05_score_quality.py --trusted runs/trusted --extended runs/extended \\
        --selfgen paraphrased.jsonl --features features.h5 --out quality.h5

In:  the trusted model M_theta and the extended model M_theta~ (04), the self-generated captions
     (JSONL), the region features. Optionally ``--captions`` (the trusted caption file): only
     captions of train-split images are scored, and ``--include-trusted`` scores the trusted captions
     too (for the separation plot).
Out: the quality HDF5: ``id``, ``logp_trusted``, ``logp_extended``, ``u`` (+ ``source``), where

    u_j = log p(y_j | x_j; theta) - log p(y_j | x_j; theta~)                     (Eq. 1)
    log p(y | x) = (1/m) * sum_t log P(w_t | w_<t, x)                            (Eq. 2)

m counts every position of the caption's level, the "." padding to the level's length included, and
every one of them is scored, as the authors' ``measure_noise.py`` does (``--count level``; the paper
says only "m tokens"). ``--count caption`` counts and scores the caption's own tokens and its final ".".

``--mode prefix`` (default, the authors' definition): all text masked, the true prefix revealed,
position t read; one pass per position, made fast without changing the numbers (see
clid/model/scoring.py). ``--precision`` (clid.run.runtime): auto scores in bfloat16 autocast on a GPU
(docs/gpu.md: its scores against float32's), in float32 on the CPU. ``--mode pseudo`` and ``--mode onepass`` are documented approximations.
Per-item stage: ``--shard-id/--num-shards`` (SLURM array defaults), chunked and resumable (a
resume with other inputs or flags is refused unless ``--restart``). Captions not scored are
counted by reason in ``OUT.skipped.tsv``.
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np

from clid.base.files import read_arrays, write_quality
from clid.base.text import load_tokenizer
from clid.data.examples import Examples
from clid.data.inputs import (
    CaptionFiles,
    add_left_out_arg,
    add_token_cache_arg,
    check_left_out,
    report_skipped,
    training_items,
    usable,
)
from clid.data.splits import add_split_args
from clid.data.store import (
    FeatureStore,
    RegionCache,
    add_bad_features_arg,
    add_region_cache_arg,
    cache_bytes,
    check_features_match,
)
from clid.model import MODES
from clid.run import runs, runtime, shard
from clid.run.cli import HelpFormatter, run_main
from clid.selection.quality import eq1_quality

COUNTS = ("level", "caption")  # Eq. 2's m: the level's padded length (the authors' code), or the caption's tokens
BATCH_SIZE = 64  # --batch-size auto on the CPU


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    data = p.add_argument_group("data", "the two models, the captions they score and the features")
    scoring = p.add_argument_group("scoring", "how Eq. 2's log p is computed")
    run = p.add_argument_group("run", "the output, shards and resuming")
    data.add_argument("--trusted", required=True, help="checkpoint of the model trained on trusted captions")
    data.add_argument("--extended", required=True, help="checkpoint of the model trained on the extended set")
    data.add_argument("--selfgen", required=True, help="self-generated (paraphrased) captions JSONL")
    data.add_argument("--features", required=True, help="region features HDF5 (the file 04 trained on)")
    add_bad_features_arg(data)
    add_region_cache_arg(data)
    run.add_argument("--out", required=True, help="quality HDF5")
    scoring.add_argument("--mode", choices=MODES, default="prefix",
                         help="prefix: every text token masked, the true prefix revealed, one pass per position "
                              "(the authors' definition); pseudo: only position t masked; onepass: one pass, every "
                              "position (approximations)")
    scoring.add_argument("--count", choices=COUNTS, default="level",
                         help='Eq. 2\'s m: level: every position up to the level\'s highest length, the "." padding '
                              'included, all scored (the authors\' measure_noise.py); caption: the caption\'s own tokens '
                              'and its final "."')
    data.add_argument("--captions", help="trusted caption file: score only captions of its train-split images")
    data.add_argument("--include-trusted", action="store_true", help="also score the trusted captions (needs --captions)")
    runtime.add_batch_size_arg(scoring, BATCH_SIZE, "captions scored together")
    runtime.add_precision_arg(scoring)
    shard.add_chunk_size_arg(run, 4096, "captions")
    runtime.add_device_arg(scoring)
    add_split_args(data)
    add_left_out_arg(data)
    add_token_cache_arg(data)
    shard.add_shard_args(run)
    args = p.parse_args(argv)
    plan = runtime.device_plan(args.device, args.precision)
    args.device, args.precision = str(plan.device), plan.use()  # what auto means here: recorded
    return args


def load_items(args, files: CaptionFiles, tokenizer) -> tuple[Examples, Counter]:
    """Everything to score, tokenised (self-generated captions, then the trusted ones with ``--include-trusted``,
    as ``trusted:ID``; ``sources`` says which), and skip counts."""
    if args.include_trusted and not args.captions:
        sys.exit("error: --include-trusted needs --captions")
    if not args.captions:
        files.check_ids(args.selfgen, tokenizer)
        return files.selfgen_table(args.selfgen, tokenizer), Counter()  # (a caption with no word left: see usable)
    found = training_items(args.captions, args.selfgen, args.test_ids, not args.no_split_check, files, tokenizer)
    items = found.selfgen
    if args.include_trusted:
        trusted = found.trusted
        items = items + replace(trusted, caption_ids=[f"trusted:{c}" for c in trusted.caption_ids],
                                sources=["trusted"] * len(trusted))
    return items, found.skipped


def drop_outside_vocab(items: Examples, skipped: Counter, output_vocab) -> Examples:
    """The captions whose every token the models can predict: a model trained with an output shortlist
    (04 ``--output-vocab``, ``--recipe demo``) gives a word outside it no probability, so such a caption
    is counted in ``skipped`` and left out (--max-left-out then stops a run that would lose too many)."""
    if output_vocab is None:
        return items
    outside = items.outside(output_vocab)
    for source, n in Counter(items.sources[k] for k in np.flatnonzero(outside)).items():
        skipped[f"{source}: a word outside the models' output vocabulary"] += n
    return items.select(~outside)


def same_weights(a, b) -> bool:
    """Whether two models hold identical weights (the same checkpoint given twice, or a copy of it)."""
    import torch

    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(sa[k].shape == sb[k].shape and torch.equal(sa[k], sb[k]) for k in sa)


def check_items_left_out(items: Examples, skipped: Counter, features: FeatureStore, args) -> None:
    """Stop before any scoring when more than --max-left-out of the captions of a source would be left
    out (their images missing from the feature file, or no word left)."""
    wordless = items.lengths == 1
    is_trusted = np.fromiter((s == "trusted" for s in items.sources), dtype=bool, count=len(items))
    for source, mine in (("selfgen", ~is_trusted), ("trusted", is_trusted)):
        rows = np.flatnonzero(mine)
        image_ids = [items.image_ids[k] for k in rows]
        with_words = [items.image_ids[k] for k in np.flatnonzero(mine & ~wordless)]
        held = {i: features.holds(i) for i in dict.fromkeys(with_words)}
        lost = Counter()
        if n := int((mine & wordless).sum()):
            lost[f"{source}: no word left after preprocessing"] = n
        if n := sum(not held[i] for i in with_words):
            lost[f"{source}: no region features for the image"] = n
        offered = len(rows) + sum(n for reason, n in skipped.items() if reason.startswith(source + ":"))
        path = args.selfgen if source == "selfgen" else args.captions
        check_left_out(source, offered, skipped + lost, args.max_left_out, path, image_ids, features)


def scoring_batch_size(args, model, features: FeatureStore) -> int:
    """--batch-size, or what auto picks: a pass's activations for the longest level and the first image's
    region count (an image of the file: they rarely differ)."""
    first = next((i for i in features.ids() if i in features), None)
    n_regions = len(features.get(first).features) if first is not None else 100
    positions = n_regions + model.levels[-1][1]
    size = runtime.batch_size(args.batch_size, args.device, runtime.encoder_bytes(model.config, positions, args.precision),
                              BATCH_SIZE)
    if args.batch_size == "auto" and runtime.device_plan(args.device).batch_by_memory:
        print(f"--batch-size auto: {size} captions a batch")
    return size


def report(out: Path) -> None:
    """Print the share of positive u per source and plot the histograms (the separation figure)."""
    q = read_arrays(out)
    print(f"{out}: {len(q['id'])} scored captions")
    sources = sorted(set(q["source"]))
    for name in sources:
        u = q["u"][q["source"] == name]
        print(f"  {name:8s} n={len(u):7d}  mean u={u.mean():+.4f}  positive u: {100 * (u > 0).mean():.1f}%")
    if len(sources) > 1:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        from clid.base.files import atomic_path

        fig, ax = plt.subplots(figsize=(6, 3.5))
        bins = np.linspace(np.percentile(q["u"], 0.5), np.percentile(q["u"], 99.5), 60)
        for name in sources:
            ax.hist(q["u"][q["source"] == name], bins=bins, alpha=0.6, density=True, label=name)
        ax.set_xlabel("u = log p(y|x; trusted) - log p(y|x; extended)")
        ax.set_ylabel("density")
        ax.legend()
        fig.tight_layout()
        plot = out.with_name(out.stem + "_histogram.png")
        with atomic_path(plot) as tmp:
            fig.savefig(tmp, format="png", dpi=120)
        print(f"  histogram: {plot}")


def load_models(args, features: FeatureStore):
    """The trusted and the extended model, checked against the features and against each other."""
    from clid.model.checkpoints import load_checkpoint, read_config

    for folder in (args.trusted, args.extended):
        check_features_match(read_config(folder), features, folder)
    trusted, extended = load_checkpoint(args.trusted, args.device), load_checkpoint(args.extended, args.device)
    if any(getattr(trusted.config, name) != getattr(extended.config, name)
           for name in ("levels", "output_vocab", "num_classes", "box_input")):
        sys.exit("error: the trusted and extended checkpoints use different length levels, output vocabularies, "
                 "region class counts or box inputs")
    if same_weights(trusted, extended):
        sys.exit(f"error: --trusted {args.trusted} and --extended {args.extended} hold the same weights: every u "
                 "would be 0; give the model trained on trusted captions and the one trained on the extended set")
    return trusted, extended


def main(argv=None):
    args = parse_args(argv)
    # the model stack (torch, the kernels), imported once the flags are read: --help and a bad flag answer at once
    from clid.model.checkpoints import saved_config
    from clid.model.scoring import caption_logprobs

    record = runs.run_record(args, inputs=("trusted", "extended", "selfgen", "features", "captions", "test_ids"),
                             settings=("mode", "count", "include_trusted", "test_ids", "no_split_check", "precision"))
    job = shard.Job(args.out, shard.Shard.from_args(args), args.chunk_size, record, args.restart, (".h5", ".hdf5"))

    # the captions, tokenised as the models read them: with the scoring model's tokenizer and levels
    levels, tokenizer = saved_config(args.trusted).levels, load_tokenizer(str(args.trusted))
    items, skipped = load_items(args, CaptionFiles(levels, args.token_cache), tokenizer)
    items = drop_outside_vocab(items, skipped, saved_config(args.trusted).output_vocab)
    features = FeatureStore(args.features, bad=args.bad_features)
    check_items_left_out(items, skipped, features, args)
    rows = range(len(items))  # (the job's items: rows of items)
    if not job.done:
        trusted, extended = load_models(args, features)
        regions = RegionCache.for_model(features, trusted.config, cache_bytes(args.region_cache))
        args.batch_size = scoring_batch_size(args, trusted, features)
        print(f"scoring {len(job.spec.select(rows))} of {len(items)} captions (shard {job.spec.shard_id}/"
              f"{job.spec.num_shards}) in {args.mode} mode on {args.device}")

    def score(chunk):
        """One chunk of captions (rows of ``items``): Eq. 2 under each model, Eq. 1 from the two; written to its
        part of the quality file (with the digest of each caption's text), and the captions it could not score
        (``skipped.tsv``: reason, count)."""
        examples, not_scored = usable(items.subset(chunk.items), trusted.levels, "selfgen", features)

        def eq2(model, progress):  # Eq. 2: each caption's length-normalised log-likelihood under ``model``
            return caption_logprobs(model, examples, regions, args.mode, args.batch_size, args.device,
                                    args.count == "level", progress, args.precision)

        # progress counts captions: a batch counts half its size per model
        logp_trusted = eq2(trusted, lambda n: chunk.progress(n // 2))
        logp_extended = eq2(extended, lambda n: chunk.progress(n - n // 2))
        u = eq1_quality(logp_trusted, logp_extended)
        features.check_unchanged()  # (no chunk is scored from two versions of the file)
        shard.write_table(chunk.table("skipped.tsv"), ("reason", "count"), sorted(not_scored.items()))
        write_quality(chunk.path, examples.caption_ids, logp_trusted, logp_extended, u, examples.sources,
                      examples.digests)

    done = job.run(rows, score, "05 score", "cap")
    for reason, count in shard.read_table(shard.side_path(job.written(), "skipped.tsv")):
        skipped[reason] += int(count)
    report_skipped(skipped, features, "not scored")
    if done is not None:
        report(done)
    else:
        print(f"shard {job.spec.shard_id} done; the last shard to finish merges (or: python -m clid.shard merge "
              f"{args.out} --num-shards {job.spec.num_shards})")


if __name__ == "__main__":
    run_main(main)
