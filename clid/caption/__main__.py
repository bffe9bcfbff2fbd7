"""Caption images at chosen length levels with a trained checkpoint; no reference captions needed.

    python -m clid.caption --checkpoint runs/clid --features features.h5 --levels 1 3 6 --out captions.jsonl
    python -m clid.caption --checkpoint runs/clid --features features.h5 --ids ids.txt --out captions.jsonl \\
        --gallery gallery.html --images photos/
    python -m clid.caption --checkpoint runs/quick/model --images photos/ --out captions.jsonl   (no feature file)

In:  a checkpoint folder (04, 06); the region-feature file of the images (``python -m clid.features``),
     or without ``--features`` the images of ``--images`` (folders, files, globs), whose features are
     computed first with the encoder the checkpoint was trained on (the whole image and a ``--grid`` grid
     of boxes; written to ``OUT.features.h5`` beside the captions, as ``python -m clid.features --boxes grid
     N`` writes them; a file there that this command did not write for these images and settings is
     refused, never replaced). Every file under ``--images`` is captioned or named in the summary with why
     not (hidden, not an image, a link that points nowhere, unreadable, too large, a name that cannot be
     an id; an animated GIF or PNG: its first frame, said so). An image's id is its file name without
     extension, but for ``--image-ids auto`` (the default, as ``clid.features --ids auto``): a zero-padded
     number or a COCO file name gives the COCO id (``0042.png`` -> ``42``); ``--image-ids keep`` keeps the
     name. Optionally ``--ids``: the image ids to caption (one a line, a JSON list, or a captions file
     whose ``--split`` images are taken, default test); without it, every image of the feature file.
Out: ``--out captions.jsonl``, one line per image and level: ``image_id`` (and ``file``, its file name,
     where known), ``level``, ``caption``, ``length`` (tokens as 07 counts them), ``in_range`` (inside the
     level asked for) and ``filled`` (the caption filled its level without "."), ordered by image id then
     level. It is the file ``07_eval.py --generated`` scores. With ``--gallery``: an HTML page of each
     image (``--images``) beside its caption at every level, one column per run (``--compare NAME=FILE``
     adds earlier runs); its thumbnails hold pixels alone (no EXIF, comment or profile) and it names files
     relative to the page, or by their names. No output may be an input or another output (links followed).

``--length N`` asks for captions of exactly N tokens instead of levels (N - 1 words and the final ".", the
project's count; any N from 1 to the checkpoint's longest level's end): each line then also holds
``length_asked``, beside the ``length`` got. A checkpoint saved before its training finished is captioned with
one warning line, and the run record (``OUT.run.json``) and the gallery's header say so too.

Only the levels asked for are decoded (``--levels all``: every level of the checkpoint), in batches, on
``--device``. Sharded like 01/02/03/05: ``--shard-id/--num-shards`` (SLURM array defaults), resumable
chunks, ``python -m clid.shard merge OUT --num-shards N``; a resume with other inputs or settings is
refused unless ``--restart``. Decoding defaults are the authors' (see ``07_eval.py``) but
for ``--block-ngram 3``: no 3-gram twice in a caption (docs/decoding.md; 0: the authors' decoding).
"""
from __future__ import annotations

import argparse
import glob
from pathlib import Path

