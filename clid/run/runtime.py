"""How a stage uses its device, one home for every stage and command: the device plan
(:class:`DevicePlan`, made once by :func:`device_plan` from ``--device`` and ``--precision``), the
arithmetic precision (``--precision``) and the batch size (``--batch-size auto``).

This is the one module that asks what kind of device a stage runs on; the others ask the plan.

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
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from clid.run.cli import whole_number

if TYPE_CHECKING:  # (torch is imported where it is used: importing this module leaves it out, for --help)
    import torch

PRECISIONS = ("auto", "fp32", "bf16")
PRECISION_HELP = ("auto: bfloat16 autocast on a GPU (TF32 for its float32 parts), float32 on the CPU; fp32: float32 "
                  "everywhere; bf16: bfloat16 autocast on any device")


def add_precision_arg(parser) -> None:
    parser.add_argument("--precision", choices=PRECISIONS, default="auto", help=PRECISION_HELP)


def device_type(device) -> str:
    """"cuda" or "cpu" of a device, a device name ("cuda:1", checked where --device is parsed) or None (the CPU)."""
    import torch

    return torch.device(device).type if device is not None else "cpu"


# ---------------------------------------------------------------------------------------------
# --device and the device plan

DEVICE_HELP = "cuda, cuda:1, cpu, ... (default: cuda if available, else cpu)"


def device_problem(text: str) -> str | None:
    """Why ``text`` is not a device to run on here (``cpu``, ``cuda``, ``cuda:N`` of a GPU that is there), or None."""
    if text == "cpu":  # (the default of some commands, converted as argparse parses: no torch needed)
        return None
    import torch

    try:
        where = torch.device(text)
    except (RuntimeError, ValueError):
        where = None
    if where is None or where.type not in ("cpu", "cuda"):
        return f"must be cpu, cuda or cuda:N, got {text!r}"
    count = torch.cuda.device_count() if where.type == "cuda" else 0
    if where.type == "cuda" and not count:
        return f"{text}: no CUDA GPU is available here (or this PyTorch has no CUDA); give --device cpu"
    if where.type == "cuda" and where.index is not None and where.index >= count:
        return f"{text}: this machine has {count} GPU(s), cuda:0 to cuda:{count - 1}"
    return None


def device_arg(text: str) -> str:
    """argparse type of ``--device`` (:func:`device_problem`)."""
    if problem := device_problem(text):
        raise argparse.ArgumentTypeError(problem)
    return text


def add_device_arg(parser, default=None, help: str = DEVICE_HELP) -> None:
    """``--device``, the one definition of every stage and command that has it (None: :func:`default_device`)."""
    parser.add_argument("--device", type=device_arg, default=default, help=help)


def default_device(index: int | None = None) -> torch.device:
    """The GPU when there is one (the ``index``-th; default: the current one), else the CPU."""
    import torch

    if torch.cuda.is_available():
        return torch.device("cuda", index) if index is not None else torch.device("cuda")
    return torch.device("cpu")


def available_workers() -> int:
    """The cores this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@dataclass(frozen=True)
