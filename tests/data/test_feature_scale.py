"""Features at COCO scale: a file stored as float16 or bfloat16 is half the bytes and reads back as float32
within the type's rounding; the region cache, sized by --region-cache, reads an image from the file once when
the features fit (also with loader workers, which share a complete cache)."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from badinput import run_stage
from toyworld import make_toy_world

from clid.data import store
from clid.data.store import FeatureStore, RegionCache, cache_bytes, region_cache_size


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("scale")
    make_toy_world(root, n_train=12, n_val=2, n_test=2, dim=256, cls_prob=True)
    return root


@pytest.mark.parametrize("dtype, rounding", [("float16", 2.0 ** -11), ("bfloat16", 2.0 ** -8)])
def test_a_half_file_is_half_the_bytes_and_reads_back_as_float32(world, tmp_path, dtype, rounding):
    half = tmp_path / f"{dtype}.h5"
    outcome = run_stage("features", ["convert", "--format", "clid", world / "features.h5", "--dtype", dtype, "--out", half])
    assert outcome.code == 0, outcome.text
    assert f"256-d, {dtype}" in outcome.text
    full_store, half_store = FeatureStore(world / "features.h5"), FeatureStore(half)
    assert half_store.dtype == dtype and full_store.dtype == "float32" and half_store.kind == full_store.kind
    full_bytes = sum(f["features"].id.get_storage_size() for f in full_store._file.values())
    half_bytes = sum(f["features"].id.get_storage_size() for f in half_store._file.values())
    assert half_bytes * 2 == full_bytes
    for image_id in full_store.ids():
        a, b = full_store.get(image_id), half_store.get(image_id)
        assert b.features.dtype == np.float32 and b.cls_prob.dtype == np.float32
        assert np.all(np.abs(b.features - a.features) <= rounding * np.abs(a.features))
        assert np.array_equal(b.boxes, a.boxes) and (b.width, b.height) == (a.width, a.height)
    cache = RegionCache(half_store, half_store.num_classes())
    features, pos = cache.get(full_store.ids()[0])
    assert features.dtype == getattr(torch, dtype)  # kept as stored: half the cache
    feats, pos, mask = cache.batch(full_store.ids()[:3])
    assert feats.dtype == pos.dtype == torch.float32  # the model's usual input
    trained = run_stage("04", ["--captions", world / "captions.json", "--features", half, "--out", tmp_path / "run",
                               "--preset", "tiny", "--max-steps", "2", "--warmup", "1", "--batch-size", "4",
                               "--eval-every", "0"])
    assert trained.code == 0, trained.text


def test_a_bfloat16_dataset_is_decoded_and_an_unknown_tag_refused(tmp_path):
    import h5py

    values = np.array([[1.0, -2.5, 3.14159, 1e-3]], np.float32)
    encoded, attrs = store.encode_values(values, "bfloat16")
    assert encoded.dtype == np.uint16 and attrs == {"dtype": "bfloat16"}
    expected = torch.from_numpy(values).to(torch.bfloat16).float().numpy()  # round to nearest, ties to even
    path = tmp_path / "f.h5"
    store.write_features(path, [("1", store.Regions(values, [[0, 0, 4, 4]], 8, 8))], "test", "bfloat16")
    assert np.array_equal(FeatureStore(path).get("1").features, expected)
    with h5py.File(path, "a") as f:
        f["1/features"].attrs["dtype"] = "float8"
    with pytest.raises(store.DataError, match="dtype = 'float8': only bfloat16"):
        FeatureStore(path).get("1")


def test_region_cache_sizes():
    assert region_cache_size("512M") == 512 << 20 and region_cache_size("1.5G") == 3 << 29
    assert region_cache_size("2GiB") == 2 << 30 and region_cache_size("auto") == "auto"
    assert cache_bytes(4 << 30) == 4 << 30
    available, total = store.memory_bytes()
    assert 0 < available <= total and cache_bytes("auto") <= available


def read_log(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["0", "2"])
def test_features_that_fit_are_read_from_the_file_once(world, tmp_path, monkeypatch, workers):
    """Every image read is written to a log (also in the loader processes, which inherit the patched reader)."""
    log = tmp_path / "reads.log"
    real = store.load_regions

    def logged(features, image_id, *args, **kwargs):
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.write(fd, f"{image_id}\n".encode())
        os.close(fd)
        return real(features, image_id, *args, **kwargs)

    monkeypatch.setattr(store, "load_regions", logged)
    argv = ["--captions", world / "captions.json", "--features", world / "features.h5", "--out", tmp_path / "run",
            "--preset", "tiny", "--max-steps", "12", "--warmup", "1", "--batch-size", "8", "--eval-every", "0",
            "--workers", workers, "--region-cache", "64M"]
    outcome = run_stage("04", argv)
    assert outcome.code == 0, outcome.text
    reads = read_log(log)
    assert len(set(reads)) == 12 and len(reads) == 12  # 12 steps of 8 captions: every train image, each once
    if workers != "0":
        assert "region cache: 12 images" in outcome.text
    # too small a cache for them: no preload (the loader processes then read the file, uncached)
    features = FeatureStore(world / "features.h5")
    small = RegionCache(features, features.num_classes(), max_bytes=1000)
    assert not small.preload(features.ids()) and not small.complete
