"""Captions and region features as the models read them, shared by training (04, 06), scoring (05)
and evaluation (07).

- :func:`training_items`: the trusted captions of the train split and the self-generated ones;
- :func:`make_examples`: captions -> token ids and length levels (too-long captions counted, not hidden);
- :func:`training_examples` / :func:`report_skipped`: the examples of :func:`training_items`, every caption
  left out counted by reason, and the lines that report them;
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


# ---------------------------------------------------------------------------------------------
# The share of the data left out: more than --max-left-out stops the run with one line

MAX_LEFT_OUT = 0.05  # the default of --max-left-out


def add_left_out_arg(parser) -> None:
    from clid.cli import unit_interval

    parser.add_argument("--max-left-out", type=unit_interval, default=MAX_LEFT_OUT, metavar="SHARE",
                        help="stop when more than this share of the trusted, or of the self-generated, captions would "
                             "be left out (no region features, no word left, a length outside the levels; "
                             "self-generated captions longer than the last level, and of images outside the training "
                             "split, are left out by design and not counted); 1: never stop")


def counts_as_lost(reason: str) -> bool:
    """Whether a skip reason of :func:`make_examples` / :func:`training_items` is data lost (counted against
    --max-left-out), not a caption left out by design."""
    source, _, why = reason.partition(": ")
    return not (why == "image not in the training split" or (source == "selfgen" and why.endswith("outside the levels")))


def check_left_out(source: str, offered: int, skipped: Counter, max_share: float, path, items=None,
                   features: FeatureStore | None = None, levels=None) -> None:
    """Stop (one line: how many, why, and a likely cause) when more than ``max_share`` of the ``offered``
    captions of ``source`` were left out for reasons that count (:func:`counts_as_lost`).

    ``items`` (caption id, image id, text) and ``features`` show a few caption image ids beside a few
    feature ids when most are missing features (an id-scheme mismatch); ``levels`` names
    ``--levels paragraph`` when most are longer than the last level.
    """
    lost = {reason: n for reason, n in skipped.items() if reason.startswith(source + ": ") and counts_as_lost(reason)}
    total = sum(lost.values())
    if not offered or total <= max_share * offered:
        return
    outside = {int(r.split("length ")[1].split()[0]): n for r, n in lost.items() if r.endswith("outside the levels")}
    grouped = Counter()
    for reason, n in lost.items():
        why = reason.split(": ", 1)[1]
        grouped["length outside the levels" if why.endswith("outside the levels") else why] += n
    why = ", ".join(f"{n} {reason}" for reason, n in grouped.most_common())
    main = grouped.most_common(1)[0][0]
    hint = ""
    if main.startswith("no region features") and items is not None and features is not None:
        missing = []
        for _, image_id, _ in items:
            if not features.holds(image_id) and str(image_id) not in missing:
                missing.append(str(image_id))
                if len(missing) == 3:
                    break
        if missing:
            hint = (f". Its images are named {', '.join(missing)}, the feature file's {', '.join(features.ids()[:3])}: do "
                    "the captions and the features use one id scheme (COCO ids, VG ids, file names)?")
        elif bad := features.bad_images:
            first = next(iter(bad))
            hint = f". {len(bad)} image(s) have bad region features (--bad-features skip), e.g. image {first}: {bad[first]}"
    elif main == "length outside the levels" and levels is not None:
        last = get_levels(levels)[-1][1]
        longer = sum(n for length, n in outside.items() if length > last)
        if longer > total / 2:
            caption_levels = get_levels(levels) != get_levels("paragraph")
            hint = (f". {longer} are longer than the last level ({last} tokens)"
                    + (": paragraphs? Give --levels paragraph" if caption_levels else ""))
    elif main.startswith("no word left"):
        hint = ". The preprocessing keeps words of a-z and 0-9 (accents folded): is the text in another script?"
    raise SystemExit(f"error: {path}: {total} of {offered} {source} captions ({100 * total / offered:.0f}%) would be "
                     f"left out ({why}), more than --max-left-out {max_share:g} (a larger share goes on with the rest)"
                     f"{hint}")


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

    def offered(self, source: str) -> int:
        """The captions of ``source`` ("trusted", "selfgen") the files hold: those kept and those left out here."""
        return len(getattr(self, source)) + sum(n for r, n in self.skipped.items() if r.startswith(source + ": "))

    def check_left_out(self, skipped: Counter, max_share: float, captions_path, selfgen_path, features, levels) -> None:
        """:func:`check_left_out` for the trusted and the self-generated captions (``skipped``: every skip count)."""
        check_left_out("trusted", self.offered("trusted"), skipped, max_share, captions_path, self.trusted, features, levels)
        check_left_out("selfgen", self.offered("selfgen"), skipped, max_share, selfgen_path, self.selfgen, features, levels)


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
    if n := sum(r.wordless for r in train):  # (the loader warned, naming them)
        skipped["trusted: no word left after preprocessing"] = n
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


def training_examples(items: CaptionItems, tokenizer, levels,
                      features: FeatureStore) -> tuple[Examples, Examples, Counter]:
    """(trusted examples, self-generated examples, skip counts by reason) of ``items``; the counts include
    those of ``items`` itself."""
    trusted, skipped = make_examples(items.trusted, tokenizer, levels, "trusted", features)
    selfgen, selfgen_skipped = make_examples(items.selfgen, tokenizer, levels, "selfgen", features)
    skipped.update(items.skipped + selfgen_skipped)
    return trusted, selfgen, skipped


def report_skipped(skipped: Counter, features: FeatureStore, word: str = "skipped") -> None:
    """Print each skip count (``  skipped N: reason``, by reason), then the images of ``features`` with bad
    region features, if any."""
    for reason, count in sorted(skipped.items()):
        print(f"  {word} {count}: {reason}")
    if bad_line := features.skip_report():
        print(f"  {bad_line}")
