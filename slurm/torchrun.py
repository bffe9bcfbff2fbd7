"""torchrun (torch.distributed.run) for a SLURM job that may be told to stop, or whose worker fails.

On SIGTERM torchrun passes the signal to its workers, which save a checkpoint and stop, and then ends in a
SignalException traceback with exit code 1, which reads as a crash in the job's log. Here it ends with one line
instead, and exit code 128 + the signal. A worker that fails (a stage's one-line error, printed by rank 0) ends
torchrun in a ChildFailedError traceback of about 60 lines; here in one line naming the rank and its exit code,
and torchrun's exit code 1. Usage: as torchrun (python slurm/torchrun.py [torchrun flags] SCRIPT ...).
"""
import sys

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import main

if __name__ == "__main__":
    try:
        main()
    except SignalException as stop:
        print(f"torchrun: stopped by {stop.sigval.name}: the workers were told to save and stop", file=sys.stderr, flush=True)
        sys.exit(128 + int(stop.sigval))
    except ChildFailedError as failed:
        rank, failure = failed.get_first_failure()
        print(f"torchrun: {failed.name}: rank {rank} exited with code {failure.exitcode} (its error is above; "
              f"{len(failed.failures)} of the job's processes failed)", file=sys.stderr, flush=True)
        sys.exit(1)
