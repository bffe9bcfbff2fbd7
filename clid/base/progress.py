"""Progress of every long loop, in one place: a tqdm bar on a terminal, plain lines in a log file.

    with Progress(total=1000, desc="04 trusted", unit="step") as bar:
        for step in ...:
            bar.update(1, loss=2.31, lr=5e-5)

On a terminal (stderr is a TTY) this is a tqdm bar, with the last values given to :meth:`update`
after it. When the output goes to a file, as under SLURM, a ``\\r``-updated bar would be one endless
line; instead a plain line is printed to stdout at the first update (so a log shows at once that the
loop runs, and how fast), then every ``seconds`` seconds (and every ``every`` items when given), and
once at the end:

    04 trusted: step 1200/100000 (1%), loss 3.214, lr 5.00e-05, 4.1 step/s, 4m53s elapsed, 6h41m left

The interval defaults to 60 seconds; the environment variable ``CLID_PROGRESS_SECONDS`` overrides it
(0: a line at every update).
"""
from __future__ import annotations

import os
import sys
import time

LARGE = 20_000  # records: a loader or tokenizer loop over this many shows progress (COCO: 123,287 images)


def plain_output() -> bool:
    """Whether progress is written as plain lines: the output is not a terminal."""
    return not sys.stderr.isatty()


def duration(seconds: float) -> str:
    """A short duration: 42s, 4m53s, 6h41m."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def shown(value) -> str:
    if isinstance(value, float):
        return f"{value:.2e}" if value and abs(value) < 1e-3 else f"{value:.3f}"
    return str(value)


class Progress:
    """A bar on a terminal, plain periodic lines otherwise (see the module docstring). ``disable``: show
    nothing (e.g. DDP ranks other than 0)."""

    def __init__(self, total: int, desc: str, unit: str = "it", initial: int = 0, disable: bool = False,
                 seconds: float | None = None, every: int | None = None, leave: bool = True):
        self.total, self.desc, self.unit, self.done = total, desc, unit, initial
        self.disable, self.every = disable, every
        self.seconds = float(os.environ.get("CLID_PROGRESS_SECONDS", 60)) if seconds is None else seconds
        self.plain = plain_output()
        self.stats: dict = {}
        self.started = self.last_time = time.time()
        self.start_count = self.last_count = initial
        self.bar = None
        if not disable and not self.plain:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, desc=desc, unit=unit, dynamic_ncols=True, leave=leave)

    def update(self, n: int = 1, **stats) -> None:
        """``n`` more items done; ``stats`` (loss=..., lr=...) are shown with the progress."""
        self.done += n
        self.stats.update(stats)
        if self.disable:
            return
        if self.bar is not None:
            if stats:
                self.bar.set_postfix({k: shown(v) for k, v in self.stats.items()}, refresh=False)
            self.bar.update(n)
            return
        if self.done == self.last_count:  # nothing new since the last line (an update of 0): no line twice
            return
        now = time.time()
        if (self.last_count == self.start_count or now - self.last_time >= self.seconds
                or (self.every and self.done // self.every > self.last_count // self.every) or self.done >= self.total):
            self.line(now)

    def line(self, now: float | None = None) -> None:
        """Print the plain progress line now."""
        now = time.time() if now is None else now
        rate = (self.done - self.start_count) / max(now - self.started, 1e-9)
        parts = [f"{self.unit} {self.done}/{self.total}" + (f" ({100 * self.done / self.total:.0f}%)" if self.total else "")]
        parts += [f"{k} {shown(v)}" for k, v in self.stats.items()]
        parts.append(f"{rate:.1f} {self.unit}/s" if rate >= 1 else f"{rate:.2g} {self.unit}/s")
        parts.append(f"{duration(now - self.started)} elapsed")
        if rate > 0 and self.done < self.total:
            parts.append(f"{duration((self.total - self.done) / rate)} left")
        print(f"{self.desc}: " + ", ".join(parts), flush=True)
        self.last_time, self.last_count = now, self.done

    def write(self, text: str) -> None:
        """Print a line without breaking the bar."""
        if self.bar is not None:
            self.bar.write(text)
        elif not self.disable:
            print(text, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif not self.disable and self.plain and self.last_count != self.done:
            self.line()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
