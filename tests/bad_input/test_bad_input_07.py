"""Bad input of 07_eval.py: one row per malformed input (tests/badinput.py runs and checks them)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from badinput import (
    BINARY,
    DATASET_12,
    FEATURE_CASES,
    Row,
    Table,
    World,
    _must,
    after,
    check_row,
    checkpoint_copy,
    coco_captions,
    first,
    first_group,
    h5_changed,
    jsonl_lines,
    karpathy,
    link_to,
    poke,
    run_stage,
    sentence,
    set_in,
    user_file,
    user_folder,
    write,
)

table = Table()
row = table.row

TEST_IMAGE = -1

REFS_CASES = [
    ("missing", lambda w, d: d / "nope.json", "no such file|not found"),
    ("not-json", lambda w, d: write(d, "r.json", "{"), "not valid json"),
    ("binary", lambda w, d: write(d, "r.json", BINARY), "utf-8"),
    ("split-null", lambda w, d: karpathy(w, d, set_in(TEST_IMAGE, split=None)), "'split' must be a string"),
    ("tokens-string", lambda w, d: karpathy(w, d, sentence(TEST_IMAGE, {"tokens": "a dog"})), "'tokens' must be a list"),
    ("raw-int", lambda w, d: karpathy(w, d, sentence(TEST_IMAGE, {"raw": 3})), "'raw' must be a string"),
    ("raw-null", lambda w, d: karpathy(w, d, sentence(TEST_IMAGE, {"raw": None})), "'raw' must be a string"),
    ("cocoid-null", lambda w, d: karpathy(w, d, set_in(TEST_IMAGE, cocoid=None)), "'cocoid' must be"),
    ("duplicate-cocoid", lambda w, d: karpathy(w, d, set_in(TEST_IMAGE, cocoid=1)), "duplicate image id 1"),
    ("sentences-null", lambda w, d: karpathy(w, d, set_in(TEST_IMAGE, sentences=None)), "'sentences' must be a list"),
    ("coco-caption-int", lambda w, d: coco_captions(w, d, 7), "'caption' must be a string"),
    ("no-test-split", lambda w, d: karpathy(w, d, lambda x: [im.update(split="train") for im in x["images"]]), "no image of split"),
]

for name, make, fragment in REFS_CASES:
    row("07", f"refs-{name}", lambda w, d, make=make: w.eval_args(d / "out", "--refs", make(w, d)), fragment)

row("07", "levels-ssa-generated-level-6",
    lambda w, d: w.eval_args(d / "out", "--levels", "ssa", "--generated",
                             jsonl_lines(w.generated, d, first(level=6), "g.jsonl")), "outside the 5 ssa levels")

# -- 07 evaluation: generated captions, features, long references, other files --------------------------
GENERATED_CASES = [
    ("missing", lambda w, d: d / "nope.jsonl", "no such file|not found"),
    ("empty", lambda w, d: write(d, "g.jsonl", ""), "no captions"),
    ("blank-lines", lambda w, d: write(d, "g.jsonl", "\n\n"), "no captions"),
    ("bad-line", lambda w, d: jsonl_lines(w.generated, d, lambda r: r + ["{"], "g.jsonl"), "not valid json"),
    ("binary", lambda w, d: write(d, "g.jsonl", BINARY), "utf-8"),
    ("level-word", lambda w, d: jsonl_lines(w.generated, d, first(level="two"), "g.jsonl"), "'level' must be a level number"),
    ("level-99", lambda w, d: jsonl_lines(w.generated, d, first(level=99), "g.jsonl"), "outside 1..7"),
    ("level-0", lambda w, d: jsonl_lines(w.generated, d, first(level=0), "g.jsonl"), "outside 1..7"),
    ("caption-int", lambda w, d: jsonl_lines(w.generated, d, first(caption=4), "g.jsonl"), "'caption' must be a string"),
    ("caption-null", lambda w, d: jsonl_lines(w.generated, d, first(caption=None), "g.jsonl"), "'caption' must be a string"),
    ("image-id-null", lambda w, d: jsonl_lines(w.generated, d, first(image_id=None), "g.jsonl"), "'image_id' must be"),
    ("duplicate", lambda w, d: jsonl_lines(w.generated, d, lambda r: r + [r[0]], "g.jsonl"), "a second caption"),
    ("no-level", lambda w, d: jsonl_lines(w.generated, d, first(level="DELETE"), "g.jsonl"), "missing key"),
]

for name, make, fragment in GENERATED_CASES:
    row("07", f"generated-{name}", lambda w, d, make=make: w.eval_args(d / "out", "--generated", make(w, d)), fragment)

row("07", "checkpoint-without-features", lambda w, d: ["--refs", w.captions, "--checkpoint", w.trusted, "--out", d / "out"], "needs --features")

row("07", "features-test-image-width-string",
    lambda w, d: ["--refs", w.captions, "--checkpoint", w.trusted, "--out", d / "out", "--spice", "off", "--features",
                  h5_changed(w.features, d, lambda f: f["11"].attrs.__setitem__("width", "abc"))],
    "width 'abc' is not a number")

for name, make, fragment, kind, needs in FEATURE_CASES[:4]:
    row("07", f"features-{name}", lambda w, d, make=make: ["--refs", w.captions, "--features", make(w, d), "--checkpoint", w.trusted,
                                                            "--out", d / "out", "--spice", "off"], fragment, kind, needs)

def long_refs(w: World, d: Path, level) -> Path:
    data = json.loads(w.captions.read_text())
    test = [im for im in data["images"] if im["split"] == "test"]
    for im in test:
        for s in im["sentences"]:
            s["level"] = 3
    test[0]["sentences"][0]["level"] = level
    return write(d, "long.json", {"images": test})

row("07", "long-refs-missing", lambda w, d: w.eval_args(d / "out", "--long-refs", d / "nope.json"), "no such file|not found")

row("07", "long-refs-not-json", lambda w, d: w.eval_args(d / "out", "--long-refs", write(d, "long.json", "{")), "not valid json")

row("07", "long-refs-level-string", lambda w, d: w.eval_args(d / "out", "--long-refs", long_refs(w, d, "3")), "needs an integer 'level'")

row("07", "long-refs-level-outside", lambda w, d: w.eval_args(d / "out", "--long-refs", long_refs(w, d, 12)), "outside the level set")

row("07", "long-refs-level-zero", lambda w, d: w.eval_args(d / "out", "--long-refs", long_refs(w, d, 0)), "outside the level set")

row("07", "long-refs-raw-int", lambda w, d: w.eval_args(d / "out", "--long-refs", karpathy(w, d, sentence(TEST_IMAGE, {"raw": 3, "level": 3}))), "'raw' must be a string")

row("07", "test-ids-missing", lambda w, d: w.eval_args(d / "out", "--test-ids", d / "nope.txt"), "no such file|not found")

row("07", "selfgen-missing", lambda w, d: w.eval_args(d / "out", "--selfgen", d / "nope.jsonl"), "no such file|not found")

row("07", "selfgen-caption-int", lambda w, d: w.eval_args(d / "out", "--selfgen", jsonl_lines(w.selfgen, d, first(caption=4))), "'caption' must be a string")

row("07", "selfgen-bad-line", lambda w, d: w.eval_args(d / "out", "--selfgen", jsonl_lines(w.selfgen, d, lambda r: r + ["{"])), "not valid json")

row("07", "out-data-folder", lambda w, d: w.eval_args(user_folder(d, w)), "did not write")

row("07", "out-users-report", lambda w, d: w.eval_args(user_file(d / "out", "report.md"), "--force"), "would replace")

row("07", "out-is-a-file", lambda w, d: w.eval_args(write(d, "out", "x")), "is a file, not a folder")

row("07", "generated-ids-7-and-string-7", lambda w, d: w.eval_args(d / "out", "--generated", write(
    d, "g.jsonl", '{"image_id": 11, "level": 1, "caption": "a dog"}\n{"image_id": "11", "level": 1, "caption": "a cat"}\n')),
    "a second caption for image 11")

row("07", "no-refs-long-refs", lambda w, d: ["--generated", w.generated, "--out", d / "out", "--long-refs", w.captions],
    "--long-refs needs --refs")

row("07", "no-refs-test-ids", lambda w, d: ["--generated", w.generated, "--out", d / "out", "--test-ids", "karpathy"],
    "--test-ids needs --refs")

row("07", "no-refs-nothing-to-evaluate", lambda w, d: ["--out", d / "out"], "nothing to evaluate")

row("07", "no-refs-generated-missing", lambda w, d: ["--generated", d / "nope.jsonl", "--out", d / "out"], "no such file")

row("07", "no-refs-generated-empty", lambda w, d: ["--generated", write(d, "g.jsonl", ""), "--out", d / "out"], "holds no captions")

row("07", "no-refs-generated-bad-line", lambda w, d: ["--generated", write(d, "g.jsonl", '{"image_id": 1, "level": 1}\n'),
                                                     "--out", d / "out"], "caption")

row("07", "no-refs-generated-level-zero", lambda w, d: ["--generated", jsonl_lines(w.generated, d, first(level=0)),
                                                       "--out", d / "out"], "level 0 is outside")

row("07", "no-refs-checkpoint-without-features", lambda w, d: ["--checkpoint", w.trusted, "--out", d / "out"],
    "--checkpoint needs --features")

row("07", "generated-level-superscript", lambda w, d: w.eval_args(d / "out", "--generated", jsonl_lines(
    w.generated, d, first(level="1\u00b2"), "g.jsonl")), "'level' must be a level number")

row("07", "generated-level-arabic-indic", lambda w, d: w.eval_args(d / "out", "--generated", jsonl_lines(
    w.generated, d, first(level="\u0661"), "g.jsonl")), "'level' must be a level number")

row("07", "generated-image-id-superscript", lambda w, d: w.eval_args(d / "out", "--generated", jsonl_lines(
    w.generated, d, first(image_id="11\u00b2"), "g.jsonl")), "left out 1 captions of images that are not test images", "ok")

row("07", "features-test-image-a-dataset-found-at-open", lambda w, d: ["--refs", w.captions, "--checkpoint", w.trusted, "--out", d / "out",
                                                                      "--spice", "off", "--features", h5_changed(w.features, d, DATASET_12)],
    "image 12: is a dataset, not a group")

# -- names that would leave --out: a run's name names its files (generated/NAME.jsonl, NAME.meta.json) ------
def bad_names(d: Path) -> dict:
    """Names that are no file name of their own, by a short id (the absolute one inside ``d``, where the row looks)."""
    return {"up-two": "../../escaped", "up-three": "../../../escaped2", "slash": "a/b", "backslash": "a\\b",
            "absolute": str(d / "abs"), "dot-dot": "..", "dot": ".", "newline": "x\ny", "control": "x\x01y",
            "del": "x\x7fy", "nul": "x\x00y", "trailing-slash": "escaped/", "too-long": "n" * 240}


def named_runs(how: str, name: str, w: World, d: Path) -> list:
    """07's arguments with one run named ``name``; --out is d/sub/eval, so that "../../x" would land inside d."""
    if how == "checkpoint":
        runs = ["--features", w.features, "--checkpoint", f"{name}={w.trusted}"]
    elif how == "generated":
        runs = ["--generated", f"{name}={w.generated}"]
    else:
        runs = ["--features", w.features, "--checkpoint", w.trusted, "--name", name]
    return ["--refs", w.captions, *runs, "--out", d / "sub" / "eval", "--spice", "off", "--decode-steps", "1"]