from clid.base.files import DataError, check_outputs, natural_key, read_jsonl, resolved, write_jsonl
from clid.caption import BLOCK_NGRAM, CaptionWriter, add_decoding_args, caption_records, decode_steps, describe_levels
from clid.caption.gallery import THUMBNAIL_SIDE, is_gallery, match_files, page_name, thumbnail, write_gallery
from clid.data.images import IMAGE_SUFFIXES, ImageList, find_images, shown, skip_summary
from clid.data.store import FeatureStore, add_bad_features_arg
from clid.features.__main__ import MAX_GRID
from clid.run import runs, runtime, shard
from clid.run.cli import HelpFormatter, level_numbers, number, positive_int, run_main


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m clid.caption", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    inputs = p.add_argument_group("input", "the checkpoint and the images")
    inputs.add_argument("--checkpoint", required=True, help="checkpoint folder (04_train_base.py, 06_train_selection.py)")
    inputs.add_argument("--features", default=None,
                        help="region-feature HDF5 of the images (without it: computed from the images of --images)")
    inputs.add_argument("--images", default=None, nargs="+", metavar="PATH",
                        help="image folders (searched recursively), files or globs ('photos/*.png'): without --features, "
                             "the images to caption; with it, shown in the gallery (files named after the image ids, or "
                             "as the captions file of --ids names them)")
    inputs.add_argument("--grid", type=number(int, low=1, high=MAX_GRID, what=f"an integer in 1..{MAX_GRID}"), default=4,
                        metavar="N", help="--images without --features: the boxes of each image, an N x N grid")
    inputs.add_argument("--image-ids", choices=["auto", "keep"], default="auto",
                        help="--images without --features: how a file name becomes an image id: auto: a zero-padded "
                             "number or a COCO file name gives the COCO id (0042.png -> 42); keep: the file name "
                             "without its extension (clid.features --ids)")
    add_bad_features_arg(inputs)
    inputs.add_argument("--ids", default=None,
                        help="image ids to caption: one a line, a JSON list, or a captions file (Karpathy, COCO or "
                             "paragraphs JSON; its --split images). Default: every image of --features")
    inputs.add_argument("--split", default="test", help="with a captions file as --ids: the split to caption")
    inputs.add_argument("--limit", type=positive_int, default=None, metavar="N", help="caption only the first N ids")
    decoding = p.add_argument_group("decoding", "the levels and how they are decoded")
    decoding.add_argument("--levels", nargs="+", default=None, metavar="LEVEL",
                          help="level numbers (from 1) to decode, or 'all' for every level of the checkpoint "
                               "(default: all)")
    decoding.add_argument("--length", type=number(int, low=1, what="a whole number of tokens from 1"), default=None,
                          metavar="N", help="captions of exactly N tokens (N - 1 words and the final '.'), from 1 to "
                                            "the checkpoint's longest level's end, instead of --levels")
    runtime.add_device_arg(decoding)
    add_decoding_args(decoding, block_ngram=BLOCK_NGRAM)
    output = p.add_argument_group("output", "the captions file and the gallery")
    output.add_argument("--out", required=True, help="captions JSONL to write")
    output.add_argument("--gallery", default=None, metavar="HTML", help="also write this self-contained HTML gallery")
    output.add_argument("--name", default=None,
                        help="this run's column in the gallery (default: the checkpoint's folder name)")
    output.add_argument("--compare", action="append", default=[], metavar="NAME=FILE",
                        help="also show these captions (JSONL of an earlier run, or 07's generated/) in the gallery, "
                             "one column each, left of this run's (repeatable)")
    output.add_argument("--thumbnail", type=positive_int, default=THUMBNAIL_SIDE,
                        help="longer side of a gallery image, in pixels")
    run = p.add_argument_group("run", "shards and resumable chunks")
    shard.add_chunk_size_arg(run, 256, "images")
    shard.add_shard_args(run)
    args = p.parse_args(argv)
    if args.length is not None and args.levels is not None:
        p.error("--length and --levels exclude each other: give --length N for captions of exactly N tokens, or "
                "--levels for length levels")
    if args.length is not None:
        pass  # (the level it is decoded at comes from the checkpoint)
    elif args.levels in (None, ["all"]):
        args.levels = "all"
    else:
        try:
            args.levels = level_numbers(args.levels)
        except ValueError as err:
            p.error(f"--levels {err}, or 'all'")
    if Path(args.out).suffix != ".jsonl":
        p.error(f"--out {args.out}: the captions file must end in .jsonl")
    if not args.features and not args.images:
        p.error("give --features (the images' region features) or --images (image folders, files or globs)")
    if not args.gallery and args.compare:
        p.error("--compare is for the gallery: give --gallery FILE too")
    if args.features and args.images and not args.gallery:
        p.error("--images beside --features is for the gallery: give --gallery FILE too, or leave out --features to "
                "caption the images themselves")
    for entry in args.compare:
        name, sep, path = entry.partition("=")
        if not sep or not name or not path:
            p.error(f"--compare {entry}: expected NAME=FILE")
    return args


