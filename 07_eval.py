"""Stage 07: evaluate length-controlled captions, per length level, for one or more methods.

In:  --refs captions.json (any caption format clid.data.captions reads; its test split is evaluated) and
     runs to compare, each either
       --checkpoint [NAME=]CKPT (with --features features.h5): captions generated at every level, or
       --generated [NAME=]FILE: captions made elsewhere, JSONL lines {"image_id", "level", "caption"}
       (optional "filled": true when the model wrote no "." in the level).
     Entries with one NAME are runs of one method (e.g. three seeds); a bare CKPT or FILE is named
     after the folder or file. Optional: --long-refs long_refs.json (demo world: test images with
     long descriptions whose sentences carry a "level"), --selfgen selfgen.jsonl (length histograms).
Out: --out DIR holding metrics.json (every number, per run and per method), report.md (tables,
     plots, example captions), control_precision.png, quality_vs_control.png, length_histograms.png,
     per_image.jsonl (per run, level and test image: in range or not, its CIDEr), and for checkpoint runs
     generated/<run>.jsonl (each caption with its length as counted; reused by a re-run while the
     checkpoint and the decoding are unchanged), and written.json (the digest of each file written, so that
     a file edited since is never replaced).
     --combine DIR ...: the folders (e.g. one per seed) reported together: each method's mean ± std over
     its runs and, from the folders' per_image.jsonl, its mean with a 95% interval (a bootstrap over the
     seeds and their test images, 2,000 resamples, seed 0), its difference against CLID paired by seed
     and image, and the paper's three claims marked held, not held or undecided (clid/evaluation/intervals.py).
     Without --refs (captions of one's own images): length control alone, over every image with a
     caption (a checkpoint captions every image of --features): control precision, length error and
     mean length per level in report.md and metrics.json, control_precision.png, length_histograms.png.

    python 07_eval.py --refs data/demo/captions.json --features data/demo/features.h5 \\
        --checkpoint trusted=runs/demo/trusted --checkpoint CLID=runs/demo/clid \\
        --checkpoint CLID=runs/demo/seed1/clid --long-refs data/demo/long_refs.json --out runs/demo/eval
    python 07_eval.py --refs captions_val2014.json --generated mine.jsonl --out eval  # Karpathy 5k
    python 07_eval.py --generated captions.jsonl --out eval  # no references: length control alone

Per level and run (definitions in clid/evaluation/metrics.py): control precision (share of ALL test images
whose caption length is inside the level; a missing caption is a miss), BLEU-1..4, METEOR,
ROUGE-L, CIDEr and SPICE (pycocoevalcap, PTB tokenizer) on the in-range captions, length error
and distinct-1/2. CIDEr's document frequencies come from the scored subset of each level. A method
with several runs is reported as the mean and the standard deviation over its runs (the paper
reports the mean of 3 runs). The defaults follow the authors' code where the paper is silent:
confidence-averaging decoding (--no-labert-average: update only the re-masked positions) and their
length count (--length-count strict: a caption filling its level without "." is one token over).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from clid.base.files import WRITTEN, DataError, check_output_folder, check_outputs, natural_key, record_written
from clid.base.text import LEVEL_SETS, get_levels, load_tokenizer
from clid.caption import add_decoding_args
from clid.data.store import FeatureStore, add_bad_features_arg
from clid.evaluation.metrics import (
    SSA_LEVELS,
    CocoScorer,
    counts_sentences,
    evaluate,
    evaluate_lengths,
    load_refs,
    long_refs_for,
    read_generated,
    to_ssa_levels,
    write_generated,
)
from clid.evaluation.report import (
    OWN_FILES,
    combine,
    edited_files,
    eval_files,
    length_histograms,
    report_coverage,
    run_ids,
    run_list,
    selfgen_captions,
    write_outputs,
)
from clid.evaluation.tables import TABLES, check_tables_folder
from clid.run import runtime
from clid.run.cli import HelpFormatter, add_download_arg, add_tokenizer_arg, non_negative_int, run_main


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    references = p.add_argument_group("references", "the test images and their references (without --refs: length "
                                                    "control alone, over every image with a caption)")
    runs = p.add_argument_group("runs", "the captions to evaluate: checkpoints (decoded here) or files")
    scoring = p.add_argument_group("scoring", "the quality metrics and the length count")
    report = p.add_argument_group("report", "the output folder")
    references.add_argument("--refs", help="reference captions (Karpathy JSON, COCO captions JSON, ...); without it: "
                                           "control precision and mean length per level, no quality scores")
    references.add_argument("--split", default="test", help="the split of --refs to evaluate on (default: test)")
    references.add_argument("--test-ids", default=None,
                            help="evaluate these image ids instead of --split (a file, or 'karpathy' for the "
                                 "Karpathy 5k test ids; the default for an official COCO captions file)")
    references.add_argument("--long-refs", default=None, help="Karpathy JSON of long references with a 'level' per sentence")
    references.add_argument("--selfgen", default=None, help="self-generated captions JSONL (length histogram only)")
    runs.add_argument("--features", default=None, help="region features HDF5 (needed by --checkpoint)")
    add_bad_features_arg(runs)
    runs.add_argument("--checkpoint", action="append", default=[], metavar="[NAME=]DIR",
                      help="a checkpoint folder to evaluate (repeatable; entries with one NAME are runs of one method)")
    runs.add_argument("--generated", action="append", default=[], metavar="[NAME=]FILE",
                      help="a generated-captions JSONL (repeatable; entries with one NAME are runs of one method)")
    runs.add_argument("--name", action="append", default=[],
                      help="names, one per entry, checkpoints first then generated files (instead of NAME=; "
                           "default: the checkpoint folder's name / the file's name without extension)")
    runs.add_argument("--levels", default=None, choices=sorted(LEVEL_SETS) + ["ssa"],
                      help="level set (default: the checkpoints' own, else caption); ssa: CIC-BART-SSA's word-count "
                           "levels <10, 10-19, 20-29, 30-39, >=40 words, for evaluation only: a checkpoint's captions of "
                           "its levels 1-5 (caption levels) are counted in words, a --generated file's levels are these")
    scoring.add_argument("--score-captions", default="in-range", choices=["in-range", "all"],
                         help="which captions get quality scores (in-range: the paper)")
    scoring.add_argument("--spice", default="auto", choices=["auto", "off"],
                         help="auto: run SPICE when Stanford CoreNLP is there or can be downloaded")
    report.add_argument("--examples", type=non_negative_int, default=3,
                        help="images shown with their captions in report.md (default: 3)")
    runtime.add_device_arg(runs, default="cpu", help="generation device: cpu, cuda, cuda:1, ...")
    add_decoding_args(runs)
    runs.add_argument("--regenerate", action="store_true", help="generate again even if generated/<run>.jsonl is current")
    add_tokenizer_arg(scoring, "tokenizer for caption lengths")
    report.add_argument("--combine", nargs="+", metavar="EVAL_DIR",
                        help="instead of evaluating: report several 07 output folders together (e.g. one per seed, each "
                             "on its own test images); a method's runs in all of them give its mean ± std, and its 95%% "
                             "interval over seeds and images, its difference against CLID and the paper's claims")
    report.add_argument("--tables", metavar="FOLDER",
                        help="with --combine: also write the README's demo tables as files into FOLDER (e.g. "
                             "docs/measurements/<date>-demo; `python -m clid.tables FOLDER` prints them)")
    report.add_argument("--out", required=True, help="output folder")
    report.add_argument("--force", action="store_true",
                        help="write into an --out that holds files 07 did not write (they are never deleted or replaced; "
                             "without it such an --out is refused)")
    add_download_arg(scoring)
    args = p.parse_args(argv)
    if not args.refs:
        for flag, given in (("--long-refs", args.long_refs), ("--test-ids", args.test_ids)):
            if given:
                p.error(f"{flag} needs --refs (without --refs, 07 reports length control alone)")
    args.precision = runtime.device_plan(args.device, args.precision).use()  # what auto means here
    return args


def collect_captions(runs, ids, args, image_ids, out: Path):
    """Every run's captions: (levels, {run: (captions, filled)}, {run: source}, {run: skip counts}, the
    evaluated image ids). ``image_ids`` None (no --refs): every image captioned by a run, where a checkpoint
    captions every image of --features."""
    from clid.caption.cached import generate_cached  # (the model stack: here, so --help answers without torch)

    levels = get_levels(args.levels) if args.levels else None
    captions, sources, skips = {}, {}, {}
    features = FeatureStore(args.features, bad=args.bad_features) if args.checkpoint else None
    to_caption = image_ids if image_ids is not None else features.ids() if features is not None else []
    for run, (name, kind, path) in zip(ids, runs):
        if kind == "checkpoint":
            run_levels, generated, filled, no_features = generate_cached(
                path, out / "generated" / f"{run}.jsonl", args, to_caption, features, levels)
            levels = levels or run_levels
            if run_levels != levels:
                raise SystemExit(f"error: {path} uses levels {run_levels}, the other runs {levels}")
            sources[run] = f"checkpoint `{path}`"
            skips[run] = {"test images without region features (counted as misses)": no_features}
            if no_features:
                print(f"warning: {run}: {no_features} test images have no region features in {args.features}; "
                      "they count as misses")
            captions[run] = (generated, filled)
    levels = levels or get_levels("caption")
    for run, (name, kind, path) in zip(ids, runs):
        if kind == "generated":
            captions[run] = read_generated(path, len(levels), with_filled=True)
            sources[run] = f"generated captions `{path}`"
            skips[run] = {}
    what = "test images" if image_ids is not None else "images"
    if image_ids is None:  # no references: every captioned image is evaluated
        image_ids = sorted({i for generated, _ in captions.values() for by_image in generated.values() for i in by_image}
                           | set(to_caption), key=natural_key)
    for run, (name, kind, path) in zip(ids, runs):
        report_coverage(run, path, captions[run][0], image_ids, len(levels), what)
    if features is not None:
        if bad_line := features.skip_report():
            print(f"warning: {bad_line}; they count as misses")
        features.close()
    return levels, {run: captions[run] for run in ids}, sources, skips, image_ids


def eval_outputs(args, out: Path, runs, ids) -> dict:
    """What 07 writes, by what names it (for :func:`clid.base.files.check_outputs`): --out and its files, each
    checkpoint run's captions and their cache record in generated/."""
    if args.combine:
        tables = {"--tables": Path(args.tables), **{f"--tables' {name}": Path(args.tables) / name
                                                    for name in (*TABLES, WRITTEN)}} if args.tables else {}
        return {"--out": out, **{f"--out's {name}": out / name for name in (*OWN_FILES, WRITTEN)}, **tables}
    outputs = {"--out": out, **{f"--out's {name}": out / name for name in (*OWN_FILES, WRITTEN)}}
    for run, (_, kind, _) in zip(ids, runs):
        if kind == "checkpoint":
            outputs[f"run {run}'s captions"] = out / "generated" / f"{run}.jsonl"
            outputs[f"run {run}'s cache record"] = out / "generated" / f"{run}.meta.json"
    return outputs


