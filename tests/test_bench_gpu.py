"""bench/bench_gpu.py, the GPU table's one command, at tiny size on the CPU: every section runs and gives its
rows, the GPU-only rows are left out, and the recipe's GPU-hours are printed."""
import json

from conftest import run_one_thread


def test_bench_gpu_smoke_on_the_cpu(tmp_path):
    out = tmp_path / "rows.json"
    proc = run_one_thread("bench/bench_gpu.py", "--smoke", "--json", out)
    rows = {row["path"]: row for row in json.loads(out.read_text())}
    for start in ("seq_logprob [", "token_logprob_hidden P=", "host share", "training step (Trainer.train_step), before",
                  "training step, --precision auto", "training step, staged bound", "training step as 04 runs it from",
                  "05 prefix scoring, levels 1-7", "05 with linear + log_softmax + gather", "05, the authors' eager loop",
                  "caption decoding, L7", "03 Pegasus, 10 beams", "03 Pegasus, --precision auto"):
        assert any(path.startswith(start) for path in rows), f"no row {start!r}:\n{proc.stdout}"
    assert all(row["ours"] > 0 for row in rows.values() if "ours" in row)
    assert not any("extra memory" in path or "read of the logits" in path for path in rows)  # GPU-only rows
    score = next(row for path, row in rows.items() if path.startswith("05 prefix scoring, --precision auto"))
    assert score["max_logp_difference"] == 0.0  # auto is float32 on the CPU: the same scores
    hours = rows["recipe GPU-hours (now)"]
    assert hours["04+06"] > 0 and hours["05"] > 0 and hours["03"] > 0 and "GPU-hours per million" in proc.stdout


def test_gpu_profile_smoke_on_the_cpu():
    """bench/gpu_profile.py profiles 04's steps and a batch of 03's beam search, and lists the operators."""
    proc = run_one_thread("bench/gpu_profile.py", "--smoke", "--steps", "2", "--rows", "4")
    for line in ("== training, 2 steps as 04 runs them", "ms a step (wall)", "== 03 Pegasus, one batch of",
                 "ms a decoding step (wall)", "Self CPU time total"):
        assert line in proc.stdout, f"no {line!r} in:\n{proc.stdout}"
