"""The token cache: a JSONL caption file's tokenised table (:class:`clid.data.examples.Examples`), kept beside
it as ``FILE.tokens-LEVELS.npz`` when 04, 05 or 06 run with ``--token-cache``, and read instead of the file
by the next run.

A cache is used only when its key matches: the file's content (a BLAKE2b digest of its bytes), the tokenizer
(a digest of its vocabulary and rules) and the level set. A cache that does not match, or that is
unreadable (truncated, corrupt, arrays that do not fit together), is rebuilt, with one line saying why.
It is written to a temporary file with a unique name and renamed into place, so concurrent runs (SLURM
array tasks that share the file) each write a whole cache and readers never see a partial one. The file
holds plain arrays only (``numpy.load(allow_pickle=False)``); a folder that cannot be written to leaves
the run without a cache, with one line.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from clid.base.text import get_levels, level_set_name

FORMAT = 1


def cache_path(path, levels) -> Path:
    """Where the cache of the caption file ``path`` for the level set ``levels`` is kept."""
    name = level_set_name(levels)
    if name.startswith("["):  # levels given explicitly: a short digest of them
        name = "levels-" + hashlib.blake2b(name.encode(), digest_size=4).hexdigest()
    path = Path(path)
    return path.with_name(f"{path.name}.tokens-{name}.npz")


def tokenizer_digest(tokenizer) -> str:
    """A digest of what turns a word into token ids: the vocabulary and, for a fast tokenizer, its rules."""
    digest = getattr(tokenizer, "_clid_digest", None)
    if digest is None:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is not None:
            spec = json.loads(backend.to_str())
            text = json.dumps({k: spec.get(k) for k in ("normalizer", "pre_tokenizer", "model")}, sort_keys=True)
        else:
            text = json.dumps(sorted(tokenizer.get_vocab().items())) + type(tokenizer).__name__
        digest = tokenizer._clid_digest = hashlib.blake2b(text.encode(), digest_size=16).hexdigest()
    return digest


def file_digest(path) -> str:
    digest = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


def cache_key(path, tokenizer, levels) -> dict:
    """What a cache of ``path`` must have been built from."""
    return {"format": FORMAT, "content": file_digest(path), "tokenizer": tokenizer_digest(tokenizer),
            "levels": [list(level) for level in get_levels(levels)]}


def _text_array(value) -> np.ndarray:
    return np.frombuffer(json.dumps(value).encode(), dtype=np.uint8)


def _from_text(array: np.ndarray):
    return json.loads(array.tobytes().decode())


def save(path, key: dict, table, id_fault) -> None:
    """Keep ``table`` (and the first id fault of the file, or None) beside ``path`` under ``key``."""
    target = cache_path(path, key["levels"])
    names = list(dict.fromkeys(table.image_ids))
    index = {name: k for k, name in enumerate(names)}
    header = {**key, "captions": len(table), "tokens": int(len(table.token_ids)), "id_fault": id_fault}
    arrays = {"header": _text_array(header), "token_ids": table.token_ids, "offsets": table.offsets,
              "digests": table.digests, "caption_ids": _text_array(table.caption_ids), "images": _text_array(names),
              "image_index": np.fromiter((index[i] for i in table.image_ids), dtype=np.int32, count=len(table))}
    tmp = None
    try:
        with tempfile.NamedTemporaryFile(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp",
                                         delete=False) as f:
            tmp = Path(f.name)
            np.savez(f, **arrays)
        os.replace(tmp, target)
    except OSError as err:
        print(f"note: cannot keep the token cache {target} ({err.strerror or err}); going on without it", flush=True)
    finally:
        if tmp is not None and tmp.exists():
            tmp.unlink()


def load(path, key: dict, vocab_size: int):
    """(table, id fault) from the cache of ``path`` built under ``key``, or None (no cache, or one that is
    stale or unreadable: then one line says so, and the caller rebuilds it)."""
    from clid.data.examples import Examples

    target = cache_path(path, key["levels"])
    try:
        if not target.exists():
            return None
    except OSError:  # (a name too long for the file system: save() says the run goes on without a cache)
        return None
    try:
        with np.load(target, allow_pickle=False) as data:
            header = _from_text(data["header"])
            why = next((what for field, what in (("format", "an older format"), ("content", "other content of the file"),
                                                 ("tokenizer", "another tokenizer"), ("levels", "other levels"))
                        if header.get(field) != key[field]), None)
            if why:
                print(f"note: {target}: the token cache was built from {why}; rebuilding it", flush=True)
                return None
            token_ids, offsets, digests = data["token_ids"], data["offsets"], data["digests"]
            caption_ids, names, image_index = _from_text(data["caption_ids"]), _from_text(data["images"]), data["image_index"]
    except (OSError, ValueError, KeyError, EOFError, UnicodeDecodeError, zipfile.BadZipFile) as err:
        print(f"note: {target}: the token cache is unreadable ({type(err).__name__}: {str(err)[:120]}); rebuilding it",
              flush=True)
        return None
    n = header.get("captions")
    problem = problem_of(n, header.get("tokens"), token_ids, offsets, digests, caption_ids, names, image_index, vocab_size)
    if problem:
        print(f"note: {target}: the token cache is corrupt ({problem}); rebuilding it", flush=True)
        return None
    image_ids = [names[k] for k in image_index.tolist()]
    table = Examples(image_ids, caption_ids, token_ids, offsets, np.zeros(n, np.int64), ["selfgen"] * n, digests)
    fault = header.get("id_fault")
    return table, (tuple(fault) if fault else None)


def problem_of(n, n_tokens, token_ids, offsets, digests, caption_ids, names, image_index, vocab_size) -> str | None:
    """What does not fit together in a cache's arrays, or None."""
    if not isinstance(n, int) or not isinstance(n_tokens, int):
        return "no caption or token count"
    shapes = {"token_ids": (token_ids, np.int32, n_tokens), "offsets": (offsets, np.int64, n + 1),
              "digests": (digests, np.uint64, n), "image_index": (image_index, np.int32, n)}
    for name, (array, dtype, length) in shapes.items():
        if array.dtype != dtype or array.shape != (length,):
            return f"{name} is {array.dtype} {array.shape}, not {np.dtype(dtype)} ({length},)"
    if not isinstance(caption_ids, list) or len(caption_ids) != n or not all(isinstance(c, str) for c in caption_ids):
        return "the caption ids do not match the count"
    if not isinstance(names, list) or not all(isinstance(c, str) for c in names):
        return "the image names are not strings"
    if offsets[0] != 0 or offsets[-1] != n_tokens or (n and np.diff(offsets).min() < 1):
        return "the offsets do not cut the tokens into captions"
    if n_tokens and (token_ids.min() < 0 or token_ids.max() >= vocab_size):
        return "a token id outside the vocabulary"
    if n and (image_index.min() < 0 or image_index.max() >= len(names)):
        return "an image index outside the image names"
    return None
