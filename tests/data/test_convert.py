"""`python -m clid.features convert`: the VLP release (the authors' features), the bottom-up TSV and the
VinVL TSV into our region-feature file, on releases of three images written from each format's layout."""
import contextlib
import io
import json

import h5py
import numpy as np
import pytest
from conftest import run_script
from feature_formats import BOX_FILE, PREFIX, butd_line, vinvl_line, write_butd, write_vinvl, write_vlp

from clid.base.files import DataError
from clid.data.convert import line_index
from clid.data.store import FeatureStore
from clid.features.convert import main


class Result:
    def __init__(self, returncode, stdout, stderr):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def convert(*argv, check=True):
    """The command in this process: exit status, output and the error line (bad input: a DataError or an
    OSError, which ``python -m clid.features convert`` prints as one line ``error: ...`` and exits 1).
    Stored as float32 (``--dtype float32``), so that every value compares exactly with the release's."""
    argv = (*argv, "--dtype", "float32")
    out = io.StringIO()
    code, message = 0, ""
    with contextlib.redirect_stdout(out):
        try:
            main([str(a) for a in argv])
        except (DataError, OSError) as err:
            code, message = 1, f"error: {err}"
    if check and code:
        raise AssertionError(f"{argv} failed: {message}\n{out.getvalue()[-2000:]}")
    return Result(code, out.getvalue(), message)


def groups(path) -> dict:
    """Every dataset and attribute of a features file, for exact comparisons."""
    with h5py.File(path, "r") as f:
        return {"root": dict(f.attrs), **{k: ({n: d[()] for n, d in g.items()}, dict(g.attrs)) for k, g in f.items()}}


def assert_same(a: dict, b: dict):
    assert a.keys() == b.keys() and a["root"] == b["root"]
    for key in set(a) - {"root"}:
        assert a[key][1] == b[key][1] and a[key][0].keys() == b[key][0].keys()
        for name in a[key][0]:
            assert np.array_equal(a[key][0][name], b[key][0][name]), (key, name)


def test_vlp_release_converts_with_class_probabilities_and_confidences(tmp_path):
    truth = write_vlp(tmp_path)
    out = tmp_path / "features.h5"
    proc = convert("--format", "vlp", tmp_path / "region_feat_gvd_wo_bgd", "--out", out)
    assert "wrote the region features of 3 images" in proc.stdout and "'vlp-fc6', 2048-d" in proc.stdout
    assert "class probabilities of 1601 classes" in proc.stdout
    assert "ids: 3 mapped from their keys (e.g. COCO_train2014_000000000009 -> 9)" in proc.stdout
    assert "image sizes from the boxes' extent (3)" in proc.stdout
    store = FeatureStore(out)
    assert store.ids() == ["9", "391895", "522418"]  # the box file's test2014 image has no features: not an image
    assert (store.kind, store.feature_dim(), store.num_classes()) == ("vlp-fc6", 2048, 1601)
    for key, (features, cls, rows) in truth.items():
        r = store.get(str(int(key[-12:])))
        assert np.array_equal(r.features, features) and np.array_equal(r.cls_prob, cls)
        assert np.array_equal(r.boxes, rows[:, :4]) and np.array_equal(r.confidence, rows[:, 5])
        # VLP's own loader estimates the image size from the boxes: the largest x and y
        assert (r.width, r.height) == (rows[:, [0, 2]].max(), rows[:, [1, 3]].max())
    # explicit files work as a folder does; --sizes gives the true sizes (a COCO annotations JSON)
    coco = tmp_path / "captions_val2014.json"
    coco.write_text(json.dumps({"images": [{"id": 391895, "width": 640, "height": 480}], "annotations": []}))
    files = sorted((tmp_path / "region_feat_gvd_wo_bgd").rglob("*.h5"))
    out2 = tmp_path / "sized.h5"
    proc = convert("--format", "vlp", *files, "--out", out2, "--sizes", coco)
    assert "image sizes from --sizes (1), the boxes' extent (2)" in proc.stdout
    sized = FeatureStore(out2).get("391895")
    assert (sized.width, sized.height) == (640, 480)


