"""Benchmark of the sampler kernels (clid.ops) against the usual ways of doing the same on this machine.

In:  nothing (N(0, 1) scores, the shape of the quality scores u; --device cuda on a GPU machine).
Out: a table on stdout, one row per (clock, size, op, thread count): ours, the fastest plain peer, the
     ratio peer / ours (above 1: ours is faster), the target and the floor, then the other peers;
     --out DIR also writes it to DIR/bench_sampler_ISA.md (ISA: the CPU copy of the kernels run), with
     the date, the commit, the CPU, its instruction sets and the load, and the rows to .json beside it;
     --json FILE writes the rows alone.

    python bench/bench_sampler.py                          # M = 1M, 10M, 100M (about 10 minutes)
    python bench/bench_sampler.py --sizes 1e6 1e7 --rounds 7 --out docs/measurements/DATE-cpu
    python bench/bench_sampler.py --sizes 1e7 --old-build OLD.so   # against another build of the kernels

The draw is step 6 at iteration 1 with the paper's values: T = the 2nd percentile of u, s = 1,
k = 90% of M (the authors' k = (100 - c i)% at i = 5), weights f = 0.5 (1 + tanh((u - T) / s)).
  smoothstep_sample      vs exponential keys E/f, the k smallest by numpy.argpartition (the same
                            distribution, the best plain NumPy way; the target: ours >= 1.5x it)
                         vs exponential keys E/f, the k smallest by torch.topk
                         vs numpy.random.choice(M, k, replace=False, p=f/sum f)   (the authors' draw)
                         vs torch.multinomial(f, k, replacement=False)
                         and a floor: our keys alone (one pass that draws the uniforms and computes
                            the M keys, torch.ops.clid.smoothstep_keys), whatever selects from them
  kth_value(u, 2% of M)  vs numpy.partition (the target: ours >= 1.2x it), numpy.percentile(u, 2),
                            torch.kthvalue, torch.quantile
Timing: ours (at torch's thread count and at one thread), the floor and the in-process peers are
measured in the same rounds, interleaved (each round calls each once, the order rotated round by
round, after one warm-up call each); a time is the median of the rounds with their spread
[lowest-highest]; a ratio is of the medians, with the spread of the per-round ratios (peer and ours
of the same round). The NumPy peers use one thread, torch's use torch's count. The authors' draw and
torch.multinomial are slow: each runs in a subprocess with a time limit (--limit seconds), after the
rounds, the best of --rounds runs (one if a run takes over 10 s), and a peer that refuses the size
(torch.multinomial above 2^24 categories), runs out of memory or out of time is reported as such.
With --device cuda the torch peers run on the GPU and the NumPy peers are left out.
--old-build FILE.so adds another build of the kernels as a peer: the module an earlier version of
this repository compiled (the pybind11 module ``clid_ops`` with ``sampler_successive`` and
``sampler_kth_value``), timed in the rounds like ours.
"""
from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from clid import ops
from clid.run.cli import HelpFormatter, run_main
from clid.run.measured import context_lines, load_text, write_measurement

SEED, ITERATION, S, PERCENT, KEEP = 0, 1, 1.0, 2.0, 0.9
TARGETS = {"smoothstep_sample": ("numpy exp-keys+argpartition", 1.5), "kth_value": ("numpy.partition", 1.2)}
FAST_PEERS = {"smoothstep_sample": ("numpy exp-keys+argpartition", "torch exp-keys+topk"),
              "kth_value": ("numpy.partition", "numpy.percentile", "torch.kthvalue", "torch.quantile")}
SLOW_PEERS = {"smoothstep_sample": ("numpy.random.choice", "torch.multinomial"), "kth_value": ()}


def scores(m: int) -> np.ndarray:
    return np.random.default_rng(SEED).normal(size=m).astype(np.float32)


def median(values: list[float]) -> float:
    return statistics.median(values)


def spread(values: list[float], digits: str = ".4f") -> str:
    """"0.1234 [0.1200-0.1300]": the median, the lowest and the highest."""
    return f"{median(values):{digits}} [{min(values):{digits}}-{max(values):{digits}}]"


