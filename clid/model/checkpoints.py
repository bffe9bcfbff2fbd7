"""Checkpoint folders: the model alone (weights, config, tokenizer), and with its training state; resumable,
atomic saves that never touch files the stage did not write.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from torch import nn

from clid.files import DataError, foreign_entries, read_json
from clid.model.captioner import Captioner, CaptionerConfig
from clid.text import load_tokenizer

# ---------------------------------------------------------------------------------------------
# Checkpoints: model.safetensors + config.json + tokenizer files (+ training state)


def save_model(model: Captioner, folder, extra_config: dict | None = None) -> None:
    """Write the model, its config and its tokenizer into ``folder`` (which must be new or a staging dir)."""
    from safetensors.torch import save_model as save_safetensors

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_safetensors(model, str(folder / "model.safetensors"))
    config = {"model": model.config.to_json(), **(extra_config or {})}
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    model.tokenizer.save_pretrained(str(folder))


def load_weights(model: nn.Module, path, device="cpu") -> None:
    """Load a ``model.safetensors`` into ``model``; a damaged file or one of another model is one DataError."""
    from safetensors.torch import load_model as load_safetensors

    from clid.files import DataError

    try:
        load_safetensors(model, str(path), device=str(device))
    except Exception as err:  # safetensors raises its own error types, torch a RuntimeError on shapes
        message = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
        raise DataError(path, None, f"cannot load these weights into the model of config.json ({message})") from None


def load_checkpoint(folder, device="cpu") -> Captioner:
    """Rebuild the model and its tokenizer from a checkpoint folder (no pickle involved)."""
    from clid.files import DataError, read_json

    folder = Path(folder)
    if not (folder / "config.json").exists() or not (folder / "model.safetensors").exists():
        raise SystemExit(f"error: {folder} is not a checkpoint (needs config.json and model.safetensors)")
    saved = read_json(folder / "config.json")
    try:
        config = CaptionerConfig.from_json(saved["model"])
    except (KeyError, TypeError, ValueError) as err:
        raise DataError(folder / "config.json", None, f"not a model config ({type(err).__name__}: {err})") from None
    model = Captioner(config)
    load_weights(model, folder / "model.safetensors", device)
    model.tokenizer = load_tokenizer(str(folder))
    return model.to(device).eval()


# ---------------------------------------------------------------------------------------------
# Checkpoints with training state (a folder swapped in atomically)


def checkpoint_exists(folder) -> bool:
    folder = Path(folder)
    old = folder.with_name(f".{folder.name}.old")
    if not folder.exists() and old.exists():  # a crash between the two renames of a save
        old.rename(folder)
    return (folder / "train_state.json").exists()


def read_train_state(folder) -> dict:
    """The checkpoint's training state; a damaged file is one DataError naming it."""
    path = Path(folder) / "train_state.json"
    state = read_json(path)
    if not isinstance(state, dict) or isinstance(state.get("step"), bool) or not isinstance(state.get("step"), int):
        raise DataError(path, None, "no integer 'step': a damaged checkpoint (remove it, or give --restart)")
    return state


# files a training stage writes into --out beside its checkpoint, and the checkpoint's own files
STAGE_FILES = ("selection_log.jsonl", "difficulty.h5")


