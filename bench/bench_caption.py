"""Captions per second of the caption API (clid.caption.CaptionWriter) per model preset and length level.

In:  nothing: models of the `tiny` and `labert` (BERT-base: 12 x 768) presets with random weights, built
     without downloading anything (the timing does not depend on training), and random region features of
     --regions regions per image (2048-d, as bottom-up features).
Out: a table on stdout, one row per (preset, level): images, seconds, captions per second, and captions
     per CPU second of this process (on a machine shared with other jobs, the wall-clock figure falls
     with the load and the CPU-time one much less; with one thread, OMP_NUM_THREADS=1, it is what an idle
     core gives); --json FILE also writes the rows.

    python bench/bench_caption.py                                   # tiny and labert, levels 1, 4 and 7
    python bench/bench_caption.py --presets tiny --levels 1 2 3 4 5 6 7 --images 64
    python bench/bench_caption.py --device cuda                     # on a GPU machine

Each row decodes --images images (--labert-images for labert) at one level in batches of --batch-size,
with the paper's mask-predict steps (10, 15, ..., 40 for levels 1..7) and the authors' decoding
(every position re-predicted, confidences averaged), the full 30,522-word vocabulary. A warm-up batch
runs first; each row keeps the fastest of --rounds rounds. The time covers what a call of
``CaptionWriter.decode`` does: reading the regions, padding, decoding and turning token ids into text.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from clid.base.text import load_tokenizer
from clid.caption import CaptionWriter, MemoryRegions
from clid.data.store import Regions
from clid.model.captioner import PRESETS, Captioner, CaptionerConfig
from clid.model.decode import default_steps
from clid.run.cli import HelpFormatter, run_main

# BERT-base's shape (the `labert` preset reads it from the BERT folder; here it is written out, so nothing
# is downloaded)
BERT_BASE = dict(hidden_size=768, num_layers=12, num_heads=12, intermediate_size=3072, max_position=512,
                 vocab_size=30522, layer_norm_eps=1e-12)
REGION_DIM = 2048


def build(preset: str, device: str) -> Captioner:
    """A model of the preset with random weights and the offline bert-base-uncased tokenizer."""
    options = {k: v for k, v in PRESETS[preset].items() if k != "init_from"}
    if preset == "labert":
        options.update(BERT_BASE)
    torch.manual_seed(0)
    model = Captioner(CaptionerConfig(region_dim=REGION_DIM, preset=preset, dropout=0.0, **options))
    model.tokenizer = load_tokenizer()
    return model.to(device).eval()


def random_regions(n_images: int, n_regions: int, seed: int = 0) -> dict[str, Regions]:
    rng = np.random.default_rng(seed)
    out = {}
    for i in range(n_images):
        xy = rng.uniform(0, 400, size=(n_regions, 2))
        wh = rng.uniform(20, 200, size=(n_regions, 2))
        boxes = np.concatenate([xy, np.minimum(xy + wh, 640)], axis=1).astype(np.float32)
        out[str(i)] = Regions(rng.normal(size=(n_regions, REGION_DIM)).astype(np.float32), boxes, 640.0, 640.0)
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    p.add_argument("--presets", nargs="+", default=["tiny", "labert"], choices=["tiny", "labert"],
                   help="model sizes to time")
    p.add_argument("--levels", type=int, nargs="+", default=[1, 4, 7], help="caption levels (1..7)")
    p.add_argument("--images", type=int, default=64, help="images per row (tiny)")
    p.add_argument("--labert-images", type=int, default=16, help="images per row (labert)")
    p.add_argument("--batch-size", type=int, default=64, help="images decoded together")
    p.add_argument("--regions", type=int, default=36, help="regions per image")
    p.add_argument("--rounds", type=int, default=2, help="timed rounds per row; the fastest counts")
    p.add_argument("--device", default="cpu", help="cpu, cuda, ...")
    p.add_argument("--json", default=None, help="also write the rows to this file")
    args = p.parse_args(argv)
    if min(args.levels) < 1 or max(args.levels) > 7 or min(args.images, args.labert_images, args.batch_size,
                                                             args.regions, args.rounds) < 1:
        p.error("--levels are 1..7; --images, --labert-images, --batch-size, --regions and --rounds at least 1")

    print(f"device {args.device}, torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"{args.regions} regions of {REGION_DIM} dimensions per image; batch {args.batch_size}")
    print(f"{'preset':8s} {'level':>5s} {'tokens':>7s} {'steps':>5s} {'images':>6s} {'seconds':>8s} {'captions/s':>10s} "
          f"{'captions/CPU s':>14s}")
    rows = []
    for preset in args.presets:
        model = build(preset, args.device)
        writer = CaptionWriter(model, device=args.device, batch_size=args.batch_size)
        n = args.labert_images if preset == "labert" else args.images
        regions = MemoryRegions(random_regions(n, args.regions), REGION_DIM)
        ids = list(regions.regions)
        writer.decode(ids[:min(4, n)], [1], features=regions)  # warm-up
        for level in args.levels:
            best = best_cpu = float("inf")
            for _ in range(args.rounds):
                if args.device.startswith("cuda"):
                    torch.cuda.synchronize()
                start, start_cpu = time.perf_counter(), time.process_time()
                captions, _ = writer.decode(ids, [level], features=regions)
                if args.device.startswith("cuda"):
                    torch.cuda.synchronize()
                best = min(best, time.perf_counter() - start)
                best_cpu = min(best_cpu, time.process_time() - start_cpu)
            assert len(captions[level]) == n
            low, high = model.levels[level - 1]
            steps = default_steps(model.levels)[level - 1]
            row = {"preset": preset, "level": level, "tokens": f"{low}-{high}", "steps": steps, "images": n,
                   "seconds": round(best, 3), "captions_per_s": round(n / best, 2),
                   "cpu_seconds": round(best_cpu, 3), "captions_per_cpu_s": round(n / best_cpu, 2)}
            rows.append(row)
            print(f"{preset:8s} {level:5d} {row['tokens']:>7s} {steps:5d} {n:6d} {best:8.2f} {n / best:10.2f} "
                  f"{n / best_cpu:14.2f}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    run_main(main)