# ---------------------------------------------------------------------------------------------

def main(argv=None) -> None:
    args = parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    out = Path(args.out)
    if args.tables:  # (checked now: the tables are written last)
        if not args.combine:
            raise SystemExit("error: --tables writes 07 --combine's tables: give it with --combine")
        check_tables_folder(args.tables)
    runs = [] if args.combine else run_list(args)  # (the runs' names, checked first: they name files in --out)
    ids = run_ids(runs)
    check_outputs(eval_outputs(args, out, runs, ids), {
        "--refs": args.refs, "--features": args.features, "--long-refs": args.long_refs, "--selfgen": args.selfgen,
        "--test-ids": args.test_ids, "--combine": args.combine or [],
        "--checkpoint": [path for _, kind, path in runs if kind == "checkpoint"],
        "--generated": [path for _, kind, path in runs if kind == "generated"]})
    if edited := edited_files(out):  # (a report the user has edited is theirs now: never replaced)
        raise DataError(out / edited[0], None, f"was edited since 07 wrote it (its digest is not the one in {WRITTEN}): "
                                               "it is kept; move it out of --out, or give another --out")
    check_output_folder(out, eval_files(out), args.force,
                        writes={"generated", *OWN_FILES, WRITTEN})
    if args.combine:
        (out / WRITTEN).unlink(missing_ok=True)  # (a run stopped while it writes leaves no digests of the last one)
        combine(args.combine, out, args.tables)
        return record_written(out, OWN_FILES)
    if args.checkpoint and args.features is None:
        raise SystemExit("error: --checkpoint needs --features")
    inputs = [("--refs", args.refs), ("--features", args.features), ("--long-refs", args.long_refs),
              ("--selfgen", args.selfgen), *(("--generated", p) for _, kind, p in runs if kind == "generated")]
    for flag, path in inputs:  # fail now, not after minutes of generation and scoring
        if path is not None and not Path(path).is_file():
            raise DataError(path, None, f"{flag}: no such file")
    tokenizer = load_tokenizer(args.tokenizer)

    # 1. the test images and their references; without --refs, every captioned image and no references
    refs, trusted, skipped, evaluated, image_ids = None, [], {}, None, None
    if args.refs:
        refs, trusted, skipped, evaluated = load_refs(args.refs, args.split, args.test_ids)
        image_ids = sorted(refs, key=natural_key)
        print(f"{args.refs}: {len(image_ids)} test images ({evaluated})")
    for reason, count in skipped.items():
        if count:
            print(f"warning: left out {count} {reason}")
    selfgen_texts = selfgen_captions(args.selfgen)  # (read now: a bad line stops the run before any work)

    # 2. the runs' captions: generated from checkpoints (cached), or read from generated files
    ssa = args.levels == "ssa"
    if ssa:  # the checkpoints' captions at their own levels, counted against SSA's word levels
        args.levels = None
    levels, captions, sources, run_skips, image_ids = collect_captions(runs, ids, args, image_ids, out)
    if refs is None:
        evaluated = "every image with a caption of a run; no references, so length control alone"
        print(f"no --refs: length control of {len(image_ids)} images, every image with a caption of a run")
    level_set = next((k for k, v in LEVEL_SETS.items() if v == levels), "custom")
    keep_sentences = counts_sentences(levels)
    histograms = length_histograms(trusted, selfgen_texts, tokenizer, keep_sentences)
    long_refs = long_refs_for(args.long_refs, refs, levels, skipped)
    if ssa:
        captions = {run: to_ssa_levels(*captions[run], levels, kind, path) for run, (_, kind, path) in zip(ids, runs)}
        levels, level_set, long_refs = SSA_LEVELS, "ssa", {}

    # 3. every run's lengths as counted, control precision and quality per level (one PTB / METEOR process)
    scorer = CocoScorer(spice=args.spice) if refs is not None else None
    if scorer:
        print(f"SPICE: {scorer.spice_reason}")
    results = {}
    for run, (generated, filled) in captions.items():
        counting = dict(tokenizer=tokenizer, keep_sentences=keep_sentences, filled=filled,
                        strict=args.length_count == "strict", words=ssa)
        if scorer is None:
            results[run] = evaluate_lengths(generated, image_ids, levels, **counting)
        else:
            results[run] = evaluate(generated, refs, levels, long_refs=long_refs, scorer=scorer,
                                    score_captions=args.score_captions, progress=True, desc=f"scoring {run}", **counting)
        run_skips[run]["captions of images outside the test images"] = n_outside = results[run].pop("n_outside")
        if n_outside:
            print(f"warning: {run}: left out {n_outside} captions of images that are not test images")
    if scorer:
        scorer.close()
    for run, (name, kind, _) in zip(ids, runs):
        if kind == "checkpoint" and not ssa:  # each generated caption with its length as counted (the cache)
            write_generated(out / "generated" / f"{run}.jsonl", *captions[run], results[run]["lengths"])

    # 4. metrics.json, report.md and the plots, per method (the mean and spread of its runs)
    methods = {}
    for run, (name, _, _) in zip(ids, runs):
        methods.setdefault(name, []).append(run)
    meta = {"refs": args.refs, "evaluated": evaluated, "n_test_images": len(image_ids),
            "level_set": level_set, "levels": [list(l) for l in levels], "length_count": args.length_count,
            "score_captions": args.score_captions, "spice": scorer.spice_reason if scorer else "n/a: no references",
            "long_refs": args.long_refs, "skipped": skipped,
            "runs": {run: {"method": name, "source": sources[run], "skipped": run_skips[run]}
                     for run, (name, _, _) in zip(ids, runs)}}
    (out / WRITTEN).unlink(missing_ok=True)  # (a run stopped while it writes leaves no digests of the last one)
    write_outputs(out, meta, methods, results, {run: c[0] for run, c in captions.items()}, refs, long_refs,
                  levels, histograms, args.examples, image_ids)
    record_written(out, OWN_FILES)


if __name__ == "__main__":
    run_main(main)
