"""Captions of an exact length (``--length N``) beside the level decoding, on the test images of a world:
the hit rate per N (the share of captions with exactly N tokens) and the control precision of the level
N is decoded at (the share of that level's captions inside it).

In:  a checkpoint (04, 06) and the folder of the world it was trained on (00_demo_data.py: its
     captions.json, whose test split is captioned, and features.h5).
Out: a Markdown table on stdout, one row per N; --json FILE also writes the rows.

    python bench/bench_length.py --checkpoint runs/quick/model --demo data/demo --lengths 5 12 25 40

Lengths are counted as 07 counts them (WordPiece tokens and the final "."), from the captions' text.
N above the checkpoint's longest level is a row that says so, with no figure. s: CPU seconds of the
exact-length decoding (this process's CPU time; OMP_NUM_THREADS=1 for figures to compare).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from clid.run.cli import HelpFormatter


def length_rows(writer, image_ids: list[str], lengths: list[int]) -> list[dict]:
    """One row per N of ``lengths``: ``length``, ``level`` (the level N is decoded at), ``hits`` and ``hit_rate``
    (captions of exactly N tokens), ``control_precision`` (that level's own captions inside it), ``seconds``;
    N above the checkpoint's longest level: ``longest`` alone."""
    from clid.base.text import caption_lengths, keeps_sentences
    from clid.model.decode import exact_level

    paragraphs = keeps_sentences(writer.levels)
    precision: dict[int, float] = {}  # level -> control precision, each level decoded once
    rows = []
    for n in lengths:
        if not 1 <= n <= writer.longest:
            rows.append({"length": n, "longest": writer.longest})
            continue
        start = time.process_time()
        captions = writer.caption(image_ids, length=n)
        seconds = time.process_time() - start
        got = caption_lengths([str(captions[i]) for i in image_ids], None, paragraphs)  # 07's count, from the text
        level = exact_level(writer.levels, n)
        if level not in precision:
            by_image = writer.caption(image_ids, levels=[level])
            precision[level] = sum(by_image[i][level].in_range for i in image_ids) / len(image_ids)
        hits = sum(g == n for g in got)
        rows.append({"length": n, "level": level, "level_range": list(writer.levels[level - 1]), "images": len(image_ids),
                     "hits": hits, "hit_rate": hits / len(image_ids), "control_precision": precision[level],
                     "seconds": seconds})
    return rows


def print_table(rows: list[dict]) -> None:
    print("| N | level | hit rate (exactly N tokens) | level's control precision | s |")
    print("|---|---|---|---|---|")
    for r in rows:
        if "hit_rate" not in r:
            print(f"| {r['length']} | - | above the longest level ({r['longest']} tokens) | - | - |")
            continue
        low, high = r["level_range"]
        print(f"| {r['length']} | L{r['level']} ({low}-{high}) | {r['hit_rate']:.1%} ({r['hits']} of {r['images']}) "
              f"| {r['control_precision']:.1%} | {r['seconds']:.1f} |")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    p.add_argument("--checkpoint", required=True, help="checkpoint folder trained on the world")
    p.add_argument("--demo", default="data/demo", help="the world's folder (captions.json, features.h5)")
    p.add_argument("--lengths", type=int, nargs="+", default=[5, 12, 25, 40], metavar="N",
                   help="the exact lengths measured, in tokens")
    p.add_argument("--block-ngram", type=int, default=None, help="n-gram blocking (default: CaptionWriter's)")
    p.add_argument("--limit", type=int, default=None, help="only the first N test images")
    p.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = p.parse_args(argv)

    from clid.base.files import natural_key
    from clid.caption import CaptionWriter
    from clid.evaluation.metrics import load_refs

    demo = Path(args.demo)
    writer = CaptionWriter.from_checkpoint(args.checkpoint, device="cpu", features=demo / "features.h5")
    if args.block_ngram is not None:
        writer.block_ngram = args.block_ngram
    image_ids = sorted(load_refs(demo / "captions.json", "test", None)[0], key=natural_key)[:args.limit]
    rows = length_rows(writer, image_ids, args.lengths)
    print(f"{args.checkpoint} on {len(image_ids)} test images of {demo} (--block-ngram {writer.block_ngram})")
    print_table(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
