"""``python -m clid.shard``: split a stage's inputs into SLURM-array shards, merge them, or say their state
(the code: ``clid.run.shard``)."""
from clid.run.cli import run_main
from clid.run.shard import main

if __name__ == "__main__":
    run_main(main)
