"""Bad input of 05_score_quality.py: one row per malformed input (tests/badinput.py runs and checks them)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from badinput import (
    FEATURE_CASES,
    MOSTLY_MISSING,
    OTHER_SCHEME,
    Row,
    Table,
    World,
    big_endian,
    check_row,
    checkpoint_copy,
    copy_to,
    features_of,
    h5_changed,
    karpathy,
    late_bad_byte,
    loop,
    other_kind,
    run_stage,
    set_in,
    write,
)

table = Table()
row = table.row

for name, make, fragment, kind, needs in FEATURE_CASES[:5] + FEATURE_CASES[9:10] + FEATURE_CASES[11:12]:
    row("05", f"features-{name}", lambda w, d, make=make: w.score_args(d / "out.h5", "--features", make(w, d)), fragment, kind, needs)

row("05", "features-big-endian", lambda w, d: w.score_args(d / "out.h5", "--features", big_endian(w, d)), "", "ok")

def without_feature_kind(folder: Path) -> None:
    """A checkpoint written before config.json recorded the features' kind."""
    config = json.loads((folder / "config.json").read_text())
    del config["feature_kind"], config["feature_dim"]
    (folder / "config.json").write_text(json.dumps(config))

row("05", "features-other-kind-older-checkpoint",  # no kind recorded: checked on the dimension only
    lambda w, d: w.score_args(d / "out.h5", "--features", other_kind(w, d),
                              "--trusted", checkpoint_copy(w.trusted, d, without_feature_kind, "old"),
                              "--extended", checkpoint_copy(w.extended, d, without_feature_kind, "old_ext")), "scored", "ok")

row("05", "features-dim-attribute-wrong",
    lambda w, d: w.score_args(d / "out.h5", "--features", h5_changed(w.features, d, lambda f: f.attrs.__setitem__("feature_dim", 99))),
    "attribute 'feature_dim': says 99, but the features of image")

row("05", "include-trusted-no-captions", lambda w, d: w.score_args(d / "out.h5", "--include-trusted"), "needs --captions")

row("05", "captions-split-null", lambda w, d: w.score_args(d / "out.h5", "--captions", karpathy(w, d, set_in(0, split=None))), "'split' must be a string")

row("05", "features-image-missing", lambda w, d: w.score_args(d / "out.h5", "--max-left-out", "0.2", "--features",
                                                              h5_changed(w.features, d, lambda f: f.__delitem__("1"))),
    "no region features for the image", "skip")

row("05", "empty-shard", lambda w, d: w.score_args(d / "out.h5", "--num-shards", "40", "--shard-id", "39"), "", "ok")

row("05", "out-is-selfgen", lambda w, d: w.score_args((p := write(d, "s.jsonl", w.selfgen.read_text())), "--selfgen", p),
    "is also the input --selfgen")

row("05", "same-checkpoint-twice", lambda w, d: w.score_args(d / "out.h5", "--extended", w.trusted), "hold the same weights")

row("05", "copy-of-the-same-checkpoint", lambda w, d: w.score_args(d / "out.h5", "--extended", checkpoint_copy(w.trusted, d, name="copy")),
    "hold the same weights")

row("05", "features-of-most-images-missing", lambda w, d: w.score_args(d / "out.h5", "--features", features_of(w, d, MOSTLY_MISSING)),
    "14 of 16 selfgen captions (88%) would be left out")

row("05", "features-another-id-scheme", lambda w, d: w.score_args(d / "out.h5", "--features", features_of(
    w, d, {str(i) for i in range(1, 14)}, OTHER_SCHEME)), "one id scheme")

row("05", "include-trusted-features-missing", lambda w, d: w.score_args(
    d / "out.h5", "--captions", w.captions, "--include-trusted", "--max-left-out", "0.2", "--features",
    features_of(w, d, set(map(str, range(1, 14))) - {"2", "3"})), "4 of 16 selfgen captions (25%)")

row("05", "number--max-left-out=-0.1", lambda w, d: w.score_args(d / "out.h5", "--max-left-out=-0.1"), "argument --max-left-out")

row("05", "allow-download-not-taken", lambda w, d: w.score_args(d / "out.h5", "--allow-download"),
    "unrecognized arguments: --allow-download")

row("05", "precision-bf16-batch-auto", lambda w, d: w.score_args(d / "out.h5", "--precision", "bf16", "--batch-size", "auto"),
    "scored captions", "ok")

row("05", "out-unrelated-file", lambda w, d: w.score_args(copy_to(w.quality, d, "q.h5")), "did not write it")

row("05", "selfgen-a-symlink-loop", lambda w, d: w.score_args(d / "q.h5", "--selfgen", loop(d, "s.jsonl")), "s.jsonl")

row("05", "features-a-symlink-loop", lambda w, d: w.score_args(d / "q.h5", "--features", loop(d, "f.h5")), "f.h5")

row("05", "selfgen-non-utf8-on-line-1500", lambda w, d: w.score_args(d / "q.h5", "--selfgen", late_bad_byte(w, d)),
    "line 1500: not utf-8")

row("05", "region-cache-auto", lambda w, d: w.score_args(d / "q.h5", "--region-cache", "auto"), "16 scored captions", "ok")


def shortlisted(w: World) -> tuple[Path, Path]:
    """A trusted and an extended model whose heads predict only the words of the world's caption files (04
    ``--output-vocab``), trained once for the rows that need them."""
    trusted, extended = w.root / "shortlisted" / "trusted", w.root / "shortlisted" / "extended"
    if not (extended / "model.safetensors").exists():
        for out, extra in ((trusted, []), (extended, ["--data", "extended", "--selfgen", w.selfgen])):
            outcome = run_stage("04", w.train_args(out, "--output-vocab", w.captions, w.selfgen, *extra))
            assert outcome.code == 0, outcome.text[-2000:]
    return trusted, extended


def selfgen_with_words(w: World, d: Path, words: dict[int, str]) -> Path:
    """The world's self-generated captions, caption k's text given by ``words`` where it names one."""
    lines = w.selfgen.read_text().splitlines()
    records = [json.loads(line) for line in lines]
    for k, text in words.items():
        records[k]["caption"] = text
    return write(d, "selfgen.jsonl", "".join(json.dumps(r) + "\n" for r in records))


def score_shortlisted(w: World, d: Path, words: dict[int, str], *extra) -> list:
    trusted, extended = shortlisted(w)
    return w.score_args(d / "q.h5", "--trusted", trusted, "--extended", extended,
                        "--selfgen", selfgen_with_words(w, d, words), *extra)


row("05", "selfgen-word-outside-a-shortlist",  # one caption of 16 the models cannot predict: a counted skip
    lambda w, d: score_shortlisted(w, d, {3: "a zebra juggles seven kumquats"}, "--max-left-out", "0.1"),
    "selfgen: a word outside the models' output vocabulary", "skip")

row("05", "selfgen-every-word-outside-a-shortlist",  # captions of another caption file: stopped before scoring
    lambda w, d: score_shortlisted(w, d, {k: "a zebra juggles seven kumquats" for k in range(16)}),
    "16 of 16 selfgen captions (100%) would be left out")


@pytest.mark.parametrize("row", table.params())
def test_bad_input(row: Row, world: World, tmp_path):
    check_row(row, world, tmp_path)
