"""Captions generated from a checkpoint for 07's evaluation, cached in ``OUT/generated/<run>.jsonl`` beside a
``.meta.json`` that keys them by the checkpoint's files, the features, the images and the decoding."""
from __future__ import annotations

import hashlib
from pathlib import Path

from clid.base.files import DataError, read_json, write_json
from clid.base.text import get_levels, level_set_name
from clid.caption import CaptionWriter, decode_steps
from clid.evaluation.metrics import read_generated, write_generated
from clid.model.checkpoints import MISSING_HINT
from clid.run import runtime
from clid.run.runs import file_state


def check_levels(checkpoint, levels, wanted_levels):
    """A checkpoint's levels, or a DataError when --levels asks for other ones."""
    if wanted_levels is not None and levels != wanted_levels:
        raise DataError(None, None, f"{checkpoint} was trained with levels {level_set_name(levels)}, not --levels "
                                    f"{level_set_name(wanted_levels)}; leave out --levels to take the checkpoint's")
    return levels


def generate_cached(checkpoint, cache: Path, args, image_ids, features, wanted_levels):
    """Captions of ``image_ids`` at every level of ``checkpoint``, decoded as ``args`` says (07's decoding flags), or
    read from ``cache`` when the checkpoint, the features, the images and the decoding are unchanged: (levels,
    {level: {image_id: caption}}, {level: filled image ids}, number of test images without features)."""
    meta_path = cache.with_suffix(".meta.json")
    decoding = {"steps": args.decode_steps, "eos_decay": args.eos_decay, "labert_average": args.labert_average}
    if args.block_ngram:  # (a key without it: the cache of the authors' decoding stays valid)
        decoding["block_ngram"] = args.block_ngram
    if args.precision != "fp32":  # (float32 captions keep the key they had before --precision)
        decoding["precision"] = args.precision
    if args.threads:  # (a fixed thread count: captions decoded at torch's own count are not reused)
        decoding["threads"] = args.threads
    if not Path(checkpoint).exists():
        raise DataError(checkpoint, None, f"checkpoint not found ({MISSING_HINT})")
    key = {"checkpoint": str(checkpoint), "files": file_state(checkpoint), "features": file_state(features.path),
           "images": hashlib.sha1("\n".join(image_ids).encode()).hexdigest(), "decoding": decoding}
    if not args.regenerate and cache.exists() and meta_path.exists():
        meta = read_json(meta_path)
        if meta.get("key") == key:
            levels = check_levels(checkpoint, get_levels(meta["levels"]), wanted_levels)
            print(f"{checkpoint}: reusing {cache} (checkpoint, features and decoding unchanged)")
            return (levels, *read_generated(cache, len(levels), with_filled=True), meta["no_features"])

    runtime.set_threads(args.threads)
    writer = CaptionWriter.from_checkpoint(checkpoint, device=args.device, batch_size=args.batch_size,
                                           eos_decay=args.eos_decay, labert_average=args.labert_average,
                                           precision=args.precision, block_ngram=args.block_ngram)
    levels = check_levels(checkpoint, writer.levels, wanted_levels)
    writer.steps = decode_steps(args.decode_steps, len(levels))
    writer.use_features(features)
    have = [i for i in image_ids if i in features]
    if not have:
        raise DataError(None, None, f"{features.path} holds none of the {len(image_ids)} test images")
    print(f"{checkpoint}: generating captions for {len(have)} test images at {len(levels)} levels")
    generated, filled = writer.decode(have, "all", progress=True)
    write_generated(cache, generated, filled)
    write_json(meta_path, {"key": key, "levels": [list(l) for l in levels],
                           "no_features": len(image_ids) - len(have)}, indent=1)
    return levels, generated, filled, len(image_ids) - len(have)
