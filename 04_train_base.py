"""Stage 04: train a base length-aware captioner (LaBERT recipe).

    python 04_train_base.py --captions captions.json --features features.h5 --data trusted --out runs/trusted
    python 04_train_base.py --captions captions.json --features features.h5 --data extended \\
        --selfgen paraphrased.jsonl --out runs/extended
    torchrun --nproc_per_node 4 04_train_base.py ...          # DDP: NCCL on GPU, gloo on CPU

In:  trusted captions (the train split of a Karpathy JSON), region features, and for
     ``--data extended`` the self-generated captions (only those of train-split images are used).
     No test image is trained on: a file without splits (the official COCO captions: convert it
     with ``python -m clid.data convert-coco``) needs ``--test-ids FILE|karpathy``, and COCO
     training images that are Karpathy test images stop the run (``--no-split-check`` overrides).
Out: a checkpoint folder (model.safetensors, config.json, tokenizer, optimizer.pt, train_state.json,
     train_log.jsonl). Killing the run and starting the same command again resumes from the last
     checkpoint; on CPU the final weights equal those of an uninterrupted run.

The paper trains M_theta (trusted) and M_theta~ (extended) independently: that is the default.
``--init-from CKPT`` reproduces the authors' code, where the trusted model continues from the
extended one. Recipe (flags default to it): mask a uniform count of positions in
[max(1, 0.1 * len), len]; label-smoothed (0.1) cross-entropy on masked positions, "." weighted 0.5;
AdamW lr 5e-5, weight decay 0.01, 1,000 warm-up steps then cosine; gradient clip 1.0; batch 64.
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter

from clid.examples import RegionCache, make_examples, training_items
from clid.files import DataError, FeatureStore, run_main
from clid.model import count_parameters
from clid.train import (Trainer, add_train_args, epoch_batches, finish_distributed, load_init_weights, new_model,
                        run_record, settings_from_args, start_run, standardize_regions, validation_check)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--captions", required=True, help="trusted captions (Karpathy JSON or COCO captions JSON)")
    p.add_argument("--data", choices=["trusted", "extended"], default="trusted")
    p.add_argument("--selfgen", help="self-generated captions JSONL (required for --data extended)")
    p.add_argument("--init-from", help="start from this checkpoint's weights (the authors' code: trusted from extended)")
    add_train_args(p)
    args = p.parse_args(argv)
    if args.data == "extended" and not args.selfgen:
        p.error("--data extended needs --selfgen FILE")
    return args


def load_examples(args, features: FeatureStore, tokenizer, levels, rank: int):
    """Trusted (+ self-generated) training examples, with every skipped caption counted."""
    items = training_items(args.captions, args.selfgen if args.data == "extended" else None,
                           args.test_ids, not args.no_split_check)
    examples, skipped = make_examples(items.trusted, tokenizer, levels, "trusted", features)
    more, more_skipped = make_examples(items.selfgen, tokenizer, levels, "selfgen", features)
    examples.extend(more)
    skipped.update(items.skipped + more_skipped)
    if rank == 0:
        kinds = Counter(examples.sources)
        for note in items.notes:
            print(note)
        print(f"training captions: {len(examples)} ({', '.join(f'{k} {v}' for k, v in sorted(kinds.items()))}); "
              f"validation images: {len(items.val_ids)}")
        for reason, count in sorted(skipped.items()):
            print(f"  skipped {count}: {reason}")
        if bad_line := features.skip_report():
            print(f"  {bad_line}")
    if not len(examples):
        sys.exit(f"error: no training captions left from {args.captions}")
    return examples, items.val_ids


def main(argv=None):
    args = parse_args(argv)
    started = start_run(args)
    if started is None:
        return
    rank, world, device, features = started
    model = new_model(args, features, device)
    if args.init_from:
        load_init_weights(model, args.init_from)
    try:
        examples, val_ids = load_examples(args, features, model.tokenizer, model.levels, rank)
    except DataError as err:
        sys.exit(f"error: {err}")
    if not args.init_from:  # (a checkpoint brings its own statistics)
        standardize_regions(model, features, examples.image_ids)

    trainer = Trainer(model, examples, RegionCache(features, model.config.num_classes), settings_from_args(args),
                      args.out, {"train": vars(args), "stage": "04_train_base",
                                "run": run_record(args)}, device, rank, world,
                      validation_check(args, features, val_ids, device))
    if trainer.resume() and rank == 0:
        print(f"resumed from {args.out} at step {trainer.step}")
    if rank == 0:
        print(f"model: {args.preset}, {count_parameters(model) / 1e6:.1f}M parameters; {world} process(es) on {device}")
    n = len(examples)
    trainer.run(args.max_steps, lambda step: epoch_batches(n, args.batch_size, step, args.seed), desc=f"04 {args.data}")
    finish_distributed(args.out, rank, world)


if __name__ == "__main__":
    run_main(main)
