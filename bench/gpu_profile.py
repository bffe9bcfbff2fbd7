"""Where the time of the two GPU rows that miss their targets goes: torch.profiler over 04's training steps
(as 04 runs them: loader workers, pinned memory, no host check inside a step) and over one
batch of 03's Pegasus beam search, on bench_gpu.py's models and data.

Out: per section, the wall time per step (or per batch), the GPU's busy time in it (the sum of its kernels'
and copies' time), and the operators that take the most GPU time and the most host time.

    python bench/gpu_profile.py                 # one H100 or H200: about a minute
    python bench/gpu_profile.py --smoke         # tiny sizes on the CPU (a test)
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from bench_gpu import FULL, SMOKE, Data, captioner, sync  # noqa: E402

from clid.run import runtime  # noqa: E402
from clid.run.cli import HelpFormatter, run_main  # noqa: E402


def report(prof, wall: float, count: int, what: str, device: str, rows: int) -> None:
    """The wall time and GPU busy time per ``what``, then the top operators by GPU time and by host time."""
    events = prof.key_averages()
    cuda = runtime.device_plan(device).gpu
    # the GPU's own events (kernels, copies), each once: an operator's row repeats its kernels' time
    busy = sum(e.self_device_time_total for e in events if e.device_type == DeviceType.CUDA) / 1e3  # (ms)
    print(f"{wall / count * 1e3:.2f} ms a {what} (wall), the GPU busy {busy / count:.2f} ms of it "
          f"({busy / (wall * 1e3) * 100:.0f}%)" if cuda else f"{wall / count * 1e3:.2f} ms a {what} (wall)")
    if cuda:
        print(events.table(sort_by="self_device_time_total", row_limit=rows, max_name_column_width=60))
    print(events.table(sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=60))


def train(size: dict, device: str, steps: int, rows: int) -> None:
    """04's steps as it runs them, through Trainer.batches (loader workers on a GPU) and Trainer.train_step."""
    from clid.data.store import RegionCache
    from clid.training.batches import epoch_batches
    from clid.training.flags import TrainSettings
    from clid.training.loop import Trainer

    with tempfile.TemporaryDirectory() as tmp:
        data = Data(Path(tmp), size)
        model = captioner(size, data.tokenizer, device, size["classes"], dropout=0.1)
        settings = TrainSettings(precision="auto", warmup=10, max_steps=10**6)
        trainer = Trainer(model, data.examples, RegionCache.for_model(data.features, model.config), settings,
                          Path(tmp) / "out", {}, torch.device(device))
        n, warm = len(data.examples), 5
        batches = trainer.batches(lambda step: epoch_batches(n, size["batch"], step, 0), range(warm + steps))
        for _ in range(warm):
            trainer.train_step(next(batches))
        trainer.check_finite()
        sync(device)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if runtime.device_plan(device).gpu else [])
        with profile(activities=activities) as prof:
            start = time.perf_counter()
            for _ in range(steps):
                trainer.train_step(next(batches))
            trainer.check_finite()
            sync(device)
            wall = time.perf_counter() - start
        print(f"== training, {steps} steps as 04 runs them ({trainer.workers} loader workers, --precision auto)")
        report(prof, wall, steps, "step", device, rows)


def paraphrase(size: dict, device: str, rows: int) -> None:
    """One batch of 03's beam search at --batch-size auto, in bf16 on a GPU."""
    from transformers import PegasusConfig, PegasusForConditionalGeneration

    from clid.selfgen import paraphrase as paraphrasers

    config = PegasusConfig(max_position_embeddings=128, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
                           **size["pegasus"])
    precision = runtime.resolve("auto", device)
    torch.manual_seed(0)
    with torch.device(device):
        model = PegasusForConditionalGeneration(config).eval()
    if precision == "bf16":
        model = model.to(torch.bfloat16)
    beams, new = size["beams"], size["new_tokens"]
    per_piece = paraphrasers.bytes_per_piece(config, beams, size["piece_tokens"] + new, precision)
    batch = runtime.batch_size("auto", device, per_piece, paraphrasers.BATCH_SIZE, most=256)
    ids = torch.randint(2, config.vocab_size, (batch, size["piece_tokens"]), generator=torch.Generator().manual_seed(3))
    ids = ids.to(device)

    def generate():
        with torch.no_grad():
            model.generate(input_ids=ids, num_beams=beams, max_new_tokens=new, min_new_tokens=new)

    generate()
    sync(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if runtime.device_plan(device).gpu else [])
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        generate()
        sync(device)
        wall = time.perf_counter() - start
    print(f"== 03 Pegasus, one batch of {batch} pieces, {beams} beams, {new} new tokens ({precision})")
    report(prof, wall, new, "decoding step", device, rows)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    p.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU (the tests)")
    p.add_argument("--sections", nargs="+", choices=("train", "paraphrase"), default=["train", "paraphrase"],
                   help="what to profile")
    p.add_argument("--steps", type=int, default=10, help="training steps profiled (after 5 of warm-up)")
    p.add_argument("--rows", type=int, default=15, help="operators listed per table")
    args = p.parse_args(argv)
    device = "cpu" if args.smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        p.error("no GPU here: give --smoke (tiny sizes on the CPU)")
    size = SMOKE if args.smoke else FULL
    for section in args.sections:
        with torch.inference_mode(False):
            train(size, device, args.steps, args.rows) if section == "train" else paraphrase(size, device, args.rows)


if __name__ == "__main__":
    run_main(main)