def test_vlp_shards_give_the_one_shard_file(tmp_path):
    write_vlp(tmp_path)
    folder = tmp_path / "region_feat_gvd_wo_bgd"
    convert("--format", "vlp", folder, "--out", tmp_path / "one.h5")
    for k in range(2):
        proc = convert("--format", "vlp", folder, "--out", tmp_path / "two.h5", "--shard-id", k, "--num-shards", 2,
                       "--chunk-size", 1)
    assert "wrote the region features of 3 images" in proc.stdout
    assert_same(groups(tmp_path / "one.h5"), groups(tmp_path / "two.h5"))
    assert sorted(p.name for p in tmp_path.glob("two.h5*")) == ["two.h5", "two.h5.counts.tsv", "two.h5.run.json"]


def test_vlp_bad_record_is_one_line_or_a_counted_skip(tmp_path):
    write_vlp(tmp_path)
    feat = tmp_path / "region_feat_gvd_wo_bgd" / "feat_cls_1000" / f"{PREFIX}_feat895.h5"
    with h5py.File(feat, "a") as f:  # 7 feature rows for the 10 boxes
        del f["COCO_val2014_000000391895"]
        f.create_dataset("COCO_val2014_000000391895", data=np.zeros((7, 2048), np.float32))
    out = tmp_path / "features.h5"
    proc = convert("--format", "vlp", tmp_path / "region_feat_gvd_wo_bgd", "--out", out, check=False)
    assert proc.returncode == 1 and proc.stderr == (
        f"error: {feat}: image COCO_val2014_000000391895: features (7, 2048) float32 do not match the 10 boxes of "
        f"{tmp_path / 'region_feat_gvd_wo_bgd' / BOX_FILE} as [R, D] numbers")
    assert not out.exists()
    proc = convert("--format", "vlp", tmp_path / "region_feat_gvd_wo_bgd", "--out", out, "--bad-records", "skip",
                   "--restart")
    assert "skipped 1 malformed record(s)" in proc.stdout and "image COCO_val2014_000000391895" in proc.stdout
    assert FeatureStore(out).ids() == ["9", "522418"]
    assert "image COCO_val2014_000000391895" in (tmp_path / "features.h5.skipped.tsv").read_text()


def test_butd_tsv_converts(tmp_path):
    tsv = tmp_path / "trainval_36.tsv"
    truth = write_butd(tsv)
    out = tmp_path / "features.h5"
    proc = convert("--format", "butd", tsv, "--out", out)
    assert "wrote the region features of 3 images" in proc.stdout and "'butd', 2048-d" in proc.stdout
    assert "ids: 0 mapped from their keys, 3 kept as the keys" in proc.stdout
    store = FeatureStore(out)
    assert store.ids() == ["9", "391895", "522418"] and (store.kind, store.num_classes()) == ("butd", 0)
    for image_id, (width, height, boxes, features) in truth.items():
        r = store.get(image_id)
        assert (r.width, r.height) == (width, height) and r.confidence is None and r.cls_prob is None
        assert np.array_equal(r.boxes, boxes) and np.array_equal(r.features, features)
    # three shards give the same file
    for k in range(3):  # the last as a process of the real command line: it merges the three parts
        argv = ("--format", "butd", tsv, "--out", tmp_path / "three.h5", "--shard-id", k, "--num-shards", 3)
        proc = run_script("-m", "clid.features", "convert", *argv, "--dtype", "float32") if k == 2 else convert(*argv)
    assert "wrote the region features of 3 images" in proc.stdout
    assert_same(groups(out), groups(tmp_path / "three.h5"))


def test_butd_bad_record(tmp_path):
    tsv = tmp_path / "bad.tsv"
    truth = write_butd(tsv)
    width, height, boxes, features = truth["9"]
    lines = tsv.read_text().splitlines()
    lines[1] = butd_line(9, width, height, boxes[:5], features).replace("\t5\t", "\t7\t", 1)  # num_boxes 7, 5 boxes
    tsv.write_text("\n".join(lines) + "\n")
    out = tmp_path / "features.h5"
    proc = convert("--format", "butd", tsv, "--out", out, check=False)
    assert proc.returncode == 1 and proc.stderr == (
        f"error: {tsv}: line 2 (image 9): num_boxes 7, but 'boxes' holds 20 values (4 a box)")
    assert not out.exists()