def best_time(fn, rounds: int, enough: float = 10.0, device: str = "cpu") -> float:
    """The fastest of `rounds` runs (a run longer than `enough` seconds is not repeated); a GPU run
    is warmed up once and waited for."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    if device.startswith("cuda"):
        fn()
        sync()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - start)
        if best > enough:
            break
    return best


def interleaved(fns: dict, rounds: int, device: str = "cpu") -> tuple[dict, dict, dict[str, str]]:
    """Seconds per call of each of ``fns`` (name -> function) in ``rounds`` rounds that call each once,
    the order rotated round by round, after one warm-up call each: the wall-clock times and the CPU
    times of this process (all its threads), each name -> a list; a function whose warm-up raises is
    left out, its error returned."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    errors = {}
    for name, fn in list(fns.items()):
        try:
            fn()
            sync()
        except (RuntimeError, MemoryError) as err:
            errors[name] = f"refuses: {str(err).splitlines()[0][:60]}"
    names = [name for name in fns if name not in errors]
    wall: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            sync()
            start, start_cpu = time.perf_counter(), time.process_time()
            fns[name]()
            sync()
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    return wall, cpu, errors


# ---------------------------------------------------------------------------------------------
# Peers. The fast ones are functions called in the rounds; the slow ones run in their own process:
# `python bench_sampler.py --peer NAME --m M --rounds R --device D` prints {"seconds": ...} or {"error": ...}.

def peer_function(name: str, u: np.ndarray, device: str = "cpu"):
    """A call of the peer ``name`` on the scores ``u`` (what it needs is computed here, untimed)."""
    m = len(u)
    threshold = np.percentile(u, PERCENT)
    k = int(KEEP * m)
    rank = max(1, int(PERCENT / 100 * m))
    weights = 0.5 * (1.0 + np.tanh((u.astype(np.float64) - threshold) / S))
    rng = np.random.default_rng(SEED)
    if name == "numpy.random.choice":
        p = weights / weights.sum()
        np.random.seed(SEED)
        return lambda: np.random.choice(m, k, replace=False, p=p)
    if name == "torch.multinomial":
        w = torch.from_numpy(weights).to(device)
        return lambda: torch.multinomial(w, k, replacement=False)
    if name == "numpy exp-keys+argpartition":
        def draw():
            keys = rng.standard_exponential(m) / weights
            return np.sort(np.argpartition(keys, k - 1)[:k])
        return draw
    if name == "torch exp-keys+topk":
        w = torch.from_numpy(weights).to(device)

        def draw():
            keys = torch.empty(m, dtype=torch.float64, device=device).exponential_() / w
            return torch.topk(keys, k, largest=False, sorted=False).indices.sort().values
        return draw
    if name == "numpy.percentile":
        return lambda: np.percentile(u, PERCENT)
    if name == "numpy.partition":
        return lambda: np.partition(u, rank - 1)[rank - 1]
    t = torch.from_numpy(u).to(device)
    if name == "torch.kthvalue":
        return lambda: torch.kthvalue(t, rank)
    if name == "torch.quantile":
        return lambda: torch.quantile(t, PERCENT / 100)
    raise ValueError(name)


def run_peer(name: str, m: int, rounds: int, device: str = "cpu") -> dict:
    fn = peer_function(name, scores(m), device)
    try:
        return {"seconds": best_time(fn, rounds, device=device)}
    except RuntimeError as err:
        message = str(err).splitlines()[0]
        return {"error": "refuses M > 2^24" if "2^24" in message else f"refuses: {message[:60]}"}


def peer_in_subprocess(name: str, m: int, rounds: int, limit: float, device: str) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--peer", name, "--m", str(m), "--rounds", str(rounds),
           "--device", device]
    try:
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=limit)
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
# The machine and the code measured

def kernel_copy() -> str:
    """The CPU copy of the kernels this machine runs (base, avx2, avx512; CLID_CPU_ISA lowers it)."""
    info = ops.build_info()
    return info.split("cpu kernels ")[1].split(",")[0] if "cpu kernels " in info else "unknown"


# ---------------------------------------------------------------------------------------------

