"""Captions of any image at chosen length levels, from a trained checkpoint: the Python API.

    from clid.caption import CaptionWriter

    writer = CaptionWriter.from_checkpoint("runs/clid", features="features.h5")  # device: cuda if available
    writer.caption("42", levels=[1, 3, 6])     # {1: "a red car", 3: "...", 6: "..."}
    writer.caption(["42", "43"])               # {"42": {1: ..., ..., 7: ...}, "43": {...}}
    writer.caption(Regions(features, boxes, width, height), levels=[2])   # regions held in memory

:meth:`CaptionWriter.decode` is the batched form the caption command (``python -m clid.caption``,
:mod:`clid.caption.__main__`) and ``07_eval.py`` use; :func:`caption_records` turns its output
into the lines of the generated-captions JSONL. Decoding itself (LaBERT's mask-predict) lives in
:mod:`clid.model.decode`.
"""
from __future__ import annotations

from clid.eval.metrics import length_control
from clid.features.store import FeatureStore, Regions, check_features_match, region_problem
from clid.files import DataError, natural_key
from clid.text import get_levels, level_set_name

__all__ = ["CaptionWriter", "MemoryRegions", "Regions", "add_decoding_args", "caption_records", "check_features",
           "decode_steps", "default_device"]


BATCH_SIZE = 64  # images decoded together (--batch-size auto on the CPU)


