"""Benchmark of reading region features from a cold file: the training loader's batches per second and MB/s
beside the disk's own random-read bound for the same reads, in the same run, with 0, 2 and 4 workers, for a
float32 file and its float16 copy.

In:  nothing: it writes a synthetic feature file shaped as the VLP release (100 regions an image, 2,048
     features and 1,601 class probabilities each) into --work, --gb gigabytes in float32 (default 2), and its
     float16 copy (``python -m clid.features convert --format clid --dtype float16``).
Out: a table on stdout (and --json FILE): per dtype and worker count, batches/s and MB/s of
     - "loader": what 04's loader does for a batch of --batch images: each image read from the HDF5 file
       through FeatureStore and RegionCache (uncached, as in a loader worker), its box inputs built, the batch
       padded; 0 workers: in this process, N: a torch DataLoader of N forked processes;
     - "pread": the bound, plain os.pread calls of the same byte ranges (each image's datasets), in the same
       order, from 0 (this thread) or N threads;
     and the ratio loader / pread, at each worker count and best against best; with 0 workers also the CPU
     time a batch costs (the loader is bound by it where cores are few: batches/s <= cores / that time).

    python bench/bench_io.py                      # 2 GB float32 + 1 GB float16, 20 batches of 64 per row
    python bench/bench_io.py --gb 40 --batches 60 # larger than this machine's page cache

Every measurement starts cold: the file's pages are dropped from the page cache (posix_fadvise DONTNEED, which
needs nothing but the file) before it, and the batches read distinct images in a random order, so no read is
served from what an earlier one brought in (as a run at COCO scale, where the file is larger than the memory).
MB are 10^6 bytes of stored features and class probabilities. Load average before and after: on a shared
machine, compare only the columns of one run.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from clid.data.store import FeatureStore, RegionCache, Regions, write_features  # noqa: E402
from clid.run.cli import HelpFormatter, positive_float, positive_int, run_main  # noqa: E402

REGIONS, DIM, CLASSES = 100, 2048, 1601  # the VLP release, as 04 reads it
WORKERS = (0, 2, 4)


def write_world(path: Path, images: int) -> None:
    """A feature file of ``images`` VLP-shaped images (random values; each image its own)."""
    rng = np.random.default_rng(0)
    base_features = rng.random((REGIONS, DIM), dtype=np.float32)
    base_classes = rng.random((REGIONS, CLASSES), dtype=np.float32)
    boxes = np.tile(np.array([[10, 10, 200, 150]], np.float32), (REGIONS, 1))

    def items():
        for i in range(images):  # a cheap change per image, so that no two images share their bytes
            yield str(i + 1), Regions(base_features * (1 + i * 1e-4), boxes, 640, 480, base_classes * (1 - i * 1e-5),
                                      np.ones(REGIONS, np.float32))
    write_features(path, items(), "bench-io")


def drop_cache(path: Path) -> None:
    """Drop the file's pages from the page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def byte_ranges(path: Path, ids: list[str]) -> dict[str, list[tuple[int, int]]]:
    """(offset, size) of each image's datasets in the file (contiguous datasets, as write_features writes)."""
    import h5py

    with h5py.File(path, "r") as f:
        return {i: [(f[i][name].id.get_offset(), f[i][name].id.get_storage_size()) for name in f[i]] for i in ids}


def payload_bytes(path: Path, ids: list[str]) -> int:
    import h5py

    with h5py.File(path, "r") as f:
        return sum(f[i][name].id.get_storage_size() for i in ids for name in ("features", "cls_prob"))


class Batches(torch.utils.data.Dataset):
    """Batch k: the padded region inputs of ``order[k]`` (a list of image ids), read uncached."""

    def __init__(self, path: Path, order: list[list[str]]):
        self.path, self.order, self.regions = path, order, None

    def __len__(self) -> int:
        return len(self.order)

    def open(self, worker_id: int = 0) -> None:
        self.regions = RegionCache(FeatureStore(self.path), CLASSES, cache=False)

    def __getitem__(self, k: int):
        return self.regions.batch(self.order[k])


def loader(path: Path, order: list[list[str]], workers: int) -> float:
    """Seconds to make every batch of ``order`` as 04's loader makes them."""
    data = Batches(path, order)
    start = time.perf_counter()
    if workers == 0:
        data.open()
        for k in range(len(data)):
            data[k]
    else:
        batches = torch.utils.data.DataLoader(data, batch_size=None, num_workers=workers, worker_init_fn=data.open,
                                              multiprocessing_context="fork", prefetch_factor=4)
        for _ in batches:
            pass
    return time.perf_counter() - start


