"""Stage 04: train a base length-aware captioner (LaBERT recipe).

    python 04_train_base.py --captions captions.json --features features.h5 --data trusted --out runs/trusted
    python 04_train_base.py --captions captions.json --features features.h5 --data extended \\
        --selfgen paraphrased.jsonl --out runs/extended
    torchrun --nproc_per_node 4 04_train_base.py ...          # DDP: NCCL on GPU, gloo on CPU

In:  trusted captions (the train split of a Karpathy / COCO captions file), region features, and for
     ``--data extended`` the self-generated captions (only those of train-split images are used).
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
from pathlib import Path

import torch

from clid.files import DataError, FeatureStore
from clid.rng import item_seed
from clid.text import get_levels, load_tokenizer
from clid.model import build_model, count_parameters, preset_config
from clid.train import (RegionCache, Trainer, TrainSettings, epoch_batches, init_distributed, make_examples,
                        read_train_state, checkpoint_exists, load_init_weights, quick_control_precision,
                        corpus_vocab, training_items)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--captions", required=True, help="trusted captions (Karpathy JSON or COCO captions JSON)")
    p.add_argument("--features", required=True, help="region features HDF5")
    p.add_argument("--data", choices=["trusted", "extended"], default="trusted")
    p.add_argument("--selfgen", help="self-generated captions JSONL (required for --data extended)")
    p.add_argument("--out", required=True, help="checkpoint folder")
    p.add_argument("--preset", choices=["tiny", "minilm", "labert"], default="labert")
    p.add_argument("--bert", help="BERT folder or hub name for minilm/labert (default: the preset's)")
    p.add_argument("--levels", choices=["caption", "paragraph", "labert"], default="caption")
    p.add_argument("--output-vocab", nargs="+", metavar="FILE",
                   help="restrict the LM head to the tokens of these caption files (a speed option for small "
                        "CPU runs such as the demo; default: the whole vocabulary, as in the paper)")
    p.add_argument("--init-from", help="start from this checkpoint's weights (the authors' code: trusted from extended)")
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--warmup", type=int, default=1000)
    p.add_argument("--max-steps", type=int, default=100_000)
    p.add_argument("--batch-size", type=int, default=64, help="global batch size (split over DDP processes)")
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--label-smoothing", type=float, default=0.1)
    p.add_argument("--eos-weight", type=float, default=0.5, help='loss weight of "." targets')
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--save-every", type=int, default=1000)
    p.add_argument("--eval-every", type=int, default=1000, help="control-precision check every N steps (0: off)")
    p.add_argument("--eval-images", type=int, default=100, help="validation images in that check")
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def load_examples(args, features: FeatureStore, tokenizer, levels, rank: int):
    """Trusted (+ self-generated) training examples, with every skipped caption counted."""
    if args.data == "extended" and not args.selfgen:
        sys.exit("error: --data extended needs --selfgen FILE")
    items = training_items(args.captions, args.selfgen if args.data == "extended" else None)
    examples, skipped = make_examples(items.trusted, tokenizer, levels, "trusted", features)
    # paragraph captions keep their "." sentence breaks
    more, more_skipped = make_examples(items.selfgen, tokenizer, levels, "selfgen", features,
                                       keep_sentences=levels == get_levels("paragraph"))
    examples.extend(more)
    skipped.update(items.skipped + more_skipped)
    if rank == 0:
        kinds = Counter(examples.sources)
        print(f"training captions: {len(examples)} ({', '.join(f'{k} {v}' for k, v in sorted(kinds.items()))}); "
              f"validation images: {len(items.val_ids)}")
        for reason, count in sorted(skipped.items()):
            print(f"  skipped {count}: {reason}")
    if not len(examples):
        sys.exit(f"error: no training captions left from {args.captions}")
    return examples, [i for i in items.val_ids if i in features]


def main(argv=None):
    args = parse_args(argv)
    rank, world, device = init_distributed()
    out = Path(args.out)
    if checkpoint_exists(out) and read_train_state(out)["step"] >= args.max_steps:
        if rank == 0:
            print(f"{out} is already trained to {args.max_steps} steps; nothing to do")
        return
    try:
        features = FeatureStore(args.features)
    except FileNotFoundError as err:
        sys.exit(f"error: {err}")

    output_vocab = corpus_vocab(args.output_vocab, load_tokenizer()) if args.output_vocab else None
    config = preset_config(args.preset, features.feature_dim(), args.levels, args.bert, dropout=args.dropout,
                           output_vocab=output_vocab)
    torch.manual_seed(item_seed(args.seed, "init"))  # the same initial weights in every run and process
    model = build_model(config).to(device)
    if args.init_from:
        load_init_weights(model, args.init_from)
    try:
        examples, val_ids = load_examples(args, features, model.tokenizer, config.levels, rank)
    except DataError as err:
        sys.exit(f"error: {err}")

    settings = TrainSettings(lr=args.lr, weight_decay=args.weight_decay, warmup=args.warmup, max_steps=args.max_steps,
                             batch_size=args.batch_size, grad_clip=args.grad_clip, label_smoothing=args.label_smoothing,
                             eos_weight=args.eos_weight, save_every=args.save_every, eval_every=args.eval_every,
                             log_every=args.log_every, seed=args.seed)
    eval_ids = val_ids[: args.eval_images]
    regions = RegionCache(features, use_cls_prob=config.num_classes > 0)
    evaluate = (lambda m, step: quick_control_precision(m, features, eval_ids, device)) if eval_ids else None
    trainer = Trainer(model, examples, regions, settings, out, {"train": vars(args), "stage": "04_train_base"},
                      device, rank, world, evaluate)
    if trainer.resume() and rank == 0:
        print(f"resumed from {out} at step {trainer.step}")
    if rank == 0:
        print(f"model: {args.preset}, {count_parameters(model) / 1e6:.1f}M parameters; {world} process(es) on {device}")
    n = len(examples)
    trainer.run(args.max_steps, lambda step: epoch_batches(n, args.batch_size, step, args.seed), desc=f"04 {args.data}")
    if rank == 0:
        print(f"checkpoint: {out}")
    if world > 1:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
