"""How a stage uses its device: the arithmetic precision (``--precision``) and the batch size
(``--batch-size auto``), one home for the stages that run a model (03 to 07, ``clid.caption``).

``--precision``:

- ``auto`` (the default): bfloat16 autocast on a GPU, with TF32 allowed for the float32 parts
  (matrix products and convolutions that autocast leaves in float32); float32 on the CPU, where every
  result stays what it was before the flag existed;
- ``fp32``: float32 everywhere, TF32 off;
- ``bf16``: bfloat16 autocast on any device (on a CPU it is slower unless the CPU has AMX or
  AVX512-BF16).

``--batch-size auto`` picks, on a GPU, the largest batch whose activations fit in half of the free
memory (at most a stage's cap, a multiple of 64); on the CPU the stage's fixed default.
"""
from __future__ import annotations

import argparse
import contextlib

import torch

from clid.run.cli import whole_number

PRECISIONS = ("auto", "fp32", "bf16")
PRECISION_HELP = ("auto: bfloat16 autocast on a GPU (TF32 for its float32 parts), float32 on the CPU; fp32: float32 "
                  "everywhere; bf16: bfloat16 autocast on any device")


def add_precision_arg(parser) -> None:
    parser.add_argument("--precision", choices=PRECISIONS, default="auto", help=PRECISION_HELP)


def device_type(device) -> str:
    """"cuda" or "cpu" of a device, a device name ("cuda:1", checked where --device is parsed) or None (the CPU)."""
    return torch.device(device).type if device is not None else "cpu"


def resolve(precision: str, device) -> str:
    """The precision ``precision`` means on ``device``: "fp32" or "bf16"."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, not {precision!r}")
    if precision == "auto":
        return "bf16" if device_type(device) == "cuda" else "fp32"
    return precision


def use_precision(precision: str, device) -> str:
    """Set torch's float32 matrix precision for ``precision`` on ``device`` (TF32 on a GPU under auto, off
    otherwise) and return the resolved precision, "fp32" or "bf16". Call once when a stage starts."""
    if device_type(device) == "cuda":
        tf32 = precision == "auto"
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
    return resolve(precision, device)


def autocast(precision: str, device):
    """The autocast context of a resolved or unresolved precision on ``device`` (a no-op for fp32)."""
    if resolve(precision, device) == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type(device), dtype=torch.bfloat16)


# ---------------------------------------------------------------------------------------------
# --batch-size auto


def batch_size_arg(text: str):
    """argparse type of ``--batch-size``: a positive integer or "auto"."""
    if text == "auto":
        return text
    try:
        value = whole_number(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer (digits 0-9) or 'auto', got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'auto', got {value}")
    return value


def add_batch_size_arg(parser, cpu_default: int, what: str) -> None:
    parser.add_argument("--batch-size", type=batch_size_arg, default="auto",
                        help=f"{what}; auto: {cpu_default} on the CPU, on a GPU as many as half its free memory holds")


def batch_size(requested, device, bytes_per_item: float, cpu_default: int, most: int = 1024) -> int:
    """``requested`` when it is a number; for "auto": ``cpu_default`` off the GPU, else the largest
    multiple of 64 (at least 1, at most ``most``) whose ``bytes_per_item`` fit in half the free memory."""
    if requested != "auto":
        return int(requested)
    if device_type(device) != "cuda":
        return cpu_default
    free, _ = torch.cuda.mem_get_info(torch.device(device))
    fits = int(0.5 * free / max(bytes_per_item, 1.0))
    return max(1, min(most, fits // 64 * 64 if fits >= 64 else fits))


def encoder_bytes(config, positions: int, precision: str) -> float:
    """Bytes of the captioner's activations for one item of ``positions`` positions (regions and text) in a
    forward pass without gradients: a generous count of what one layer holds at a time."""
    width = 2 if precision == "bf16" else 4
    return width * positions * (8 * config.hidden_size + 2 * config.intermediate_size + config.num_heads * positions)


def pin(tensors, device):
    """``tensors`` in pinned memory when they go to a GPU (so their copy can overlap the GPU's work)."""
    if device_type(device) != "cuda":
        return tensors
    return [t.pin_memory() for t in tensors]


def to_device(tensors, device):
    """Copies of CPU tensors on ``device``; to a GPU from pinned memory without waiting for it."""
    if device_type(device) != "cuda":
        return [t.to(device) for t in tensors]
    return [(t if t.is_pinned() else t.pin_memory()).to(device, non_blocking=True) for t in tensors]


def prefetch(items, make, device):
    """``make(item)`` for each item, in order. Towards a GPU, the next item's is made in a second thread
    while the caller uses the current one (the GPU works meanwhile); on the CPU, one after the other."""
    if device_type(device) != "cuda":
        yield from (make(item) for item in items)
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        pending = None
        for item in items:
            current, pending = pending, pool.submit(make, item)
            if current is not None:
                yield current.result()
        if pending is not None:
            yield pending.result()
