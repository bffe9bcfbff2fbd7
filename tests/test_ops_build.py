"""Building the clid_ops extension: once, into a folder named after its sources, and never hanging.

A build killed with kill -9 (or Ctrl-C, or a preempted SLURM job) used to leave torch's ``lock`` file
in the shared build folder, and every later run waited on it forever. These tests kill real builds
(of a tiny extension, through the same clid.ops build and lock code as the real one) and show that
the next run finishes, that a waiter says what it waits for, and that a failed build is not retried
by every later run.
"""
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from conftest import ROOT, run_script

import clid.ops as ops

TINY_SOURCE = r"""
#include <pybind11/pybind11.h>
int add(int a, int b) { return a + b; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("add", &add); }
"""

# Builds (or imports) the tiny extension through clid.ops.load_or_build and calls it.
BUILD_TINY = """
import sys, time
from pathlib import Path
from clid import ops
spec = ops.ExtensionSpec("clid_tiny", (Path(sys.argv[1]),), cflags=("-O0",))
started = time.time()
module = ops.load_or_build(spec, report_every=1.0)
print("add", module.add(2, 3), "seconds", round(time.time() - started, 1), flush=True)
"""


def start(script: str, *args, env: dict, stderr=subprocess.PIPE) -> subprocess.Popen:
    """A Python child in its own process group (so the whole build, ninja and compilers, can be killed)."""
    return subprocess.Popen([sys.executable, "-c", script, *map(str, args)], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=stderr, start_new_session=True)


def wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@pytest.fixture
def tiny(tmp_path):
    """(source file, environment with a private build root, build root)."""
    source = tmp_path / "tiny.cpp"
    source.write_text(TINY_SOURCE)
    root = tmp_path / "builds"
    env = dict(os.environ, PYTHONPATH=str(ROOT), CLID_OPS_BUILD_DIR=str(root), OMP_NUM_THREADS="1")
    return source, env, root


def test_a_build_killed_mid_way_does_not_block_the_waiter_or_the_next_run(tiny, tmp_path):
    source, env, root = tiny
    builder = start(BUILD_TINY, source, env=env)
    # the builder is compiling once torch has written its ninja file into the private staging folder
    def started():
        assert builder.poll() is None, builder.communicate()[1]  # (a builder that died at once shows why)
        return next(root.glob("clid_tiny_*.tmp-*/build.ninja"), None)

    staging = wait_for(started, 120, "the build to start").parent
    waiter_log = tmp_path / "waiter.err"
    with open(waiter_log, "w") as err:
        waiter = start(BUILD_TINY, source, env=env, stderr=err)
    wait_for(lambda: f"waiting for pid {builder.pid} on host {socket.gethostname()}" in waiter_log.read_text(),
             60, "the waiter to report the live builder")
    os.killpg(builder.pid, signal.SIGKILL)  # the builder, ninja and the compiler, mid-build
    builder.wait()
    assert (staging / "lock").exists()  # torch's lock, left behind as before: it must not matter
    try:
        out, _ = waiter.communicate(timeout=300)
    finally:
        if waiter.poll() is None:
            os.killpg(waiter.pid, signal.SIGKILL)
    log = waiter_log.read_text()
    assert waiter.returncode == 0 and out.startswith("add 5"), log
    assert str(staging.name.split(".tmp-")[0]) in log  # it named the folder it waited for
    assert "building the clid_tiny extension" in log  # then built it itself
    folders = [p for p in root.iterdir() if p.is_dir()]
    assert len(folders) == 1 and (folders[0] / ops.READY).exists()  # the killed staging folder is gone

    # the next run only imports the finished module: no build, no waiting
    again = run_script("-c", BUILD_TINY, source, env={"CLID_OPS_BUILD_DIR": str(root)})
    assert again.stdout.startswith("add 5") and again.stderr == ""


