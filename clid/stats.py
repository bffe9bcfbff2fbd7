"""Caption length statistics per level, like the paper's level table.

    python -m clid.stats CAPTIONS_FILE [--levels caption|paragraph|labert] [--split test] [--json]

Reads Karpathy JSON, the official COCO captions JSON, the paragraphs JSON or our JSONL (only a
Karpathy JSON has splits: ``--split`` on another file, or a split without captions, is an error). Lengths
follow the length convention of docs/method.md (WordPiece tokens of the preprocessed caption plus the
final ".").
With ``--json`` the last line printed is one JSON object: ``n``, ``mean``, ``std`` and ``levels``
(a list of ``{level, low, high, count, pct}``), plus ``above`` (longer than the last level).
With ``--levels paragraph`` it also prints (and, with ``--json``, gives as ``bands``) the share of
paragraphs in the paper's four length bands, beside the paper's own shares.
"""
from __future__ import annotations

import argparse
import json

from clid.data.stats import above_note, file_lengths, format_bands, format_table, length_stats, paragraph_bands
from clid.run.cli import HelpFormatter, add_download_arg, add_levels_arg, add_tokenizer_arg, run_main


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m clid.stats", description=__doc__.split("\n\n")[0],
                                     formatter_class=HelpFormatter)
    parser.add_argument("path", help="Karpathy JSON, COCO captions JSON, paragraphs JSON or JSONL")
    add_levels_arg(parser, "the length levels the shares are counted in")
    parser.add_argument("--split", default=None, help="only this split (e.g. train, val, test)")
    add_tokenizer_arg(parser, "tokenizer folder or hub name")
    add_download_arg(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = parser.parse_args(argv)
    from clid.base.text import load_tokenizer

    lengths = file_lengths(args.path, args.split, load_tokenizer(args.tokenizer))
    stats = length_stats(lengths, args.levels)
    print(format_table(stats, f"{args.path} ({args.levels} levels)"))
    if line := above_note(stats, args.levels):
        print(line)
    if args.levels == "paragraph":
        stats["bands"] = paragraph_bands(lengths)
        print(format_bands(stats["bands"]))
    if args.json:
        print(json.dumps(stats))


if __name__ == "__main__":
    run_main(main)
