"""Stage 06: CLID training with gradual data selection (the method's core).

    python 06_train_selection.py --captions captions.json --selfgen paraphrased.jsonl \\
        --quality quality.h5 --features features.h5 --out runs/clid

In:  trusted captions, self-generated captions, their quality scores u (05), region features.
     The split guard of 04 applies (``--test-ids``, ``--no-split-check``).
Out: a checkpoint folder usable by 07, with ``selection_log.jsonl`` (one line per iteration).

Schedule (paper defaults: c = 2, s = 1, eta = 1200): for iterations i = 0, 1, 2, ...

    T_i  = the (c * i)-th percentile of u over the self-generated pool
    f(u) = 0.5 * (1 + tanh((u - T_i) / s))
    draw floor((100 - c * i)% of the pool) captions WITHOUT replacement, proportionally to f
    train eta optimizer steps on trusted + drawn captions

until c * i reaches 100 (nothing left to draw); then training goes on with trusted captions only
until ``--max-steps``, as the authors' code does. Draws use the fused sampler
(``clid.ops.smoothstep_sample``) keyed by (seed, iteration), so a resumed run, or any DDP rank,
redraws exactly the same captions.

Where the paper is silent this stage follows the authors' code and configuration: the model starts
randomly initialised (``--init random``; ``bert`` starts as 04 does, ``CKPT`` copies a checkpoint),
with a fresh optimizer and a fresh learning-rate schedule (1,000 warm-up steps, then a cosine whose
horizon is their ``max_steps``, 300,000, while the stage trains 100,000 steps: ``--lr-horizon
300000 --max-steps 100000``; the rate ends at 75% of its peak), and a batch of 64 (``--batch-size``
is the global batch: under torchrun keep 64, or eta = 1200 steps no longer means what it did).

Options: ``--full-epochs`` (one epoch of trusted + drawn captions per iteration instead of eta steps:
an option of the authors' code that their configuration leaves off); ``--schedule constant`` (every
caption equally likely, the paper's ablation), ``hard`` (s -> 0: a step at T_i), ``none`` (the whole
extended set, no selection).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from pathlib import Path

import numpy as np
import torch

from clid import ops
from clid.cli import HelpFormatter, number, positive_float, positive_int
from clid.features.store import RegionCache, check_features_match
from clid.files import DataError, atomic_path, read_quality, run_main
from clid.model.captioner import count_parameters
from clid.model.checkpoints import feature_record, load_init_weights, read_config
from clid.model.inputs import make_examples, training_items
from clid.model.train import (
    Trainer,
    add_train_args,
    check_train_args,
    epoch_batches,
    finish_distributed,
    new_model,
    settings_from_args,
    standardize_regions,
    start_run,
    train_arg_groups,
    validation_check,
)
from clid.runs import training_record

CAPTION_ETA, PARAGRAPH_ETA = 1200, 200


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    groups = train_arg_groups(p)
    data, schedule = groups["data"], groups["schedule"]
    data.add_argument("--captions", required=True, help="trusted captions (Karpathy JSON, or any caption file with "
                                                        "--test-ids)")
    data.add_argument("--selfgen", required=True, help="self-generated (paraphrased) captions JSONL, the pool scored "
                                                       "by 05")
    data.add_argument("--quality", required=True, help="quality HDF5 from 05")
    schedule.add_argument("--c", type=number(float, low=0, high=100, low_open=True), default=2.0,
                          help="percent of the pool dropped per iteration")
    schedule.add_argument("--s", type=positive_float, default=1.0, help="smoothness of the weighting")
    schedule.add_argument("--eta", type=positive_int, default=None,
                          help="optimizer steps per iteration (the paper: 1200 for captions, 200 for paragraphs)")
    schedule.add_argument("--full-epochs", action="store_true",
                          help="one epoch of trusted + drawn captions per iteration instead of --eta steps (an option "
                               "of the authors' code, off in their configuration, which trains 1200 steps per "
                               "iteration)")
    schedule.add_argument("--schedule", choices=["smooth", "constant", "hard", "none"], default="smooth")
    groups["model"].add_argument("--init", default="random",
                                 help="random (the authors' code re-initialises the model) | bert (as 04 starts) | "
                                      "a checkpoint folder")
    add_train_args(groups)
    p.set_defaults(lr_horizon=300_000)  # the authors' schedule: a 300,000-step cosine, of which 06 trains 100,000
    args = p.parse_args(argv)
    check_train_args(p, args)
    if args.eta is None:  # the paper's eta: 200 on the (much smaller) paragraph set, else 1200
        args.eta = PARAGRAPH_ETA if args.levels == "paragraph" else CAPTION_ETA
    if args.init not in ("bert", "random") and not Path(args.init).is_dir():
        p.error(f"--init must be bert, random or a checkpoint folder (got {args.init!r})")
    if args.region_init and args.init not in ("bert", "random"):
        p.error("--region-init sets a new model's first region layer; the checkpoint of --init brings its own")
    return args


# ---------------------------------------------------------------------------------------------
# The selection plan


def draw(u: torch.Tensor, iteration: int, args) -> tuple[np.ndarray, float]:
    """Indices into the pool drawn at ``iteration``, and the threshold T_i."""
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
    """One entry per iteration: threshold, draw size and statistics, and its range of steps."""
    plan, step, iteration = [], 0, 0
    if args.schedule == "none":  # the whole extended set, no selection
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
                     "levels": histogram.tolist(),
                     "digest": hashlib.sha1(indices.tobytes()).hexdigest()[:16]})
        step += steps
        iteration += 1
    if step < args.max_steps:
        plan.append({"iteration": iteration, "start": step, "end": args.max_steps, "threshold": None,
                     "drawn": 0, "pool": int(len(u)), "trusted_only": True, "digest": "none"})
    return plan


def scores_for(selfgen_ids: list[str], quality_path) -> torch.Tensor:
    """u of every usable self-generated caption, in the order of ``selfgen_ids``."""
    q = read_quality(quality_path)
    by_id = dict(zip(q["id"], q["u"]))
    missing = [c for c in selfgen_ids if c not in by_id]
    if missing:
        raise DataError(quality_path, None, f"{len(missing)} self-generated captions have no quality score "
                                            f"(first: {missing[0]}); run 05 on the same captions")
    u = np.asarray([by_id[c] for c in selfgen_ids], dtype=np.float32)
    bad = ~np.isfinite(u)  # NaN or +-inf: no threshold or weight can be computed from it
    if bad.any():
        first = int(bad.argmax())
        raise DataError(quality_path, f"caption {selfgen_ids[first]}",
                        f"u is {u[first]} ({int(bad.sum())} of the {len(u)} scores are not finite)")
    return torch.from_numpy(u)


def report_plan(plan, notes, skipped, features, n_trusted, u, out: Path, args) -> None:
    """Print what is trained on and the plan, and write the plan to OUT/selection_log.jsonl."""
    for note in notes:
        print(note)
    print(f"trusted captions: {n_trusted}; self-generated pool: {len(u)} (u mean {float(u.mean()):+.3f})")
    for reason, count in sorted(skipped.items()):
        print(f"  skipped {count}: {reason}")
    if bad_line := features.skip_report():
        print(f"  {bad_line}")
    print(f"plan: {sum(1 for p in plan if p['drawn'])} selection iterations, then trusted only "
          f"from step {plan[-1]['start'] if plan[-1].get('trusted_only') else args.max_steps}")
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / "selection_log.jsonl") as tmp:
        tmp.write_text("".join(json.dumps(p) + "\n" for p in plan))


def training_set(entry: dict, u: torch.Tensor, n_trusted: int, n_examples: int, args) -> np.ndarray:
    """The example indices one iteration trains on: the trusted captions plus that iteration's draw
    (drawn again from its seed, and checked against the plan), or every example with --schedule none."""
    if args.schedule == "none":
        return np.arange(n_examples)
    if not entry["drawn"]:
        return np.arange(n_trusted)
    drawn, _ = draw(u, entry["iteration"], args)
    assert hashlib.sha1(drawn.tobytes()).hexdigest()[:16] == entry["digest"], "the draw is not reproducible"
    return np.concatenate([np.arange(n_trusted), n_trusted + drawn])


def main(argv=None):
    args = parse_args(argv)
    started = start_run(args)
    if started is None:
        return
    rank, world, device, features = started
    out = Path(args.out)
    # the model: as 04 starts it (bert), randomly initialised (the authors' code), or a checkpoint's weights
    model = new_model(args, features, device, pretrained=args.init != "random")
    if args.init not in ("bert", "random"):
        check_features_match(read_config(args.init), features, args.init)
        load_init_weights(model, args.init, "--init")
    config = model.config

    # the data: trusted examples first, then the scored self-generated pool
    items = training_items(args.captions, args.selfgen, args.test_ids, not args.no_split_check)
    trusted, skipped = make_examples(items.trusted, model.tokenizer, config.levels, "trusted", features)
    pool, pool_skipped = make_examples(items.selfgen, model.tokenizer, config.levels, "selfgen", features)
    skipped.update(items.skipped + pool_skipped)
    items.check_left_out(skipped, args.max_left_out, args.captions, args.selfgen, features, config.levels)
    u = scores_for(pool.caption_ids, args.quality)
    n_trusted = len(trusted)
    examples = trusted.extend(pool)  # trusted captions first, then the pool
    if args.init in ("bert", "random"):  # (a checkpoint brings its own statistics)
        standardize_regions(model, features, examples.image_ids)
    lengths = np.array([len(t) for t in pool.tokens])
    plan = make_plan(u, n_trusted, lengths, np.array(pool.levels), config.num_levels, args)
    if world > 1:  # every rank must draw the same captions
        digests = [None] * world
        torch.distributed.all_gather_object(digests, [p["digest"] for p in plan])
        if any(d != digests[0] for d in digests):
            sys.exit("error: DDP ranks drew different captions")
    if rank == 0:
        report_plan(plan, items.notes, skipped, features, n_trusted, u, out, args)

    trainer = Trainer(model, examples, RegionCache.for_model(features, config), settings_from_args(args), out,
                      {"train": vars(args), "stage": "06_train_selection", "run": training_record(args),
                       **feature_record(features)}, device, rank, world,
                      validation_check(args, features, items.val_ids, device))
    if trainer.resume() and rank == 0:
        print(f"resumed from {out} at step {trainer.step}")
    if rank == 0:
        print(f"model: {args.preset}, {count_parameters(model) / 1e6:.1f}M parameters; {world} process(es) on {device}")

    for entry in plan:
        if trainer.step >= entry["end"]:
            continue
        members = training_set(entry, u, n_trusted, len(examples), args)
        if rank == 0:
            print(f"iteration {entry['iteration']}: T={entry['threshold']}, drawn {entry['drawn']} of {entry['pool']}, "
                  f"mean length {entry.get('mean_length')}, levels {entry.get('levels')}, steps {entry['start']}-{entry['end']}")
        start = entry["start"]
        batch_for = (lambda step, members=members, start=start, i=entry["iteration"]:
                     members[epoch_batches(len(members), args.batch_size, step - start, args.seed, ("iter", i))])
        trainer.run(entry["end"], batch_for, desc=f"06 it {entry['iteration']}",
                    state_for=lambda step, i=entry["iteration"]: {"iteration": i})
    finish_distributed(out, rank, world)


if __name__ == "__main__":
    run_main(main)