class DevicePlan:
    """Every choice that depends on where a stage runs, made once (:func:`device_plan`) and passed down.

    On a GPU: bfloat16 autocast under ``--precision auto``, one padded encoder pass per batch (its small
    grouped passes and the synchronisations that form them would cost more than the padding), the plain
    head (cuBLAS and torch's kernels beat the fused op there), loader processes that hand over pinned
    batches, checks of finite values deferred to the log steps (no wait for the device inside a step),
    ``--batch-size auto`` measured from the free memory. On the CPU: float32, the encoder's grouped passes
    (no compute on padded text), the fused head (no [P, V] logits), batches made in the training process,
    a check after every step. The fused AdamW kernel everywhere: the same update rule as the default loop.
    """
    device: torch.device
    precision: str  # the flag as given: auto, fp32 or bf16 (what it means here: :attr:`compute`)
    gpu: bool  # the device is a CUDA GPU
    compute: str  # the resolved precision: "fp32" or "bf16"
    grouped_encoding: bool  # the encoder runs rows of equal text length together (else one padded pass)
    head: str  # Eq. 2's head: "fused" (clid.ops.token_logprob_hidden) or "eager" (linear, log_softmax, gather)
    pin_memory: bool  # batches go to the device from pinned memory, without waiting
    defer_checks: bool  # the training loop checks finite values at the log steps only (no host sync per step)
    fused_optimizer: bool  # AdamW's fused kernel
    batch_by_memory: bool  # --batch-size auto is measured from the device's free memory
    dist_backend: str  # the process group's backend under torchrun

    @property
    def dtype(self) -> torch.dtype:
        """The compute dtype of the autocast regions."""
        import torch

        return torch.bfloat16 if self.compute == "bf16" else torch.float32

    @property
    def type(self) -> str:
        """The device's kind, "cuda" or "cpu" (for a library that takes it by name)."""
        return self.device.type

    def loader_workers(self, requested) -> int:
        """--workers: a number, or "auto": none on the CPU (they would take its cores from the training), four on
        a GPU (fewer on a machine with fewer cores to spare)."""
        import torch

        if requested != "auto":
            return int(requested)
        if not self.gpu:
            return 0
        return max(0, min(4, available_workers() // max(1, torch.cuda.device_count()) - 1))

    def use(self) -> str:
        """Set torch's float32 matrix precision for this plan (:func:`use_precision`); returns :attr:`compute`."""
        return use_precision(self.precision, self.device)

    def autocast(self):
        """The autocast context of this plan (a no-op for fp32)."""
        return autocast(self.compute, self.device)

    def replace(self, **choices) -> "DevicePlan":
        """This plan with other choices (a benchmark's switch, a test's)."""
        from dataclasses import replace

        return replace(self, **choices)


def device_plan(device=None, precision: str = "auto") -> DevicePlan:
    """The plan of a stage on ``device`` (a torch device, a name such as "cuda:1", or None: :func:`default_device`)
    under ``precision`` (--precision)."""
    import torch

    device = torch.device(device) if device is not None else default_device()
    gpu = device.type == "cuda"
    return DevicePlan(device=device, precision=precision, gpu=gpu, compute=resolve(precision, device),
                      grouped_encoding=not gpu, head="eager" if gpu else "fused", pin_memory=gpu, defer_checks=gpu,
                      fused_optimizer=True, batch_by_memory=gpu, dist_backend="nccl" if gpu else "gloo")


def as_plan(device, precision: str = "auto") -> DevicePlan:
    """``device`` when it is a plan already, else :func:`device_plan` of it (a library call given a device)."""
    return device if isinstance(device, DevicePlan) else device_plan(device, precision)


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
    import torch

    if device_type(device) == "cuda":
        tf32 = precision == "auto"
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
    return resolve(precision, device)


def autocast(precision: str, device):
    """The autocast context of a resolved or unresolved precision on ``device`` (a no-op for fp32)."""
    import torch

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


def set_threads(threads: int) -> None:
    """A ``--threads`` flag: torch's thread count in this process (0 keeps torch's own: OMP_NUM_THREADS or the
    cores). A CPU splits its float sums by the thread count, so only a fixed count gives the same numbers
    whatever the machine or the environment grants."""
    if threads:
        import torch

        torch.set_num_threads(threads)


def add_batch_size_arg(parser, cpu_default: int, what: str) -> None:
    parser.add_argument("--batch-size", type=batch_size_arg, default="auto",
                        help=f"{what}; auto: {cpu_default} on the CPU, on a GPU as many as half its free memory holds")


def batch_size(requested, device, bytes_per_item: float, cpu_default: int, most: int = 1024) -> int:
    """``requested`` when it is a number; for "auto": ``cpu_default`` off the GPU, else the largest
    multiple of 64 (at least 1, at most ``most``) whose ``bytes_per_item`` fit in half the free memory."""
    import torch

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
