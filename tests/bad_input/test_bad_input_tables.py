"""Bad input of python -m clid.tables: one row per malformed input (tests/badinput.py runs and checks them).
The rows need no trained world."""
from __future__ import annotations

import pytest
from badinput import Row, Table, check_row, write

table = Table()
row = table.row

GOOD = "model,CP L1,CP average\ntrusted-only,100.0 ± 0.0,30.8 ± 1.0\nCLID,100.0 ± 0.0,69.6 ± 9.9\n"


def readme(d, body):
    """A README whose one generated block is ``body``, with the folder m/ of GOOD beside it."""
    write(d, "m/results.csv", GOOD)
    return write(d, "README.md", f"# Results\n\n<!-- tables: m -->\n{body}<!-- end tables -->\n")


TABLE = ("**Mean ± standard deviation over the seeds (control precision in %, CIDEr x100)** (`results.csv`)\n\n"
         "| model | CP L1 | CP average |\n|---|---:|---:|\n| trusted-only | 100.0 ± 0.0 | 30.8 ± 1.0 |\n"
         "| CLID | 100.0 ± 0.0 | 69.6 ± 9.9 |\n\n")

row("tables", "folder-missing", lambda w, d: [d / "nope"], "no such file|holds none of the table files")
row("tables", "folder-without-tables", lambda w, d: [write(d, "m/notes.txt", "x").parent], "holds none of the table files")
row("tables", "empty-table", lambda w, d: [write(d, "m/results.csv", "").parent], "holds no header row")
row("tables", "short-row", lambda w, d: [write(d, "m/results.csv", GOOD + "loss-remove,100.0\n").parent],
    "line 4: has 2 cells, the header 3")
row("tables", "repeated-model", lambda w, d: [write(d, "m/results.csv", GOOD + "CLID,1,2\n").parent],
    "model 'CLID' appears twice")
row("tables", "can-write-empty", lambda w, d: ["--can-write", ""], "argument --can-write: an empty value")
row("tables", "can-write-users-results", lambda w, d: ["--can-write", write(d / "t", "results.csv", "model,mine\n").parent],
    "results.csv: was not written by 07 --tables")
row("tables", "neither", lambda w, d: [], "give a measurement folder, --check README or --can-write FOLDER")
row("tables", "check-agrees", lambda w, d: ["--check", readme(d, TABLE)], "1 generated table block(s)", "ok")
row("tables", "check-changed-cell", lambda w, d: ["--check", readme(d, TABLE.replace("69.6", "76.9"))],
    "the tables of m differ")
row("tables", "check-folder-missing", lambda w, d: ["--check", write(d, "README.md", "<!-- tables: gone -->\nx\n<!-- end tables -->\n")],
    "no such file|holds none of the table files")


@pytest.mark.parametrize("row", table.params())
def test_bad_input(row: Row, tmp_path):
    check_row(row, None, tmp_path)
