"""What keyed dropout costs: one training step (forward, backward, optimizer) of the captioner with dropout
drawn per example (04's --dropout-draws example, the default) against torch's per-process dropout
(--dropout-draws rank, SDPA's fused attention dropout) and against no dropout, interleaved in one process.

In:  nothing (random regions and captions of the demo's shapes: 64 captions, 10 regions of 1,408 features, text
     of 20 tokens, the head shortlisted to 1,000 tokens as the demo's). Out: a table on stdout, median milliseconds a step over --rounds rounds and the ratio
     against torch's dropout.

    python bench/bench_dropout.py                    # the demo's tiny model on the CPU
    python bench/bench_dropout.py --preset labert --device cuda --regions 100 --dim 2048 --classes 1601 --shortlist 0
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from clid.model.captioner import Captioner, preset_config  # noqa: E402
from clid.run.cli import HelpFormatter, positive_int, run_main  # noqa: E402


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    p.add_argument("--preset", default="tiny", help="the model preset")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--batch", type=positive_int, default=64, help="captions a step")
    p.add_argument("--regions", type=positive_int, default=10, help="regions an image")
    p.add_argument("--dim", type=positive_int, default=1408, help="feature dimension")
    p.add_argument("--classes", type=int, default=0, help="class probabilities a region")
    p.add_argument("--text", type=positive_int, default=20, help="text tokens a caption")
    p.add_argument("--rounds", type=positive_int, default=30, help="interleaved rounds")
    p.add_argument("--shortlist", type=int, default=1000, help="output classes (0: the whole vocabulary)")
    args = p.parse_args(argv)

    device = torch.device(args.device)
    torch.manual_seed(0)
    vocab = list(range(1000, 1000 + args.shortlist)) if args.shortlist else None
    config = preset_config(args.preset, args.dim, "caption", num_classes=args.classes, dropout=0.1, output_vocab=vocab)
    model = Captioner(config).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    B, R, T = args.batch, args.regions, args.text
    feats = torch.randn(B, R, args.dim, device=device)
    pos = torch.randn(B, R, 6 + args.classes, device=device)
    mask = torch.ones(B, R, dtype=torch.bool, device=device)
    ids = torch.randint(1000, 1000 + (args.shortlist or 1000), (B, T), device=device)
    levels = torch.randint(1, 4, (B,), device=device)
    where = torch.rand(B, T, device=device) < 0.3
    keys = torch.randint(0, 2**32 - 1, (B,), device=device)

    def step(p: float, keyed: bool):
        def run():
            for m in model.modules():
                if hasattr(m, "p") and hasattr(m, "site"):
                    m.p = p
            logits = model(feats, pos, mask, ids, levels, where, dropout_keys=keys if keyed else None)
            loss = logits.float().logsumexp(-1).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if device.type == "cuda":
                torch.cuda.synchronize()
        return run

    runs = {"no dropout": step(0.0, False), "torch's dropout (rank)": step(0.1, False),
            "keyed dropout (example)": step(0.1, True)}
    for run in runs.values():  # warm-up
        run()
    times = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    base = statistics.median(times["torch's dropout (rank)"])
    print(f"one training step, preset {args.preset} on {args.device}, batch {B}, {R} regions, {T} text tokens, "
          f"median of {args.rounds} interleaved rounds")
    print("| dropout | ms a step | against torch's dropout |")
    print("|---|---:|---:|")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"| {name} | {median * 1000:.1f} | {median / base:.2f}x |")


if __name__ == "__main__":
    run_main(main)
