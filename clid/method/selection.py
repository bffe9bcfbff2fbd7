"""Selection strategies of 06: which captions each optimizer step draws its batch from.

Every strategy trains the same model, for the same steps, with the same batch size and seed; they
differ only in the *training set* of each round: a set of example indices (the trusted captions
first, then the self-generated pool). A round's batches are shuffled epochs over its set, keyed by
(seed, round), so a resumed run draws exactly the same batches.

- ``clid`` (default): CLID's schedule (the paper, Sec. 3.3). Iteration i draws floor((100 - c i)%)
  of the pool without replacement, proportionally to f(u) = 0.5 (1 + tanh((u - T_i) / s)), T_i the
  (c i)-th percentile of u; eta steps per iteration; trusted captions only once c i reaches 100.
  ``--schedule constant`` (uniform draws) and ``hard`` (s -> 0) are the paper's ablations.
- ``loss-remove`` / ``loss-replacecap``: loss-based curation (Li et al., "The Role of Data Curation
  in Image Captioning", EACL 2024). The set starts as the whole extended set; every ``--curate-every``
  steps (their "epoch") the current model scores every sample of the current set (its loss: minus
  the length-normalised log-likelihood of Eq. 2, :func:`clid.method.scoring.caption_logprobs`) and
  flags the highest-loss ones: the top ``--curate-ratio`` (``round(N * ratio)``, their default 1%) or,
  with ``--curate-std K``, those above mean + K standard deviations (their ``--dynamic``, K = 2).
  REMOVE drops them for the rest of training; REPLACECAP puts in each flagged sample's place a caption
  of the same image drawn at random among those never flagged (it may already be in the set, as in
  their code), or keeps the sample when none is left, so the set keeps its size.
- ``curriculum``: Baby Step (Simi-CL, EMNLP 2022). Every example gets a difficulty (``--difficulty``:
  ``clip:DIR`` minus the CLIP image-text cosine similarity, ``bootstrap:CKPT`` the loss under a model
  trained on the trusted captions, ``u`` minus CLID's score); the examples sorted easiest first are cut
  into ``--buckets`` equal buckets; training starts on the first and adds the next after
  ``--patience`` evaluations in a row (every ``--curate-every`` steps) that do not improve the
  validation score (by more than ``--min-improvement``), the mean log-likelihood (Eq. 2) of the
  validation split's trusted captions.
- ``none``: the whole extended set for every step (the extended-only baseline trained as 06 trains).

The dynamic strategies keep what they decided (removed and replaced samples, evaluations) in the
checkpoint's training state, so a resumed run continues with the same set; ``selection_log.jsonl``
has one line per round.
"""
from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch

from clid.run.cli import non_negative_float, number, positive_float, positive_int
from clid.base.files import DataError, atomic_path

STRATEGIES = ("clid", "loss-remove", "loss-replacecap", "curriculum", "none")


# ---------------------------------------------------------------------------------------------
# Flags (06 adds them to its parser)


def add_strategy_args(p) -> None:
    """06's flags of the selection strategies (CLID's own flags stay in 06)."""
    p.add_argument("--strategy", choices=STRATEGIES, default="clid",
                   help="clid: CLID's schedule; loss-remove, loss-replacecap: loss-based curation; curriculum: Baby "
                        "Step over difficulty buckets; none: the whole extended set (see clid/method/selection.py)")
    p.add_argument("--curate-every", type=positive_int, default=None,
                   help="loss-*: steps between curations; curriculum: steps between validation evaluations "
                        "(default: --eta)")
    p.add_argument("--curate-ratio", type=number(float, low=0, high=1, low_open=True, high_open=True,
                                                 what="a share in (0, 1)"), default=0.01,
                   help="loss-*: share of the current training set flagged at each curation (their default 1%%)")
    p.add_argument("--curate-std", type=positive_float, default=None, metavar="K",
                   help="loss-*: flag instead the samples whose loss is above mean + K standard deviations "
                        "(their --dynamic: K = 2)")
    p.add_argument("--loss-mode", choices=("prefix", "pseudo", "onepass"), default="onepass",
                   help="how loss-*, curriculum's bootstrap difficulty and its validation score compute Eq. 2 "
                        "(clid/method/scoring.py); onepass: one pass per caption, as their loss is one pass")
    p.add_argument("--buckets", type=positive_int, default=5, help="curriculum: number of difficulty buckets (Simi-CL: 5 on COCO)")
    p.add_argument("--patience", type=positive_int, default=3,
                   help="curriculum: evaluations without a better validation score before the next bucket is added")
    p.add_argument("--min-improvement", type=non_negative_float, default=0.0,
                   help="curriculum: an evaluation improves on the best since the last added bucket only by more than "
                        "this (nats of mean log p)")
    p.add_argument("--difficulty", default=None, metavar="clip:DIR|bootstrap:CKPT|u",
                   help="curriculum: the difficulty of a caption: clip:DIR (a transformers CLIPModel folder, needs "
                        "--images), bootstrap:CKPT (its loss under a checkpoint trained on trusted captions), u (minus "
                        "CLID's score; the trusted captions need theirs: 05 --include-trusted)")
    p.add_argument("--images", default=None, help="curriculum with clip:DIR: the folder of the captions' images")


