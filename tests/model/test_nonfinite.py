"""NaN and inf never poison a run: bad region features are a clear error or a counted skip, a training
run whose loss or weights become non-finite stops naming the step and saves nothing, and 06 refuses
non-finite quality scores."""
import json
import re

import h5py
import numpy as np
import pytest
import torch
from conftest import run_script
from toyworld import make_toy_world

from clid.base import files
from clid.base.files import DataError, write_quality
from clid.data import store as feature_store
from clid.data.store import FeatureStore, region_problem

# one image's region features, damaged in the ways that used to turn every weight into NaN
DAMAGE = {
    "nan_row": (lambda g: g["features"].__setitem__(1, np.nan), "features: NaN at region 1 (column 0)"),
    "inf_value": (lambda g: g["features"].__setitem__((0, 5), np.inf), "features: inf at region 0 (column 5)"),
    "nan_box": (lambda g: g["boxes"].__setitem__((1, 2), np.nan), "boxes: NaN at region 1 (column 2)"),
    "zero_width": (lambda g: g.attrs.__setitem__("width", 0), "width is 0.0; it must be a positive number of pixels"),
    "box_outside": (lambda g: g["boxes"].__setitem__(0, [10, 10, 400, 20]),
                    "box of region 0 (x1, y1, x2, y2 = 10, 10, 400, 20) is not inside the 160 x 160 image"),
}


def damage(features, image_id: str, kind: str) -> str:
    """Damage one image group of a features file in place; return the expected message."""
    change, message = DAMAGE[kind]
    with h5py.File(features, "r+") as f:
        change(f[image_id])
    return message


@pytest.fixture
def world(tmp_path):
    return make_toy_world(tmp_path, n_train=12, n_val=2, n_test=4)


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_a_bad_image_is_an_error_naming_it_or_a_counted_skip(world, kind, monkeypatch):
    _, features = world
    message = damage(features, "3", kind)
    checks = []
    monkeypatch.setattr(feature_store, "region_problem", lambda *a: checks.append(a) or real_check(*a))
    store = FeatureStore(features)
    assert "3" in store  # present; the check runs when it is read
    for _ in range(2):
        with pytest.raises(DataError, match=re.escape(f"features.h5: image 3: {message}")):
            store.get("3")
    assert len(checks) == 1  # checked once, the verdict kept
    assert store.get("4").features.shape[0] >= 2 and len(checks) == 2

    skipping = FeatureStore(features, bad="skip")
    kept = [i for i in skipping.ids() if i in skipping]
    assert "3" not in kept and len(kept) == len(skipping) - 1
    assert skipping.bad_images.keys() == {"3"}
    assert skipping.skip_report().endswith("skipped 1 image(s) with bad region features (--bad-features skip); "
                                           f"first: image 3: {skipping.bad_images['3']}")


real_check = region_problem


def test_shapes_are_checked(tmp_path):
    good = {"features": np.ones((2, 8), np.float32), "boxes": np.array([[0, 0, 5, 5]] * 2, np.float32)}
    groups = [("1", good, {"width": 10, "height": 10}),
              ("2", {"features": np.ones((0, 8), np.float32), "boxes": np.ones((0, 4), np.float32)},
               {"width": 10, "height": 10}),
              ("3", {"features": np.ones((2, 6), np.float32), "boxes": good["boxes"]}, {"width": 10, "height": 10}),
              ("4", {**good, "boxes": np.ones((2, 3), np.float32)}, {"width": 10, "height": 10}),
              ("5", good, {"width": 10, "height": -4}),
              ("6", {**good, "boxes": np.array([[0, 0, 5, 5], [4, 4, 2, 9]], np.float32)}, {"width": 10, "height": 10}),
              ("7", {**good, "boxes": np.array([[-0.5, 0, 10.5, 10]] * 2, np.float32)}, {"width": 10, "height": 10})]
    files.write_h5_groups(tmp_path / "f.h5", groups)
    store = FeatureStore(tmp_path / "f.h5", bad="skip")
    assert [i for i in store.ids() if i in store] == ["1", "7"]  # 7: half a pixel past the edges is tolerated
    assert store.bad_images == {
        "2": "features (0, 8) is not [R, D] with at least one region",
        "3": "features (2, 6) have 6 columns, the file's other images 8",
        "4": "features (2, 8) and boxes (2, 3) do not match as [R, D], [R, 4]",
        "5": "height is -4.0; it must be a positive number of pixels",
        "6": "box of region 1 (x1, y1, x2, y2 = 4, 4, 2, 9) ends before it starts: boxes are x1, y1, x2, y2 in pixels "
                                   "(are these x, y, width, height?)"}


