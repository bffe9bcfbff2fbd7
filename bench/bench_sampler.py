"""Benchmark of the sampler kernels (clid.ops) against the usual ways of doing the same on this machine.

In:  nothing (N(0, 1) scores, the shape of the quality scores u; --device cuda on a GPU machine).
Out: a table on stdout, one row per (size, op, peer) printed as it is measured: our time, the peer's,
     and the ratio peer / ours (above 1: ours is faster); a summary line per op with the ratio against
     the fastest peer; --json FILE also writes the rows.

    python bench/bench_sampler.py                          # M = 1M, 10M, 100M (about 10 minutes)
    python bench/bench_sampler.py --sizes 1e6 1e7 --limit 60
    python bench/bench_sampler.py --sizes 1e7 --old-build OLD.so   # against another build of the kernels

The draw is step 6 at iteration 1 with the paper's values: T = the 2nd percentile of u, s = 1,
k = 90% of M (the authors' k = (100 - c i)% at i = 5), weights f = 0.5 (1 + tanh((u - T) / s)).
  smoothstep_sample      vs numpy.random.choice(M, k, replace=False, p=f/sum f)   (the authors' draw)
                         vs torch.multinomial(f, k, replacement=False)
                         vs exponential keys E/f, the k smallest by numpy.argpartition (the same
                            distribution, the best plain NumPy way)
                         vs exponential keys E/f, the k smallest by torch.topk
  kth_value(u, 2% of M)  vs numpy.percentile(u, 2), numpy.partition, torch.kthvalue, torch.quantile
With --device cuda the torch peers run on the GPU and the NumPy peers are left out.
Each peer runs in a subprocess with a time limit (--limit seconds): a peer that refuses the size
(torch.multinomial above 2^24 categories), runs out of memory or out of time is reported as such.
--old-build FILE.so adds another build of the kernels as a peer: the module an earlier version of
this repository compiled (the pybind11 module ``clid_ops`` with ``sampler_successive`` and
``sampler_kth_value``), timed in this process like ours.
Times are wall-clock, the best of --rounds runs (one run at 100M and for slow peers). Ours is
timed with torch's thread count and with one thread, and the faster counts: on a shared machine
whose other cores are busy, waking a second thread can cost more than it saves (the load average
is printed for that reason).
"""
from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

import clid.ops as ops
from clid.run.cli import HelpFormatter, run_main

SEED, ITERATION, S, PERCENT, KEEP = 0, 1, 1.0, 2.0, 0.9
PEERS = {"smoothstep_sample": ("numpy.random.choice", "torch.multinomial", "numpy exp-keys+argpartition",
                               "torch exp-keys+topk"),
         "kth_value": ("numpy.percentile", "numpy.partition", "torch.kthvalue", "torch.quantile")}
GPU_PEERS = {op: tuple(p for p in peers if p.startswith("torch")) for op, peers in PEERS.items()}  # NumPy has no GPU


def scores(m: int) -> np.ndarray:
    return np.random.default_rng(SEED).normal(size=m).astype(np.float32)


