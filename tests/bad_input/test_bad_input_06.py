"""Bad input of 06_train_selection.py: one row per malformed input (tests/badinput.py runs and checks them)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from badinput import (
    CAPTION_CASES,
    FEATURE_CASES,
    MOSTLY_MISSING,
    OTHER_SCHEME,
    SELFGEN_CASES,
    Row,
    Table,
    World,
    _must,
    check_row,
    checkpoint_copy,
    edit_config,
    features_of,
    first_rows,
    h5_changed,
    held,
    jsonl_lines,
    link_to,
    paragraphs,
    run_stage,
    truncated,
    unfinished,
    user_folder,
    write,
)

table = Table()
row = table.row

for name in ("missing", "binary", "split-null", "tokens-string", "raw-int", "duplicate-cocoid", "emoji-caption"):
    make, fragment, kind = next((m, f, k) for n, m, f, k in CAPTION_CASES if n == name)
    row("06", f"captions-{name}", lambda w, d, make=make: w.selection_args(d / "out", "--captions", make(w, d)),
        fragment, kind)

for name, make, fragment, kind, needs in FEATURE_CASES[:4]:
    row("06", f"features-{name}", lambda w, d, make=make: w.selection_args(d / "out", "--features", make(w, d)), fragment, kind, needs)

for name, make, fragment, kind in SELFGEN_CASES[:1] + SELFGEN_CASES[4:6]:
    row("06", f"selfgen-{name}", lambda w, d, make=make: w.selection_args(d / "out", "--selfgen", make(w, d)), fragment, kind)

RESUME_CHANGES_06 = [
    ("c", lambda w, d: ["--c", "5"], "--c"),
    ("eta", lambda w, d: ["--eta", "2"], "--eta"),
    ("schedule", lambda w, d: ["--schedule", "constant"], "--schedule"),
    ("quality-file", lambda w, d: ["--quality", h5_changed(w.quality, d, lambda f: f["u"].__setitem__(0, 9.0))], "--quality"),
]

for name, extra, fragment in RESUME_CHANGES_06:
    row("06", f"resume-changed-{name}", lambda w, d, extra=extra: w.selection_args(checkpoint_copy(w.selection, d), *extra(w, d)), fragment)

QUALITY_CASES = [
    ("missing", lambda w, d: d / "nope.h5", "no such file|not found", None),
    ("not-hdf5", lambda w, d: write(d, "q.h5", "nope"), "not an hdf5 file", None),
    ("empty", lambda w, d: write(d, "q.h5", b""), "not an hdf5 file", None),
    ("truncated", lambda w, d: truncated(w.quality, d), "not an hdf5 file", None),
    ("no-u", lambda w, d: h5_changed(w.quality, d, lambda f: f.__delitem__("u")), "missing dataset 'u'", None),
    ("u-nan", lambda w, d: h5_changed(w.quality, d, lambda f: f["u"].__setitem__(0, np.nan)), "u is nan", None),
    ("u-inf", lambda w, d: h5_changed(w.quality, d, lambda f: f["u"].__setitem__(0, np.inf)), "u is inf", None),
    ("missing-scores", lambda w, d: h5_changed(w.quality, d, first_rows(3)), "have no quality score", None),
    ("ragged", lambda w, d: h5_changed(w.quality, d, lambda f: f.__delitem__("u") or f.create_dataset("u", data=np.zeros(3, np.float32))), "lengths", None),
]

for name, make, fragment, needs in QUALITY_CASES:
    row("06", f"quality-{name}", lambda w, d, make=make: w.selection_args(d / "out", "--quality", make(w, d)), fragment, "error", needs)

row("06", "init-other-levels", lambda w, d: w.selection_args(d / "out", "--init", w.trusted, "--levels", "paragraph"),
    "trained with levels caption, not this run's --levels paragraph")

row("06", "init-not-a-folder", lambda w, d: w.selection_args(d / "out", "--init", d / "nope"), "--init must be")

# -- 06 selection strategies (clid/selection/schedule.py) ---------------------------------------------------------
STRATEGY_FLAG_CASES = [
    ("curriculum-no-difficulty", ["--strategy", "curriculum"], "needs --difficulty"),
    ("difficulty-unknown", ["--strategy", "curriculum", "--difficulty", "loss"], "--difficulty must be"),
    ("difficulty-bootstrap-missing", ["--strategy", "curriculum", "--difficulty", "bootstrap:/no/such/ckpt"], "is not a folder"),
    ("difficulty-clip-no-images", ["--strategy", "curriculum", "--difficulty", "clip:."], "needs --images"),
    ("curate-ratio-zero", ["--strategy", "loss-remove", "--curate-ratio", "0"], "argument --curate-ratio: must be"),
    ("curate-ratio-one", ["--strategy", "loss-remove", "--curate-ratio", "1"], "argument --curate-ratio: must be"),
    ("curate-std-negative", ["--strategy", "loss-remove", "--curate-std", "-2"], "argument --curate-std: must be a positive"),
    ("curate-std-inf", ["--strategy", "loss-remove", "--curate-std", "inf"], "argument --curate-std: must be a positive"),
    ("curate-every-zero", ["--strategy", "loss-remove", "--curate-every", "0"], "argument --curate-every: must be a positive integer"),
    ("buckets-zero", ["--strategy", "curriculum", "--difficulty", "u", "--buckets", "0"], "argument --buckets: must be a positive integer"),
    ("patience-zero", ["--strategy", "curriculum", "--difficulty", "u", "--patience", "0"], "argument --patience: must be a positive integer"),
    ("min-improvement-nan", ["--strategy", "curriculum", "--difficulty", "u", "--min-improvement", "nan"],
     "argument --min-improvement: must be"),
]

def without(args: list, flag: str) -> list:
    """An argument list of flag-value pairs without ``flag``."""
    return [x for pair in zip(args[::2], args[1::2]) if pair[0] != flag for x in pair]

for name, extra, fragment in STRATEGY_FLAG_CASES:
    row("06", name, lambda w, d, extra=extra: w.selection_args(d / "out", *extra), fragment)

row("06", "strategy-clid-no-quality", lambda w, d: without(w.selection_args(d / "out"), "--quality"), "needs --quality")

row("06", "difficulty-u-no-trusted-scores", lambda w, d: w.selection_args(d / "out", "--strategy", "curriculum",
                                                                           "--difficulty", "u"),
    "trusted captions have no quality score")

row("06", "difficulty-bootstrap-other-levels",
    lambda w, d: w.selection_args(d / "out", "--strategy", "curriculum", "--difficulty", f"bootstrap:{w.trusted}",
                                  "--levels", "paragraph"), "trained with levels caption")

row("06", "difficulty-bootstrap-not-a-checkpoint",
    lambda w, d: w.selection_args(d / "out", "--strategy", "curriculum", "--difficulty", f"bootstrap:{w.images}"),
    "is not a checkpoint")

row("06", "difficulty-clip-not-a-model",
    lambda w, d: w.selection_args(d / "out", "--strategy", "curriculum", "--difficulty", f"clip:{w.images}",
                                  "--images", w.images), "not a transformers clip model folder")

row("06", "out-data-folder", lambda w, d: w.selection_args(user_folder(d, w)), "did not write")

row("06", "out-parent-of-runs", lambda w, d: w.selection_args(checkpoint_copy(w.selection, d, name="runs/clid").parent), "did not write")

row("06", "out-is-init", lambda w, d: w.selection_args((ck := checkpoint_copy(w.trusted, d)), "--init", ck), "is also the input --init")

row("06", "lr-horizon-below-max-steps", lambda w, d: w.selection_args(d / "out", "--lr-horizon", "1"), "--lr-horizon 1 is below --max-steps 2")

row("06", "c-0-eta-0", lambda w, d: w.selection_args(d / "out", "--c", "0", "--eta", "0"), "argument --c")

def repeated_quality_ids(f):
    ids = f["id"].asstr()[()].tolist()
    ids[1] = ids[0]
    del f["id"]
    f.create_dataset("id", data=ids)

row("06", "quality-repeated-ids", lambda w, d: w.selection_args(d / "out", "--quality", h5_changed(w.quality, d, repeated_quality_ids)),
    "have more than one score")

row("06", "quality-u-strings", lambda w, d: w.selection_args(d / "out", "--quality", h5_changed(
    w.quality, d, lambda f: f.__delitem__("u") or f.create_dataset("u", data=np.array([b"x"] * len(f["id"]))))), "not numbers")

row("06", "quality-u-2d", lambda w, d: w.selection_args(d / "out", "--quality", h5_changed(
    w.quality, d, lambda f: f.__delitem__("u") or f.create_dataset("u", data=np.zeros((len(f["id"]), 2), np.float32)))),
    "not one value per row")

row("06", "features-quality-file", lambda w, d: w.selection_args(d / "out", "--features", w.quality), "flat arrays")

row("06", "quality-is-a-feature-file", lambda w, d: w.selection_args(d / "out", "--quality", w.features), "holds groups")

row("06", "quality-is-a-saliency-file", lambda w, d: w.selection_args(d / "out", "--quality", w.saliency), "holds groups")

row("06", "resume-config-edited", lambda w, d: w.selection_args(checkpoint_copy(w.selection, d, unfinished(edit_config(num_heads=2)))),
    "does not describe the weights")

row("06", "paragraphs-without-levels-paragraph", lambda w, d: w.selection_args(d / "out", "--captions", paragraphs(w, d)),
    "give --levels paragraph")

row("06", "features-of-most-images-missing", lambda w, d: w.selection_args(d / "out", "--features", features_of(w, d, MOSTLY_MISSING)),
    "would be left out (21 no region features")

row("06", "features-another-id-scheme", lambda w, d: w.selection_args(d / "out", "--features", features_of(
    w, d, {str(i) for i in range(1, 14)}, OTHER_SCHEME)), "one id scheme")

row("06", "number--max-left-out=nan", lambda w, d: w.selection_args(d / "out", "--max-left-out=nan"), "argument --max-left-out")

row("06", "recipe-unknown", lambda w, d: w.selection_args(d / "out", "--recipe", "paperish"), "invalid choice: 'paperish'")

row("06", "recipe-sets-no-flag", lambda w, d: w.selection_args(d / "out", "--recipe", write(d, "mine.toml", "[train]\nrate = 1")),
    "[train] rate is not a flag of this stage")

row("06", "recipe-selection-eta-text", lambda w, d: w.selection_args(d / "out", "--recipe", write(
    d, "mine.toml", '[selection]\neta = "many"')), "[selection] eta = \"many\": must be a number")

row("06", "recipe-selection-sets-a-flag-of-04", lambda w, d: w.selection_args(d / "out", "--recipe", write(
    d, "mine.toml", "[selection]\ncontinue_from = \"x\"")), "[selection] continue_from is not a flag of this stage")


def scored_quality(w: World, d: Path, trusted: bool = False) -> Path:
    """A quality file as 05 writes it now: u and the digest of each scored caption's text (with ``trusted``,
    the trusted captions' too, as ``trusted:ID``)."""
    from clid.base.files import read_jsonl, write_quality
    from clid.data.captions import load_karpathy
    from clid.data.examples import text_digest
    from clid.selection.quality import eq1_quality

    records = list(read_jsonl(w.selfgen))
    ids, texts = [r["id"] for r in records], [r["caption"] for r in records]
    if trusted:  # (05 scores a trusted caption's preprocessed text)
        for r in load_karpathy(w.captions):
            if r.split in ("train", "restval"):
                ids += [f"trusted:{r.image_id}#{j}" for j in range(len(r.captions))]
                texts += r.captions
    u = np.linspace(-2, -1, len(ids))
    path = d / "scored.h5"
    logp = u, np.full(len(ids), -1.5)
    write_quality(path, ids, *logp, eq1_quality(*logp), text_digest=[text_digest(t) for t in texts])
    return path

