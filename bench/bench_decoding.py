"""Decoding with and without n-gram blocking, on the demo world's test images: control precision, CIDEr
against the trusted references and against the world's long references, repetition, and seconds.

In:  a checkpoint (04, 06) trained on the demo world, and the world's folder (00_demo_data.py: its
     captions.json, long_refs.json and features.h5).
Out: a Markdown table on stdout, one row per (--block-ngram, level); the first rows are the references'
     own repetition per level (the world's long descriptions, and the trusted captions at their level);
     --json FILE also writes the rows.

    python bench/bench_decoding.py --checkpoint runs/quick/model --demo data/demo --block-ngram 0 3 4

Columns: control precision (the share of captions inside their level, counted as 07 counts); CIDEr of
the in-range captions against the trusted test references and against that level's long references
(07's scorer, SPICE off); rep3: the share of captions with a 3-gram twice or more; max4: the most
times one 4-gram occurs in one caption; broken: the share of captions that end on a function word or pair
words that no phrase pairs ("a in", "a umbrella"; clid.evaluation.repetition); listed: the share that list objects
("a sand and a dress and a woman", where a sentence links them by verbs and prepositions); s: CPU seconds of decoding per level
(this process's CPU time, which a busy machine changes much less than wall-clock time; OMP_NUM_THREADS=1).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from clid.evaluation.repetition import reference_texts, repetition
from clid.run.cli import HelpFormatter, run_main


def reference_rows(demo: Path, levels) -> list[dict]:
    """The repetition of the world's own texts at each level (clid.evaluation.repetition.reference_texts)."""
    return [{"decoding": f"references ({kind})", "level": level, **repetition(texts)}
            for level, (kind, texts) in reference_texts(demo, levels).items()]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    p.add_argument("--checkpoint", required=True, help="checkpoint folder trained on the demo world")
    p.add_argument("--demo", default="data/demo", help="the demo world's folder")
    p.add_argument("--block-ngram", type=int, nargs="+", default=[0, 3], help="the settings compared")
    p.add_argument("--levels", type=int, nargs="+", default=None, help="levels to decode (default: every level)")
    p.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = p.parse_args(argv)

    from clid.caption import CaptionWriter
    from clid.evaluation.metrics import CocoScorer, evaluate, load_long_refs, load_refs

    demo = Path(args.demo)
    writer = CaptionWriter.from_checkpoint(args.checkpoint, device="cpu", features=demo / "features.h5")
    levels = writer.select_levels(args.levels)
    refs = load_refs(demo / "captions.json", "test", None)[0]
    long_refs = load_long_refs(demo / "long_refs.json")
    rows = reference_rows(demo, writer.levels)
    scorer = CocoScorer(spice="off")
    for n in args.block_ngram:
        writer.block_ngram = n
        start = time.process_time()
        generated, filled = writer.decode(sorted(refs), levels)
        seconds = time.process_time() - start
        result = evaluate(generated, refs, writer.levels, long_refs=long_refs, scorer=scorer, filled=filled)
        for level in levels:
            row = result["levels"][level]
            rows.append({"decoding": f"block {n}" if n else "authors' (block 0)", "level": level,
                         "control_precision": row["control_precision"], "cider": row.get("CIDEr"),
                         "cider_long": result["long_refs"].get(level, {}).get("CIDEr"),
                         **repetition(generated[level].values()), "seconds": seconds / len(levels)})
    scorer.close()
    print(f"{args.checkpoint} on the {len(refs)} test images of {demo}")
    print("| decoding | level | control precision | CIDEr | CIDEr (long refs) | rep3 | max4 | broken | listed | s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    cell = lambda v, f: "" if v is None else format(v, f)  # noqa: E731
    for r in rows:
        print(f"| {r['decoding']} | L{r['level']} | {cell(r.get('control_precision'), '.3f')} | {cell(r.get('cider'), '.3f')} "
              f"| {cell(r.get('cider_long'), '.3f')} | {r['repeats_3gram']:.1%} | {r['max_4gram']} "
              f"| {r['broken']:.1%} | {r['listed']:.1%} | {cell(r.get('seconds'), '.1f')} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    run_main(main)
