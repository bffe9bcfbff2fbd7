"""One demo image, start to finish: build, draw and save the scene, then its graphs, captions, references
and region features. Runs in worker processes (``init_worker`` sets each one up)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..features import RegionEncoder, colour_histograms, crop_regions
from ..files import atomic_path
from .captions import trusted_captions
from .graphs import scene_graphs
from .references import long_references
from .scenes import build_scene
from .world import Scene


def region_boxes(scene: Scene) -> list[tuple]:
    """Row 0 is the whole image; then one box per true object (objects, clothes, background regions),
    sorted by position so the row order carries no label."""
    return [(0, 0, scene.width, scene.height)] + sorted(t.box for t in scene.things)


CONFIG: dict = {}


def init_worker(config: dict, threads: int = 1) -> None:
    """Per process: the settings, the tokenizer and (unless skipped) the encoder, on ``threads`` threads."""
    CONFIG.update(config)
    from clid.text import load_tokenizer

    CONFIG["tokenizer"] = load_tokenizer()
    if not config["skip_features"]:
        import torch

        torch.set_num_threads(threads)
        CONFIG["encoder"] = RegionEncoder(config["batch_size"])


def make_image(image_id: int, split: str) -> dict:
    """Build, draw and save one scene; return its graphs, captions, references and region crops."""
    c = CONFIG
    scene = build_scene(c["seed"], image_id, c["size"], c["size"])
    filename = f"demo_{image_id:06d}.png"
    with atomic_path(Path(c["out"]) / "images" / filename) as tmp:
        scene.image.save(tmp, format="PNG", compress_level=1)
    clean, noisy = scene_graphs(scene, c["seed"], c["graph_noise"])
    record = {"image_id": image_id, "split": split, "filename": filename, "clean": clean, "noisy": noisy,
              "captions": trusted_captions(scene, c["seed"], c["captions_per_image"], c["tokenizer"]),
              "refs": (long_references(scene, c["seed"], c["long_levels"], c["refs_per_level"], c["tokenizer"])
                       if split == "test" and c["refs_per_level"] > 0 else {}),
              "boxes": region_boxes(scene), "kind": scene.kind}
    if not c["skip_features"]:
        record["whole"], record["crops"] = crop_regions(scene.image, record["boxes"][1:], c["crop"], c["whole"])
        record["colours"] = colour_histograms(scene.image, record["boxes"], c["colour_bins"])
    return record


def make_chunk(jobs: list) -> list[dict]:
    """A few images at once, so the encoder sees full batches: adds ``features`` [R, 1280 + 2 * bins**3]
    (EfficientNet, then the colour histograms) to each record."""
    records = [make_image(image_id, split) for image_id, split in jobs]
    if not CONFIG["skip_features"]:
        encoder = CONFIG["encoder"]
        crops = encoder(np.concatenate([r.pop("crops") for r in records]))
        wholes = encoder(np.stack([r.pop("whole") for r in records]))
        row = 0
        for r, whole in zip(records, wholes):
            n = len(r["boxes"]) - 1
            encoded = np.concatenate([whole[None], crops[row:row + n]])
            r["features"] = np.concatenate([encoded, r.pop("colours")], axis=1).astype(np.float32)
            row += n
    return records
