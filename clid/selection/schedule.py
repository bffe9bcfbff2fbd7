"""CLID's schedule (the paper, Sec. 3.3): the plan of 06's ``clid`` and ``none`` strategies, fixed before training.

Iteration i draws floor((100 - c i)%) of the self-generated pool without replacement, proportionally to
f(u) = 0.5 (1 + tanh((u - T_i) / s)), T_i the (c i)-th percentile of u (:func:`draw`, with the compiled
kernels of :mod:`clid.ops.sampler`; :mod:`clid.selection.reference` is the same draw in NumPy); eta steps per
iteration; trusted captions only once c i reaches 100. ``--schedule constant`` (uniform draws) and ``hard``
(s -> 0) are the paper's ablations. A round's batches are shuffled epochs over its set, keyed by (seed, round),
so a resumed run draws exactly the same batches.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch

from clid.base.files import DataError, atomic_path

# ---------------------------------------------------------------------------------------------
# What a strategy works on


@dataclass
class Pool:
    """The examples 06 trains on: ``n_trusted`` trusted captions, then the self-generated pool."""

    image_ids: list[str]  # per example
    caption_ids: list[str]  # per example
    n_trusted: int
    lengths: np.ndarray  # tokens of each pool caption
    levels: np.ndarray  # level of each pool caption (1-based)
    num_levels: int

    @property
    def size(self) -> int:
        return len(self.image_ids)


@dataclass
class Round:
    """Steps [start, end) trained on ``members`` (example indices, possibly repeated)."""

    key: tuple  # keys the round's shuffles
    start: int
    end: int
    members: np.ndarray
    description: str
    state: dict = field(default_factory=dict)  # saved with the checkpoints of this round


def digest(indices: np.ndarray) -> str:
    return hashlib.sha1(np.asarray(indices, dtype=np.int64).tobytes()).hexdigest()[:16]


def write_log(out: Path, rows: list[dict]) -> None:
    """OUT/selection_log.jsonl, one line per round (written whole, atomically)."""
    import json

    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / "selection_log.jsonl") as tmp:
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))


# ---------------------------------------------------------------------------------------------
# clid (and none): a plan fixed before training


def draw(u: torch.Tensor, iteration: int, args) -> tuple[np.ndarray, float]:
    """Indices into the pool drawn at ``iteration``, and the threshold T_i."""
    from clid import ops

    M = len(u)
    percent = args.c * iteration
    k = math.floor(M * (100.0 - percent) / 100.0 + 1e-9)  # the authors' int(M * (1 - c*i/100))
    threshold = float(ops.percentile_threshold(u, percent)) if M else 0.0
    if args.schedule == "constant":  # every caption equally likely: a uniform draw of k
        indices = ops.smoothstep_sample(torch.zeros_like(u), 0.0, 1.0, k, args.seed, iteration)
    else:
        s = 0.0 if args.schedule == "hard" else args.s
        indices = ops.smoothstep_sample(u, threshold, s, k, args.seed, iteration)
    return indices.cpu().numpy(), threshold


def make_plan(u: torch.Tensor, n_trusted: int, selfgen_lengths: np.ndarray, selfgen_levels: np.ndarray,
              num_levels: int, args) -> list[dict]:
    """CLID's plan: one entry per iteration with its threshold, draw size and statistics, and its steps."""
    plan, step, iteration = [], 0, 0
    if args.schedule == "none" or args.strategy == "none":  # the whole extended set, no selection
        return [{"iteration": 0, "start": 0, "end": args.max_steps, "threshold": None,
                 "drawn": int(len(u)), "pool": int(len(u)), "digest": "all"}]
    while args.c * iteration < 100 and step < args.max_steps and len(u):
        indices, threshold = draw(u, iteration, args)
        size = n_trusted + len(indices)
        steps = math.ceil(size / args.batch_size) if args.full_epochs else args.eta
        histogram = np.bincount(selfgen_levels[indices], minlength=num_levels + 1)[1:]
        plan.append({"iteration": iteration, "start": step, "end": min(step + steps, args.max_steps),
                     "threshold": threshold, "drawn": int(len(indices)), "pool": int(len(u)),
                     "mean_length": round(float(selfgen_lengths[indices].mean()), 3) if len(indices) else None,
                     "mean_u": round(float(u[indices].mean()), 4) if len(indices) else None,
                     "levels": histogram.tolist(), "digest": digest(indices)})
        step += steps
        iteration += 1
    if step < args.max_steps:
        plan.append({"iteration": iteration, "start": step, "end": args.max_steps, "threshold": None,
                     "drawn": 0, "pool": int(len(u)), "trusted_only": True, "digest": "none"})
    return plan


