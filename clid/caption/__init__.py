"""Captions of any image at chosen length levels, from a trained checkpoint: the Python API.

    from clid.caption import CaptionWriter

    writer = CaptionWriter.from_checkpoint("runs/clid", features="features.h5")  # device: cuda if available
    writer.caption("42", levels=[1, 3, 6])     # {1: "a red car", 3: "...", 6: "..."}
    writer.caption(["42", "43"])               # {"42": {1: ..., ..., 7: ...}, "43": {...}}
    writer.caption(Regions(features, boxes, width, height), levels=[2])   # regions held in memory
    writer.caption_images(["photo.jpg", pil_image], levels=[1, 3, 6])     # [{1: ..., 3: ..., 6: ...}, {...}]
    writer.caption_images(image_files("photos", "more/*.png"))           # every image of a folder, files, globs
    writer.caption("42", length=12)            # one caption of exactly 12 tokens (11 words and the final ".")

Each caption is a :class:`Caption`: its text (a ``str``), with its ``length`` (counted as 07 counts it)
and ``in_range`` (inside its level); with ``length=N``, ``asked`` is N. ``length=`` (``caption``,
``caption_images``, ``decode``) asks for exactly N tokens instead of levels (:mod:`clid.model.decode`), any N
from 1 to the checkpoint's longest level's end. A checkpoint saved before its training finished is said so
in one warning line when it is loaded; ``writer.checkpoint_state`` and ``writer.unfinished`` tell it too.
:meth:`CaptionWriter.caption_images` computes the region features of image files, PIL images or NumPy arrays
on the fly, with the encoder the checkpoint was trained on (``clid.features``), each read as the caption
command reads it (:func:`clid.data.images.read_image`: upright, in 8-bit RGB as a person sees it).
:func:`image_files` lists the image files of folders, files and globs as the command does (:data:`IMAGE_SUFFIXES`).

:meth:`CaptionWriter.decode` is the batched form the caption command (``python -m clid.caption``,
:mod:`clid.caption.__main__`) and ``07_eval.py`` use; :func:`caption_records` turns its output
into the lines of the generated-captions JSONL. Decoding itself (LaBERT's mask-predict) lives in
:mod:`clid.model.decode`.

Errors are exceptions that ``except Exception`` catches, never an exit: a missing or damaged checkpoint or
feature file is a :class:`~clid.base.files.DataError` (a ``ValueError`` naming the file and the record);
an unreadable image, a level the checkpoint lacks or an unknown device a ``ValueError`` naming it; a file
that cannot be opened an ``OSError``. ``python -m clid.caption`` prints the same message as one line
``error: ...`` and exits 1.
"""
from __future__ import annotations

from pathlib import Path

from clid.base.files import DataError, natural_key
from clid.base.text import get_levels, level_set_name
from clid.data.images import IMAGE_SUFFIXES
from clid.data.store import FeatureStore, Regions, check_features_match, region_problem
from clid.evaluation.metrics import length_control

__all__ = ["IMAGE_SUFFIXES", "Caption", "CaptionWriter", "ImageFiles", "MemoryRegions", "Regions", "add_decoding_args",
           "caption_records", "check_features", "decode_steps", "default_device", "encoder_settings", "image_files"]


BATCH_SIZE = 64  # images decoded together (--batch-size auto on the CPU)
BLOCK_NGRAM = 3  # the caption command's and the API's --block-ngram (07 keeps the authors' 0)


def default_device() -> str:
    """``cuda`` when a GPU is there, else ``cpu``."""
    from clid.run import runtime

    return str(runtime.default_device())


