"""What a dated measurement says about itself: the date, the commit, the CPU and the machine's load.

The benchmarks in bench/ write their tables with ``--out DIR`` through :func:`write_measurement`:
``DIR/NAME.md`` (the context lines, then the tables) and ``DIR/NAME.json`` (the context, the rows and a
``summary`` table that ``python -m clid.tables DIR`` prints into the docs).
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "bmi2", "avx512f", "avx512dq", "avx512vl", "avx512bw")


def cpu_text() -> str:
    """The CPU's model and the vector instruction sets of its flags (/proc/cpuinfo where there is one)."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    isa = " ".join(f for f in ISA_FLAGS if f in flags) or "unknown"
    return f"{model}; {os.cpu_count()} CPUs; ISA flags: {isa}"


def commit_text() -> str:
    """The commit measured, and whether the code (clid/, csrc/, bench/, the stage scripts) differs from it."""
    def git(*args):
        return subprocess.run(["git", *args], check=False, cwd=REPO, capture_output=True, text=True).stdout.strip()
    try:
        commit = git("rev-parse", "--short=10", "HEAD")
        changed = git("status", "--porcelain", "--", "clid", "csrc", "bench", ":(glob)*.py")
    except OSError:
        return "unknown (no git)"
    return (commit or "unknown") + (" with uncommitted changes to the code" if changed else "")


def load_text() -> str:
    """The load average over 1, 5 and 15 minutes."""
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f}, {five:.2f}, {fifteen:.2f}"


def context_lines(command: str) -> list[str]:
    """The lines a measurement starts with: date, commit, CPU, command and the load before it ran."""
    now = datetime.datetime.now(datetime.UTC)
    return [f"date: {now:%Y-%m-%d %H:%M} UTC", f"commit: {commit_text()}", f"CPU: {cpu_text()}",
            f"command: {command}", f"load average (1, 5, 15 min) before: {load_text()}"]


def write_measurement(out, name: str, context: list[str], body: list[str], rows: list, summary: dict) -> Path:
    """Write ``out/name.md`` (the context as a list, then ``body``'s lines) and ``out/name.json`` (context,
    rows and ``summary``: {"header": [...], "rows": [[...], ...]}, the table the docs print); returns the .md."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    md = out / f"{name}.md"
    for path, text in ((md, "\n".join([f"# {name}", "", *[f"- {line}" for line in context], "", *body]) + "\n"),
                       (out / f"{name}.json", json.dumps({"context": context, "rows": rows, "summary": summary},
                                                         indent=1))):
        part = path.with_name(path.name + ".part")
        part.write_text(text, encoding="utf-8")
        os.replace(part, path)
    return md
