"""Checkpoint folders: the model alone (weights, config, tokenizer), and with its training state; resumable,
atomic saves that never touch files the stage did not write.

``config.json`` holds the model's config under ``model``, the stage's flags, and the kind and dimension
of the region features the model was trained on (``feature_kind``, ``feature_dim``: see
:func:`feature_record`), which ``clid.data.store.check_features_match`` checks a features file
against.

``MODEL_CARD.md`` is written at every save (:func:`save_checkpoint`), marked unfinished ("step 711 of 2,000:
unfinished") until the run's last step; a card the stage did not write (a user's own, or one edited since) is
never replaced. :func:`checkpoint_state` says how far a checkpoint's training got, for the caption command.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from clid.base.files import DataError, foreign_entries, read_json
from clid.base.text import load_tokenizer
from clid.model.captioner import Captioner, CaptionerConfig

# ---------------------------------------------------------------------------------------------
# Checkpoints: model.safetensors + config.json + tokenizer files (+ training state)


def save_model(model: Captioner, folder, extra_config: dict | None = None) -> None:
    """Write the model, its config and its tokenizer into ``folder`` (which must be new or a staging dir)."""
    from safetensors.torch import save_model as save_safetensors

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_safetensors(model, str(folder / "model.safetensors"),
                     metadata={CONFIG_METADATA: json.dumps(model.config.to_json(), sort_keys=True)})
    config = {"model": model.config.to_json(), **(extra_config or {})}
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    model.tokenizer.save_pretrained(str(folder))


def feature_record(store) -> dict:
    """``feature_kind`` and ``feature_dim`` of the features file a model is trained on, for its
    config.json (the kind is None for a file that does not record it)."""
    return {"feature_kind": store.kind, "feature_dim": store.feature_dim()}


MISSING_HINT = "`make checkpoint` trains a quick one in runs/quick/model; 04 and 06 train the others"


def read_config(folder) -> dict:
    """A checkpoint's config.json; a damaged one is one DataError naming it."""
    path = Path(folder) / "config.json"
    if not Path(folder).exists():
        raise DataError(folder, None, f"no such checkpoint folder ({MISSING_HINT})")
    if not path.is_file() or not (Path(folder) / "model.safetensors").is_file():
        raise DataError(None, None, f"{folder} is not a checkpoint (needs config.json and model.safetensors)")
    saved = read_json(path)
    if not isinstance(saved, dict) or not isinstance(saved.get("model"), dict):
        raise DataError(path, None, "not a checkpoint config (no 'model' object)")
    return saved


def load_weights(model: nn.Module, path, device="cpu") -> None:
    """Load a ``model.safetensors`` into ``model``; a damaged file or one of another model is one DataError."""
    from safetensors.torch import load_model as load_safetensors

    from clid.base.files import DataError

    try:
        load_safetensors(model, str(path), device=str(device))
    except Exception as err:  # safetensors raises its own error types, torch a RuntimeError on shapes
        message = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
        raise DataError(path, None, f"cannot load these weights into the model of config.json ({message})") from None


# the model config the weights were trained with, kept in model.safetensors' metadata: what config.json
# must agree with (num_heads or layer_norm_eps cannot be read from the weights' shapes)
CONFIG_METADATA = "clid_model_config"
# config fields that do not change what the weights compute (dropout: not at inference)
NOT_COMPUTED = ("preset", "init_from", "tokenizer", "dropout")


def check_config_matches_weights(config: CaptionerConfig, weights) -> None:
    """Refuse a config.json that differs from the config the weights were saved with (kept in the
    file's metadata; a checkpoint written before that was kept is not checked)."""
    from safetensors import safe_open

    try:
        with safe_open(str(weights), "pt") as f:
            saved = (f.metadata() or {}).get(CONFIG_METADATA)
    except Exception:  # a damaged file: load_weights says so
        return
    if saved is None:
        return
    try:
        saved = json.loads(saved)
    except ValueError:
        raise DataError(weights, None, f"its metadata '{CONFIG_METADATA}' is not valid JSON: a damaged checkpoint") from None
    ours = config.to_json()
    differ = [name for name in sorted(set(saved) | set(ours)) if name not in NOT_COMPUTED
              and json.dumps(saved.get(name)) != json.dumps(ours.get(name))]
    if differ:
        shown = "; ".join(f"{name} {ours.get(name)!r} in config.json, {saved.get(name)!r} in the weights"
                          for name in differ[:3])
        raise DataError(Path(weights).with_name("config.json"), None,
                        f"does not describe the weights it sits beside ({shown}): the weights would compute other "
                        "numbers; restore the checkpoint's own config.json")


