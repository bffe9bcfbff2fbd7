"""Benchmark of the fused Eq. 2 scoring kernels (clid.ops) against their peers on this machine.

In:  nothing (random inputs of BERT-base sizes; --device cuda on a GPU machine).
Out: a table on stdout, one row per (path, peer) printed as soon as it is measured, with both times
     and their ratio measured in the same run, the target and whether it is met; --json FILE also
     writes the rows.

    python bench/bench_score.py                  # CPU, all rows at the full sizes
    python bench/bench_score.py --quick          # smaller sizes, 3 rounds, no torch.compile (minutes)
    python bench/bench_score.py --no-compile     # skip the torch.compile peer (its compile is slow)
    python bench/bench_score.py --no-e2e         # skip the 05 end-to-end row (it builds a small demo world)

05 end to end: the `prefix` scoring of clid.model.scoring (batched by level and length, finished captions
dropped, the head only at the scored position through token_logprob_hidden) against a faithful eager
re-implementation of the authors' loop (random batches, a full-vocabulary softmax at every position of
every pass, then gather), both on the `tiny` model (full vocabulary, random weights: the timing and the
equality of the scores do not depend on training) and the captions of a `00_demo_data.py --small` world
(its trusted captions and its long references, so every level is present).

Timing: the methods of a section run round-robin for --rounds rounds and each keeps its fastest
round, so a busy machine slows every method alike instead of whichever happened to run last.
Peak extra memory is the rise of the process's resident high-water mark (VmHWM, reset through
/proc/self/clear_refs) during one call, measured in a fresh subprocess after a warm-up call on a
small problem, so the inputs, the loaded libraries and the thread pool are excluded. The fused
path's own buffers are also counted by construction (they do not depend on the machine).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

import clid.ops as ops
from clid.run.cli import HelpFormatter, run_main

ROOT = Path(__file__).resolve().parents[1]
SEQ_SHAPE = (64, 24, 30522)            # [N, T, V]: a batch of BERT-vocabulary captions
HIDDEN_SHAPE = (1536, 768, 30522)      # P, H, V: BERT-base's head
QUICK_SEQ_SHAPE = (16, 24, 30522)      # --quick
QUICK_HIDDEN_SHAPE = (512, 768, 30522)
QUICK_E2E_CAPTIONS = 120


# ---------------------------------------------------------------------------------------------
# The computations being compared

def eager_seq_logprob(logits, targets, mask):
    """The plain PyTorch way: a full log-softmax tensor, gather, masked mean."""
    logp = torch.log_softmax(logits, dim=-1).gather(-1, targets[..., None])[..., 0]
    return (logp * mask).sum(1) / mask.sum(1)


def read_bound_reduction(logits):
    """The memory limit: one plain reduction over the same logits (no exp, no gather)."""
    return logits.sum(-1)


def eager_hidden(hidden, weight, bias, targets):
    logits = torch.nn.functional.linear(hidden, weight, bias)
    return torch.log_softmax(logits, dim=-1).gather(1, targets[:, None])[:, 0]


def bare_matmul(hidden, weight):
    """The compute limit: the product h W^T alone."""
    return hidden @ weight.T


# ---------------------------------------------------------------------------------------------
# Inputs, timing, memory

def seq_inputs(device, seed=0, shape=SEQ_SHAPE, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    N, T, V = shape
    logits = (torch.randn(N, T, V, generator=gen) * 3).to(device, dtype)
    targets = torch.randint(0, V, (N, T), generator=gen).to(device)
    mask = torch.ones(N, T, device=device)
    return logits, targets, mask


def hidden_inputs(device, seed=0, shape=HIDDEN_SHAPE, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    P, H, V = shape
    hidden = torch.randn(P, H, generator=gen).to(device, dtype)
    weight = (torch.randn(V, H, generator=gen) / math.sqrt(H)).to(device, dtype)
    bias = torch.randn(V, generator=gen).to(device, dtype)
    targets = torch.randint(0, V, (P,), generator=gen).to(device)
    return hidden, weight, bias, targets


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def gpu_copy_bandwidth() -> float:
    """Bytes per second of a large device-to-device copy, counting bytes read and written."""
    src = torch.randn(256 * 2**20, device="cuda")      # 1 GiB
    dst = torch.empty_like(src)
    best = math.inf
    for _ in range(10):
        torch.cuda.synchronize()
        start = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return 2 * src.numel() * src.element_size() / best


def gpu_peak_extra(fn) -> int:
    """Bytes the CUDA allocator's high-water mark rises during one call (the output included)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    del out
    return torch.cuda.max_memory_allocated() - before