def default_device() -> str:
    """``cuda`` when a GPU is there, else ``cpu``."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def add_decoding_args(parser) -> None:
    """The decoding flags of the caption command and ``07_eval.py``: ``--batch-size``, ``--precision``,
    ``--decode-steps``, ``--eos-decay``, ``--labert-average``, ``--length-count`` (the defaults are the
    authors')."""
    import argparse

    from clid import runtime
    from clid.cli import number, positive_int

    runtime.add_batch_size_arg(parser, BATCH_SIZE, "images decoded together")
    runtime.add_precision_arg(parser)
    parser.add_argument("--decode-steps", type=positive_int, nargs="+", default=None, metavar="N",
                        help="mask-predict iterations, one number per level of the checkpoint or one for every level "
                             "(default: the paper's 10, 15, ..., 40)")
    parser.add_argument("--eos-decay", type=number(float, low=0, high=1, low_open=True), default=1.0,
                        help="penalty on '.' inside a level's range, decay ** (distance to the level's end); "
                             "1.0: none, as in the authors' configuration")
    parser.add_argument("--labert-average", action=argparse.BooleanOptionalAction, default=True,
                        help="decoding as LaBERT's and the authors' code: re-predict every position and "
                             "average the confidences; --no-labert-average: re-predict only the re-masked positions")
    parser.add_argument("--length-count", choices=["authors", "strict"], default="authors",
                        help="the length of a caption that fills its level without '.': authors (the authors' code): "
                             "its tokens, no '.' (in range); strict: with a final '.' (one over)")


def decode_steps(steps, num_levels: int) -> tuple[int, ...] | None:
    """Mask-predict iterations per level from one number for every level or one per level (None: the
    paper's defaults); any other count is one clear error."""
    if steps is None:
        return None
    steps = [steps] if isinstance(steps, int) else list(steps)
    if len(steps) not in (1, num_levels):
        raise SystemExit(f"error: --decode-steps takes one number per level ({num_levels}) or one for all, "
                         f"not {len(steps)}")
    return tuple(steps * num_levels if len(steps) == 1 else steps)


def check_features(config, store: FeatureStore, checkpoint=None) -> None:
    """One DataError naming both files when ``store`` holds region features of another kind, dimension
    or class count than the model (``config``: its :class:`~clid.model.captioner.CaptionerConfig`;
    ``checkpoint``: its folder, whose config.json records the features it was trained on)."""
    from clid.model.checkpoints import read_config

    saved = read_config(checkpoint) if checkpoint else {"region_dim": config.region_dim}
    check_features_match(saved, store, checkpoint or "(in memory)")
    classes = store.num_classes()
    if config.num_classes and classes != config.num_classes:
        model = f"the checkpoint {checkpoint}" if checkpoint else "the model"
        found = f"{classes} class probabilities per region" if classes else "no class probabilities (cls_prob)"
        raise DataError(store.path, None, f"has {found}, but {model} reads {config.num_classes}")


class MemoryRegions:
    """Region features held in memory, read like a :class:`FeatureStore`: image id -> :class:`Regions`."""

    path = "<regions in memory>"

    def __init__(self, regions: dict[str, Regions], dim: int):
        for image_id, r in regions.items():
            if problem := region_problem(r, dim):
                raise DataError(self.path, f"image {image_id}", problem)
        self.regions = regions

    def get(self, image_id) -> Regions:
        return self.regions[str(image_id)]


class CaptionWriter:
    """A trained captioner that writes captions at chosen length levels.

    ``features``: the region-feature file (a path or a :class:`FeatureStore`) the image ids refer to.
    Decoding options (the defaults are the authors'): ``steps`` (mask-predict iterations per level;
    None: 10, 15, ..., 40), ``eos_decay`` and ``labert_average`` (see :mod:`clid.model.decode`).
    ``batch_size``: images decoded together, or "auto" (:mod:`clid.runtime`: 64 on the CPU, on a GPU as
    many as half its free memory holds); ``precision``: "auto" (bfloat16 autocast on a GPU, float32 on
    the CPU), "fp32" or "bf16".
    """

    def __init__(self, model, features=None, device: str | None = None, batch_size="auto",
                 steps: tuple[int, ...] | None = None, eos_decay: float = 1.0, labert_average: bool = True,
                 checkpoint=None, precision: str = "auto"):
        from clid import runtime

        self.model, self.checkpoint = model, checkpoint
        self.device = device or default_device()
        self.precision = runtime.resolve(precision, self.device)
        self.batch_size, self.steps, self.eos_decay, self.labert_average = batch_size, steps, eos_decay, labert_average
        self.features = None
        if features is not None:
            self.use_features(features)

    @classmethod
    def from_checkpoint(cls, folder, device: str | None = None, features=None, **options) -> "CaptionWriter":
        """Load a checkpoint folder (04, 06) onto ``device`` (default: cuda if available, else cpu)."""
        from clid.cli import device_problem
        from clid.model import checkpoints

        device = device or default_device()
        if problem := device_problem(str(device)):
            raise ValueError(f"device: {problem}")
        return cls(checkpoints.load_checkpoint(folder, device=device), features, device, checkpoint=folder, **options)

    @property
    def levels(self) -> tuple[tuple[int, int], ...]:
        """The checkpoint's length levels: level n (from 1) is ``levels[n - 1]``, an inclusive token range."""
        return get_levels(self.model.levels)

    def use_features(self, features) -> None:
        """Read image ids from this region-feature file (a path or a :class:`FeatureStore`)."""
        store = features if isinstance(features, FeatureStore) else FeatureStore(features)
        check_features(self.model.config, store, self.checkpoint)
        self.features = store

    def select_levels(self, levels=None) -> list[int]:
        """Level numbers (from 1) of ``levels``: None or "all" for every level, else numbers, each checked."""
        count = len(self.levels)
        if levels is None or levels == "all":
            return list(range(1, count + 1))
        chosen = [levels] if isinstance(levels, int) else list(levels)
        for level in chosen:
            if isinstance(level, bool) or not isinstance(level, int) or not 1 <= level <= count:
                where = f"the checkpoint {self.checkpoint}" if self.checkpoint else "the model"
                raise ValueError(f"level {level!r} is not one of the levels of {where}: 1..{count} "
                                 f"({level_set_name(self.levels)}: {describe_levels(self.levels)})")
        return sorted(set(chosen))

    def decode(self, image_ids, levels=None, progress=False, features=None):
        """``({level: {image_id: caption}}, {level: image ids whose caption filled the level without "."})``
        for the images of the feature file (or of ``features``, any object with ``get(image_id)``)."""
        from clid.model import decode

        source = self.features if features is None else features
        if source is None:
            raise ValueError("no region features: give features= to from_checkpoint, or call use_features(path)")
        image_ids, levels = [str(i) for i in image_ids], self.select_levels(levels)
        return decode.generate_captions(self.model, source, image_ids, levels,
                                        batch_size=self.decode_batch_size(source, image_ids, levels), device=self.device,
                                        steps=self.steps, eos_decay=self.eos_decay, labert_average=self.labert_average,
                                        progress=progress, return_filled=True, precision=self.precision)

    def decode_batch_size(self, source, image_ids, levels) -> int:
        """``batch_size``, or what "auto" picks: one image's activations at the longest level asked for
        (its first image's regions, all positions re-predicted: float32 logits and probabilities)."""
        from clid import runtime

        if self.batch_size != "auto" or runtime.device_type(self.device) != "cuda" or not image_ids:
            return runtime.batch_size(self.batch_size, self.device, 1.0, BATCH_SIZE)
        config, high = self.model.config, max(self.levels[level - 1][1] for level in levels)
        positions = len(source.get(image_ids[0]).features) + high
        per_image = runtime.encoder_bytes(config, positions, self.precision) + 3 * 4 * high * config.output_size
        return runtime.batch_size("auto", self.device, per_image, BATCH_SIZE)

    def caption(self, images, levels=None):
        """Captions, by level, of one image (an image id or its :class:`Regions`): ``{level: text}``;
        of a list of image ids: ``{image_id: {level: text}}``."""
        if isinstance(images, Regions):
            captions, _ = self.decode(["image"], levels, features=MemoryRegions({"image": images},
                                                                              self.model.config.region_dim))
            return {level: by_image["image"] for level, by_image in captions.items()}
        one = isinstance(images, (str, int))
        ids = [str(images)] if one else [str(i) for i in images]
        captions, _ = self.decode(ids, levels)
        by_image = {i: {level: captions[level][i] for level in captions} for i in ids}
        return by_image[ids[0]] if one else by_image


def describe_levels(levels) -> str:
    """"1-9, 10-19, ... tokens" for a level set."""
    return ", ".join(f"{low}-{high}" for low, high in get_levels(levels)) + " tokens"


def caption_records(captions, filled, levels, tokenizer=None, strict: bool = False) -> list[dict]:
    """The generated-captions JSONL lines of decoded captions: ``image_id``, ``level``, ``caption``,
    ``length`` (counted as 07 counts it: WordPiece tokens and the final "."; a caption that filled its
    level without "." has no final "." unless ``strict``), ``in_range`` and ``filled``; ordered by image
    id, then level. ``levels``: the checkpoint's level set."""
    image_ids = sorted({i for by_image in captions.values() for i in by_image}, key=natural_key)
    control = length_control(captions, image_ids, levels, tokenizer, filled=filled, strict=strict)
    rows = []
    for image_id in image_ids:
        for level in sorted(captions):
            if image_id not in captions[level]:
                continue
            length = control[level].lengths.get(image_id, 0)  # 0: no word in the caption
            low, high = get_levels(levels)[level - 1]
            rows.append({"image_id": image_id, "level": level, "caption": captions[level][image_id],
                         "length": length, "in_range": low <= length <= high,
                         "filled": image_id in filled.get(level, ())})
    return rows