def pread(path: Path, order: list[list[str]], ranges: dict, workers: int) -> float:
    """Seconds to read the same byte ranges with os.pread, image by image, from ``workers`` threads."""
    fd = os.open(path, os.O_RDONLY)
    reads = [r for batch in order for i in batch for r in ranges[i]]
    start = time.perf_counter()
    try:
        if workers == 0:
            for offset, size in reads:
                os.pread(fd, size, offset)
        else:
            with ThreadPoolExecutor(workers) as pool:
                list(pool.map(lambda r: os.pread(fd, r[1], r[0]), reads, chunksize=8))
    finally:
        os.close(fd)
    return time.perf_counter() - start


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    p.add_argument("--work", default="/tmp/clid-bench-io", help="folder for the feature files (kept for the next run)")
    p.add_argument("--gb", type=positive_float, default=2.0, help="size of the float32 file, in GB")
    p.add_argument("--batch", type=positive_int, default=64, help="images a batch (04's global batch)")
    p.add_argument("--batches", type=positive_int, default=20, help="batches a measurement")
    p.add_argument("--json", help="write the results here too")
    args = p.parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    per_image = REGIONS * (DIM + CLASSES) * 4
    images = max(1, int(args.gb * 1e9 / per_image))
    if args.batch * args.batches > images:
        p.error(f"--batches {args.batches} of --batch {args.batch} read {args.batch * args.batches} distinct images; "
                f"--gb {args.gb:g} holds {images}: give a larger --gb")
    files = {"float32": work / f"features-{images}.h5", "float16": work / f"features-{images}-fp16.h5"}
    if not files["float32"].exists():
        print(f"writing {images} images ({images * per_image / 1e9:.1f} GB) to {files['float32']}", flush=True)
        write_world(files["float32"], images)
    if not files["float16"].exists():
        from clid.features.convert import main as convert

        convert(["--format", "clid", str(files["float32"]), "--dtype", "float16", "--out", str(files["float16"])])
    order_ids = np.random.default_rng(1).permutation(images)[: args.batch * args.batches] + 1
    order = [[str(i) for i in order_ids[k * args.batch:(k + 1) * args.batch]] for k in range(args.batches)]
    print(f"load average before: {os.getloadavg()}", flush=True)
    rows = []
    for dtype, path in files.items():
        ranges = byte_ranges(path, [i for batch in order for i in batch])
        megabytes = payload_bytes(path, [i for batch in order for i in batch]) / 1e6
        for workers in WORKERS:
            row = {"dtype": dtype, "workers": workers, "file_gb": round(path.stat().st_size / 1e9, 2)}
            for name, run in (("loader", lambda: loader(path, order, workers)),
                              ("pread", lambda: pread(path, order, ranges, workers))):
                drop_cache(path)
                cpu = time.process_time()
                seconds = run()
                if workers == 0:  # (this process's CPU time: what the loader costs a core, free of the machine's load)
                    row[f"{name}_cpu_ms_per_batch"] = round((time.process_time() - cpu) * 1000 / args.batches, 1)
                row[f"{name}_batches_s"] = round(args.batches / seconds, 2)
                row[f"{name}_mb_s"] = round(megabytes / seconds, 1)
            row["ratio"] = round(row["loader_mb_s"] / row["pread_mb_s"], 3)
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"load average after: {os.getloadavg()}")
    print(f"\n{'dtype':8} {'workers':>7} {'loader b/s':>10} {'loader MB/s':>11} {'pread b/s':>9} {'pread MB/s':>10} "
          f"{'loader/pread':>12}")
    for r in rows:
        print(f"{r['dtype']:8} {r['workers']:>7} {r['loader_batches_s']:>10} {r['loader_mb_s']:>11} "
              f"{r['pread_batches_s']:>9} {r['pread_mb_s']:>10} {r['ratio']:>12}")
    summary = {}
    for dtype in files:
        mine = [r for r in rows if r["dtype"] == dtype]
        best_loader = max(mine, key=lambda r: r["loader_mb_s"])
        best_pread = max(mine, key=lambda r: r["pread_mb_s"])
        summary[dtype] = {"loader_best_workers": best_loader["workers"], "pread_best_workers": best_pread["workers"],
                          "best_against_best": round(best_loader["loader_mb_s"] / best_pread["pread_mb_s"], 3),
                          "loader_batches_s": best_loader["loader_batches_s"]}
        print(f"{dtype}: the loader's best ({best_loader['workers']} workers, {best_loader['loader_batches_s']} "
              f"batches/s) is {summary[dtype]['best_against_best']:.0%} of the random-read bound's best "
              f"({best_pread['workers']} threads); target >= 80%")
    print(f"float16 against float32, the loader's best batches/s: "
          f"{summary['float16']['loader_batches_s'] / summary['float32']['loader_batches_s']:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "summary": summary}, indent=1))


if __name__ == "__main__":
    run_main(main)
