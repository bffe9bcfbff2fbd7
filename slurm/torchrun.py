"""torchrun (torch.distributed.run) for a SLURM job that may be told to stop.

On SIGTERM torchrun passes the signal to its workers, which save a checkpoint and stop, and then ends in a
SignalException traceback with exit code 1, which reads as a crash in the job's log. Here it ends with one line
instead, and exit code 128 + the signal. Usage: as torchrun (python slurm/torchrun.py [torchrun flags] SCRIPT ...).
"""
import sys

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.run import main

if __name__ == "__main__":
    try:
        main()
    except SignalException as stop:
        print(f"torchrun: stopped by {stop.sigval.name}: the workers were told to save and stop", file=sys.stderr, flush=True)
        sys.exit(128 + int(stop.sigval))
