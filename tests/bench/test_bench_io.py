"""bench/bench_io.py at a toy size: every row (float32 and float16, 0, 2 and 4 workers) is measured, the float16
file is half the float32 one's payload, and the summary names the ratio against the random-read bound."""
import json

import pytest
from conftest import run_script


@pytest.mark.slow
def test_bench_io_measures_every_row(tmp_path):
    out = tmp_path / "io.json"
    proc = run_script("bench/bench_io.py", "--work", tmp_path, "--gb", "0.02", "--batch", "4", "--batches", "3",
                      "--json", out, env={"OMP_NUM_THREADS": "1"}, timeout=600)
    result = json.loads(out.read_text())
    rows = {(r["dtype"], r["workers"]): r for r in result["rows"]}
    assert set(rows) == {(d, w) for d in ("float32", "float16") for w in (0, 2, 4)}
    for r in rows.values():
        assert r["loader_batches_s"] > 0 and r["pread_mb_s"] > 0
        assert abs(r["ratio"] - r["loader_mb_s"] / r["pread_mb_s"]) < 0.01
    assert rows[("float16", 0)]["file_gb"] < 0.6 * rows[("float32", 0)]["file_gb"]
    assert "of the random-read bound's best" in proc.stdout and "target >= 80%" in proc.stdout
    too_many = run_script("bench/bench_io.py", "--work", tmp_path, "--gb", "0.02", "--batches", "100", check=False)
    assert too_many.returncode == 2 and "give a larger --gb" in too_many.stderr