def saved_config(folder) -> CaptionerConfig:
    """The model config of a checkpoint's config.json; a damaged one is one DataError."""
    saved = read_config(folder)
    try:
        return CaptionerConfig.from_json(saved["model"])
    except (KeyError, TypeError, ValueError) as err:
        raise DataError(Path(folder) / "config.json", None, f"not a model config ({type(err).__name__}: {err})") from None


def load_checkpoint(folder, device="cpu") -> Captioner:
    """Rebuild the model and its tokenizer from a checkpoint folder (no pickle involved)."""
    folder = Path(folder)
    config = saved_config(folder)
    check_config_matches_weights(config, folder / "model.safetensors")
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


# files a training stage writes into --out beside its checkpoint, and the checkpoint's own files (the model card,
# CARD_NAME, is the stage's only while it is the card it wrote: :func:`own_card`)
STAGE_FILES = ("selection_log.jsonl", "difficulty.h5")
CARD_NAME = "MODEL_CARD.md"


CHECKPOINT_NAMES = ("model.safetensors", "config.json", "optimizer.pt", "train_state.json", "train_log.jsonl",
                    "vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def checkpoint_files(folder) -> set[str]:
    """The names of the files a training stage wrote into ``folder``: the checkpoint's manifest (for a
    checkpoint written before manifests, the files beside its train_state.json that have a checkpoint
    file's name), STAGE_FILES, and the model card when the stage wrote it as it is (:func:`own_card`)."""
    folder = Path(folder)
    own = set(STAGE_FILES) | ({CARD_NAME} if own_card(folder / CARD_NAME) else set())
    state_path = folder / "train_state.json"
    if state_path.is_file():
        try:
            files = json.loads(state_path.read_text(encoding="utf-8")).get("files")
        except (ValueError, AttributeError):
            files = None
        if isinstance(files, list):
            own.update(str(name) for name in files if name != CARD_NAME)
        else:  # (a checkpoint written before manifests: the names a checkpoint has, nothing else)
            own.update(item.name for item in folder.iterdir() if item.is_file() and item.name in CHECKPOINT_NAMES)
    return own


def own_card(path) -> bool:
    """Whether the file at ``path`` is a model card a training stage wrote, unedited since: its last line holds
    the digest of the lines above it (a card of an earlier version, without that line, counts when it begins
    with the cards' title and names the stage that wrote it)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    body, _, last = text.rstrip("\n").rpartition("\n")
    if last.startswith(CARD_DIGEST):
        return last == card_digest_line(body + "\n")
    return text.startswith(CARD_TITLE) and "\nWritten by 0" in text and CARD_DIGEST.strip() not in text



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
    own = checkpoint_files(folder)
    foreign = foreign_entries(folder, own)
    try:
        save_model(model, staging, config_extra)
        torch.save(optimizer.state_dict(), staging / "optimizer.pt")
        previous_log = folder / "train_log.jsonl"
        lines = (previous_log.read_text().splitlines() if previous_log.exists() else []) + log_lines
        (staging / "train_log.jsonl").write_text("".join(line + "\n" for line in lines))
        if CARD_NAME in own or not (folder / CARD_NAME).exists():
            (staging / CARD_NAME).write_text(model_card_text(staging, folder.name, state), encoding="utf-8")
        else:
            note_users_card(folder / CARD_NAME)
        keep = [item for item in folder.iterdir() if item.is_file() and item.name in own
                and item.name != "train_state.json" and not (staging / item.name).exists()] if folder.is_dir() else []
        files = sorted({item.name for item in staging.iterdir()} | {item.name for item in keep} | {"train_state.json"})
        (staging / "train_state.json").write_text(json.dumps({**state, "files": files}, indent=1))
        if not foreign:
            for item in keep:  # files the stage keeps there (e.g. selection_log.jsonl)
                shutil.copy2(item, staging / item.name)
    except Exception as err:  # a full disk: OSError, safetensors' SafetensorError, torch's RuntimeError
        shutil.rmtree(staging, ignore_errors=True)
        kept = f"the last checkpoint in {folder} (step {read_train_state(folder)['step']}) is kept" \
            if (folder / "train_state.json").exists() else "no checkpoint was written"
        message = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
        raise DataError(None, None, f"cannot write the checkpoint into {folder} ({message}: is the disk full?); "
                                    f"{kept}") from None
    if foreign:
        if clash := sorted(set(os.listdir(staging)) & set(foreign)):
            shutil.rmtree(staging, ignore_errors=True)
            raise DataError(None, None, f"{folder / clash[0]} was not written by this stage and the checkpoint would "
                                        "replace it: give another --out")
        for name in sorted(n for n in os.listdir(staging) if n != "train_state.json") + ["train_state.json"]:
            os.replace(staging / name, folder / name)
        staging.rmdir()
        return
    if folder.exists():
        shutil.rmtree(old, ignore_errors=True)
        folder.rename(old)
    staging.rename(folder)
    shutil.rmtree(old, ignore_errors=True)


def restore(folder, model: Captioner, optimizer) -> dict:
    """Load weights and optimizer state of a checkpoint into existing objects; return its state."""

    folder = Path(folder)
    state = read_train_state(folder)
    for config in (saved_config(folder), model.config):  # the folder's config.json, and this run's
        check_config_matches_weights(config, folder / "model.safetensors")
    load_weights(model, folder / "model.safetensors", str(next(model.parameters()).device))
    try:
        optimizer.load_state_dict(torch.load(folder / "optimizer.pt", weights_only=True))
    except Exception as err:  # torch raises many kinds for a damaged file
        raise DataError(folder / "optimizer.pt", None, f"cannot load the optimizer state ({type(err).__name__}: "
                                                        f"{str(err).splitlines()[0][:200]}); remove the checkpoint "
                                                        "or give --restart") from None
    return state


def check_same_levels(flag: str, folder, theirs, ours) -> None:
    """A DataError when a checkpoint we start from was trained on other length levels."""
    from clid.base.text import get_levels, level_set_name

    if get_levels(theirs) != get_levels(ours):
        raise DataError(None, None, f"{flag} {folder} was trained with levels {level_set_name(theirs)}, "
                                    f"not this run's --levels {level_set_name(ours)}")


def load_init_weights(model: Captioner, folder, flag: str = "--init-from") -> None:
    """Copy the weights of another checkpoint (``--init-from``, ``--continue-from``); configs must match."""
    source = load_checkpoint(folder)
    check_same_levels(flag, folder, source.config.levels, model.config.levels)
    if source.config.to_json() | {"init_from": None, "preset": None} != model.config.to_json() | {"init_from": None, "preset": None}:
        raise DataError(None, None, f"{flag} {folder}: its model config differs from this run's")
    model.load_state_dict(source.state_dict())


def remove_checkpoint(folder) -> None:
    """Delete the stage's own files in ``folder`` (and the folder, if nothing else is left in it)."""
    folder = Path(folder)
    for name in checkpoint_files(folder):
        (folder / name).unlink(missing_ok=True)
    if not any(folder.iterdir()):
        folder.rmdir()


# ---------------------------------------------------------------------------------------------
# The model card written beside the checkpoint at every save, and how far a checkpoint's training got


CARD_TITLE = "# Model card:"
CARD_DIGEST = "<!-- written by a CLID training stage; sha256 "  # the card's last line: the digest of the lines above
_NOTED_CARDS: set[str] = set()  # the users' cards already named in this process


def card_digest_line(body: str) -> str:
    return f"{CARD_DIGEST}{hashlib.sha256(body.encode('utf-8')).hexdigest()} -->"


def note_users_card(card: Path) -> None:
    """Say once per process that ``card`` is kept as it is (a file the stage did not write, or edited since)."""
    if str(card.resolve()) not in _NOTED_CARDS:
        _NOTED_CARDS.add(str(card.resolve()))
        print(f"note: {card} was not written by a training stage (or was edited since): it is kept, and the model "
              "card is not written", flush=True)


def planned_steps(config: dict, state: dict | None = None) -> int | None:
    """The last step of the run that trains a checkpoint: its training state's ``planned_steps``, else its
    config.json's ``train.max_steps`` (04, 06); None when neither records it."""
    train = config.get("train") if isinstance(config.get("train"), dict) else {}
    for value in ((state or {}).get("planned_steps"), train.get("max_steps")):
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def steps_done(step: int, planned: int | None) -> str:
    """"step 711 of 2,000: unfinished", "step 2,000 of 2,000: finished" (or "step 711" alone)."""
    if planned is None:
        return f"step {step:,}"
    return f"step {step:,} of {planned:,}: " + ("finished" if step >= planned else "unfinished")


def model_card_text(folder, name: str, state: dict) -> str:
    """The text of ``MODEL_CARD.md`` for the checkpoint in ``folder`` (named ``name``: a save writes it into its
    staging folder) with the training ``state`` (its ``step``): the data, the recipe, the steps trained (unfinished below the run's last step),
    the control precision measured during training (if any), and what the model cannot do. Every figure is read
    from the folder's own files; the last line is the digest that marks the card as the stage's own."""
    from clid.base.text import get_levels

    folder = Path(folder)
    config = read_config(folder)
    train = config.get("train", {}) if isinstance(config.get("train"), dict) else {}
    model = config["model"]
    stage = str(config.get("stage") or "a training stage")
    stage = stage if stage.endswith(".py") or " " in stage else f"{stage}.py"
    step, planned = state["step"], planned_steps(config, state)
    finished = planned is None or step >= planned
    levels = get_levels([tuple(level) for level in model.get("levels")]) if model.get("levels") else get_levels("caption")
    evals = []
    log = folder / "train_log.jsonl"
    for line in log.read_text().splitlines() if log.is_file() else []:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("eval"), dict):
            evals.append(record)

    def flag(key, default="-"):
        value = train.get(key)
        return default if value in (None, "", []) else value

    written = (f"Written by {stage} at {steps_done(step, planned)}: training stopped or is still running, and this "
               "checkpoint is not the model the run trains (the same training command resumes it; "
               "`python -m clid.caption` warns about it)." if not finished else
               f"Written by {stage} when it finished training this checkpoint ({steps_done(step, planned)}).")
    data = {"trusted": "the trusted captions alone", "extended": "the trusted and the self-generated captions"}
    lines = [f"{CARD_TITLE} {name}", "",
             f"**{steps_done(step, planned)}**" if planned is not None else f"**step {step:,}**", "",
             written + " Every figure comes from the files beside it.",
             "", "## Model", "",
             f"- A length-controllable captioner (LaBERT-style non-autoregressive BERT), preset `{flag('preset', model.get('preset', '-'))}`, "
             f"{len(levels)} length levels: " + ", ".join(f"L{n} {low}-{high}" for n, (low, high) in enumerate(levels, 1))
             + " tokens.",
             f"- Region features: `{config.get('feature_kind') or 'unrecorded kind'}`, {config.get('feature_dim', model.get('region_dim'))} "
             "dimensions; it reads those alone.", "", "## Data", "",
             f"- Captions: `{flag('captions')}`" + (f"; self-generated: `{flag('selfgen')}`" if flag("selfgen") != "-" else ""),
             f"- Trained on: {data.get(flag('data'), flag('data'))}" + (
                 f"; selected by 06 (strategy `{flag('strategy')}`, eta {flag('eta')})" if stage.startswith("06") else ""),
             f"- Features: `{flag('features')}`", "", "## Recipe", "",
             f"- `--recipe {flag('recipe', 'paper')}`: lr {flag('lr')}, warm-up {flag('warmup')}, batch {flag('batch_size')}, "
             f"dropout {flag('dropout')}, seed {flag('seed')}",
             f"- Steps trained: {step} of --max-steps {flag('max_steps')}" + ("" if finished else " (unfinished)")
             + (f" (continued from `{flag('continue_from')}`)" if flag("continue_from") != "-" else ""), "",
             "## Measured control precision", ""]
    if evals:
        last = evals[-1]
        shares = {k: v for k, v in last["eval"].items() if isinstance(v, (int, float))}
        lines.append(f"- At step {last.get('step')}, on the validation images (authors' decoding): "
                     + ", ".join(f"L{k} {100 * v:.0f}%" for k, v in shares.items()))
    else:
        lines.append("- Not measured while training (--eval-every 0). Measure it with `python 07_eval.py --checkpoint "
                     f"{name} --features FEATURES --refs CAPTIONS --out eval`; the demo's quick checkpoint: "
                     "docs/decoding.md.")
    lines += ["", "## What it cannot do", "",
              "- Describe what its training images did not show: a model trained on the demo world knows its "
              "flat-drawn objects and colours alone, and on a photograph writes a caption of about the right length "
              "that seldom says what it shows.",
              f"- Write beyond its last level ({levels[-1][1]} tokens), or read features of another kind or dimension.",
              "- Avoid repeated phrases by itself: mask-predict decoding repeats words; `python -m clid.caption` and "
              "`CaptionWriter` block a repeated 3-gram by default (`--block-ngram 0`: the authors' decoding).",
              "- Guarantee a length at a level: the control precision above is a share, not a promise, and a caption "
              "can end mid-phrase when its level is longer than what the model has to say (`--length N` asks for "
              "exactly N tokens).", ""]
    body = "\n".join(lines)
    return body + card_digest_line(body) + "\n"


