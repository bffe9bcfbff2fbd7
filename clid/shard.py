"""``python -m clid.shard merge OUT --num-shards N``: join the parts of a sharded stage (the shards:
:mod:`clid.run.shard`)."""
from __future__ import annotations

import argparse
from pathlib import Path

from clid.run.cli import HelpFormatter, positive_int, run_main
from clid.run.shard import check_suffix, merge


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m clid.shard", description="Merge the parts of a sharded stage.",
                                     formatter_class=HelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("merge", help="join OUT.part-*-of-N into OUT", formatter_class=HelpFormatter)
    m.add_argument("out", help="the output the shards wrote (the same --out they were given); its parts "
                               "OUT.part-*-of-N are joined into it and removed")
    m.add_argument("--num-shards", type=positive_int, required=True, help="the number of shards that wrote the parts")
    args = parser.parse_args(argv)
    check_suffix(args.out, (".jsonl", ".h5", ".hdf5"))
    if Path(args.out).exists():
        print(f"{args.out} already exists; nothing to merge")
        return
    merged = merge(args.out, args.num_shards)  # (a part not found: a FileNotFoundError naming it)
    if merged is not None:
        print(f"merged {args.num_shards} parts into {args.out}")


if __name__ == "__main__":
    run_main(main)
