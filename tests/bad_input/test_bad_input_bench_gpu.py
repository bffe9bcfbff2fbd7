"""Bad input of bench/bench_gpu.py and bench/gpu_check.sh: one row per malformed input (tests/badinput.py runs and checks them)."""
from __future__ import annotations

import pytest
from badinput import Row, Table, World, check_row
from conftest import ROOT

table = Table()
row = table.row

row("bench_gpu", "repeats-zero", lambda w, d: ["--smoke", "--repeats", "0"], "argument --repeats")

row("bench_gpu", "repeats-text", lambda w, d: ["--smoke", "--repeats", "five"], "argument --repeats")

row("bench_gpu", "budget-negative", lambda w, d: ["--smoke", "--budget", "-5"], "--budget must be a positive")

row("bench_gpu", "budget-text", lambda w, d: ["--smoke", "--budget", "soon"], "argument --budget")

row("bench_gpu", "section-unknown", lambda w, d: ["--smoke", "--sections", "train05"], "argument --sections")

row("bench_gpu", "cuda-without-a-gpu", lambda w, d: ["--device", "cuda", "--budget", "-1"], "no gpu here|--budget must be")


@pytest.mark.parametrize("args,message", [
    (["--cpu-dry-run", "OUT", "soon"], "SECONDS must be a whole number of seconds, at least 60, not 'soon'"),
    (["OUT", "30"], "SECONDS must be a whole number of seconds, at least 60, not '30'"),
    (["--cpu-dry-run"], "usage: bash bench/gpu_check.sh [--cpu-dry-run] OUTDIR [SECONDS]"),
])
def test_gpu_check_arguments(tmp_path, args, message):
    """bench/gpu_check.sh refuses a bad time budget or a missing OUTDIR in one line, before it writes anything."""
    import subprocess

    argv = [str(tmp_path / a) if a == "OUT" else a for a in args]
    proc = subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh"), *argv], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode != 0 and message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "OUT").exists()


@pytest.mark.parametrize("row", table.params())
def test_bad_input(row: Row, world: World, tmp_path):
    check_row(row, world, tmp_path)
