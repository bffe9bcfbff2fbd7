"""Training machinery shared by 04_train_base.py and 06_train_selection.py.

- :func:`collate`: LaBERT's training input: pad each caption with "." to its level's highest length,
  mask a uniform count in [max(1, int(0.1 * high)), high] of its positions;
- :func:`masked_lm_loss`: label-smoothed cross-entropy (0.1) on the masked positions only, "." targets
  weighted 0.5 (LaBERT's balance weight);
- :class:`Trainer`: AdamW (eps 1e-6, as the authors' ``transformers`` AdamW), linear warm-up then cosine decay, gradient clipping, atomic checkpoints,
  exact resume (every random draw is keyed by (seed, step)), DDP under ``torchrun`` (gloo on CPU,
  NCCL on GPU) with the loss normalised over the *global* batch, so N processes compute the same
  loss and gradient as one process with the same global batch;
- :func:`make_trainer`: a stage's Trainer, its run record, resumed or continued, and the model line.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist

from clid.run import runtime
from clid.run.cli import add_download_arg, add_levels_arg, non_negative_float, non_negative_int, positive_float, positive_int, probability
from clid.data.splits import add_split_args
from clid.data.store import FeatureStore, RegionCache, add_bad_features_arg, add_region_cache_arg
from clid.base.files import DataError
from clid.data.region_inputs import BOX_INPUTS
from clid.method.captioner import REGION_NORMS, Captioner, count_parameters
from clid.method.checkpoints import checkpoint_exists, feature_record, restore, save_checkpoint
from clid.data.examples import Examples
from clid.data.inputs import add_left_out_arg, add_token_cache_arg
from clid.base.rng import item_rng, item_seed
from clid.run.recipes import DEMO_STEPS_ENV, PAPER, flag_defaults, recipe_arg, recipe_names, recipe_path, resolved, resolved_steps
from clid.training.resume import already_trained, check_resume, hold_out_folder, training_record
from clid.base.text import eos_id


def corpus_vocab(paths, tokenizer, files=None) -> list[int]:
    """Sorted token ids used by the captions of these files, plus "." and [UNK] (an output shortlist).
    ``files``: the run's :class:`CaptionFiles` (its tables are shared with the rest of the run)."""
    from clid.data.inputs import CaptionFiles

    files = files or CaptionFiles()
    ids = {eos_id(tokenizer), tokenizer.unk_token_id}
    for path in paths:
        ids.update(np.flatnonzero(np.bincount(files.table(path, tokenizer).token_ids)).tolist())
    return sorted(ids)


# ---------------------------------------------------------------------------------------------
# Batches: masking and loss


def collate(examples: Examples, indices, model: Captioner, seed: int, step: int, positions=None):
    """LaBERT's training batch for ``indices`` (``positions``: each example's place in the global batch).

    Returns (input_ids, targets, masked, levels): ``input_ids`` [B, T] with masks applied (PAD beyond
    each level's length), ``targets`` [B, T] the true ids, ``masked`` [B, T] bool.
    """
    tok = model.tokenizer
    end, pad, mask_id = eos_id(tok), tok.pad_token_id, tok.mask_token_id
    highs = [model.levels[examples.levels[i] - 1][1] for i in indices]
    T = max(highs)
    targets = torch.full((len(indices), T), pad, dtype=torch.long)
    masked = torch.zeros((len(indices), T), dtype=torch.bool)
    positions = range(len(indices)) if positions is None else positions
    for row, (i, high, place) in enumerate(zip(indices, highs, positions)):
        ids = examples.tokens[i]
        targets[row, :high] = torch.tensor(ids + [end] * (high - len(ids)))
        rng = item_rng(seed, "mask", step, place)  # keyed by the global position: same on any world size
        n_mask = int(rng.integers(max(1, int(0.1 * high)), high + 1))
        masked[row, torch.from_numpy(rng.choice(high, n_mask, replace=False))] = True
    input_ids = targets.masked_fill(masked, mask_id)
    levels = torch.tensor([examples.levels[i] for i in indices], dtype=torch.long)
    return input_ids, targets, masked, levels


def masked_lm_loss(logits, targets, eos: int, eos_weight: float = 0.5, smoothing: float = 0.1):
    """Weighted label-smoothed cross-entropy, summed: returns (sum of w * loss, sum of w).

    Smoothing puts ``smoothing / (V - 1)`` on every wrong class (as LaBERT); the weight of a target
    is ``eos_weight`` for "." and 1 otherwise.
    """
    logp = logits.float().log_softmax(-1)
    V = logp.shape[-1]
    logp_target = logp.gather(1, targets[:, None]).squeeze(1)
    other = logp.sum(-1) - logp_target
    loss = -((1.0 - smoothing) * logp_target + smoothing / (V - 1) * other)
    weight = torch.where(targets == eos, eos_weight, 1.0).to(loss.dtype)
    return (loss * weight).sum(), weight.sum()