def measure(m: int, args, thread_counts: list[int], old) -> list[dict]:
    """The rows of one size: per op, ours at each thread count against the fastest plain peer, then the
    other peers against ours at torch's count."""
    default_threads = torch.get_num_threads()
    rounds = max(1, args.rounds if m < 100_000_000 else min(args.rounds, 3))
    u_np = scores(m)
    u = torch.from_numpy(u_np).to(args.device)
    k = int(KEEP * m)
    rank = max(1, int(PERCENT / 100 * m))
    threshold = ops.percentile_threshold(u, PERCENT)

    def at(threads, fn):
        def call():
            torch.set_num_threads(threads)
            try:
                return fn()
            finally:
                torch.set_num_threads(default_threads)
        return call

    ours = {"smoothstep_sample": lambda: ops.smoothstep_sample(u, threshold, S, k, SEED, ITERATION),
            "kth_value": lambda: ops.kth_value(u, rank)}
    floors = {"smoothstep_sample": lambda: torch.ops.clid.smoothstep_keys(u, float(threshold), S, SEED, ITERATION)}
    olds = {} if old is None else {
        "smoothstep_sample": lambda: old.sampler_successive(u, threshold, S, k, SEED, ITERATION, 0),
        "kth_value": lambda: old.sampler_kth_value(u, rank, False)}
    rows = []
    for op in ("smoothstep_sample", "kth_value"):
        fns = {}
        for t in thread_counts:
            fns[f"ours {t}t"] = at(t, ours[op])
            if op in floors:
                fns[f"floor {t}t"] = at(t, floors[op])
            if op in olds:
                fns[f"old {t}t"] = at(t, olds[op])
        peers = [p for p in FAST_PEERS[op] if args.device == "cpu" or p.startswith("torch")]
        for peer in peers:
            fns[peer] = peer_function(peer, u_np, args.device)
        wall, cpu, errors = interleaved(fns, rounds, args.device)
        for clock, times in (("wall", wall), ("cpu", cpu)):
            rows += op_rows(m, op, clock, times, errors if clock == "wall" else {}, peers, thread_counts)
        if not args.no_slow_peers:
            reference = median(wall[f"ours {thread_counts[0]}t"])
            for peer in SLOW_PEERS[op]:
                if args.device == "cpu" or peer.startswith("torch"):
                    result = peer_in_subprocess(peer, m, rounds, args.limit, args.device)
                    row = {"M": m, "op": op, "clock": "wall", "threads": thread_counts[0], "seconds": reference,
                           "peer": peer, "other_peer": True, **{f"peer_{key}": value for key, value in result.items()}}
                    if "seconds" in result:
                        row["ratio"] = result["seconds"] / reference
                    elif "time limit" in result.get("error", ""):
                        row["ratio_at_least"] = args.limit / reference
                    rows.append(row)
                    print(row_line(row), flush=True)
    return rows


def op_rows(m: int, op: str, clock: str, times: dict, errors: dict, peers: list, thread_counts: list) -> list[dict]:
    """The rows of one op by one clock: ours at each thread count against the fastest plain peer of the
    rounds (and the floor), then each other peer against ours at the first thread count."""
    rows = []
    target_peer, target = TARGETS[op]
    timed = {p: times[p] for p in peers if p in times}
    fastest = min(timed, key=lambda p: median(timed[p])) if timed else None
    for t in thread_counts:
        mine = times[f"ours {t}t"]
        row = {"M": m, "op": op, "clock": clock, "threads": t, "rounds": len(mine), "seconds": median(mine),
               "seconds_rounds": mine, "peer": fastest}
        if fastest:
            per_round = [p / o for p, o in zip(timed[fastest], mine)]
            row.update(peer_seconds=median(timed[fastest]), peer_rounds=timed[fastest],
                       ratio=median(timed[fastest]) / median(mine), ratio_low=min(per_round), ratio_high=max(per_round))
        if target_peer in timed:
            target_ratio = median(timed[target_peer]) / median(mine)
            row.update(target=f">= {target}x {target_peer}", target_ratio=target_ratio, met=target_ratio >= target)
        if f"floor {t}t" in times:
            floor = times[f"floor {t}t"]
            row.update(floor_seconds=median(floor), floor_rounds=floor, over_floor=median(mine) / median(floor))
        if f"old {t}t" in times:
            row.update(old_seconds=median(times[f"old {t}t"]), old_ratio=median(times[f"old {t}t"]) / median(mine))
        rows.append(row)
    reference = times[f"ours {thread_counts[0]}t"]
    for peer in [p for p in peers if p in times and p != fastest] + list(errors):
        row = {"M": m, "op": op, "clock": clock, "threads": thread_counts[0], "seconds": median(reference),
               "seconds_rounds": reference, "peer": peer, "other_peer": True}
        if peer in times:
            row.update(peer_seconds=median(times[peer]), peer_rounds=times[peer],
                       ratio=median(times[peer]) / median(reference))
        else:
            row["peer_error"] = errors[peer]
        rows.append(row)
    for row in rows:
        print(row_line(row), flush=True)
    return rows


