"""Every benchmark command that docs/running.md ("Benchmarks") and the README print runs, at a smoke size,
and every bench/*.py answers --help, each as a reader runs it: ``python bench/X.py ...`` in a subprocess.

The commands are read from the docs, so a benchmark documented later is run too: each needs its row in
SMOKE (the flags appended to the printed command, argparse keeping the last value of a flag) or in
GPU_ONLY.
"""
import os
import re
import shlex
import subprocess

import pytest
from conftest import ROOT, run_script

# flags appended to a printed command: the same code paths at tiny sizes
SMOKE = {
    "bench/bench_sampler.py": ["--sizes", "2e4", "--rounds", "1", "--limit", "120", "--threads", "1"],
    "bench/bench_score.py": ["--rounds", "1", "--no-compile", "--seq-shape", "2", "4", "256",
                             "--hidden-shape", "8", "32", "256", "--e2e-captions", "8"],
    "bench/bench_scale.py": ["--captions", "400", "--images", "40", "--steps", "2", "--eta", "1", "--paths", "new",
                             "--work", "{tmp}/work"],
    "bench/bench_gpu.py": ["--smoke", "--repeats", "2", "--sections", "kernels"],
    "bench/bench_help.py": ["--rounds", "1"],
}
GPU_ONLY = {"bench/gpu_check.sh": "builds the CUDA kernels and runs the GPU tests (its --cpu-dry-run: "
                                  "tests/bad_input/test_bad_input_bench_gpu.py)"}
SLOW = {"bench/bench_help.py", "bench/bench_scale.py", "bench/bench_gpu.py", "bench/bench_score.py", "bench/bench_sampler.py"}  # (over 20 s)
# what each prints when it ran through (default: a ratio, "1.23x")
EXPECT = {"bench/bench_score.py": r"05 prefix scoring, tiny, \d+ captions .* \d+\.\d+x",
          "bench/bench_sampler.py": r"`kth_value` .*numpy\.partition",
          "bench/bench_help.py": r"\| `07_eval\.py --help` \| \d+\.\d+ \| [\d.]+-[\d.]+ \| (met|MISSED) \|",
          "bench/bench_scale.py": r"\| 06 clid: start-up to the first optimizer step \(s\) \|"}


def section(text: str, title: str) -> str:
    """A Markdown section, from its title to the next title of its level."""
    start = text.index(title)
    end = text.find("\n## ", start + len(title))
    return text[start:] if end < 0 else text[start:end]


def documented_commands() -> list[str]:
    """The ``python bench/...`` and ``bash bench/...`` code spans of running.md's Benchmarks and of the README,
    each once (a span may wrap across lines)."""
    text = section((ROOT / "docs" / "running.md").read_text(), "## Benchmarks") + (ROOT / "README.md").read_text()
    spans = re.findall(r"`([^`]+)`", " ".join(text.split()))
    return list(dict.fromkeys(s for s in spans if re.match(r"(python|bash) bench/", s)))


COMMANDS = documented_commands()
BENCH_SCRIPTS = sorted(p.relative_to(ROOT).as_posix() for p in ROOT.glob("bench/*.py"))


def script_of(command: str) -> str:
    return shlex.split(command)[1]


def test_the_documented_commands_are_found_and_each_has_a_smoke_size():
    assert "python bench/bench_score.py --quick" in COMMANDS and len(COMMANDS) >= 5
    for command in COMMANDS:
        assert script_of(command) in {**SMOKE, **GPU_ONLY}, f"{command!r}: give it a smoke size in SMOKE"


def test_section_ends_at_the_next_title():
    text = "# A\n## Benchmarks\n`python bench/x.py`\n### sub\n`bash bench/y.sh`\n## Next\n`python bench/z.py`\n"
    assert section(text, "## Benchmarks") == "## Benchmarks\n`python bench/x.py`\n### sub\n`bash bench/y.sh`"


def with_root() -> dict:
    """The environment of a clone after `make venv` (which installs ``clid`` editable): the root importable."""
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


@pytest.mark.parametrize("command", [pytest.param(c, marks=pytest.mark.slow) if script_of(c) in SLOW else c
                                     for c in COMMANDS])
@pytest.mark.slow
def test_documented_benchmark_runs_at_smoke_size(command, tmp_path):
    import torch

    script, printed = script_of(command), shlex.split(command)[2:]
    if (script in GPU_ONLY or "cuda" in printed) and not torch.cuda.is_available():
        pytest.skip(f"needs a GPU: {script} {GPU_ONLY.get(script, '--device cuda')}")
    if "OLD.so" in printed:  # an earlier pybind11 build, which a clone does not have: the rest of the command runs
        at = printed.index("OLD.so")
        printed = printed[:at - 1] + printed[at + 1:]
    printed = [str(tmp_path / "out") if a == "OUTDIR" or a.startswith("docs/measurements/") else a for a in printed]
    smoke = [a.format(tmp=tmp_path) for a in SMOKE.get(script, [])]
    if command.startswith("bash "):
        proc = subprocess.run(["bash", script, *printed, *smoke], cwd=ROOT, capture_output=True, text=True)
    else:
        proc = run_script(script, *printed, *smoke, timeout=1200, env={"OMP_NUM_THREADS": "1", **with_root()})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and " failed" not in proc.stderr, proc.stderr[-3000:]
    assert re.search(EXPECT.get(script, r"\d\.\d+x"), proc.stdout), f"{command}: {proc.stdout[-3000:]}"


@pytest.mark.parametrize("script", BENCH_SCRIPTS)
def test_bench_help_runs_as_printed(script):
    """``python bench/X.py --help`` (not main() in-process: the script's own ``__main__`` line)."""
    proc = run_script(script, "--help", timeout=300, env=with_root())
    assert proc.stdout.startswith("usage:") and proc.stderr == "", proc.stderr[-3000:]