class StepBatches(torch.utils.data.Dataset):
    """A training run's batches by step: item i is this rank's share of the global batch ``batch_for(step)``
    at ``steps[i]``, collated (:func:`collate`), with its padded regions and the flat places and head classes
    of its masked positions, all on the CPU. A batch depends only on (seed, step), so loader workers in any
    number give the same batches, and a resumed run the rest of them.

    A worker reads regions from the training process's cache when it holds every image (:meth:`RegionCache.preload`),
    else through its own HDF5 handle (:meth:`open_in_worker`), uncached. Bad input met in
    a worker (an image's features, a token outside the head's vocabulary) comes back as a :class:`BadBatch`,
    raised in the training process as the one line it would have been there.
    """

    def __init__(self, examples: Examples, model: Captioner, regions: RegionCache, batch_for: Callable[[int], np.ndarray],
                 steps: range, seed: int, rank: int = 0, world: int = 1):
        self.examples, self.model, self.regions, self.batch_for = examples, model, regions, batch_for
        self.steps, self.seed, self.rank, self.world = steps, seed, rank, world
        index = model.output_index  # token id -> head class (-1: not predictable), read on the CPU
        self.output_index = None if index is None else index.cpu()

    def __len__(self) -> int:
        return len(self.steps)

    def __getitem__(self, i: int):
        step = self.steps[i]
        global_indices = self.batch_for(step)
        places = np.arange(len(global_indices))[self.rank::self.world]
        indices = global_indices[places]
        try:
            input_ids, targets, masked, levels = collate(self.examples, indices, self.model, self.seed, step, places)
            regions = self.regions.batch([self.examples.image_ids[i] for i in indices])
        except DataError as err:
            return BadBatch(err.path, err.record, err.problem)
        wanted = targets[masked]
        classes = wanted if self.output_index is None else self.output_index[wanted]
        if bool((classes < 0).any()):
            token = self.model.tokenizer.convert_ids_to_tokens(int(wanted[classes < 0][0]))
            return BadBatch(None, None, f"token {token!r} is not in the model's output vocabulary")
        keys = torch.tensor([item_seed(self.seed, "dropout", step, int(place)) & 0xFFFFFFFF for place in places])
        return (*regions, input_ids, levels), masked.flatten().nonzero()[:, 0], classes, keys

    def open_in_worker(self, worker_id: int) -> None:
        """A loader worker's own handle on the feature file (an HDF5 handle must not cross a fork), and the
        inherited cache when it is complete; the tokenizer's thread pool, started before the fork, is never
        waited for here, whatever TOKENIZERS_PARALLELISM says."""
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        features = self.regions.features.reopened()
        if self.regions.complete:
            self.regions.features = features
        else:
            self.regions = RegionCache(features, self.regions.num_classes, self.regions.box_input, cache=False)


@dataclass
class BadBatch:
    """Bad input met while making a batch: a :class:`DataError` (path given) or a plain error line."""
    path: str | None
    record: str | None
    problem: str

    def raise_it(self):
        if self.path is not None:
            raise DataError(self.path, self.record, self.problem)
        raise SystemExit(f"error: {self.problem}")


def quick_control_precision(model: Captioner, features: FeatureStore, image_ids: list[str], device,
                            precision: str = "fp32") -> dict:
    """Share of ``image_ids`` whose caption decoded at each level has a length inside that level."""
    from clid.method.metrics import control_precision
    from clid.method.decode import generate_captions

    levels = list(range(1, model.config.num_levels + 1))
    captions = generate_captions(model, features, image_ids, levels, device=device,
                                 precision=runtime.resolve(precision, device))
    shares = control_precision(captions, image_ids, model.levels, model.tokenizer)
    return {f"cp{level}": round(share, 3) for level, share in shares.items()}


# ---------------------------------------------------------------------------------------------
# Learning-rate schedule


def learning_rate(step: int, base_lr: float, warmup: int, total: int) -> float:
    """Linear warm-up to ``base_lr`` over ``warmup`` steps, then cosine decay to 0 at ``total``."""
    if step < warmup:
        return base_lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return base_lr * 0.5 * (1.0 + math.cos(math.pi * progress))


def epoch_batches(n: int, batch_size: int, step: int, seed: int, tag="data") -> np.ndarray:
    """The global batch at ``step`` of an endless sequence of shuffled epochs over ``n`` examples."""
    start = step * batch_size
    out, filled = np.empty(batch_size, dtype=np.int64), 0
    while filled < batch_size:
        epoch, offset = divmod(start + filled, n)
        take = min(batch_size - filled, n - offset)
        out[filled:filled + take] = epoch_order(n, seed, tag, epoch)[offset:offset + take]
        filled += take
    return out


@functools.lru_cache(maxsize=3)
def epoch_order(n: int, seed: int, tag, epoch: int) -> np.ndarray:
    """The shuffled order of ``n`` examples in ``epoch``, computed once: the latest three are kept (a batch
    spans at most two epochs, and 06 shuffles the next round's ahead), so a step costs a slice, not a
    permutation of the whole set."""
    order = item_rng(seed, tag, epoch).permutation(n)
    order.flags.writeable = False
    return order


def balanced_batches(levels, batch_size: int, seed: int) -> Callable[[int], np.ndarray]:
    """``batch_for(step)``: global batches drawn as the authors' ``balanced_training`` draws them.

    Each batch is drawn with replacement, caption i with probability 1 / (number of levels that have
    captions * captions at i's level): every such level fills an equal share of the batches, and a
    level's captions are equally likely. Keyed by (seed, step), so a resumed run draws the same.
    """
    levels = np.asarray(levels)
    counts = np.bincount(levels)
    cdf = np.cumsum(1.0 / (np.count_nonzero(counts) * counts[levels]))

    def batch_for(step: int) -> np.ndarray:
        u = item_rng(seed, "balanced", step).random(batch_size) * cdf[-1]
        return np.minimum(np.searchsorted(cdf, u, side="right"), len(levels) - 1)

    return batch_for


# ---------------------------------------------------------------------------------------------
# Distributed set-up


DIST_TIMEOUT_MINUTES = 60.0  # --dist-timeout: a rank may wait this long for the others (e.g. a checkpoint)


