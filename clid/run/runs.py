"""Run records: what determines a run's output (the sizes and modification times of its input files, and
its settings), kept beside the output and compared when the run resumes, so that a run never mixes work
done with other inputs or settings. One record for every stage: the per-item stages (clid.run.shard), the
training runs (04, 06: clid.training.resume), 07's caption cache and 00's world.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from clid.base.files import DataError, check_outputs, read_json, resolved, write_json


def flag_name(dest: str) -> str:
    """An argparse destination as its flag: "max_steps" -> "--max-steps"."""
    return "--" + dest.replace("_", "-")


def file_state(path, skip=lambda p: False) -> dict:
    """What identifies an input: its size and modification time; a folder: those of its files and, in
    turn, of its subfolders (a linked folder is not entered, as the stages' own searches do not), but
    those for which ``skip(path)`` is true."""
    path = Path(path)
    if path.is_dir():
        return {p.name: file_state(p, skip) for p in sorted(path.iterdir())
                if (p.is_file() or (p.is_dir() and not p.is_symlink())) and not skip(p)}
    if not path.exists():
        return {"missing": True}
    stat = path.stat()
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def run_record(args, inputs: Sequence[str] = (), settings: Sequence[str] = ()) -> dict:
    """What determines a stage's output: the files named by the ``inputs`` flags (an input folder's
    files, but the output's own files written into it) and the values of the ``settings`` flags
    (argparse dest names; a flag that names a file may be given as both). An ``--out`` that is one of
    the inputs is refused here, before any work."""
    written = getattr(args, "out", None)
    if written:
        check_outputs({"--out": written}, {flag_name(name): getattr(args, name) for name in inputs})
        written = resolved(written)

    def own(p: Path) -> bool:  # the output, its side files, chunks, parts and lock, in an input folder
        return bool(written) and p.name.lstrip(".").startswith(written.name) and p.parent.resolve() == written.parent

    out = {"inputs": {}, "settings": {}}
    for name in inputs:
        value = getattr(args, name)
        values = list(value) if isinstance(value, (list, tuple)) else [value]
        for n, one in enumerate(values):
            if one is not None and Path(str(one)).exists():  # several files: "--weights[1]"
                out["inputs"][flag_name(name) + (f"[{n}]" if len(values) > 1 else "")] = file_state(one, own)
    for name in settings:
        value = getattr(args, name)
        if isinstance(value, str) and Path(value).exists():  # a path: the same however it is spelled
            value = str(resolved(value))
        out["settings"][flag_name(name)] = list(value) if isinstance(value, tuple) else value
    return out


def record_differences(old: dict, new: dict) -> list[str]:
    """What differs between an earlier run's record and this run's, in words. A setting the earlier
    record lacks (a flag added to the code since) is not a difference, nor are the files of a flag it
    recorded as a setting alone (an earlier version did not record them): its value is compared. A flag
    that names files is compared by their state, not their path: a checkout moved elsewhere resumes."""
    out = []
    old_inputs, new_inputs = old.get("inputs", {}), new.get("inputs", {})
    for flag in sorted(old.get("settings", {})):
        a, b = old["settings"][flag], new.get("settings", {}).get(flag)
        if json.loads(json.dumps(a)) != json.loads(json.dumps(b)):
            files = [k for k in old_inputs if k == flag or k.startswith(flag + "[")]
            if files and all(old_inputs[k] == new_inputs.get(k) for k in files) and set(files) == {
                    k for k in new_inputs if k == flag or k.startswith(flag + "[")}:
                continue  # (a file's path, moved with the checkout: its size and modification time are the same)
            out.append(f"{flag} {a} then, {b} now")
    for flag in sorted(set(old.get("inputs", {})) | set(new.get("inputs", {}))):
        a, b = old.get("inputs", {}).get(flag), new.get("inputs", {}).get(flag)
        if a is None and flag in old.get("settings", {}):
            continue
        if a != b:
            out.append(f"the file of {flag} changed" if a and b else f"{flag} {'not given' if not b else 'new'} now")
    return out


# ---------------------------------------------------------------------------------------------
# An output file is replaced only by the command that wrote it, unchanged since: its run record lies beside it


def record_path(out) -> Path:
    """``OUT.run.json``: the run record kept beside an output file."""
    out = Path(out)
    return out.with_name(f"{out.name}.run.json")


FORMER_NAMES = {  # a renamed command: what its earlier names wrote is its own
    "python -m clid.captions convert-coco": ("python -m clid.data convert-coco",),
    "python -m clid.captions convert-ssa": ("python -m clid.data convert-ssa",),
    "python -m clid.emlnet convert": ("python -m clid.saliency.emlnet convert",),
}

WRITING = "being written"  # a record's "output" while the command writes the file (a kill then leaves it its own)


def check_own_output(out, command: str) -> None:
    """Refuse an existing ``out`` that ``command`` did not write (no run record of it beside the file,
    :func:`write_own_record`), or that changed since it wrote it (its size or modification time is not the
    recorded one): such a file is the user's, kept, and named in one line. A folder is refused."""
    out = Path(out)
    if out.is_dir():
        raise DataError(None, None, f"--out {out} is a folder; give the file to write")
    if record_path(out).is_dir():
        raise DataError(None, None, f"the place of --out's run record, {record_path(out)}, is a folder: move it away")
    if not out.exists():
        return
    try:
        earlier = read_json(record_path(out))
    except (OSError, DataError):
        earlier = None
    keep = "it is kept: give another --out, or move the file away yourself"
    if not isinstance(earlier, dict) or earlier.get("command") not in (command, *FORMER_NAMES.get(command, ())):
        if isinstance(earlier, dict):  # (another command's record: a sharded stage's names no command)
            writer = earlier.get("command") or "another command (a sharded stage, such as convert)"
            raise DataError(None, None, f"--out {out} exists and {writer} wrote it, not {command} (its run record "
                                        f"{record_path(out).name} says so); {keep}")
        raise DataError(None, None, f"--out {out} exists and {command} did not write it (no run record "
                                    f"{record_path(out).name} of it beside the file); {keep}")
    if changed_since(earlier, out):
        raise DataError(None, None, f"--out {out} was changed since {command} wrote it (its size or modification "
                                    f"time is not the one its run record {record_path(out).name} holds); {keep}")


def changed_since(record: dict, out) -> bool:
    """Whether ``out`` changed since the command whose run record is ``record`` wrote it (a record of an earlier
    version, without the output's state, cannot tell: False)."""
    return record.get("output", WRITING) != WRITING and record["output"] != file_state(out)


def claim_output(out, command: str) -> None:
    """Mark ``out`` as ``command``'s before writing it (after :func:`check_own_output`): killed while it writes,
    the command still knows the file for its own."""
    write_json(record_path(out), {"command": command, "output": WRITING})


def write_own_record(out, record: dict, command: str) -> None:
    """Mark ``out``, just written, as ``command``'s output, with its size and modification time
    (:func:`check_own_output`)."""
    write_json(record_path(out), {"command": command, **record, "output": file_state(out)})


# ---------------------------------------------------------------------------------------------
# Training runs (04, 06): every flag is recorded but those that do not change what the run computes
