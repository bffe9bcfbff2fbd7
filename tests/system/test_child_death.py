"""Child processes that die or could deadlock: every run ends within seconds, in one line, or finishes.

Each case runs the command in a subprocess with a timeout that fails the test rather than waits: the
parallel caption reader (clid/data/parallel_read.py, its threshold lowered to a few hundred lines), and
04's batch-making processes (``--workers``). A child is killed from outside (``kill -9`` and other
signals) once it has told the test its pid, or ends itself without its result.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT
from toyworld import make_toy_world

LIMIT = 90  # seconds a case may take: a hang fails the test here, not at the job's time limit

# The reader, run as the stages run it (clid.run.cli.run_main: bad input is one "error:" line), with the
# parallel threshold lowered and, per CLID_TEST_CHILD, one child that waits to be killed or ends itself.
READER = r"""
import os, signal, sys, time
from pathlib import Path
from clid.run.cli import run_main
from clid.data import inputs, parallel_read
from clid.base.text import load_tokenizer

inputs.PARALLEL_FROM = 10
parallel_read.processes = lambda: 3
how, pid_file = os.environ.get("CLID_TEST_CHILD", ""), os.environ.get("CLID_TEST_PID_FILE")
read_part = parallel_read._read_part
def part(byte_range):
    if how and byte_range == parallel_read.line_ranges(sys.argv[1], 24)[4]:  # (part 5, in the second child)
        if how == "exit":
            os._exit(3)
        Path(pid_file).write_text(str(os.getpid()))
        go = Path(pid_file + ".go")
        for _ in range(3000):  # (until killed, or told to go on)
            if how == "wait" and go.exists():
                break
            time.sleep(0.1)
    return read_part(byte_range)
parallel_read._read_part = part

def main(argv):
    tokenizer = load_tokenizer()
    if os.environ.get("TOKENIZERS_PARALLELISM") == "true":  # (the tokenizer's threads run before the fork)
        tokenizer(["a dog on the grass"] * 2000)
    table, _ = inputs.read_jsonl_table(argv[0], tokenizer, False)
    print(f"read {len(table)} captions")

run_main(main, sys.argv[1:])
"""


def captions_file(path: Path, n: int = 600) -> Path:
    lines = [json.dumps({"id": i, "image_id": i % 17, "caption": f"a dog number {i} on the red grass"}) for i in range(n)]
    path.write_text("\n".join(lines) + "\n")
    return path


def start(args: list, tmp_path: Path, **env) -> subprocess.Popen:
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
                   "CLID_TEST_PID_FILE": str(tmp_path / "child.pid"), **env}
    return subprocess.Popen([sys.executable, *map(str, args)], cwd=tmp_path, env=environment, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)


def finish(process: subprocess.Popen, limit: float = LIMIT) -> str:
    """The output of ``process``, which must end within ``limit`` seconds (else it is killed and the test fails)."""
    try:
        output, _ = process.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"still running after {limit} s (a hang):\n{output[-2000:]}")
    return output


def kill_child(process: subprocess.Popen, pid_file: Path, sig: int) -> float:
    """Wait for the child to write its pid, then send it ``sig``; returns when it was sent."""
    deadline = time.monotonic() + LIMIT
    while not (pid_file.exists() and pid_file.read_text()):
        if process.poll() is not None or time.monotonic() > deadline:
            pytest.fail("the child never started:\n" + finish(process))
        time.sleep(0.05)
    os.kill(int(pid_file.read_text()), sig)
    return time.monotonic()


def one_error_line(output: str) -> str:
    assert "Traceback" not in output, output
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, output
    return errors[0]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGSEGV, signal.SIGABRT])
def test_a_reading_process_killed_ends_the_run_in_one_line(tmp_path, sig):
    path = captions_file(tmp_path / "selfgen.jsonl")
    process = start(["-c", READER, path], tmp_path, CLID_TEST_CHILD="sleep")
    sent = kill_child(process, tmp_path / "child.pid", sig)
    output = finish(process)
    assert time.monotonic() - sent < 20 and process.returncode == 1
    line = one_error_line(output)
    assert str(path) in line and "part 5 of 24" in line and f"killed by {sig.name}" in line, line


def test_a_reading_process_that_ends_without_its_result_ends_the_run(tmp_path):
    path = captions_file(tmp_path / "selfgen.jsonl")
    output = finish(start(["-c", READER, path], tmp_path, CLID_TEST_CHILD="exit"))
    line = one_error_line(output)
    assert "part 5 of 24" in line and "exited with status 3 without its result" in line and "lines " in line, line


@pytest.mark.parametrize("value", ["true", "1", "false"])
def test_tokenizers_parallelism_does_not_deadlock_the_reader(tmp_path, value):
    path = captions_file(tmp_path / "selfgen.jsonl")
    output = finish(start(["-c", READER, path], tmp_path, TOKENIZERS_PARALLELISM=value), limit=60)
    assert "read 600 captions" in output, output


def test_a_file_replaced_while_it_is_read_is_refused(tmp_path):
    """The file is renamed over while a child waits: the children read the parent's handle (one version), and
    the change is refused in one line."""
    path = captions_file(tmp_path / "selfgen.jsonl")
    process = start(["-c", READER, path], tmp_path, CLID_TEST_CHILD="wait")
    pid_file = tmp_path / "child.pid"
    kill_child(process, pid_file, 0)  # (signal 0: only waits for the child to be there)
    os.replace(captions_file(tmp_path / "other.jsonl", 650), path)
    Path(f"{pid_file}.go").touch()
    line = one_error_line(finish(process))
    assert str(path) in line and "was replaced while it was read" in line, line


# -- 04's batch-making processes (--workers) ---------------------------------------------------------------
LOADER = r"""
import os, runpy, sys, time
from pathlib import Path
import torch.utils.data
from clid.training.batches import StepBatches

