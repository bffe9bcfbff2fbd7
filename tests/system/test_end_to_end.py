"""The whole pipeline, 00 to 07, on the small demo world (demo.sh with SMALL=1), in a few minutes."""
import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT

from clid.base.files import read_jsonl, read_quality


def run_small_demo(demo, runs, **env) -> subprocess.CompletedProcess:
    """demo.sh on the small world with few steps (the stages must fit together; what the models learn
    is tested elsewhere), with .venv's python when there is one; it must succeed."""
    py = os.environ.get("PY", str(ROOT / ".venv" / "bin" / "python"))
    env = dict(os.environ, SMALL="1", PY=py if os.path.exists(py) else sys.executable,
               STEPS_SMALL="60", ETA_SMALL="1", FT_SMALL="10", BATCH="16", **env)
    proc = subprocess.run(["bash", str(ROOT / "demo.sh"), str(demo), str(runs)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.mark.slow
def test_demo_pipeline_small(tmp_path):
    demo, runs = tmp_path / "demo", tmp_path / "runs"
    proc = run_small_demo(demo, runs)
    for stage in ("00 demo world", "01 saliency", "02 self-generated", "03 paraphrase", "04 trusted-only", "04 M_theta~", "04 scoring model",
                  "05 quality", "06 CLID", "07 evaluation"):
        assert f"==== {stage}" in proc.stdout

    # every stage's output, in its documented format
    selfgen = list(read_jsonl(runs / "paraphrased.jsonl", required=("id", "image_id", "caption", "n_tokens", "level")))
    assert len(selfgen) > 100 and all(r["paraphraser"] == "rules" for r in selfgen)
    # the scoring model continued the extended one (04 --continue-from), as in the authors' code
    assert json.loads((runs / "trusted_ft" / "config.json").read_text())["train"]["continue_from"] == str(runs / "extended")
    quality = read_quality(runs / "quality.h5")
    assert len(quality["id"]) > 0 and set(quality["id"]) <= {r["id"] for r in selfgen}
    log = [json.loads(line) for line in (runs / "clid" / "selection_log.jsonl").read_text().splitlines()]
    drawn = [p["drawn"] for p in log if p["drawn"]]
    assert len(drawn) == 50 and drawn == sorted(drawn, reverse=True) and log[-1].get("trusted_only")

    metrics = json.loads((runs / "eval" / "metrics.json").read_text())
    runs_by_name = metrics["runs"]
    assert set(runs_by_name) == {"trusted-only", "extended-only", "CLID"}
    for name, run in runs_by_name.items():
        cp = [run["levels"][str(level)]["control_precision"] for level in range(1, 8)]
        assert all(0.0 <= v <= 1.0 for v in cp), (name, cp)
    # a model that never saw a caption longer than 24 tokens cannot fill levels 4 to 7
    trusted = runs_by_name["trusted-only"]["levels"]
    assert all(trusted[str(level)]["control_precision"] == 0.0 for level in range(4, 8))
    report = (runs / "eval" / "report.md").read_text()
    assert "Control precision" in report and "long references" in report.lower()
    for figure in ("control_precision.png", "quality_vs_control.png", "length_histograms.png"):
        assert (runs / "eval" / figure).stat().st_size > 1000
    # the gallery: 8 test images, each at every level, trusted-only and CLID side by side
    gallery = (runs / "gallery.html").read_text()
    assert gallery.count('<section class="figure"') == gallery.count('src="data:image/jpeg;base64,') == 8
    assert gallery.count("<tr data-level=") == 8 * 7 and "<th>level</th><th>trusted-only</th><th>CLID</th>" in gallery


@pytest.mark.slow
def test_demo_paragraph_pipeline_small(tmp_path):
    """The paragraph task, 00 to 07 (demo.sh TASK=paragraph SMALL=1, few steps): paragraph levels in every
    stage, read by 05 and 07 from the checkpoints, and decoded paragraphs that keep their sentences."""
    import re

    from clid.base.text import LEVEL_SETS

    demo, runs = tmp_path / "demo", tmp_path / "runs"
    proc = run_small_demo(demo, runs, TASK="paragraph")
    assert "==== 07 evaluation: paragraph-only vs extended-only vs CLID" in proc.stdout

    paragraph_levels = [list(level) for level in LEVEL_SETS["paragraph"]]
    # 02 joins the walk's jumps with "." and levels its walks on the 13 paragraph levels
    selfgen = list(read_jsonl(runs / "paraphrased.jsonl", required=("id", "image_id", "caption", "n_tokens", "level")))
    assert any(re.search(r"\. \w", r["caption"]) for r in selfgen)
    assert all(1 <= r["level"] <= 13 for r in selfgen) and max(r["level"] for r in selfgen) >= 3
    for name in ("trusted", "extended", "trusted_ft", "clid"):
        assert json.loads((runs / name / "config.json").read_text())["model"]["levels"] == paragraph_levels, name

    # 07 was given no --levels: it read the paragraph levels from the checkpoints
    metrics = json.loads((runs / "eval" / "metrics.json").read_text())
    assert set(metrics["runs"]) == {"paragraph-only", "extended-only", "CLID"}
    for run in metrics["runs"].values():
        assert sorted(run["levels"], key=int) == [str(level) for level in range(1, 14)]
        assert all(0.0 <= level["control_precision"] <= 1.0 for level in run["levels"].values())
    generated = list(read_jsonl(runs / "eval" / "generated" / "CLID.jsonl", required=("image_id", "level", "caption")))
    assert {r["level"] for r in generated} == set(range(1, 14))
    # decoding keeps a paragraph's sentences: a "." followed by a word survives at the long levels
    assert any(re.search(r"\. \w", r["caption"]) for r in generated if r["level"] > 3)
    # control precision counts the recorded paragraph lengths against the paragraph levels
    clid = metrics["runs"]["CLID"]["levels"]
    for level, (low, high) in enumerate(paragraph_levels, start=1):
        lengths = [r["length"] for r in generated if r["level"] == level]
        assert len(lengths) == clid[str(level)]["n_captions"] == 12
        hits = sum(low <= n <= high for n in lengths)
        assert abs(clid[str(level)]["control_precision"] - hits / len(lengths)) < 1e-9, level
    gallery = (runs / "gallery.html").read_text()
    assert gallery.count("<tr data-level=") == 8 * 13 and "<th>paragraph-only</th><th>CLID</th>" in gallery
