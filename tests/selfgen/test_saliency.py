"""Stage 01: spectral-residual and EML-Net saliency maps, image lists, failures, shards, resume."""
import json
import shutil

import h5py
import numpy as np
import pytest
import torch
from conftest import import_script, run_one_thread
from PIL import Image

from clid import emlnet as emlnet_command
from clid.base import files
from clid.data import images
from clid.run import shard
from clid.selfgen import emlnet
from clid.selfgen.saliency import map_shape, spectral_residual

stage01 = import_script("01_saliency.py", "stage01")

PHOTOS = ["astronaut", "chelsea", "coffee", "rocket", "camera"]


@pytest.fixture(scope="module")
def photo_folder(tmp_path_factory):
    """Real photographs (skimage.data) at reduced size, JPEG and PNG, plus a corrupt file."""
    import skimage.data

    folder = tmp_path_factory.mktemp("photos")
    for n, name in enumerate(PHOTOS):
        img = Image.fromarray(getattr(skimage.data, name)())
        img = img.resize((img.width // 2, img.height // 3))  # not square: the map keeps the aspect ratio
        img.save(folder / (f"{name}.png" if n % 2 else f"{name}.jpg"))
    (folder / "broken.jpg").write_bytes(b"\xff\xd8 this is not a JPEG")
    return folder


def maps_of(path):
    with h5py.File(path, "r") as f:
        return {k: (g["map"][()], dict(g.attrs)) for k, g in f.items()}


def test_spectral_residual_finds_the_odd_object():
    """On a textured background, a small blob is the most salient place, also near a border."""
    rng = np.random.default_rng(0)
    for cy, cx in [(20, 40), (50, 12), (6, 58)]:
        y, x = np.mgrid[0:64, 0:64]
        image = 0.5 + 0.15 * np.sin(x * 1.3) * np.sin(y * 1.1) + 0.03 * rng.standard_normal((64, 64))
        blob = (y - cy) ** 2 + (x - cx) ** 2 <= 9
        image[blob] = 1.0
        smap = spectral_residual(torch.tensor(image[None], dtype=torch.float32))[0].numpy()
        assert smap.min() == 0 and smap.max() == pytest.approx(1)
        near = (y - cy) ** 2 + (x - cx) ** 2 <= 36
        assert smap[near].mean() > 4 * smap[~near].mean()
        peak = np.unravel_index(np.argmax(smap), smap.shape)
        assert abs(peak[0] - cy) <= 4 and abs(peak[1] - cx) <= 4


@pytest.mark.slow
def test_folder_list_failures_and_rerun(tmp_path, photo_folder):
    out = tmp_path / "sal.h5"
    proc = run_one_thread("01_saliency.py", "--images", photo_folder, "--out", out, "--map-side", "48",
               "--batch-size", "2", "--preview", "2", check=False)
    assert proc.returncode == 1
    assert "broken.jpg" in proc.stderr and "1 image(s) failed" in proc.stderr
    maps = maps_of(out)
    assert sorted(maps) == sorted(PHOTOS)  # keyed by file-name stem
    for name, (smap, attrs) in maps.items():
        width, height = Image.open(next(photo_folder.glob(f"{name}.*"))).size
        assert (attrs["width"], attrs["height"]) == (width, height) and attrs["method"] == "spectral"
        assert smap.dtype == np.float16 and max(smap.shape) == 48
        assert smap.shape == map_shape(width, height, 48)
        assert smap.min() == 0 and smap.max() == 1
    previews = sorted((tmp_path / "sal_preview").glob("*.png"))
    assert len(previews) == 2 and Image.open(previews[0]).height == 256
    failed = (tmp_path / "sal.h5.failed.tsv").read_text()
    assert "broken" in failed and "unreadable" in failed
    # a re-run does not recompute, and still reports the failure
    before = out.stat().st_mtime_ns
    again = run_one_thread("01_saliency.py", "--images", photo_folder, "--out", out, "--map-side", "48", check=False)
    assert again.returncode == 1 and "already exists" in again.stdout and "broken.jpg" in again.stderr
    assert out.stat().st_mtime_ns == before
    # other flags than those of the output are refused, not taken for it
    other = run_one_thread("01_saliency.py", "--images", photo_folder, "--out", out, check=False)
    assert other.returncode == 1 and "--map-side 48 then, 64 now" in other.stderr and "Traceback" not in other.stderr
    assert out.stat().st_mtime_ns == before


@pytest.mark.slow
def test_lists_key_maps_by_dataset_id(tmp_path, photo_folder):
    karpathy = {"images": [{"cocoid": 100 + n, "filename": f"{name}.{'png' if n % 2 else 'jpg'}", "split": "train",
                            "sentences": [{"raw": "a photo"}]} for n, name in enumerate(PHOTOS[:3])]}
    karpathy["images"].append({"cocoid": 999, "filename": "gone.jpg", "split": "train", "sentences": [{"raw": "x"}]})
    (tmp_path / "captions.json").write_text(json.dumps(karpathy))
    image_data = [{"image_id": 5000 + n, "width": 10, "height": 10, "coco_id": 200 + n if n else None,
                   "url": f"https://example.org/VG_100K/{name}.{'png' if n % 2 else 'jpg'}"}
                  for n, name in enumerate(PHOTOS[:2])]
    (tmp_path / "image_data.json").write_text(json.dumps(image_data))
    (tmp_path / "list.txt").write_text("coffee.jpg\nrocket\n")

    proc = run_one_thread("01_saliency.py", "--images", photo_folder, "--list", tmp_path / "captions.json",
               "--out", tmp_path / "a.h5", check=False)
    assert proc.returncode == 1 and "gone.jpg" in proc.stderr and "missing" in proc.stderr
    assert sorted(maps_of(tmp_path / "a.h5")) == ["100", "101", "102"]
    run_one_thread("01_saliency.py", "--images", photo_folder, "--list", tmp_path / "image_data.json", "--out", tmp_path / "b.h5")
    vg = maps_of(tmp_path / "b.h5")
    assert sorted(vg) == ["5000", "5001"]
    assert vg["5001"][1]["vg_image_id"] == "5001" and vg["5001"][1]["coco_id"] == "201"
    assert "coco_id" not in vg["5000"][1]
    run_one_thread("01_saliency.py", "--images", photo_folder, "--list", tmp_path / "list.txt", "--out", tmp_path / "c.h5")
    c = maps_of(tmp_path / "c.h5")
    assert sorted(c) == ["coffee", "rocket"]
    # the same image gives the same map whatever the list
    np.testing.assert_array_equal(c["coffee"][0], maps_of(tmp_path / "a.h5")["102"][0])


@pytest.mark.slow
def test_shards_equal_one_run_and_resume_skips_done_chunks(tmp_path, photo_folder):
    common = ["--images", photo_folder, "--chunk-size", "2", "--batch-size", "3"]
    run_one_thread("01_saliency.py", *common, "--out", tmp_path / "one.h5", check=False)
    for shard_id in (0, 1):
        run_one_thread("01_saliency.py", *common, "--out", tmp_path / "two.h5", "--shard-id", shard_id,
            "--num-shards", "2", check=False)
    one, two = maps_of(tmp_path / "one.h5"), maps_of(tmp_path / "two.h5")
    assert sorted(one) == sorted(two) == sorted(PHOTOS)
    for key in one:
        np.testing.assert_array_equal(one[key][0], two[key][0])
        assert one[key][1] == two[key][1]
    assert not [p for p in tmp_path.glob("two.h5.part-*") if not p.name.endswith(".failed.tsv")]

    # a run killed after its first chunk: that chunk is on disk; the re-run keeps it, does the rest
    items = images.list_items(photo_folder, None)
    assert [i.image_id for i in items[:2]] == ["astronaut", "broken"]
    first = ["astronaut"]  # the broken file failed in the killed run
    files.write_h5_groups(tmp_path / "three.h5.chunk-000000",
                          [(i, {"map": np.full((4, 4), 0.25, np.float16)}, {"width": 4, "height": 4}) for i in first])
    shard.write_table(tmp_path / "three.h5.chunk-000000.failed.tsv", stage01.FAILED,
                      [("broken", items[1].path, "unreadable (killed run)")])
    shutil.copy(tmp_path / "one.h5.run.json", tmp_path / "three.h5.run.json")  # the killed run's flags: the same
    proc = run_one_thread("01_saliency.py", *common, "--out", tmp_path / "three.h5", check=False)
    assert "resuming: 1 of 3 chunks already done" in proc.stdout
    assert proc.returncode == 1 and "unreadable (killed run)" in proc.stderr  # its failure is still reported
    three = maps_of(tmp_path / "three.h5")
    assert sorted(three) == sorted(PHOTOS)
    for key in three:
        if key in first:
            assert three[key][0].shape == (4, 4)  # kept, not recomputed
        else:
            np.testing.assert_array_equal(three[key][0], one[key][0])


def official_layout(model):
    """A checkpoint as the official EML-Net training saves it: DataParallel names under "state_dict"."""
    return {"state_dict": {f"module.{k}": v for k, v in model.state_dict().items()}, "epoch": 9}


@pytest.mark.slow
def test_emlnet_names_match_the_official_checkpoints_and_load(one_thread, tmp_path, photo_folder):
    torch.manual_seed(0)
    encoder, decoder = emlnet.EMLEncoder(), emlnet.EMLDecoder()
    for module in list(encoder.modules()) + list(decoder.modules()):  # non-trivial BN statistics
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.uniform_(-0.1, 0.1)
            module.running_var.uniform_(0.5, 1.5)
    enc_keys, dec_keys = encoder.state_dict(), decoder.state_dict()
    # the official module names (ResNet-50 as torchvision names it, read-outs output0-4, combined)
    for key, shape in [("conv1.weight", (64, 3, 7, 7)), ("layer1.0.downsample.0.weight", (256, 64, 1, 1)),
                       ("layer3.5.bn3.running_var", (1024,)), ("layer4.2.conv2.weight", (512, 512, 3, 3)),
                       ("output0.0.weight", (1, 64, 3, 3)), ("output4.0.weight", (1, 2048, 3, 3)),
                       ("output4.1.running_mean", (1,)), ("combined.0.weight", (1, 5, 3, 3)), ("combined.0.bias", (1,))]:
        assert tuple(enc_keys[key].shape) == shape
    for key, shape in [("img_model.4.0.weight", (1, 1, 3, 3)), ("pla_model.0.1.running_mean", (1,)),
                       ("combined.0.weight", (1, 10, 3, 3))]:
        assert tuple(dec_keys[key].shape) == shape
    assert len(enc_keys) == 360 and not any(k.startswith("fc.") for k in enc_keys)
    torch.save(official_layout(encoder), tmp_path / "res_imagenet.pth")
    torch.save({"state_dict": decoder.state_dict()}, tmp_path / "res_decoder.pth")

    net = emlnet.EMLNet([tmp_path / "res_imagenet.pth"] * 2 + [tmp_path / "res_decoder.pth"], size=(64, 96))
    for loaded in net.encoders:
        for key, value in encoder.state_dict().items():
            assert torch.equal(loaded.state_dict()[key], value), key
    x = torch.rand(2, 3, 64, 96)
    with torch.no_grad():
        encoder.eval(), decoder.eval()
        reference = decoder(encoder.readouts(x), encoder.readouts(x), (64, 96))[:, 0]
    got = net(x)
    assert got.shape == (2, 64, 96)
    expected = emlnet.normalise01(emlnet.gaussian_blur(reference, 5.0 * 64 / 480))
    torch.testing.assert_close(got, expected)
    single = emlnet.EMLNet([tmp_path / "res_imagenet.pth"], size=(64, 96))  # one encoder, its own head
    torch.testing.assert_close(single(x), emlnet.normalise01(emlnet.gaussian_blur(encoder(x)[:, 0], 5.0 * 64 / 480)))

    out = tmp_path / "eml.h5"
    weights = [tmp_path / "res_imagenet.pth", tmp_path / "res_imagenet.pth", tmp_path / "res_decoder.pth"]
    proc = run_one_thread("01_saliency.py", "--images", photo_folder, "--out", out, "--method", "emlnet",
               "--weights", *weights, "--emlnet-size", "64", "96", check=False)
    assert proc.returncode == 1 and "broken.jpg" in proc.stderr  # the corrupt file, nothing else
    maps = maps_of(out)
    assert sorted(maps) == sorted(PHOTOS) and all(a["method"] == "emlnet" for _, a in maps.values())
    assert all(m.min() == 0 and m.max() == 1 for m, _ in maps.values())

    # no weights, and a decoder given where an encoder belongs: one clear line each
    proc = run_one_thread("01_saliency.py", "--images", photo_folder, "--out", tmp_path / "x.h5", "--method", "emlnet",
               check=False)
    assert proc.returncode == 2 and "--weights" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_one_thread("01_saliency.py", "--images", photo_folder, "--out", tmp_path / "x.h5", "--method", "emlnet",
               "--weights", tmp_path / "res_decoder.pth", check=False)
    assert proc.returncode == 1 and "not an EML-Net ResNet-50 encoder checkpoint" in proc.stderr
    assert "Traceback" not in proc.stderr


class RunsCode:
    """Unpickling this object calls Path.touch(marker): what a crafted checkpoint could do."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        from pathlib import Path

        return Path.touch, (Path(self.marker),)


def test_emlnet_weights_are_never_unpickled(one_thread, tmp_path, photo_folder, capsys):
    marker = tmp_path / "code-ran"
    crafted = tmp_path / "res_imagenet.pth"
    torch.save({"state_dict": {"conv1.weight": torch.zeros(1)}, "payload": RunsCode(marker)}, crafted)
    with pytest.raises(files.DataError) as refused:
        stage01.main(["--images", str(photo_folder), "--out", str(tmp_path / "x.h5"), "--method", "emlnet",
                      "--weights", str(crafted)])
    message = str(refused.value)
    assert message.startswith(f"{crafted}: holds more than tensors") and "\n" not in message
    assert "--trust-pickle" in message
    assert not marker.exists()  # the payload never ran
    # the conversion command refuses it too, unless told to trust the file
    with pytest.raises(files.DataError, match="Only for a file you trust: add --trust-pickle"):
        emlnet_command.main(["convert", str(crafted), "--out", str(tmp_path / "x.safetensors")])
    assert not marker.exists() and not (tmp_path / "x.safetensors").exists()

    # a whole pickled module (not a state dict): converted once with --trust-pickle, then loaded safely
    torch.manual_seed(0)
    decoder = emlnet.EMLDecoder()
    pickled = tmp_path / "res_decoder.pth"
    torch.save(decoder, pickled)
    with pytest.raises(files.DataError, match="holds more than tensors"):
        emlnet.read_state_dict(pickled)
    converted = tmp_path / "res_decoder.safetensors"
    emlnet_command.main(["convert", "--trust-pickle", str(pickled), "--out", str(converted)])
    assert "unpickling" in capsys.readouterr().out
    loaded = emlnet.load_weights(emlnet.EMLDecoder(), converted, "decoder")
    for key, value in decoder.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    # a plain state dict needs no trust at all
    plain = tmp_path / "plain.pth"
    torch.save({"state_dict": {f"module.{k}": v for k, v in decoder.state_dict().items()}}, plain)
    emlnet_command.main(["convert", str(plain), "--out", str(tmp_path / "plain.safetensors")])
    assert emlnet.read_state_dict(tmp_path / "plain.safetensors").keys() == decoder.state_dict().keys()


def test_a_killed_runs_hidden_temporary_files_are_removed(one_thread, tmp_path, photo_folder):
    out = tmp_path / "sal.h5"
    leftovers = [tmp_path / ".sal.h5.chunk-000000.tmp-4000001", tmp_path / ".sal.h5.tmp-4000002",
                 tmp_path / ".sal.h5.chunk-000001.failed.tsv.tmp-4000003"]  # what kill -9 leaves mid-write
    others = [tmp_path / ".features.h5.tmp-4000004", tmp_path / ".sal.h5.part-00001-of-00002.tmp-4000005"]
    for path in leftovers + others:
        path.write_bytes(b"half written")
    assert stage01.main(["--images", str(photo_folder), "--out", str(out), "--chunk-size", "2"]) == 1  # broken.jpg
    assert not any(p.exists() for p in leftovers)
    assert all(p.exists() for p in others)  # another output's, another shard's (it may be running)
    assert sorted(files.h5_group_ids(out)) == sorted(PHOTOS)
    failed = (tmp_path / "sal.h5.failed.tsv").read_text().splitlines()
    assert failed[0] == "image_id\tpath\treason" and len(failed) == 2 and failed[1].startswith("broken\t")


def test_saliency_source_reads_no_nested_group(tmp_path):
    """An id that HDF5 would read as a path ("a/b", "..") finds no map, not a nested group or the root."""
    from clid.selfgen.graphs import SaliencySource

    path = tmp_path / "s.h5"
    with h5py.File(path, "w") as f:
        for key in ("1", "a/b"):
            f.create_group(key).create_dataset("map", data=np.ones((2, 2), np.float16))
            f[key].attrs.update(width=2.0, height=2.0)
    source = SaliencySource(path)
    assert source.get("1", "1") is not None
    for image_id in ("a/b", ".", ".."):
        assert source.get(image_id, image_id) is None