for how in ("checkpoint", "generated", "name"):
    for which in bad_names(Path("d")):
        row("07", f"run-name-{which}-by-{how}", lambda w, d, how=how, which=which: named_runs(
            how, bad_names(d)[which], w, d), "a run's name names its files in --out")

row("07", "run-name-empty-by-name", lambda w, d: named_runs("name", "", w, d), "argument --name: an empty value")

row("07", "run-name-with-dots-inside", lambda w, d: named_runs("generated", "v1.2", w, d), "generated/v1.2.jsonl|v1.2", "ok")


# -- 07 --combine: the evaluation folders it reads -----------------------------------------------------


def evaluated(w: World, d: Path, change=None) -> Path:
    """A 07 folder of the toy world's captions, its per_image.jsonl changed by ``change`` (see jsonl_lines)."""
    from badinput import run_stage

    folder = d / "eval"
    outcome = run_stage("07", w.eval_args(folder))
    assert outcome.code == 0, outcome.text[-2000:]
    if change == "DELETE":
        (folder / "per_image.jsonl").unlink()
    elif change is not None:
        jsonl_lines(folder / "per_image.jsonl", folder, change, "per_image.jsonl")
    return folder


def combine_args(w: World, d: Path, change=None) -> list:
    return ["--combine", evaluated(w, d, change), "--out", d / "combined"]


