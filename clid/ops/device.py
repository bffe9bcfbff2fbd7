"""Where an op may run: a GPU tensor needs a build with CUDA kernels."""
from __future__ import annotations

import functools

import torch


@functools.cache
def _built_with_cuda() -> bool:
    return torch.ops.clid.with_cuda()


def check_device(op: str, *tensors) -> None:
    """One clear error for GPU tensors when clid._C has no CUDA kernels."""
    if any(t is not None and t.is_cuda for t in tensors) and not _built_with_cuda():
        raise RuntimeError(f"clid.ops.{op}: the inputs are on the GPU, but clid._C was built without CUDA kernels "
                           "(PyTorch without CUDA, or no CUDA toolkit when it was installed); reinstall with "
                           "`pip install --no-build-isolation -e .` where both are present")


def check_on_gpu(op: str, cpu_twin: str, *tensors) -> None:
    """One clear error for a CUDA-only op given tensors that are not all on a GPU, naming its CPU twin."""
    if not all(t.is_cuda for t in tensors if t is not None):
        raise RuntimeError(f"clid.ops.{op}: a CUDA kernel (tensor cores), but the inputs are not on a GPU; "
                           f"clid.ops.{cpu_twin} computes the same on the CPU")