# ---------------------------------------------------------------------------------------------
# The images to caption

def read_ids(args, store: FeatureStore) -> tuple[list[str], dict[str, str]]:
    """The image ids to caption, in order, each once, and (from a captions file) their file names.
    An id without region features is one DataError naming both files; so is an empty list."""
    from clid.data.captions import detect_format, load_captions, read_id_list

    names: dict[str, str] = {}
    if args.ids is None:
        source, ids = store.path, store.ids()
    else:
        source = Path(args.ids)
        if not source.is_file():
            raise DataError(source, None, "--ids: no such file")
        try:
            kind = detect_format(source)[0] if source.suffix == ".json" else "ids"
        except DataError:  # not a captions file: a list of ids (read_id_list names what is wrong with it)
            kind = "ids"
        if kind in ("karpathy", "coco", "paragraphs"):
            records = load_captions(source, args.split)
            if not records:
                raise DataError(source, None, f"holds no image of split {args.split!r} (--split)")
            ids, names = [r.image_id for r in records], {r.image_id: r.filename for r in records}
        else:
            ids = read_id_list(source)
    ids = list(dict.fromkeys(ids))[:args.limit]
    if not ids:
        raise DataError(source, None, "no image id to caption (the list is empty)")
    known = set(store.ids())
    unknown = [i for i in ids if i not in known]
    if unknown:
        more = f" ({len(unknown)} of the {len(ids)} ids have none)" if len(unknown) > 1 else ""
        raise DataError(source, f"image {unknown[0]}", f"no region features in {store.path}{more}")
    if store.bad == "skip":  # images with bad features are left out, counted and reported
        ids = [i for i in ids if i in store]
        if not ids:
            raise DataError(store.path, None, "every image asked for has bad region features (--bad-features skip)")
    return ids, names


def read_compare(entry: str, levels) -> tuple[str, dict]:
    """(name, {(image_id, level): record}) of a ``--compare NAME=FILE`` captions file, checked."""
    from clid.evaluation.metrics import read_generated

    name, _, path = entry.partition("=")
    if not Path(path).is_file():
        raise DataError(path, None, "--compare: no such file")
    read_generated(path, len(levels))  # a bad line, a level outside the levels, a repeat: one DataError
    return name, {(str(r["image_id"]), int(r["level"])): r for r in read_jsonl(path)}


CAPTION = "python -m clid.caption"  # the writer the run record of the features it computes names


def features_path(out) -> Path:
    """``OUT.features.h5``: where the caption command computes the features of ``--images`` (``captions.jsonl`` ->
    ``captions.features.h5``)."""
    return Path(out).with_suffix(".features.h5")