row("07", "combine-no-metrics", lambda w, d: ["--combine", d, "--out", d / "combined"], "no such file|not found")
COMBINE_CASES = [
    ("bad-line", lambda r: r + ["{"], "not valid json"),
    ("empty", lambda r: [], "holds no line with images of the runs"),
    ("other-runs", lambda r: [dict(x, run="renamed") for x in r], "holds no line with images of the runs"),
    ("no-in-range", first(in_range="DELETE"), "missing key"),
    ("level-string", first(level="1"), "'level' must be a level number"),
    ("level-outside", first(level=9), "'level' must be a level number 1..7"),
    ("in-range-short", lambda r: [dict(r[0], in_range=r[0]["in_range"][1:])] + r[1:], "'in_range' must be a list of 3"),
    ("in-range-number", lambda r: [dict(r[0], in_range=[1] * 3)] + r[1:], "'in_range' must hold true or false"),
    ("cider-string", lambda r: [dict(r[0], CIDEr=["0.5"] * 3)] + r[1:], "'CIDEr' must hold numbers or null"),
    ("images-differ", lambda r: r[:1] + [dict(r[1], image_ids=r[1]["image_ids"][::-1])] + r[2:],
     "its images differ from the first line's"),
]
for name, change, fragment in COMBINE_CASES:
    row("07", f"combine-per-image-{name}", lambda w, d, change=change: combine_args(w, d, change), fragment)
