"""Shared test fixtures: real-format sample files and the real COCO 2014 captions."""
import importlib.util
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs TEST_JOBS pytest-xdist workers (2: the cores here): one thread each (and in the stages they start),
    # so that the workers do not compete for the cores
    os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture
def fixtures() -> Path:
    return FIXTURES


@pytest.fixture(scope="session")
def coco_annotations(tmp_path_factory) -> Path:
    """The real MS-COCO 2014 caption files, unpacked from the pycocoevalcap wheel's SPICE jar."""
    import importlib.util

    package = Path(importlib.util.find_spec("pycocoevalcap").submodule_search_locations[0])
    jar = package / "spice" / "spice-1.0.jar"
    out = tmp_path_factory.mktemp("coco")
    with zipfile.ZipFile(jar) as z:
        for name in ("captions_train2014.json", "captions_val2014.json"):
            target = out / name
            target.write_bytes(z.read(f"coco/annotations/{name}"))
    return out


def run_script(*args, cwd=ROOT, check=True, env=None, timeout=1800) -> subprocess.CompletedProcess:
    """Run a repository script or module with this interpreter; return the completed process."""
    full_env = dict(os.environ, **(env or {}))
    proc = subprocess.run([sys.executable, *map(str, args)], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{args} failed ({proc.returncode}):\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}")
    return proc


def run_one_thread(*args, **kwargs) -> subprocess.CompletedProcess:
    """:func:`run_script` with one thread per process: on a busy machine, spinning OpenMP threads
    make small torch ops many times slower."""
    return run_script(*args, env={"OMP_NUM_THREADS": "1", **kwargs.pop("env", {})}, **kwargs)


@pytest.fixture
def one_thread():
    """One torch thread for in-process model tests (see :func:`run_one_thread`); restored afterwards."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def import_script(filename: str, module_name: str):
    """Import a numbered stage script (e.g. "02_scenegraph_captions.py") as a module."""
    spec = importlib.util.spec_from_file_location(module_name, ROOT / filename)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def kill_after_checkpoint(command: list, state_file: Path, min_step: int, timeout: float = 300,
                          sig: int | None = None) -> None:
    """Start a training command, SIGKILL it (or send ``sig``: SIGTERM stops it cleanly at its next step) once
    ``state_file`` records ``min_step`` steps or more."""
    import json
    import signal
    import time

    child = subprocess.Popen([sys.executable, *map(str, command)], cwd=ROOT,
                             env=dict(os.environ),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + timeout
    while time.time() < deadline and child.poll() is None:
        if state_file.exists() and json.loads(state_file.read_text())["step"] >= min_step:
            break
        time.sleep(0.05)
    child.send_signal(signal.SIGKILL if sig is None else sig)
    child.wait(timeout)


# The bad-input table's shared valid inputs (a toy world with tiny trained checkpoints), made once per test
# process for every file that asks for ``world`` (imported last: tests/badinput.py imports this module).
from badinput import world  # noqa: E402,F401
