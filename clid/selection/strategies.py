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
  the length-normalised log-likelihood of Eq. 2, :func:`clid.model.scoring.caption_logprobs`) and
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

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from clid.base.files import DataError
from clid.run.cli import non_negative_float, number, positive_float, positive_int

if TYPE_CHECKING:  # (the strategies, with torch, are imported by make_strategy: 06 parses its flags without them)
    from clid.selection.schedule import Pool

STRATEGIES = ("clid", "loss-remove", "loss-replacecap", "curriculum", "none")

STRATEGIES = ("clid", "loss-remove", "loss-replacecap", "curriculum", "none")


# ---------------------------------------------------------------------------------------------
# Flags (06 adds them to its parser)


def add_strategy_args(p) -> None:
    """06's flags of the selection strategies (CLID's own flags stay in 06)."""
    p.add_argument("--strategy", choices=STRATEGIES, default="clid",
                   help="clid: CLID's schedule; loss-remove, loss-replacecap: loss-based curation; curriculum: Baby "
                        "Step over difficulty buckets; none: the whole extended set (see clid/selection/schedule.py)")
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
                        "(clid/model/scoring.py); onepass: one pass per caption, as their loss is one pass")
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





def make_strategy(args, pool: Pool, examples, model, regions, device, out: Path, u=None, val_examples=None,
                  texts=None, filenames=None, check=None, rank: int = 0):
    """The strategy object of ``args.strategy`` (its ``rounds(step, state)`` yields the rounds to train)."""
    from clid.model.scoring import caption_logprobs
    from clid.selection.peers import BabyStep, LossCuration, example_difficulty
    from clid.selection.schedule import Schedule

    if args.strategy in ("clid", "none"):
        return Schedule(pool, u, args)

    def logp(indices):
        return caption_logprobs(model, examples.subset(indices), regions, args.loss_mode, 64, device,
                                precision=args.precision)

    if args.strategy in ("loss-remove", "loss-replacecap"):
        return LossCuration(pool, args, logp, check)
    if val_examples is None or not len(val_examples):
        raise DataError(None, None, "--strategy curriculum needs validation captions (the val split of --captions, "
                                    "with region features) for its validation score")

    def val_score() -> float:
        return float(np.mean(caption_logprobs(model, val_examples, regions, args.loss_mode, 64, device,
                                                precision=args.precision)))

    difficulty, seconds = example_difficulty(args, pool, examples, texts, filenames, regions, device, out,
                                             model.config.levels, write=rank == 0)
    return BabyStep(pool, difficulty, args, val_score, seconds)
