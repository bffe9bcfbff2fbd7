"""Bad input of python -m clid.demo.truth: one row per malformed input (tests/badinput.py runs and checks them)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from badinput import Row, Table, World, check_row, first_rows, h5_changed, jsonl_lines

table = Table()
row = table.row

def truth_args(w: World, d: Path, selfgen=None, *extra) -> list:
    return ["--selfgen", selfgen or jsonl_lines(w.selfgen, d, lambda rows: [dict(r, truth={"hallucinated": 0})
                                                                             for r in rows], "t.jsonl"),
            "--quality", w.quality, "--out", d / "truth", *extra]

row("truth", "selfgen-without-truth", lambda w, d: truth_args(w, d, w.selfgen), "no 'truth'")

row("truth", "quality-missing", lambda w, d: truth_args(w, d, None, "--quality", d / "nope.h5"), "no such file|not found")

row("truth", "quality-of-other-captions",
    lambda w, d: truth_args(w, d, None, "--quality", h5_changed(w.quality, d, first_rows(0))), "scores none of the captions")

row("truth", "run-not-a-folder", lambda w, d: truth_args(w, d, None, "--run", f"CLID={d / 'nope'}"), "--run must be")

row("truth", "run-without-log", lambda w, d: truth_args(w, d, None, "--run", f"CLID={w.trusted}"),
    "selection_log.jsonl")

row("truth", "difficulty-of-other-captions",
    lambda w, d: truth_args(w, d, None, "--difficulty", write_difficulty(d)), "no difficulty for")

row("truth", "combine-missing", lambda w, d: ["--combine", d / "nope", "--out", d / "all"], "no such file|not found")

row("truth", "no-inputs", lambda w, d: ["--out", d / "t"], "are required")

def write_difficulty(d: Path) -> Path:
    from clid.base.files import write_arrays

    write_arrays(d / "difficulty.h5", {"id": np.asarray(["someone_else"], dtype=object), "difficulty": np.zeros(1)})
    return d / "difficulty.h5"


@pytest.mark.parametrize("row", table.params())
def test_bad_input(row: Row, world: World, tmp_path):
    check_row(row, world, tmp_path)
