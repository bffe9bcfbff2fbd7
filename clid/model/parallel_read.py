"""A long JSONL caption file read and tokenised by several processes (one per core, at most 8).

Each process reads whole lines of one part of the file (its byte range starts and ends at a line
break), checks and tokenises them as :func:`clid.model.inputs.read_jsonl_table` does, and hands back
flat arrays; the parts are joined in file order, so the table is the serial one. Only a file without a
fault is read here: a part that meets a bad record, a record without a valid ``id``, or ids that repeat
make :func:`read_parts` return None, and the caller reads the file serially, which names the fault
exactly as before.
"""
from __future__ import annotations

import json
import multiprocessing
import os

import numpy as np

from clid.files import record_problem
from clid.text import FlatEncoder, caption_words

MOST_PROCESSES = 8
PARTS_PER_PROCESS = 8  # (smaller parts: the progress bar moves and the processes finish together)

_job: tuple | None = None  # (path, tokenizer, keep_sentences), inherited by the forked processes


def processes() -> int:
    """The cores this process may use (SLURM's allocation), at most :data:`MOST_PROCESSES`."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return min(MOST_PROCESSES, cores)


def line_ranges(path, parts: int) -> list[tuple[int, int]]:
    """Byte ranges of about equal size that start after a line break (or at the start, past a UTF-8 BOM)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        first = 3 if f.read(3) == b"\xef\xbb\xbf" else 0
        cuts = [first]
        for k in range(1, parts):
            f.seek(max(cuts[-1], first + (size - first) * k // parts))
            f.readline()  # (to the end of the line the guess fell in)
            if f.tell() >= size:
                break
            if f.tell() > cuts[-1]:
                cuts.append(f.tell())
    return list(zip(cuts, cuts[1:] + [size]))


def _read_part(byte_range: tuple[int, int]):
    """(caption ids, image ids, token ids, token counts, digests) of one part's records, or None where a
    record would stop the serial reader or lacks a valid id."""
    from clid.model.inputs import text_digest

    path, tokenizer, keep_sentences = _job
    start, end = byte_range
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(end - start)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    caption_ids, image_ids, digests = [], [], []
    encoder = FlatEncoder(tokenizer)
    for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):  # (as text mode splits lines)
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            return None
        if record_problem(record, ("id", "image_id", "caption")):  # (the serial reader names the fault)
            return None
        caption_ids.append(str(record["id"]))
        image_ids.append(str(record["image_id"]))
        encoder.add(caption_words(record["caption"], keep_sentences))
        digests.append(text_digest(record["caption"]))
    encoder.flush()
    return caption_ids, image_ids, np.concatenate(encoder.parts or [np.zeros(0, np.int32)]), encoder.lengths, digests


def read_parts(path, tokenizer, keep_sentences: bool, progress=None):
    """(caption ids, image ids, token ids, offsets, digests) of every record of ``path``, read by several
    processes; None when one part holds a fault or an id repeats (the serial reader then names it).
    ``progress(n)`` is told of each part's lines as it comes in."""
    global _job
    workers = processes()
    ranges = line_ranges(path, workers * PARTS_PER_PROCESS)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # (the tokenizer's threads must not cross a fork)
    _job = (str(path), tokenizer, keep_sentences)
    try:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            parts = []
            for part in pool.imap(_read_part, ranges):
                if part is None:
                    pool.terminate()
                    return None
                parts.append(part)
                if progress is not None:
                    progress(len(part[0]))
    finally:
        _job = None
    caption_ids = [c for part in parts for c in part[0]]
    if len(set(caption_ids)) != len(caption_ids):
        return None
    names: dict[str, str] = {}
    image_ids = [names.setdefault(i, i) for part in parts for i in part[1]]  # (one string per image)
    token_ids = np.concatenate([part[2] for part in parts]) if parts else np.zeros(0, np.int32)
    offsets = np.zeros(len(caption_ids) + 1, dtype=np.int64)
    np.cumsum([n for part in parts for n in part[3]], out=offsets[1:])
    digests = np.array([d for part in parts for d in part[4]], dtype=np.uint64)
    return caption_ids, image_ids, token_ids, offsets, digests