def check_strategy_args(p, args) -> None:
    """Refuse inconsistent strategy flags at parse time (``p.error``)."""
    if args.curate_every is None:
        args.curate_every = args.eta
    needs_quality = args.strategy == "clid" or (args.strategy == "curriculum" and args.difficulty == "u")
    if needs_quality and not args.quality:
        p.error(f"--strategy {args.strategy}{' --difficulty u' if args.strategy == 'curriculum' else ''} needs --quality")
    if args.strategy != "curriculum":
        return
    kind, _, where = (args.difficulty or "").partition(":")
    if args.difficulty is None:
        p.error("--strategy curriculum needs --difficulty clip:DIR, bootstrap:CKPT or u")
    if args.difficulty != "u" and (kind not in ("clip", "bootstrap") or not where):
        p.error(f"--difficulty must be clip:DIR, bootstrap:CKPT or u, not {args.difficulty!r}")
    if kind in ("clip", "bootstrap") and not Path(where).is_dir():
        p.error(f"--difficulty {args.difficulty}: {where} is not a folder")
    if kind == "clip" and not (args.images and Path(args.images).is_dir()):
        p.error("--difficulty clip:DIR needs --images, the folder of the captions' images")


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


# ---------------------------------------------------------------------------------------------
# loss-remove, loss-replacecap


def flag_high_loss(loss: np.ndarray, ratio: float | None = None, n_std: float | None = None) -> np.ndarray:
    """Positions of the flagged samples, highest loss first: the top ``round(N * ratio)`` by loss (ties:
    the earlier position first), or, with ``n_std``, every loss above mean + n_std * std (ddof 1)."""
    loss = np.asarray(loss, dtype=np.float64)
    order = np.argsort(-loss, kind="stable")
    if n_std is not None:
        if len(loss) < 2:
            return np.zeros(0, dtype=np.int64)
        cut = loss.mean() + n_std * loss.std(ddof=1)
        return order[loss[order] > cut]
    return order[:round(len(loss) * ratio)]


