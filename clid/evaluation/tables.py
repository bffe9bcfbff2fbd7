"""The README's demo tables as files: written from 07 --combine's metrics.json, printed as Markdown, checked.

A measurement folder (``docs/measurements/<date>-demo/``) holds one CSV a table (:data:`TABLES`): a header
row, then one row a model, its first cell the model's name (unique within the table), the others the cells as
the README shows them. :func:`markdown` prints the folder's tables; in the README each printed block stands
between ``<!-- tables: FOLDER -->`` and ``<!-- end tables -->``, and :func:`readme_problems` says where a block
differs from what its folder prints.
"""
from __future__ import annotations

import csv
import json
import re
from pathlib import Path

from clid.base.files import (
    WRITTEN,
    DataError,
    atomic_path,
    check_folder_place,
    not_written,
    record_written,
    written_record,
)

TABLES = {  # file: title
    "results.csv": "Mean ± standard deviation over the seeds (control precision in %, CIDEr x100)",
    "intervals.csv": "Mean with its 95% interval over seeds and test images",
    "claims.csv": "The paper's claims on the demo",
}
BLOCK = re.compile(r"<!-- tables: (?P<folder>[^ ]+) -->\n(?P<body>.*?)<!-- end tables -->", re.S)


def _cell(row: dict | None, field: str, scale: float = 100.0) -> str:
    if not row or row.get(field) is None:
        return "–"
    std = row.get(f"{field}_std")
    value = f"{row[field] * scale:.1f}"
    return value if std is None else f"{value} ± {std * scale:.1f}"


def _iv(iv: dict | None, scale: float = 100.0) -> str:
    if not iv or iv.get("value") is None:
        return "–"
    value = f"{iv['value'] * scale:.1f}"
    return value if iv.get("low") is None else f"{value} [{iv['low'] * scale:.1f}, {iv['high'] * scale:.1f}]"


def demo_tables(metrics: dict) -> dict[str, list[list[str]]]:
    """The tables of a combined metrics.json (07 --combine): file name -> rows, the header first."""
    n_levels = len(metrics["levels"])
    longs = sorted({int(n) for m in metrics["methods"].values() for n in m["long_refs"]})
    header = (["model"] + [f"CP L{n}" for n in range(1, n_levels + 1)] + ["CP average", "CIDEr L1", "CIDEr L2"]
              + [f"CIDEr long L{n}" for n in longs])
    results = [header]
    for name, m in metrics["methods"].items():
        levels, long = m["levels"], m["long_refs"]
        results.append([name] + [_cell(levels.get(str(n)), "control_precision") for n in range(1, n_levels + 1)]
                       + [_cell(m["average"], "control_precision")]
                       + [_cell(levels.get(str(n)), "CIDEr") for n in (1, 2)]
                       + [_cell(long.get(str(n)), "CIDEr") for n in longs])
    tables = {"results.csv": results}
    intervals = metrics.get("intervals")
    if intervals:
        rows = [["model", "CP average", *(f"CP L{n}" for n in range(1, n_levels + 1)), "difference from CLID, CP average"]]
        for name, m in intervals["methods"].items():
            difference = intervals["differences"].get(name, {}).get("cp_average")
            rows.append([name, _iv(m["cp_average"]), *(_iv(m["cp"].get(str(n))) for n in range(1, n_levels + 1)),
                         _iv(difference)])
        tables["intervals.csv"] = rows
        claims = [["claim", "against", "verdict", "statistic", "interval (x100)"]]
        for c in intervals["claims"]:
            shown = ("; ".join(f"L{n}: {_iv(iv)}" for n, iv in c["levels"].items()) if c["kind"] == "ratio"
                     else _iv(c["interval"]))
            claims.append([f"({c['claim']}) {c['text']}", c["against"], c["verdict"], c["statistic"], shown])
        tables["claims.csv"] = claims
    return tables