how, pid_file = os.environ["CLID_TEST_CHILD"], os.environ["CLID_TEST_PID_FILE"]
get_item = StepBatches.__getitem__
def item(self, i):
    if i == 1 and torch.utils.data.get_worker_info() is not None:
        if how == "exit":
            os._exit(3)
        Path(pid_file).write_text(str(os.getpid()))
        time.sleep(300)
    return get_item(self, i)
StepBatches.__getitem__ = item
sys.argv = ["04_train_base.py", *sys.argv[1:]]
runpy.run_path(os.path.join(os.environ["PYTHONPATH"], "04_train_base.py"), run_name="__main__")
"""


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> tuple[Path, Path]:
    return make_toy_world(tmp_path_factory.mktemp("child_death"), n_train=8, n_val=2, n_test=3, dim=16)


def train_args(toy, out: Path) -> list:
    captions, features = toy
    return ["--captions", captions, "--features", features, "--out", out, "--preset", "tiny", "--max-steps", "4",
            "--warmup", "1", "--batch-size", "4", "--eval-every", "0", "--save-every", "1", "--workers", "1",
            "--max-left-out", "1"]


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_loader_process_killed_ends_training_in_one_line(tmp_path, toy, sig):
    out = tmp_path / "out"
    process = start(["-c", LOADER, *train_args(toy, out)], tmp_path, CLID_TEST_CHILD="sleep")
    sent = kill_child(process, tmp_path / "child.pid", sig)
    output = finish(process)
    assert time.monotonic() - sent < 30 and process.returncode == 1, output
    line = one_error_line(output)
    assert "training stopped at step" in line and (f"killed by signal: {sig.name[3:].title()}" in line
                                                   or "ended while" in line or "exited unexpectedly" in line) and "The same command resumes" in line, line
    assert not [p for p in out.rglob("*") if "tmp" in p.name]  # (a checkpoint is whole or absent)


@pytest.mark.slow
def test_a_loader_process_that_exits_ends_training_in_one_line(tmp_path, toy):
    output = finish(start(["-c", LOADER, *train_args(toy, tmp_path / "out")], tmp_path, CLID_TEST_CHILD="exit"))
    line = one_error_line(output)
    assert "training stopped at step" in line and ("exited unexpectedly" in line or "ended while" in line), line


# -- what else stops a run that could go on -----------------------------------------------------------------
def test_no_process_can_start_the_file_is_read_by_this_one(tmp_path, monkeypatch, capsys):
    """A read-only /dev/shm, or no process left to fork: one note, and the serial reader reads the file."""
    import errno
    import multiprocessing.context

    from clid.base.text import load_tokenizer
    from clid.data import inputs, parallel_read

    def refuse(self):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(inputs, "PARALLEL_FROM", 10)
    monkeypatch.setattr(parallel_read, "processes", lambda: 3)
    monkeypatch.setattr(multiprocessing.context.ForkProcess, "start", refuse)
    table, fault = inputs.read_jsonl_table(captions_file(tmp_path / "s.jsonl"), load_tokenizer(), False)
    assert len(table) == 600 and fault is None
    assert "cannot start the reading processes (Read-only file system); this process reads the file alone" in capsys.readouterr().out


def test_allow_download_is_seen_abbreviated_as_argparse_takes_it(monkeypatch):
    from clid.run.cli import allows_download

    assert allows_download(["--allow-d"]) and allows_download(["--out", "x", "--allow-download"])
    assert not allows_download(["--out", "x"]) and not allows_download(["--", "--allow-download"])
    assert not allows_download(["--a"])  # (too short to be read as it: argparse may take it for another flag)


@pytest.mark.slow
def test_demo_steps_changed_between_runs_names_the_variable(tmp_path, toy, monkeypatch):
    """CLID_DEMO_STEPS 2, then 3: the refusal names the variable, not a flag the user never gave; the recipe's
    own warm-up, longer than the run, is a note, not a warning to change it."""
    captions, features = toy
    out = tmp_path / "out"
    args = [sys.executable, str(ROOT / "04_train_base.py"), "--captions", captions, "--features", features, "--out", out,
            "--recipe", "demo", "--batch-size", "4", "--max-left-out", "1"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    first = subprocess.run(list(map(str, args)), env={**env, "CLID_DEMO_STEPS": "2"}, capture_output=True, text=True,
                           timeout=LIMIT)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "warning: --warmup" not in first.stderr and "the recipe's 100-step warm-up for the whole run" in first.stdout
    second = subprocess.run(list(map(str, args)), env={**env, "CLID_DEMO_STEPS": "3"}, capture_output=True, text=True,
                            timeout=LIMIT)
    line = one_error_line(second.stdout + second.stderr)
    assert "CLID_DEMO_STEPS under --recipe demo) 2 then, 3 now" in line and "make passes no flags" in line, line


def test_captions_read_again_after_the_file_changed_are_refused(tmp_path):
    """06 reads the self-generated texts a second time (for CLIP): a file rewritten meanwhile is refused."""
    from clid.base.files import DataError
    from clid.base.text import load_tokenizer
    from clid.data.inputs import CaptionFiles, caption_texts

    path = captions_file(tmp_path / "s.jsonl", 20)
    table = CaptionFiles().selfgen_table(path, load_tokenizer())
    assert caption_texts(table.caption_ids, [], path, table.digests)[3] == "a dog number 3 on the red grass"
    path.write_text(path.read_text().replace("number 3 ", "number three "))
    with pytest.raises(DataError, match="caption 3: the file changed since this run read it"):
        caption_texts(table.caption_ids, [], path, table.digests)


# -- 00's drawing processes (--workers) ---------------------------------------------------------------------
DRAWER = r"""
import os, runpy, sys, time
from pathlib import Path
from clid.demo import worker

