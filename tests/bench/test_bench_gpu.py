"""bench/bench_gpu.py, the GPU table's one command, at tiny size on the CPU: every section runs and gives its
rows, each beside its bound or peer measured in the same interleaved rounds, the GPU-only rows are left out,
and the recipe's GPU-hours are printed as their two sums."""
import json
import statistics

import pytest
from conftest import run_one_thread


@pytest.mark.slow
def test_bench_gpu_smoke_on_the_cpu(tmp_path):
    out = tmp_path / "rows.json"
    proc = run_one_thread("bench/bench_gpu.py", "--smoke", "--repeats", "2", "--json", out)
    rows = {row["path"]: row for row in json.loads(out.read_text())}
    for start in ("seq_logprob [", "token_logprob_hidden P=64 H=16 V=301", "token_logprob_hidden P=64 H=16 V=320",
                  "host share", "training step (Trainer.train_step), before", "training step, Trainer.train_step, --precision auto",
                  "training step, staged bound", "loader alone: batches/s from the HDF5 file",
                  "training step as 04 runs it from", "05 prefix scoring, levels 1-7", "05 head, one level-1 pass",
                  "05, the authors' eager loop", "caption decoding, labert, L7", "03 Pegasus, 2 beams, 4 new tokens"):
        assert any(path.startswith(start) for path in rows), f"no row {start!r}:\n{proc.stdout}"
    assert not any("extra memory" in path or "read of the logits" in path for path in rows)  # GPU-only rows
    assert rows["training step under torchrun --nproc_per_node N"]["note"] == "skipped: 0 GPUs"
    measured = [row for row in rows.values() if "ours" in row and row["ours_rounds"]]
    assert len(measured) >= 14 and all(row["ours"] > 0 for row in measured)
    for row in measured:  # every round of a row beside a round of its peer; the median printed, the ratio of medians
        assert len(row["ours_rounds"]) >= 2 and row["ours"] == statistics.median(row["ours_rounds"])
        if row["peer_rounds"] and row["ratio"] is not None:
            assert len(row["peer_rounds"]) == len(row["ours_rounds"]), row["path"]
            assert abs(row["ratio"] - row["ours"] / row["peer_value"]) < 1e-9 * row["ratio"], row["path"]
    padded = next(row for path, row in rows.items() if path.startswith("token_logprob_hidden P=64 H=16 V=320 bf16"))
    assert padded["max_difference_from_unpadded"] < 0.05  # the -inf bias: the padding changes no log p beyond bf16
    score = next(row for path, row in rows.items() if path.startswith("05 prefix scoring"))
    # auto is float32 on the CPU: the same scores, to the rounding of other batch sizes (2e-7 on an AVX-512 CPU)
    assert score["max_logp_difference"] <= 1e-5
    ct2 = next(row for path, row in rows.items() if path.endswith(": CTranslate2"))
    assert ct2["same_beams"] == ct2["pieces"]  # float32 on the CPU: the two engines' best beams are the same
    hours = rows["recipe GPU-hours"]
    assert hours["04+06 fixed"] > 0 and hours["05"] > 0 and hours["03"] > 0
    assert abs(hours["per million"] - hours["03"] - hours["05"]) < 1e-9
    assert "fixed: 04 + 06, 300,000 steps" in proc.stdout and "per million self-generated captions" in proc.stdout


@pytest.mark.slow
def test_one_section_keeps_its_bound(tmp_path):
    """--sections train04 alone still measures the staged bound beside 04."""
    out = tmp_path / "rows.json"
    run_one_thread("bench/bench_gpu.py", "--smoke", "--repeats", "2", "--sections", "train04", "--json", out)
    row = next(r for r in json.loads(out.read_text()) if r["path"].startswith("training step as 04 runs it"))
    assert row["peer"] == "staged bound" and row["peer_value"] > 0 and len(row["peer_rounds"]) == 2


@pytest.mark.slow
def test_gpu_profile_smoke_on_the_cpu():
    """bench/gpu_profile.py profiles 04's steps and a batch of 03's beam search, and lists the operators."""
    proc = run_one_thread("bench/gpu_profile.py", "--smoke", "--steps", "2", "--rows", "4")
    for line in ("== training, 2 steps as 04 runs them", "ms a step (wall)", "== 03 Pegasus, one batch of",
                 "ms a decoding step (wall)", "Self CPU time total"):
        assert line in proc.stdout, f"no {line!r} in:\n{proc.stdout}"


@pytest.mark.slow
def test_a_time_limit_still_prints_the_gpu_hours_of_what_was_measured(tmp_path):
    """gpu_check.sh stops the benchmark at its time limit (SIGTERM): the rows measured and the GPU-hours they
    give are still printed and written, and the exit status says it was stopped."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    out = tmp_path / "rows.json"
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, "bench/bench_gpu.py", "--smoke", "--repeats", "2", "--sections", "kernels",
                             "paraphrase", "--json", str(out)], cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("== paraphrase"):
            time.sleep(1)
            proc.send_signal(signal.SIGTERM)
            break
    lines += proc.stdout.readlines()
    proc.wait(timeout=120)
    text = "".join(lines)
    assert proc.returncode == 1 and "stopped by signal SIGTERM" in text, text[-2000:]
    assert "The COCO recipe's GPU-hours" in text and "fixed: 04 + 06, 300,000 steps at 04's step from HDF5: not measured" in text
    rows = {row["path"] for row in json.loads(out.read_text())}
    assert any(path.startswith("seq_logprob [") for path in rows) and "recipe GPU-hours" in rows
