"""Sharding for the per-item stages (01, 02, 03, 05), for SLURM array jobs or plain loops.

Item i of the stage's item list belongs to shard ``i mod num_shards``. A shard processes its
items in chunks; every chunk is written atomically to its own file, so a killed run resumes at
the first missing chunk. When all chunks of a shard exist they are joined into the shard's part
file; with one shard, the part *is* the output. With N shards, ``python -m clid.shard merge OUT
--num-shards N`` joins the parts (the last shard to finish does this by itself too).

File names, for ``--out selfgen.jsonl`` and 4 shards::

    selfgen.jsonl.part-00001-of-00004                 # shard 1's part
    selfgen.jsonl.part-00001-of-00004.chunk-000007     # shard 1's 8th chunk, while running

Beside the data, a chunk may have TSV side tables (``CHUNK.failed.tsv``, ``CHUNK.problems.tsv``,
written before the chunk itself); they are joined with the chunks and the parts into
``OUT.failed.tsv`` and so on. ``OUT.run.json`` (``PART.run.json`` while shards run) records what
determines the output: the input files' sizes and modification times, and the settings. A run
that finds chunks, a part or an output recorded with other inputs or settings refuses to mix
them, naming what differs, unless told ``--restart``; so does a run whose ``--out`` exists without a
run record (a file this stage did not write).

Records are joined in a canonical order (natural order of image id, then of record id),
so the merged output is byte-identical to a 1-shard run when randomness is keyed by
(seed, item id) (see :mod:`clid.base.rng`).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from clid.base import files
from clid.base.files import DataError, Stopped
from clid.run.cli import is_whole_number, non_negative_int, positive_int
from clid.run.runs import record_differences, record_path


def add_shard_args(parser: argparse.ArgumentParser, seed: int = 0) -> None:
    """``--shard-id``/``--num-shards`` (defaults from SLURM array variables) and ``--seed``."""
    env = os.environ
    parser.add_argument("--shard-id", type=non_negative_int, default=env.get("SLURM_ARRAY_TASK_ID", "0"),
                        help="this shard's index ($SLURM_ARRAY_TASK_ID when set)")
    parser.add_argument("--num-shards", type=positive_int, default=env.get("SLURM_ARRAY_TASK_COUNT", "1"),
                        help="number of shards ($SLURM_ARRAY_TASK_COUNT when set)")
    parser.add_argument("--seed", type=non_negative_int, default=seed, help="random seed; randomness is keyed by (seed, item id)")
    parser.add_argument("--restart", action="store_true",
                        help="discard this shard's chunks, part and output left by an earlier run with other inputs "
                             "or settings, instead of refusing to mix them; replace an --out this stage did not write")


def add_chunk_size_arg(parser, default: int, what: str) -> None:
    """``--chunk-size``: how many ``what`` (images, graphs, captions) one resumable chunk holds."""
    parser.add_argument("--chunk-size", type=positive_int, default=default, help=f"{what} per resumable chunk")


@dataclass(frozen=True)
class Shard:
    shard_id: int = 0
    num_shards: int = 1

    def __post_init__(self):
        if self.num_shards < 1 or not 0 <= self.shard_id < self.num_shards:
            raise DataError(None, None, f"shard id {self.shard_id} is outside 0..{self.num_shards - 1}")

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


def count_chunks(items: Sequence, shard: Shard, chunk_size: int) -> int:
    """Chunks of this shard; a shard without items has one empty chunk, so it writes an empty part."""
    n = len(shard.select(items))
    return max(1, (n + chunk_size - 1) // chunk_size)


# ---------------------------------------------------------------------------------------------
# Side tables (TSV, one header line) and the run record, stored beside a data file

def side_path(data: Path, name: str) -> Path:
    """``DATA.name``: a side table (``failed.tsv``) or the run record (``run.json``) of a data file."""
    return data.with_name(f"{data.name}.{name}")


def write_table(path, header: Sequence[str], rows: Sequence[Sequence]) -> None:
    """A TSV side table, written atomically; tabs and newlines inside values become spaces."""
    with files.atomic_path(path) as tmp, open(tmp, "w") as f:
        for row in [header, *rows]:
            f.write("\t".join(str(x).replace("\t", " ").replace("\n", " ") for x in row) + "\n")


def read_table(path) -> list[list[str]]:
    """The rows of a TSV side table (without its header); none when the file does not exist."""
    if not Path(path).exists():
        return []
    lines = Path(path).read_text().splitlines()
    return [line.split("\t") for line in lines[1:]]


SIDE_TABLES = ("counts.tsv", "failed.tsv", "problems.tsv", "skipped.tsv")  # the side tables the stages write


def side_tables(data: Path) -> list[str]:
    """Names (of :data:`SIDE_TABLES`) of the side tables beside a data file: another ``DATA.notes.tsv`` there is
    the user's, never joined nor removed."""
    return [name for name in SIDE_TABLES if side_path(data, name).exists()]


