"""The device plan (clid.run.runtime): its choices on the CPU and on a GPU, and that it is the one place
that asks what kind of device a stage runs on."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from clid.run import runtime

ROOT = Path(__file__).resolve().parents[2]

# what asks for the kind of a device, or whether a GPU is there
DEVICE_TESTS = re.compile(r"""\.is_cuda\b|cuda\.is_available\(|cuda\.device_count\(|\bdevice_type\(|"""
                          r"""\.type\s*(==|!=)\s*["']|\.type\s+(not\s+)?in\s+\(|startswith\(\s*["']cuda|"""
                          r"""(==|!=)\s*["'](cuda|cpu)["']|["'](cuda|cpu)["']\s*(==|!=)|["']cuda["']\s+if\b""")
# the plan's own module; the kernels' guard (a layer below the plan) on where their input tensors are
ALLOWED = {"clid/run/runtime.py", "clid/ops/device.py"}


def test_only_the_plan_tests_the_device_type():
    sources = sorted(ROOT.glob("clid/**/*.py")) + sorted(ROOT.glob("0*.py"))
    found = []
    for path in sources:
        name = path.relative_to(ROOT).as_posix()
        if name in ALLOWED:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if DEVICE_TESTS.search(line.split("#")[0]):
                found.append(f"{name}:{number}: {line.strip()}")
    assert not found, "the device type is tested outside clid/run/runtime.py (ask the device plan):\n" + "\n".join(found)


def test_the_check_finds_a_device_test():
    for line in ('if device.type == "cuda":', "x.is_cuda", "torch.cuda.is_available()", 'd.startswith("cuda")',
                 '"cuda" if ok else "cpu"', 'runtime.device_type(d) != "cuda"'):
        assert DEVICE_TESTS.search(line), line
    assert not DEVICE_TESTS.search('help="cpu, cuda, cuda:1, ..."')


def test_cpu_plan():
    plan = runtime.device_plan("cpu")
    assert plan.device == torch.device("cpu") and not plan.gpu
    assert (plan.precision, plan.compute, plan.dtype) == ("auto", "fp32", torch.float32)
    assert plan.grouped_encoding and plan.head == "fused"
    assert not plan.pin_memory and not plan.defer_checks and plan.fused_optimizer
    assert not plan.batch_by_memory and plan.dist_backend == "gloo"
    assert plan.loader_workers("auto") == 0 and plan.loader_workers(3) == 3
    bf16 = runtime.device_plan("cpu", "bf16")
    assert (bf16.compute, bf16.dtype) == ("bf16", torch.bfloat16)


@pytest.mark.parametrize("name", ["cuda", "cuda:1"])
def test_gpu_plan(name, monkeypatch):
    """A GPU's plan, computed without one (only the loader's workers look at the machine)."""
    plan = runtime.device_plan(name)
    assert plan.device == torch.device(name) and plan.gpu and plan.type == "cuda"
    assert (plan.compute, plan.dtype) == ("bf16", torch.bfloat16)
    assert runtime.device_plan(name, "fp32").compute == "fp32"
    assert not plan.grouped_encoding and plan.head == "eager"
    assert plan.pin_memory and plan.defer_checks and plan.fused_optimizer
    assert plan.batch_by_memory and plan.dist_backend == "nccl"
    monkeypatch.setattr(runtime, "available_workers", lambda: 16)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert plan.loader_workers("auto") == 4
    monkeypatch.setattr(runtime, "available_workers", lambda: 4)
    assert plan.loader_workers("auto") == 1 and plan.loader_workers(0) == 0


def test_plan_switches_and_defaults():
    plan = runtime.device_plan("cpu")
    other = plan.replace(grouped_encoding=False, head="eager")
    assert not other.grouped_encoding and other.head == "eager" and plan.grouped_encoding  # (frozen: a new plan)
    assert runtime.as_plan(plan) is plan and runtime.as_plan("cpu", "bf16").compute == "bf16"
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert runtime.device_plan(None).device.type == expected
    with pytest.raises(Exception):
        plan.gpu = True


def test_encoding_follows_the_plan():
    """encode's default is the plan's encoding for its tensors' device; a given choice wins."""
    from clid.model.captioner import build_model, preset_config

    torch.manual_seed(0)
    model = build_model(preset_config("tiny", 8)).eval()
    calls = []
    original = model.encoder.forward

    def counting(*args, **kwargs):
        calls.append(args[0].shape[1])
        return original(*args, **kwargs)

    model.encoder.forward = counting
    regions, pos = torch.randn(2, 3, 8), torch.rand(2, 3, 6)
    rmask = torch.ones(2, 3, dtype=torch.bool)
    ids = torch.tensor([[5, 6, 7, 8], [5, 6, model.pad_id, model.pad_id]])
    levels = torch.tensor([1, 1])
    with torch.no_grad():
        grouped = model.encode(regions, pos, rmask, ids, levels)
        assert len(calls) == 2  # on the CPU: a pass per text length
        calls.clear()
        padded = model.encode(regions, pos, rmask, ids, levels, grouped=False)
        assert len(calls) == 1
    torch.testing.assert_close(grouped, padded, rtol=1e-4, atol=1e-5)
