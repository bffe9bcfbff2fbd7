"""``python -m clid.stats``: the caption and level statistics of a captions file (the code: ``clid.data.stats``)."""
from clid.data.stats import main
from clid.run.cli import run_main

if __name__ == "__main__":
    run_main(main)