def test_vinvl_tsv_converts_with_confidences(tmp_path):
    tsv, hw = tmp_path / "features.tsv", tmp_path / "hw.tsv"
    truth = write_vinvl(tsv, hw)
    out = tmp_path / "features.h5"
    proc = convert("--format", "vinvl", tsv, "--sizes", hw, "--out", out)
    assert "'vinvl', 2048-d" in proc.stdout and "image sizes from --sizes (2), the records (1)" in proc.stdout
    store = FeatureStore(out)
    assert store.ids() == ["391895", "522418", "1000092795"] and store.kind == "vinvl"
    for image_id, (width, height, boxes, conf, features) in truth.items():
        r = store.get(image_id)
        assert (r.width, r.height) == (width, height)
        assert np.array_equal(r.boxes, boxes) and np.array_equal(r.confidence, conf)
        assert np.array_equal(r.features, features)
    # --ids keep: the keys as they are
    kept = tmp_path / "kept.h5"
    proc = convert("--format", "vinvl", tsv, "--sizes", hw, "--out", kept, "--ids", "keep", check=False)
    assert proc.returncode == 1 and proc.stderr == (f"error: {tsv}: line 2 (image flickr/1000092795.jpg): the image id "
                                                    "'flickr/1000092795.jpg' holds a '/' (--ids auto keeps only the file name)")
    lines = tsv.read_text().splitlines()
    tsv.write_text("\n".join(lines[:1] + lines[2:]) + "\n")
    convert("--format", "vinvl", tsv, "--sizes", hw, "--out", kept, "--ids", "keep")
    assert FeatureStore(kept).ids() == ["000000522418", "COCO_val2014_000000391895.jpg"]


def test_vinvl_bad_record(tmp_path):
    tsv, hw = tmp_path / "features.tsv", tmp_path / "hw.tsv"
    write_vinvl(tsv, hw)
    lines = tsv.read_text().splitlines()
    record = json.loads(lines[2].split("\t", 1)[1])
    del record["objects"][3]["feature"]
    lines[2] = "000000522418\t" + json.dumps(record)
    tsv.write_text("\n".join(lines) + "\n")
    out = tmp_path / "features.h5"
    proc = convert("--format", "vinvl", tsv, "--sizes", hw, "--out", out, check=False)
    assert proc.returncode == 1 and proc.stderr == (
        f"error: {tsv}: line 3 (image 000000522418) objects[3]: no 'feature' (the benchmark writes it with "
        "TEST.OUTPUT_FEATURE True)")
    assert not out.exists()


def test_line_index_streams_every_record(tmp_path):
    """Offsets and line numbers of the non-empty lines, across blocks, with CRLF, blank lines and no final newline."""
    path = tmp_path / "x.tsv"
    lines = ["a\t" + "x" * 50, "", "b\t" + "y" * 7, "\r", "c\tzz"]
    path.write_bytes("\n".join(lines).encode())
    index = line_index(path, block=16)
    data = path.read_bytes()
    assert [line for _, line in index] == [1, 3, 4, 5]
    assert [data[o:o + 1] for o, _ in index] == [b"a", b"b", b"\r", b"c"]
    # a "\r"-only line (a blank line of a CRLF file) is read back empty and skipped; every record is there
    write_butd(tmp_path / "b.tsv")
    text = (tmp_path / "b.tsv").read_text()
    (tmp_path / "gaps.tsv").write_bytes(("\n\n" + text.replace("\n", "\n\n")).replace("\n", "\r\n").encode())
    out = tmp_path / "gaps.h5"
    convert("--format", "butd", tmp_path / "gaps.tsv", "--out", out)
    assert len(FeatureStore(out)) == 3


@pytest.mark.parametrize("fmt", ["butd", "vinvl"])
def test_mixed_dimensions_are_one_line(tmp_path, fmt):
    tsv = tmp_path / "x.tsv"
    rng = np.random.default_rng(0)
    boxes = np.array([[1, 2, 30, 40], [5, 5, 20, 20]], np.float32)
    if fmt == "butd":
        lines = [butd_line(1, 50, 50, boxes, rng.normal(size=(2, 8))), butd_line(2, 50, 50, boxes, rng.normal(size=(2, 6)))]
    else:
        lines = [vinvl_line("1", boxes, ["a", "b"], [0.5, 0.6], rng.normal(size=(2, 8)), (50, 50)),
                 vinvl_line("2", boxes, ["a", "b"], [0.5, 0.6], rng.normal(size=(2, 6)), (50, 50))]
    tsv.write_text("\n".join(lines) + "\n")
    proc = convert("--format", fmt, tsv, "--out", tmp_path / "f.h5", check=False)
    assert proc.returncode == 1 and "line 2 (image 2): 6-d features, the records before 8-d" in proc.stderr
    assert not (tmp_path / "f.h5").exists()


