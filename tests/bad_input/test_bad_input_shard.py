"""Bad input of python -m clid.shard: one row per malformed input (tests/badinput.py runs and checks them)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from badinput import SELFGEN_RECORDS, Row, Table, World, check_row, write

table = Table()
row = table.row

for name in ("quality", "selfgen.json", "x.hdf"):
    row("shard", f"merge-out-suffix-{name}", lambda w, d, name=name: ["merge", d / name, "--num-shards", "2"], "must end in")

def parts(w: World, d: Path, records_of: list) -> Path:
    """Two part files of ``out.jsonl`` (2 shards) holding ``records_of[k]``; returns the output path."""
    out = d / "out.jsonl"
    from clid.base.files import write_jsonl
    for k, records in enumerate(records_of):
        write_jsonl(out.with_name(f"out.jsonl.part-{k:05d}-of-{len(records_of):05d}"), records)
    return out

def h5_parts(w: World, d: Path, source: Path, name="out.h5") -> Path:
    """Two part files of OUT (2 shards), both copies of ``source``: every record in both."""
    out = d / name
    for k in range(2):
        shutil.copy(source, out.with_name(f"{name}.part-{k:05d}-of-00002"))
    return out

row("shard", "merge-duplicate-across-jsonl-parts", lambda w, d: ["merge", parts(w, d, [SELFGEN_RECORDS(w)[:3], SELFGEN_RECORDS(w)[2:5]]),
                                                                  "--num-shards", "2"], "appears in two parts", leaves_output=True)

row("shard", "merge-two-copies-of-a-shard", lambda w, d: ["merge", parts(w, d, [SELFGEN_RECORDS(w), SELFGEN_RECORDS(w)]),
                                                           "--num-shards", "2"], "appears in two parts", leaves_output=True)

row("shard", "merge-duplicate-quality-rows", lambda w, d: ["merge", h5_parts(w, d, w.quality), "--num-shards", "2"],
    "appears in two parts", leaves_output=True)

row("shard", "merge-duplicate-image-groups", lambda w, d: ["merge", h5_parts(w, d, w.saliency), "--num-shards", "2"],
    "appears in two parts", leaves_output=True)

row("shard", "merge-a-part-missing", lambda w, d: ["merge", parts(w, d, [SELFGEN_RECORDS(w)[:2]]).with_name("x.jsonl"),
                                                    "--num-shards", "3"], "parts missing", leaves_output=True)

row("shard", "merge-part-not-jsonl", lambda w, d: ["merge", (parts(w, d, [SELFGEN_RECORDS(w)[:2], []]), write(
    d, "out.jsonl.part-00001-of-00002", "{oops\n"))[0], "--num-shards", "2"], "not valid json", leaves_output=True)

row("shard", "merge-part-not-hdf5", lambda w, d: ["merge", (h5_parts(w, d, w.quality), write(
    d, "out.h5.part-00001-of-00002", "oops"))[0], "--num-shards", "2"], "not an hdf5 file", leaves_output=True)

row("shard", "merge-parts-mix-groups-and-arrays", lambda w, d: ["merge", (shutil.copy(w.quality, d / "out.h5.part-00000-of-00002"),
                                                                          shutil.copy(w.saliency, d / "out.h5.part-00001-of-00002"))
                                                                 and d / "out.h5", "--num-shards", "2"], "mix image groups",
    leaves_output=True)

row("shard", "merge-nothing-to-do", lambda w, d: ["merge", w.selfgen, "--num-shards", "2"], "already exists", "ok")


@pytest.mark.parametrize("row", table.params())
def test_bad_input(row: Row, world: World, tmp_path):
    check_row(row, world, tmp_path)
