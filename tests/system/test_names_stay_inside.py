"""Nothing is written outside --out: every command that takes a name which becomes part of a path (07's run names by
--checkpoint NAME=, --generated NAME= and --name; 01's image ids, which name HDF5 groups and preview files; the
caption command's --name and --compare names, which label the gallery's columns) is run with names that would leave
the folder. Each run is refused in one line or writes only inside the folder of its outputs: the tree of the test's
folder outside it is the same before and after."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from badinput import World, run_stage

pytestmark = pytest.mark.slow  # (each case runs a command against the bad-input world)

BAD_NAMES = {"up-one": "../x", "up-two": "../../escaped", "slash": "a/b", "backslash": "a\\b", "dot": ".",
             "dot-dot": "..", "newline": "x\ny", "nul": "x\x00y", "control": "x\x01y", "trailing-slash": "escaped/",
             "absolute": "ABSOLUTE"}  # (ABSOLUTE: a path inside the test's folder, outside --out)


def tree(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def commands(w: World, root: Path, name: str) -> dict[str, tuple[str, list]]:
    """Each way a name reaches a path: (stage, argv), every output under root/inside/deep."""
    deep = root / "inside" / "deep"
    ids = root / "list.json"
    ids.write_text(json.dumps([{"image_id": 1, "file_name": "1.png"}, {"image_id": name, "file_name": "107899.png"}]))
    runs = ["--refs", w.captions, "--out", deep / "eval", "--spice", "off", "--decode-steps", "1"]
    caption = ["--checkpoint", w.trusted, "--features", w.features, "--out", deep / "c.jsonl", "--device", "cpu",
               "--decode-steps", "1", "--levels", "1", "--ids", ids_file(root), "--gallery", deep / "g.html"]
    return {
        "07-checkpoint": ("07", [*runs, "--features", w.features, "--checkpoint", f"{name}={w.trusted}"]),
        "07-generated": ("07", [*runs, "--generated", f"{name}={w.generated}"]),
        "07-name": ("07", [*runs, "--features", w.features, "--checkpoint", w.trusted, "--name", name]),
        "01-list-id": ("01", ["--images", w.images, "--list", ids, "--out", deep / "s.h5", "--preview", "2"]),
        "caption-name": ("caption", [*caption, "--name", name]),
        "caption-compare": ("caption", [*caption, "--compare", f"{name}={w.generated}"]),
    }


def ids_file(root: Path) -> Path:
    path = root / "ids.txt"
    path.write_text("11\n")
    return path


@pytest.mark.parametrize("which", sorted(BAD_NAMES))
@pytest.mark.parametrize("how", ["07-checkpoint", "07-generated", "07-name", "01-list-id", "caption-name",
                                 "caption-compare"])
def test_a_name_never_writes_outside_its_folder(world: World, tmp_path, how, which):
    root = tmp_path / "probe"
    root.mkdir()
    name = str(root / "abs") if BAD_NAMES[which] == "ABSOLUTE" else BAD_NAMES[which]
    stage, argv = commands(world, root, name)[how]
    before = tree(root)
    outcome = run_stage(stage, argv)
    assert outcome.code != "traceback" and "Traceback" not in outcome.text, outcome.error + outcome.text[-1500:]
    if outcome.code != 0:  # refused: one line naming the problem
        assert any(line.startswith("error:") for line in outcome.text.splitlines()), outcome.text[-1500:]
    outside = sorted(p for p in tree(root) - before if not p.startswith("inside"))
    assert not outside, f"{how} {name!r} wrote outside its folder: {outside}"
    if how.startswith(("07", "01")):  # names of files and groups: refused, never mapped
        assert outcome.code != 0, outcome.text[-1500:]