row("07", "tables-without-combine", lambda w, d: w.eval_args(d / "out", "--tables", d / "tables"), "give it with --combine")
row("07", "combine-without-per-image", lambda w, d: combine_args(w, d, "DELETE"), "no intervals", "ok")

# -- 07 --combine --tables FOLDER: it replaces only the tables it wrote there, unchanged since --------------------
row("07", "combine-tables-a-file", lambda w, d: combine_args(w, d) + ["--tables", write(d, "t.csv", "mine\n")],
    "is a file, not a folder")
row("07", "combine-tables-the-out-folder", lambda w, d: combine_args(w, d) + ["--tables", d / "combined"],
    "is both --out and --tables|is both --tables and --out")
row("07", "combine-tables-holds-the-users-results", lambda w, d: combine_args(w, d) + [
    "--tables", write(d / "tables", "results.csv", "model,mine\n").parent],
    "results.csv: was not written by 07 --tables (or was edited since): it is kept")

def tables_again(w: World, d: Path, change=None) -> list:
    """07 --combine --tables run once into d/tables, ``change`` applied to the folder; the row runs it again."""
    from badinput import _must, run_stage

    args = combine_args(w, d) + ["--tables", d / "tables"]
    _must(run_stage("07", args))
    if change:
        change(d / "tables")
    return args

row("07", "combine-tables-its-own-tables", lambda w, d: tables_again(w, d), "results.csv", "ok")
row("07", "combine-tables-edited-since", lambda w, d: tables_again(w, d, lambda t: write(t, "results.csv", "model,edited\n")),
    "results.csv: was not written by 07 --tables (or was edited since): it is kept")

