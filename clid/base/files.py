"""The files passed between stages (docs/formats.md).

Every write goes to a temporary file in the destination folder and is renamed into place when it
is complete, so a crash never leaves a half-written file behind.

- JSONL: one JSON object a line (self-generated and paraphrased captions, generated captions).
- HDF5 with one group per image id: region features (``features`` [R, D], ``boxes`` [R, 4] in
  pixels as x1, y1, x2, y2, attrs ``width``/``height``, optional ``cls_prob`` [R, C]) and saliency
  (``map`` [h, w] float16 in [0, 1], attrs ``width``/``height``).
- HDF5 of flat arrays with one row per caption: quality scores (``id``, ``logp_trusted``,
  ``logp_extended``, ``u``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np


class DataError(ValueError):
    """Bad input, or a run that cannot go on: the message names the file, the record and what is wrong.

    The library raises it where a command prints one line ``error: MESSAGE`` and exits 1
    (:func:`clid.run.cli.run_main`). ``path`` None: a problem that is not about one file (a flag's value,
    the run's settings); the message is then the problem alone."""

    def __init__(self, path, record, problem: str):
        self.path = None if path is None else str(path)
        self.record, self.problem = record, problem
        where = ": ".join(str(part) for part in (path, record) if part not in (None, ""))
        super().__init__(f"{where}: {problem}" if where else problem)


class Stopped(Exception):
    """A run that stops on purpose, not on bad input (asked to by SIGTERM; a copy of a shard that another
    process already runs), having printed why: a command exits with status ``code`` and prints nothing
    more (:func:`clid.run.cli.run_main`); ``message`` says why, for a caller from Python."""

    def __init__(self, code: int, message: str):
        self.code, self.message = code, message
        super().__init__(message)


def id_problem(value) -> str | None:
    """Why ``value`` cannot be an image or caption id (ids are strings or integers), or None."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return f"must be a string or an integer, got {json.dumps(value) if value is None else type(value).__name__}"
    return None


NAME_BYTES = 200  # the longest name of its own: a file name holds 255 bytes, with room for a suffix


def name_problem(name) -> str | None:
    """Why ``name`` cannot become one file or HDF5 group name of its own (a run name, an image id that names its
    group or its preview file), or None: an empty name, "." or "..", a path separator, a control character, a
    name too long. Such a name is refused, never mapped: a name that leaves its folder writes outside it."""
    text = str(name)
    if not text:
        return "is empty"
    if text in (".", ".."):
        return f"is {text!r}, which names a folder, not a file"
    if "/" in text or "\\" in text:
        return f"{text!r} holds a path separator (/ or \\), so it would name a file in another folder"
    if any(ord(c) < 32 or 127 <= ord(c) < 160 for c in text):
        return f"{text!r} holds a control character"
    if len(text.encode("utf-8", "surrogateescape")) > NAME_BYTES:
        return f"is longer than {NAME_BYTES} bytes"
    return None


# ---------------------------------------------------------------------------------------------
# Atomic writes

@contextlib.contextmanager
def atomic_path(path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        yield tmp
        os.replace(tmp, path)
    except OSError as err:
        if err.filename is None:  # (a failed write names no file: name the one being written)
            raise OSError(err.errno, err.strerror, str(path)) from None
        raise
    finally:
        if tmp.exists():
            tmp.unlink()


def foreign_entries(folder, own) -> list[str]:
    """Names of the entries of an existing ``folder`` that are not in ``own`` (a stage's own file names)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(e.name + ("/" if e.is_dir() else "") for e in folder.iterdir() if e.name not in own)


def check_folder_place(folder, flag: str) -> None:
    """Refuse an output folder that is a file, or lies under one (``notes.txt/out``): it could never be made."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise DataError(None, None, f"{flag} {folder} is a file, not a folder")
    above = next((p for p in folder.parents if p.exists()), None)
    if above is not None and not above.is_dir():
        raise DataError(None, None, f"{flag} {folder} lies under {above}, which is a file, not a folder")


def check_output_folder(folder, own, force: bool, writes=(), flag: str = "--out") -> list[str]:
    """Refuse an output folder that holds what the stage did not write, unless ``force``.

    ``own``: the names the stage wrote there; ``writes``: the names it is about to write. Returns
    the foreign entries. With ``force`` the stage writes its own files beside them, and refuses
    when one of them has a name it would write: nothing of the user's is deleted or replaced.
    """
    folder = Path(folder)
    check_folder_place(folder, flag)
    foreign = foreign_entries(folder, own)
    if clash := [name for name in foreign if name.rstrip("/") in writes]:
        raise DataError(None, None, f"{flag} {folder} holds {clash[0]}, which this stage did not write and would "
                                    "replace: give another folder")
    if foreign and not force:
        shown = ", ".join(foreign[:4]) + (f" and {len(foreign) - 4} more" if len(foreign) > 4 else "")
        raise DataError(None, None, f"{flag} {folder} holds files this stage did not write ({shown}): give a new "
                                    "folder, or --force to write beside them (nothing of yours is deleted or replaced)")
    return foreign


def resolved(path) -> Path:
    """``path`` made absolute with its links followed; a link that leads back to itself is a DataError."""
    try:
        return Path(path).resolve()
    except RuntimeError:  # (how Python 3.11 reports a loop of symbolic links)
        raise DataError(path, None, "a symbolic link that leads back to itself (a loop)") from None


def file_key(path) -> tuple:
    """What names one file however it is spelled: its path with links followed, and its (device, inode) where it
    exists (a hard link shares the inode)."""
    try:
        stat = os.stat(path)
    except (OSError, ValueError):
        return resolved(path), None
    return resolved(path), (stat.st_dev, stat.st_ino)


def check_outputs(outputs: dict, inputs: dict) -> None:
    """Refuse, before anything is written, an output that is one of the command's inputs or another of its
    outputs: two spellings of one path, a symbolic link and a hard link all name the same file.

    ``outputs``: what names an output (its flag, or words for a side file) -> its path; ``inputs``: flag -> a
    path or a list of paths. A None path is left out."""
    read: dict = {}  # a path with its links followed, and a (device, inode): the input it names
    for flag, paths in inputs.items():
        for path in paths if isinstance(paths, (list, tuple)) else [paths]:
            if path is not None:
                for key in file_key(path):
                    if key is not None:
                        read.setdefault(key, (flag, path))
    written: dict = {}
    for what, path in outputs.items():
        if path is None:
            continue
        keys = [key for key in file_key(path) if key is not None]
        if given := next((read[key] for key in keys if key in read), None):
            flag, spelled = given
            also = "" if str(spelled) == str(path) else f" ({spelled})"
            raise DataError(None, None, f"{what} {path} is also the input {flag}{also}: a command never writes "
                                        "over its own input; give another path")
        if other := next((written[key] for key in keys if key in written), None):
            raise DataError(path, None, f"is both {other} and {what}: one run never writes two outputs to one "
                                        "file; give another path")
        written.update({key: what for key in keys})


def write_json(path, obj, indent: int | None = None) -> None:
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        f.write(json.dumps(obj, indent=indent))  # (dumps encodes in C, several times faster than dump)


def read_json(path, object_pairs_hook=None):
    """Parse a JSON file; a syntax error names the file, line and column. ``object_pairs_hook``: as
    :func:`json.load`'s (it sees an object's keys in order, repeats included)."""
    try:
        with open(path, encoding="utf-8-sig") as f:
            return json.load(f, object_pairs_hook=object_pairs_hook)
    except json.JSONDecodeError as err:
        raise DataError(path, f"line {err.lineno} column {err.colno}", f"not valid JSON ({err.msg})") from None
    except UnicodeDecodeError as err:
        raise DataError(path, f"byte {err.start}", "not UTF-8 text (is this the right file?)") from None


# ---------------------------------------------------------------------------------------------
# JSONL

def record_problem(record, required: tuple) -> str | None:
    """What is wrong with one parsed JSONL record (see :func:`read_jsonl`), or None."""
    if not isinstance(record, dict):
        return "expected a JSON object"
    missing = [key for key in required if key not in record]
    if missing:
        return f"missing key(s) {missing}"
    for key in ("id", "image_id"):
        problem = id_problem(record[key]) if key in required else None
        if problem:
            return f"'{key}' {problem}"
    if "caption" in required and not isinstance(record["caption"], str):
        return f"'caption' must be a string, got {json.dumps(record['caption'])[:40]}"
    return None


def read_jsonl(path, required: Iterable[str] = (), unique_id: bool | None = None) -> Iterator[dict]:
    """Yield the records of a JSONL file; a bad line or a missing key names the file and line.

    Required ``id`` / ``image_id`` must be strings or integers and a required ``caption`` a string.
    ``unique_id`` (the default when ``id`` is required): a record id seen before is a DataError
    naming both lines, also when one is written 7 and the other "7" (ids are compared as strings).
    """
    required = tuple(required)
    unique_id = "id" in required if unique_id is None else unique_id
    seen: dict[str, tuple[int, object]] = {}
    for number, line in text_lines(path):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(path, f"line {number}", f"not valid JSON ({err.msg})") from None
        if problem := record_problem(record, required):
            raise DataError(path, f"line {number}", problem)
        if unique_id and "id" in record:
            key = str(record["id"])
            if key in seen:
                line, first = seen[key]
                shown = json.dumps(record["id"])
                also = f"line {line}" + (f" (written {json.dumps(first)})" if first != record["id"] else "")
                raise DataError(path, f"line {number}", f"id {shown} appears twice (also at {also}); "
                                                        "every record needs its own id")
            seen[key] = (number, record["id"])
        yield record


def text_lines(path) -> Iterator[tuple[int, str]]:
    """(line number, text) of each line of a UTF-8 file (a BOM dropped; \\n, \\r\\n and \\r end a line, as in
    text mode). Each line is decoded on its own, so a byte that is not UTF-8 is named on its own line."""
    number = 0
    with open(path, "rb") as f:
        for raw in f:
            if number == 0 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise DataError(path, f"line {number + 1}", "not UTF-8 text (is this the right file?)") from None
            if "\r" in text:  # (a line ended by \r alone, or several)
                parts = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
                for part in parts[:-1] if parts[-1] == "" else parts:
                    number += 1
                    yield number, part
            else:
                number += 1
                yield number, text


def read_state(path) -> tuple:
    """What shows that a file was replaced or rewritten: its device, inode, size and modification time."""
    stat = os.stat(path)
    return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns


def check_unchanged(path, before: tuple) -> None:
    """Refuse ``path`` (a DataError) when it is no longer the file :func:`read_state` saw as ``before``."""
    try:
        now = read_state(path)
    except OSError:
        now = None
    if now != before:
        what = "was removed" if now is None else "was replaced" if now[:2] != before[:2] else "was rewritten"
        raise DataError(path, None, f"the file {what} while it was read, so what was read may mix two versions; "
                                    "run again once nothing writes it")


def write_jsonl(path, records: Iterable[dict]) -> int:
    """Write records atomically, one JSON object a line. Returns the number written."""
    count = 0
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
            count += 1
    return count


# ---------------------------------------------------------------------------------------------
# What a command wrote into a folder: ``written.json`` holds the sha256 of each file it wrote there. A file it
# does not name, or whose digest is another now (the user edited it), is the user's: never replaced.

WRITTEN = "written.json"


def file_digest(path) -> str:
    """The sha256 of a file's bytes, in hex."""
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def record_written(folder, names) -> None:
    """Write ``folder/written.json``: the digest of each of ``names`` there (those that are files), just written."""
    folder = Path(folder)
    write_json(folder / WRITTEN, {name: file_digest(folder / name) for name in names if (folder / name).is_file()},
               indent=1)


def written_record(folder) -> dict | None:
    """``folder/written.json`` (name -> digest), or None: none there, or one not of that form."""
    try:
        record = read_json(Path(folder) / WRITTEN)
    except (OSError, DataError):
        return None
    return record if isinstance(record, dict) and all(isinstance(v, str) for v in record.values()) else None


def not_written(folder, names) -> list[str]:
    """Those of ``names`` that lie in ``folder`` and were not written there, unchanged since, by the command whose
    ``written.json`` is there: a file it does not name, or one edited since."""
    folder, record = Path(folder), written_record(folder) or {}
    return [name for name in names if (folder / name).exists()
            and (name not in record or not (folder / name).is_file() or file_digest(folder / name) != record[name])]


# ---------------------------------------------------------------------------------------------
# Ordering shared by the writers and the shard merge, so 1 shard and N shards give equal files.

def natural_key(value) -> tuple:
    """Sort key that orders "img2" before "img10" and numbers numerically (ASCII digits only: "room101²" is
    "room", 101, "²")."""
    parts = re.split(r"([0-9]+)", str(value))
    return tuple((0, int(p), "") if p.isascii() and p.isdigit() else (1, 0, p) for p in parts if p != "")


def jsonl_order_key(record: dict) -> tuple:
    """Canonical record order: natural order of image id, then of record id (if any)."""
    return natural_key(record.get("image_id", "")), natural_key(record.get("id", ""))


# ---------------------------------------------------------------------------------------------
# HDF5, one group per image id


def open_h5(path, what: str = "HDF5 file"):
    """Open an HDF5 file for reading; a missing, empty, truncated or non-HDF5 file is one DataError."""
    import h5py

    if Path(path).is_dir():
        raise DataError(path, None, f"is a folder; give the {what} (an HDF5 file)")
    if not Path(path).is_file():
        raise DataError(path, None, f"{what} not found")
    try:
        return h5py.File(path, "r")
    except OSError as err:
        raise DataError(path, None, f"not an HDF5 file, or a truncated one ({err})") from None


def check_image_groups(f, path, kind: str) -> None:
    """Refuse an open HDF5 file that holds flat arrays where one group per image id belongs (a quality
    file given as a region-feature or saliency file); ``kind`` names what was expected."""
    import h5py

    arrays = [name for name, item in f.items() if isinstance(item, h5py.Dataset)]
    if arrays and len(arrays) == len(f):
        hint = " (a quality file from 05?)" if "u" in arrays else ""
        raise DataError(path, None, f"holds flat arrays ({', '.join(sorted(arrays)[:4])}), not one group per image: "
                                    f"not a {kind} file{hint}")


def h5_number(path, record, group, name: str, positive: bool = False) -> float:
    """A numeric attribute of an HDF5 group (``width``, ``height``), checked."""
    if name not in group.attrs:
        raise DataError(path, record, f"missing attribute '{name}'")
    value = group.attrs[name]
    shown = repr(value) if isinstance(value, (str, bytes)) else str(value)
    try:
        if np.ndim(value) != 0 or isinstance(value, (str, bytes)):
            raise TypeError
        number = float(value)
    except (TypeError, ValueError):
        raise DataError(path, record, f"attribute '{name}' must be a number, got {shown}") from None
    if positive and not number > 0:
        raise DataError(path, record, f"attribute '{name}' must be a positive number, got {shown}")
    return number


def write_h5_groups(path, groups: Iterable[tuple[str, dict, dict]], compression: str | None = None,
                    root_attrs: dict | None = None) -> int:
    """Write ``(image_id, datasets, attrs)`` triples atomically as one group per image id. A dataset's value
    is an array, or (array, the dataset's own attributes).

    ``root_attrs`` become the file's own attributes; they are read after the last group is written,
    so a generator of the groups may fill them in (a value of None is left out)."""
    import h5py

    count = 0
    with atomic_path(path) as tmp:
        with h5py.File(tmp, "w") as f:
            for image_id, datasets, attrs in groups:
                if problem := name_problem(image_id):  # (HDF5 would make "a/b" a group b inside a group a)
                    raise DataError(path, f"image {image_id!r}", f"the image id {problem}: an id names its group "
                                                               "in this file; give the image another id")
                group = f.create_group(str(image_id))
                for name, value in datasets.items():
                    value, own = value if isinstance(value, tuple) else (value, {})
                    dataset = group.create_dataset(name, data=np.asarray(value), compression=compression)
                    dataset.attrs.update(own)
                for name, value in attrs.items():
                    group.attrs[name] = value
                count += 1
            for name, value in (root_attrs or {}).items():
                if value is not None:
                    f.attrs[name] = value
    return count


def h5_group_ids(path) -> list[str]:
    with open_h5(path) as f:
        return sorted(f.keys(), key=natural_key)


# ---------------------------------------------------------------------------------------------
# Quality scores: flat arrays, one row per caption

QUALITY_FIELDS = ("logp_trusted", "logp_extended", "u")


def write_quality(path, ids: list[str], logp_trusted, logp_extended, u, source=None, text_digest=None) -> None:
    """Write the quality file: each caption's two log-likelihoods and its quality ``u`` (Eq. 1,
    :func:`clid.selection.quality.eq1_quality`), stored as float32; ``source`` (optional) says where each caption
    comes from ("selfgen", "trusted"), ``text_digest`` (optional, uint64) what each scored caption's text was
    (clid.data.examples.text_digest)."""
    arrays = {"id": np.asarray([str(i) for i in ids], dtype=object),
              "logp_trusted": np.asarray(logp_trusted, np.float64).astype(np.float32),
              "logp_extended": np.asarray(logp_extended, np.float64).astype(np.float32),
              "u": np.asarray(u, np.float64).astype(np.float32)}
    if source is not None:
        arrays["source"] = np.asarray([str(s) for s in source], dtype=object)
    if text_digest is not None:
        arrays["text_digest"] = np.asarray(text_digest, dtype=np.uint64)
    write_arrays(path, arrays)


def read_quality(path) -> dict[str, np.ndarray]:
    arrays = read_arrays(path)
    for name in ("id",) + QUALITY_FIELDS:
        if name not in arrays:
            raise DataError(path, None, f"missing dataset '{name}'")
    lengths = {name: len(arrays[name]) for name in ("id",) + QUALITY_FIELDS}
    if len(set(lengths.values())) > 1:
        raise DataError(path, None, f"datasets differ in lengths {lengths}")
    for name in QUALITY_FIELDS:
        if arrays[name].dtype.kind not in "fiu":
            raise DataError(path, f"dataset '{name}'", f"holds {arrays[name].dtype}, not numbers")
    if "text_digest" in arrays and (arrays["text_digest"].dtype != np.uint64 or len(arrays["text_digest"]) != len(arrays["id"])):
        raise DataError(path, "dataset 'text_digest'", f"holds {len(arrays['text_digest'])} {arrays['text_digest'].dtype}, "
                                                       f"not one uint64 digest per caption ({len(arrays['id'])})")
    repeated = repeated_values(arrays["id"])
    if repeated:
        raise DataError(path, None, f"{len(repeated)} caption id(s) have more than one score (e.g. "
                                    f"{', '.join(repeated[:3])}): each caption must be scored once")
    return arrays


def repeated_values(values) -> list[str]:
    """The values (as strings) that occur more than once, in order of first repeat."""
    seen, repeated = set(), {}
    for value in values:
        key = str(value)
        if key in seen:
            repeated[key] = None
        seen.add(key)
    return list(repeated)


def write_arrays(path, arrays: dict[str, np.ndarray]) -> None:
    """Write equal-length 1-d arrays (strings allowed) atomically as HDF5 datasets."""
    import h5py

    lengths = {name: len(a) for name, a in arrays.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"arrays differ in length: {lengths}")
    with atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
        for name, array in arrays.items():
            array = np.asarray(array)
            if array.dtype == object or array.dtype.kind in "US":
                f.create_dataset(name, data=[str(x) for x in array], dtype=h5py.string_dtype())
            else:
                f.create_dataset(name, data=array)


def read_arrays(path) -> dict[str, np.ndarray]:
    import h5py

    out = {}
    with open_h5(path) as f:
        groups = [name for name, item in f.items() if not isinstance(item, h5py.Dataset)]
        if groups:
            raise DataError(path, None, f"holds groups ({', '.join(groups[:3])}{', ...' if len(groups) > 3 else ''}), "
                                        "not flat arrays: is this a region-feature or saliency file (one group per "
                                        "image) given where a quality file (05's output) belongs?")
        for name, ds in f.items():
            if ds.ndim != 1:
                raise DataError(path, f"dataset '{name}'", f"has shape {ds.shape}, not one value per row")
            if ds.dtype.kind == "O" or h5py.check_string_dtype(ds.dtype):
                out[name] = np.asarray(ds.asstr()[()], dtype=object)
            else:
                out[name] = ds[()]
    return out