def init_distributed(timeout_minutes: float = DIST_TIMEOUT_MINUTES,
                     precision: str = "auto") -> tuple[int, int, runtime.DevicePlan]:
    """(global rank, world size, device plan); starts the process group under torchrun (gloo on CPU, NCCL on GPU).

    The rank is the global one (``RANK``: checkpoints, logs and the output lock are rank 0's, on one node of
    several); the GPU is the node's ``LOCAL_RANK``-th. A collective waits up to ``timeout_minutes`` for a
    rank that is late, such as rank 0 writing a checkpoint to a slow shared file system, before it fails.
    """
    world = int(os.environ.get("WORLD_SIZE", 1))
    rank = int(os.environ.get("RANK", 0))
    plan = runtime.device_plan(runtime.default_device(int(os.environ.get("LOCAL_RANK", 0))), precision)
    if plan.gpu:
        torch.cuda.set_device(plan.device)
    if world > 1 and not dist.is_initialized():
        from datetime import timedelta

        dist.init_process_group(plan.dist_backend, timeout=timedelta(minutes=timeout_minutes))
    return rank, world, plan


def finish_distributed(out, rank: int, world: int) -> None:
    """Name the finished checkpoint (rank 0) and leave the process group under torchrun."""
    if rank == 0:
        print(f"checkpoint: {out}")
    if world > 1:
        dist.destroy_process_group()


def standardize_regions(model: Captioner, features: FeatureStore, image_ids, max_images: int = 5000,
                        seed: int = 0) -> None:
    """Set the model's region-feature mean and standard deviation (``--region-norm standardize``).

    Statistics per feature dimension over every region of the training images (a fixed random
    subset of ``max_images`` when there are more). A near-constant dimension's deviation is floored
    at 1% of the mean deviation, so it cannot blow up at test time.
    """
    embeddings = model.embeddings
    if not embeddings.standardize:
        return
    ids = sorted({str(i) for i in image_ids})
    if len(ids) > max_images:
        ids = [ids[j] for j in np.sort(item_rng(seed, "region-stats").choice(len(ids), max_images, replace=False))]
    total = square = 0.0
    count = 0
    for image_id in ids:
        x = features.get(image_id).features.astype(np.float64)
        total, square, count = total + x.sum(0), square + (x * x).sum(0), count + len(x)
    mean = total / count
    std = np.sqrt(np.maximum(square / count - mean * mean, 0.0))
    std = np.maximum(std, 0.01 * std.mean())
    embeddings.region_mean.copy_(torch.as_tensor(mean, dtype=torch.float32))
    embeddings.region_std.copy_(torch.as_tensor(std, dtype=torch.float32))


# ---------------------------------------------------------------------------------------------
# The training loop


@dataclass
class TrainSettings:
    lr: float = 5e-5
    weight_decay: float = 0.01
    adam_eps: float = 1e-6  # the authors' (transformers' AdamW default); torch's default is 1e-8
    warmup: int = 1000
    max_steps: int = 100_000
    lr_horizon: int = 0  # the step where the cosine reaches 0 (0: max_steps)
    batch_size: int = 64  # global batch (split over DDP ranks)
    grad_clip: float = 1.0
    label_smoothing: float = 0.1
    eos_weight: float = 0.5
    save_every: int = 1000
    eval_every: int = 1000  # 0: off
    log_every: int = 20
    seed: int = 0
    precision: str = "auto"  # clid.run.runtime: bfloat16 autocast of the forward pass on a GPU, float32 on the CPU
    workers: int | str = "auto"  # batch-making processes (DevicePlan.loader_workers)
    dropout_draws: str = "example"  # example: each example's masks keyed by (seed, step, its place); rank: torch's


# ---------------------------------------------------------------------------------------------
# The command line and set-up shared by 04 and 06


TRAIN_GROUPS = {  # the --help sections of 04 and 06
    "data": "what is trained on",
    "model": "the captioner and where its weights start",
    "optimisation": "the optimizer and the loss",
    "schedule": "how many steps, and the learning rate over them",
    "run": "the output folder, checkpoints, logs and resuming",
}


def parse_train_args(p, argv, model):
    """Parse 04's or 06's flags. ``--recipe NAME`` makes the recipe's settings for ``model`` (one of
    :data:`clid.run.recipes.MODELS`, or a function of the parsed flags that names it) the defaults, so that a flag
    given on the command line still wins."""
    args = p.parse_args(argv)
    if args.recipe != PAPER:
        defaults = flag_defaults(args.recipe, model(args) if callable(model) else model)
        unknown = [name for name in defaults if not hasattr(args, name)]
        if unknown:
            p.error(f"--recipe {args.recipe}: {recipe_path(args.recipe)} sets {', '.join(unknown)}, not a flag of this stage")
        p.set_defaults(**defaults)
        args = p.parse_args(argv)
    return args


def recipe_schedule(args, start_step: int = 0, horizon_factor: int = 1) -> None:
    """Resolve what a recipe with steps (``--recipe demo``) leaves open: ``--max-steps`` is ``start_step`` (a
    continued checkpoint's step) plus the recipe's steps (:func:`clid.run.recipes.resolved_steps`), and
    ``--lr-horizon`` ``horizon_factor`` times that (0: the cosine ends at --max-steps)."""
    if args.max_steps is None:
        args.max_steps = start_step + resolved_steps(args.recipe)
    if args.lr_horizon is None:
        args.lr_horizon = horizon_factor * args.max_steps if horizon_factor > 1 else 0


def recipe_vocab(args, *caption_files) -> None:
    """A recipe that shortlists (``--recipe demo``), without ``--output-vocab``: shortlist the tokens of the caption
    files the run reads."""
    if resolved(args.recipe).get("shortlist") and not args.output_vocab:
        args.output_vocab = [str(f) for f in caption_files if f]


def train_arg_groups(p) -> dict:
    """The argparse groups of 04 and 06 (data, model, optimisation, schedule, run), for their own flags
    and then :func:`add_train_args`."""
    return {name: p.add_argument_group(name, description) for name, description in TRAIN_GROUPS.items()}


