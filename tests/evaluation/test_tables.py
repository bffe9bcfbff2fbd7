"""The README's demo tables against the committed measurement files (clid.evaluation.tables, python -m clid.tables)."""
import contextlib
import io

import pytest
from conftest import ROOT

from clid.evaluation.tables import readme_blocks, readme_problems


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