def train_cmd(world, out, *extra):
    captions, features = world
    return ["04_train_base.py", "--captions", captions, "--features", features, "--out", out, "--preset", "tiny",
            "--batch-size", "8", "--lr", "1e-3", "--warmup", "2", "--eval-every", "0", "--log-every", "1", *extra]


def all_finite(folder) -> bool:
    from safetensors.torch import load_file

    return all(bool(torch.isfinite(t).all()) for t in load_file(str(folder / "model.safetensors")).values())


@pytest.mark.slow
def test_training_on_bad_features_stops_with_one_line_or_skips_them(world, tmp_path):
    captions, features = world
    for image_id, kind in zip(("2", "5", "7", "11"), ("nan_row", "inf_value", "nan_box", "zero_width")):
        damage(features, image_id, kind)
    stopped = run_script(*train_cmd(world, tmp_path / "stopped", "--max-steps", "8", "--save-every", "1"), check=False)
    last = stopped.stderr.strip().splitlines()[-1]
    assert stopped.returncode == 1 and "Traceback" not in stopped.stderr
    assert last.startswith("error: ") and "features.h5: image " in last  # the first bad image it read
    assert any(message in last for _, message in DAMAGE.values())
    if (tmp_path / "stopped" / "model.safetensors").exists():
        assert all_finite(tmp_path / "stopped")

    skipped = run_script(*train_cmd(world, tmp_path / "skipped", "--max-steps", "4", "--bad-features", "skip",
                                    "--max-left-out", "0.5"))
    assert "skipped 12: trusted: no region features for the image" in skipped.stdout  # 4 images x 3 captions
    assert ("skipped 4 image(s) with bad region features (--bad-features skip); first: image 2: "
            "features: NaN at region 1 (column 0)") in skipped.stdout
    assert all_finite(tmp_path / "skipped")


