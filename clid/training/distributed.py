"""The process group under torchrun, and a stop request (SIGTERM) that every rank agrees on."""
import os
import signal
import threading

import torch
import torch.distributed as dist

from clid.run import runtime
from clid.training.flags import DIST_TIMEOUT_MINUTES


def init_distributed(timeout_minutes: float = DIST_TIMEOUT_MINUTES,
                     precision: str = "auto") -> tuple[int, int, runtime.DevicePlan]:
    """(global rank, world size, device plan); starts the process group under torchrun (gloo on CPU, NCCL on GPU).

    The rank is the global one (``RANK``: checkpoints, logs and the output lock are rank 0's, on one node of
    several); the GPU is the node's ``LOCAL_RANK``-th. A collective waits up to ``timeout_minutes`` for a
    rank that is late, such as rank 0 writing a checkpoint to a slow shared file system, before it fails.
    """
    world = int(os.environ.get("WORLD_SIZE", 1))
    rank = int(os.environ.get("RANK", 0))
    plan = runtime.device_plan(runtime.default_device(int(os.environ.get("LOCAL_RANK", 0))), precision)
    if plan.gpu:
        torch.cuda.set_device(plan.device)
    if world > 1 and not dist.is_initialized():
        from datetime import timedelta

        dist.init_process_group(plan.dist_backend, timeout=timedelta(minutes=timeout_minutes))
    return rank, world, plan


def finish_distributed(out, rank: int, world: int) -> None:
    """Name the finished checkpoint (rank 0) and leave the process group under torchrun."""
    if rank == 0:
        print(f"checkpoint: {out}")
    if world > 1:
        dist.destroy_process_group()


class StopRequest:
    """SIGTERM (what SLURM sends before a time limit, or on preemption) asks the training loop to stop: the
    loop checkpoints after the step it is in and exits, so a requeued job resumes from there."""

    def __init__(self):
        self.signal = 0
        self.name = "SIGTERM"
        self.previous = None
        if threading.current_thread() is threading.main_thread():  # (signals reach the main thread only)
            self.previous = signal.signal(signal.SIGTERM, self.request)

    def request(self, signum, frame) -> None:
        self.signal = signum

    def agreed(self, world: int, device) -> bool:
        """Whether any process was asked to stop (under DDP, all processes agree)."""
        if world == 1:
            return bool(self.signal)
        flag = torch.tensor([self.signal], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        self.signal = int(flag.item())
        return bool(self.signal)

    def restore(self) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)