def one_caption_changed(w: World, d: Path) -> Path:
    return jsonl_lines(w.selfgen, d, lambda records: [dict(records[0], caption="a cat on a red ball")] + records[1:])

row("06", "selfgen-differs-from-the-scored-captions", lambda w, d: w.selection_args(
    d / "out", "--quality", scored_quality(w, d), "--selfgen", one_caption_changed(w, d)),
    "caption 1-0: its text is not the one")

row("06", "selfgen-differs-from-the-scored-captions-curriculum-u", lambda w, d: w.selection_args(
    d / "out", "--quality", scored_quality(w, d, trusted=True), "--selfgen", one_caption_changed(w, d),
    "--strategy", "curriculum", "--difficulty", "u", "--eval-every", "0"), "caption 1-0: its text is not the one")

row("06", "quality-without-caption-digests", lambda w, d: w.selection_args(d / "out"), "records no digest of the captions", "skip")

row("06", "quality-text-digest-not-uint64", lambda w, d: w.selection_args(d / "out", "--quality", h5_changed(
    scored_quality(w, d), d, lambda f: (f.__delitem__("text_digest"), f.create_dataset("text_digest", data=np.zeros(16))))),
    "dataset 'text_digest'")

row("06", "out-held-by-another-run", lambda w, d: w.selection_args(held(d / "out")), "is training into this folder")

