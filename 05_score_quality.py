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
clid/model/scoring.py). ``--mode pseudo`` and ``--mode onepass`` are documented approximations.
Per-item stage: ``--shard-id/--num-shards`` (SLURM array defaults), chunked and resumable (a
resume with other inputs or flags is refused unless ``--restart``). Captions not scored are
counted by reason in ``OUT.skipped.tsv``.
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from clid import runs, shard
from clid.cli import HelpFormatter, device, positive_int, run_main
from clid.data.splits import add_split_args
from clid.features.store import FeatureStore, RegionCache, add_bad_features_arg, check_features_match
from clid.files import DataError, read_arrays, read_jsonl, write_quality
from clid.model.checkpoints import load_checkpoint, read_config
from clid.model.inputs import add_left_out_arg, check_left_out, make_examples, report_skipped, training_items
from clid.model.scoring import MODES, caption_logprobs
from clid.text import preprocess

COUNTS = ("level", "caption")  # Eq. 2's m: the level's padded length (the authors' code), or the caption's tokens


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
    scoring.add_argument("--batch-size", type=positive_int, default=64, help="captions scored together")
    run.add_argument("--chunk-size", type=positive_int, default=4096, help="captions per resumable chunk")
    scoring.add_argument("--device", type=device, default=None,
                         help="cuda, cuda:1, cpu, ... (default: cuda if available, else cpu)")
    add_split_args(data)
    add_left_out_arg(data)
    shard.add_shard_args(run)
    args = p.parse_args(argv)
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    return args


def load_items(args):
    """(caption id, image id, text, source) of everything to score, and skip counts."""
    if args.include_trusted and not args.captions:
        sys.exit("error: --include-trusted needs --captions")
    if not args.captions:
        items = [(str(r["id"]), str(r["image_id"]), r["caption"], "selfgen")
                 for r in read_jsonl(args.selfgen, required=("id", "image_id", "caption"))]
        return items, Counter()  # (a caption with no word left is counted by make_examples)
    found = training_items(args.captions, args.selfgen, args.test_ids, not args.no_split_check)
    items = [(*item, "selfgen") for item in found.selfgen]
    if args.include_trusted:
        items += [(f"trusted:{c}", i, t, "trusted") for c, i, t in found.trusted]
    return items, found.skipped


def same_weights(a, b) -> bool:
    """Whether two models hold identical weights (the same checkpoint given twice, or a copy of it)."""
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(sa[k].shape == sb[k].shape and torch.equal(sa[k], sb[k]) for k in sa)


def check_items_left_out(items, skipped: Counter, features: FeatureStore, args) -> None:
    """Stop before any scoring when more than --max-left-out of the captions of a source would be left
    out (their images missing from the feature file, or no word left)."""
    for source in ("selfgen", "trusted"):
        mine = [(c, i, t) for c, i, t, s in items if s == source]
        lost = Counter(f"{source}: no word left after preprocessing" if not preprocess(t)
                       else f"{source}: no region features for the image" for _, i, t in mine
                       if not preprocess(t) or not features.holds(i))
        offered = len(mine) + sum(n for reason, n in skipped.items() if reason.startswith(source + ":"))
        path = args.selfgen if source == "selfgen" else args.captions
        check_left_out(source, offered, skipped + lost, args.max_left_out, path, mine, features)


def score_chunk(chunk, models, features, regions, args):
    """Score one chunk of captions with both models; write its part of the quality file (Eq. 1)
    and the captions it could not score (``skipped.tsv``: reason, count)."""
    tokenizer = models[0].tokenizer
    examples, skipped = make_examples([(c, i, t) for c, i, t, _ in chunk.items], tokenizer, models[0].levels,
                                      "selfgen", features)
    source = {c: s for c, _, _, s in chunk.items}
    # progress counts captions: a batch counts half its size per model
    logp = [caption_logprobs(m, examples, regions, args.mode, args.batch_size, args.device, args.count == "level",
                             progress=lambda n, k=k: chunk.progress(n // 2 if k == 0 else n - n // 2))
            for k, m in enumerate(models)]
    shard.write_table(chunk.table("skipped.tsv"), ("reason", "count"), sorted(skipped.items()))
    write_quality(chunk.path, examples.caption_ids, logp[0], logp[1], [source[c] for c in examples.caption_ids])


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

        from clid.files import atomic_path

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


def main(argv=None):
    args = parse_args(argv)
    record = runs.run_record(args, inputs=("trusted", "extended", "selfgen", "features", "captions", "test_ids"),
                             settings=("mode", "count", "include_trusted", "test_ids", "no_split_check"))
    job = shard.Job(args.out, shard.Shard.from_args(args), args.chunk_size, record, args.restart, (".h5", ".hdf5"))
    try:
        items, skipped = load_items(args)
        features = FeatureStore(args.features, bad=args.bad_features)
    except (DataError, FileNotFoundError) as err:
        sys.exit(f"error: {err}")
    check_items_left_out(items, skipped, features, args)
    if not job.done:
        for folder in (args.trusted, args.extended):
            check_features_match(read_config(folder), features, folder)
        models = [load_checkpoint(args.trusted, args.device), load_checkpoint(args.extended, args.device)]
        if any(getattr(models[0].config, name) != getattr(models[1].config, name)
               for name in ("levels", "output_vocab", "num_classes", "box_input")):
            sys.exit("error: the trusted and extended checkpoints use different length levels, output vocabularies, "
                     "region class counts or box inputs")
        if same_weights(*models):
            sys.exit(f"error: --trusted {args.trusted} and --extended {args.extended} hold the same weights: every u "
                     "would be 0; give the model trained on trusted captions and the one trained on the extended set")
        regions = RegionCache.for_model(features, models[0].config)
        print(f"scoring {len(job.spec.select(items))} of {len(items)} captions (shard {job.spec.shard_id}/"
              f"{job.spec.num_shards}) in {args.mode} mode on {args.device}")
    done = job.run(items, lambda chunk: score_chunk(chunk, models, features, regions, args), "05 score", "cap")
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
