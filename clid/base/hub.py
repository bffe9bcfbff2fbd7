"""Models loaded by a hub name or from a folder: why one cannot load, in a few words of one line.

The hub libraries' own errors span lines and, offline, ask the user to check an internet connection that
the project itself turned off (clid.run.cli.stay_offline); :func:`load_problem` says instead whether the
folder is missing or empty, or the name is not on disk in an offline run.
"""
from __future__ import annotations

import os
import re
from pathlib import Path


def is_local(name: str) -> bool:
    """Whether ``name`` is meant as a folder on disk rather than a hub name ("org/model")."""
    return Path(name).expanduser().exists() or name.startswith(("/", ".", "~")) or name.count("/") > 1


def is_offline() -> bool:
    """Whether this process runs offline (clid.run.cli.stay_offline, or the user's own ``HF_HUB_OFFLINE``),
    read as the hub library reads it."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.upper() in ("1", "ON", "YES", "TRUE")


def load_problem(name: str, err: BaseException) -> str:
    """Why the model or tokenizer ``name`` did not load (``err``: what the hub library raised), one line."""
    path = Path(name).expanduser()
    if is_local(name):
        if not path.exists():
            return f"not found: there is no folder {name}"
        if not path.is_dir():
            return f"{name} is a file, not a model folder"
        if not any(path.iterdir()):
            return f"the folder {name} is empty"
        if not (path / "config.json").exists() and not (path / "tokenizer.json").exists() and not (path / "vocab.txt").exists():
            return f"the folder {name} holds no model (no config.json, tokenizer.json or vocab.txt)"
    elif is_offline():
        return "not on disk, and this run is offline"
    text = " ".join(str(err).split()) or type(err).__name__
    text = re.sub(r"\s*Check your internet connection[^.]*\.?", "", text, flags=re.IGNORECASE)
    return text[:200]
