"""Run records: what determines a run's output (the sizes and modification times of its input files, and
its settings), kept beside the output and compared when the run resumes, so that a run never mixes work
done with other inputs or settings. One record for every stage: the per-item stages (clid.shard), the
training runs (04, 06: :func:`check_resume`), 07's caption cache and 00's world.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from clid.files import DataError, check_not_input, check_output_folder, read_json


def flag_name(dest: str) -> str:
    """An argparse destination as its flag: "max_steps" -> "--max-steps"."""
    return "--" + dest.replace("_", "-")


def file_state(path) -> dict:
    """What identifies an input: its size and modification time (a folder: those of its files)."""
    path = Path(path)
    if path.is_dir():
        return {p.name: file_state(p) for p in sorted(path.iterdir()) if p.is_file()}
    if not path.exists():
        return {"missing": True}
    stat = path.stat()
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def run_record(args, inputs: Sequence[str] = (), settings: Sequence[str] = ()) -> dict:
    """What determines a stage's output: the files named by the ``inputs`` flags and the values of
    the ``settings`` flags (argparse dest names; a flag that names a file may be given as both).
    An ``--out`` that is one of the inputs is refused here, before any work."""
    if getattr(args, "out", None):
        check_not_input(args.out, {flag_name(name): getattr(args, name) for name in inputs})
    out = {"inputs": {}, "settings": {}}
    for name in inputs:
        value = getattr(args, name)
        values = list(value) if isinstance(value, (list, tuple)) else [value]
        for n, one in enumerate(values):
            if one is not None and Path(str(one)).exists():  # several files: "--weights[1]"
                out["inputs"][flag_name(name) + (f"[{n}]" if len(values) > 1 else "")] = file_state(one)
    for name in settings:
        value = getattr(args, name)
        if isinstance(value, str) and Path(value).exists():  # a path: the same however it is spelled
            value = str(Path(value).resolve())
        out["settings"][flag_name(name)] = list(value) if isinstance(value, tuple) else value
    return out


def record_differences(old: dict, new: dict) -> list[str]:
    """What differs between an earlier run's record and this run's, in words. A setting the earlier
    record lacks (a flag added to the code since) is not a difference."""
    out = []
    for flag in sorted(old.get("settings", {})):
        a, b = old["settings"][flag], new.get("settings", {}).get(flag)
        if json.loads(json.dumps(a)) != json.loads(json.dumps(b)):
            out.append(f"{flag} {a} then, {b} now")
    for flag in sorted(set(old.get("inputs", {})) | set(new.get("inputs", {}))):
        a, b = old.get("inputs", {}).get(flag), new.get("inputs", {}).get(flag)
        if a != b:
            out.append(f"the file of {flag} changed" if a and b else f"{flag} {'not given' if not b else 'new'} now")
    return out


# ---------------------------------------------------------------------------------------------
# Training runs (04, 06): every flag is recorded but those that do not change what the run computes

NOT_RECORDED = ("out", "save_every", "eval_every", "eval_images", "log_every", "restart", "force", "max_left_out",
                "recipe", "allow_download")  # (a recipe sets other flags, which are recorded)
INPUT_FLAGS = ("captions", "selfgen", "quality", "features", "output_vocab", "init_from", "init", "bert", "test_ids",
               "region_init")


def training_record(args) -> dict:
    """The run record of a training run: its input files and its other flags."""
    names = [name for name in vars(args) if name not in NOT_RECORDED]
    return run_record(args, inputs=[n for n in names if n in INPUT_FLAGS],
                      settings=[n for n in names if n not in INPUT_FLAGS])


def earlier_record(config: dict) -> dict:
    """The run record in a checkpoint's config.json. A checkpoint of an earlier version recorded
    its flags under "train" or as {"flags", "inputs"}: its flags are compared, not its files."""
    record = config.get("run")
    if isinstance(record, dict) and "settings" in record:
        return record
    flags = record.get("flags", {}) if isinstance(record, dict) else config["train"]
    return {"settings": {flag_name(k): v for k, v in flags.items() if k not in NOT_RECORDED and k not in INPUT_FLAGS}}


def check_resume(args, rank: int, world: int) -> None:
    """Refuse to resume ``--out`` when it was trained with other flags or inputs (``--restart`` starts over)."""
    import torch.distributed as dist

    from clid.model.checkpoints import CHECKPOINT_NAMES, STAGE_FILES, checkpoint_exists, checkpoint_files, remove_checkpoint

    out = Path(args.out)
    check_not_input(out, {flag_name(name): getattr(args, name)
                          for name in (*INPUT_FLAGS, "continue_from") if getattr(args, name, None)})
    check_output_folder(out, checkpoint_files(out), args.force, writes=CHECKPOINT_NAMES + STAGE_FILES)
    if not checkpoint_exists(out):
        return
    if args.restart:
        if rank == 0:
            print(f"--restart: removing the checkpoint in {out}")
            remove_checkpoint(out)
        if world > 1:
            dist.barrier()
        return
    config = read_json(out / "config.json")
    if not isinstance(config, dict) or not isinstance(config.get("run", config.get("train")), dict):
        raise DataError(out / "config.json", None, "no run record: a damaged checkpoint (give --restart)")
    differences = record_differences(earlier_record(config), training_record(args))
    if differences:
        raise SystemExit(f"error: {out} holds a run with other settings: {'; '.join(differences)}. "
                         "Give --restart to start it over, or another --out")


def already_trained(args, rank: int) -> bool:
    """True (and says so) when ``args.out`` holds a checkpoint trained to ``--max-steps``."""
    from clid.model.checkpoints import checkpoint_exists, read_train_state

    if checkpoint_exists(args.out) and read_train_state(args.out)["step"] >= args.max_steps:
        if rank == 0:
            print(f"{args.out} is already trained to {args.max_steps} steps; nothing to do")
        return True
    return False
