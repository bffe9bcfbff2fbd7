"""The region input as the authors' code builds it (their train_denoise.py, measure_noise.py and
inference.py compute it alike), the image-size input one flag away, and `--preset labert` on converted
VLP features: the authors' input, head and optimizer settings."""
import json

import numpy as np
import pytest
import torch
from feature_formats import VLP_KEYS, write_vlp

from clid.base.text import get_levels, load_tokenizer
from clid.data.region_inputs import region_inputs
from clid.data.store import FeatureStore, RegionCache, Regions, write_features
from clid.model.captioner import CaptionerConfig, build_model, load_region_init

# boxes (x1, y1, x2, y2 pixels) and detector confidences of one 200 x 200 image
BOXES = np.array([[10, 20, 50, 80], [20, 40, 100, 160], [0, 0, 200, 200], [150, 30, 190, 95]], np.float32)
CONF = np.array([0.9, 0.9, 1.0, 0.3], np.float32)


def layer_norm(values: np.ndarray) -> np.ndarray:
    """Layer norm over the last axis without scale or shift (eps 1e-5), in float64."""
    mean = values.mean(-1, keepdims=True)
    return (values - mean) / np.sqrt(((values - mean) ** 2).mean(-1, keepdims=True) + 1e-5)


def authors_box_input(boxes, conf) -> np.ndarray:
    """The six numbers, written out: x1/x2, y1/y2, x2/x2, y2/y2 (each side over the box's own x2 or y2
    plus 1e-5), the area of that normalised box, the confidence; then layer-normed."""
    x1, y1, x2, y2 = (boxes[:, k].astype(np.float64) for k in range(4))
    nx1, nx2 = x1 / (x2 + 1e-5), x2 / (x2 + 1e-5)
    ny1, ny2 = y1 / (y2 + 1e-5), y2 / (y2 + 1e-5)
    six = np.stack([nx1, ny1, nx2, ny2, np.maximum((ny2 - ny1) * (nx2 - nx1), 0), conf], axis=1)
    assert np.allclose(six[:, 2:4], 1.0, atol=1e-6)  # two of the six are always (almost) 1
    return layer_norm(six)


def test_the_authors_box_input_on_known_boxes():
    got = region_inputs(BOXES, 200, 200, confidence=CONF).numpy()
    np.testing.assert_allclose(got, authors_box_input(BOXES, CONF), atol=1e-5)
    # the first box by hand: 10/50, 20/80, 1, 1, (1 - 0.25) * (1 - 0.2) = 0.6, 0.9
    np.testing.assert_allclose(got[0], layer_norm(np.array([0.2, 0.25, 1.0, 1.0, 0.6, 0.9])), atol=1e-5)
    # boxes are divided by their own corner, not the image: box 2 is box 1 twice as large and
    # elsewhere, and reads the same; the image-size input tells them apart
    np.testing.assert_allclose(got[1], got[0], atol=1e-5)
    image = region_inputs(BOXES, 200, 200, confidence=CONF, box_input="image").numpy()
    assert not np.allclose(image[1], image[0])
    # without a confidence (our encoder's boxes) the sixth number is 1
    np.testing.assert_allclose(region_inputs(BOXES, 200, 200).numpy(), authors_box_input(BOXES, np.ones(4)), atol=1e-5)


def test_the_image_size_box_input_on_known_boxes():
    got = region_inputs(BOXES, 200, 200, confidence=CONF, box_input="image").numpy()
    want = np.array([[10, 20, 50, 80, 40, 60], [20, 40, 100, 160, 80, 120], [0, 0, 200, 200, 200, 200],
                     [150, 30, 190, 95, 40, 65]]) / 200
    np.testing.assert_allclose(got, want, atol=1e-6)


def test_class_probabilities_are_layer_normed_by_the_authors_input_and_raw_by_the_image_input():
    cls = np.random.default_rng(0).dirichlet(np.ones(1601), size=4).astype(np.float32)
    authors = region_inputs(BOXES, 200, 200, cls, CONF).numpy()
    image = region_inputs(BOXES, 200, 200, cls, CONF, box_input="image").numpy()
    assert authors.shape == image.shape == (4, 6 + 1601)
    np.testing.assert_allclose(authors[:, 6:], layer_norm(cls.astype(np.float64)), atol=1e-4)
    np.testing.assert_array_equal(image[:, 6:], cls)


def test_both_inputs_from_a_features_file(tmp_path):
    """The file's boxes and confidences reach the model's batch, built as the model's config says."""
    path = tmp_path / "f.h5"
    features = np.random.default_rng(1).normal(size=(4, 8)).astype(np.float32)
    write_features(path, [("7", Regions(features, BOXES, 200, 200, confidence=CONF))], "test")
    store = FeatureStore(path)
    for box_input, want in (("authors", authors_box_input(BOXES, CONF)),
                            ("image", region_inputs(BOXES, 200, 200, box_input="image").numpy())):
        config = CaptionerConfig(region_dim=8, box_input=box_input)
        f, pos, mask = RegionCache.for_model(store, config).batch(["7"])
        np.testing.assert_allclose(pos[0].numpy(), want, atol=1e-5)
        assert torch.equal(f[0], torch.from_numpy(features)) and mask.all()