def test_a_waiter_reports_the_live_builder_periodically_and_goes_on_when_it_dies(tmp_path, capsys):
    hold = ("import sys, time\nfrom pathlib import Path\nfrom clid.ops import build_lock\n"
            "with build_lock(Path(sys.argv[1]), Path(sys.argv[2])):\n    print('held', flush=True)\n    time.sleep(300)\n")
    lock, folder = tmp_path / "ext.lock", tmp_path / "ext"
    holder = start(hold, lock, folder, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        assert holder.stdout.readline().strip() == "held"
        threading.Timer(2.0, lambda: os.killpg(holder.pid, signal.SIGKILL)).start()
        started = time.monotonic()
        with ops.build_lock(lock, folder, report_every=0.5):
            waited = time.monotonic() - started
            assert lock.read_text().startswith(f"pid {os.getpid()} on host {socket.gethostname()}")
    finally:
        if holder.poll() is None:
            os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
    err = capsys.readouterr().err
    assert 1.5 < waited < 30  # the kernel dropped the dead holder's lock at once
    assert err.count(f"clid.ops: waiting for pid {holder.pid} on host {socket.gethostname()}") >= 2
    assert f"building the extension in {folder}" in err


def test_a_file_system_without_flock_builds_unlocked_and_says_so(tmp_path, monkeypatch, capsys):
    import errno
    import fcntl

    def no_flock(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    with ops.build_lock(tmp_path / "ext.lock", tmp_path / "ext") as locked:
        assert locked is False
    assert f"cannot lock {tmp_path / 'ext.lock'} (No locks available); building without a lock" in capsys.readouterr().err


def test_same_sources_share_a_folder_and_changed_ones_never_clash(tmp_path):
    clones = []
    for name in ("clone_a", "clone_b"):
        csrc = tmp_path / name / "csrc"
        shutil.copytree(ops.CSRC, csrc)
        spec = ops.extension_spec()
        clones.append((csrc, ops.ExtensionSpec(spec.name, tuple(csrc / s.relative_to(ops.CSRC) for s in spec.sources),
                                               (csrc,), spec.cflags, spec.cuda_flags, spec.ldflags, spec.with_cuda)))
    (a_csrc, a), (b_csrc, b) = clones
    assert ops.build_directory(a) == ops.build_directory(b) == ops.build_directory(ops.extension_spec())
    header = b_csrc / "common" / "score.h"
    header.write_text(header.read_text() + "\n// an edit\n")  # a header, not a compiled source
    assert ops.build_directory(b) != ops.build_directory(a)
    assert ops.build_directory(b).parent == ops.build_directory(a).parent


def test_a_failed_build_warns_and_later_runs_fall_back_without_building_again(tmp_path):
    fake = tmp_path / "broken-c++"
    fake.write_text('#!/bin/sh\nfor arg in "$@"; do\n  if [ "$arg" = "-c" ]; then\n'
                    '    echo "x.cpp:1: error: simulated compiler failure" >&2; exit 1\n  fi\ndone\nexec c++ "$@"\n')
    fake.chmod(0o755)
    env = {"CXX": str(fake), "CLID_OPS_BUILD_DIR": str(tmp_path / "builds"), "CLID_OPS_NO_CUDA": "1"}
    build = run_script("-m", "clid.ops", "build", env=env)  # make venv goes on: the references still work
    assert "could not build the clid_ops extension" in build.stderr and "simulated compiler failure" in build.stderr
    assert run_script("-m", "clid.ops", "build", "--strict", env=env, check=False).returncode == 1
    failed = list((tmp_path / "builds").glob("*.failed"))
    assert len(failed) == 1 and "simulated compiler failure" in failed[0].read_text()
    probe = run_script("-c", "import clid.ops as ops, torch\nprint(ops.extension(), '|', ops.build_error())\n"
                             "print(ops.segment_mean(torch.ones(3), lengths=torch.tensor([1, 2])).tolist())", env=env)
    assert probe.stdout.startswith("None | RuntimeError: the build failed before (RuntimeError: x.cpp:1: error: simulated")
    assert "[1.0, 1.0]" in probe.stdout and "building" not in probe.stderr


def test_the_build_command_reports_a_finished_build():
    module = ops.extension()
    assert module is not None, f"the extension did not build: {ops.build_error()}"
    out = run_script("-m", "clid.ops", "build").stdout
    assert out.strip() == f"clid.ops: clid_ops is already built in {ops.build_directory()}"