def join_tables(paths: Sequence[Path], out: Path) -> None:
    """Join the side tables of ``paths`` into those of ``out``; a table without rows is not written."""
    for name in sorted({name for p in paths for name in side_tables(p)}):
        sources = [side_path(p, name) for p in paths if side_path(p, name).exists()]
        header = sources[0].read_text().splitlines()[0].split("\t")
        rows = [row for s in sources for row in read_table(s)]
        target = side_path(out, name)
        if rows:
            write_table(target, header, rows)
        else:
            target.unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------
# The runner

@dataclass
class Chunk:
    """One chunk of a shard's items; ``path`` is where the stage writes its data (atomically)."""

    index: int
    items: list
    path: Path
    progress: Callable[[int], None] = field(default=lambda n: None)  # report items done inside the chunk

    def table(self, name: str) -> Path:
        """The path of this chunk's side table ``name`` (e.g. "failed.tsv"); write it before the data."""
        return side_path(self.path, name)


class Job:
    """One shard of a per-item stage writing ``out``: checks what an earlier run left (and its run
    record), runs the pending chunks with a progress bar, joins them, and merges the shards.

        job = shard.Job(out, shard.Shard.from_args(args), args.chunk_size, record, args.restart)
        if not job.done:
            final = job.run(items, process, "captions", "graph")   # process(chunk: Chunk)
    """

    def __init__(self, out, spec: Shard, chunk_size: int, record: dict, restart: bool = False,
                 suffixes: Sequence[str] = (".jsonl", ".h5", ".hdf5")):
        if chunk_size < 1:
            raise DataError(None, None, f"--chunk-size must be at least 1, not {chunk_size}")
        check_suffix(out, suffixes)
        self.out, self.spec, self.chunk_size = Path(out), spec, chunk_size
        self.part = part_path(out, spec.shard_id, spec.num_shards)
        self.record = {**record, "settings": {**record.get("settings", {}), "--chunk-size": chunk_size}}
        self.shard_items = self.done_before = 0  # this shard's items, those done by an earlier run (set by run)
        if Path(out).is_dir():
            raise DataError(None, None, f"--out {out} is a folder; give the file to write")
        self.lock = ShardLock(self.part)  # before anything of an earlier run is removed
        if not self.lock.acquire():
            print(f"note: {self.lock.holder()} is already running shard {spec.shard_id} of {spec.num_shards} of {out}; "
                  "this copy stops and leaves the work to it", flush=True)
            raise Stopped(0, f"shard {spec.shard_id} of {spec.num_shards} of {out} is already running")
        self._remove_temporary_files()
        self._check_earlier_run(restart)
        self.done = self.out.exists() or self.part.exists()

    def own_files(self) -> list[Path]:
        """This shard's part (the output, with one shard), its chunks and their side tables, the part's side tables
        and run record: the names the stage writes, and no other file beside them (a user's ``OUT.bak`` stays)."""
        chunks = sorted(self.part.parent.glob(f"{glob.escape(self.part.name)}.chunk-*"))
        sides = [side_path(self.part, name) for name in SIDE_TABLES] + [record_path(self.part)]
        return [p for p in [self.part, *chunks, *sides] if p.exists()]

    def _remove_temporary_files(self) -> None:
        """Hidden ``.NAME.tmp-PID`` files of this shard, left by a killed run (atomic writes)."""
        def others(tmp: Path, name: str) -> bool:  # another shard's part or chunk
            return ".part-" in tmp.name[len(name) + 1:]

        for tmp in self.part.parent.glob(f".{glob.escape(self.part.name)}*.tmp-*"):
            if not others(tmp, self.part.name):
                tmp.unlink(missing_ok=True)
        for tmp in self.out.parent.glob(f".{glob.escape(self.out.name)}.*tmp-*"):  # a killed merge's, when its writer is gone
            pid = tmp.name.rsplit(".tmp-", 1)[-1]
            if not others(tmp, self.out.name) and ".chunk-" not in tmp.name and is_whole_number(pid) and not _alive(int(pid)):
                tmp.unlink(missing_ok=True)

    def _check_earlier_run(self, restart: bool) -> None:
        # the record of what is here: the output's, else this shard's part or chunks'
        found = [p for p in (self.out, self.part) if p.exists()]
        chunks = sorted(self.part.parent.glob(f"{glob.escape(self.part.name)}.chunk-*"))
        holder = found[0] if found else self.part
        record_file = record_path(holder)
        if not found and not chunks:
            record_file.unlink(missing_ok=True)
            return
        if not record_file.exists() and not found:
            print(f"note: {len(chunks)} chunk file(s) of {self.part} have no run record; they are computed again")
            for p in chunks:
                p.unlink(missing_ok=True)
            return
        if record_file.exists():
            try:
                earlier = json.loads(record_file.read_text())
            except (OSError, json.JSONDecodeError):
                earlier = {}
            differences = record_differences(earlier, self.record)
            if not differences:
                return
            why = f"an earlier run with other inputs or settings left {'this output' if found else 'chunks'} here " \
                  f"({'; '.join(differences)})"
        else:  # a file this stage did not write (or an output from before run records): never replaced
            raise DataError(holder, None, f"this stage did not write it (it has no run record {record_file.name}): "
                                          "it is kept; give another --out, or move the file away yourself")
        if not restart:
            raise DataError(holder if found else self.part, None,
                            f"{why}; run with the same settings to resume, or add --restart to discard it")
        print(f"--restart: discarding what is there: {why}")
        for p in self.own_files() + ([self.out] + [side_path(self.out, name) for name in SIDE_TABLES]
                                     + [record_path(self.out)]) * self.out.exists():
            p.unlink(missing_ok=True)

    def run(self, items: Sequence, process: Callable[[Chunk], None], desc: str, unit: str) -> Path | None:
        """Run ``process`` over the pending chunks, join them into the part, merge when all shards are
        done. Returns the output path once it exists, else None (other shards still running)."""
        from clid.base.progress import Progress

        mine = self.spec.select(items)
        total = count_chunks(items, self.spec, self.chunk_size)
        if not self.done:
            files.write_json(record_path(self.part), self.record)
        pending = [] if self.done else [i for i in range(total) if not chunk_path(self.part, i).exists()]
        self.shard_items = len(mine)
        self.done_before = len(mine) - sum(len(self._items(mine, i)) for i in pending)
        if self.done:
            print(f"{self.part if self.part.exists() else self.out} already exists")
        elif len(pending) < total:
            print(f"resuming: {total - len(pending)} of {total} chunks already done")
        with Progress(len(mine), desc, unit, initial=self.done_before, disable=self.done) as bar:
            for index in pending:
                chunk_items = self._items(mine, index)
                reported = [0]

                def progress(k, reported=reported):
                    reported[0] += k
                    bar.update(k)

                process(Chunk(index, chunk_items, chunk_path(self.part, index), progress))
                bar.update(max(0, len(chunk_items) - reported[0]))
        try:
            return finish_shard(items, self.out, self.spec, self.chunk_size)
        finally:
            self.lock.release()

    def _items(self, mine: list, index: int) -> list:
        return mine[index * self.chunk_size:(index + 1) * self.chunk_size]

    def written(self) -> Path:
        """The merged output if it exists, else this shard's part."""
        return self.out if self.out.exists() else self.part