def add_train_args(groups: dict) -> None:
    """The flags 04 and 06 share, into their groups; defaults are the paper's (LaBERT's) recipe."""
    data, model, optimisation, schedule, run = (groups[name] for name in TRAIN_GROUPS)
    data.add_argument("--features", required=True, help="region features HDF5")
    add_bad_features_arg(data)
    add_region_cache_arg(data)
    add_levels_arg(data, "the length levels: caption (the paper's 7 levels, 1-9, 10-19, ..., 60-69 tokens), "
                         "paragraph (13 levels up to 129 tokens), labert (LaBERT's 4 levels)")
    add_split_args(data)
    add_left_out_arg(data)
    add_token_cache_arg(data)
    model.add_argument("--recipe", type=recipe_arg, default=PAPER, metavar="NAME",
                       help=f"{PAPER}: every default below (LaBERT's recipe, as the paper); "
                            f"{', '.join(recipe_names())}: the settings of recipes/NAME.toml, each explained there (or "
                            "of a .toml file given): demo, the demo's small model trained from scratch in minutes on a "
                            f"CPU ({DEMO_STEPS_ENV} sets its steps); flags given still win")
    model.add_argument("--preset", choices=["tiny", "minilm", "labert"], default="labert",
                       help="the captioner: tiny (3 layers of 192, random; for tests and the demo), minilm (6 x 384 "
                            "BERT from an offline package), labert (BERT-base, as the paper; needs --bert or a download)")
    model.add_argument("--bert", help="BERT folder or hub name for minilm/labert (default: the preset's)")
    add_download_arg(model)
    model.add_argument("--output-vocab", nargs="+", metavar="FILE",
                       help="restrict the LM head, and the word-embedding table, to the tokens of these caption files "
                            "(a speed option for small CPU runs such as the demo; default: the whole vocabulary, "
                            "as in the paper)")
    model.add_argument("--dropout", type=probability, default=0.1, help="dropout probability of the encoder (BERT's)")
    model.add_argument("--dropout-draws", choices=["example", "rank"], default="example",
                       help="example: each example's dropout masks drawn from (seed, step, its place in the global "
                            "batch), so 1, 2 or 8 ranks train the same run; rank: torch's dropout, drawn per process "
                            "(SDPA's fused attention dropout; the run depends on the number of ranks)")
    model.add_argument("--region-norm", choices=REGION_NORMS, default="none",
                       help="standardize: shift and scale each region-feature dimension by the training images' "
                            "mean and deviation (the demo: grounding is learned several times faster); "
                            "none: raw features, as LaBERT and the paper")
    model.add_argument("--cls-prob", choices=["use", "ignore"], default="use",
                       help="use: the region position embedding reads each region's class probabilities when the "
                            "feature file has them (cls_prob), as LaBERT; ignore: box coordinates only")
    d = TrainSettings()  # the defaults, in one place
    model.add_argument("--box-input", choices=BOX_INPUTS, default="authors",
                       help="authors: the six numbers of the authors' code (x1/x2, y1/y2, x2/x2, y2/y2 of the box's own "
                            "x2 and y2, relative area, detector confidence), layer-normed, and the class probabilities "
                            "layer-normed; image: x1, y1, x2, y2, width, height over the image size, raw class "
                            "probabilities")
    model.add_argument("--region-dropout", choices=["on", "off"], default="on",
                       help="on: dropout (--dropout) at the end of both region MLPs, as the authors' code; off: none there")
    model.add_argument("--tie-head", action="store_true",
                       help="the LM head projects with the word embeddings (tied; off: a weight of its own, as the "
                            "authors' code)")
    model.add_argument("--region-init", metavar="FILE",
                       help="set the first region layer from the detector's layer in this file (safetensors, or a plain "
                            "state dict read with weights_only=True: the authors' bert.pth, or weight/bias); default: "
                            "random, unless a checkpoint brings it")
    optimisation.add_argument("--lr", type=positive_float, default=d.lr, help="peak learning rate (AdamW)")
    optimisation.add_argument("--weight-decay", type=non_negative_float, default=d.weight_decay,
                              help="AdamW's decoupled weight decay")
    optimisation.add_argument("--adam-eps", type=positive_float, default=d.adam_eps,
                              help="AdamW's epsilon (the authors' code: 1e-6; torch's default: 1e-8)")
    optimisation.add_argument("--batch-size", type=positive_int, default=d.batch_size,
                              help="global batch size (split over DDP processes)")
    optimisation.add_argument("--grad-clip", type=non_negative_float, default=d.grad_clip, help="gradient-norm clip (0: none)")
    optimisation.add_argument("--label-smoothing", type=probability, default=d.label_smoothing,
                              help="label smoothing of the masked-token loss (LaBERT's)")
    optimisation.add_argument("--eos-weight", type=positive_float, default=d.eos_weight, help='loss weight of "." targets')
    runtime.add_precision_arg(optimisation)
    optimisation.add_argument("--amp", action="store_true", help="the same as --precision bf16 (its older name)")
    schedule.add_argument("--warmup", type=non_negative_int, default=d.warmup, help="linear warm-up steps")
    schedule.add_argument("--max-steps", type=positive_int, default=d.max_steps, help="the last training step")
    schedule.add_argument("--lr-horizon", type=non_negative_int, default=d.lr_horizon,
                          help="the step at which the cosine learning rate reaches 0 (0: --max-steps, 04's default; "
                               "06's default is the authors' 300000)")
    run.add_argument("--out", required=True, help="checkpoint folder (a re-run resumes from it)")
    run.add_argument("--save-every", type=positive_int, default=d.save_every, help="checkpoint every N steps")
    run.add_argument("--eval-every", type=non_negative_int, default=d.eval_every,
                     help="control-precision check every N steps (0: off)")
    run.add_argument("--eval-images", type=positive_int, default=100, help="validation images in that check")
    run.add_argument("--log-every", type=positive_int, default=d.log_every, help="a train_log.jsonl line every N steps")
    run.add_argument("--seed", type=non_negative_int, default=d.seed,
                     help="seeds the initial weights, the batches, the masks and the dropout")
    run.add_argument("--workers", type=workers_arg, default=d.workers,
                     help="processes that make the batches (collate, read and pad the regions) while the model trains; "
                          "auto: none on the CPU, up to 4 with a GPU. The batches are the same for any number")
    run.add_argument("--dist-timeout", type=positive_float, default=DIST_TIMEOUT_MINUTES, metavar="MINUTES",
                     help="under torchrun: how long a process waits for the others (a checkpoint written to a slow "
                          "shared file system, a rank restarting) before the run fails")
    run.add_argument("--restart", action="store_true",
                     help="remove a checkpoint in --out and start over (a re-run resumes only the same flags and inputs)")
    run.add_argument("--force", action="store_true",
                     help="write the checkpoint into an --out that holds files this stage did not write (they are "
                          "never deleted or replaced; without it such an --out is refused)")


