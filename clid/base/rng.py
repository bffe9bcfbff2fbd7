"""Randomness keyed by (seed, item id), so an item's draws do not depend on sharding or order.

    rng = item_rng(seed, image_id)          # numpy Generator
    rng = item_rng(seed, image_id, "walk")  # an independent stream for another purpose
"""
from __future__ import annotations

import hashlib

import numpy as np


def item_seed(seed: int, *keys) -> int:
    """A 64-bit integer derived from the seed and the keys (stable across runs and machines)."""
    text = "\x1f".join([str(int(seed))] + [str(k) for k in keys])
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def item_rng(seed: int, *keys) -> np.random.Generator:
    return np.random.default_rng(item_seed(seed, *keys))