def check_paths(args, listing: ImageList | None, computed: Path | None) -> None:
    """Refuse, before anything is written, an output (``--out``, ``--gallery``, the features file computed
    beside ``--out``, the run records beside them) that is an input (the checkpoint and its files, ``--features``,
    ``--ids``, ``--compare``, an image or an ``--images`` folder) or another output, links followed; and a gallery
    that a later ``--images`` search would read as an image."""
    outputs = {"--out": Path(args.out), "--gallery": args.gallery and Path(args.gallery),
               f"(the features file this run computes beside --out {args.out})": computed,
               "(the run record of --out)": runs.record_path(args.out),
               "(the run record of the features file)": computed and runs.record_path(computed)}
    checkpoint = Path(args.checkpoint)
    inputs = {"--checkpoint": [checkpoint] + (sorted(checkpoint.iterdir()) if checkpoint.is_dir() else []),
              "--features": args.features, "--ids": args.ids, "--compare": [e.partition("=")[2] for e in args.compare],
              "--images": list(args.images or []) + [f.path for f in (listing.files if listing else [])]}
    check_outputs(outputs, inputs)
    if args.gallery and args.images and Path(args.gallery).name.lower().endswith(IMAGE_SUFFIXES):
        folders = [resolved(i) for i in args.images if Path(i).is_dir()]
        if any(resolved(args.gallery).is_relative_to(f) for f in folders):
            raise DataError(args.gallery, None, "--gallery: an image file name inside an --images folder: the next run "
                                                "would read the page as an image; give a .html file")


def earlier_output(out: Path) -> bool:
    """Whether an earlier run left captions (or their chunks or shard parts) at ``out``."""
    name = glob.escape(out.name)
    return out.exists() or any(out.parent.glob(f"{name}.chunk-*")) or any(out.parent.glob(f"{name}.part-*"))


def image_changes(before: dict, now: dict) -> str:
    """What changed between two runs' image files (their run records' ``--images``), in words."""
    added = [n for n in now if n not in before]
    removed = [n for n in before if n not in now]
    edited = [n for n in now if n in before and now[n] != before[n]]
    parts = [f"{len(names)} {what} ({', '.join(shown(n) for n in names[:3])}{', ...' if len(names) > 3 else ''})"
             for what, names in (("added", added), ("removed", removed), ("edited", edited)) if names]
    return "images " + ", ".join(parts) if parts else ""


def compute_features(args, listing: ImageList, path: Path) -> tuple[str, dict | None]:
    """``--images`` without ``--features``: the region features of the images, computed by the encoder the
    checkpoint was trained on into ``path`` (``OUT.features.h5``, as ``python -m clid.features`` computes
    them), or the file there when it holds them already. A file there that this command did not write is
    refused, never replaced; one it wrote for other images or settings is computed again with --restart
    alone; either refusal comes before anything is written. Returns its path and its run record."""
    from clid.caption import encoder_settings
    from clid.features import __main__ as features
    from clid.model.checkpoints import read_config
    from clid.run.runs import record_differences

    if shard.Shard.from_args(args).num_shards > 1:
        raise DataError(None, None, "a sharded run reads one feature file: compute it first (python -m clid.features "
                                    "--images DIR --boxes grid N --out FILE), then give --features FILE")
    settings = encoder_settings(read_config(args.checkpoint), args.checkpoint)
    argv = ["--images", *map(str, args.images), "--boxes", "grid", str(args.grid), "--out", str(path),
            "--colour-bins", str(settings["colour_bins"]), "--ids", args.image_ids]
    fargs = features.parse_args(argv + (["--device", args.device] if args.device else []))
    earlier = features.read_record(path)
    if path.exists() or path.is_symlink():
        if features.up_to_date(fargs, listing, writers=(CAPTION, features.COMMAND)):
            print(f"{path}: the region features of these images are up to date")
            for line in skip_summary([tuple(s) for s in earlier.get("skipped", [])], len(earlier.get("images", {}))
                                     + len(earlier.get("skipped", [])), listed_in=runs.record_path(path)):
                print(line)
            return str(path), earlier
        why = ""
        if earlier is not None:
            fresh = features.features_record(fargs, listing)
            changes = [image_changes(earlier.get("inputs", {}).get("--images", {}), fresh["inputs"]["--images"])]
            changes += [d for d in record_differences({**earlier, "inputs": {}}, {**fresh, "inputs": {}})]
            why = "; ".join(c for c in changes if c) or "other images or settings"
        if earlier is None or earlier.get("command") != CAPTION:
            who = f"{earlier.get('command') or 'another command'} wrote it, and it differs: {why}" if earlier else "it has no run record"
            raise DataError(path, None, f"exists and this command did not write it ({who}): it computes the features "
                                        f"of --images there, and never replaces a file it did not write; give another "
                                        f"--out, or caption with --features {path}")
        if runs.changed_since(earlier, path):
            raise DataError(path, None, "was changed since this command wrote it (its size or modification time is not "
                                        f"the one its run record {runs.record_path(path).name} holds): it is kept; give "
                                        f"another --out, or caption with --features {path}")
        if not args.restart:
            raise DataError(path, None, f"holds the features of an earlier run's images or settings ({why}): --restart "
                                        "computes them again, and the captions")
        print(f"--restart: computing the features again ({why})")
    elif earlier_output(Path(args.out)) and not args.restart:
        raise DataError(args.out, None, f"an earlier run left captions here, and the features file it read ({path}) is "
                                        "not there: --restart computes both again")
    return str(path), features.compute(fargs, listing, writer=CAPTION)