class LossCuration:
    """``loss-remove`` and ``loss-replacecap`` (see the module docstring).

    ``logp(indices)`` returns the current model's Eq. 2 for those examples. The state is the list of
    curations; the current set is rebuilt from it (:meth:`members`).
    """

    def __init__(self, pool: Pool, args, logp: Callable[[np.ndarray], np.ndarray], check=None):
        self.pool, self.args, self.logp, self.check = pool, args, logp, check
        self.replace = args.strategy == "loss-replacecap"
        self.history: list[dict] = []
        by_image: dict[str, list[int]] = {}
        for index, image_id in enumerate(pool.image_ids):
            by_image.setdefault(image_id, []).append(index)
        self.captions_of_image = by_image
        if not self.replace and args.curate_std is None:
            self.check_not_emptied()

    def check_not_emptied(self) -> None:
        """Refuse (one line) a ``--curate-ratio`` that removes every caption before ``--max-steps``: the sizes
        of the set after each curation are known in advance (``round(N * ratio)`` go each time)."""
        size, every, ratio = self.pool.size, self.args.curate_every, self.args.curate_ratio
        for step in range(every, self.args.max_steps, every):
            flagged = round(size * ratio)
            if not flagged:
                return
            size -= flagged
            if not size:
                raise SystemExit(f"error: --strategy loss-remove with --curate-ratio {ratio:g} every {every} steps "
                                 f"removes every one of the {self.pool.size} captions by step {step} (of --max-steps "
                                 f"{self.args.max_steps}): give a smaller --curate-ratio or a larger --curate-every")

    def summary(self) -> list[str]:
        rule = (f"the samples above mean + {self.args.curate_std:g} std" if self.args.curate_std is not None
                else f"the top {100 * self.args.curate_ratio:g}%")
        action = "replaced by another caption of their image" if self.replace else "removed"
        return [f"plan: start from the whole extended set ({self.pool.size} captions); every "
                f"{self.args.curate_every} steps, {rule} by loss ({self.args.loss_mode} Eq. 2) are {action}"]

    def members(self, history: list[dict] | None = None) -> np.ndarray:
        """The current training set after the curations of ``history``: example indices, one per sample."""
        members = np.arange(self.pool.size)
        if self.replace:
            for entry in history if history is not None else self.history:
                for position, _, new in entry["replaced"]:
                    members[position] = new
            return members
        keep = np.ones(self.pool.size, dtype=bool)
        for entry in history if history is not None else self.history:
            keep[entry["removed"]] = False
        return members[keep]

    def curate(self, step: int) -> dict:
        """Score the current set with the current model and flag its highest-loss samples."""
        started = time.time()
        members = self.members()
        unique, inverse = np.unique(members, return_inverse=True)
        loss = -np.asarray(self.logp(unique), dtype=np.float64)[inverse]
        flagged = flag_high_loss(loss, self.args.curate_ratio, self.args.curate_std)
        entry = {"step": step, "size": int(len(members)), "loss_mean": round(float(loss.mean()), 5),
                 "loss_std": round(float(loss.std(ddof=1)) if len(loss) > 1 else 0.0, 5), "flagged": int(len(flagged))}
        if self.replace:
            entry["replaced"] = self.replacements(members, flagged, step)
        else:
            entry["removed"] = sorted(int(members[p]) for p in flagged)
        entry["seconds"] = round(time.time() - started, 2)
        return entry

    def replacements(self, members: np.ndarray, flagged: np.ndarray, step: int) -> list[list[int]]:
        """[position, old example, new example] per flagged sample, highest loss first. A flagged caption is
        never drawn again; its replacement is a random never-flagged caption of its image (or itself)."""
        from clid.base.rng import item_rng

        spent = {int(old) for entry in self.history for _, old, _ in entry["replaced"]}
        out = []
        for position in flagged:
            old = int(members[position])
            spent.add(old)
            candidates = [c for c in self.captions_of_image[self.pool.image_ids[old]] if c not in spent]
            new = candidates[int(item_rng(self.args.seed, "replacecap", step, int(position)).integers(len(candidates)))] \
                if candidates else old
            out.append([int(position), old, int(new)])
        return out

    def log_rows(self) -> list[dict]:
        """One line per round: sizes and what changed, by caption id."""
        rows, n_trusted = [], self.pool.n_trusted
        for r, entry in enumerate([{"step": 0}] + self.history):
            members = self.members(self.history[:r])
            row = {"round": r, "start": entry["step"], "size": int(len(members)),
                   "trusted": int((members < n_trusted).sum()), "pool": int((members >= n_trusted).sum()),
                   "digest": digest(members)}
            if r:
                row.update({k: entry[k] for k in ("loss_mean", "loss_std", "flagged", "seconds")})
                ids = self.pool.caption_ids
                if self.replace:
                    row["replaced"] = [[ids[old], ids[new]] for _, old, new in entry["replaced"]]
                else:
                    row["removed"] = [ids[i] for i in entry["removed"]]
            rows.append(row)
        return rows

    def rounds(self, step: int, state: dict) -> Iterator[Round]:
        every, max_steps = self.args.curate_every, self.args.max_steps
        self.history = [e for e in state.get("curations", []) if e["step"] <= step]
        r = step // every
        while r * every < max_steps:
            start = r * every
            if start > 0 and (not self.history or self.history[-1]["step"] < start):
                entry = self.curate(start)
                self.history.append(entry)
                if self.check is not None:
                    self.check(digest(self.members()))
                yield_note = (f"curation at step {start}: loss {entry['loss_mean']:.3f} ± {entry['loss_std']:.3f}, "
                              f"{entry['flagged']} of {entry['size']} flagged ({entry['seconds']:.1f} s)")
            else:
                yield_note = None
            members = self.members()
            end = min(start + every, max_steps)
            n_pool = int((members >= self.pool.n_trusted).sum())
            text = (f"round {r}: {len(members)} captions ({n_pool} self-generated), steps {start}-{end}"
                    + (f"; {yield_note}" if yield_note else ""))
            yield Round(("round", r), start, end, members, text, {"curations": self.history})
            r += 1

    def seconds(self) -> float:
        return float(sum(e["seconds"] for e in self.history))