CHECKPOINT_NAMES = ("model.safetensors", "config.json", "optimizer.pt", "train_state.json", "train_log.jsonl",
                    "vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def checkpoint_files(folder) -> set[str]:
    """The names of the files a training stage wrote into ``folder``: the checkpoint's manifest (for a
    checkpoint written before manifests, every file beside its train_state.json), and STAGE_FILES."""
    folder = Path(folder)
    own = set(STAGE_FILES)
    state_path = folder / "train_state.json"
    if state_path.is_file():
        try:
            files = json.loads(state_path.read_text(encoding="utf-8")).get("files")
        except (ValueError, AttributeError):
            files = None
        if isinstance(files, list):
            own.update(str(name) for name in files)
        else:
            own.update(item.name for item in folder.iterdir() if item.is_file())
    return own


def save_checkpoint(folder, model: Captioner, optimizer, state: dict, config_extra: dict, log_lines: list[str]):
    """Write model + config + tokenizer + optimizer + state into a staging folder, then swap it in.

    Only the stage's own files are ever replaced: when ``folder`` also holds files the stage did not
    write (allowed by --force), the checkpoint's files are moved in one by one, the state last, and
    nothing else in the folder is touched.
    """
    folder = Path(folder)
    staging = folder.with_name(f".{folder.name}.staging")
    old = folder.with_name(f".{folder.name}.old")
    shutil.rmtree(staging, ignore_errors=True)
    save_model(model, staging, config_extra)
    torch.save(optimizer.state_dict(), staging / "optimizer.pt")
    previous_log = folder / "train_log.jsonl"
    lines = (previous_log.read_text().splitlines() if previous_log.exists() else []) + log_lines
    (staging / "train_log.jsonl").write_text("".join(line + "\n" for line in lines))
    own = checkpoint_files(folder)
    keep = [item for item in folder.iterdir() if item.is_file() and item.name in own
            and item.name != "train_state.json" and not (staging / item.name).exists()] if folder.is_dir() else []
    files = sorted({item.name for item in staging.iterdir()} | {item.name for item in keep} | {"train_state.json"})
    (staging / "train_state.json").write_text(json.dumps({**state, "files": files}, indent=1))
    foreign = foreign_entries(folder, own)
    if foreign:
        if clash := sorted(set(os.listdir(staging)) & set(foreign)):
            shutil.rmtree(staging, ignore_errors=True)
            raise SystemExit(f"error: {folder / clash[0]} was not written by this stage and the checkpoint would "
                             "replace it: give another --out")
        for name in sorted(n for n in os.listdir(staging) if n != "train_state.json") + ["train_state.json"]:
            os.replace(staging / name, folder / name)
        staging.rmdir()
        return
    for item in keep:  # files the stage keeps there (e.g. selection_log.jsonl)
        shutil.copy2(item, staging / item.name)
    if folder.exists():
        shutil.rmtree(old, ignore_errors=True)
        folder.rename(old)
    staging.rename(folder)
    shutil.rmtree(old, ignore_errors=True)


def restore(folder, model: Captioner, optimizer) -> dict:
    """Load weights and optimizer state of a checkpoint into existing objects; return its state."""

    folder = Path(folder)
    state = read_train_state(folder)
    load_weights(model, folder / "model.safetensors", str(next(model.parameters()).device))
    try:
        optimizer.load_state_dict(torch.load(folder / "optimizer.pt", weights_only=True))
    except Exception as err:  # torch raises many kinds for a damaged file
        raise DataError(folder / "optimizer.pt", None, f"cannot load the optimizer state ({type(err).__name__}: "
                                                        f"{str(err).splitlines()[0][:200]}); remove the checkpoint "
                                                        "or give --restart") from None
    return state


def check_same_levels(flag: str, folder, theirs, ours) -> None:
    """One clear error when a checkpoint we start from was trained on other length levels."""
    from clid.text import get_levels, level_set_name

    if get_levels(theirs) != get_levels(ours):
        raise SystemExit(f"error: {flag} {folder} was trained with levels {level_set_name(theirs)}, "
                         f"not this run's --levels {level_set_name(ours)}")


def load_init_weights(model: Captioner, folder, flag: str = "--init-from") -> None:
    """Copy the weights of another checkpoint (``--init-from``, ``--continue-from``); configs must match."""
    source = load_checkpoint(folder)
    check_same_levels(flag, folder, source.config.levels, model.config.levels)
    if source.config.to_json() | {"init_from": None, "preset": None} != model.config.to_json() | {"init_from": None, "preset": None}:
        raise SystemExit(f"error: {flag} {folder}: its model config differs from this run's")
    model.load_state_dict(source.state_dict())


def remove_checkpoint(folder) -> None:
    """Delete the stage's own files in ``folder`` (and the folder, if nothing else is left in it)."""
    folder = Path(folder)
    for name in checkpoint_files(folder):
        (folder / name).unlink(missing_ok=True)
    if not any(folder.iterdir()):
        folder.rmdir()
