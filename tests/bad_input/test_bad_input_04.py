"""Bad input of 04_train_base.py: one row per malformed input (tests/badinput.py runs and checks them)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from badinput import (
    BINARY,
    CAPTION_CASES,
    DATASET_12,
    FEATURE_CASES,
    MOSTLY_MISSING,
    OTHER_SCHEME,
    SHARE,
    Row,
    Table,
    World,
    _must,
    big_endian,
    check_row,
    checkpoint_copy,
    corrupt,
    edit_config,
    features_of,
    first_group,
    h5_changed,
    held,
    jsonl_lines,
    karpathy,
    late_bad_byte,
    link_to,
    loop,
    many_regions,
    paragraphs,
    run_stage,
    sentence,
    set_in,
    unfinished,
    user_file,
    user_folder,
    write,
)

table = Table()
row = table.row

# 04 reads the train split; 07 the test split (the last image); 06 the same loader as 04
for name, make, fragment, kind in CAPTION_CASES:
    if name.startswith("coco-") and kind == "skip":
        continue
    row("04", f"captions-{name}", lambda w, d, make=make: w.train_args(d / "out", "--captions", make(w, d)),
        fragment, kind)

for name, make, fragment, kind, needs in FEATURE_CASES:
    row("04", f"features-{name}", lambda w, d, make=make: w.train_args(d / "out", "--features", make(w, d)), fragment, kind, needs)

row("04", "features-big-endian", lambda w, d: w.train_args(d / "out", "--features", big_endian(w, d)), "", "ok")

row("04", "features-image-missing", lambda w, d: w.train_args(d / "out", "--max-left-out", "0.2", "--features",
                                                              h5_changed(w.features, d, lambda f: f.__delitem__("1"))),
    "no region features for the image", "skip")

row("04", "adam-eps-zero", lambda w, d: w.train_args(d / "out", "--adam-eps", "0"), "argument --adam-eps: must be a positive")

row("04", "region-init-with-init-from", lambda w, d: w.train_args(d / "out", "--init-from", w.trusted, "--region-init", d / "fc.pt"),
    "--region-init sets a new model's first region layer")

row("04", "region-init-not-a-state-dict", lambda w, d: w.train_args(d / "out", "--region-init", write(d, "fc.pt", BINARY)),
    "not a safetensors file or a plain state dict")

# -- 04 training: other inputs, corrupt checkpoints, resume with changed inputs -------------------------
row("04", "output-vocab-missing", lambda w, d: w.train_args(d / "out", "--output-vocab", d / "nope.json"), "no such file|not found")

row("04", "output-vocab-not-json", lambda w, d: w.train_args(d / "out", "--output-vocab", write(d, "v.json", "{")), "not valid json")

row("04", "init-from-missing", lambda w, d: w.train_args(d / "out", "--init-from", d / "nope"), "no such checkpoint folder")

row("04", "init-from-bad-config", lambda w, d: w.train_args(d / "out", "--init-from", checkpoint_copy(w.trusted, d, corrupt("config.json", b"{"), "init")), "not valid json")

row("04", "init-from-other-levels", lambda w, d: w.train_args(d / "out", "--init-from", w.trusted, "--levels", "paragraph"),
    "trained with levels caption, not this run's --levels paragraph")

row("04", "continue-from-other-levels",
    lambda w, d: w.train_args(d / "out", "--continue-from", w.trusted, "--levels", "paragraph", "--max-steps", "1000"),
    "trained with levels caption, not this run's --levels paragraph")

row("04", "init-from-bad-weights", lambda w, d: w.train_args(d / "out", "--init-from", checkpoint_copy(w.trusted, d, corrupt("model.safetensors"), "init")), "model.safetensors")

RESUME_CHANGES_04 = [
    ("lr", lambda w, d: ["--lr", "1e-2"], "--lr"),
    ("batch-size", lambda w, d: ["--batch-size", "8"], "--batch-size"),
    ("data", lambda w, d: ["--data", "extended", "--selfgen", w.selfgen], "--data"),
    ("max-steps", lambda w, d: ["--max-steps", "3"], "--max-steps"),
    ("seed", lambda w, d: ["--seed", "3"], "--seed"),
    ("levels", lambda w, d: ["--levels", "labert"], "--levels"),
    ("captions-file", lambda w, d: ["--captions", karpathy(w, d, sentence(0, {"raw": "a different caption"}))], "--captions"),
    ("features-file", lambda w, d: ["--features", h5_changed(w.features, d, lambda f: f.__delitem__("1"))], "--features"),
]

for name, extra, fragment in RESUME_CHANGES_04:
    row("04", f"resume-changed-{name}", lambda w, d, extra=extra: w.train_args(checkpoint_copy(w.trusted, d), *extra(w, d)), fragment)

def without_run_record(folder: Path) -> None:
    """A checkpoint as written before input files were recorded: its flags only under "train"."""
    config = json.loads((folder / "config.json").read_text())
    del config["run"]
    (folder / "config.json").write_text(json.dumps(config))

row("04", "resume-old-checkpoint-changed-lr",
    lambda w, d: w.train_args(checkpoint_copy(w.trusted, d, without_run_record), "--lr", "1e-2"), "--lr")

row("04", "resume-changed-log-every-is-fine", lambda w, d: w.train_args(checkpoint_copy(w.trusted, d), "--log-every", "7"),
    "already trained", "ok")

row("04", "resume-changed-lr-restart", lambda w, d: w.train_args(checkpoint_copy(w.trusted, d), "--lr", "1e-2", "--restart"),
    "checkpoint:", "ok")

row("04", "out-data-folder", lambda w, d: w.train_args(user_folder(d, w)), "did not write")

row("04", "out-parent-of-runs", lambda w, d: w.train_args(checkpoint_copy(w.trusted, d, name="runs/trusted").parent), "did not write")

row("04", "out-is-a-file", lambda w, d: w.train_args(write(d, "out", "x")), "is a file, not a folder")

row("04", "out-force-would-replace-users-config", lambda w, d: w.train_args(user_file(d / "out", "config.json"), "--force"),
    "would replace")

row("04", "out-is-continue-from", lambda w, d: w.train_args((ck := checkpoint_copy(w.trusted, d)), "--continue-from", ck, "--max-steps", "4"),
    "is also the input --continue-from")

row("04", "out-is-init-from", lambda w, d: w.train_args((ck := checkpoint_copy(w.trusted, d)), "--init-from", ck),
    "is also the input --init-from")

row("04", "restart-in-data-folder", lambda w, d: w.train_args(user_folder(d, w), "--restart"), "did not write")

row("04", "split-capitalised", lambda w, d: w.train_args(d / "out", "--captions", karpathy(w, d, set_in(0, split="Train"))),
    "unknown split 'train'")

row("04", "test-ids-binary", lambda w, d: w.train_args(d / "out", "--test-ids", write(d, "ids.txt", BINARY)), "utf-8")

row("04", "lr-horizon-below-max-steps", lambda w, d: w.train_args(d / "out", "--lr-horizon", "1"), "--lr-horizon 1 is below --max-steps 2")

row("04", "features-10000-regions-skipped-over-the-share", lambda w, d: w.train_args(d / "out", "--bad-features", "skip", "--features",
                                                                                     h5_changed(w.features, d, first_group(many_regions(10_000)))),
    "1 image(s) have bad region features (--bad-features skip), e.g. image 1: 10000 regions")

row("04", "features-10000-regions-skipped", lambda w, d: w.train_args(d / "out", "--bad-features", "skip", *SHARE, "--features",
                                                                      h5_changed(w.features, d, first_group(many_regions(10_000)))),
    "at most 1000 per image", "skip")

row("04", "init-from-config-edited", lambda w, d: w.train_args(d / "out", "--init-from", checkpoint_copy(
    w.trusted, d, edit_config(num_heads=2), "init")), "does not describe the weights")

row("04", "resume-config-edited", lambda w, d: w.train_args(checkpoint_copy(w.trusted, d, unfinished(edit_config(layer_norm_eps=1e-6)))),
    "does not describe the weights")

row("04", "features-of-most-images-missing", lambda w, d: w.train_args(d / "out", "--features", features_of(w, d, MOSTLY_MISSING)),
    "21 of 24 trusted captions (88%) would be left out (21 no region features for the image)")

row("04", "features-another-id-scheme", lambda w, d: w.train_args(d / "out", "--features", features_of(
    w, d, {str(i) for i in range(1, 14)}, OTHER_SCHEME)), "its images are named 1, 2, 3, the feature file's coco_train2014_000000000001")

row("04", "features-another-id-scheme-selfgen", lambda w, d: w.train_args(d / "out", "--data", "extended", "--selfgen", w.selfgen,
                                                                          "--max-left-out", "1", "--features", features_of(w, d, {"1", "2", "3"})),
    "", "ok")

row("04", "selfgen-of-most-images-missing", lambda w, d: w.train_args(
    d / "out", "--data", "extended", "--max-left-out", "0.2", "--features", features_of(w, d, set(map(str, range(1, 14))) - {"8"}),
    "--selfgen", jsonl_lines(w.selfgen, d, lambda r: [dict(x, image_id=8) for x in r])), "16 of 16 selfgen captions (100%)")

row("04", "features-image-missing-over-the-share", lambda w, d: w.train_args(d / "out", "--features", h5_changed(
    w.features, d, lambda f: f.__delitem__("1"))), "3 of 24 trusted captions (12%) would be left out")

row("04", "max-left-out-1-goes-on", lambda w, d: w.train_args(d / "out", "--max-left-out", "1", "--features", features_of(w, d, MOSTLY_MISSING)),
    "skipped 21: trusted: no region features for the image", "skip")

row("04", "paragraphs-without-levels-paragraph", lambda w, d: w.train_args(d / "out", "--captions", paragraphs(w, d)),
    "give --levels paragraph")

row("04", "trusted-mostly-another-script", lambda w, d: w.train_args(d / "out", "--captions", karpathy(
    w, d, lambda x: [s.update(raw="一只狗", tokens=["一只狗"]) for im in x["images"][:4] for s in im["sentences"]])),
    "no word left|another script")

row("04", "number--max-left-out=1.5", lambda w, d: w.train_args(d / "out", "--max-left-out=1.5"), "argument --max-left-out")

row("04", "test-ids-bom-holds-out-the-first-id", lambda w, d: w.train_args(d / "out", "--test-ids", write(d, "ids.txt", "\ufeff1\n2\n")),
    "held out of training and validation: 2 images", "ok")

for name, change, fragment in [("config-garbage", corrupt("config.json", b"{"), "not valid json"),
                               ("config-a-list", corrupt("config.json", b"[]"), "no model config"),
                               ("config-bom", lambda f: (f / "config.json").write_bytes(b"\xef\xbb\xbf" + (f / "config.json").read_bytes()),
                                "its learning rate reached 0 at step 2"),  # (read through its BOM: the schedule's end)
                               ("train-state-garbage", corrupt("train_state.json", b"{"), "train_state.json")]:
    row("04", f"continue-from-{name}", lambda w, d, change=change: w.train_args(d / "out", "--continue-from", checkpoint_copy(
        w.trusted, d, change, "ck"), "--max-steps", "3"), fragment)

# -- a researcher's first hour: --recipe, --allow-download, --ids, 07 without --refs, the misleads ------
row("04", "recipe-unknown", lambda w, d: w.train_args(d / "out", "--recipe", "fast"), "invalid choice: 'fast'")

row("04", "recipe-file-missing", lambda w, d: w.train_args(d / "out", "--recipe", d / "mine.toml"), "no recipe ")

row("04", "recipe-file-not-toml", lambda w, d: w.train_args(d / "out", "--recipe", write(d, "mine.toml", "lr = [")),
    "mine.toml is not TOML")

# a recipe's values are checked as the flags they stand for: one line naming the file, the table and the key
RECIPE_CASES = [
    ("steps-1e30", "[resolved]\nsteps = 1e30", "[resolved] steps must be a positive integer"),
    ("preset-huge", '[train]\npreset = "huge"', "[train] preset = \"huge\": must be one of tiny"),
    ("train-a-number", "train = 3", "train = 3: must be a table"),
    ("eta-span-text", '[resolved]\neta_span = "0.9"', "[resolved] eta_span must be a number in (0, 1]"),
    ("eta-span-above-1", "[resolved]\neta_span = 1.5", "[resolved] eta_span must be a number in (0, 1]"),
    ("batch-size-0", "[train]\nbatch_size = 0", "[train] batch_size = 0: must be a positive integer"),
    ("max-steps-0", "[train]\nmax_steps = 0", "[train] max_steps = 0: must be a positive integer"),
    ("dropout-5", "[train]\ndropout = 5.0", "[train] dropout = 5.0: must be a probability"),
    ("lr-text", '[train]\nlr = "fast"', "[train] lr = \"fast\": must be a number, not the text"),
    ("lr-nan", "[train]\nlr = nan", "[train] lr = nan"),
    ("batch-size-float", "[train]\nbatch_size = 4.5", "[train] batch_size = 4.5"),
    ("batch-size-true", "[train]\nbatch_size = true", "[train] batch_size = true: must be a number"),
    ("preset-a-number", "[train]\npreset = 3", "[train] preset = 3: must be text"),
    ("switch-as-text", '[train]\ntie_head = "yes"', "[train] tie_head = \"yes\": must be true or false"),
    ("levels-a-list", '[train]\nlevels = ["caption"]', "must be one value, not a list"),
    ("unknown-table", "[trainer]\nlr = 1e-3", "[trainer] is no table of a recipe"),
    ("unknown-resolved-key", "[resolved]\nstep = 10", "[resolved] step: no such setting"),
    ("shortlist-text", '[resolved]\nshortlist = "yes"', "[resolved] shortlist must be true or false"),
    ("nested-table", "[train.lr]\nvalue = 1", "[train] lr: must be a value, not a table"),
    ("trusted-table-bad-value", "[trusted]\nwarmup = -1", "[trusted] warmup = -1"),
    ("extends-a-number", "extends = 3", "extends = 3: must be a recipe's name"),
    ("extends-missing", 'extends = "nope"', "no recipe"),
    ("sets-no-flag", "[train]\nrate = 1", "[train] rate is not a flag of this stage"),
    ("flag-as-on-the-command-line", '[train]\n"--max-steps" = 3', "[train] --max-steps is not a flag of this stage (the flag "
                                                                  "--max-steps is written max_steps here)"),
    ("flag-with-hyphens", '[train]\nbatch-size = 3', "[train] batch-size is not a flag of this stage (the flag --batch-size"),
    ("steps-text", '[resolved]\nsteps = "1000"', "[resolved] steps must be a positive integer, got \"1000\""),
    ("steps-zero", "[resolved]\nsteps = 0", "[resolved] steps must be a positive integer, got 0"),
    ("steps-inf", "[resolved]\nsteps = inf", "[resolved] steps must be a positive integer, got inf"),
    ("eta-span-zero", "[resolved]\neta_span = 0", "[resolved] eta_span must be a number in (0, 1]"),
    ("eta-span-nan", "[resolved]\neta_span = nan", "[resolved] eta_span must be a number in (0, 1]"),
    ("world-n-train-float", "[world]\nn_train = 1e3", "[world] n_train must be a positive integer, got 1000.0"),
    ("quick-paraphraser-unknown", '[quick]\nparaphraser = "pegasus"', "[quick] paraphraser must be one of rules, sentences"),
    ("preset-upper-case", '[train]\npreset = "TINY"', "[train] preset = \"TINY\": must be one of tiny"),
    ("dropout-negative", "[train]\ndropout = -0.1", "[train] dropout = -0.1: must be a probability"),
    ("max-steps-1e30", "[train]\nmax_steps = 1e30", "[train] max_steps = 1e+30"),
    ("model-table-a-list", "trusted = [1, 2]", "trusted = [1, 2]: must be a table"),
    ("extends-itself", 'extends = "mine.toml"', "extends itself"),  # (a file is named from the folder of the one that extends it)
    ("extends-itself-by-another-path", 'extends = "./sub/../mine.toml"', "extends itself"),
    ("extends-a-file-beside-it", 'extends = "base.toml"', "[train] batch_size = 0: must be a positive integer"),
    ("not-utf8", b"[train]\nlr = 1e-3 # \xff\n", "is not utf-8"),
]

def recipe_file(d: Path, text) -> Path:
    """``mine.toml`` holding ``text``, beside ``base.toml``, a recipe of a value 04 refuses, and a folder ``sub``."""
    write(d, "base.toml", "[train]\nbatch_size = 0\n")
    (d / "sub").mkdir()
    return write(d, "mine.toml", text)

for name, text, fragment in RECIPE_CASES:
    row("04", f"recipe-{name}", lambda w, d, text=text: w.train_args(d / "out", "--recipe", recipe_file(d, text)), fragment)

row("04", "recipe-a-folder", lambda w, d: w.train_args(d / "out", "--recipe", (d / "r.toml").mkdir() or d / "r.toml"),
    "is a folder, not a recipe file")

row("04", "amp-with-precision-fp32", lambda w, d: w.train_args(d / "out", "--amp", "--precision", "fp32"),
    "--amp is --precision bf16")

row("04", "workers-2", lambda w, d: w.train_args(d / "out", "--workers", "2"), "checkpoint:", "ok")

row("04", "out-held-by-another-run", lambda w, d: w.train_args(held(d / "out")), "is training into this folder")

row("04", "captions-a-symlink-loop", lambda w, d: w.train_args(d / "out", "--captions", loop(d, "c.json")), "c.json")

row("04", "features-a-symlink-loop", lambda w, d: w.train_args(d / "out", "--features", loop(d, "f.h5")), "f.h5")

row("04", "features-group-a-dataset", lambda w, d: w.train_args(d / "out", "--features", h5_changed(
    w.features, d, lambda f: (f.__delitem__("2"), f.create_dataset("2", data=np.zeros((3, 16), np.float32))))), "image 2")

def trained_then(w: World, d: Path, *extra) -> list:
    """04's arguments of a run already trained into d/out, given again with ``extra``."""
    _must(run_stage("04", w.train_args(d / "out")))
    return w.train_args(d / "out", *extra)

