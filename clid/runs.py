"""Run records: what determines a run's output, and the check that refuses to resume a run whose flags or
inputs changed.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch.distributed as dist

from clid.files import DataError, check_not_input, check_output_folder, read_json
from clid.model.checkpoints import (
    CHECKPOINT_NAMES,
    STAGE_FILES,
    checkpoint_exists,
    checkpoint_files,
    read_train_state,
    remove_checkpoint,
)

# flags that do not change what a run computes (a resumed run may change them)
NOT_RECORDED = ("out", "save_every", "eval_every", "eval_images", "log_every", "restart", "force")


# flags naming input files: recorded by the files' size and modification time
INPUT_FLAGS = ("captions", "selfgen", "quality", "features", "output_vocab", "init_from", "init", "bert", "test_ids",
               "region_init")


def file_stamp(value):
    """Size and modification time of each input file (or of a checkpoint folder's files); other values as given."""
    if isinstance(value, list):
        return [file_stamp(v) for v in value]
    path = Path(str(value)) if value is not None else None
    if path is None or not path.exists():
        return value
    files = sorted(f for f in path.iterdir() if f.suffix in (".json", ".safetensors")) if path.is_dir() else [path]
    return {f.name: [f.stat().st_size, f.stat().st_mtime_ns] for f in files}


def run_record(args) -> dict:
    """What determines a training run's output: its flags, and its input files' sizes and modification times."""
    flags = {k: v for k, v in vars(args).items() if k not in NOT_RECORDED and k not in INPUT_FLAGS}
    inputs = {k: file_stamp(v) for k, v in vars(args).items() if k in INPUT_FLAGS}
    return {"flags": flags, "inputs": inputs}


def check_resume(args, rank: int, world: int) -> None:
    """Refuse to resume ``--out`` when it was trained with other flags or inputs (``--restart`` starts over)."""
    out = Path(args.out)
    check_not_input(out, {"--" + name.replace("_", "-"): getattr(args, name)
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
    # (a checkpoint written before input files were recorded has its flags under "train")
    old = config.get("run") or {"flags": {k: v for k, v in config["train"].items()
                                          if k not in NOT_RECORDED and k not in INPUT_FLAGS}}
    new = run_record(args)
    differences = []
    for kind in ("flags", "inputs"):
        for name in sorted(old.get(kind, {})):  # (a flag added to the code since is not a difference)
            before, now = old[kind][name], new[kind].get(name)
            if json.loads(json.dumps(before)) != json.loads(json.dumps(now)):
                flag = "--" + name.replace("_", "-")
                differences.append(f"{flag} {before!r} -> {now!r}" if kind == "flags"
                                   else f"{flag} (the file changed: size or modification time)")
    if differences:
        raise SystemExit(f"error: {out} holds a run with other settings: {'; '.join(differences)}. "
                         "Give --restart to start it over, or another --out")


def already_trained(args, rank: int) -> bool:
    """True (and says so) when ``args.out`` holds a checkpoint trained to ``--max-steps``."""
    if checkpoint_exists(args.out) and read_train_state(args.out)["step"] >= args.max_steps:
        if rank == 0:
            print(f"{args.out} is already trained to {args.max_steps} steps; nothing to do")
        return True
    return False