def row_line(row: dict) -> str:
    """One row of the markdown table."""
    ours = spread(row["seconds_rounds"]) if "seconds_rounds" in row else f"{row['seconds']:.4f}"
    if row.get("other_peer"):
        if "peer_seconds" in row:
            theirs = spread(row["peer_rounds"]) if "peer_rounds" in row else f"{row['peer_seconds']:.4f} (best)"
            ratio = f"{row['ratio']:.2f}x"
        else:
            theirs, ratio = row["peer_error"], (f"> {row['ratio_at_least']:.0f}x" if "ratio_at_least" in row else "-")
        return f"| {row['clock']} | {row['M']:,} | `{row['op']}` | {row['threads']} | {ours} | {row['peer']} | {theirs} | {ratio} | | |"
    if row.get("peer_seconds") is not None:
        theirs = spread(row["peer_rounds"])
        ratio = f"**{row['ratio']:.2f}x** [{row['ratio_low']:.2f}-{row['ratio_high']:.2f}]"
    else:
        theirs, ratio = "-", "-"
    target = "" if "target" not in row else f"{row['target']}: {row['target_ratio']:.2f}x, {'met' if row['met'] else 'MISSED'}"
    floor = "" if "floor_seconds" not in row else f"{spread(row['floor_rounds'])}, ours {row['over_floor']:.2f}x it"
    if "old_ratio" in row:
        floor += f"; earlier build {row['old_seconds']:.4f} ({row['old_ratio']:.2f}x)"
    return f"| {row['clock']} | {row['M']:,} | `{row['op']}` | {row['threads']} | {ours} | {row['peer']} | {theirs} | {ratio} | {target} | {floor} |"


HEADER = ("| clock | M | op | threads (ours) | ours (s) | peer | peer (s) | peer / ours | target: peer / ours | "
          "floor: keys alone (s) |\n"
          "|---|---|---|---|---|---|---|---|---|---|")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=HelpFormatter)
    p.add_argument("--sizes", type=float, nargs="+", default=[1e6, 1e7, 1e8], help="pool sizes M")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (at most 3 at M >= 1e8)")
    p.add_argument("--limit", type=float, default=300.0, help="seconds a slow peer may take (per size)")
    p.add_argument("--no-slow-peers", action="store_true",
                   help="leave out numpy.random.choice and torch.multinomial (default: measured after the rounds)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, ...")
    p.add_argument("--threads", type=int, nargs="+", default=None,
                   help="time ours with these thread counts (default: torch's count and 1)")
    p.add_argument("--old-build", default=None, metavar="FILE.so", help="another build of the kernels, as a peer")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="also write the table with the date, commit, CPU and load to DIR/bench_sampler_ISA.md (and .json)")
    p.add_argument("--json", default=None, help="also write the rows to this file")
    p.add_argument("--peer", default=None, help=argparse.SUPPRESS)
    p.add_argument("--m", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.peer:
        print(json.dumps(run_peer(args.peer, args.m, args.rounds, args.device)))
        return

    old = load_old_build(args.old_build) if args.old_build else None
    default_threads = torch.get_num_threads()
    thread_counts = sorted({default_threads, 1} if args.threads is None else set(args.threads), reverse=True)
    if args.device.startswith("cuda"):
        thread_counts = [default_threads]
    command = f"python bench/bench_sampler.py {' '.join(argv if argv is not None else sys.argv[1:])}"
    context = context_lines(command)
    context.insert(3, (f"kernels: {ops.build_info()}; device {args.device}; ours at {thread_counts} threads, "
                       f"torch's peers at {default_threads}, NumPy's at 1"))
    for line in context:
        print(f"# {line}", flush=True)
    print(HEADER, flush=True)
    rows = []
    for size in args.sizes:
        rows += measure(int(size), args, thread_counts, old)
    context.append(f"load average (1, 5, 15 min) after: {load_text()}")
    print(f"# {context[-1]}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if args.out:
        tables = []
        for clock, title in (("wall", "Wall-clock time"), ("cpu", "CPU time of the process (all its threads)")):
            tables += [f"## {title}", "", HEADER, *[row_line(r) for r in rows if r["clock"] == clock], ""]
        body = [("Times: the median of the interleaved rounds [lowest-highest]; peer / ours: the ratio of the "
                 "medians [the lowest and highest per-round ratio]; above 1: ours is faster. Rows with a target "
                 "compare ours with the fastest plain peer of the rounds; the others compare a peer with ours at "
                 f"{thread_counts[0]} threads (slow peers: the best of their runs, in a subprocess, wall-clock)."),
                "", *tables]
        summary = {"header": [c.strip() for c in HEADER.splitlines()[0].split("|")[1:-1]],
                   "rows": [[c.strip() for c in row_line(r).split("|")[1:-1]] for r in rows if "target" in r]}
        md = write_measurement(args.out, f"bench_sampler_{kernel_copy()}", context, body, rows, summary)
        print(f"# wrote {md}")

if __name__ == "__main__":
    run_main(main)
