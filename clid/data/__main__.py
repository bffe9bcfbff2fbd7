"""``python -m clid.data convert-coco``: official COCO captions JSONs -> a Karpathy-style JSON."""
from __future__ import annotations

import argparse
import sys

from clid.cli import HelpFormatter, non_negative_int
from clid.data.splits import convert_coco
from clid.files import DataError, check_not_input, write_json

def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m clid.data", description="Caption-file tools.",
                                     formatter_class=HelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    convert = commands.add_parser(
        "convert-coco", help="official COCO captions JSONs -> a Karpathy-style JSON",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,  # (its description is wrapped)
        description="Official COCO captions JSONs -> a Karpathy-style JSON with train, val and test. test: the "
                    "Karpathy 5k test images (ids from eccv-caption); val: --karpathy's val (and its restval), else "
                    "the 5,000 val2014 images outside test with the smallest SHA-1 of their COCO id; train: the rest. "
                    "Prints the split sizes (the Karpathy split: 113,287 / 5,000 / 5,000).")
    convert.add_argument("--captions", nargs="+", required=True, metavar="FILE",
                         help="official COCO captions JSONs (captions_train2014.json captions_val2014.json)")
    convert.add_argument("--out", required=True, help="the Karpathy-style JSON to write")
    convert.add_argument("--karpathy", default=None, metavar="dataset_coco.json",
                         help="take val (and restval) from the Karpathy split file; default: the 5,000 val2014 images "
                              "outside the test split with the smallest SHA-1 of their COCO id")
    convert.add_argument("--val-size", type=non_negative_int, default=5000, help="validation images without --karpathy")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    check_not_input(args.out, {"--captions": args.captions, "--karpathy": args.karpathy})
    try:
        data, notes = convert_coco(args.captions, args.karpathy, args.val_size)
    except (DataError, FileNotFoundError) as err:
        sys.exit(f"error: {err}")
    write_json(args.out, data)
    print("\n".join(notes))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
