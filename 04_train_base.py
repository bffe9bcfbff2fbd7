"""Stage 04: train a base length-aware captioner (LaBERT recipe).

    python 04_train_base.py --captions captions.json --features features.h5 --data trusted --out runs/trusted
    python 04_train_base.py --captions captions.json --features features.h5 --data extended \\
        --selfgen paraphrased.jsonl --out runs/extended
    torchrun --nproc_per_node 4 04_train_base.py ...          # DDP: NCCL on GPU, gloo on CPU

In:  trusted captions (the train split of a Karpathy JSON), region features, and for
     ``--data extended`` the self-generated captions (only those of train-split images are used).
     No test image is trained on: a file without splits (the official COCO captions: convert it
     with ``python -m clid.captions convert-coco``) needs ``--test-ids FILE|karpathy``, and COCO
     training images that are Karpathy test images stop the run (``--no-split-check`` overrides).
Out: a checkpoint folder (model.safetensors, config.json, tokenizer, optimizer.pt, train_state.json,
     train_log.jsonl). Killing the run and starting the same command again resumes from the last
     checkpoint; on CPU the final weights equal those of an uninterrupted run.

The paper only says that M_theta is trained on the trusted captions; the authors' code trains
M_theta~ first and continues it on the trusted captions, weights, optimizer state and learning-rate
schedule included. That is the recipe:

    python 04_train_base.py ... --data extended --selfgen FILE --out runs/extended --lr-horizon 300000
    python 04_train_base.py ... --data trusted --continue-from runs/extended --max-steps 200000 --out runs/scoring

(the authors' configuration: one 300,000-step cosine, of which M_theta~ trains steps 0-100,000 and
M_theta steps 100,000-200,000). With ``--continue-from`` the step count goes on from the
checkpoint's (``--max-steps`` is the last step) under the checkpoint's learning rate, warm-up and
``--lr-horizon``. An independently trained
M_theta (the trusted-only baseline) is the same command without ``--continue-from``;
``--init-from CKPT`` copies only the weights. ``--balanced`` draws the captions as the authors'
``balanced_training`` (every length level an equal share of the batches: the length-balanced
baseline of the paper's Figure 5). Recipe (flags default to it): mask a uniform count of positions
in [max(1, 0.1 * len), len]; label-smoothed (0.1) cross-entropy on masked positions, "." weighted
0.5; AdamW lr 5e-5, weight decay 0.01, 1,000 warm-up steps then cosine; gradient clip 1.0; batch 64.
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from clid.base.files import DataError, check_outputs, read_json
from clid.data.inputs import CaptionFiles, report_skipped, training_examples, training_items
from clid.data.store import FeatureStore, RegionCache, cache_bytes, check_features_match
from clid.run.cli import HelpFormatter, run_main
from clid.run.recipes import resolved
from clid.training.flags import (
    add_train_args,
    check_train_args,
    parse_train_args,
    recipe_schedule,
    recipe_vocab,
    train_arg_groups,
)


def parser() -> argparse.ArgumentParser:
    """This stage's flags (a recipe's flag tables are checked against them: clid/run/recipes.py check)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    groups = train_arg_groups(p)
    groups["data"].add_argument("--captions", required=True, help="trusted captions (Karpathy JSON or COCO captions JSON)")
    groups["data"].add_argument("--data", choices=["trusted", "extended"], default="trusted",
                                help="trusted: the trusted captions alone (M_theta, the trusted-only baseline); extended: "
                                     "with the self-generated captions of --selfgen (M_theta~)")
    groups["data"].add_argument("--selfgen", help="self-generated captions JSONL (required for --data extended)")
    groups["data"].add_argument("--balanced", action="store_true",
                                help="every length level an equal share of the batches, as the authors' "
                                     "balanced_training (the length-balanced baseline; off: shuffled epochs)")
    groups["model"].add_argument("--continue-from", metavar="CKPT",
                                 help="continue this checkpoint: its weights, optimizer state, step and learning-rate "
                                      "schedule (the authors' code: M_theta continues M_theta~); --max-steps is then "
                                      "the last step")
    groups["model"].add_argument("--init-from", metavar="CKPT", help="start from this checkpoint's weights only")
    add_train_args(groups)
    return p


def parse_args(argv=None):
    p = parser()
    args = parse_train_args(p, argv, lambda args: "scoring" if args.continue_from else args.data)
    if args.data == "extended" and not args.selfgen:
        p.error("--data extended needs --selfgen FILE")
    if args.continue_from and args.init_from:
        p.error("--continue-from and --init-from exclude each other")
    if args.region_init and (args.continue_from or args.init_from):
        p.error("--region-init sets a new model's first region layer; a checkpoint (--init-from, --continue-from) "
                "brings its own")
    check_outputs({"--out": args.out}, {"--continue-from": args.continue_from, "--init-from": args.init_from})
    if args.continue_from:
        continued_schedule(args)
    else:  # --recipe demo: M_theta~'s cosine spans 3x its steps (the authors' proportions), so a scoring model can continue it
        extended_horizon = resolved(args.recipe).get("extended_horizon", 1)
        recipe_schedule(args, horizon_factor=extended_horizon if args.data == "extended" else 1)
        recipe_vocab(args, args.captions, args.selfgen if args.data == "extended" else None)
    check_train_args(p, args)
    return args


