"""bfloat16 against float32 where it matters to the method: the two measurements that let ``--precision
auto`` (bf16 autocast on a GPU) be the default (docs/gpu.md has the results).

1. ``scores``: 05's log p of every self-generated caption under both models, in float32 and under bf16
   autocast, and u = log p(trusted) - log p(extended) of each. CLID's schedule (06, c = 2, s = 1) draws at
   80% of its iterations (iteration 40) a fifth of the pool; the share of the float32 draw that the bf16
   draw keeps must be at least 99%. Also the largest |log p| difference and the rank correlation of u.
2. ``features``: the same with the region features stored as float16 and as bfloat16 (``python -m clid.features
   convert --format clid --dtype ...``) against float32, both models in float32: the file sizes, the largest
   input difference, the rank correlation of u (target >= 0.9999) and the draw overlap at 80% (>= 99%).
3. ``train``: short runs of 04 (the flags given after ``--``) in float32 at several seeds and in bf16 at
   some of them: the mean loss of a bf16 run's last logged steps must differ from the float32 run's at its
   seed by less than the float32 seeds' standard deviation (the range of the float32 seeds is shown too).

    python bench/bench_precision.py scores --trusted runs/demo/trusted_ft --extended runs/demo/extended \\
        --selfgen runs/demo/paraphrased.jsonl --features data/demo/features.h5 [--device cuda] [--limit N]
    python bench/bench_precision.py features --trusted runs/demo/trusted_ft --extended runs/demo/extended \\
        --selfgen runs/demo/paraphrased.jsonl --features data/demo/features.h5 [--limit N]
    python bench/bench_precision.py train --seeds 0 1 2 -- --captions data/demo/captions.json \\
        --features data/demo/features.h5 --preset tiny --max-steps 200 ...
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from clid.run.cli import HelpFormatter, run_main  # noqa: E402

DRAW_ITERATION = 40  # 80% of the schedule at c = 2


def scores(args) -> dict:
    from clid.base.files import read_jsonl
    from clid.data.inputs import make_examples
    from clid.data.store import FeatureStore, RegionCache
    from clid.model.checkpoints import load_checkpoint
    from clid.model.scoring import caption_logprobs
    from clid.selection.schedule import draw

    features = FeatureStore(args.features)
    models = [load_checkpoint(args.trusted, args.device), load_checkpoint(args.extended, args.device)]
    items = [(str(r["id"]), str(r["image_id"]), r["caption"]) for r in read_jsonl(args.selfgen)]
    if args.limit:
        items = [items[i] for i in np.random.default_rng(0).choice(len(items), args.limit, replace=False)]
    examples, _ = make_examples(items, models[0].tokenizer, models[0].levels, "selfgen", features)
    regions = RegionCache.for_model(features, models[0].config)
    logp, seconds = {}, {}
    for precision in ("fp32", "bf16"):
        start = time.time()
        logp[precision] = [caption_logprobs(m, examples, regions, device=args.device, precision=precision) for m in models]
        seconds[precision] = round(time.time() - start, 1)
        print(f"{precision}: {len(examples)} captions, both models, {seconds[precision]} s", flush=True)
    u = {p: torch.from_numpy((a - b).astype(np.float32)) for p, (a, b) in logp.items()}
    schedule = SimpleNamespace(c=2.0, s=1.0, schedule="smooth", seed=args.seed)
    drawn = {p: set(draw(u[p], DRAW_ITERATION, schedule)[0].tolist()) for p in u}
    overlap = len(drawn["fp32"] & drawn["bf16"]) / max(1, len(drawn["fp32"]))
    diff = max(float(np.max(np.abs(logp["bf16"][k] - logp["fp32"][k]))) for k in range(2))
    ranks = [np.argsort(np.argsort(u[p].numpy())) for p in ("fp32", "bf16")]
    result = {"captions": len(examples), "drawn_at_80": len(drawn["fp32"]), "overlap_at_80": round(overlap, 5),
              "max_logp_difference": diff, "u_rank_correlation": float(np.corrcoef(*ranks)[0, 1]),
              "seconds": seconds, "device": str(args.device), "target": "overlap >= 0.99",
              "met": overlap >= 0.99}
    print(json.dumps(result, indent=1))
    return result


def feature_dtypes(args) -> dict:
    """float16 and bfloat16 region features against float32, under the same two float32 models."""
    import os

    from clid.base.files import read_jsonl
    from clid.data.inputs import make_examples
    from clid.data.store import FeatureStore, RegionCache
    from clid.features.convert import main as convert
    from clid.model.checkpoints import load_checkpoint
    from clid.model.scoring import caption_logprobs
    from clid.selection.schedule import draw

    models = [load_checkpoint(args.trusted, args.device), load_checkpoint(args.extended, args.device)]
    items = [(str(r["id"]), str(r["image_id"]), r["caption"]) for r in read_jsonl(args.selfgen)]
    if args.limit:
        items = [items[i] for i in np.random.default_rng(0).choice(len(items), args.limit, replace=False)]
    schedule = SimpleNamespace(c=2.0, s=1.0, schedule="smooth", seed=args.seed)
    result, u, drawn = {"device": str(args.device)}, {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        files = {"float32": Path(args.features)}
        for dtype in ("float16", "bfloat16"):
            files[dtype] = Path(tmp) / f"{dtype}.h5"
            convert(["--format", "clid", args.features, "--dtype", dtype, "--out", str(files[dtype])])
        stores = {dtype: FeatureStore(path) for dtype, path in files.items()}
        examples, _ = make_examples(items, models[0].tokenizer, models[0].levels, "selfgen", stores["float32"])
        images = sorted(set(examples.image_ids))
        for dtype, store in stores.items():
            start = time.time()
            regions = RegionCache.for_model(store, models[0].config)
            logp = [caption_logprobs(m, examples, regions, mode=args.mode, device=args.device, precision="fp32")
                    for m in models]
            u[dtype] = torch.from_numpy((logp[0] - logp[1]).astype(np.float32))
            drawn[dtype] = set(draw(u[dtype], DRAW_ITERATION, schedule)[0].tolist())
            row = {"file_bytes": os.path.getsize(files[dtype]), "seconds": round(time.time() - start, 1)}
            if dtype != "float32":
                worst = {f"{name} {how}": 0.0 for name in ("features", "cls_prob") for how in ("absolute", "relative")}
                largest = 0.0
                for image_id in images:  # (relative: to the value; tiny values lose their digits in float16)
                    a, b = stores["float32"].get(image_id), store.get(image_id)
                    largest = max(largest, float(np.abs(a.features).max()))
                    for name in ("features", "cls_prob"):
                        x, y = getattr(a, name), getattr(b, name)
                        if x is not None:
                            worst[f"{name} absolute"] = max(worst[f"{name} absolute"], float(np.abs(x - y).max()))
                            worst[f"{name} relative"] = max(worst[f"{name} relative"], float(
                                np.max(np.abs(x - y) / np.maximum(np.abs(x), 1e-30))))
                overlap = len(drawn[dtype] & drawn["float32"]) / max(1, len(drawn["float32"]))
                ranks = [np.argsort(np.argsort(u[p].numpy())) for p in ("float32", dtype)]
                row.update(bytes_ratio=round(row["file_bytes"] / result["float32"]["file_bytes"], 3),
                           largest_input_difference=worst, largest_feature=largest,
                           max_u_difference=float((u[dtype] - u["float32"]).abs().max()),
                           u_rank_correlation=float(np.corrcoef(*ranks)[0, 1]), overlap_at_80=round(overlap, 5),
                           met=bool(np.corrcoef(*ranks)[0, 1] >= 0.9999 and overlap >= 0.99))
            result[dtype] = row
            print(f"{dtype}: {json.dumps(row)}", flush=True)
    result.update(mode=args.mode, captions=len(examples), images=len(images), drawn_at_80=len(drawn["float32"]),
                  target="u rank correlation >= 0.9999 and overlap >= 0.99")
    print(json.dumps(result, indent=1))
    return result


def final_loss(out: Path, last: int) -> float:
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    return float(np.mean([r["loss"] for r in log if "loss" in r][-last:]))


def train(args) -> dict:
    flags = [a for a in args.flags if a != "--"]
    if not set(args.bf16_seeds or []) <= set(args.seeds) or len(args.seeds) < 2:
        raise SystemExit("error: --bf16-seeds must be some of --seeds, which needs two seeds at least")
    losses: dict[str, dict[int, float]] = {"fp32": {}, "bf16": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for precision, seeds in (("fp32", args.seeds), ("bf16", args.bf16_seeds or args.seeds[:1])):
            for seed in seeds:
                out = Path(tmp) / f"{precision}-{seed}"
                command = [sys.executable, str(ROOT / "04_train_base.py"), *flags, "--seed", str(seed),
                           "--precision", precision, "--out", str(out)]
                start = time.time()
                subprocess.run(command, cwd=ROOT, check=True, capture_output=True)
                losses[precision][seed] = final_loss(out, args.last)
                print(f"{precision} seed {seed}: loss {losses[precision][seed]:.4f} ({time.time() - start:.0f} s)",
                      flush=True)
    fp32 = list(losses["fp32"].values())
    spread = float(np.std(fp32, ddof=1))
    gaps = {seed: abs(v - losses["fp32"][seed]) for seed, v in losses["bf16"].items()}
    result = {"fp32": losses["fp32"], "bf16": losses["bf16"], "fp32_range": [min(fp32), max(fp32)],
              "fp32_seed_std": spread, "bf16_minus_fp32_same_seed": gaps,
              "target": "bf16's loss differs from fp32's at the same seed by less than the fp32 seeds' standard "
                        "deviation", "met": all(gap < spread for gap in gaps.values())}
    print(json.dumps(result, indent=1))
    return result


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    s = sub.add_parser("scores", help="05's scores and CLID's draw at 80%% of its schedule, fp32 against bf16",
                       formatter_class=HelpFormatter)
    s.add_argument("--trusted", required=True, help="05's --trusted: the checkpoint of the trusted-only model")
    s.add_argument("--extended", required=True, help="05's --extended: the checkpoint of M_theta~")
    s.add_argument("--selfgen", required=True, help="the self-generated captions scored (JSONL)")
    s.add_argument("--features", required=True, help="the region features both models read (HDF5)")
    s.add_argument("--device", default="cpu", help="where both precisions score: cpu, cuda, cuda:1, ...")
    s.add_argument("--limit", type=int, default=0, help="score a random subset of this many captions (0: all)")
    s.add_argument("--seed", type=int, default=0, help="the draw's seed (06's --seed)")
    f = sub.add_parser("features", help="05's scores and the draw at 80%%: float16 and bfloat16 features against "
                       "float32", formatter_class=HelpFormatter)
    for action in s._actions[1:]:  # (the same flags as scores)
        f._add_action(action)
    f.add_argument("--mode", choices=["prefix", "pseudo", "onepass"], default="prefix", help="05's --mode")
    t = sub.add_parser("train", help="short 04 runs: bf16's final loss against the fp32 seeds' range",
                       formatter_class=HelpFormatter)
    t.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="fp32 seeds")
    t.add_argument("--bf16-seeds", type=int, nargs="+", default=None, help="bf16 seeds, some of --seeds (default: the first)")
    t.add_argument("--last", type=int, default=3, help="logged steps averaged for a run's final loss")
    t.add_argument("flags", nargs=argparse.REMAINDER, help="-- then 04's flags (without --seed, --precision, --out)")
    p.add_argument("--json", default=None, help="also write the result to this file")
    args = p.parse_args(argv)
    result = {"scores": scores, "features": feature_dtypes, "train": train}[args.what](args)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    run_main(main)