# ---------------------------------------------------------------------------------------------

def main(argv=None) -> None:
    args = parse_args(argv)
    out = Path(args.out)
    listing = find_images(args.images) if args.images else None
    computed = None if args.features else features_path(out)
    check_paths(args, listing, computed)
    if args.gallery:
        if Path(args.gallery).is_dir():
            raise DataError(None, None, f"--gallery {args.gallery} is a folder; give the HTML file to write")
        if Path(args.gallery).exists() and not is_gallery(args.gallery):
            raise DataError(None, None, f"--gallery {args.gallery} exists and is not a gallery this command wrote: "
                                        "it is kept; give another file, or move it away yourself")

    # 1. the images, the checkpoint and the levels to decode, all checked before any work
    if computed is not None:
        args.features, features_record = compute_features(args, listing, computed)
    else:
        from clid.features.__main__ import read_record

        features_record = read_record(args.features)
    files = dict((features_record or {}).get("images") or {})  # image id -> its file name, where known
    store = FeatureStore(args.features, bad=args.bad_features)
    ids, names = read_ids(args, store)
    plan = runtime.device_plan(args.device, args.precision)
    device, args.precision = str(plan.device), plan.use()  # what auto means here: recorded
    runtime.set_threads(args.threads)
    writer = CaptionWriter.from_checkpoint(args.checkpoint, device, batch_size=args.batch_size,
                                           eos_decay=args.eos_decay, labert_average=args.labert_average,
                                           precision=args.precision, block_ngram=args.block_ngram)
    writer.steps = decode_steps(args.decode_steps, len(writer.levels))
    writer.use_features(store)
    if args.length is not None:
        from clid.model.decode import exact_level

        try:
            args.levels = [exact_level(writer.levels, writer.select_length(args.length))]
        except ValueError as err:
            raise DataError(None, None, f"--length: {err}") from None
    try:
        args.levels = writer.select_levels(args.levels)
    except ValueError as err:
        raise DataError(None, None, f"--levels: {err}") from None
    name = args.name or Path(args.checkpoint).resolve().name
    compare = [read_compare(entry, writer.levels) for entry in args.compare] if args.gallery else []
    thumbnails = None
    if args.gallery and listing is not None:  # every image read now: an unreadable one stops the run before it starts
        if computed is not None:
            by_name = {f.name: f for f in listing.files}
            found = {i: by_name[files[i]] for i in ids if files.get(i) in by_name}
        else:
            found = match_files(ids, listing, names, args.image_ids)
        files.update({i: f.name for i, f in found.items()})
        thumbnails = {i: thumbnail(f.path, i, args.thumbnail) for i, f in found.items()}
    files = {i: files[i] for i in ids if i in files}

    # 2. decode this shard's images in resumable chunks; the last shard to finish merges
    record = runs.run_record(args, inputs=("checkpoint", "features", "ids"), settings=(
        "levels", "split", "limit", "decode_steps", "eos_decay", "labert_average", "length_count", "bad_features",
        "precision", "block_ngram", "length"))
    if writer.checkpoint_state is not None:  # how far its training got (not compared on a resume: its files are)
        record["checkpoint"] = writer.checkpoint_state.to_json()
    job = shard.Job(out, shard.Shard.from_args(args), args.chunk_size, record, args.restart)
    asked = (f"exactly {args.length} tokens (level {args.levels[0]} of {describe_levels(writer.levels)})"
             if args.length is not None else f"levels {', '.join(map(str, args.levels))} of {describe_levels(writer.levels)}")
    if not job.done:
        print(f"captioning {len(job.spec.select(ids))} of {len(ids)} images at {asked} on {device} "
              f"(shard {job.spec.shard_id} of {job.spec.num_shards})")
    from clid.base.text import load_tokenizer

    tokenizer = load_tokenizer()  # lengths counted as 07 counts them

    def caption_chunk(chunk: shard.Chunk) -> None:
        captions, filled = writer.decode(chunk.items, None if args.length else args.levels, progress=chunk.progress,
                                         length=args.length)
        write_jsonl(chunk.path, caption_records(captions, filled, writer.levels, tokenizer,
                                                strict=args.length_count == "strict", files=files, length=args.length))

    done = job.run(ids, caption_chunk, "caption", "img")
    if bad_line := store.skip_report():
        print(bad_line)
    if done is None:
        print(f"shard {job.spec.shard_id} done; the last shard to finish merges (or: python -m clid.shard merge "
              f"{out} --num-shards {job.spec.num_shards})")
        return

    # 3. what was written: the share of captions inside their level, and the gallery
    records = list(read_jsonl(done, required=("image_id", "level", "caption")))
    print(f"{done}: {len(records)} captions of {len({r['image_id'] for r in records})} images")
    for level in args.levels:
        at = [r for r in records if r.get("level") == level and "in_range" in r and "length" in r]
        low, high = writer.levels[level - 1]
        if at and args.length is not None:
            print(f"  length {args.length} (level {level}, {low}-{high} tokens): {sum(r['length'] == args.length for r in at)} "
                  f"of {len(at)} captions have exactly {args.length} tokens")
        elif at:
            print(f"  level {level} ({low}-{high} tokens): {sum(r['in_range'] for r in at)} of {len(at)} in range, "
                  f"mean length {sum(r['length'] for r in at) / len(at):.1f}")
    if args.gallery:
        seen = sorted({str(r["image_id"]) for r in records}, key=natural_key)
        own = {(str(r["image_id"]), r["level"]): r for r in records}
        title = None
        if args.length is not None:  # the badge: green when the caption has the length asked for
            own = {key: {**r, "in_range": r.get("length") == args.length} for key, r in own.items()}
            title = f"Captions of exactly {args.length} tokens"
        notes = [f"warning: {writer.checkpoint_state.warning(page_name(args.checkpoint, args.gallery))}"] if writer.unfinished else []
        notes += [f"{len(seen)} images; {asked}"]
        notes += [f"{n}: {page_name(path, args.gallery)}" for n, _, path in (e.partition("=") for e in args.compare)]
        notes += [f"{name}: {page_name(args.checkpoint, args.gallery)}"
                  + (f" ({writer.checkpoint_state.describe()})" if writer.unfinished else "")]
        write_gallery(args.gallery, seen, compare + [(name, own)], writer.levels, args.levels, thumbnails, title=title,
                      notes=notes, files=files)
        print(f"gallery: {args.gallery}")
    if computed is not None and features_record:
        skipped = len(features_record.get("skipped", []))
        read = len(features_record.get("images", {}))
        print(f"--images: {read} of {read + skipped} files read" + (f", {skipped} skipped (named above, with why)"
                                                                   if skipped else ""))
    store.close()


if __name__ == "__main__":
    run_main(main)
