"""Bad input of 00_demo_data.py: one row per malformed input (tests/badinput.py runs and checks them)."""
from __future__ import annotations

from pathlib import Path

import pytest
from badinput import Row, Table, World, _must, check_row, run_stage, write

table = Table()
row = table.row

row("00", "all-splits-empty", lambda w, d: ["--out", d / "demo", "--n-train", "0", "--n-val", "0", "--n-test", "0"], "must not all be 0")

row("00", "out-a-file", lambda w, d: ["--out", write(d, "demo", "x"), "--small", "--skip-features"], "is a file")

row("00", "hallucinations-unknown", lambda w, d: ["--out", d / "demo", "--small", "--hallucinations", "rare"], "invalid choice")


def demo_then_smaller(w: World, d: Path) -> list:
    _must(run_stage("00", ["--out", d / "demo", "--skip-features", "--n-train", "6", "--n-val", "2", "--n-test", "2",
                           "--size", "96", "--workers", "1"]))
    return ["--out", d / "demo", "--skip-features", "--n-train", "3", "--n-val", "1", "--n-test", "1", "--size", "96",
            "--workers", "1"]

row("00", "rebuilt-smaller-in-the-same-folder", demo_then_smaller, "removed 5 images of an earlier, larger world", "ok")


@pytest.mark.parametrize("row", table.params())
def test_bad_input(row: Row, world: World, tmp_path):
    check_row(row, world, tmp_path)
