"""``python -m clid.features convert --format vlp|butd|vinvl|clid INPUT [INPUT ...] --out features.h5``: the
region features of a released detector as our HDF5 (the readers: :mod:`clid.data.convert`)."""
from __future__ import annotations

import argparse

from clid.base.files import DataError
from clid.data import convert
from clid.data.convert import BUTD_DIM, CONVERTERS, FORMATS, summary
from clid.data.store import FEATURE_DTYPES
from clid.run import runs, shard
from clid.run.cli import HelpFormatter, positive_int


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m clid.features convert", description=convert.__doc__.split("\n\n")[0],
                                epilog=convert.__doc__.split("\n\n", 2)[2], formatter_class=HelpFormatter)
    p.add_argument("--format", required=True, choices=FORMATS, help="the release's format (see below)")
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="the release's files, or folders holding them")
    p.add_argument("--out", required=True, help="the region-feature HDF5 to write (.h5)")
    p.add_argument("--dtype", choices=FEATURE_DTYPES, default="float16",
                   help="how the features and class probabilities are stored: float16 (half the file of float32; on "
                        "the demo it changes no draw of 06: docs/scale.md), bfloat16 (kept as uint16 with the "
                        "attribute dtype = bfloat16) or float32 (the release's values exactly); read back as float32")
    p.add_argument("--sizes", nargs="+", metavar="FILE",
                   help="image sizes where a record has none: the benchmark's hw TSV, VG image_data.json or COCO "
                        "annotations JSONs (default: the boxes' extent)")
    p.add_argument("--ids", choices=["auto", "keep"], default="auto",
                   help="auto: COCO file names and zero-padded numbers become COCO ids, other keys lose an image "
                        "extension; keep: the keys as they are")
    p.add_argument("--bad-records", choices=["error", "skip"], default="error",
                   help="a malformed record: error (stop, naming the file and the record) or skip (left out, "
                        "counted, listed in OUT.skipped.tsv)")
    p.add_argument("--dim", type=positive_int, default=None, metavar="D",
                   help=f"butd: the features' dimension; the byte count of a record then says float16, float32 or "
                        f"float64 (default: the dtype read from the values, {BUTD_DIM} as released where a payload "
                        "fits two)")
    shard.add_chunk_size_arg(p, 1000, "images")
    shard.add_shard_args(p)
    args = p.parse_args(argv)
    if not args.out.endswith((".h5", ".hdf5")):
        p.error(f"--out must end with .h5 or .hdf5 (got {args.out})")
    if args.format == "clid" and len(args.inputs) != 1:
        p.error(f"--format clid rewrites one region-feature file, not {len(args.inputs)}")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    record = runs.run_record(args, inputs=("inputs", "sizes"), settings=("format", "ids", "bad_records", "dim", "dtype"))
    job = shard.Job(args.out, shard.Shard.from_args(args), args.chunk_size, record, args.restart)
    converter = CONVERTERS[args.format](args)
    items = [] if job.done else converter.index()
    if not job.done and not items:
        raise DataError(", ".join(args.inputs), None, "no records to convert (an empty file?)")
    if not job.done:
        for note in converter.notes:
            print(note)
        print(f"converting {len(job.spec.select(items))} of {len(items)} records ({args.format}; shard "
              f"{job.spec.shard_id}/{job.spec.num_shards})")
    done = job.run(items, converter.process, "convert", "image")
    if done is None:
        print(f"shard {job.spec.shard_id} done; the last shard to finish merges (or: python -m clid.shard merge "
              f"{args.out} --num-shards {job.spec.num_shards})")
        return
    for line in summary(done):
        print(line)