def workers_arg(text: str):
    """argparse type of --workers: a whole number from 0 to the cores this job may use, or "auto"."""
    if text == "auto":
        return text
    workers, cores = non_negative_int(text), runtime.available_workers()
    if workers > cores:
        raise argparse.ArgumentTypeError(f"{workers} loader processes on {cores} core(s) would only wait for each other: "
                                         f"give at most {cores}, or auto")
    return workers


def check_train_args(p, args) -> None:
    """The checks between flags of 04 and 06 (each flag's own bound is checked by its type); a warm-up
    as long as the run is one warning line."""
    if args.amp:
        if args.precision == "fp32":
            p.error("--amp is --precision bf16: it cannot go with --precision fp32")
        args.precision = "bf16"
    if args.lr_horizon and args.lr_horizon < args.max_steps:
        p.error(f"--lr-horizon {args.lr_horizon} is below --max-steps {args.max_steps}: the learning rate would be 0 "
                "for the last steps (0: the horizon is --max-steps)")
    recipe_steps = ("steps" in resolved(args.recipe) and args.warmup == flag_defaults(args.recipe, "trusted").get("warmup")
                    and args.max_steps == resolved_steps(args.recipe))
    if args.warmup >= args.max_steps and recipe_steps:  # (both set by the recipe, the steps by CLID_DEMO_STEPS)
        print(f"note: --recipe {args.recipe} of {args.max_steps} steps ({DEMO_STEPS_ENV}): the learning rate stays in the "
              f"recipe's {args.warmup}-step warm-up for the whole run, as a smoke test needs no more", flush=True)
    elif args.warmup >= args.max_steps:
        print(f"warning: --warmup {args.warmup} is not below --max-steps {args.max_steps}: the learning rate rises for "
              f"the whole run and never reaches --lr {args.lr:g}; give a shorter --warmup (--recipe demo: 100)",
              file=sys.stderr)


def settings_from_args(args) -> TrainSettings:
    return TrainSettings(**{name: getattr(args, name) for name in TrainSettings.__dataclass_fields__})


def start_run(args):
    """(rank, world, device plan, features) for a training stage; None when ``--out`` is already trained."""
    rank, world, plan = init_distributed(args.dist_timeout, args.precision)
    if args.batch_size < world:
        raise SystemExit(f"error: --batch-size {args.batch_size} is the global batch, split over {world} processes: "
                         f"give at least {world}")
    if rank == 0:
        hold_out_folder(args)
    check_resume(args, rank, world)
    if already_trained(args, rank):
        return None
    try:
        features = FeatureStore(args.features, bad=args.bad_features)
    except FileNotFoundError as err:
        raise SystemExit(f"error: {err}") from None
    return rank, world, plan, features


def new_model(args, features: FeatureStore, device, pretrained: bool = True, files=None) -> Captioner:
    """The captioner of ``--preset``, the same initial weights in every run and process.

    ``pretrained=False`` leaves out the preset's BERT weights (a random initialisation); ``files``: the run's
    :class:`CaptionFiles`, which ``--output-vocab`` reads its files from.
    """
    from clid.method.captioner import build_model, preset_config
    from clid.base.text import load_tokenizer

    output_vocab = input_vocab = None
    if args.output_vocab:  # a shortlist: the head predicts its tokens, the table holds them and [PAD], [MASK]
        tokenizer = load_tokenizer()
        output_vocab = corpus_vocab(args.output_vocab, tokenizer, files)
        input_vocab = sorted({*output_vocab, tokenizer.pad_token_id, tokenizer.mask_token_id})
    num_classes = features.num_classes() if args.cls_prob == "use" else 0
    config = preset_config(args.preset, features.feature_dim(), args.levels, args.bert, num_classes=num_classes,
                           dropout=args.dropout, output_vocab=output_vocab, input_vocab=input_vocab,
                           region_norm=args.region_norm, box_input=args.box_input,
                           region_dropout=args.region_dropout == "on", tie_head=args.tie_head)
    if not pretrained:
        config.init_from = None
    torch.manual_seed(item_seed(args.seed, "init"))
    model = build_model(config)
    if args.region_init:
        from clid.method.captioner import load_region_init

        keys = load_region_init(model, args.region_init)
        if int(os.environ.get("RANK", 0)) == 0:
            print(f"first region layer from {args.region_init} ({keys})")
    return model.to(device)


def validation_check(args, features: FeatureStore, val_ids: list[str], device):
    """The quick control-precision check run every ``--eval-every`` steps (None without val images)."""
    eval_ids = [i for i in val_ids if i in features][: args.eval_images]
    if not eval_ids:
        return None
    return lambda model, step: quick_control_precision(model, features, eval_ids, device, args.precision)


