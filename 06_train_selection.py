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
extended set, no selection; the same as ``--strategy none``).

Other strategies on the same data, model, steps, batch and seed (``--strategy``, clid/selection/schedule.py):
``loss-remove`` and ``loss-replacecap`` (loss-based curation every ``--curate-every`` steps),
``curriculum`` (Baby Step over ``--buckets`` difficulty buckets, ``--difficulty clip:DIR|bootstrap:CKPT|u``)
and ``none`` (the whole extended set). Their decisions are kept in the checkpoints, so each resumes
after a kill with the same training sets.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from clid.data.inputs import CaptionFiles, caption_texts, report_skipped, training_examples, training_items, usable
from clid.data.store import RegionCache, cache_bytes, check_features_match
from clid.run.cli import HelpFormatter, number, positive_float, positive_int, run_main
from clid.run.recipes import selection_eta
from clid.selection import strategies
from clid.training.flags import (
    add_train_args,
    check_train_args,
    parse_train_args,
    recipe_schedule,
    recipe_vocab,
    train_arg_groups,
)

CAPTION_ETA, PARAGRAPH_ETA = 1200, 200


def parser() -> argparse.ArgumentParser:
    """This stage's flags (a recipe's flag tables are checked against them: clid/run/recipes.py check)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    groups = train_arg_groups(p)
    data, schedule = groups["data"], groups["schedule"]
    strategy = p.add_argument_group("selection", "the strategy that picks each round's self-generated captions")
    data.add_argument("--captions", required=True, help="trusted captions (Karpathy JSON, or any caption file with "
                                                        "--test-ids)")
    data.add_argument("--selfgen", required=True, help="self-generated (paraphrased) captions JSONL, the pool scored "
                                                       "by 05")
    data.add_argument("--quality", help="quality HDF5 from 05 (needed by --strategy clid and --difficulty u)")
    schedule.add_argument("--c", type=number(float, low=0, high=100, low_open=True), default=2.0,
                          help="percent of the pool dropped per iteration")
    schedule.add_argument("--s", type=positive_float, default=1.0, help="smoothness of the weighting")
    schedule.add_argument("--eta", type=positive_int, default=None,
                          help="optimizer steps per iteration (the paper: 1200 for captions, 200 for paragraphs; "
                               "--recipe demo: the 50 iterations span 90%% of --max-steps)")
    schedule.add_argument("--full-epochs", action="store_true",
                          help="one epoch of trusted + drawn captions per iteration instead of --eta steps (an option "
                               "of the authors' code, off in their configuration, which trains 1200 steps per "
                               "iteration)")
    schedule.add_argument("--schedule", choices=["smooth", "constant", "hard", "none"], default="smooth",
                          help="how a caption's chance to be drawn follows u: smooth (the paper's tanh of (u - T_i) / s), "
                               "constant (every caption alike: the paper's ablation), hard (a step at T_i), none (the "
                               "whole extended set, no selection)")
    groups["model"].add_argument("--init", default="random",
                                 help="random (the authors' code re-initialises the model) | bert (as 04 starts) | "
                                      "a checkpoint folder")
    strategies.add_strategy_args(strategy)
    add_train_args(groups)
    p.set_defaults(lr_horizon=300_000)  # the authors' schedule: a 300,000-step cosine, of which 06 trains 100,000
    return p


def parse_args(argv=None):
    p = parser()
    args = parse_train_args(p, argv, "selection")
    recipe_schedule(args)  # --recipe demo: its steps, and a cosine that ends with them
    recipe_vocab(args, args.captions, args.selfgen)
    check_train_args(p, args)
    if args.eta is None:  # --recipe demo: the 50 iterations span 90% of the steps (recipes/demo.toml)
        args.eta = selection_eta(args.recipe, args.max_steps)
    if args.eta is None:  # the paper's eta: 200 on the (much smaller) paragraph set, else 1200
        args.eta = PARAGRAPH_ETA if args.levels == "paragraph" else CAPTION_ETA
    if args.init not in ("bert", "random") and not Path(args.init).is_dir():
        p.error(f"--init must be bert, random or a checkpoint folder (got {args.init!r})")
    if args.region_init and args.init not in ("bert", "random"):
        p.error("--region-init sets a new model's first region layer; the checkpoint of --init brings its own")
    strategies.check_strategy_args(p, args)
    return args


def main(argv=None):
    args = parse_args(argv)
    # the model stack (torch, the kernels), imported once the flags are read: --help and a bad flag answer at once
    from clid.model.checkpoints import load_init_weights, read_config, write_model_card
    from clid.selection import schedule
    from clid.training.batches import epoch_batches, epoch_order
    from clid.training.distributed import finish_distributed
    from clid.training.stage import check_predictable, make_trainer, new_model, standardize_regions, start_run

    started = start_run(args)
    if started is None:
        return
    rank, world, plan, features = started
    out = Path(args.out)
    files = CaptionFiles(args.levels, args.token_cache)  # every caption file read once, shared by what follows
    # the model: as 04 starts it (bert), randomly initialised (the authors' code), or a checkpoint's weights
    model = new_model(args, features, plan.device, pretrained=args.init != "random", files=files)
    if args.init not in ("bert", "random"):
        check_features_match(read_config(args.init), features, args.init)
        load_init_weights(model, args.init, "--init")
    config = model.config

    # the data: trusted examples first, then the self-generated pool (scored by 05 for CLID)
    items = training_items(args.captions, args.selfgen, args.test_ids, not args.no_split_check, files, model.tokenizer)
    trusted, pool, skipped = training_examples(items, config.levels, features)
    items.check_left_out(skipped, args.max_left_out, args.captions, args.selfgen, features, config.levels)
    u = schedule.scores_for(pool.caption_ids, args.quality, pool.digests, args.selfgen) if args.strategy == "clid" else None
    n_trusted = len(trusted)
    examples = trusted + pool  # trusted captions first, then the pool
    check_predictable(examples, model, {"trusted": args.captions, "selfgen": args.selfgen})
    if args.init in ("bert", "random"):  # (a checkpoint brings its own statistics)
        standardize_regions(model, features, examples.image_ids)
    regions = RegionCache.for_model(features, config, cache_bytes(args.region_cache))

    # the strategy: which captions each round trains on
    data = schedule.Pool(examples.image_ids, examples.caption_ids, n_trusted, pool.lengths, pool.levels,
                          config.num_levels)
    val, _ = usable(items.val, config.levels, "val", features)
    check = same_on_every_rank(world)
    texts = (caption_texts(examples.caption_ids, files.records(args.captions)[0], args.selfgen,
                           examples.digests)
             if (args.difficulty or "").startswith("clip:") else None)  # (CLIP reads the text, not the tokens)
    strategy = strategies.make_strategy(args, data, examples, model, regions, plan.device, out, u, val, texts,
                                       items.filenames, check, rank)
    if check and isinstance(strategy, schedule.Schedule):  # every rank must draw the same captions
        check([p["digest"] for p in strategy.plan])
    if rank == 0:
        report_data(items.notes, skipped, features, n_trusted, len(pool), u)
        print("\n".join(strategy.summary()))
        schedule.write_log(out, strategy.log_rows())

    trainer = make_trainer(args, "06_train_selection", model, examples, regions, features, items.val_ids, out,
                           plan, rank, world)

    rounds = strategy.rounds(trainer.step, trainer.state)
    if isinstance(strategy, schedule.Schedule):  # a plan fixed before training: each round drawn while one trains
        rounds = schedule.prepared_ahead(rounds, lambda rnd: epoch_order(len(rnd.members), args.seed, rnd.key, 0))
    for rnd in rounds:
        if rank == 0:
            print(rnd.description)
            if not isinstance(strategy, schedule.Schedule):  # the log grows with each curation or evaluation
                schedule.write_log(out, strategy.log_rows())
        batch_for = (lambda step, rnd=rnd: rnd.members[epoch_batches(len(rnd.members), args.batch_size, step - rnd.start,
                                                                     args.seed, rnd.key)])
        trainer.run(rnd.end, batch_for, desc=f"06 {rnd.key[0]} {rnd.key[1]}", state_for=lambda step, rnd=rnd: rnd.state)
    if rank == 0 and hasattr(strategy, "seconds"):
        print(f"curation time: {strategy.seconds():.1f} s")
    if rank == 0:
        write_model_card(out, "06_train_selection.py")
    finish_distributed(out, rank, world)


def report_data(notes, skipped, features, n_trusted: int, n_pool: int, u) -> None:
    """Print what is trained on: the split guard's notes, the counts, and what was skipped."""
    for note in notes:
        print(note)
    print(f"trusted captions: {n_trusted}; self-generated pool: {n_pool}"
          + (f" (u mean {float(u.mean()):+.3f})" if u is not None else ""))
    report_skipped(skipped, features)


def same_on_every_rank(world: int):
    """A check that every DDP rank holds the same value (a selection's digest); None on one process."""
    if world == 1:
        return None

    def check(value) -> None:
        import torch.distributed

        values = [None] * world
        torch.distributed.all_gather_object(values, value)
        if any(v != values[0] for v in values):
            sys.exit("error: DDP ranks drew different captions")

    return check


if __name__ == "__main__":
    run_main(main)