# curating every caption away
row("06", "loss-remove-curates-every-caption-away", lambda w, d: w.selection_args(
    d / "out", "--strategy", "loss-remove", "--curate-ratio", "0.99", "--curate-every", "1"), "removes every one of the 40 captions")

row("06", "workers-above-the-cores", lambda w, d: w.selection_args(d / "out", "--workers", "4096"), "argument --workers")

row("06", "dropout-draws-unknown", lambda w, d: w.selection_args(d / "out", "--dropout-draws", "Example"), "argument --dropout-draws")

row("06", "dist-timeout-nan", lambda w, d: w.selection_args(d / "out", "--dist-timeout", "nan"), "argument --dist-timeout")

row("06", "dist-timeout-1e308", lambda w, d: w.selection_args(d / "out", "--dist-timeout", "1e308"), "a number of minutes in (0, 10080]")


# -- an --out that is an input by another name ----------------------------------------------------------------
row("06", "out-a-link-to-init", lambda w, d: w.selection_args(link_to(d, "out", checkpoint_copy(w.trusted, d, name="ck")),
                                                              "--init", d / "ck"), "is also the input --init")

row("06", "out-holds-the-quality-file-as-its-log", lambda w, d: w.selection_args(d / "out", "--quality", write(
    d / "out", "difficulty.h5", w.quality.read_bytes()), "--force"), "is also the input --quality")


# -- --force replaces only what 06 wrote: a model card the user edited is kept, and named ---------------------------
def card_edited(w: World, d: Path, *extra) -> list:
    """06's arguments of a run trained into d/out whose MODEL_CARD.md the user has since edited."""
    _must(run_stage("06", w.selection_args(d / "out")))
    card = d / "out" / "MODEL_CARD.md"
    card.write_text(card.read_text() + "\nMy notes: trained for the March report.\n")
    return w.selection_args(d / "out", *extra)

for extra in (("--restart", "--force"), ("--restart",)):
    row("06", "keeps-an-edited-model-card" + "".join(extra).replace("--", "-"),
        lambda w, d, extra=extra: card_edited(w, d, *extra),
        "MODEL_CARD.md was not written by a training stage (or was edited since): it is kept", "ok")


row("06", "selfgen-word-outside-output-vocab", lambda w, d: w.selection_args(d / "out", "--output-vocab", w.captions),
    "selfgen.jsonl: caption 1-1: holds 'big', outside the model's output vocabulary (--output-vocab), as 8 captions")


@pytest.mark.parametrize("row", table.params())
def test_bad_input(row: Row, world: World, tmp_path):
    check_row(row, world, tmp_path)