def tiny_bert(folder):
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    BertModel(BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)) \
        .save_pretrained(folder)
    load_tokenizer().save_pretrained(str(folder))


def test_preset_labert_on_converted_vlp_features_is_the_authors_model(tmp_path, one_thread):
    """04 --preset labert on the converted VLP release: 2048-d fc6 features and 1,601 class
    probabilities; the authors' box input, dropout in both region MLPs, an untied LM head, AdamW eps
    1e-6, and the first region layer from a detector file; the checkpoint records the features' kind."""
    from conftest import import_script
    from safetensors.torch import save_file

    from clid.features.convert import main as convert

    truth = write_vlp(tmp_path, regions=6)
    convert(["--format", "vlp", str(tmp_path / "region_feat_gvd_wo_bgd"), "--out", str(tmp_path / "f.h5"), "--dtype", "float32"])
    ids = [str(int(key[-12:])) for key in VLP_KEYS]
    captions = tmp_path / "captions.json"
    captions.write_text(json.dumps({"images": [
        {"cocoid": int(i), "filename": f"{key}.jpg", "split": split,
         "sentences": [{"raw": "a man riding a horse on a beach."}, {"raw": "a dog in the park."}]}
        for i, key, split in zip(ids, VLP_KEYS, ["test", "train", "train"])]}))
    tiny_bert(tmp_path / "bert")
    fc = torch.randn(2048, 2048) * 0.01, torch.randn(2048) * 0.01
    save_file({"weight": fc[0], "bias": fc[1]}, str(tmp_path / "fc7.safetensors"))

    train = import_script("04_train_base.py", "train_base_labert")
    train.main(["--captions", str(captions), "--features", str(tmp_path / "f.h5"), "--out", str(tmp_path / "ck"),
                "--preset", "labert", "--bert", str(tmp_path / "bert"), "--max-steps", "1", "--warmup", "1",
                "--batch-size", "2", "--eval-every", "0", "--region-init", str(tmp_path / "fc7.safetensors"),
                "--no-split-check"])  # (the fixture's COCO ids are real ones, some of them Karpathy test images)
    from clid.model.checkpoints import load_checkpoint, read_config

    saved = read_config(tmp_path / "ck")
    assert (saved["feature_kind"], saved["feature_dim"]) == ("vlp-fc6", 2048)
    model = load_checkpoint(tmp_path / "ck")
    c = model.config
    assert (c.preset, c.box_input, c.tie_head, c.region_dropout) == ("labert", "authors", False, True)
    assert (c.region_dim, c.region_hidden, c.num_classes, c.region_norm) == (2048, 2048, 1601, "none")
    assert [d.p for d in model.embeddings.region_end_dropouts] == [0.1, 0.1]  # both region MLPs end in dropout
    assert model.head.decoder is not None and model.output_weight.data_ptr() != model.embeddings.word_embeddings.weight.data_ptr()
    optimizer = torch.load(tmp_path / "ck" / "optimizer.pt", weights_only=True)
    assert optimizer["param_groups"][0]["eps"] == 1e-6
    # the first region layer started as the file's (one step at lr 5e-5 moves it by at most ~lr)
    assert (model.embeddings.region_embed[0].weight - fc[0]).abs().max() < 1e-3
    # the model reads the authors' six numbers and layer-normed class probabilities of each region
    features, cls, rows = truth[VLP_KEYS[0]]
    _, pos, _ = RegionCache.for_model(FeatureStore(tmp_path / "f.h5"), c).batch([ids[0]])
    np.testing.assert_allclose(pos[0, :, :6].numpy(), authors_box_input(rows[:, :4], rows[:, 5]), atol=1e-5)
    np.testing.assert_allclose(pos[0, :, 6:].numpy(), layer_norm(cls.astype(np.float64)), atol=1e-4)


def test_region_init_file_forms_and_errors(tmp_path):
    from clid.base.files import DataError

    model = build_model(CaptionerConfig(region_dim=8, region_hidden=4, hidden_size=16, num_layers=1, num_heads=2,
                                        intermediate_size=16, levels=get_levels("caption")))
    weight, bias = torch.randn(4, 8), torch.randn(4)
    # the authors' bert.pth: a plain state dict, the layer under their module names, read with weights_only
    torch.save({"model": {"embedding_layer.region_embed.0.weight": weight, "embedding_layer.region_embed.0.bias": bias,
                          "encoder.layer.0.attention.self.query.weight": torch.zeros(2)}}, tmp_path / "bert.pth")
    assert load_region_init(model, tmp_path / "bert.pth") == ("embedding_layer.region_embed.0.weight, "
                                                              "embedding_layer.region_embed.0.bias")
    assert torch.equal(model.embeddings.region_embed[0].weight, weight)
    assert torch.equal(model.embeddings.region_embed[0].bias, bias)
    torch.save({"fc7_w": weight.T, "fc7_b": bias}, tmp_path / "wrong.pt")
    with pytest.raises(DataError, match=r"shapes \[8, 4\] and \[4\], but the model's first region layer is \[4, 8\]"):
        load_region_init(model, tmp_path / "wrong.pt")
    torch.save({"other": weight}, tmp_path / "none.pt")
    with pytest.raises(DataError, match="no weight and bias pair of the first region layer"):
        load_region_init(model, tmp_path / "none.pt")

    class Payload:
        def __reduce__(self):
            return (print, ("never",))

    torch.save({"weight": Payload()}, tmp_path / "pickle.pt")
    with pytest.raises(DataError, match="not a safetensors file or a plain state dict"):
        load_region_init(model, tmp_path / "pickle.pt")