def scores_for(caption_ids: list[str], quality_path, digests=None, selfgen_path=None, captions_path=None) -> torch.Tensor:
    """u of every caption id, in the order of ``caption_ids`` (a missing or non-finite score is an error).

    ``digests`` (of each caption's text, :func:`clid.data.examples.text_digest`) are checked against those 05
    recorded: a caption whose text differs from the one scored is refused, naming it and its file
    (``selfgen_path``, or ``captions_path`` for a trusted caption, ``trusted:ID``). A quality file from before
    05 recorded them is taken with a warning.
    """
    import sys

    from clid.base.files import read_quality

    q = read_quality(quality_path)
    row_of = {c: k for k, c in enumerate(q["id"])}
    missing = [c for c in caption_ids if c not in row_of]
    if missing:
        trusted = missing[0].startswith("trusted:")
        raise DataError(quality_path, None, f"{len(missing)} {'trusted' if trusted else 'self-generated'} captions "
                                            f"have no quality score (first: {missing[0]}); run 05 on the same captions"
                                            + (" with --include-trusted" if trusted else ""))
    rows = np.fromiter((row_of[c] for c in caption_ids), dtype=np.int64, count=len(caption_ids))
    if digests is not None and "text_digest" not in q:
        print(f"warning: {quality_path} records no digest of the captions it scored (written before 05 recorded "
              "them): it cannot be checked that it scored these captions; run 05 again to have them checked",
              file=sys.stderr)
    elif digests is not None and (differ := np.flatnonzero(q["text_digest"][rows] != np.asarray(digests))).size:
        first = caption_ids[differ[0]]
        path = captions_path if first.startswith("trusted:") else selfgen_path
        raise DataError(path or quality_path, f"caption {first}",
                        f"its text is not the one {quality_path} scored ({len(differ)} of {len(caption_ids)} captions "
                        "differ): the scores belong to other captions; run 05 again on these captions")
    u = q["u"][rows].astype(np.float32)
    bad = ~np.isfinite(u)  # NaN or +-inf: no threshold or weight can be computed from it
    if bad.any():
        first = int(bad.argmax())
        raise DataError(quality_path, f"caption {caption_ids[first]}",
                        f"u is {u[first]} ({int(bad.sum())} of the {len(u)} scores are not finite)")
    return torch.from_numpy(u)


class Schedule:
    """``clid`` and ``none``: the plan is fixed before training (:func:`make_plan`)."""

    def __init__(self, pool: Pool, u: torch.Tensor | None, args):
        self.pool, self.args = pool, args
        self.u = u if u is not None else torch.zeros(pool.size - pool.n_trusted)
        self.plan = make_plan(self.u, pool.n_trusted, pool.lengths, pool.levels, pool.num_levels, args)

    def summary(self) -> list[str]:
        if self.plan[0]["digest"] == "all":
            return [f"plan: the whole extended set ({self.pool.size} captions) for every step"]
        last = self.plan[-1]
        return [f"plan: {sum(1 for p in self.plan if p['drawn'])} selection iterations, then trusted only from step "
                f"{last['start'] if last.get('trusted_only') else self.args.max_steps}"]

    def log_rows(self) -> list[dict]:
        return self.plan

    def members(self, entry: dict) -> np.ndarray:
        """The trusted captions plus the iteration's draw (drawn again and checked against the plan)."""
        n_trusted = self.pool.n_trusted
        if entry["digest"] == "all":
            return np.arange(self.pool.size)
        if not entry["drawn"]:
            return np.arange(n_trusted)
        drawn, _ = draw(self.u, entry["iteration"], self.args)
        assert digest(drawn) == entry["digest"], "the draw is not reproducible"
        return np.concatenate([np.arange(n_trusted), n_trusted + drawn])

    def rounds(self, step: int, state: dict) -> Iterator[Round]:
        for entry in self.plan:
            if step >= entry["end"]:
                continue
            text = (f"iteration {entry['iteration']}: T={entry['threshold']}, drawn {entry['drawn']} of "
                    f"{entry['pool']}, mean length {entry.get('mean_length')}, levels {entry.get('levels')}, "
                    f"steps {entry['start']}-{entry['end']}")
            yield Round(("iter", entry["iteration"]), entry["start"], entry["end"], self.members(entry), text,
                        {"iteration": entry["iteration"]})


def prepared_ahead(rounds: Iterator[Round], prepare: Callable[[Round], object]) -> Iterator[Round]:
    """The rounds of a plan fixed before training (:class:`Schedule`), each one made (its captions drawn) and
    ``prepare``d (e.g. its first epoch shuffled) in a background thread while the round before it trains, so
    that a round change costs the training loop nothing (numpy's shuffle and the draw release the GIL)."""
    from concurrent.futures import ThreadPoolExecutor

    def make() -> Round | None:
        rnd = next(rounds, None)
        if rnd is not None:
            prepare(rnd)
        return rnd

    with ThreadPoolExecutor(1) as pool:
        upcoming = pool.submit(make)
        while (rnd := upcoming.result()) is not None:
            upcoming = pool.submit(make)
            yield rnd