def card_edited(w: World, d: Path, *extra) -> list:
    """04's arguments of a run trained into d/out whose MODEL_CARD.md the user has since edited."""
    argv = trained_then(w, d, *extra)
    card = d / "out" / "MODEL_CARD.md"
    card.write_text(card.read_text() + "\nMy notes: trained for the March report.\n")
    return argv

row("04", "restart-force-keeps-an-edited-model-card", lambda w, d: card_edited(w, d, "--restart", "--force"),
    "MODEL_CARD.md was not written by a training stage (or was edited since): it is kept", "ok")

row("04", "restart-names-an-edited-model-card", lambda w, d: card_edited(w, d, "--restart"),
    "MODEL_CARD.md was not written by a training stage (or was edited since): it is kept", "ok")

row("04", "max-steps-fullwidth", lambda w, d: w.train_args(d / "out", "--max-steps", "\uff12"), "argument --max-steps")

row("04", "batch-size-superscript", lambda w, d: w.train_args(d / "out", "--batch-size", "4\u00b2"), "argument --batch-size")

row("04", "workers-above-the-cores", lambda w, d: w.train_args(d / "out", "--workers", "4096"), "argument --workers")

row("04", "resume-precision-fp32-after-auto", lambda w, d: trained_then(w, d, "--precision", "fp32"), "already trained", "ok")

