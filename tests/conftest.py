"""Shared test fixtures: real-format sample files and the real COCO 2014 captions."""
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


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
    full_env = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    proc = subprocess.run([sys.executable, *map(str, args)], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{args} failed ({proc.returncode}):\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}")
    return proc
