"""`python -m clid.features` for new images: boxes from a detector's output (JSON, COCO results, the TSVs
`convert` reads) or an N x N grid, without scene graphs; the file records its kind and dimension."""
import json

import numpy as np
import pytest
from conftest import run_script
from feature_formats import butd_line
from PIL import Image

from clid.data.encoder import grid_boxes, load_detections
from clid.data.store import FeatureStore
from clid.features.__main__ import main

DIM = 1280 + 2 * 2 ** 3  # EfficientNet-Lite0 features and two histograms of 2 bins a channel
FAST = ["--crop", "32", "--whole", "32", "--colour-bins", "2"]


@pytest.fixture
def images(tmp_path):
    folder = tmp_path / "photos"
    (folder / "more").mkdir(parents=True)
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (60, 80, 3), dtype=np.uint8)).save(folder / "beach.png")
    Image.fromarray(rng.integers(0, 255, (90, 40, 3), dtype=np.uint8)).save(folder / "more" / "COCO_val2014_000000391895.jpg")
    return folder


def test_grid_boxes_without_scene_graphs(images, tmp_path, one_thread, capsys):
    out = tmp_path / "grid.h5"
    main(["--images", str(images), "--boxes", "grid", "2", "--out", str(out), *FAST])
    printed = capsys.readouterr().out
    assert "wrote the region features of 2 images" in printed
    # --ids auto: a COCO file name gives the COCO id (as convert-coco keys the captions), another keeps its name
    assert ("ids (--ids auto): 1 of 2 images mapped from COCO file names to COCO ids (e.g. "
            "COCO_val2014_000000391895.jpg -> 391895), 1 named by their file names") in printed
    store = FeatureStore(out)
    assert store.ids() == ["391895", "beach"]
    main(["--images", str(images), "--boxes", "grid", "1", "--out", str(tmp_path / "kept.h5"), "--ids", "keep", *FAST])
    assert "0 of 2 images mapped" in capsys.readouterr().out
    assert FeatureStore(tmp_path / "kept.h5").ids() == ["COCO_val2014_000000391895", "beach"]  # the file names
    assert (store.kind, store.feature_dim()) == ("clid-encoder", DIM)
    beach = store.get("beach")
    assert (beach.width, beach.height) == (80, 60) and beach.confidence is None
    assert beach.boxes.tolist() == [[0, 0, 80, 60], [0, 0, 40, 30], [40, 0, 80, 30], [0, 30, 40, 60], [40, 30, 80, 60]]
    assert grid_boxes(40, 90, 3)[4] == (40 / 3, 30, 80 / 3, 60)


def test_detections_json_coco_results_and_tsv(images, tmp_path, one_thread, capsys):
    detections = tmp_path / "det.json"
    detections.write_text(json.dumps({
        "beach.png": [[1, 2, 30, 40], {"rect": [5, 5, 70, 50], "conf": 0.1, "class": "sea"},
                      {"rect": [10, 10, 20, 20], "conf": 0.9, "class": "dog"}],
        "COCO_val2014_000000391895.jpg": [{"box": [0, 0, 39, 89], "score": 0.5}]}))
    out = tmp_path / "det.h5"
    main(["--images", str(images), "--detections", str(detections), "--out", str(out), *FAST])
    store = FeatureStore(out)
    assert store.ids() == ["391895", "beach"] and store.kind == "clid-encoder"  # keys read as 02 reads them
    beach = store.get("beach")
    assert beach.boxes.tolist() == [[0, 0, 80, 60], [1, 2, 30, 40], [10, 10, 20, 20]]  # conf 0.1 < --min-conf 0.2
    np.testing.assert_allclose(beach.confidence, [1.0, 1.0, 0.9])  # the whole image, a box without one, 0.9
    # COCO detection results: bbox [x, y, w, h]; --max-boxes keeps the most confident
    coco = tmp_path / "results.json"
    coco.write_text(json.dumps([{"image_id": 391895, "bbox": [1, 2, 10, 20], "score": 0.3, "category_id": 18},
                                {"image_id": 391895, "bbox": [5, 5, 30, 30], "score": 0.8, "category_id": 1},
                                {"image_id": 391895, "bbox": [0, 0, 5, 5], "score": 0.25, "category_id": 3}]))
    main(["--images", str(images), "--detections", str(coco), "--out", str(tmp_path / "coco.h5"), "--max-boxes", "2", *FAST])
    r = FeatureStore(tmp_path / "coco.h5").get("391895")
    assert r.boxes.tolist() == [[0, 0, 40, 90], [1, 2, 11, 22], [5, 5, 35, 35]]
    np.testing.assert_allclose(r.confidence, [1.0, 0.3, 0.8])
    # the bottom-up TSV: its boxes (its features are not used)
    tsv = tmp_path / "butd.tsv"
    boxes = np.array([[2, 3, 20, 30], [0, 0, 40, 40]], np.float32)
    tsv.write_text(butd_line(391895, 40, 90, boxes, np.zeros((2, 4))) + "\n")
    assert [b for b, _ in load_detections(tsv)["391895"]] == boxes.tolist()


