"""The flags of 04 and 06 (their shared groups, recipe defaults and checks) and the settings a run trains with."""
import argparse
import sys
from dataclasses import dataclass

from clid.data.inputs import add_left_out_arg, add_token_cache_arg
from clid.data.region_inputs import BOX_INPUTS, REGION_NORMS
from clid.data.splits import add_split_args
from clid.data.store import add_bad_features_arg, add_region_cache_arg
from clid.run import runtime
from clid.run.cli import (
    add_download_arg,
    add_levels_arg,
    non_negative_float,
    non_negative_int,
    number,
    positive_float,
    positive_int,
    probability,
)
from clid.run.recipes import (
    DEMO_STEPS_ENV,
    PAPER,
    flag_defaults,
    recipe_arg,
    recipe_flag_values,
    recipe_names,
    resolved,
    resolved_steps,
)

# --dist-timeout: a week at most (a longer wait is no timeout, and 1e308 minutes overflows the clock's type)
dist_minutes = number(float, low=0, high=7 * 24 * 60, low_open=True, what="a number of minutes in (0, 10080]")

DIST_TIMEOUT_MINUTES = 60.0  # --dist-timeout: a rank may wait this long for the others (e.g. a checkpoint)

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
        which = model(args) if callable(model) else model
        try:
            values = recipe_flag_values(p, args.recipe, which)
        except ValueError as err:
            p.error(f"--recipe {args.recipe}: {err}")
        p.set_defaults(**{**flag_defaults(args.recipe, which), **values})
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
    run.add_argument("--threads", type=non_negative_int, default=0,
                     help="torch's threads in this process (0: torch's own count, OMP_NUM_THREADS or the cores). A CPU "
                          "splits its float sums by the thread count, so the same seed trains the same weights only at "
                          "the same count; --recipe demo: 1 (recipes/demo.toml)")
    run.add_argument("--dist-timeout", type=dist_minutes, default=DIST_TIMEOUT_MINUTES, metavar="MINUTES",
                     help="under torchrun: how long a process waits for the others (a checkpoint written to a slow "
                          "shared file system, a rank restarting) before the run fails; at most a week (10080)")
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