def check_suffix(out, suffixes: Sequence[str]) -> None:
    """Refuse, before any work, an output whose kind the final join cannot tell from its name."""
    if Path(out).suffix.lower() not in suffixes:
        raise DataError(None, None, f"--out {out} must end in {' or '.join(suffixes)} (the file's kind is read from "
                                    "its name when the chunks and shards are joined)")


class ShardLock:
    """An exclusive lock per shard (``.PART.lock`` beside the output, holding the holder's host and pid), so
    that two copies of one shard (a SLURM task run twice) do not both write it. A POSIX record lock: it
    works across the machines of an NFS share and is released when the process ends, however it ends."""

    def __init__(self, part: Path):
        self.path = part.with_name(f".{part.name}.lock")
        self.file = None
        self._holder = [None]  # the open lock file, shared with the finalizer (which must not hold self)
        self._finalizer = weakref.finalize(self, ShardLock._drop, self.path, self._holder)

    @staticmethod
    def _drop(path: Path, holder: list) -> None:
        """Remove the lock file when its owner is gone (an error before the shard finished)."""
        if holder[0] is not None:
            path.unlink(missing_ok=True)
            try:
                holder[0].close()
            except OSError:  # (its holder line could not be written: a full disk)
                pass
            holder[0] = None

    def acquire(self) -> bool:
        import fcntl
        import socket

        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+")
        try:
            fcntl.lockf(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            return False
        try:  # (who holds it, for the other copy's message; a full disk leaves it empty)
            handle.seek(0)
            handle.truncate()
            handle.write(f"{socket.gethostname()} {os.getpid()}\n")
            handle.flush()
        except OSError:
            pass
        self.file = handle
        self._holder[0] = handle  # (the finalizer releases it, unless release() did)
        return True

    def holder(self) -> str:
        try:
            host, pid = self.path.read_text().split()[:2]
            return f"process {pid} on {host}"
        except (OSError, ValueError):
            return "another process"

    def release(self) -> None:
        """Remove the lock file and let go of the lock (the file first: a copy that opened it before is
        refused while the lock is held)."""
        self._finalizer()
        self.file = None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
            for name in side_tables(c):
                side_path(c, name).unlink()
            c.unlink()
    if shard.num_shards > 1 and not Path(out).exists():
        parts = [part_path(out, i, shard.num_shards) for i in range(shard.num_shards)]
        if all(p.exists() for p in parts):
            try:
                merge(out, shard.num_shards)
            except FileNotFoundError:  # another shard merged first and removed the parts
                pass
    return Path(out) if Path(out).exists() else None


# ---------------------------------------------------------------------------------------------
# Joining files of one kind (by extension): JSONL records, HDF5 groups, HDF5 flat arrays.


def join_files(paths: Sequence[Path], out) -> None:
    """Join partial files into ``out`` atomically, in the canonical order (see module docstring);
    their side tables are joined too (the tables first: the data file marks the join as done)."""
    join_tables(paths, Path(out))
    suffix = Path(Path(out).name.split(".part-")[0].split(".chunk-")[0]).suffix  # of the final output
    if suffix == ".jsonl":
        records, seen = [], {}
        for p in paths:
            for r in files.read_jsonl(p):
                if "id" in r:  # a record in two parts (two copies of a shard, mixed settings): refused
                    if str(r["id"]) in seen:
                        raise files.DataError(p, f"record {r['id']}", f"appears in two parts (also in {seen[str(r['id'])]})")
                    seen[str(r["id"])] = p.name
                records.append(r)
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
        with files.open_h5(p, "part file") as f:
            kinds.update("groups" if isinstance(v, h5py.Group) else "arrays" for v in f.values())
    if len(kinds) > 1:
        raise files.DataError(paths[0], None, "parts mix image groups and flat arrays")
    if kinds != {"arrays"}:  # image groups, or nothing at all; the parts' own attributes must agree
        with files.atomic_path(out) as tmp, h5py.File(tmp, "w") as dst:
            for p in paths:
                with h5py.File(p, "r") as src:
                    for name, value in src.attrs.items():
                        if name in dst.attrs and not np.array_equal(dst.attrs[name], value):
                            raise files.DataError(p, f"attribute '{name}'", f"{value!r} here, {dst.attrs[name]!r} "
                                                                            "in another part")
                        dst.attrs[name] = value
                    for key in src:
                        if key in dst:
                            raise files.DataError(p, f"image {key}", "appears in two parts")
                        src.copy(src[key], dst, name=key)
        return
    arrays = [a for a in (files.read_arrays(p) for p in paths) if a]  # empty parts add no rows
    names = list(arrays[0])
    joined = {n: np.concatenate([a[n] for a in arrays]) for n in names}
    if "id" in joined and (repeated := files.repeated_values(joined["id"])):
        raise files.DataError(out, f"record {repeated[0]}", f"appears in two parts ({len(repeated)} records do): "
                                                             "were two copies of a shard, or runs with other settings, "
                                                             "mixed?")
    if "id" in joined:
        order = sorted(range(len(joined["id"])), key=lambda i: files.natural_key(joined["id"][i]))
        joined = {n: v[order] for n, v in joined.items()}
    files.write_arrays(out, joined)


def merge(out, num_shards: int) -> Path | None:
    """Join the parts of all shards into ``out``, then remove the parts. None when another process is
    merging them (it finishes the output)."""
    lock = ShardLock(Path(out).with_name(Path(out).name + ".merge"))
    if not lock.acquire():
        print(f"note: {lock.holder()} is merging the parts of {out}")
        return None
    try:
        if Path(out).exists():  # (another process merged them meanwhile)
            return Path(out)
        return _merge(out, num_shards)
    finally:
        lock.release()


def _merge(out, num_shards: int) -> Path:
    parts = [part_path(out, i, num_shards) for i in range(num_shards)]
    missing = [str(p) for p in parts if not p.exists()]
    if missing:
        raise FileNotFoundError(f"cannot merge {out}: {len(missing)} of {num_shards} parts missing: {', '.join(missing[:3])}")
    records = {record_path(p).read_text() for p in parts if record_path(p).exists()}
    if len(records) > 1:
        raise DataError(None, None, f"cannot merge {out}: its shards ran with other inputs or settings "
                                    f"(see {parts[0].name}.run.json and the others); rerun the odd ones with --restart")
    if records:
        files.write_json(record_path(out), json.loads(records.pop()))
    join_files(parts, out)
    for p in parts:
        for side in [side_path(p, name) for name in side_tables(p)] + [record_path(p)]:
            side.unlink(missing_ok=True)
        p.unlink(missing_ok=True)
    return Path(out)
