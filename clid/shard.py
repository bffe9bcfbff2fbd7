"""Sharding for the per-item stages (01, 02, 03, 05), for SLURM array jobs or plain loops.

Item i of the stage's item list belongs to shard ``i mod num_shards``. A shard processes its
items in chunks; every chunk is written atomically to its own file, so a killed run resumes at
the first missing chunk. When all chunks of a shard exist they are joined into the shard's part
file; with one shard, the part *is* the output. With N shards, ``python -m clid.shard merge OUT
--num-shards N`` joins the parts (the last shard to finish does this by itself too).

File names, for ``--out selfgen.jsonl`` and 4 shards::

    selfgen.jsonl.part-00001-of-00004                 # shard 1's part
    selfgen.jsonl.part-00001-of-00004.chunk-000007     # shard 1's 8th chunk, while running

Records are joined in a canonical order (natural order of image id, then of record id),
so the merged output is byte-identical to a 1-shard run when randomness is keyed by
(seed, item id) (see :mod:`clid.rng`).
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

from . import files


def add_shard_args(parser: argparse.ArgumentParser, seed: int = 0) -> None:
    """``--shard-id``/``--num-shards`` (defaults from SLURM array variables) and ``--seed``."""
    env = os.environ
    parser.add_argument("--shard-id", type=int, default=int(env.get("SLURM_ARRAY_TASK_ID", 0)),
                        help="this shard's index (default: $SLURM_ARRAY_TASK_ID or 0)")
    parser.add_argument("--num-shards", type=int, default=int(env.get("SLURM_ARRAY_TASK_COUNT", 1)),
                        help="number of shards (default: $SLURM_ARRAY_TASK_COUNT or 1)")
    parser.add_argument("--seed", type=int, default=seed, help="random seed; randomness is keyed by (seed, item id)")


@dataclass(frozen=True)
class Shard:
    shard_id: int = 0
    num_shards: int = 1

    def __post_init__(self):
        if self.num_shards < 1 or not 0 <= self.shard_id < self.num_shards:
            raise SystemExit(f"error: shard id {self.shard_id} is outside 0..{self.num_shards - 1}")

    @classmethod
    def from_args(cls, args) -> "Shard":
        return cls(args.shard_id, args.num_shards)

    def select(self, items: Sequence) -> list:
        """The items of this shard: item i goes to shard ``i mod num_shards``."""
        return [item for i, item in enumerate(items) if i % self.num_shards == self.shard_id]


def part_path(out, shard_id: int, num_shards: int) -> Path:
    """The part file of one shard; with a single shard this is the output itself."""
    out = Path(out)
    if num_shards == 1:
        return out
    return out.with_name(f"{out.name}.part-{shard_id:05d}-of-{num_shards:05d}")


def chunk_path(part: Path, index: int) -> Path:
    return part.with_name(f"{part.name}.chunk-{index:06d}")


def is_done(out, shard: Shard) -> bool:
    """True when the shard's part (or the merged output) already exists."""
    return Path(out).exists() or part_path(out, shard.shard_id, shard.num_shards).exists()


def pending_chunks(items: Sequence, out, shard: Shard, chunk_size: int) -> Iterator[tuple[int, list, Path]]:
    """Yield ``(chunk index, items, chunk path)`` for this shard's chunks not yet written.

    The caller writes each chunk path atomically (e.g. with :func:`clid.files.write_jsonl`), then
    calls :func:`finish_shard`. Chunks already on disk from an earlier, killed run are skipped.
    """
    if is_done(out, shard):
        return
    part = part_path(out, shard.shard_id, shard.num_shards)
    mine = shard.select(items)
    for index in range(count_chunks(items, shard, chunk_size)):
        path = chunk_path(part, index)
        if not path.exists():
            yield index, mine[index * chunk_size:(index + 1) * chunk_size], path