# ---------------------------------------------------------------------------------------------
# curriculum (Baby Step)


def difficulty_buckets(difficulty: np.ndarray, n_buckets: int) -> list[np.ndarray]:
    """Example indices sorted easiest first (ties by index), cut into ``n_buckets`` near-equal buckets."""
    difficulty = np.asarray(difficulty, dtype=np.float64)
    order = np.lexsort((np.arange(len(difficulty)), difficulty))
    return [np.sort(b) for b in np.array_split(order, n_buckets)]


def baby_step(scores: list[float], patience: int, n_buckets: int, min_improvement: float = 0.0) -> list[int]:
    """The number of buckets in use after each evaluation of ``scores`` (higher is better).

    Training starts on one bucket. An evaluation that does not beat the best score since the last
    bucket was added by more than ``min_improvement`` is flat; after ``patience`` flat evaluations in
    a row the next bucket is added (and the best and the count start over).
    """
    active, best, flat, out = 1, None, 0, []
    for score in scores:
        if best is None or score > best + min_improvement:
            best, flat = score, 0
        else:
            flat += 1
        if flat >= patience and active < n_buckets:
            active, best, flat = active + 1, None, 0
        out.append(active)
    return out


class BabyStep:
    """``curriculum``: Baby Step over difficulty buckets (see the module docstring).

    ``val_score()`` returns the current model's validation score (higher is better); the state is the
    list of evaluations, from which the buckets in use are recomputed (:func:`baby_step`).
    """

    def __init__(self, pool: Pool, difficulty: np.ndarray, args, val_score: Callable[[], float],
                 difficulty_seconds: float = 0.0):
        self.pool, self.args, self.val_score = pool, args, val_score
        self.buckets = difficulty_buckets(difficulty, args.buckets)
        self.difficulty = difficulty
        self.difficulty_seconds = difficulty_seconds
        self.history: list[dict] = []
        self.sets: dict[int, tuple] = {}  # buckets in use -> (their examples, self-generated count, digest)

    def summary(self) -> list[str]:
        sizes = [len(b) for b in self.buckets]
        means = [round(float(self.difficulty[b].mean()), 3) if len(b) else None for b in self.buckets]
        pools = [int((b >= self.pool.n_trusted).sum()) for b in self.buckets]
        return [f"plan: Baby Step over {len(self.buckets)} buckets by difficulty {self.args.difficulty} "
                f"(sizes {sizes}, self-generated {pools}, mean difficulty {means}); a validation evaluation every "
                f"{self.args.curate_every} steps, the next bucket after {self.args.patience} without an improvement "
                f"of more than {self.args.min_improvement:g}"]

    def active(self, history: list[dict] | None = None) -> int:
        history = self.history if history is None else history
        if not history:
            return 1
        return baby_step([e["score"] for e in history], self.args.patience, len(self.buckets),
                         self.args.min_improvement)[-1]

    def members(self, history: list[dict] | None = None) -> np.ndarray:
        return self.training_set(self.active(history))[0]

    def training_set(self, active: int) -> tuple[np.ndarray, int, str]:
        """(the examples of the first ``active`` buckets, how many are self-generated, their digest), computed
        once per bucket count, not at every round."""
        if active not in self.sets:
            members = np.sort(np.concatenate(self.buckets[:active]))
            self.sets[active] = (members, int((members >= self.pool.n_trusted).sum()), digest(members))
        return self.sets[active]

    def log_rows(self) -> list[dict]:
        rows = []
        for r, entry in enumerate([{"step": 0}] + self.history):
            active = self.active(self.history[:r])
            members, n_pool, members_digest = self.training_set(active)
            row = {"round": r, "start": entry["step"], "buckets": active, "size": int(len(members)), "pool": n_pool,
                   "digest": members_digest}
            if r:
                row.update(score=entry["score"], seconds=entry["seconds"])
            else:
                row["difficulty_seconds"] = round(self.difficulty_seconds, 2)
            rows.append(row)
        return rows

    def rounds(self, step: int, state: dict) -> Iterator[Round]:
        every, max_steps = self.args.curate_every, self.args.max_steps
        self.history = [e for e in state.get("evaluations", []) if e["step"] <= step]
        r = step // every
        while r * every < max_steps:
            start = r * every
            note = None
            if start > 0 and (not self.history or self.history[-1]["step"] < start):
                started = time.time()
                score = float(self.val_score())
                self.history.append({"step": start, "score": round(score, 6), "seconds": round(time.time() - started, 2)})
                note = f"validation log p {score:.4f}"
            members = self.members()
            end = min(start + every, max_steps)
            text = (f"round {r}: buckets 1-{self.active()} of {len(self.buckets)}, {len(members)} captions, "
                    f"steps {start}-{end}" + (f"; {note}" if note else ""))
            yield Round(("round", r), start, end, members, text, {"evaluations": self.history})
            r += 1

    def seconds(self) -> float:
        return self.difficulty_seconds + float(sum(e["seconds"] for e in self.history))