def test_shard_parts_of_other_dimensions_do_not_merge(tmp_path):
    from clid.base.files import DataError
    from clid.data.store import Regions, write_features
    from clid.run.shard import join_files

    boxes = np.array([[0, 0, 4, 4]], np.float32)
    for n, dim in enumerate((8, 6)):
        write_features(tmp_path / f"p{n}.h5", [(str(n), Regions(np.zeros((1, dim), np.float32), boxes, 4, 4))], "butd")
    with pytest.raises(DataError, match="attribute 'feature_dim'"):
        join_files([tmp_path / "p0.h5", tmp_path / "p1.h5"], tmp_path / "out.h5")
    assert not (tmp_path / "out.h5").exists()


def test_butd_float64_values_convert_to_the_float32_ones(tmp_path):
    """A bottom-up TSV written with float64 boxes and features gives the file of its float32 twin."""
    import base64

    truth = write_butd(tmp_path / "f32.tsv", dim=64)
    lines = []
    for image_id, (width, height, boxes, features) in truth.items():
        wide = [base64.b64encode(a.astype(np.float64).tobytes()).decode() for a in (boxes, features)]
        lines.append("\t".join([image_id, str(width), str(height), str(len(boxes)), *wide]))
    (tmp_path / "f64.tsv").write_text("\n".join(lines) + "\n")
    convert("--format", "butd", tmp_path / "f32.tsv", "--out", tmp_path / "f32.h5")
    proc = convert("--format", "butd", tmp_path / "f64.tsv", "--out", tmp_path / "f64.h5")
    assert "3 records of float64 values, converted to float32" in proc.stdout and "'butd', 64-d" in proc.stdout
    assert_same(groups(tmp_path / "f32.h5"), groups(tmp_path / "f64.h5"))


def test_one_image_in_two_records_gives_one_outcome_whatever_the_chunks(tmp_path):
    """Keys 9 and 000000000009 in two files: refused before any work, or (skip) the later one left out, the
    same file from chunks of 1, of 1,000 and from two shards."""
    truth = write_butd(tmp_path / "a.tsv", dim=8)
    width, height, boxes, features = truth["9"]
    (tmp_path / "b.tsv").write_text(butd_line("000000000009", width, height, boxes, features + 1) + "\n")
    inputs = ("--format", "butd", tmp_path / "a.tsv", tmp_path / "b.tsv")
    for chunk in (1, 1000):
        proc = convert(*inputs, "--out", tmp_path / f"e{chunk}.h5", "--chunk-size", chunk, check=False)
        assert proc.returncode == 1 and proc.stderr == (
            f"error: {tmp_path / 'b.tsv'}: line 1 (image 000000000009): image id 9 again (also {tmp_path / 'a.tsv'}: "
            "line 2 (image 9)): an image is converted once; leave one record out, or give --bad-records skip")
        assert not list(tmp_path.glob(f"e{chunk}.h5*"))
    outs = []
    for name, commands in (("one", [["--chunk-size", 1]]), ("all", [[]]),
                           ("shards", [["--num-shards", 2, "--shard-id", k] for k in (0, 1)])):
        out = tmp_path / f"{name}.h5"
        for extra in commands:
            proc = convert(*inputs, "--out", out, "--bad-records", "skip", *extra)
        assert "skipped 1 malformed record(s)" in proc.stdout
        assert FeatureStore(out).get("9").features.tolist() == features.tolist()  # the first record's
        outs.append(out)
    for out in outs[1:]:
        assert_same(groups(outs[0]), groups(out))
        assert out.with_name(out.name + ".skipped.tsv").read_bytes() == outs[0].with_name(
            outs[0].name + ".skipped.tsv").read_bytes()