row("04", "dropout-draws-unknown", lambda w, d: w.train_args(d / "out", "--dropout-draws", "batch"), "argument --dropout-draws")

row("04", "resume-dropout-draws-changed", lambda w, d: trained_then(w, d, "--dropout-draws", "rank"),
    "--dropout-draws example then, rank now", leaves_output=True)

row("04", "bert-folder-not-found", lambda w, d: w.train_args(d / "out", "--preset", "labert", "--bert", d / "nope"),
    "not found: there is no folder")

row("04", "bert-folder-empty", lambda w, d: w.train_args(d / "out", "--preset", "minilm", "--bert", (d / "e").mkdir() or d / "e"),
    "is empty")

row("04", "selfgen-non-utf8-on-line-1500", lambda w, d: w.train_args(d / "out", "--data", "extended", "--selfgen", late_bad_byte(w, d)),
    "line 1500: not utf-8")

row("04", "token-cache-name-too-long", lambda w, d: w.train_args(d / "out", "--data", "extended", "--token-cache", "--selfgen", write(
    d, "s" * 236 + ".jsonl", w.selfgen.read_text())), "going on without it", "ok")

row("04", "features-test-image-a-dataset-found-at-open", lambda w, d: w.train_args(d / "out", "--features", h5_changed(
    w.features, d, DATASET_12)), "image 12: is a dataset, not a group")

