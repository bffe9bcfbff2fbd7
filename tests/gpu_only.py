"""A pytest plugin for bench/gpu_check.sh (``-p gpu_only`` with tests/ on the path): it keeps only the GPU
tests, those skipped where there is no GPU (a ``skipif`` whose reason names a GPU).

CLID_GPU_TESTS=assert keeps those that expect a device-side assertion (it ends the CUDA context of the process
it happens in, so they run in a pytest of their own), =rest the others, =all (the default) both."""
import os

import pytest


def is_gpu_test(item) -> bool:
    return any("GPU" in str(mark.kwargs.get("reason", "")) for mark in item.iter_markers("skipif"))


def pytest_collection_modifyitems(config, items):
    which = os.environ.get("CLID_GPU_TESTS", "all")
    if which not in ("all", "assert", "rest"):
        raise pytest.UsageError(f"CLID_GPU_TESTS must be all, assert or rest, not {which!r}")
    keep, drop = [], []
    for item in items:
        expects_assertion = "device_assertion" in item.name
        wanted = is_gpu_test(item) and (which == "all" or (which == "assert") == expects_assertion)
        (keep if wanted else drop).append(item)
    config.hook.pytest_deselected(items=drop)
    items[:] = keep
