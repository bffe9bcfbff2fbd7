"""A long JSONL caption file read and tokenised by several processes (one per core, at most 8).

Each process reads whole lines of its parts of the file (a part's byte range starts and ends at a line
break), checks and tokenises them as :func:`clid.data.inputs.read_jsonl_table` does, and hands back
flat arrays; the parts are joined in file order, so the table is the serial one. Only a file without a
fault is read here: a part that meets a bad record, a record without a valid ``id``, or ids that repeat
make :func:`read_parts` return None, and the caller reads the file serially, which names the fault
exactly as before.

The processes read the one handle the parent opened (never the path again), and the file's size and
modification time are compared before and after: a file replaced or rewritten while it is read is
refused. A process that dies (killed by a signal, such as the out-of-memory killer's SIGKILL, or ended
without its result) stops the read at once with one line naming the file, the part and how it died. The
children tokenise with ``TOKENIZERS_PARALLELISM=false`` whatever the user set, so the tokenizer's
threads, started before the fork, are never waited for in a child.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import signal
from multiprocessing.connection import wait

import numpy as np

from clid.base.files import DataError, check_unchanged, read_state, record_problem
from clid.base.text import FlatEncoder, caption_words
from clid.run import runtime

MOST_PROCESSES = 8
PARTS_PER_PROCESS = 8  # (smaller parts: the progress bar moves and the processes finish together)

_job: tuple | None = None  # (file descriptor, tokenizer, keep_sentences), inherited by the forked processes


class ReaderDied(DataError):
    """A reading process died (a signal, or an exit without its result)."""


def processes() -> int:
    """The cores this process may use (SLURM's allocation), at most :data:`MOST_PROCESSES`."""
    return min(MOST_PROCESSES, runtime.available_workers())


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
    from clid.data.examples import text_digest

    fd, tokenizer, keep_sentences = _job
    start, end = byte_range
    data = os.pread(fd, end - start, start)
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


def _work(send, parts: list[tuple[int, tuple[int, int]]]) -> None:
    """A child: send (part number, :func:`_read_part`) for each of ``parts``, in order."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # (read at each call: no thread pool is waited for here)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (Ctrl-C stops the parent, which ends its children)
    for k, byte_range in parts:
        try:
            part = _read_part(byte_range)
        except Exception as err:  # noqa: BLE001 - told to the parent, which stops the run in one line
            part = f"{type(err).__name__}: {err}"
        send.send((k, part))
    send.close()


def how_it_died(exitcode: int | None) -> str:
    """A child's end in words: "was killed by SIGKILL (signal 9)", "exited with status 1"."""
    if exitcode is None:
        return "stopped answering"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = "a signal"
        hint = " (the kernel's out-of-memory killer sends it: is the job's memory too small?)" if -exitcode == 9 else ""
        return f"was killed by {name} (signal {-exitcode}){hint}"
    return f"exited with status {exitcode} without its result"


def line_of(handle, offset: int) -> int:
    """The line number (from 1) of the line that starts at byte ``offset`` of the open file ``handle``."""
    handle.seek(0)
    lines, left = 1, offset
    while left > 0:
        block = handle.read(min(left, 1 << 24))
        if not block:
            break
        lines, left = lines + block.count(b"\n"), left - len(block)
    return lines


def read_parts(path, tokenizer, keep_sentences: bool, progress=None):
    """(caption ids, image ids, token ids, offsets, digests) of every record of ``path``, read by several
    processes; None when one part holds a fault or an id repeats (the serial reader then names it).
    ``progress(n)`` is told of each part's lines as it comes in. A dying process is a :class:`ReaderDied`,
    a file changed meanwhile a DataError."""
    global _job
    workers = processes()
    with open(path, "rb") as handle:
        before = read_state(path)
        ranges = line_ranges(path, workers * PARTS_PER_PROCESS)
        _job = (handle.fileno(), tokenizer, keep_sentences)
        try:
            found = _gather(path, handle, ranges, workers, progress)
        finally:
            _job = None
        check_unchanged(path, before)
    if found is None:
        return None
    parts = [found[k] for k in range(len(ranges))]
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


def _gather(path, handle, ranges, workers: int, progress) -> dict | None:
    """{part number: :func:`_read_part`} from ``workers`` forked children (part k to child k % workers); None
    at the first part with a fault. Every child has ended when it returns or raises."""
    context = multiprocessing.get_context("fork")
    children = {}  # receiving end -> (process, its parts not yet received)
    try:
        for w in range(min(workers, len(ranges))):
            mine = [(k, ranges[k]) for k in range(w, len(ranges), workers)]
            receive, send = context.Pipe(duplex=False)
            process = context.Process(target=_work, args=(send, mine), daemon=True)
            process.start()
            send.close()  # (the child holds the only writing end: its end is this end's EOF)
            children[receive] = (process, [k for k, _ in mine])
        found = {}
        while children:
            for receive in wait(list(children)):
                process, todo = children[receive]
                try:
                    k, part = receive.recv()
                except (EOFError, OSError):
                    process.join(5)
                    del children[receive]
                    if todo:
                        start, end = ranges[todo[0]]
                        raise ReaderDied(path, f"lines {line_of(handle, start)}-{line_of(handle, end) - 1}",
                                         f"the process reading part {todo[0] + 1} of {len(ranges)} "
                                         f"{how_it_died(process.exitcode)}; nothing was written. Run again (on one "
                                         "core, e.g. under taskset -c 0, this process reads the file alone)")
                    continue
                if part is None:
                    return None
                if isinstance(part, str):
                    start, end = ranges[k]
                    raise ReaderDied(path, f"lines {line_of(handle, start)}-{line_of(handle, end) - 1}",
                                     f"the process reading part {k + 1} of {len(ranges)} failed ({part})")
                found[k] = part
                todo.remove(k)
                if progress is not None:
                    progress(len(part[0]))
        return found
    finally:
        for receive, (process, _) in children.items():
            process.kill()
            process.join()
            receive.close()