class StopRequest:
    """SIGTERM (what SLURM sends before a time limit, or on preemption) asks the training loop to stop: the
    loop checkpoints after the step it is in and exits, so a requeued job resumes from there."""

    def __init__(self):
        self.signal = 0
        self.name = "SIGTERM"
        self.previous = None
        if threading.current_thread() is threading.main_thread():  # (signals reach the main thread only)
            self.previous = signal.signal(signal.SIGTERM, self.request)

    def request(self, signum, frame) -> None:
        self.signal = signum

    def agreed(self, world: int, device) -> bool:
        """Whether any process was asked to stop (under DDP, all processes agree)."""
        if world == 1:
            return bool(self.signal)
        flag = torch.tensor([self.signal], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        self.signal = int(flag.item())
        return bool(self.signal)

    def restore(self) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)


WORKER_TIMEOUT = 600  # seconds a loader process may take over one batch before the run stops


class Trainer:
    """Runs optimizer steps on batches chosen by a caller's function ``batch_for(step) -> indices``.

    On a GPU nothing inside a step waits for the device: the batches come from loader processes
    (:class:`StepBatches`, pinned memory, non-blocking copies), and the checks that need the host (a NaN or
    infinite loss or gradient norm) run every ``log_every`` steps and before every checkpoint and evaluation.
    They still guarantee what the per-step checks of the CPU do: from a non-finite step on, the optimizer
    skips every update on the device (fused AdamW's ``found_inf``), so no such step reaches the weights, and
    the check stops the run naming that step before anything is saved.
    """

    def __init__(self, model: Captioner, examples: Examples, regions: RegionCache, settings: TrainSettings,
                 out_dir, config_extra: dict, device, rank: int = 0, world: int = 1,
                 evaluate: Callable[[Captioner, int], dict] | None = None, defer_checks: bool | None = None):
        """``device``: the stage's :class:`~clid.run.runtime.DevicePlan` (or a device: its plan under
        ``settings.precision``); ``defer_checks`` overrides the plan's."""
        self.model, self.examples, self.regions, self.settings = model, examples, regions, settings
        plan = runtime.as_plan(device, settings.precision)
        self.plan = plan if defer_checks is None else plan.replace(defer_checks=defer_checks)
        self.plan.use()
        self.out_dir, self.config_extra, self.device = Path(out_dir), config_extra, plan.device
        self.rank, self.world, self.evaluate = rank, world, evaluate
        self.workers = plan.loader_workers(settings.workers)
        # the fused AdamW kernel: the same update rule as the default loop, several times faster on CPU
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=settings.lr, betas=(0.9, 0.999),
                                           eps=settings.adam_eps, weight_decay=settings.weight_decay,
                                           fused=plan.fused_optimizer)
        # A key's bias adds the same number to all of a query's scores, which the softmax removes: its true
        # gradient is 0, and the computed one is rounding noise that AdamW would scale up to full steps (noise
        # that differs with the world size). It gets a gradient of 0: only the weight decay moves it.
        for layer in model.encoder.layer:
            layer.attention.self.key.bias.register_hook(torch.zeros_like)
        self.ddp = None
        if world > 1:  # DDP also starts every rank from rank 0's weights
            self.ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[plan.device] if plan.gpu else None)
        eos = eos_id(model.tokenizer)
        self.eos_class = eos if model.output_index is None else int(model.output_index[eos])
        # checks deferred to the log steps (the plan's: on a GPU; on the CPU a check costs nothing)
        self.defer_checks = self.plan.defer_checks
        self.nonfinite = torch.zeros((), device=self.device)  # 1 from the first non-finite step on (deferred checks)
        self.unchecked: list[tuple[int, torch.Tensor, torch.Tensor]] = []  # (step, loss, gradient norm)
        self.step = 0
        self.state: dict = {}
        self.pending_log: list[str] = []

    # -- resume ---------------------------------------------------------------------------------
    def resume(self) -> bool:
        """Load the last checkpoint of ``out_dir`` if there is one. Returns True if it resumed."""
        if not checkpoint_exists(self.out_dir):
            return False
        self.state = restore(self.out_dir, self.model, self.optimizer)
        self.step = int(self.state["step"])
        return True

    def continue_from(self, folder) -> None:
        """Start from the checkpoint in ``folder`` (another run's): its weights, optimizer state and step, so
        its schedule goes on."""
        self.state = restore(folder, self.model, self.optimizer)
        self.step = int(self.state["step"])

    # -- one step -------------------------------------------------------------------------------
    def train_step(self, batch) -> torch.Tensor:
        """One optimizer step on a :class:`StepBatches` item (this rank's share of the global batch); returns
        the global batch's loss, a 0-dim tensor on the device.

        The loss is normalised by the weight of the *global* batch, so that DDP's gradient averaging
        over N processes gives the step one process takes on the same global batch.
        """
        if isinstance(batch, BadBatch):
            batch.raise_it()
        settings, model = self.settings, self.model
        model.train()
        torch.manual_seed(item_seed(settings.seed, "dropout", self.step, self.rank))  # (--dropout-draws rank)
        inputs, places, classes, keys = batch  # keys: each example's dropout key (StepBatches)
        *inputs, places, classes, keys = runtime.to_device([*inputs, places, classes, keys], self.device)
        keys = keys if settings.dropout_draws == "example" else None
        with self.plan.autocast():
            logits = (self.ddp or model)(*inputs, places, grouped=self.plan.grouped_encoding, dropout_keys=keys)
        loss_sum, weight_sum = masked_lm_loss(logits, classes, self.eos_class, settings.eos_weight,
                                              settings.label_smoothing)
        total_weight, reported = weight_sum.detach().clone(), loss_sum.detach().clone()
        if self.world > 1:
            dist.all_reduce(total_weight)
            dist.all_reduce(reported)  # the global loss: every rank sees the same value and stops together
        batch_loss = reported / total_weight
        if not self.defer_checks:
            self.stop_if_not_finite(self.step + 1, batch_loss, "the training loss")
        loss = loss_sum * self.world / total_weight  # DDP averages the gradients over the ranks
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate(self.step, settings.lr, settings.warmup,
                                        settings.lr_horizon or settings.max_steps)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        # the norm of the (DDP-averaged) gradient; with --grad-clip 0 it is only measured (clip at inf)
        clip = settings.grad_clip if settings.grad_clip > 0 else math.inf
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        if self.defer_checks:  # no wait: this step and every later one skip their update if a value is not finite
            self.nonfinite = torch.maximum(self.nonfinite, (~(torch.isfinite(batch_loss) & torch.isfinite(norm))).float())
            self.optimizer.found_inf = self.nonfinite
            self.unchecked.append((self.step + 1, batch_loss, norm))
        else:
            self.stop_if_not_finite(self.step + 1, norm, "the gradient norm")
        self.optimizer.step()
        self.step += 1
        return batch_loss

    def check_finite(self) -> None:
        """Deferred checks: stop, naming the first step, if a loss or gradient norm since the last check was
        NaN or infinite (no such step, nor any after it, has reached the weights)."""
        if not self.unchecked:
            return
        values = torch.stack([torch.stack([loss.float(), norm.float()]) for _, loss, norm in self.unchecked]).tolist()
        steps = [step for step, _, _ in self.unchecked]
        self.unchecked = []
        for step, (loss, norm) in zip(steps, values):
            self.stop_if_not_finite(step, torch.tensor(loss), "the training loss")
            self.stop_if_not_finite(step, torch.tensor(norm), "the gradient norm")

    def stop_if_not_finite(self, step: int, value: torch.Tensor, what: str) -> None:
        """Stop the run, before the optimizer step of ``step``, when ``value`` is NaN or infinite."""
        if not bool(torch.isfinite(value)):
            raise SystemExit(f"error: {what} is {float(value)} at step {step}; stopped before its optimizer "
                             f"step, {self.kept()}. A diverging run: try a lower --lr or a longer --warmup")

    def kept(self) -> str:
        """What the output folder holds when a run is stopped (for the error message)."""
        step = self.state.get("step")
        return f"{self.out_dir} keeps its last checkpoint (step {step})" if step else "no checkpoint was written"

    # -- checkpointing and logging --------------------------------------------------------------
    def log(self, record: dict) -> None:
        if self.rank == 0:
            self.pending_log.append(json.dumps(record))

    def save(self, extra_state: dict | None = None) -> None:
        """Checkpoint the current step; refuses (stops the run) if any weight is NaN or infinite."""
        self.check_finite()
        self.regions.features.check_unchanged()  # (nothing learned from a feature file that changed is saved)
        for name, tensor in self.model.state_dict().items():  # the same weights on every DDP rank
            if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                raise SystemExit(f"error: the weights hold NaN or inf after step {self.step} ({name}); not saved, "
                                 f"{self.kept()}. A diverging run: try a lower --lr or a longer --warmup")
        self.state = {"step": self.step, **(extra_state or {})}
        if self.rank == 0:
            save_checkpoint(self.out_dir, self.model, self.optimizer, self.state, self.config_extra, self.pending_log)
            self.pending_log = []
        if self.world > 1:
            dist.barrier()

    def batches(self, batch_for: Callable[[int], np.ndarray], steps: range):
        """The batches of ``steps`` in order: made in this process, or by ``workers`` loader processes."""
        data = StepBatches(self.examples, self.model, self.regions, batch_for, steps, self.settings.seed,
                           self.rank, self.world)
        if not self.workers:
            return (data[i] for i in range(len(data)))
        if not self.regions.complete and self.regions.preload(self.examples.image_ids) and self.rank == 0:
            print(self.regions.describe(), flush=True)
        # (the tokenizer's own threads must not cross the fork either: said before it, the workers stay quiet)
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        loader = torch.utils.data.DataLoader(data, batch_size=None, num_workers=self.workers,
                                             pin_memory=self.plan.pin_memory, worker_init_fn=data.open_in_worker,
                                             multiprocessing_context="fork", prefetch_factor=4, timeout=WORKER_TIMEOUT)
        return self.watched(loader)

    def watched(self, loader):
        """The batches of ``loader``; a loader process that dies (a signal, an exit) or stops answering ends the
        run in one line naming the step whose batch it made and how it died (torch's own words)."""
        batches = iter(loader)
        try:
            while True:
                try:
                    batch = next(batches)
                except StopIteration:
                    return
                except (RuntimeError, ConnectionError, EOFError) as err:
                    raise self.loader_failure(err) from None
                yield batch
        finally:  # (the other processes are ended here, quietly, not at exit by torch, which would print their fate)
            try:
                batches._shutdown_workers()
            except Exception:  # noqa: BLE001 - a process already dead
                pass

    def loader_failure(self, err: Exception) -> BaseException:
        """The one-line stop for a loader process's death (torch raises it in this process, at any point of a
        step: its SIGCHLD handler; or the batch's pipe breaks), or ``err`` itself when it is another error."""
        if isinstance(err, (ConnectionError, EOFError)):
            why = f"a loader process ended while it handed over a batch ({err})"
        elif str(err).startswith("DataLoader"):
            why = str(err).replace("DataLoader worker", "a loader process").split(". ")[0].strip().rstrip(".")
        elif "in DataLoader worker process" in str(err):  # (an error inside it: a full /dev/shm, a read-only one)
            why = "a loader process failed: " + str(err).strip().splitlines()[-1].removeprefix(
                f"{DataError.__module__}.DataError: ")[:300]
        else:
            return err
        return SystemExit(f"error: training stopped at step {self.step + 1}: {why} (--workers {self.workers}); nothing "
                          f"was left half-written, {self.kept()}. The same command resumes (--workers 0 makes the "
                          "batches in this process)")

    def run(self, end_step: int, batch_for: Callable[[int], np.ndarray], desc: str = "train",
            state_for: Callable[[int], dict] | None = None) -> None:
        """Train from the current step up to ``end_step``, checkpointing every ``save_every`` steps.

        ``state_for(step)`` adds fields to the saved training state (e.g. 06's iteration). The guards are
        helpers: a stop request (:meth:`stop_if_requested`), finite values (:meth:`train_step`, and
        :meth:`check_finite` at the steps that log, evaluate or save), a loader process's death (:meth:`guarded`).
        """
        from clid.base.progress import Progress

        bar = Progress(end_step, desc, "step", initial=self.step, disable=self.rank != 0)
        started, losses = time.time(), []
        stop = StopRequest()
        batches = self.batches(batch_for, range(self.step, end_step))
        with self.guarded(batches, bar, stop):
            for batch in batches:
                self.stop_if_requested(stop, end_step, bar, state_for)
                losses.append(self.train_step(batch))
                lr = self.optimizer.param_groups[0]["lr"]
                log_now, evaluate_now, save_now = self.due(end_step)
                if self.defer_checks:
                    if log_now or evaluate_now or save_now:
                        self.check_finite()
                    bar.update(1, lr=lr)
                else:
                    bar.update(1, loss=float(losses[-1]), lr=lr)
                if log_now:
                    self.log_losses(losses, lr, started, bar)
                    losses = []
                if evaluate_now and self.rank == 0:
                    self.log_evaluation(bar)
                if save_now:
                    self.save(state_for(self.step) if state_for else None)

    @contextlib.contextmanager
    def guarded(self, batches, bar, stop: "StopRequest"):
        """Around the loop: a loader process's death raised in it is one line (:meth:`loader_failure`); on the
        way out the loader processes end, the bar closes (before an error stops the run, so the error is the
        last line) and SIGTERM's handler is restored."""
        try:
            yield
        except RuntimeError as err:
            raise self.loader_failure(err) from None
        finally:
            if hasattr(batches, "close"):
                batches.close()
            bar.close()
            stop.restore()

    def stop_if_requested(self, stop: "StopRequest", end_step: int, bar, state_for) -> None:
        """When a process was asked to stop (SIGTERM), checkpoint the current step and exit (128 + the signal).
        Every DDP rank stops at the same step; under deferred checks they agree at the log steps only, as
        agreeing waits for them all."""
        agree = not self.defer_checks or self.world == 1 or self.step % self.settings.log_every == 0
        if not (agree and stop.agreed(self.world, self.device)):
            return
        self.save(state_for(self.step) if state_for else None)
        bar.close()
        if self.rank == 0:
            print(f"stopped by {stop.name} at step {self.step} of {end_step}; the checkpoint in "
                  f"{self.out_dir} is saved: the same command resumes from it", flush=True)
        raise SystemExit(128 + stop.signal)

    def due(self, end_step: int) -> tuple[bool, bool, bool]:
        """Whether the step just taken logs, evaluates and checkpoints."""
        settings, step = self.settings, self.step
        log_now = step % settings.log_every == 0 or step == end_step
        evaluate_now = bool(self.evaluate and settings.eval_every and step % settings.eval_every == 0)
        save_now = step % settings.save_every == 0 or step == end_step
        return log_now, evaluate_now, save_now

    def log_losses(self, losses: list[torch.Tensor], lr: float, started: float, bar) -> None:
        """The log line of the steps since the last one: their mean loss, the learning rate, the time so far."""
        mean = float(np.mean(torch.stack(losses).tolist()))
        self.log({"step": self.step, "loss": mean, "lr": lr, "seconds": round(time.time() - started, 2)})
        if self.defer_checks:
            bar.update(0, loss=mean)

    def log_evaluation(self, bar) -> None:
        """The validation check at this step: logged and written under the bar."""
        result = self.evaluate(self.model, self.step)
        self.log({"step": self.step, "eval": result})
        bar.write(f"step {self.step}: " + " ".join(f"{k}={v}" for k, v in result.items()))


