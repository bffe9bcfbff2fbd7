"""A toy captioning world for the model tests: region features that encode what the captions say.

Each image holds 1-3 objects (category + colour). A region's feature is a fixed random code of its
category plus one of its colour, plus noise, so a captioner can learn to name what it sees. Written in
the real formats (Karpathy JSON + features HDF5), like the demo world, but tiny and instant.
"""
import json

import numpy as np

from clid.base.files import write_h5_groups

CATEGORIES = ["dog", "cat", "ball", "car", "tree", "boat"]
COLOURS = ["red", "blue", "green", "yellow"]


def make_toy_world(folder, n_train=40, n_val=6, n_test=6, dim=32, seed=0, long_every=0, cls_prob=False):
    """Write captions.json and features.h5 into ``folder``; return their paths.

    ``long_every`` > 0 also makes every n-th caption a long one (for tests that need several levels).
    ``cls_prob`` adds each region's category as class probabilities (one-hot; all 0 for the whole image).
    """
    rng = np.random.default_rng(seed)
    cat_code = rng.normal(size=(len(CATEGORIES), dim))
    col_code = rng.normal(size=(len(COLOURS), dim))
    images, groups, sentence = [], [], 0
    for image_id in range(1, n_train + n_val + n_test + 1):
        split = "train" if image_id <= n_train else "val" if image_id <= n_train + n_val else "test"
        objs = [(int(rng.integers(len(CATEGORIES))), int(rng.integers(len(COLOURS))))
                for _ in range(int(rng.integers(1, 4)))]
        feats, boxes = [], []
        for c, k in objs:
            feats.append(cat_code[c] + col_code[k] + 0.1 * rng.normal(size=dim))
            x, y = rng.uniform(0, 100, size=2)
            boxes.append([x, y, x + rng.uniform(10, 60), y + rng.uniform(10, 60)])
        feats.append(np.mean(feats, axis=0))  # whole image
        boxes.append([0, 0, 160, 160])
        datasets = {"features": np.asarray(feats, np.float32), "boxes": np.asarray(boxes, np.float32)}
        if cls_prob:
            datasets["cls_prob"] = np.eye(len(CATEGORIES) + 1, len(CATEGORIES), dtype=np.float32)[[c for c, _ in objs] + [-1]]
        groups.append((str(image_id), datasets, {"width": 160, "height": 160}))
        phrases = [f"a {COLOURS[k]} {CATEGORIES[c]}" for c, k in objs]
        sentences = []
        for n in range(3):
            text = phrases[0] + " sitting on the grass next to a small tree in the park"
            if len(phrases) > 1:
                text = " and ".join(phrases) + " in the park"
            if long_every and (sentence % long_every == 0):
                text = " and ".join(phrases * 4) + " with many more things around them on a sunny day in the big green park"
            sentences.append({"raw": text.capitalize() + ".", "tokens": text.split()})
            sentence += 1
        images.append({"cocoid": image_id, "filename": f"{image_id:06d}.jpg", "split": split, "sentences": sentences})
    captions = folder / "captions.json"
    captions.write_text(json.dumps({"images": images}))
    features = folder / "features.h5"
    write_h5_groups(features, groups, root_attrs={"feature_kind": "toy", "feature_dim": dim})
    return captions, features