# ---------------------------------------------------------------------------------------------
# Difficulty of every example (curriculum)


def clip_similarity(folder, images, texts: list[str], image_ids: list[str], filenames: dict[str, str],
                    batch_size: int = 64, device="cpu") -> np.ndarray:
    """Cosine similarity of each (image, text) pair under a transformers CLIPModel saved in ``folder``."""
    from PIL import Image, UnidentifiedImageError
    from transformers import CLIPModel, CLIPProcessor

    from clid.data.images import convert_image

    try:
        model = CLIPModel.from_pretrained(str(folder)).to(device).eval()
        processor = CLIPProcessor.from_pretrained(str(folder))
    except (OSError, ValueError, TypeError) as err:
        from clid.base.hub import load_problem

        raise DataError(folder, None, f"not a transformers CLIP model folder ({load_problem(str(folder), err)})") from None
    image_embeds = {}
    unique = list(dict.fromkeys(image_ids))
    with torch.no_grad():
        for start in range(0, len(unique), batch_size):
            chunk = unique[start:start + batch_size]
            pixels = []
            for image_id in chunk:
                if image_id not in filenames:
                    raise DataError(images, f"image {image_id}", "the captions file names no image file for it")
                path = Path(images) / filenames[image_id]
                try:
                    with Image.open(path) as im:
                        pixels.append(convert_image(im, "RGB"))
                except (OSError, UnidentifiedImageError) as err:
                    raise DataError(path, f"image {image_id}", f"cannot read the image ({type(err).__name__})") from None
            inputs = processor(images=pixels, return_tensors="pt")
            embeds = model.get_image_features(pixel_values=inputs["pixel_values"].to(device))
            embeds = getattr(embeds, "pooler_output", embeds)
            for image_id, e in zip(chunk, torch.nn.functional.normalize(embeds.float(), dim=-1)):
                image_embeds[image_id] = e
        out = np.empty(len(texts))
        for start in range(0, len(texts), batch_size):
            inputs = processor(text=texts[start:start + batch_size], return_tensors="pt", padding=True, truncation=True)
            embeds = model.get_text_features(input_ids=inputs["input_ids"].to(device),
                                             attention_mask=inputs["attention_mask"].to(device))
            embeds = torch.nn.functional.normalize(getattr(embeds, "pooler_output", embeds).float(), dim=-1)
            pictures = torch.stack([image_embeds[i] for i in image_ids[start:start + batch_size]])
            out[start:start + batch_size] = (embeds * pictures).sum(-1).cpu().numpy()
    return out