def add_decoding_args(parser, block_ngram: int = 0) -> None:
    """The decoding flags of the caption command and ``07_eval.py``: ``--batch-size``, ``--precision``,
    ``--decode-steps``, ``--eos-decay``, ``--labert-average``, ``--block-ngram`` (default ``block_ngram``),
    ``--length-count`` (the other defaults are the authors'), ``--threads``."""
    import argparse

    from clid.run import runtime
    from clid.run.cli import non_negative_int, number, positive_int

    runtime.add_batch_size_arg(parser, BATCH_SIZE, "images decoded together")
    runtime.add_precision_arg(parser)
    parser.add_argument("--threads", type=non_negative_int, default=0,
                        help="torch's threads while decoding (0: torch's own count, OMP_NUM_THREADS or the cores). A CPU "
                             "splits its float sums by the thread count, so a fixed count decodes the same captions "
                             "whatever the machine grants; demo.sh: 1, as its trainings")
    parser.add_argument("--decode-steps", type=positive_int, nargs="+", default=None, metavar="N",
                        help="mask-predict iterations, one number per level of the checkpoint or one for every level "
                             "(default: the paper's 10, 15, ..., 40)")
    parser.add_argument("--eos-decay", type=number(float, low=0, high=1, low_open=True), default=1.0,
                        help="penalty on '.' inside a level's range, decay ** (distance to the level's end); "
                             "1.0: none, as in the authors' configuration")
    parser.add_argument("--labert-average", action=argparse.BooleanOptionalAction, default=True,
                        help="decoding as LaBERT's and the authors' code: re-predict every position and "
                             "average the confidences; --no-labert-average: re-predict only the re-masked positions")
    parser.add_argument("--block-ngram", type=number(int, low=0, high=8, what="an integer in 0..8"), default=block_ngram,
                        metavar="N", help="fill re-masked positions so that no N-gram occurs twice (trigram blocking "
                                          "carried over to mask-predict; docs/decoding.md); 0: off, as the authors")
    parser.add_argument("--length-count", choices=["authors", "strict"], default="authors",
                        help="the length of a caption that fills its level without '.': authors (the authors' code): "
                             "its tokens, no '.' (in range); strict: with a final '.' (one over)")


