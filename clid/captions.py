"""``python -m clid.captions convert-coco``: official COCO captions JSONs -> a Karpathy-style JSON;
``python -m clid.captions convert-ssa``: CIC-BART-SSA's SSA captions -> our self-generated JSONL."""
from __future__ import annotations

import argparse

from clid.base.files import check_outputs, write_json, write_jsonl
from clid.data.splits import convert_coco
from clid.run import runs
from clid.run.cli import HelpFormatter, WrappedHelpFormatter, add_levels_arg, non_negative_int, run_main


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m clid.captions", description="Caption-file tools.",
                                     formatter_class=HelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    convert = commands.add_parser(
        "convert-coco", help="official COCO captions JSONs -> a Karpathy-style JSON",
        formatter_class=WrappedHelpFormatter,
        description="Official COCO captions JSONs -> a Karpathy-style JSON with train, val and test. test: the "
                    "Karpathy 5k test images (ids from eccv-caption); val: --karpathy's val (and its restval), else "
                    "the 5,000 val2014 images outside test with the smallest SHA-1 of their COCO id; train: the rest. "
                    "Prints the split sizes (the Karpathy split: 113,287 / 5,000 / 5,000).")
    convert.add_argument("--captions", nargs="+", required=True, metavar="FILE",
                         help="official COCO captions JSONs (captions_train2014.json captions_val2014.json)")
    convert.add_argument("--out", required=True, help="the Karpathy-style JSON to write")
    convert.add_argument("--karpathy", default=None, metavar="dataset_coco.json",
                         help="take val (and restval) from the Karpathy split file (default: the 5,000 val2014 images "
                              "outside the test split with the smallest SHA-1 of their COCO id)")
    convert.add_argument("--val-size", type=non_negative_int, default=5000, help="validation images without --karpathy")
    ssa = commands.add_parser(
        "convert-ssa", help="CIC-BART-SSA's SSA captions (one JSON per image) -> self-generated captions JSONL",
        formatter_class=WrappedHelpFormatter,
        description="The released SSA captions (ASG-style JSON, one <image id>.json per image, regions keyed by "
                    "region id, each with objects, relationships and a phrase) -> our self-generated JSONL (id, "
                    "image_id, caption, objects, n_tokens, level), for 05 and 06. Malformed regions and regions with "
                    "an ungrounded object are left out and counted (clid/data/ssa.py).")
    ssa.add_argument("--ssa", nargs="+", required=True, metavar="PATH", help="SSA JSON files or folders of them")
    ssa.add_argument("--out", required=True, help="the JSONL to write")
    add_levels_arg(ssa, "length levels for 'level'")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.command == "convert-ssa":
        return convert_ssa(args)
    check_outputs({"--out": args.out}, {"--captions": args.captions, "--karpathy": args.karpathy})
    command = "python -m clid.captions convert-coco"
    runs.check_own_output(args.out, command)
    data, notes = convert_coco(args.captions, args.karpathy, args.val_size)
    runs.claim_output(args.out, command)
    write_json(args.out, data)
    record = runs.run_record(args, inputs=("captions", "karpathy"), settings=("val_size",))
    runs.write_own_record(args.out, record, command)
    print("\n".join(notes))
    print(f"wrote {args.out}")


def convert_ssa(args) -> None:
    from clid.data.ssa import load_ssa, ssa_files
    from clid.data.stats import format_table, length_stats

    command, notes = "python -m clid.captions convert-ssa", []
    check_outputs({"--out": args.out}, {"--ssa": [*args.ssa, *ssa_files(args.ssa)]})
    runs.check_own_output(args.out, command)
    records, skipped, problems = load_ssa(args.ssa, args.levels, notes=notes)
    runs.claim_output(args.out, command)
    write_jsonl(args.out, records)
    runs.write_own_record(args.out, runs.run_record(args, inputs=("ssa",), settings=("levels",)), command)
    for note in notes:
        print(f"note: {note}")
    for reason, count in sorted(skipped.items()):
        print(f"  left out {count}: {reason}")
    for line in problems[:5]:
        print(f"    {line}")
    if len(problems) > 5:
        print(f"    ... and {len(problems) - 5} more malformed regions")
    print(format_table(length_stats([r["n_tokens"] for r in records], args.levels), f"{args.out} ({args.levels} levels)"))
    print(f"wrote {len(records)} captions of {len({r['image_id'] for r in records})} images to {args.out}")


if __name__ == "__main__":
    run_main(main)