def write_model_card(folder, stage: str | None = None) -> Path:
    """(Re)write ``MODEL_CARD.md`` of the checkpoint in ``folder`` from its own files (:func:`model_card_text`;
    every save writes it too), unless the folder holds a card the stage did not write, which is kept (one note).
    ``stage``: unused, the card names the stage its config.json records."""
    folder = Path(folder)
    card = folder / CARD_NAME
    if card.exists() and not own_card(card):  # a file of the user's, or a card edited since
        note_users_card(card)
        return card
    tmp = card.with_name(card.name + ".tmp")
    tmp.write_text(model_card_text(folder, folder.name, read_train_state(folder)), encoding="utf-8")
    os.replace(tmp, card)
    state_path = folder / "train_state.json"
    state = read_train_state(folder)
    if isinstance(state.get("files"), list) and card.name not in state["files"]:  # the manifest names it too
        state["files"] = sorted(state["files"] + [card.name])
        tmp = state_path.with_name(state_path.name + ".tmp")
        tmp.write_text(json.dumps(state, indent=1))
        os.replace(tmp, state_path)
    return card


@dataclass(frozen=True)
class CheckpointState:
    """How far the training of a checkpoint folder got: ``step`` (None: a model saved without a training state),
    ``planned`` (the run's last step; None: not recorded) and ``card`` (a model card the stage wrote is there).
    It is ``unfinished`` below its run's last step, or, when that is not recorded, without a model card (an
    earlier version wrote the card when training finished)."""

    folder: str
    step: int | None
    planned: int | None
    card: bool

    @property
    def unfinished(self) -> bool:
        if self.step is None:
            return False
        return self.step < self.planned if self.planned is not None else not self.card

    def describe(self) -> str:
        """"step 711 of 2,000: unfinished", or "step 711: unfinished (no model card)"."""
        if self.step is None:
            return "no training state"
        if self.planned is None:
            return f"step {self.step:,}: " + ("unfinished (no model card)" if self.unfinished else "finished")
        return steps_done(self.step, self.planned)

    def warning(self, name: str | None = None) -> str:
        """The one line the caption command prints for an unfinished checkpoint, naming it ``name`` (default: its
        folder as given; a page names it relative to itself)."""
        steps = f"step {self.step:,} of {self.planned:,}" if self.planned is not None else \
            f"step {self.step:,} and no model card"
        parts = Path(self.folder).resolve().parts
        resume = "`make checkpoint` resumes it" if parts[-3:] == ("runs", "quick", "model") else \
            "the same training command resumes it"
        return f"{self.folder if name is None else name} is unfinished: {steps}; {resume}"

    def to_json(self) -> dict:
        """For a captions file's run record: ``{"step", "planned_steps", "unfinished"}``."""
        return {"step": self.step, "planned_steps": self.planned, "unfinished": self.unfinished}


def checkpoint_state(folder) -> CheckpointState:
    """How far the training of the checkpoint in ``folder`` got (its train_state.json and config.json; an
    unreadable training state is read as none: it does not change what the model computes)."""
    folder = Path(folder)
    state = config = None
    try:
        state = json.loads((folder / "train_state.json").read_text(encoding="utf-8"))
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        pass
    step = state.get("step") if isinstance(state, dict) else None
    if not isinstance(step, int) or isinstance(step, bool):
        return CheckpointState(str(folder), None, None, False)
    planned = planned_steps(config if isinstance(config, dict) else {}, state)
    return CheckpointState(str(folder), step, planned, own_card(folder / CARD_NAME))
