"""torchrun (torch.distributed.run) for a SLURM job that may be told to stop, or whose worker fails.

On SIGTERM torchrun passes the signal to its workers, which save a checkpoint and stop, and then ends in a
SignalException traceback with exit code 1, which reads as a crash in the job's log. Here it ends with one line
instead, and exit code 128 + the signal. A signal that comes while torchrun is still starting its workers finds
them unknown to it, and torchrun would leave them running, unsignalled: here every worker still alive gets the
signal too, and is waited for (killed after STOP_GRACE seconds, as torchrun does). A worker that fails (a stage's
one-line error, printed by rank 0) ends torchrun in a ChildFailedError traceback of about 60 lines; here in one
line naming the rank and its exit code, and torchrun's exit code 1. Usage: as torchrun (python slurm/torchrun.py
[torchrun flags] SCRIPT ...).
"""
import os
import signal
import sys
import time

STOP_GRACE = 30.0  # seconds a signalled worker has to save and stop (torchrun's own wait)


def children() -> list[int]:
    """The process ids of this process's children (Linux: read from /proc)."""
    me, found = os.getpid(), []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue  # (a process that ended meanwhile)
            if parent == me:
                found.append(int(entry))
    return found


def stop_children(sig: int, grace: float = STOP_GRACE) -> None:
    """Send ``sig`` to every child still running and wait for them; kill those alive after ``grace`` seconds."""
    pids = children()
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    while pids:
        running = []
        for pid in pids:
            try:
                if os.waitpid(pid, os.WNOHANG) == (0, 0):
                    running.append(pid)
            except ChildProcessError:  # (reaped already)
                pass
        pids = running
        if pids and time.monotonic() > deadline:
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            deadline = float("inf")
        time.sleep(0.05)


def launch(main) -> None:
    """Run torchrun's ``main``; a signal or a failed worker ends in one line and its exit code."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    try:
        main()
    except SignalException as stop:
        stop_children(int(stop.sigval))
        print(f"torchrun: stopped by {stop.sigval.name}: the workers were told to save and stop", file=sys.stderr, flush=True)
        sys.exit(128 + int(stop.sigval))
    except ChildFailedError as failed:
        rank, failure = failed.get_first_failure()
        print(f"torchrun: {failed.name}: rank {rank} exited with code {failure.exitcode} (its error is above; "
              f"{len(failed.failures)} of the job's processes failed)", file=sys.stderr, flush=True)
        sys.exit(1)


if __name__ == "__main__":
    from torch.distributed.run import main as torchrun_main

    launch(torchrun_main)