def continued_schedule(args) -> None:
    """Take the learning rate, warm-up and horizon of the checkpoint that ``--continue-from`` continues (with
    ``--recipe demo`` also its output vocabulary, and ``--max-steps`` defaults to its step plus the recipe's)."""
    from clid.model.checkpoints import check_same_levels, checkpoint_exists, read_train_state

    folder = Path(args.continue_from)
    if not checkpoint_exists(folder):
        raise SystemExit(f"error: --continue-from {folder}: no checkpoint with a training state there")
    step = int(read_train_state(folder)["step"])
    config = read_json(folder / "config.json")
    if not isinstance(config, dict) or not isinstance(config.get("model"), dict):
        raise DataError(folder / "config.json", None, "no model config: not a checkpoint's config.json")
    if "levels" in config["model"]:  # (a config without it fails, clearly, when the weights load)
        check_same_levels("--continue-from", folder, config["model"]["levels"], args.levels)
    train = config.get("train", {})
    for name in ("lr", "warmup", "lr_horizon"):
        if name in train:
            setattr(args, name, train[name])
    recipe_schedule(args, start_step=step)
    recipe_vocab(args, *(train.get("output_vocab") or []))
    horizon = args.lr_horizon or train.get("max_steps", step)
    if step >= args.max_steps:
        raise SystemExit(f"error: --continue-from {folder} is at step {step}; --max-steps ({args.max_steps}) is the "
                         "last step of the continued run and must be larger")
    if horizon <= step:
        raise SystemExit(f"error: --continue-from {folder}: its learning rate reached 0 at step {horizon}; train it "
                         f"with --lr-horizon {args.max_steps} (its steps and the continued ones) to continue it")
    if horizon < args.max_steps:
        raise SystemExit(f"error: --continue-from {folder}: its learning rate reaches 0 at step {horizon}, before "
                         f"--max-steps {args.max_steps}; train it with --lr-horizon {args.max_steps} to continue it "
                         f"that far, or give --max-steps {horizon}")
    args.lr_horizon = horizon


def load_examples(args, features: FeatureStore, tokenizer, levels, rank: int, files: CaptionFiles):
    """Trusted (+ self-generated) training examples, with every skipped caption counted."""
    items = training_items(args.captions, args.selfgen if args.data == "extended" else None,
                           args.test_ids, not args.no_split_check, files, tokenizer)
    trusted, selfgen, skipped = training_examples(items, levels, features)
    examples = trusted + selfgen
    items.check_left_out(skipped, args.max_left_out, args.captions, args.selfgen, features, levels)
    if rank == 0:
        kinds = Counter(examples.sources)
        for note in items.notes:
            print(note)
        print(f"training captions: {len(examples)} ({', '.join(f'{k} {v}' for k, v in sorted(kinds.items()))}); "
              f"validation images: {len(items.val_ids)}")
        report_skipped(skipped, features)
    if not len(examples):
        sys.exit(f"error: no training captions left from {args.captions}")
    return examples, items.val_ids


def main(argv=None):
    args = parse_args(argv)
    # the model stack (torch), imported once the flags are read: --help and a bad flag answer at once
    from clid.model.checkpoints import load_init_weights, read_config, write_model_card
    from clid.training.batches import balanced_batches, epoch_batches
    from clid.training.distributed import finish_distributed
    from clid.training.stage import check_predictable, make_trainer, new_model, standardize_regions, start_run

    started = start_run(args)
    if started is None:
        return
    rank, world, plan, features = started
    files = CaptionFiles(args.levels, args.token_cache)  # every caption file read once, shared by what follows
    model = new_model(args, features, plan.device, files=files)
    if args.init_from or args.continue_from:
        source = args.init_from or args.continue_from
        check_features_match(read_config(source), features, source)
        load_init_weights(model, source, "--init-from" if args.init_from else "--continue-from")
    examples, val_ids = load_examples(args, features, model.tokenizer, model.levels, rank, files)
    check_predictable(examples, model, {"trusted": args.captions, "selfgen": args.selfgen})
    if not (args.init_from or args.continue_from):  # (a checkpoint brings its own statistics)
        standardize_regions(model, features, examples.image_ids)

    trainer = make_trainer(args, "04_train_base", model, examples, RegionCache.for_model(features, model.config, cache_bytes(args.region_cache)),
                           features, val_ids, args.out, plan, rank, world, continue_from=args.continue_from)
    n = len(examples)
    batch_for = (balanced_batches(examples.levels, args.batch_size, args.seed) if args.balanced
                 else lambda step: epoch_batches(n, args.batch_size, step, args.seed))
    trainer.run(args.max_steps, batch_for, desc=f"04 {args.data}")
    if rank == 0:
        write_model_card(args.out, "04_train_base.py")
    finish_distributed(args.out, rank, world)


if __name__ == "__main__":
    run_main(main)