def test_check_features_match_names_both_kinds_and_dimensions(tmp_path):
    from clid.base.files import DataError
    from clid.data.store import check_features_match

    path = tmp_path / "f.h5"
    write_features(path, [("7", Regions(np.zeros((4, 8), np.float32), BOXES, 200, 200))], "butd")
    store = FeatureStore(path)
    check_features_match({"model": {"region_dim": 8}, "feature_kind": "butd", "feature_dim": 8}, store, "ck")
    check_features_match({"model": {"region_dim": 8}}, store, "old")  # a checkpoint without a kind: dimension only
    with pytest.raises(DataError) as err:
        check_features_match({"model": {"region_dim": 2048}, "feature_kind": "vlp-fc6", "feature_dim": 2048}, store, "ck")
    assert str(err.value) == (f"{path}: holds 'butd' features of 8 dimensions, but the checkpoint ck was trained on "
                              "'vlp-fc6' features of 2048 dimensions; give the features it was trained on (or a "
                              "checkpoint trained on these)")
    with pytest.raises(DataError, match="was trained on 'clid-encoder' features of 8 dimensions"):
        check_features_match({"model": {"region_dim": 8}, "feature_kind": "clid-encoder", "feature_dim": 8}, store, "ck")
    # a features file without a kind (written before it was recorded): the dimension decides
    old = tmp_path / "old.h5"
    from clid.base.files import write_h5_groups

    write_h5_groups(old, [("7", {"features": np.zeros((4, 6), np.float32), "boxes": BOXES}, {"width": 200, "height": 200})])
    old_store = FeatureStore(old)
    assert old_store.kind is None
    check_features_match({"model": {"region_dim": 6}, "feature_kind": "butd", "feature_dim": 6}, old_store, "ck")
    with pytest.raises(DataError, match="holds features of unrecorded kind of 6 dimensions, but the checkpoint ck was "
                                        "trained on 'butd' features of 8 dimensions"):
        check_features_match({"model": {"region_dim": 8}, "feature_kind": "butd", "feature_dim": 8}, old_store, "ck")


def test_a_checkpoint_from_before_these_settings_loads_as_the_model_it_was(tmp_path):
    """config.json without box_input, region_dropout and tie_head: the image-size input, no region
    dropout, a tied head (the model those checkpoints hold), with the same weights and outputs."""
    from clid.model.checkpoints import load_checkpoint, save_model

    torch.manual_seed(0)
    old = build_model(CaptionerConfig(region_dim=8, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=16,
                                      region_hidden=8, levels=get_levels("caption"), box_input="image",
                                      region_dropout=False, tie_head=True)).eval()
    save_model(old, tmp_path / "ck")
    config = json.loads((tmp_path / "ck" / "config.json").read_text())
    for key in ("box_input", "region_dropout", "tie_head"):
        del config["model"][key]
    (tmp_path / "ck" / "config.json").write_text(json.dumps(config))
    loaded = load_checkpoint(tmp_path / "ck")
    assert loaded.config == old.config and loaded.head.decoder is None
    assert len(loaded.embeddings.region_end_dropouts) == 0  # no dropout after the region MLPs


def test_region_cache_keeps_the_latest_images_within_its_bytes(tmp_path, monkeypatch):
    """The cache gives each image's inputs as a fresh read does, holds no more than max_bytes (the least
    recently used image given up first), and reads an image again only when it was given up."""
    import clid.data.store as store_module

    rng = np.random.default_rng(0)
    path = tmp_path / "features.h5"
    write_features(path, ((str(i), Regions(rng.normal(size=(10, 8)), rng.uniform(0, 50, (10, 4)) + [0, 0, 50, 50],
                                           100.0, 100.0)) for i in range(6)), "test")
    store = FeatureStore(path)
    fresh = {str(i): store_module.load_regions(store, str(i)) for i in range(6)}
    one_image = sum(t.element_size() * t.nelement() for t in fresh["0"])
    reads = []
    monkeypatch.setattr(store_module, "load_regions", lambda features, i, *a: reads.append(i) or fresh[i])
    cache = RegionCache(store, max_bytes=3 * one_image)
    for image_id in ["0", "1", "2", "0", "3", "0", "1"]:
        assert cache.get(image_id) is fresh[image_id]
    # "0" was used again before "3" came, so "1", the least recently used, was given up: read again
    assert reads == ["0", "1", "2", "3", "1"]
    assert list(cache._cache) == ["3", "0", "1"] and cache._bytes == 3 * one_image