def make_trainer(args, stage: str, model: Captioner, examples: Examples, regions: RegionCache, features: FeatureStore,
                 val_ids: list[str], out, plan: runtime.DevicePlan, rank: int, world: int,
                 continue_from=None) -> Trainer:
    """The :class:`Trainer` of a training stage (``stage``: its name in config.json) on the stage's device
    ``plan``, resumed from the checkpoint in ``out`` if there is one, else continuing the checkpoint
    ``continue_from`` (its weights, optimizer state and step) if given; prints where it starts and the model line."""
    device = plan.device
    trainer = Trainer(model, examples, regions, settings_from_args(args), out,
                      {"train": vars(args), "stage": stage, "run": training_record(args), **feature_record(features)},
                      plan, rank, world, validation_check(args, features, val_ids, device))
    if trainer.resume():
        if rank == 0:
            print(f"resumed from {out} at step {trainer.step}")
    elif continue_from:
        trainer.continue_from(continue_from)
        if rank == 0:
            print(f"continuing {continue_from} from step {trainer.step} (lr {args.lr}, warm-up {args.warmup}, "
                  f"horizon {args.lr_horizon})")
    if rank == 0:
        print(f"model: {args.preset}, {count_parameters(model) / 1e6:.1f}M parameters; {world} process(es) on {device}")
    return trainer