def count_chunks(items: Sequence, shard: Shard, chunk_size: int) -> int:
    """Chunks of this shard; a shard without items has one empty chunk, so it writes an empty part."""
    n = len(shard.select(items))
    return max(1, (n + chunk_size - 1) // chunk_size)


def finish_shard(items: Sequence, out, shard: Shard, chunk_size: int) -> Path | None:
    """Join this shard's chunks into its part; merge all parts when every shard is done.

    Returns the final output path if it now exists, else None (other shards still running).
    """
    part = part_path(out, shard.shard_id, shard.num_shards)
    if not Path(out).exists() and not part.exists():
        chunks = [chunk_path(part, i) for i in range(count_chunks(items, shard, chunk_size))]
        missing = [str(c) for c in chunks if not c.exists()]
        if missing:
            raise RuntimeError(f"cannot finish shard {shard.shard_id}: {len(missing)} chunk(s) missing, e.g. {missing[0]}")
        join_files(chunks, part)
        for c in chunks:
            c.unlink()
    if shard.num_shards > 1 and not Path(out).exists():
        parts = [part_path(out, i, shard.num_shards) for i in range(shard.num_shards)]
        if all(p.exists() for p in parts):
            try:
                merge(out, shard.num_shards)
            except FileNotFoundError:  # another shard merged first and removed the parts
                pass
    return Path(out) if Path(out).exists() else None


def run_chunks(items: Sequence, out, shard: Shard, chunk_size: int, process: Callable[[list, Path], None],
               progress: Callable[[int], None] | None = None) -> Path | None:
    """Run ``process(chunk_items, chunk_path)`` over the pending chunks, then finish the shard."""
    for _, chunk_items, path in pending_chunks(items, out, shard, chunk_size):
        process(chunk_items, path)
        if progress:
            progress(len(chunk_items))
    return finish_shard(items, out, shard, chunk_size)


# ---------------------------------------------------------------------------------------------
# Joining files of one kind (by extension): JSONL records, HDF5 groups, HDF5 flat arrays.


def join_files(paths: Sequence[Path], out) -> None:
    """Join partial files into ``out`` atomically, in the canonical order (see module docstring)."""
    suffix = Path(Path(out).name.split(".part-")[0].split(".chunk-")[0]).suffix  # of the final output
    if suffix == ".jsonl":
        records = [r for p in paths for r in files.read_jsonl(p)]
        records.sort(key=files.jsonl_order_key)  # stable: ties keep the order written
        files.write_jsonl(out, records)
    elif suffix in (".h5", ".hdf5"):
        _join_h5(paths, out)
    else:
        raise ValueError(f"{out}: cannot join files of type '{suffix}' (expected .jsonl or .h5)")


def _join_h5(paths: Sequence[Path], out) -> None:
    import h5py
    import numpy as np

    kinds = set()  # "groups" (one group per image id) or "arrays" (flat arrays); an empty part has neither
    for p in paths:
        with h5py.File(p, "r") as f:
            kinds.update("groups" if isinstance(v, h5py.Group) else "arrays" for v in f.values())
    if len(kinds) > 1:
        raise files.DataError(paths[0], None, "parts mix image groups and flat arrays")
    if kinds != {"arrays"}:  # image groups, or nothing at all
        with files.atomic_path(out) as tmp, h5py.File(tmp, "w") as dst:
            for p in paths:
                with h5py.File(p, "r") as src:
                    for key in src:
                        if key in dst:
                            raise files.DataError(p, f"image {key}", "appears in two parts")
                        src.copy(src[key], dst, name=key)
        return
    arrays = [a for a in (files.read_arrays(p) for p in paths) if a]  # empty parts add no rows
    names = list(arrays[0])
    joined = {n: np.concatenate([a[n] for a in arrays]) for n in names}
    if "id" in joined:
        order = sorted(range(len(joined["id"])), key=lambda i: files.natural_key(joined["id"][i]))
        joined = {n: v[order] for n, v in joined.items()}
    files.write_arrays(out, joined)


def merge(out, num_shards: int) -> Path:
    """Join the parts of all shards into ``out``, then remove the parts."""
    parts = [part_path(out, i, num_shards) for i in range(num_shards)]
    missing = [str(p) for p in parts if not p.exists()]
    if missing:
        raise FileNotFoundError(f"cannot merge {out}: {len(missing)} of {num_shards} parts missing: {', '.join(missing[:3])}")
    join_files(parts, out)
    for p in parts:
        p.unlink(missing_ok=True)
    return Path(out)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m clid.shard", description="Merge the parts of a sharded stage.")
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("merge", help="join OUT.part-*-of-N into OUT")
    m.add_argument("out")
    m.add_argument("--num-shards", type=int, required=True)
    args = parser.parse_args(argv)
    if Path(args.out).exists():
        print(f"{args.out} already exists; nothing to merge")
        return
    try:
        merge(args.out, args.num_shards)
    except FileNotFoundError as err:
        sys.exit(f"error: {err}")
    print(f"merged {args.num_shards} parts into {args.out}")


if __name__ == "__main__":
    main()
