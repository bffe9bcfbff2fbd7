"""The CI smoke test of bench/bench_scale.py: this tree's path at N = 20,000 self-generated captions (the
benchmark at full size, against today's path, is run by hand: docs/scale.md)."""
import json

import pytest
from conftest import ROOT, run_one_thread


@pytest.mark.slow
def test_bench_scale_runs_at_20000_captions(tmp_path):
    out = tmp_path / "scale.json"
    proc = run_one_thread(ROOT / "bench" / "bench_scale.py", "--captions", "20000", "--images", "200", "--steps", "2",
                          "--eta", "1", "--paths", "new", "--work", tmp_path / "work", "--json", out, timeout=900)
    assert "| 06 clid: start-up to the first optimizer step (s) |" in proc.stdout
    numbers = json.loads(out.read_text())
    assert numbers["captions"] == 20000
    new = numbers["columns"]["new"]
    for stage in ("04", "05", "06"):
        assert 0 < new[stage]["startup_s"] < 900 and 0.1 < new[stage]["peak_rss_gb"] < 20
    assert new["04"]["per_step_us"] > 0 and new["06"]["per_round_ms"] >= 0 and new["06"]["beyond_model_gb"] > 0
    log = (tmp_path / "work" / "06-new.log").read_text()
    assert "iteration 2:" in log and "checkpoint:" in log  # three rounds of one step each, as asked