def decode_steps(steps, num_levels: int) -> tuple[int, ...] | None:
    """Mask-predict iterations per level from one number for every level or one per level (None: the
    paper's defaults); any other count is a DataError."""
    if steps is None:
        return None
    steps = [steps] if isinstance(steps, int) else list(steps)
    if len(steps) not in (1, num_levels):
        raise DataError(None, None, f"--decode-steps takes one number per level ({num_levels}) or one for all, "
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


class ImageFiles(list):
    """The image files :func:`image_files` found (a list of paths), with ``skipped``: ``(name, reason)`` of every
    other entry of the folders searched."""

    skipped: list[tuple[str, str]]


def image_files(*paths_or_globs) -> ImageFiles:
    """The image files (paths, in order) of folders (searched recursively), files and globs, as ``python -m
    clid.caption --images`` finds them: every file whose name ends in one of :data:`IMAGE_SUFFIXES`; what else a
    folder holds (hidden files, other files, links that point nowhere) is in ``.skipped`` with its reason, and
    one warning counts it. A path that does not exist, or a glob that matches nothing, is a DataError."""
    import warnings

    from clid.data.images import find_images, shown

    found = find_images(paths_or_globs, "image_files")
    files = ImageFiles(f.path for f in found.files)
    files.skipped = found.skipped
    if found.skipped:
        first = ", ".join(f"{shown(name)} ({shown(reason)})" for name, reason in found.skipped[:3])
        warnings.warn(f"image_files: {len(found.skipped)} entries are not read as images: {first}"
                      + (", ..." if len(found.skipped) > 3 else "") + " (all in .skipped)", stacklevel=2)
    return files


class Caption(str):
    """A caption: its text, with ``level`` (from 1), ``length`` (tokens as 07 counts them), ``in_range``
    (inside its level), ``filled`` (it filled its level without ".") and ``asked`` (the exact length asked
    for, or None)."""

    level: int
    length: int
    in_range: bool
    filled: bool
    asked: int | None

    def __new__(cls, text: str, level: int, length: int, in_range: bool, filled: bool = False,
                asked: int | None = None):
        caption = super().__new__(cls, text)
        caption.level, caption.length, caption.in_range, caption.filled = level, length, in_range, filled
        caption.asked = asked
        return caption


def encoder_settings(config: dict, checkpoint) -> dict:
    """The ``clid.features`` settings that compute the region features a checkpoint was trained on
    (``config``: its config.json): ``colour_bins``, from the recorded dimension. Features of another
    kind (a detector's, converted) cannot be computed from pixels here: a DataError."""
    from clid.data.encoder import RegionEncoder
    from clid.features.__main__ import KIND

    kind, dim = config.get("feature_kind"), config.get("feature_dim", config["model"].get("region_dim"))
    bins = next((b for b in range(17) if isinstance(dim, int) and RegionEncoder.dim + 2 * b ** 3 == dim), None)
    if kind != KIND or bins is None or config["model"].get("num_classes"):
        from clid.data.store import describe_features

        raise DataError(None, None, f"the checkpoint {checkpoint} was trained on {describe_features(kind, dim)}, "
                                    f"which this package cannot compute from an image (it computes '{KIND}' "
                                    "features): compute them as for training, then caption by image id with --features")
    return {"colour_bins": bins}


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
    Decoding options: ``steps`` (mask-predict iterations per level; None: 10, 15, ..., 40), ``eos_decay``
    and ``labert_average`` (the authors' defaults), ``block_ngram`` (default 3: no 3-gram twice; 0: the
    authors' decoding); see :mod:`clid.model.decode`.
    ``batch_size``: images decoded together, or "auto" (:mod:`clid.run.runtime`: 64 on the CPU, on a GPU as
    many as half its free memory holds); ``precision``: "auto" (bfloat16 autocast on a GPU, float32 on
    the CPU), "fp32" or "bf16".
    """

    def __init__(self, model, features=None, device: str | None = None, batch_size="auto",
                 steps: tuple[int, ...] | None = None, eos_decay: float = 1.0, labert_average: bool = True,
                 checkpoint=None, precision: str = "auto", block_ngram: int = BLOCK_NGRAM):
        from clid.model.checkpoints import checkpoint_state
        from clid.run import runtime

        self.model, self.checkpoint = model, checkpoint
        self.checkpoint_state = checkpoint_state(checkpoint) if checkpoint is not None else None
        self.device = device or default_device()
        self.precision = runtime.resolve(precision, self.device)
        self.batch_size, self.steps, self.eos_decay, self.labert_average = batch_size, steps, eos_decay, labert_average
        self.block_ngram = block_ngram
        self.features = self.encoder = None
        if features is not None:
            self.use_features(features)

    @classmethod
    def from_checkpoint(cls, folder, device: str | None = None, features=None, warn: bool = True,
                        **options) -> "CaptionWriter":
        """Load a checkpoint folder (04, 06) onto ``device`` (default: cuda if available, else cpu). A missing or
        damaged checkpoint is a DataError naming the file. A checkpoint saved before its training finished is
        one warning line on stderr (``warn=False``: none; either way :attr:`unfinished` says it)."""
        import sys

        from clid.model import checkpoints
        from clid.run.runtime import device_problem

        device = device or default_device()
        if problem := device_problem(str(device)):
            raise ValueError(f"device: {problem}")
        writer = cls(checkpoints.load_checkpoint(folder, device=device), features, device, checkpoint=folder, **options)
        if warn and writer.unfinished:
            print(f"warning: {writer.checkpoint_state.warning()}", file=sys.stderr, flush=True)
        return writer

    @property
    def unfinished(self) -> bool:
        """Whether the checkpoint was saved before its training finished (:func:`clid.model.checkpoints.checkpoint_state`)."""
        return bool(self.checkpoint_state and self.checkpoint_state.unfinished)

    @property
    def longest(self) -> int:
        """The longest caption the checkpoint writes, in tokens: its last level's end."""
        return self.levels[-1][1]

    def select_length(self, length) -> int:
        """``length`` checked: a whole number from 1 to :attr:`longest`, else one ValueError naming the range."""
        if isinstance(length, bool) or not isinstance(length, int) or not 1 <= length <= self.longest:
            where = f"the checkpoint {self.checkpoint}" if self.checkpoint else "the model"
            raise ValueError(f"length {length!r} is outside 1..{self.longest}, the lengths in tokens {where} writes "
                             f"({level_set_name(self.levels)}: {describe_levels(self.levels)})")
        return length

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

    def decode(self, image_ids, levels=None, progress=False, features=None, length: int | None = None):
        """``({level: {image_id: caption}}, {level: image ids whose caption filled the level without "."})``
        for the images of the feature file (or of ``features``, any object with ``get(image_id)``). ``length``
        N (not with ``levels``): one caption of exactly N tokens per image, under the level it is decoded at."""
        from clid.model import decode

        source = self.features if features is None else features
        if source is None:
            raise ValueError("no region features: give features= to from_checkpoint, or call use_features(path)")
        if length is not None:
            if levels is not None:
                raise ValueError("give levels or length, not both")
            levels = [decode.exact_level(self.levels, self.select_length(length))]
        image_ids, levels = [str(i) for i in image_ids], self.select_levels(levels)
        return decode.generate_captions(self.model, source, image_ids, None if length else levels,
                                        batch_size=self.decode_batch_size(source, image_ids, levels), device=self.device,
                                        steps=self.steps, eos_decay=self.eos_decay, labert_average=self.labert_average,
                                        progress=progress, return_filled=True, precision=self.precision,
                                        block_ngram=self.block_ngram, length=length)

    def decode_batch_size(self, source, image_ids, levels) -> int:
        """``batch_size``, or what "auto" picks: one image's activations at the longest level asked for
        (its first image's regions, all positions re-predicted: float32 logits and probabilities)."""
        from clid.run import runtime

        if self.batch_size != "auto" or not runtime.device_plan(self.device).batch_by_memory or not image_ids:
            return runtime.batch_size(self.batch_size, self.device, 1.0, BATCH_SIZE)
        config, high = self.model.config, max(self.levels[level - 1][1] for level in levels)
        positions = len(source.get(image_ids[0]).features) + high
        per_image = runtime.encoder_bytes(config, positions, self.precision) + 3 * 4 * high * config.output_size
        return runtime.batch_size("auto", self.device, per_image, BATCH_SIZE)

    def caption(self, images, levels=None, length: int | None = None):
        """Captions (:class:`Caption`), by level, of one image (an image id or its :class:`Regions`):
        ``{level: caption}``; of a list of image ids: ``{image_id: {level: caption}}``. With ``length`` N (not
        with ``levels``): the caption of exactly N tokens in place of each ``{level: caption}``."""
        if isinstance(images, Regions):
            by_image = self.captions_of(["image"], levels, MemoryRegions({"image": images}, self.model.config.region_dim),
                                        length=length)
            return by_image["image"]
        one = isinstance(images, (str, int))
        ids = [str(images)] if one else [str(i) for i in images]
        by_image = self.captions_of(ids, levels, length=length)
        return by_image[ids[0]] if one else by_image

    def caption_images(self, images, levels=None, grid: int = 4, length: int | None = None):
        """Captions (:class:`Caption`), by level, of images: image files, PIL images or NumPy arrays (H x W x 3
        or H x W uint8), each read as the caption command reads it (:func:`clid.data.images.read_image`:
        upright, in 8-bit RGB), their region features computed on the fly by the encoder the checkpoint was
        trained on (the whole image and a ``grid`` x ``grid`` grid of boxes, as ``python -m clid.features
        --boxes grid 4``): ``{level: caption}`` for one image, else a list of them in order (with ``length``
        N: a caption of exactly N tokens in place of each ``{level: caption}``). The arguments are checked
        first, as the command checks its flags; an image that cannot be read (anything else, an unreadable or
        too large file) is one DataError (a ValueError) naming it; an animated file's first frame is read,
        with a warning."""
        import warnings

        import numpy as np
        if length is not None:
            self.select_length(length)  # (checked before any image is read)
            if levels is not None:
                raise ValueError("give levels or length, not both")
        from PIL import Image

        from clid.data.encoder import RegionFeatures, grid_boxes
        from clid.data.images import read_image
        from clid.features.__main__ import grid_problem

        if problem := grid_problem(grid, "grid"):
            raise ValueError(problem)
        levels = None if length is not None else self.select_levels(levels)
        one = isinstance(images, (str, Path, Image.Image, np.ndarray))
        if not one and not isinstance(images, (list, tuple)) and not hasattr(images, "__iter__"):
            raise DataError("images", None, f"is {type(images).__name__}: give an image (a file's path, a PIL image, "
                                            "a NumPy array) or a list of them")
        items = [images] if one else list(images)
        pictures = []
        for k, item in enumerate(items):
            where = str(item) if isinstance(item, (str, Path)) else "image" if one else f"images[{k}]"
            picture, note = read_image(item, where)
            if note:
                warnings.warn(f"{where}: {note}", stacklevel=2)
            pictures.append(picture)
        if self.encoder is None:  # (loaded once every image has been read)
            from clid.model.checkpoints import read_config

            config = read_config(self.checkpoint) if self.checkpoint else {"model": self.model.config.to_json()}
            self.encoder = RegionFeatures(**encoder_settings(config, self.checkpoint or "(in memory)"), device=self.device)
        regions = {}
        for start in range(0, len(pictures), 16):  # a few images' crops encoded together
            part = pictures[start:start + 16]
            encoded = self.encoder(part, [grid_boxes(p.width, p.height, grid) for p in part])
            for k, (picture, (features, boxes)) in enumerate(zip(part, encoded), start):
                regions[str(k)] = Regions(features, boxes, picture.width, picture.height)
        by_image = self.captions_of(list(regions), levels, MemoryRegions(regions, self.model.config.region_dim),
                                    length=length)
        captions = [by_image[str(k)] for k in range(len(items))]
        return captions[0] if one else captions

    def captions_of(self, image_ids, levels, features=None, length: int | None = None) -> dict:
        """``{image_id: {level: Caption}}`` of images of the feature file (or of ``features``); with ``length``,
        ``{image_id: Caption}``."""
        captions, filled = self.decode(image_ids, levels, features=features, length=length)
        by_image = {str(i): {} for i in image_ids}
        for r in caption_records(captions, filled, self.levels, self.model.tokenizer, length=length):
            by_image[r["image_id"]][r["level"]] = Caption(r["caption"], r["level"], r["length"], r["in_range"], r["filled"],
                                                          r.get("length_asked"))
        if length is not None:
            return {image_id: next(iter(by_level.values())) for image_id, by_level in by_image.items()}
        return by_image


def describe_levels(levels) -> str:
    """"1-9, 10-19, ... tokens" for a level set."""
    return ", ".join(f"{low}-{high}" for low, high in get_levels(levels)) + " tokens"


def caption_records(captions, filled, levels, tokenizer=None, strict: bool = False, files=None,
                    length: int | None = None) -> list[dict]:
    """The generated-captions JSONL lines of decoded captions: ``image_id`` (and ``file``, its file name, where
    ``files`` (image id -> name) knows it), ``level``, ``caption``,
    ``length`` (counted as 07 counts it: WordPiece tokens and the final "."; a caption that filled its
    level without "." has no final "." unless ``strict``), ``in_range`` and ``filled``; ordered by image
    id, then level. ``levels``: the checkpoint's level set. ``length``: the exact length asked for (captions
    decoded with ``length=``), kept as ``length_asked`` beside the ``length`` got (the empty caption, "." alone,
    counts 1)."""
    from clid.base.text import caption_lengths, keeps_sentences

    image_ids = sorted({i for by_image in captions.values() for i in by_image}, key=natural_key)
    control = length_control(captions, image_ids, levels, tokenizer, filled=filled, strict=strict)
    exact = {}
    if length is not None:  # (no caption filled its level: every one ends in ".")
        pairs = [(level, i) for level in captions for i in captions[level]]
        exact = dict(zip(pairs, caption_lengths([captions[lv][i] for lv, i in pairs], tokenizer, keeps_sentences(levels))))
    rows = []
    for image_id in image_ids:
        for level in sorted(captions):
            if image_id not in captions[level]:
                continue
            text = captions[level][image_id]
            got = control[level].lengths.get(image_id, 0) if length is None else exact[level, image_id]  # 0: no word
            low, high = get_levels(levels)[level - 1]
            row = {"image_id": image_id, "file": (files or {}).get(image_id), "level": level, "caption": text,
                   "length": got, "in_range": low <= got <= high, "filled": image_id in filled.get(level, ())}
            if row["file"] is None:
                del row["file"]
            if length is not None:
                row["length_asked"] = length
            rows.append(row)
    return rows
