"""Resuming a training run (04, 06): its run record (clid.run.runs) compared with the checkpoint's, the lock on
its folder, and whether it is already trained."""
from __future__ import annotations

import weakref
from pathlib import Path

from clid.base.files import DataError, check_output_folder, check_outputs, read_json
from clid.run.recipes import DEMO_STEPS_ENV
from clid.run.runs import flag_name, record_differences, run_record

NOT_RECORDED = ("out", "save_every", "eval_every", "eval_images", "log_every", "restart", "force", "max_left_out",
                "workers", "token_cache", "recipe", "allow_download", "region_cache", "dist_timeout")  # (a recipe sets other flags, which are recorded)
INPUT_FLAGS = ("captions", "selfgen", "quality", "features", "output_vocab", "init_from", "init", "bert", "test_ids",
               "region_init", "continue_from")
BOTH = ("init", "continue_from")  # input flags whose value is recorded too ("--init random" names no file)


def training_record(args) -> dict:
    """The run record of a training run: its input files and its other flags."""
    names = [name for name in vars(args) if name not in NOT_RECORDED]
    return resolve_precision(run_record(args, inputs=[n for n in names if n in INPUT_FLAGS],
                                        settings=[n for n in names if n not in INPUT_FLAGS or n in BOTH]))


def resolve_precision(record: dict) -> dict:
    """``record`` with its ``--precision`` as it resolves on this machine's device ("auto" is float32 on the
    CPU, bfloat16 on a GPU: clid.run.runtime), as 05 records it; an earlier record's "auto" is read the same way."""
    from clid.run import runtime

    value = record.get("settings", {}).get("--precision")
    if value in runtime.PRECISIONS:
        record["settings"]["--precision"] = runtime.device_plan(None, value).compute
    return record


def earlier_record(config: dict) -> dict:
    """The run record in a checkpoint's config.json. A checkpoint of an earlier version recorded
    its flags under "train" or as {"flags", "inputs"}: its flags are compared, not its files."""
    record = config.get("run")
    if isinstance(record, dict) and "settings" in record:
        return resolve_precision(record)
    flags = record.get("flags", {}) if isinstance(record, dict) else config["train"]
    return {"settings": {flag_name(k): v for k, v in flags.items() if k not in NOT_RECORDED and k not in INPUT_FLAGS}}


def hold_out_folder(args) -> None:
    """Take the sharded stages' lock (:class:`clid.run.shard.ShardLock`, ``.OUT.lock`` beside ``--out``) for as
    long as ``args`` lives, that is, the run: a second run training into the same folder is a DataError."""
    from clid.run.shard import ShardLock

    out = Path(args.out).resolve()
    if not out.name:  # (the root folder: refused as a folder of other files)
        return
    lock = ShardLock(out)
    if not lock.acquire():
        raise DataError(None, None, f"--out {args.out}: {lock.holder()} is training into this folder; two runs never "
                                    "write one checkpoint: wait for it to end, or give another --out")
    weakref.finalize(args, lock.release)


def check_resume(args, rank: int, world: int) -> None:
    """Refuse to resume ``--out`` when it was trained with other flags or inputs (``--restart`` starts over)."""
    import torch.distributed as dist

    from clid.model.checkpoints import (
        CARD_NAME,
        CHECKPOINT_NAMES,
        STAGE_FILES,
        checkpoint_exists,
        checkpoint_files,
        remove_checkpoint,
    )

    out = Path(args.out)
    check_outputs({"--out": out, **{f"--out's {name}": out / name for name in (*CHECKPOINT_NAMES, *STAGE_FILES, CARD_NAME)}},
                  {flag_name(name): getattr(args, name) for name in INPUT_FLAGS if getattr(args, name, None)})
    # (a model card the stage did not write, or one edited since, is kept beside the checkpoint and named at its save)
    check_output_folder(out, checkpoint_files(out) | {CARD_NAME}, args.force, writes=CHECKPOINT_NAMES + STAGE_FILES)
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
    fix = "Give --restart to start it over, or another --out"
    if getattr(args, "recipe", None) == "demo" and any(d.startswith("--max-steps ") for d in differences):
        differences = [d.replace("--max-steps", f"the steps (--max-steps, or {DEMO_STEPS_ENV} under --recipe demo)", 1)
                       for d in differences]
        fix = (f"Set {DEMO_STEPS_ENV} as then to resume it, or start it over: --restart, or remove {out} (make passes "
               "no flags), or another --out")
    if differences:
        raise DataError(None, None, f"{out} holds a run with other settings: {'; '.join(differences)}. {fix}")


def already_trained(args, rank: int) -> bool:
    """True (and says so) when ``args.out`` holds a checkpoint trained to ``--max-steps``."""
    from clid.model.checkpoints import checkpoint_exists, read_train_state

    if checkpoint_exists(args.out) and read_train_state(args.out)["step"] >= args.max_steps:
        if rank == 0:
            print(f"{args.out} is already trained to {args.max_steps} steps; nothing to do")
        return True
    return False