how, pid_file = os.environ["CLID_TEST_CHILD"], os.environ["CLID_TEST_PID_FILE"]
make_chunk = worker.make_chunk
def chunk(jobs):
    if jobs[0][0] == 5:
        if how == "exit":
            os._exit(3)
        Path(pid_file).write_text(str(os.getpid()))
        time.sleep(300)
    return make_chunk(jobs)
chunk.__module__, chunk.__qualname__ = worker.__name__, "make_chunk"  # (pickled by name, as the pool sends it)
worker.make_chunk = chunk
sys.argv = ["00_demo_data.py", *sys.argv[1:]]
runpy.run_path(os.path.join(os.environ["PYTHONPATH"], "00_demo_data.py"), run_name="__main__")
"""
DEMO_ARGS = ["--skip-features", "--n-train", "8", "--n-val", "2", "--n-test", "2", "--size", "96", "--workers", "2",
             "--chunk", "4"]


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_drawing_process_killed_ends_the_demo_in_one_line(tmp_path, sig):
    process = start(["-c", DRAWER, "--out", tmp_path / "demo", *DEMO_ARGS], tmp_path, CLID_TEST_CHILD="sleep")
    sent = kill_child(process, tmp_path / "child.pid", sig)
    output = finish(process)
    assert time.monotonic() - sent < 20 and process.returncode == 1, output
    line = one_error_line(output)
    assert "a process drawing the images" in line and "run the same command again" in line, line
    assert not (tmp_path / "demo" / "world.json").exists() and not list((tmp_path / "demo").rglob("*tmp*"))


def test_a_drawing_process_that_exits_ends_the_demo_in_one_line(tmp_path):
    output = finish(start(["-c", DRAWER, "--out", tmp_path / "demo", *DEMO_ARGS], tmp_path, CLID_TEST_CHILD="exit"))
    assert "a process drawing the images" in one_error_line(output)


@pytest.mark.slow
def test_tokenizers_parallelism_does_not_deadlock_the_loader(tmp_path, toy):
    args = [ROOT / "04_train_base.py", *train_args(toy, tmp_path / "out")]
    output = finish(start(args, tmp_path, TOKENIZERS_PARALLELISM="true"), limit=120)
    assert "Traceback" not in output and (tmp_path / "out" / "config.json").exists(), output
