"""Generate the demo world: a small, fully known stand-in for COCO + Visual Genome + region features.

    python 00_demo_data.py --out data/demo [--small] [--seed N] [--graph-noise 0.15] [--preview N]

In: nothing but a seed. Out, in --out (the formats of docs/formats.md, read by the `clid` loaders):
  images/demo_NNNNNN.png   rendered scenes, 160x160 by default
  captions.json            trusted captions, Karpathy JSON: 5 short human-like captions per image whose
                           length histogram follows COCO's (mostly 10-19 tokens, long ones rare)
  scene_graphs.json        Visual Genome scene graphs as a scene-graph generator would give them: the true
                           graph with --graph-noise errors (attributes and predicates corrupted or dropped,
                           objects mislabelled, hallucinated objects with valid boxes, jittered boxes) at a
                           rate that varies per image (--graph-noise times an exponential draw of mean 1);
                           --hallucinations atypical draws the hallucinated objects from the categories the
                           scene kind never holds, in any colour (a second noise model)
  scene_graphs_clean.json  the true graphs (diagnostics only; no stage should read them)
  image_data.json          VG image records: width, height, coco_id (VG id = 1,000,000 + caption id)
  features.h5              one group per caption id: row 0 the whole image, then one row per true object
                           box (x1, y1, x2, y2 pixels); ImageNet EfficientNet-Lite0 features of the pixels,
                           then colour histograms of the box and of its figure (--colour-bins), made by
                           clid.data.encoder, which serves any image folder with boxes (the file's
                           feature_kind: clid-encoder)
  long_refs.json           test images only: several true descriptions per level 3-6 (20-59 tokens),
                           each sentence with a "level" key; for evaluation only, never for training
  world.json               the arguments and counts; a re-run with the same arguments skips the work
  preview.png              with --preview N: the first N images with their graph boxes, edges, a caption

Everything is a function of --seed (randomness is keyed by seed and image id; the encoder runs on one
thread per process), so two runs give identical files whatever --workers is.

The world. Each image is an outdoor scene (park, beach, street, snow: sky above a ground) or a room (wall
and floor) holding 2 to 12 objects of 22 categories drawn with distinct shapes. Every object has a colour,
a size (small/large read off its drawn size) and often a pattern or material (striped, spotted,
checkered, wooden, metal), all drawn visibly. Objects stand on the ground at a depth (far ones smaller
and occluded by near ones), sit on supporters (tables, chairs, boxes, benches, cars), lie under them,
are held by people or fly in the sky. Relations are read off the drawn geometry: holding (a hand touches
the object), on, under, in front of / behind (drawn silhouettes overlap), above, below, next to, left
of, right of, wearing, in. An object's salience grows with its visible area, centrality, contrast with
the background behind it, and is higher for people and animals; the trusted captions name the 1 to 3
most salient objects, as people do. The simulator is the package clid/demo/, one module per concern.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import time
from pathlib import Path

import numpy as np

from clid.base.files import read_json, write_json
from clid.base.text import LEVEL_SETS, caption_lengths, karpathy_tokens
from clid.data.encoder import add_encoder_size_args
from clid.data.store import Regions, write_features
from clid.demo import (
    BACKGROUND_NAMES,
    HALLUCINATIONS,
    VG_ID_OFFSET,
    make_images,
    noise_report,
    read_preview_records,
    write_preview,
)
from clid.run.cli import HelpFormatter, non_negative_int, number, positive_int, run_main, unit_interval
from clid.run.runs import record_differences, run_record


def karpathy_json(records: list, sentences_of) -> dict:
    images, sentence_id = [], 0
    for index, r in enumerate(records):
        sentences = []
        for raw, extra in sentences_of(r):
            sentences.append({"raw": raw, "tokens": karpathy_tokens(raw), "imgid": index, "sentid": sentence_id, **extra})
            sentence_id += 1
        images.append({"cocoid": r["image_id"], "imgid": index, "filename": r["filename"], "split": r["split"],
                       "sentids": [x["sentid"] for x in sentences], "sentences": sentences})
    return {"dataset": "demo", "images": images}


def caption_levels(text: str) -> list[int]:
    """``--long-levels``: comma-separated caption levels (1..7)."""
    try:
        levels = [int(x) for x in text.split(",")]
    except ValueError:
        levels = []
    if not levels or any(not 1 <= level <= len(LEVEL_SETS["caption"]) for level in levels):
        raise argparse.ArgumentTypeError(f"must be caption levels 1..{len(LEVEL_SETS['caption'])}, comma-separated "
                                         f"(e.g. 3,4,5,6), got {text!r}")
    return levels


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    world = p.add_argument_group("world", "the demo world's images, captions and scene graphs")
    features = p.add_argument_group("features", "the region features of every image (features.h5)")
    run = p.add_argument_group("run", "the output folder, workers and previews")
    run.add_argument("--out", default="data/demo", help="output folder")
    world.add_argument("--seed", type=non_negative_int, default=0, help="seeds the world: scenes, captions, graph noise")
    world.add_argument("--small", action="store_true", help="a tiny world for tests: 48 train, 12 val, 12 test images")
    world.add_argument("--n-train", type=non_negative_int, default=3000, help="training images")
    world.add_argument("--n-val", type=non_negative_int, default=250, help="validation images")
    world.add_argument("--n-test", type=non_negative_int, default=250, help="test images")
    world.add_argument("--size", type=number(int, low=64, what="an integer >= 64"), default=160, help="image width and height in pixels")
    world.add_argument("--graph-noise", type=unit_interval, default=0.15,
                       help="share of attributes/predicates a scene-graph generator gets wrong (0 = the true graphs)")
    world.add_argument("--hallucinations", choices=HALLUCINATIONS, default="typical",
                       help="the objects the noisy graphs hold that the image does not: typical (a category of the "
                            "scene's own prior, in one of its colours, as a generator's), or atypical (a category the "
                            "scene kind never holds, in any colour: a second noise model, to tell whether a finding "
                            "depends on how the world draws its noise)")
    world.add_argument("--captions-per-image", type=positive_int, default=5, help="trusted captions per image (COCO has 5)")
    world.add_argument("--refs-per-level", type=non_negative_int, default=3, help="long references per test image and level")
    world.add_argument("--long-levels", type=caption_levels, default="3,4,5,6",
                       help="caption levels of the long references, comma-separated")
    add_encoder_size_args(features, "object crops are resized to crop x crop for the encoder")
    features.add_argument("--colour-bins", type=non_negative_int, default=4,
                          help="each region's features end with two joint RGB histograms, of its box and of what the box "
                               "adds over its surroundings, this many bins per channel (2 * bins**3 values; "
                               "0: EfficientNet features only)")
    run.add_argument("--workers", type=positive_int, default=os.cpu_count() or 1,
                     help="processes drawing and encoding the scenes (one torch thread each)")
    run.add_argument("--chunk", type=positive_int, default=16, help="images per work unit")
    features.add_argument("--skip-features", action="store_true", help="write everything but features.h5 (quick looks)")
    run.add_argument("--preview", type=non_negative_int, default=0, metavar="N", help="write preview.png with the first N images")
    world.add_argument("--paragraphs", action="store_true",
                       help="also write paragraphs/: one multi-sentence description per image in the Stanford "
                            "paragraphs' layout (paragraphs_v1.json and its split files), for the paragraph task")
    run.add_argument("--force", action="store_true", help="rebuild even if --out holds this exact world")
    args = p.parse_args(argv)
    if args.small:
        args.n_train, args.n_val, args.n_test = 48, 12, 12
    if args.n_train + args.n_val + args.n_test == 0:
        p.error("the split sizes must not all be 0")
    return args


OUTPUTS = ("captions.json", "scene_graphs.json", "scene_graphs_clean.json", "image_data.json", "long_refs.json")
PARAGRAPH_OUTPUTS = ("paragraphs/paragraphs_v1.json", "paragraphs/train_split.json", "paragraphs/val_split.json",
                     "paragraphs/test_split.json")


def describe_world(records: list, splits: list, out: Path, args, seconds: float) -> dict:
    """Print the length tables of the captions, long references (and paragraphs) and the world's
    counts; return the counts."""
    from clid.base.text import load_tokenizer
    from clid.data.stats import format_table, length_stats

    tests = [r for r in records if r["split"] == "test"]
    tokenizer = load_tokenizer()
    caption_stats = length_stats(caption_lengths([c for r in records for c in r["captions"]], tokenizer))
    ref_texts = [t for r in tests for texts in r["refs"].values() for t in texts]
    ref_stats = length_stats(caption_lengths(ref_texts, tokenizer))
    short = {}
    for level in args.long_levels:
        short[level] = sum(len(r["refs"].get(level, [])) < args.refs_per_level for r in tests)
    objects = [len([o for o in r["clean"]["objects"] if o["names"][0] not in BACKGROUND_NAMES + ("shirt", "dress")])
               for r in records]
    counts = {"images": {s: splits.count(s) for s in ("train", "val", "test")},
              "objects_per_image": round(float(np.mean(objects)), 2),
              "relations_per_image": round(float(np.mean([len(r["clean"]["relationships"]) for r in records])), 2),
              "graph_noise": noise_report(records),
              "long_refs": len(ref_texts),
              "test_images_short_of_refs": {str(k): v for k, v in short.items()},
              "seconds": round(seconds, 1)}
    print(format_table(caption_stats, f"trusted captions ({out / 'captions.json'})"))
    print(format_table(ref_stats, f"long references ({out / 'long_refs.json'})"))
    if args.paragraphs:
        from clid.data.stats import format_bands, paragraph_bands

        lengths = caption_lengths([r["paragraph"] for r in records], tokenizer, keep_sentences=True)
        print(format_table(length_stats(lengths, "paragraph"), f"paragraphs ({out / 'paragraphs'})"))
        print(format_bands(paragraph_bands(lengths)))
    print(json.dumps(counts, indent=1))
    for level, n_short in short.items():
        if n_short:
            print(f"note: {n_short} of {len(tests)} test images have fewer than {args.refs_per_level} level-{level} "
                  "references (their scenes hold too little to describe truthfully at that length)")
    return counts


def remove_other_images(folder: Path, kept: set) -> None:
    """Remove the images an earlier, larger world of this command left in ``folder`` (its names, demo_NNNNNN.png,
    outside ``kept``), so that a command reading the folder whole reads this world alone."""
    earlier = [p for p in folder.glob("demo_*.png") if re.fullmatch(r"demo_\d{6}\.png", p.name) and p.name not in kept]
    for path in earlier:
        path.unlink()
    if earlier:
        print(f"removed {len(earlier)} images of an earlier, larger world from {folder}")


def main(argv=None) -> None:
    args = parse_args(argv)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise SystemExit(f"error: --out {out} is a file, not a folder")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    # 0. a re-run with the same arguments has nothing to do
    record = run_record(args, settings=[k for k in vars(args) if k not in ("out", "workers", "chunk", "batch_size",
                                                                           "preview", "force")])
    record["settings"]["world features"] = "box and figure histograms"  # a world with older features is rebuilt
    stamp = out / "world.json"
    wanted = list(OUTPUTS) + ([] if args.skip_features else ["features.h5"]) + list(PARAGRAPH_OUTPUTS if args.paragraphs else ())
    if not args.force and stamp.exists() and all((out / f).exists() for f in wanted):
        earlier = read_json(stamp).get("run")
        differences = record_differences(earlier, record) if isinstance(earlier, dict) else ["an earlier version"]
        if not differences:
            print(f"{out}: this world is already complete (see {stamp}); --force rebuilds it")
            if args.preview:
                records = read_preview_records(out, args.preview)
                write_preview(out / "preview.png", out, records, args.preview)
                print(f"wrote {out / 'preview.png'}")
            return
        print(f"{out}: rebuilding the world ({'; '.join(differences)})")
    t_start = time.time()
    splits = ["train"] * args.n_train + ["val"] * args.n_val + ["test"] * args.n_test
    jobs = [(i + 1, split) for i, split in enumerate(splits)]  # caption (COCO) ids 1..N
    config = {"out": str(out), "seed": args.seed, "size": args.size, "graph_noise": args.graph_noise,
              "hallucinations": args.hallucinations,
              "captions_per_image": args.captions_per_image, "refs_per_level": args.refs_per_level,
              "long_levels": args.long_levels, "crop": args.crop, "whole": args.whole,
              "colour_bins": args.colour_bins, "skip_features": args.skip_features, "batch_size": args.batch_size,
              "paragraphs": args.paragraphs}
    (out / "images").mkdir(parents=True, exist_ok=True)

    # 1. draw the scenes, write the images, encode the regions (chunks of images in worker processes);
    #    graphs, captions, references and features come back in id order
    records = make_images(jobs, config, args.workers, args.chunk)
    t_draw = time.time() - t_start
    remove_other_images(out / "images", {r["filename"] for r in records})

    # 2. region features: one HDF5 group per caption id
    if not args.skip_features:
        write_features(out / "features.h5", ((r["image_id"], Regions(r.pop("features"), r["boxes"], args.size, args.size))
                                             for r in records), "clid-encoder")

    # 3. the dataset files
    write_json(out / "captions.json", karpathy_json(records, lambda r: [(c, {}) for c in r["captions"]]))
    tests = [r for r in records if r["split"] == "test"]
    write_json(out / "long_refs.json", karpathy_json(
        tests, lambda r: [(text, {"level": int(level)}) for level, texts in sorted(r["refs"].items()) for text in texts]))
    write_json(out / "scene_graphs.json", [r["noisy"] for r in records])
    write_json(out / "scene_graphs_clean.json", [r["clean"] for r in records])
    write_json(out / "image_data.json", [{"image_id": VG_ID_OFFSET + r["image_id"], "width": args.size,
                                          "height": args.size, "coco_id": r["image_id"], "flickr_id": None,
                                          "url": r["filename"]} for r in records])
    if args.paragraphs:  # the Stanford layout: the paragraphs, and the split id lists beside them
        write_json(out / "paragraphs" / "paragraphs_v1.json", [
            {"url": r["filename"], "image_id": r["image_id"], "paragraph": r["paragraph"]} for r in records])
        for split in ("train", "val", "test"):
            write_json(out / "paragraphs" / f"{split}_split.json", [r["image_id"] for r in records if r["split"] == split])
    if args.preview:
        write_preview(out / "preview.png", out, records, args.preview)

    # 4. what was made: the length tables and counts, kept in world.json (a re-run of this recipe skips)
    counts = describe_world(records, splits, out, args, seconds=time.time() - t_start)
    write_json(stamp, {"run": record, "counts": counts}, indent=1)
    print(f"wrote {out} in {time.time() - t_start:.0f} s (drawing and encoding {t_draw:.0f} s)")


if __name__ == "__main__":
    run_main(main)