def check_tables_folder(folder) -> None:
    """Refuse, before any work, a ``--tables`` folder that 07 cannot write into: a file, or a folder holding a
    table file that 07 did not write there or that was edited since (``written.json``, clid.base.files)."""
    folder = Path(folder)
    check_folder_place(folder, "--tables")
    foreign = not_written(folder, TABLES)
    if (folder / WRITTEN).exists() and written_record(folder) is None:
        foreign.insert(0, WRITTEN)
    if foreign:
        raise DataError(folder / foreign[0], None, "was not written by 07 --tables (or was edited since): it is kept; "
                                                   "give another --tables folder, or move the file away yourself")


def write_tables(metrics: dict, folder) -> list[Path]:
    """Write :func:`demo_tables` into ``folder``, each file atomically, and their digests (``written.json``);
    return the files."""
    folder = Path(folder)
    check_tables_folder(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, rows in demo_tables(metrics).items():
        with atomic_path(folder / name) as tmp, open(tmp, "w", newline="", encoding="utf-8") as f:
            csv.writer(f, lineterminator="\n").writerows(rows)
        written.append(folder / name)
    record_written(folder, TABLES)
    return written


def read_table(path) -> list[list[str]]:
    """A table file's rows; a row of another width than the header, or a repeated name, is a DataError."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    if not rows:
        raise DataError(path, "", "holds no header row")
    seen = set()
    for number, row in enumerate(rows[1:], 2):
        if len(row) != len(rows[0]):
            raise DataError(path, f"line {number}", f"has {len(row)} cells, the header {len(rows[0])}")
        if row[0] in seen:
            raise DataError(path, f"line {number}", f"model {row[0]!r} appears twice: every row names its own model")
        seen.add(row[0])
    return rows


def bench_markdown(folder) -> str:
    """The Markdown of a benchmark folder (``docs/measurements/<date>-cpu``): per ``bench_*.json`` (written by
    clid.run.measured), a line of its context (date, commit, CPU, load) and its summary table."""
    text = ""
    for path in sorted(Path(folder).glob("bench_*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            context, header, rows = data["context"], data["summary"]["header"], data["summary"]["rows"]
        except (ValueError, KeyError, TypeError) as e:
            raise DataError(path, "", f"is not a benchmark's measurement (context and summary): {e}") from None
        kept = [line for line in context if not line.startswith("command:")]
        text += (f"`{path.with_suffix('.md').name}`: " + "; ".join(kept) + "\n\n| " + " | ".join(header)
                 + " |\n|" + "---|" * len(header) + "\n" + "".join("| " + " | ".join(r) + " |\n" for r in rows) + "\n")
    return text


def markdown(folder) -> str:
    """The README's Markdown of a measurement folder's tables (those of :data:`TABLES` it holds, in that order;
    a benchmark folder's, :func:`bench_markdown`)."""
    folder = Path(folder)
    if any(folder.glob("bench_*.json")):
        return bench_markdown(folder)
    found = [name for name in TABLES if (folder / name).is_file()]
    if not found:
        raise DataError(folder, "", f"holds none of the table files {', '.join(TABLES)}")
    text = ""
    for name in found:
        rows = read_table(folder / name)
        text += (f"**{TABLES[name]}** (`{name}`)\n\n| " + " | ".join(rows[0]) + " |\n|---|"
                 + "---:|" * (len(rows[0]) - 1) + "\n" + "".join("| " + " | ".join(r) + " |\n" for r in rows[1:]) + "\n")
    return text


def readme_blocks(text: str) -> list[tuple[str, str]]:
    """(folder, body) of every generated block of a README's text."""
    return [(m["folder"], m["body"]) for m in BLOCK.finditer(text)]


def readme_problems(readme, root) -> list[str]:
    """A line per generated block of ``readme`` that differs from what its folder (relative to ``root``) prints."""
    problems = []
    for folder, body in readme_blocks(Path(readme).read_text(encoding="utf-8")):
        if body.strip() != markdown(Path(root) / folder).strip():
            problems.append(f"{readme}: the tables of {folder} differ from what `python -m clid.tables {folder}` "
                            "prints; paste its output between the markers")
    return problems