@pytest.mark.slow
def test_a_loss_that_becomes_nan_stops_the_run_naming_the_step(world, tmp_path):
    # a diverging run: at lr 1e30 the first step leaves finite but huge weights, the second step's loss is NaN
    proc = run_script(*train_cmd(world, tmp_path / "run", "--lr", "1e30", "--warmup", "1", "--max-steps", "4",
                                 "--save-every", "1"), check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(
        f"error: the training loss is nan at step 2; stopped before its optimizer step, {tmp_path / 'run'} keeps its "
        "last checkpoint (step 1)")
    assert json.loads((tmp_path / "run" / "train_state.json").read_text())["step"] == 1
    assert all_finite(tmp_path / "run")


@pytest.mark.slow
def test_weights_that_become_infinite_are_never_saved(world, tmp_path):
    # lr 1e39 overflows float32: the first update makes the weights infinite; the checkpoint is refused
    proc = run_script(*train_cmd(world, tmp_path / "run", "--lr", "1e39", "--warmup", "1", "--max-steps", "4",
                                 "--save-every", "1"), check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: the weights hold NaN or inf after step 1 (") and "not saved, no checkpoint was written" in last
    assert not (tmp_path / "run" / "model.safetensors").exists()


@pytest.mark.slow
def test_06_refuses_infinite_and_nan_scores(world, tmp_path):
    from clid.selection.schedule import scores_for

    ids = ["1_0", "1_1", "2_0", "2_1"]
    for bad, shown in ((np.inf, "inf"), (-np.inf, "-inf"), (np.nan, "nan")):
        quality = tmp_path / f"q_{shown}.h5"
        write_quality(quality, ids, [0.0, 0.0, bad, 0.0], np.zeros(4), [0.0, 0.0, bad, 0.0])
        with pytest.raises(DataError, match=re.escape(f"q_{shown}.h5: caption 2_0: u is {shown} (1 of the 4 scores are not finite)")):
            scores_for(ids, quality)
    # the stage itself: one line, exit 1
    captions, features = world
    selfgen = tmp_path / "selfgen.jsonl"
    files.write_jsonl(selfgen, [{"id": f"{i}_0", "image_id": i, "caption": "a red dog in the park"} for i in range(1, 13)])
    quality = tmp_path / "quality.h5"
    u = [0.0] * 4 + [np.inf] + [0.0] * 7
    write_quality(quality, [f"{i}_0" for i in range(1, 13)], u, np.zeros(12), u)
    proc = run_script("06_train_selection.py", "--captions", captions, "--features", features, "--selfgen", selfgen,
                      "--quality", quality, "--out", tmp_path / "clid", "--preset", "tiny", "--max-steps", "2",
                      "--eval-every", "0", check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (f"error: {quality}: caption 5_0: u is inf "
                                                    "(1 of the 12 scores are not finite)")


@pytest.mark.slow
def test_scoring_and_evaluation_stop_on_a_bad_image_or_skip_it(world, tmp_path):
    captions, features = world
    run_script(*train_cmd(world, tmp_path / "ckpt", "--max-steps", "2"))
    run_script(*train_cmd(world, tmp_path / "other", "--max-steps", "2", "--seed", "1"))  # 05 needs two models
    selfgen = tmp_path / "selfgen.jsonl"
    files.write_jsonl(selfgen, [{"id": f"{i}_0", "image_id": i, "caption": "a red dog in the park"} for i in range(1, 7)])
    damage(features, "3", "nan_box")  # a training image: 05 scores its caption
    damage(features, "16", "zero_width")  # a test image: 07 captions it
    score = ["05_score_quality.py", "--trusted", tmp_path / "ckpt", "--extended", tmp_path / "other", "--selfgen", selfgen,
             "--features", features, "--device", "cpu", "--max-left-out", "0.5"]
    stopped = run_script(*score, "--out", tmp_path / "q_error.h5", check=False)
    assert stopped.returncode == 1 and "Traceback" not in stopped.stderr
    assert stopped.stderr.strip().splitlines()[-1] == f"error: {features}: image 3: boxes: NaN at region 1 (column 2)"
    skipped = run_script(*score, "--out", tmp_path / "q_skip.h5", "--bad-features", "skip")
    assert "not scored 1: selfgen: no region features for the image" in skipped.stdout
    assert "skipped 1 image(s) with bad region features (--bad-features skip); first: image 3" in skipped.stdout
    assert sorted(files.read_quality(tmp_path / "q_skip.h5")["id"]) == ["1_0", "2_0", "4_0", "5_0", "6_0"]

    evaluate = ["07_eval.py", "--refs", captions, "--features", features, "--checkpoint", tmp_path / "ckpt",
                "--spice", "off", "--decode-steps", "1"]
    stopped = run_script(*evaluate, "--out", tmp_path / "eval_error", check=False)
    assert stopped.returncode == 1 and "Traceback" not in stopped.stderr
    assert stopped.stderr.strip().splitlines()[-1] == (f"error: {features}: image 16: width is 0.0; "
                                                       "it must be a positive number of pixels")
    skipped = run_script(*evaluate, "--out", tmp_path / "eval_skip", "--bad-features", "skip")
    assert ("skipped 1 image(s) with bad region features (--bad-features skip); first: image 16: width is 0.0; "
            "it must be a positive number of pixels; they count as misses") in skipped.stdout
    metrics = json.loads((tmp_path / "eval_skip" / "metrics.json").read_text())
    assert metrics["runs"]["ckpt"]["skipped"]["test images without region features (counted as misses)"] == 1
