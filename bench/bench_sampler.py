"""Benchmark of the sampler kernels (clid.ops) against the usual ways of doing the same on this machine.

In:  nothing (N(0, 1) scores, the shape of the quality scores u; --device cuda on a GPU machine).
Out: a table on stdout with both times and their ratio measured in the same run, the issue's
     target and whether it is met; --json FILE also writes the rows.

    python bench/bench_sampler.py                          # M = 1M, 10M, 100M (about 10 minutes)
    python bench/bench_sampler.py --sizes 1e6 1e7 --limit 60

The draw is step 6 at iteration 1 with the paper's values: T = the 2nd percentile of u, s = 1,
k = 90% of M (the authors' k = (100 - c i)% at i = 5), weights f = 0.5 (1 + tanh((u - T) / s)).
  smoothstep_sample            vs numpy.random.choice(M, k, replace=False, p=f/sum f)  (the authors')
                               vs torch.multinomial(f, k, replacement=False)
  kth_value(u, 2% of M)        vs numpy.percentile(u, 2)
Each peer runs in a subprocess with a time limit (--limit seconds): a peer that refuses the size
(torch.multinomial above 2^24 categories), runs out of memory or out of time is reported as such.
Times are wall-clock, the best of --rounds runs (one run at 100M and for slow peers). Ours is
timed with torch's thread count and with one thread, and the faster counts: on a shared machine
whose other cores are busy, waking a second thread can cost more than it saves (the load average
is printed for that reason).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import clid.ops as ops  # noqa: E402
from clid.cli import HelpFormatter  # noqa: E402

TARGETS = {"numpy.random.choice": 100.0, "torch.multinomial": 10.0, "numpy.percentile": 3.0}  # at M = 10M
SEED, ITERATION, S, PERCENT, KEEP = 0, 1, 1.0, 2.0, 0.9


def scores(m: int) -> np.ndarray:
    return np.random.default_rng(SEED).normal(size=m).astype(np.float32)


def best_time(fn, rounds: int, enough: float = 10.0) -> float:
    """The fastest of `rounds` runs (a run longer than `enough` seconds is not repeated)."""
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
        if best > enough:
            break
    return best


# ---------------------------------------------------------------------------------------------
# Peers, each run in its own process: `python bench_sampler.py --peer NAME --m M --rounds R`
# prints {"seconds": ...} or {"error": ...}.

def run_peer(name: str, m: int, rounds: int) -> dict:
    u = scores(m)
    threshold = np.percentile(u, PERCENT)
    k = int(KEEP * m)
    weights = 0.5 * (1.0 + np.tanh((u.astype(np.float64) - threshold) / S))
    if name == "numpy.random.choice":
        p = weights / weights.sum()
        np.random.seed(SEED)
        return {"seconds": best_time(lambda: np.random.choice(m, k, replace=False, p=p), rounds)}
    if name == "torch.multinomial":
        w = torch.from_numpy(weights)
        try:
            return {"seconds": best_time(lambda: torch.multinomial(w, k, replacement=False), rounds)}
        except RuntimeError as err:
            message = str(err).splitlines()[0]
            return {"error": "refuses M > 2^24" if "2^24" in message else f"refuses: {message}"}
    if name == "numpy.percentile":
        return {"seconds": best_time(lambda: np.percentile(u, PERCENT), rounds)}
    raise ValueError(name)


def peer_in_subprocess(name: str, m: int, rounds: int, limit: float) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--peer", name, "--m", str(m), "--rounds", str(rounds)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        return {"error": f"> {limit:.0f} s (time limit)"}
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        if proc.returncode < 0 or "MemoryError" in proc.stderr or "Unable to allocate" in proc.stderr:
            return {"error": f"out of memory ({tail[:80]})"}
        return {"error": f"failed: {tail[:100]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------

def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=HelpFormatter)
    p.add_argument("--sizes", type=float, nargs="+", default=[1e6, 1e7, 1e8])
    p.add_argument("--rounds", type=int, default=3, help="runs per method (one at M >= 1e8 and for peers over 10 s)")
    p.add_argument("--limit", type=float, default=300.0, help="seconds a peer may take (per size)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None,
                   help="time ours with this many threads only (default: torch's count and 1, the faster counts)")
    p.add_argument("--json", default=None, help="also write the rows to this file")
    p.add_argument("--peer", default=None, help=argparse.SUPPRESS)
    p.add_argument("--m", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.peer:
        print(json.dumps(run_peer(args.peer, args.m, args.rounds)))
        return

    if ops.extension() is None:
        sys.exit(f"bench_sampler: the clid_ops extension is unavailable ({ops.build_error()})")
    default_threads = torch.get_num_threads()
    thread_counts = sorted({default_threads, 1} if args.threads is None else {args.threads}, reverse=True)
    print(f"# {os.cpu_count()} CPUs, ours timed with {thread_counts} threads (the faster counts; peers use "
          f"{default_threads}), device {args.device}, load average {os.getloadavg()[0]:.1f} at start")
    rows = []
    header = (f"{'M':>11}  {'ours':<28} {'time':>9}  {'by thread count (s)':<22}  {'peer':<20} {'peer time':>26}"
              f"  {'ratio':>8}  target@10M")
    print(header)
    for size in args.sizes:
        m = int(size)
        rounds = 1 if m >= 100_000_000 else args.rounds
        u = torch.from_numpy(scores(m)).to(args.device)
        k = int(KEEP * m)
        rank = max(1, int(PERCENT / 100 * m))
        threshold = ops.percentile_threshold(u, PERCENT)
        ours = {}  # op -> {threads: seconds}
        for threads in thread_counts:
            torch.set_num_threads(threads)
            ours.setdefault("smoothstep_sample", {})[threads] = best_time(
                lambda: ops.smoothstep_sample(u, threshold, S, k, SEED, ITERATION), rounds)
            ours.setdefault("kth_value", {})[threads] = best_time(lambda: ops.kth_value(u, rank), rounds)
        torch.set_num_threads(default_threads)
        for op, peer in [("smoothstep_sample", "numpy.random.choice"), ("smoothstep_sample", "torch.multinomial"),
                         ("kth_value", "numpy.percentile")]:
            result = peer_in_subprocess(peer, m, rounds, args.limit)
            mine = min(ours[op].values())
            threads_text = " ".join(f"{t}t:{ours[op][t]:.4f}" for t in thread_counts)
            timed_out = "time limit" in result.get("error", "")
            ratio = result["seconds"] / mine if "seconds" in result else (args.limit / mine if timed_out else None)
            if "seconds" in result:
                peer_text, ratio_text = f"{result['seconds']:.4f} s", f"{ratio:.1f}x"
            else:
                peer_text, ratio_text = result["error"][:26], (f"> {ratio:.0f}x" if timed_out else "-")
            target = TARGETS[peer]
            met = "" if m != 10_000_000 or ratio is None else (" met" if ratio >= target else " NOT met")
            label = f"{op}(k={k})" if op == "smoothstep_sample" else f"{op}(k={rank})"
            print(f"{m:>11,}  {label:<28} {mine:>7.4f} s  {threads_text:<22}  {peer:<20} {peer_text:>26}  {ratio_text:>8}"
                  f"  >= {target:g}x{met}", flush=True)
            rows.append({"M": m, "op": op, "seconds": mine, "seconds_by_threads": ours[op], "peer": peer,
                         "peer_seconds": result.get("seconds"),
                         "peer_error": result.get("error"), "ratio": ratio, "ratio_is_lower_bound": timed_out,
                         "target_at_10M": target})
        del u
    print(f"# load average {os.getloadavg()[0]:.1f} at end")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