def process_cpu_seconds() -> float:
    """CPU time of this process, all threads (user + system)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def time_round_robin(methods: dict, rounds: int, device: str) -> tuple[dict, dict]:
    """Fastest wall time and fastest process CPU time of each method over `rounds` rounds, the
    methods interleaved within each round. On a machine shared with other jobs the CPU time
    (the work done, summed over threads) is the steadier of the two."""
    wall = {name: math.inf for name in methods}
    cpu = {name: math.inf for name in methods}
    for fn in methods.values():            # warm-up: builds, compiles, first-touch allocations
        fn(); sync(device)
    for _ in range(rounds):
        for name, fn in methods.items():
            sync(device)
            start, start_cpu = time.perf_counter(), process_cpu_seconds()
            fn()
            sync(device)
            wall[name] = min(wall[name], time.perf_counter() - start)
            cpu[name] = min(cpu[name], process_cpu_seconds() - start_cpu)
    return wall, cpu


MEMORY_PROBE = """
import gc, importlib.util, torch
import clid.ops as ops
spec = importlib.util.spec_from_file_location("bench_score", {path!r})
b = importlib.util.module_from_spec(spec)
spec.loader.exec_module(b)
torch.set_num_threads({threads})
def call(which, h, w, bias, y):
    if which == "fused":
        return ops.token_logprob_hidden(h, w, bias, y)
    return b.eager_hidden(h, w, bias, y) if which == "eager" else b.bare_matmul(h, w)
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
hidden, weight, bias, targets = b.hidden_inputs("cpu", shape={shape!r})
call({which!r}, hidden[:8], weight[:1000], bias[:1000], targets[:8] % 1000)   # warm-up on a small problem
gc.collect()
open("/proc/self/clear_refs", "w").write("5")         # reset the high-water mark to the current RSS
before = status("VmRSS:")
out = call({which!r}, hidden, weight, bias, targets)
print(status("VmHWM:") - before)
"""


def peak_extra_memory(which: str, threads: int, shape) -> int | None:
    """Bytes the resident high-water mark rises during one call (None where it cannot be measured)."""
    code = MEMORY_PROBE.format(path=str(Path(__file__).resolve()), threads=threads, which=which, shape=tuple(shape))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"memory probe {which} failed: {proc.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    return int(proc.stdout.strip().splitlines()[-1])


def own_buffers_bytes(threads: int, shape) -> int:
    """The hidden path's own buffers by construction (float32 inputs): per thread one row-block x
    vocabulary-tile logits buffer; per (tile, row) one log-sum-exp state; one target logit per row."""
    P, _, V = shape
    block, tile, _ = torch.ops.clid.hidden_tiling()
    n_tiles = -(-V // tile)
    return threads * (block * tile + 16) * 4 + n_tiles * P * 8 + P * 4


# ---------------------------------------------------------------------------------------------

def end_to_end(rows, device, limit=None):
    """05 in prefix mode against the authors' scoring loop, on demo captions (see the docstring)."""
    import tempfile

    import numpy as np

    from clid.data.captions import load_captions
    from clid.data.inputs import make_examples
    from clid.data.store import FeatureStore, RegionCache
    from clid.model.captioner import build_model, preset_config
    from clid.model.scoring import caption_logprobs, caption_logprobs_eager

    with tempfile.TemporaryDirectory() as tmp:
        world = Path(tmp) / "demo"
        subprocess.run([sys.executable, str(ROOT / "00_demo_data.py"), "--out", str(world), "--small"],
                       check=True, capture_output=True)
        features = FeatureStore(world / "features.h5")
        torch.manual_seed(0)
        model = build_model(preset_config("tiny", features.feature_dim())).to(device).eval()
        items = [(f"{name}:{r.image_id}#{j}", r.image_id, text) for name in ("captions.json", "long_refs.json")
                 for r in load_captions(world / name) for j, text in enumerate(r.captions)]
        examples, _ = make_examples(items, model.tokenizer, model.levels, "demo", features)
        if limit:  # the same number of captions of every level
            per_level = -(-limit // len(set(examples.levels)))
            by_level = {}
            for i, level in enumerate(examples.levels):
                by_level.setdefault(level, []).append(i)
            examples = examples.subset(sorted(i for ids in by_level.values() for i in ids[:per_level]))
        regions = RegionCache(features)
        regions.batch(examples.image_ids)  # read every image once, outside the timings
        start = time.perf_counter()
        fast = caption_logprobs(model, examples, regions, "prefix", device=device)
        sync(device)
        ours = time.perf_counter() - start
        start = time.perf_counter()
        eager = caption_logprobs_eager(model, examples, regions, device=device)
        sync(device)
        theirs = time.perf_counter() - start
        features.close()
    worst = float(np.abs(fast - eager).max())
    print(f"05 end to end: {len(examples)} demo captions, levels {sorted(map(int, set(examples.levels)))}, "
          f"largest score difference {worst:.2e}")
    row(rows, f"05 prefix scoring, tiny, {len(examples)} captions", "authors' eager loop (full softmax)",
        ours, theirs, ">= 3x, equal 1e-4", theirs >= 3 * ours and worst <= 1e-4)


HEADER = f"{'path':42} {'peer':34} {'ours':>9} {'peer':>9} {'ratio':>7}  {'target':13} ok   cpu-time ratio"


def row(rows, path, peer, ours, theirs, target, ok, cpu_ratio=None):
    """Record a row and print it at once."""
    rows.append(dict(path=path, peer=peer, ours_s=ours, peer_s=theirs, target=target, ok=ok, cpu_ratio=cpu_ratio))
    if peer.startswith("peak extra memory"):
        cells = f"{'':>9} {'':>9} {ours * 100 if ours is not None else float('nan'):6.2f}%"
    elif theirs is None:
        cells = f"{ours * 1e3:7.1f}ms {'-':>9} {'-':>7}"
    else:
        ratio = theirs / ours                      # > 1: ours is faster
        cells = f"{ours * 1e3:7.1f}ms {theirs * 1e3:7.1f}ms {ratio:6.2f}x"
    verdict = "-" if ok is None else ("yes" if ok else "NO")
    cpu_cell = "" if cpu_ratio is None else f"{cpu_ratio:.2f}x"
    print(f"{path:42} {peer:34} {cells}  {target:13} {verdict:4} {cpu_cell}", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where the ops run")
    parser.add_argument("--rounds", type=int, default=None, help="timing rounds per method, fastest kept (default 7; "
                        "--quick: 3)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="CPU threads")
    parser.add_argument("--quick", action="store_true", help=f"sizes {QUICK_SEQ_SHAPE} and {QUICK_HIDDEN_SHAPE}, "
                        f"{QUICK_E2E_CAPTIONS} end-to-end captions, 3 rounds, no torch.compile peer")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile peer")
    parser.add_argument("--json", type=Path, help="also write the rows to this JSON file")
    parser.add_argument("--no-e2e", action="store_true", help="skip the 05 end-to-end row")
    parser.add_argument("--e2e-captions", type=int, default=None, metavar="N",
                        help=f"captions of the 05 end-to-end row, as many of each level (default: every caption of "
                             f"the demo world; --quick: {QUICK_E2E_CAPTIONS})")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                        help="dtype of the logits and of the head's inputs")
    parser.add_argument("--seq-shape", type=int, nargs=3, metavar=("N", "T", "V"), help="seq_logprob's logits shape")
    parser.add_argument("--hidden-shape", type=int, nargs=3, metavar=("P", "H", "V"),
                        help="token_logprob_hidden's shape")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rounds = args.rounds or (3 if args.quick else 7)
    seq_shape, hidden_shape = (QUICK_SEQ_SHAPE, QUICK_HIDDEN_SHAPE) if args.quick else (SEQ_SHAPE, HIDDEN_SHAPE)
    seq_shape, hidden_shape = tuple(args.seq_shape or seq_shape), tuple(args.hidden_shape or hidden_shape)
    device, dtype = args.device, getattr(torch, args.dtype)
    dname = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}[args.dtype]
    print(f"device {device}, {args.threads} threads, torch {torch.__version__}, {ops.build_info()}, "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    print(HEADER, flush=True)
    rows = []

    # seq_logprob, fp32 logits
    logits, targets, mask = seq_inputs(device, shape=seq_shape, dtype=dtype)
    methods = {
        "fused": lambda: ops.seq_logprob(logits, targets, mask),
        "eager": lambda: eager_seq_logprob(logits, targets, mask),
        "read-bound sum": lambda: read_bound_reduction(logits),
    }
    compile_note = None
    if not (args.no_compile or args.quick):
        try:
            compiled = torch.compile(eager_seq_logprob)
            compiled(logits, targets, mask)
            methods["torch.compile"] = lambda: compiled(logits, targets, mask)
        except Exception as err:  # report the peer's failure instead of hiding the row
            compile_note = f"peer failed: {type(err).__name__}: {str(err).strip().splitlines()[0][:120]}"
    t, c = time_round_robin(methods, rounds, device)
    cr = lambda peer: c[peer] / c["fused"]  # noqa: E731
    shape = "x".join(map(str, seq_shape))
    row(rows, f"seq_logprob [{shape}] {dname}", "eager log_softmax+gather", t["fused"], t["eager"],
        "faster", t["fused"] < t["eager"], cr("eager"))
    if "torch.compile" in t:
        row(rows, "seq_logprob", "torch.compile(eager)", t["fused"], t["torch.compile"],
            ">= 2x faster", t["torch.compile"] >= 2 * t["fused"], cr("torch.compile"))
    else:
        row(rows, "seq_logprob", "torch.compile(eager)", t["fused"], None, ">= 2x faster", None)
    row(rows, "seq_logprob", "read-bound logits.sum(-1)", t["fused"], t["read-bound sum"],
        "within 1.5x", t["fused"] <= 1.5 * t["read-bound sum"], cr("read-bound sum"))
    if device == "cuda":
        bandwidth = gpu_copy_bandwidth()
        floor = logits.numel() * logits.element_size() / bandwidth
        print(f"# measured copy bandwidth {bandwidth / 1e12:.2f} TB/s (read + written): reading the logits once "
              f"takes {floor * 1e3:.3f} ms", flush=True)
        row(rows, "seq_logprob", "logits read once at copy bandwidth", t["fused"], floor,
            "within 1.3x", t["fused"] <= 1.3 * floor)
    logits = None  # (frees the logits before the next section)

    # token_logprob_hidden (calls of about a second on a CPU: fewer rounds)
    hidden_rounds = max(3, rounds // 2)
    hidden, weight, bias, targets = hidden_inputs(device, shape=hidden_shape, dtype=dtype)
    t, c = time_round_robin({
        "fused": lambda: ops.token_logprob_hidden(hidden, weight, bias, targets),
        "eager": lambda: eager_hidden(hidden, weight, bias, targets),
        "matmul": lambda: bare_matmul(hidden, weight),
    }, hidden_rounds, device)
    P, H, V = hidden_shape
    row(rows, f"token_logprob_hidden P={P} H={H} V={V} {dname}", "eager linear+log_softmax+gather", t["fused"], t["eager"],
        "faster", t["fused"] < t["eager"], c["eager"] / c["fused"])
    within = 1.15 if device == "cuda" else 1.10
    row(rows, "token_logprob_hidden", "bare matmul h W^T", t["fused"], t["matmul"],
        f"within {within:.2f}x", t["fused"] <= within * t["matmul"], c["matmul"] / c["fused"])
    logits_bytes = P * V * hidden.element_size()
    memory = {}
    if device == "cuda":
        memory = {"fused": gpu_peak_extra(lambda: ops.token_logprob_hidden(hidden, weight, bias, targets)),
                  "eager": gpu_peak_extra(lambda: eager_hidden(hidden, weight, bias, targets)),
                  "matmul": gpu_peak_extra(lambda: bare_matmul(hidden, weight))}
        row(rows, "token_logprob_hidden", "peak extra memory / logits size", memory["fused"] / logits_bytes, None,
            "<= 5%", memory["fused"] <= 0.05 * logits_bytes)
    if device == "cpu":
        memory = {w: peak_extra_memory(w, args.threads, hidden_shape) for w in ("fused", "eager", "matmul")}
        fused_mem = memory["fused"]
        row(rows, "token_logprob_hidden", "peak extra memory / logits size",
            None if fused_mem is None else fused_mem / logits_bytes, None, "<= 5%",
            None if fused_mem is None else fused_mem <= 0.05 * logits_bytes)

    if not args.no_e2e:
        end_to_end(rows, device, args.e2e_captions or (QUICK_E2E_CAPTIONS if args.quick else None))

    print("\nratio = peer time / fused time (above 1: the fused kernel is faster), fastest wall time of "
          f"{rounds} interleaved rounds ({hidden_rounds} for token_logprob_hidden); cpu-time ratio: the same "
          "with process CPU time (all threads).")
    if compile_note:
        print(f"torch.compile: {compile_note}")
    if memory:
        mib = lambda b: "n/a" if b is None else f"{b / 2**20:.1f} MiB"  # noqa: E731
        print(f"peak extra memory during one call: fused {mib(memory['fused'])}, eager {mib(memory['eager'])}, "
              f"bare matmul {mib(memory['matmul'])}; logits would be {mib(logits_bytes)}; the fused path's own "
              f"buffers by construction: {mib(own_buffers_bytes(args.threads, hidden_shape))}.")
    if args.json:
        args.json.write_text(json.dumps(dict(device=device, threads=args.threads, rows=rows, memory=memory,
                                             compile_note=compile_note), indent=1))


if __name__ == "__main__":
    run_main(main)
