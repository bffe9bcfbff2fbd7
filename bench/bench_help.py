"""Benchmark of `--help`: how long each stage script and command takes to answer it, in a fresh interpreter.

In:  nothing (the stage scripts 00 to 07 and every ``python -m clid.X`` command found on disk).
Out: a table on stdout: per command, the median wall time of --rounds fresh runs of ``python ... --help``
     [lowest-highest] against the 1.0 s target, and ``python -c "import torch"`` for scale (the peer: what
     a script that imports torch before it parses its flags pays at least); --out DIR also writes it to
     DIR/bench_help.md and .json with the date, the commit, the CPU and the load.

    python bench/bench_help.py --rounds 3 --out docs/measurements/DATE-cpu

The runs are interleaved: each round runs every command once, in the same order.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from clid.run.cli import HelpFormatter, run_main
from clid.run.measured import context_lines, load_text, write_measurement

ROOT = Path(__file__).resolve().parent.parent
TARGET_S = 1.0
TORCH = ["-c", "import torch"]


def commands() -> list[list[str]]:
    """The argument lists after ``python``: each stage script, then each ``clid`` module that runs as a command."""
    stages = [[p.name, "--help"] for p in sorted(ROOT.glob("[0-9][0-9]_*.py"))]
    modules = sorted(".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__main__")
                     for p in ROOT.glob("clid/**/*.py") if 'if __name__ == "__main__"' in p.read_text())
    return [*stages, *[["-m", m, "--help"] for m in modules]]


def wall_time(args: list[str]) -> float:
    """Seconds of one fresh ``python ARGS``, run from the repository's root; a failure is an error."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"error: python {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
    return seconds


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=HelpFormatter)
    p.add_argument("--rounds", type=int, default=3, help="fresh runs of each command (interleaved)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="also write the table with the date, commit, CPU and load to DIR/bench_help.md (and .json)")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds {args.rounds}: give 1 or more")

    context = context_lines(f"python bench/bench_help.py {' '.join(argv if argv is not None else sys.argv[1:])}")
    for line in context:
        print(f"# {line}", flush=True)
    runs = [*commands(), TORCH]
    times = {tuple(a): [] for a in runs}
    for _ in range(args.rounds):
        for a in runs:
            times[tuple(a)].append(wall_time(a))
    context.append(f"load average (1, 5, 15 min) after: {load_text()}")
    print(f"# {context[-1]}")

    header = ["command", "median (s)", "range (s)", "target: <= 1.0 s"]
    rows, cells = [], []
    for a in runs:
        seconds = times[tuple(a)]
        median = statistics.median(seconds)
        name = 'python -c "import torch" (for scale)' if a == TORCH else f"`{' '.join(a)}`"
        verdict = "" if a == TORCH else ("met" if median <= TARGET_S else "MISSED")
        rows.append({"command": " ".join(a), "seconds_rounds": seconds, "median": median, "met": verdict == "met"})
        cells.append([name, f"{median:.2f}", f"{min(seconds):.2f}-{max(seconds):.2f}", verdict])
    table = ["| " + " | ".join(header) + " |", "|---|---|---|---|", *["| " + " | ".join(c) + " |" for c in cells]]
    print("\n".join(table))
    if args.out:
        body = [f"Wall time of a fresh `python ... --help` from the repository's root, median of {args.rounds} "
                "interleaved rounds [lowest-highest].", "", *table]
        md = write_measurement(args.out, "bench_help", context, body, rows, {"header": header, "rows": cells})
        print(f"# wrote {md}")


if __name__ == "__main__":
    run_main(main)