def example_difficulty(args, pool: Pool, examples, texts: list[str], filenames: dict[str, str], regions, device,
                       out: Path, levels, write: bool = True) -> tuple[np.ndarray, float]:
    """(difficulty of every example, seconds spent), cached in OUT/difficulty.h5 for a resumed run."""
    from clid.base.files import read_arrays, write_arrays

    cache = Path(out) / "difficulty.h5"
    if cache.is_file():
        saved = read_arrays(cache)
        if list(saved.get("id", [])) == pool.caption_ids and "difficulty" in saved:
            return np.asarray(saved["difficulty"], dtype=np.float64), float(saved.get("seconds", [0.0])[0])
    started = time.time()
    kind, _, where = args.difficulty.partition(":")
    if kind == "u":  # minus CLID's score: the trusted captions' from 05 --include-trusted
        ids = [f"trusted:{c}" if k < pool.n_trusted else c for k, c in enumerate(pool.caption_ids)]
        difficulty = -scores_for(ids, args.quality, examples.digests, args.selfgen, args.captions).numpy().astype(np.float64)
    elif kind == "bootstrap":  # the loss under a model trained on the trusted captions
        difficulty = -bootstrap_logprobs(where, examples, regions, args.loss_mode, device, levels)
    else:  # minus the CLIP similarity of image and text
        difficulty = -clip_similarity(where, args.images, texts, pool.image_ids, filenames, device=device)
    seconds = time.time() - started
    if write:
        write_arrays(cache, {"id": np.asarray(pool.caption_ids, dtype=object), "difficulty": difficulty,
                             "seconds": np.full(len(difficulty), seconds)})
    return difficulty, seconds


def bootstrap_logprobs(folder, examples, regions, mode: str, device, levels) -> np.ndarray:
    """Eq. 2 of every example under the checkpoint in ``folder`` (trained on the same ``levels``)."""
    from clid.method.checkpoints import check_same_levels, load_checkpoint
    from clid.method.scoring import caption_logprobs

    model = load_checkpoint(folder, device)
    check_same_levels("--difficulty bootstrap:", folder, model.config.levels, levels)
    tokens = torch.tensor(sorted({t for row in examples.tokens for t in row}))
    missing = tokens[model.to_output(tokens) < 0]
    if len(missing):
        raise SystemExit(f"error: --difficulty bootstrap:{folder}: token "
                         f"{model.tokenizer.convert_ids_to_tokens(int(missing[0]))!r} of the captions is not in its "
                         "output vocabulary (train it with the same --output-vocab)")
    return caption_logprobs(model, examples, regions, mode, 64, device)


def make_strategy(args, pool: Pool, examples, model, regions, device, out: Path, u=None, val_examples=None,
                  texts=None, filenames=None, check=None, rank: int = 0):
    """The strategy object of ``args.strategy`` (its ``rounds(step, state)`` yields the rounds to train)."""
    from clid.method.scoring import caption_logprobs

    if args.strategy in ("clid", "none"):
        return Schedule(pool, u, args)

    def logp(indices):
        return caption_logprobs(model, examples.subset(indices), regions, args.loss_mode, 64, device,
                                precision=args.precision)

    if args.strategy in ("loss-remove", "loss-replacecap"):
        return LossCuration(pool, args, logp, check)
    if val_examples is None or not len(val_examples):
        raise SystemExit("error: --strategy curriculum needs validation captions (the val split of --captions, "
                         "with region features) for its validation score")

    def val_score() -> float:
        return float(np.mean(caption_logprobs(model, val_examples, regions, args.loss_mode, 64, device,
                                                precision=args.precision)))

    difficulty, seconds = example_difficulty(args, pool, examples, texts, filenames, regions, device, out,
                                             model.config.levels, write=rank == 0)
    return BabyStep(pool, difficulty, args, val_score, seconds)
