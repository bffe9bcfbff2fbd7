"""The bad-input table as a whole: large, one file a command, every row's id unique."""
import importlib.util
from pathlib import Path

from badinput import SCRIPTS

HERE = Path(__file__).resolve().parent


def table_rows() -> dict:
    """Each file's rows (the files are loaded again here, under names of their own)."""
    rows = {}
    for path in sorted(HERE.glob("test_bad_input_*.py")):
        spec = importlib.util.spec_from_file_location(f"table_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        rows[path.stem.removeprefix("test_bad_input_")] = module.table.rows
    return rows


def test_the_table_is_large_covers_every_command_and_keeps_each_command_in_its_file():
    rows = table_rows()
    every = [r for file_rows in rows.values() for r in file_rows]
    assert len(every) >= 1000
    assert {r.stage for r in every} == set(SCRIPTS)
    assert len({r.id for r in every}) == len(every)
    for name, file_rows in rows.items():
        stages = {r.stage for r in file_rows}
        if name == "shared":  # inputs several commands read alike: each of its loops covers several
            assert len(stages) > 1
        else:
            assert stages == {"data" if name == "captions" else name}, name
