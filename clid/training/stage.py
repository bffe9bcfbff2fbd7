"""A training stage's set-up around the loop: its processes and features (:func:`start_run`), its model
(:func:`new_model`), the region statistics, the validation check, and its :class:`~clid.training.loop.Trainer`
(:func:`make_trainer`)."""
import os

import numpy as np
import torch

from clid.base.files import DataError
from clid.base.rng import item_rng, item_seed
from clid.data.examples import Examples
from clid.data.store import FeatureStore, RegionCache
from clid.model.captioner import Captioner, count_parameters
from clid.model.checkpoints import feature_record
from clid.run import runtime
from clid.training.batches import corpus_vocab
from clid.training.distributed import init_distributed
from clid.training.flags import settings_from_args
from clid.training.loop import Trainer
from clid.training.resume import already_trained, check_resume, hold_out_folder, training_record


def start_run(args):
    """(rank, world, device plan, features) for a training stage; None when ``--out`` is already trained.
    ``--threads`` fixes torch's thread count first (0: torch's own)."""
    runtime.set_threads(args.threads)
    rank, world, plan = init_distributed(args.dist_timeout, args.precision)
    if args.batch_size < world:
        raise DataError(None, None, f"--batch-size {args.batch_size} is the global batch, split over {world} "
                                    f"processes: give at least {world}")
    if rank == 0:
        hold_out_folder(args)
    check_resume(args, rank, world)
    if already_trained(args, rank):
        return None
    try:
        features = FeatureStore(args.features, bad=args.bad_features)
    except FileNotFoundError as err:
        raise DataError(None, None, str(err)) from None
    return rank, world, plan, features


def new_model(args, features: FeatureStore, device, pretrained: bool = True, files=None) -> Captioner:
    """The captioner of ``--preset``, the same initial weights in every run and process.

    ``pretrained=False`` leaves out the preset's BERT weights (a random initialisation); ``files``: the run's
    :class:`CaptionFiles`, which ``--output-vocab`` reads its files from.
    """
    from clid.base.text import load_tokenizer
    from clid.model.captioner import build_model, preset_config

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
        from clid.model.captioner import load_region_init

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


def quick_control_precision(model: Captioner, features: FeatureStore, image_ids: list[str], device,
                            precision: str = "fp32") -> dict:
    """Share of ``image_ids`` whose caption decoded at each level has a length inside that level."""
    from clid.evaluation.metrics import control_precision
    from clid.model.decode import generate_captions

    levels = list(range(1, model.config.num_levels + 1))
    captions = generate_captions(model, features, image_ids, levels, device=device,
                                 precision=runtime.resolve(precision, device))
    shares = control_precision(captions, image_ids, model.levels, model.tokenizer)
    return {f"cp{level}": round(share, 3) for level, share in shares.items()}


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


def check_predictable(examples: Examples, model: Captioner, paths: dict) -> None:
    """Refuse, before training, captions holding a word the model's output shortlist (``--output-vocab``) leaves
    out: the loss could not score them. One line: the file, how many, the first caption and its word."""
    vocab = model.config.output_vocab
    if vocab is None:
        return
    outside = examples.outside(vocab)
    if not outside.any():
        return
    first, sources, known = int(np.flatnonzero(outside)[0]), np.array(examples.sources), set(vocab)
    source = sources[first]
    word = model.tokenizer.convert_ids_to_tokens(next(t for t in examples.tokens[first] if t not in known))
    count = int((outside & (sources == source)).sum())
    raise DataError(paths.get(source), f"caption {examples.caption_ids[first]}",
                    f"holds {word!r}, outside the model's output vocabulary (--output-vocab), as {count} captions of "
                    "this file do: give this file to --output-vocab too")


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
