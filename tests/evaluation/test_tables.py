"""The README's demo tables against the committed measurement files (clid.evaluation.tables, python -m clid.tables)."""
import contextlib
import io
import re

import pytest
from conftest import ROOT

from clid.base.files import DataError
from clid.evaluation.tables import markdown, readme_blocks, readme_problems
from clid.run.measured import context_lines, write_measurement


def test_the_readme_prints_its_measurement_files():
    """Every generated block of the README is what its docs/measurements/<date>-demo folder prints."""
    blocks = readme_blocks((ROOT / "README.md").read_text(encoding="utf-8"))
    if not blocks:
        pytest.skip("the README has no generated table yet: its demo tables are copied by hand and not re-measured "
                    "(the evidence run of docs/demo-notes.md writes the first measurement folder)")
    assert all(folder.startswith("docs/measurements/") and folder.endswith("-demo") for folder, _ in blocks)
    assert readme_problems(ROOT / "README.md", ROOT) == []


def test_a_block_that_differs_from_its_folder_is_found(tmp_path):
    from clid.tables import main

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "results.csv").write_text("model,CP average\ntrusted-only,30.8 ± 1.0\nCLID,69.6 ± 9.9\n")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        main([str(tmp_path / "m")])
    block = printed.getvalue().replace(str(tmp_path / "m"), "m")
    readme = tmp_path / "README.md"
    readme.write_text(f"# Results\n\n{block}\nMore text.\n")
    assert readme_blocks(readme.read_text()) and readme_problems(readme, tmp_path) == []
    readme.write_text(f"# Results\n\n{block.replace('69.6', '76.9')}\nMore text.\n")
    assert readme_problems(readme, tmp_path) == [f"{readme}: the tables of m differ from what `python -m clid.tables m` "
                                                 "prints; paste its output between the markers"]
    with pytest.raises(DataError, match="differ from what `python -m clid.tables m` prints"):
        main(["--check", str(readme)])  # (python -m clid.tables --check README.md: that line, exit 1)


def test_the_benchmark_docs_print_their_measurement_files():
    """docs/running.md's CPU tables are what their docs/measurements/<date>-cpu folder prints."""
    running = ROOT / "docs" / "running.md"
    blocks = readme_blocks(running.read_text(encoding="utf-8"))
    assert [folder for folder, _ in blocks] and all(f.endswith("-cpu") for f, _ in blocks)
    assert readme_problems(running, running.parent) == []
    for folder, body in blocks:
        names = {p.stem for p in (running.parent / folder).glob("bench_*.json")}
        assert {"bench_help", "bench_sampler_avx512"} <= names and all(f"`{n}.md`" in body for n in names)


def test_a_benchmark_folder_prints_each_summary_with_its_context(tmp_path):
    context = context_lines("python bench/bench_x.py --out DIR")
    write_measurement(tmp_path, "bench_x", context, ["a table"], [{"s": 1.0}],
                      {"header": ["op", "ratio"], "rows": [["`kth_value`", "1.63x"]]})
    text = markdown(tmp_path)
    assert text.startswith("`bench_x.md`: date: ") and "load average (1, 5, 15 min) before: " in text
    assert "command:" not in text and "| op | ratio |\n|---|---|\n| `kth_value` | 1.63x |\n" in text
    assert (tmp_path / "bench_x.md").read_text().startswith("# bench_x\n\n- date: ")
    (tmp_path / "bench_y.json").write_text('{"rows": []}')
    with pytest.raises(DataError, match="bench_y.json.*not a benchmark's measurement"):
        markdown(tmp_path)



def table_numbers(text: str) -> dict:
    """``{(model, measure, level): [values]}`` from a README's Markdown tables: the per-level tables (rows
    "control precision, MODEL", "CIDEr (trusted refs), MODEL", "CIDEr (long refs), MODEL"; columns L1, L2, ...)
    and the per-model ones (first column "method" or "model"; columns "CP L1", "CIDEr L1", "CIDEr long L3",
    "long L4", ...); each value as shown, without its ± or interval, once a table that shows it."""
    measures = {"control precision": "CP", "CIDEr (trusted refs)": "CIDEr", "CIDEr (long refs)": "long"}
    columns = re.compile(r"(CP|CIDEr|CIDEr long|long) L(\d+)$")
    found, header = {}, None
    for line in text.splitlines() + [""]:
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
            continue
        if set(line) <= set("|-: "):
            continue
        for title, cell in zip(header[1:], cells[1:]):
            value = re.split(r" ±| \[", cell)[0]
            if value in ("", "–"):
                continue
            if header[0] == "" and ", " in cells[0] and re.fullmatch(r"L\d+", title):
                measure, model = cells[0].split(", ", 1)
                if measure in measures:
                    found.setdefault((model, measures[measure], int(title[1:])), []).append(value)
            elif header[0] in ("method", "model") and (match := columns.match(title)):
                measure = {"CP": "CP", "CIDEr": "CIDEr"}.get(match[1], "long")
                found.setdefault((cells[0], measure, int(match[2])), []).append(value)
    return found


def test_every_readme_row_names_one_model():
    """A model's name in the README's results tables stands for one model: wherever two tables show the same
    model, measure and level, they show the same number (two different models once shared "extended-only")."""
    numbers = table_numbers((ROOT / "README.md").read_text(encoding="utf-8"))
    assert len([key for key, values in numbers.items() if len(values) > 1]) >= 12  # (CLID, trusted-only: L1-L6)
    assert {key: values for key, values in numbers.items() if len(set(values)) > 1} == {}


def test_two_models_under_one_name_are_found():
    text = ("| | L1 | L4 |\n|---|---:|---:|\n| control precision, extended-only | 100.0 ± 0.0 | 66.1 ± 33.3 |\n\n"
            "| method | CP L1 | CP L4 | CIDEr long L4 |\n|---|---:|---:|---:|\n| extended-only | 100.0 | 91.7 | 18.5 |\n")
    assert table_numbers(text) == {("extended-only", "CP", 1): ["100.0", "100.0"],
                                   ("extended-only", "CP", 4): ["66.1", "91.7"], ("extended-only", "long", 4): ["18.5"]}