def test_07_cache_is_keyed_by_the_features_file(world: World, tmp_path, capsys):
    """Captions generated from one feature file are not reused after --features changes."""
    from conftest import import_script

    from clid.caption.cached import generate_cached
    from clid.data.store import FeatureStore

    script = import_script("07_eval.py", "eval_cache_by_features")
    data = json.loads(world.captions.read_text())
    image_ids = [str(im["cocoid"]) for im in data["images"] if im["split"] == "test"]
    other = h5_changed(world.features, tmp_path, first_group(poke("features", (0, 0), 5.0)), "other.h5")
    cache = tmp_path / "generated" / "trusted.jsonl"
    for features, expected in ((world.features, "generating"), (world.features, "reusing"), (other, "generating")):
        args = script.parse_args(["--refs", str(world.captions), "--features", str(features),
                                  "--checkpoint", str(world.trusted), "--out", str(tmp_path), "--decode-steps", "1"])
        store = FeatureStore(features)
        generate_cached(world.trusted, cache, args, image_ids, store, None)
        store.close()
        assert expected in capsys.readouterr().out


# -- an output that is an input: a checkpoint run writes generated/RUN.jsonl and RUN.meta.json in --out ---------
def generated_in_out(w: World, d: Path, name: str, how=lambda d, p: p) -> list:
    """07's arguments with a checkpoint run "ck" and the user's --generated file at d/eval/generated/``name``,
    given as ``how(d, path)``."""
    mine = write(d / "eval" / "generated", name, w.generated.read_text())
    return ["--refs", w.captions, "--features", w.features, "--checkpoint", f"ck={w.trusted}", "--generated",
            f"mine={how(d, mine)}", "--out", d / "eval", "--spice", "off", "--decode-steps", "1"]

row("07", "generated-is-a-checkpoint-runs-captions", lambda w, d: generated_in_out(w, d, "ck.jsonl"),
    "run ck's captions")

row("07", "generated-is-a-checkpoint-runs-cache-record", lambda w, d: generated_in_out(w, d, "ck.meta.json"),
    "run ck's cache record")

row("07", "generated-a-link-to-a-checkpoint-runs-captions", lambda w, d: generated_in_out(
    w, d, "ck.jsonl", lambda d, p: link_to(d, "mine.jsonl", p)), "run ck's captions")

row("07", "generated-a-hard-link-to-a-checkpoint-runs-captions", lambda w, d: generated_in_out(
    w, d, "ck.jsonl", lambda d, p: link_to(d, "mine.jsonl", p, hard=True)), "run ck's captions")

row("07", "out-is-the-checkpoint", lambda w, d: ["--refs", w.captions, "--features", w.features, "--checkpoint",
                                                 (ck := checkpoint_copy(w.trusted, d, name="ck")), "--out", ck / ".." / "ck"],
    "is also the input --checkpoint")

row("07", "out-metrics-is-the-refs", lambda w, d: w.eval_args(d / "eval", "--refs", write(
    d / "eval", "metrics.json", w.captions.read_text())), "is also the input --refs")


# -- --force replaces only what 07 wrote: a file of its folder edited since (written.json holds each one's digest) --
def eval_edited(w: World, d: Path, name: str, *extra) -> list:
    """07's arguments of an evaluation already written to d/eval, whose file ``name`` the user has since edited."""
    _must(run_stage("07", w.eval_args(d / "eval")))
    with open(d / "eval" / name, "ab") as f:
        f.write(b"\nMy notes on the table above.\n")
    return w.eval_args(d / "eval", *extra)

for name in ("report.md", "metrics.json", "control_precision.png"):
    for force in ((), ("--force",)):
        row("07", f"rerun-keeps-an-edited-{name.split('.')[0]}{'-force' if force else ''}",
            lambda w, d, name=name, force=force: eval_edited(w, d, name, *force), f"{name}: was edited since 07 wrote it")

row("07", "rerun-over-its-own-folder", lambda w, d: after("07", w.eval_args(d / "eval"), w.eval_args(d / "eval")),
    "wrote", "ok")


row("07", "tables-empty", lambda w, d: combine_args(w, d) + ["--tables", ""], "argument --tables: an empty value")
row("07", "tables-under-a-file", lambda w, d: combine_args(w, d) + ["--tables", write(d, "t", "x") / "sub"], "which is a file, not a folder")
row("07", "tables-written-json-of-the-users", lambda w, d: combine_args(w, d) + ["--tables", write(d / "tables", "written.json", "[1]").parent],
    "written.json")


@pytest.mark.parametrize("row", table.params())
def test_bad_input(row: Row, world: World, tmp_path):
    check_row(row, world, tmp_path)