row("04", "features-test-image-a-dataset-skipped", lambda w, d: w.train_args(d / "out", "--bad-features", "skip", "--features", h5_changed(
    w.features, d, DATASET_12)), "bad region features", "skip")

# -- training and features at cluster scale: --region-cache, --dist-timeout, convert --dtype ------------
def bf16_tag(value):
    """A features dataset whose dtype attribute says ``value`` (bfloat16 is known, and only over uint16)."""
    def change(group):
        group["features"].attrs["dtype"] = value
    return first_group(change)

row("04", "region-cache-512M", lambda w, d: w.train_args(d / "out", "--region-cache", "512M"), "checkpoint:", "ok")

row("04", "dist-timeout-0", lambda w, d: w.train_args(d / "out", "--dist-timeout", "0"), "argument --dist-timeout")

row("04", "features-unknown-dtype-tag", lambda w, d: w.train_args(d / "out", "--features", h5_changed(
    w.features, d, bf16_tag("float8"))), "dtype = 'float8': only bfloat16")

row("04", "features-bfloat16-tag-on-float32", lambda w, d: w.train_args(d / "out", "--features", h5_changed(
    w.features, d, bf16_tag("bfloat16"))), "is float32 with the attribute dtype = 'bfloat16'")

row("04", "dist-timeout-1e308", lambda w, d: w.train_args(d / "out", "--dist-timeout", "1e308"), "a number of minutes in (0, 10080]")


# -- an --out that is an input by another name ----------------------------------------------------------------
row("04", "out-a-link-to-init-from", lambda w, d: w.train_args(link_to(d, "out", checkpoint_copy(w.trusted, d, name="ck")),
                                                               "--init-from", d / "ck"), "is also the input --init-from")

row("04", "out-init-from-another-spelling", lambda w, d: w.train_args(d / "ck", "--init-from", checkpoint_copy(w.trusted, d, name="ck")
                                                                      / ".." / "ck"), "is also the input --init-from")

row("04", "captions-inside-out-named-as-its-log", lambda w, d: w.train_args(d / "out", "--captions", write(
    d / "out", "train_log.jsonl", w.captions.read_text()), "--force"), "is also the input --captions")


row("04", "captions-word-outside-output-vocab", lambda w, d: w.train_args(d / "out", "--output-vocab", w.selfgen),
    "holds 'dog'|outside the model's output vocabulary (--output-vocab)")


@pytest.mark.parametrize("row", table.params())
def test_bad_input(row: Row, world: World, tmp_path):
    check_row(row, world, tmp_path)