def test_the_command_line_and_its_errors(images, tmp_path):
    proc = run_script("-m", "clid.features", "--images", images, "--boxes", "grid", "1", "--out", tmp_path / "f.h5", *FAST)
    assert "(boxes: a 1 x 1 grid on the images of" in proc.stdout
    assert FeatureStore(tmp_path / "f.h5").get("beach").boxes.tolist() == [[0, 0, 80, 60], [0, 0, 80, 60]]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"beach": [[1, 2, 3]]}))
    proc = run_script("-m", "clid.features", "--images", images, "--detections", bad, "--out", tmp_path / "g.h5",
                      check=False)
    assert proc.returncode == 1 and proc.stderr.strip() == (
        f"error: {bad}: image beach box 0: a box must be four numbers [x1, y1, x2, y2], got [1, 2, 3]")
    assert not (tmp_path / "g.h5").exists()


def test_a_16_bit_png_gives_the_features_of_its_8_bit_image(tmp_path, one_thread):
    """Pillow reads a 16-bit greyscale PNG as mode I;16; scaled to 8 bits, it is the 8-bit image, not white."""
    from clid.data.images import load_image

    grey = np.random.default_rng(1).integers(0, 256, (48, 64), dtype=np.uint8)
    for name, pixels in (("eight", grey), ("sixteen", grey.astype(np.uint16) * 257)):
        (tmp_path / name).mkdir()
        Image.fromarray(pixels).save(tmp_path / name / "photo.png")
        main(["--images", str(tmp_path / name), "--boxes", "grid", "2", "--out", str(tmp_path / f"{name}.h5"), *FAST])
    with Image.open(tmp_path / "sixteen" / "photo.png") as image:
        assert image.mode == "I;16"
    eight, sixteen = (FeatureStore(tmp_path / f"{name}.h5").get("photo").features for name in ("eight", "sixteen"))
    np.testing.assert_array_equal(sixteen, eight)
    for mode in ("L", "RGB"):  # 01's loader too
        a, b = (load_image(tmp_path / name / "photo.png", mode, (24, 32))[0] for name in ("eight", "sixteen"))
        np.testing.assert_array_equal(b, a)
        assert 0.3 < b.mean() < 0.7


def test_regions_from_python_lists(tmp_path):
    from clid.data.store import Regions, write_features

    regions = Regions([[1.0, 2.0], [3.0, 4.0]], [[0, 0, 80, 60], [5, 5, 20, 20]], 80, 60, confidence=[1.0, 0.5])
    assert regions.features.dtype == np.float32 and regions.boxes.shape == (2, 4) and regions.width == 80.0
    write_features(tmp_path / "f.h5", [("photo", regions)], "mine")
    read = FeatureStore(tmp_path / "f.h5").get("photo")
    assert read.features.tolist() == [[1, 2], [3, 4]] and read.confidence.tolist() == [1.0, 0.5]
    with pytest.raises(TypeError, match="Regions.boxes must be an array"):
        Regions([[1.0, 2.0]], [[0, 0, 8], [1]], 80, 60)
    with pytest.raises(TypeError, match="Regions.height must be a number"):
        Regions([[1.0, 2.0]], [[0, 0, 8, 6]], 80, "60")