def best_time(fn, rounds: int, enough: float = 10.0, device: str = "cpu") -> float:
    """The fastest of `rounds` runs (a run longer than `enough` seconds is not repeated); a GPU run
    is warmed up once and waited for."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    if device.startswith("cuda"):
        fn(); sync()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        fn(); sync()
        best = min(best, time.perf_counter() - start)
        if best > enough:
            break
    return best


# ---------------------------------------------------------------------------------------------
# Peers, each run in its own process: `python bench_sampler.py --peer NAME --m M --rounds R --device D`
# prints {"seconds": ...} or {"error": ...}. The torch peers run on --device, the NumPy ones on the CPU.

def run_peer(name: str, m: int, rounds: int, device: str = "cpu") -> dict:
    u = scores(m)
    threshold = np.percentile(u, PERCENT)
    k = int(KEEP * m)
    rank = max(1, int(PERCENT / 100 * m))
    weights = 0.5 * (1.0 + np.tanh((u.astype(np.float64) - threshold) / S))
    rng = np.random.default_rng(SEED)
    if name == "numpy.random.choice":
        p = weights / weights.sum()
        np.random.seed(SEED)
        return {"seconds": best_time(lambda: np.random.choice(m, k, replace=False, p=p), rounds)}
    if name == "torch.multinomial":
        w = torch.from_numpy(weights).to(device)
        try:
            return {"seconds": best_time(lambda: torch.multinomial(w, k, replacement=False), rounds, device=device)}
        except RuntimeError as err:
            message = str(err).splitlines()[0]
            return {"error": "refuses M > 2^24" if "2^24" in message else f"refuses: {message}"}
    if name == "numpy exp-keys+argpartition":
        def draw():
            keys = rng.standard_exponential(m) / weights
            return np.sort(np.argpartition(keys, k - 1)[:k])
        return {"seconds": best_time(draw, rounds)}
    if name == "torch exp-keys+topk":
        w = torch.from_numpy(weights).to(device)

        def draw():
            keys = torch.empty(m, dtype=torch.float64, device=device).exponential_() / w
            return torch.topk(keys, k, largest=False, sorted=False).indices.sort().values
        return {"seconds": best_time(draw, rounds, device=device)}
    if name == "numpy.percentile":
        return {"seconds": best_time(lambda: np.percentile(u, PERCENT), rounds)}
    if name == "numpy.partition":
        return {"seconds": best_time(lambda: np.partition(u, rank - 1)[rank - 1], rounds)}
    if name in ("torch.kthvalue", "torch.quantile"):
        t = torch.from_numpy(u).to(device)
        if name == "torch.kthvalue":
            return {"seconds": best_time(lambda: torch.kthvalue(t, rank), rounds, device=device)}
        try:
            return {"seconds": best_time(lambda: torch.quantile(t, PERCENT / 100), rounds, device=device)}
        except RuntimeError as err:
            return {"error": f"refuses: {str(err).splitlines()[0][:60]}"}
    raise ValueError(name)


def peer_in_subprocess(name: str, m: int, rounds: int, limit: float, device: str) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--peer", name, "--m", str(m), "--rounds", str(rounds),
           "--device", device]
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


def load_old_build(path: str):
    """An earlier build's pybind11 module (``clid_ops``), loaded from its file."""
    name = Path(path).name.split(".")[0]
    spec = importlib.util.spec_from_file_location(name, path, loader=importlib.machinery.ExtensionFileLoader(name, path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "sampler_successive"):
        sys.exit(f"bench_sampler: {path} has no sampler_successive: not an earlier clid_ops build")
    return module


# ---------------------------------------------------------------------------------------------

def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=HelpFormatter)
    p.add_argument("--sizes", type=float, nargs="+", default=[1e6, 1e7, 1e8], help="pool sizes M")
    p.add_argument("--rounds", type=int, default=3, help="runs per method (one at M >= 1e8 and for peers over 10 s)")
    p.add_argument("--limit", type=float, default=300.0, help="seconds a peer may take (per size)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, ...")
    p.add_argument("--threads", type=int, default=None,
                   help="time ours with this many threads only (default: torch's count and 1, the faster counts)")
    p.add_argument("--old-build", default=None, metavar="FILE.so", help="another build of the kernels, as a peer")
    p.add_argument("--json", default=None, help="also write the rows to this file")
    p.add_argument("--peer", default=None, help=argparse.SUPPRESS)
    p.add_argument("--m", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.peer:
        print(json.dumps(run_peer(args.peer, args.m, args.rounds, args.device)))
        return

    old = load_old_build(args.old_build) if args.old_build else None
    default_threads = torch.get_num_threads()
    thread_counts = sorted({default_threads, 1} if args.threads is None else {args.threads}, reverse=True)
    if args.device.startswith("cuda"):
        thread_counts = [default_threads]
    print(f"# {ops.build_info()}; {os.cpu_count()} CPUs, ours timed with {thread_counts} threads (the faster "
          f"counts; peers use {default_threads}), device {args.device}, load average {os.getloadavg()[0]:.1f} at start")
    print(f"{'M':>11}  {'op':<18} {'ours (s)':>9}  {'by thread count (s)':<22}  {'peer':<28} {'peer (s)':>22}"
          f"  {'ratio':>8}", flush=True)
    rows = []
    for size in args.sizes:
        m = int(size)
        rounds = 1 if m >= 100_000_000 else args.rounds
        u = torch.from_numpy(scores(m)).to(args.device)
        k = int(KEEP * m)
        rank = max(1, int(PERCENT / 100 * m))
        threshold = ops.percentile_threshold(u, PERCENT)
        calls = {"smoothstep_sample": lambda: ops.smoothstep_sample(u, threshold, S, k, SEED, ITERATION),
                 "kth_value": lambda: ops.kth_value(u, rank)}
        old_calls = {} if old is None else {
            "smoothstep_sample": lambda: old.sampler_successive(u, threshold, S, k, SEED, ITERATION, 0),
            "kth_value": lambda: old.sampler_kth_value(u, rank, False)}
        for op, call in calls.items():
            ours, theirs = {}, {}
            for threads in thread_counts:
                torch.set_num_threads(threads)
                ours[threads] = best_time(call, rounds, device=args.device)
                if op in old_calls:
                    theirs[threads] = best_time(old_calls[op], rounds)
            torch.set_num_threads(default_threads)
            mine = min(ours.values())
            threads_text = " ".join(f"{t}t:{ours[t]:.4f}" for t in thread_counts)
            peers = GPU_PEERS[op] if args.device.startswith("cuda") else PEERS[op]
            results = {peer: peer_in_subprocess(peer, m, rounds, args.limit, args.device) for peer in peers}
            if theirs:
                results["the --old-build kernels"] = {"seconds": min(theirs.values())}
            for peer, result in results.items():
                timed_out = "time limit" in result.get("error", "")
                ratio = result["seconds"] / mine if "seconds" in result else (args.limit / mine if timed_out else None)
                if "seconds" in result:
                    peer_text, ratio_text = f"{result['seconds']:.4f}", f"{ratio:.2f}x"
                else:
                    peer_text, ratio_text = result["error"][:22], (f"> {ratio:.0f}x" if timed_out else "-")
                print(f"{m:>11,}  {op:<18} {mine:>9.4f}  {threads_text:<22}  {peer:<28} {peer_text:>22}  {ratio_text:>8}",
                      flush=True)
                rows.append({"M": m, "op": op, "k": k if op == "smoothstep_sample" else rank, "seconds": mine,
                             "seconds_by_threads": ours, "peer": peer, "peer_seconds": result.get("seconds"),
                             "peer_error": result.get("error"), "ratio": ratio, "ratio_is_lower_bound": timed_out})
            timed = {peer: r["seconds"] for peer, r in results.items() if "seconds" in r and peer in peers}
            if timed:
                fastest = min(timed, key=timed.get)
                print(f"{m:>11,}  {op:<18} against the fastest peer, {fastest}: {timed[fastest] / mine:.2f}x", flush=True)
        u = None  # (frees the scores before the next size)
    print(f"# load average {os.getloadavg()[0]:.1f} at end")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    run_main(main)
