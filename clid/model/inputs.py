"""Captions and region features as the models read them, shared by training (04, 06), scoring (05)
and evaluation (07).

- :func:`training_items`: the trusted captions of the train split and the self-generated ones;
- :func:`make_examples`: captions -> token ids and length levels (too-long captions counted, not hidden);
- :func:`load_regions` / :func:`pad_regions`: one image's region inputs, a padded batch of them;
- :class:`RegionCache`: region features of the images, loaded once.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from clid.features.store import FeatureStore
from clid.text import encode, get_levels, length_to_level


@dataclass
class Examples:
    """Tokenised training captions. ``tokens[i]`` ends with "."; ``levels[i]`` is 1-based."""

    image_ids: list[str] = field(default_factory=list)
    tokens: list[list[int]] = field(default_factory=list)
    levels: list[int] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)  # "trusted" / "selfgen"
    caption_ids: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, other: "Examples") -> "Examples":
        for name in ("image_ids", "tokens", "levels", "sources", "caption_ids"):
            getattr(self, name).extend(getattr(other, name))
        return self

    def subset(self, indices) -> "Examples":
        out = Examples()
        for name in ("image_ids", "tokens", "levels", "sources", "caption_ids"):
            values = getattr(self, name)
            setattr(out, name, [values[i] for i in indices])
        return out


def make_examples(items: list[tuple[str, str, str]], tokenizer, levels, source: str,
                  features: FeatureStore | None = None) -> tuple[Examples, Counter]:
    """Tokenise ``(caption id, image id, text)`` triples. Returns the examples and skip counts by reason.

    With the paragraph levels, sentence breaks stay in the text as "." tokens (they count).
    """
    skipped = Counter()
    keep_sentences = get_levels(levels) == get_levels("paragraph")
    ids = encode([text for _, _, text in items], tokenizer, keep_sentences)
    out = Examples()
    for (caption_id, image_id, _), row in zip(items, ids):
        if len(row) == 1:  # only the final ".": no word was left after preprocessing
            skipped[f"{source}: no word left after preprocessing"] += 1
            continue
        level = length_to_level(len(row), levels)
        if level is None:
            skipped[f"{source}: length {len(row)} outside the levels"] += 1
            continue
        if features is not None and str(image_id) not in features:
            skipped[f"{source}: no region features for the image"] += 1
            continue
        out.image_ids.append(str(image_id))
        out.tokens.append(row)
        out.levels.append(level)
        out.sources.append(source)
        out.caption_ids.append(str(caption_id))
    return out, skipped


@dataclass
class CaptionItems:
    """Training captions as ``(caption id, image id, text)``: trusted (train split) and self-generated."""

    trusted: list[tuple[str, str, str]]
    selfgen: list[tuple[str, str, str]]
    val_ids: list[str]  # validation images (for the quick control-precision check)
    skipped: Counter
    notes: list[str] = field(default_factory=list)  # what the split guard held out
    val: list[tuple[str, str, str]] = field(default_factory=list)  # the validation images' trusted captions
    filenames: dict[str, str] = field(default_factory=dict)  # image id -> image file name (train and val images)


def training_items(captions_path, selfgen_path=None, test_ids=None, split_check: bool = True) -> CaptionItems:
    """Trusted captions of the train split (Karpathy "restval" included) and the self-generated
    captions of train-split images; self-generated captions of other images are counted, not used.
    The split guard (:func:`clid.data.splits.training_records`) refuses files that would train on test images."""
    from clid.data.records import report_wordless
    from clid.data.splits import training_records
    from clid.files import read_jsonl
    from clid.text import preprocess

    train, val, notes = training_records(captions_path, test_ids, split_check)
    trusted = [(f"{r.image_id}#{j}", r.image_id, text) for r in train for j, text in enumerate(r.captions)]
    skipped, selfgen, wordless = Counter(), [], []
    if selfgen_path:
        train_ids = {r.image_id for r in train}
        for rec in read_jsonl(selfgen_path, required=("id", "image_id", "caption")):
            if not preprocess(rec["caption"]):
                skipped["selfgen: no word left after preprocessing"] += 1
                wordless.append(f"caption {rec['id']}")
            elif str(rec["image_id"]) in train_ids:
                selfgen.append((str(rec["id"]), str(rec["image_id"]), rec["caption"]))
            else:
                skipped["selfgen: image not in the training split"] += 1
        report_wordless(selfgen_path, wordless)
    val_items = [(f"{r.image_id}#{j}", r.image_id, text) for r in val for j, text in enumerate(r.captions)]
    filenames = {r.image_id: r.filename for r in (*train, *val)}
    return CaptionItems(trusted, selfgen, [r.image_id for r in val], skipped, notes, val_items, filenames)
