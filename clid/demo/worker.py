"""One demo image, start to finish: build, draw and save the scene, then its graphs, captions, references
and region features. Runs in worker processes (``init_worker`` sets each one up)."""
from __future__ import annotations

from pathlib import Path

from clid.base.files import DataError, atomic_path
from clid.base.text import load_tokenizer
from clid.data.encoder import RegionFeatures
from clid.demo.captions import trusted_captions
from clid.demo.graphs import scene_graphs
from clid.demo.references import long_references, paragraph
from clid.demo.scenes import build_scene
from clid.demo.world import Scene


def region_boxes(scene: Scene) -> list[tuple]:
    """One box per true object (objects, clothes, background regions), sorted by position so the row
    order carries no label (the features add the whole image as row 0)."""
    return sorted(t.box for t in scene.things)


CONFIG: dict = {}


def init_worker(config: dict, threads: int = 1) -> None:
    """Per process: the settings, the tokenizer and (unless skipped) the encoder, on ``threads`` threads."""
    CONFIG.update(config)
    CONFIG["tokenizer"] = load_tokenizer()
    if not config["skip_features"]:
        import torch

        torch.set_num_threads(threads)
        CONFIG["features"] = RegionFeatures(config["crop"], config["whole"], config["colour_bins"],
                                            config["batch_size"])


def make_image(image_id: int, split: str) -> dict:
    """Build, draw and save one scene; return its graphs, captions, references and (for the features)
    its object boxes and image."""
    c = CONFIG
    scene = build_scene(c["seed"], image_id, c["size"], c["size"])
    filename = f"demo_{image_id:06d}.png"
    with atomic_path(Path(c["out"]) / "images" / filename) as tmp:
        scene.image.save(tmp, format="PNG", compress_level=1)
    clean, noisy = scene_graphs(scene, c["seed"], c["graph_noise"], c.get("hallucinations", "typical"))
    return {"image_id": image_id, "split": split, "filename": filename, "clean": clean, "noisy": noisy,
            "captions": trusted_captions(scene, c["seed"], c["captions_per_image"], c["tokenizer"]),
            "refs": (long_references(scene, c["seed"], c["long_levels"], c["refs_per_level"], c["tokenizer"])
                     if split == "test" and c["refs_per_level"] > 0 else {}),
            "paragraph": paragraph(scene, c["seed"], c["tokenizer"]) if c.get("paragraphs") else None,
            "boxes": region_boxes(scene), "image": scene.image, "kind": scene.kind}


def make_chunk(jobs: list) -> list[dict]:
    """A few images at once, so the encoder sees full batches: replaces each record's ``image`` by its
    ``features`` [1 + R, 1280 + 2 * bins**3] and ``boxes`` [1 + R, 4] (row 0 the whole image)."""
    records = [make_image(image_id, split) for image_id, split in jobs]
    images = [r.pop("image") for r in records]
    if not CONFIG["skip_features"]:
        for r, (features, boxes) in zip(records, CONFIG["features"](images, [r["boxes"] for r in records])):
            r["features"], r["boxes"] = features, boxes
    return records


def make_images(jobs: list, config: dict, workers: int, chunk: int) -> list[dict]:
    """The records of ``jobs`` [(image id, split)], in order: chunks of ``chunk`` images made by ``workers``
    processes (one torch thread each)."""
    from clid.base.progress import Progress

    chunks = [jobs[i:i + chunk] for i in range(0, len(jobs), chunk)]
    records = []
    with Progress(len(jobs), "drawing and encoding", "img") as progress:
        if workers > 1:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor
            from concurrent.futures.process import BrokenProcessPool

            from clid.data.parallel_read import how_it_died

            # (unlike multiprocessing.Pool, whose lost chunk is waited for forever, a process that dies breaks the
            # pool at once)
            ends = []
            try:
                with ProcessPoolExecutor(workers, multiprocessing.get_context("fork"), init_worker, (config, 1)) as pool:
                    try:
                        for part in pool.map(make_chunk, chunks):
                            records += part
                            progress.update(len(part))
                    except BrokenProcessPool:
                        ends = [p.exitcode for p in (getattr(pool, "_processes", None) or {}).values() if p.exitcode]
                        raise
            except BrokenProcessPool:
                for tmp in (Path(config["out"]) / "images").glob(".demo_*.png.tmp-*"):  # (the other processes' writes,
                    tmp.unlink(missing_ok=True)                                          # cut short: they have ended)
                raise DataError(config['out'], None, "a process drawing the images "
                                                     f"{how_it_died(ends[0]) if ends else 'ended'}; every "
                                                     "image written is whole and no world.json was written: "
                                                     "run the same command again (--workers 1: this process "
                                                     "alone)") from None
        else:
            init_worker(config, 1)  # one thread, as in the workers: features do not depend on --workers
            for jobs_of_chunk in chunks:
                records += make_chunk(jobs_of_chunk)
                progress.update(len(jobs_of_chunk))
    return records
