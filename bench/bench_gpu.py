"""Every row of the COCO recipe's GPU table in one command, each beside its bound or peer measured in the
same run, and the recipe's GPU-hours per million self-generated captions.

In:  nothing: models of the real shapes with random weights (the captioner as the `labert` preset, BERT-base;
     Pegasus as pegasus-large), random region features (100 regions of 2048 dimensions and 1,601 class
     probabilities per image, as the VLP release), captions of every level 1 to 7, and a vocabulary of
     30,522 made-up words (the GPU machine has no offline vocabulary package; nothing is downloaded).
Out: one line per row as it is measured, then a table and the GPU-hours; --json FILE also writes the rows.

    python bench/bench_gpu.py                          # one H100 or H200: about 5 minutes, at most 8
    python bench/bench_gpu.py --smoke                  # tiny sizes on the CPU, the GPU-only rows and torchrun
                                                       # skipped (a test)
    python bench/bench_gpu.py --sections kernels score # some of: kernels train train04 score caption paraphrase

Rows (a "target" is issue 42's for one H200, with the H100's in brackets; the CPU smoke test checks none):
- kernels: seq_logprob [64, 24, 30522] bf16 against eager log_softmax + gather and one read of the logits at
  the measured copy bandwidth; token_logprob_hidden (P = 16,384, H = 768, V = 30,522, bf16) against the bare
  cuBLAS product h @ W.T, and its extra memory against the logits'.
- train: Trainer.train_step on a batch of 64 (levels 1-7) as the code ran before (one encoder pass per text
  length, float32, a host check in every step), with one padded pass, and with --precision auto; beside the
  staged bound (the batches already on the GPU, one padded pass, bf16 autocast, no host synchronisation);
  the host's share (collate and region padding of one batch).
- train04: 04_train_base.py itself from an HDF5 file, and under torchrun --nproc_per_node 1, its step time
  from train_log.jsonl.
- score: 05's prefix scoring (levels 1-7) in float32 at batch 64 (before), under --precision auto and
  --batch-size auto with the default head (clid.model.scoring.default_head) and with the other one, and the
  authors' eager loop;
  bf16's largest log p difference from fp32 and the rank correlation of the two.
- caption: clid.caption's decoding, 36 regions per image, levels 1, 4, 7 in float32 at batch 64 (before) and
  with --precision auto --batch-size auto.
- paraphrase: Pegasus beam search (10 beams, 32 new tokens) in float32 at batch 32 (03's defaults before) and
  in bfloat16 at 03's --batch-size auto.

Timing: wall-clock with a device synchronisation, after warm-up; a row's time is the median of its repeats
(or of a loop of steps divided by their number, the way the stage runs them).
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from bench_score import gpu_copy_bandwidth, gpu_peak_extra  # noqa: E402

from clid import ops, runtime  # noqa: E402
from clid.cli import HelpFormatter, run_main  # noqa: E402

SECTIONS = ("kernels", "train", "train04", "score", "caption", "paraphrase")
BERT_BASE = dict(hidden_size=768, num_layers=12, num_heads=12, intermediate_size=3072, region_hidden=2048)
PEGASUS_LARGE = dict(d_model=1024, encoder_layers=16, decoder_layers=16, encoder_attention_heads=16,
                     decoder_attention_heads=16, encoder_ffn_dim=4096, decoder_ffn_dim=4096, vocab_size=96103)
VOCAB = 30522
FULL = dict(model=BERT_BASE, regions=100, feature_dim=2048, classes=1601, batch=64, train_steps=20, images=128,
            run_steps=60, log_every=20, score_levels=(1, 2, 3, 4, 5, 6, 7), score_per_level=256, before_per_level=64,
            eager_captions=32, caption_images=64, caption_regions=36,
            caption_levels=(1, 4, 7), decode_steps=None,
            pegasus=PEGASUS_LARGE, pieces=32, piece_tokens=32, new_tokens=32, beams=10,
            seq_shape=(64, 24, VOCAB), hidden_shape=(16384, 768, VOCAB), repeats=20)
SMOKE = dict(model=dict(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, region_hidden=32),
             regions=6, feature_dim=16, classes=5, batch=8, train_steps=2, images=12, run_steps=2, log_every=1,
             score_levels=(1,), score_per_level=2, before_per_level=2, eager_captions=2, caption_images=2,
             caption_regions=5, caption_levels=(7,), decode_steps=(2,) * 7,
             pegasus=dict(d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                          decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, vocab_size=200),
             pieces=4, piece_tokens=8, new_tokens=4, beams=2, seq_shape=(4, 6, 301), hidden_shape=(64, 16, 301),
             repeats=2)
MILLION = 1e6
RECIPE_STEPS = 300_000  # the authors' 04 + 06 steps


# ---------------------------------------------------------------------------------------------
# Rows and timing


class Table:
    """The measured rows, each printed as soon as it is known."""

    def __init__(self, device: str):
        self.device, self.rows = device, []

    def add(self, path: str, ours: float, unit: str, peer: str = "", theirs: float | None = None,
            ratio: float | None = None, target: str = "", met: bool | None = None, **extra) -> dict:
        row = {"path": path, "ours": ours, "unit": unit, "peer": peer, "peer_value": theirs, "ratio": ratio,
               "target": target, "met": met, **extra}
        self.rows.append(row)
        print(" | ".join([path, f"{ours:.4g} {unit}", f"{peer} {theirs:.4g}" if theirs is not None else peer,
                          f"{ratio:.3g}x" if ratio is not None else "", target,
                          "" if met is None else ("met" if met else "missed")]), flush=True)
        return row

    def value(self, path: str) -> float | None:
        return next((r["ours"] for r in self.rows if r["path"] == path), None)


def sync(device: str) -> None:
    if runtime.device_type(device) == "cuda":
        torch.cuda.synchronize()


def median_seconds(fn, device: str, repeats: int, warmup: int = 2) -> float:
    """Median wall-clock seconds of ``fn()``, each call closed by a device synchronisation."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def loop_seconds(fn, device: str, n: int, warmup: int = 2) -> float:
    """Seconds per call of ``n`` calls in a row with one synchronisation at the end (how a stage loops)."""
    for _ in range(warmup):
        fn()
    sync(device)
    start = time.perf_counter()
    for _ in range(n):
        fn()
    sync(device)
    return (time.perf_counter() - start) / n


def target_for(device: str, h200: float, h100: float) -> tuple[float | None, str]:
    """(the issue's target on this GPU, its text): H200's, or H100's on an H100; none on the CPU."""
    if runtime.device_type(device) != "cuda":
        return None, ""
    name = torch.cuda.get_device_name()
    value = h100 if "H100" in name else h200
    return value, f">= {value:g} ({'H100' if 'H100' in name else 'H200'})"


# ---------------------------------------------------------------------------------------------
# Inputs: a vocabulary, captions, region features, models


def write_vocabulary(folder: Path):
    """A BERT WordPiece tokenizer of 30,522 entries, with BERT's special and "." ids, saved in ``folder``."""
    from transformers import BertTokenizerFast

    words = [f"w{i}" for i in range(VOCAB)]
    for i, token in ((0, "[PAD]"), (100, "[UNK]"), (101, "[CLS]"), (102, "[SEP]"), (103, "[MASK]"), (1012, ".")):
        words[i] = token
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(words) + "\n")
    tokenizer = BertTokenizerFast.from_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return tokenizer


def caption_texts(levels, n_per_level: int, seed: int) -> list[tuple[int, str]]:
    """(level, text) of ``n_per_level`` captions at each of the caption levels ``levels``, lengths spread over
    the level."""
    from clid.text import get_levels

    rng = np.random.default_rng(seed)
    out = []
    for level in levels:
        low, high = get_levels("caption")[level - 1]
        for _ in range(n_per_level):
            n_words = int(rng.integers(low, high + 1)) - 1  # the final "." is a token
            out.append((level, " ".join(f"w{i}" for i in rng.integers(2000, 29000, max(1, n_words))) + "."))
    return out


def write_features(path: Path, size: dict, n_images: int, seed: int = 0, classes: bool = True) -> None:
    from clid.features.store import Regions, write_features as write

    rng = np.random.default_rng(seed)

    def images():
        for i in range(n_images):
            R = size["regions"]
            xy = rng.uniform(0, 400, (R, 2))
            boxes = np.concatenate([xy, xy + rng.uniform(20, 200, (R, 2))], axis=1).astype(np.float32)
            cls = rng.dirichlet(np.ones(size["classes"]), R).astype(np.float32) if classes else None
            yield str(i), Regions(rng.normal(size=(R, size["feature_dim"])).astype(np.float32), boxes, 640.0, 640.0,
                                  cls, rng.uniform(0.2, 1.0, R).astype(np.float32))

    write(path, images(), "vlp-fc6")


def write_captions(path: Path, texts: list[tuple[int, str]], n_images: int) -> None:
    """A Karpathy JSON: the captions spread over the train images, one val and one test image."""
    images = [{"cocoid": i, "filename": f"{i:06d}.jpg", "split": "train", "sentences": []} for i in range(n_images)]
    images[-2]["split"], images[-1]["split"] = "val", "test"
    for k, (_, text) in enumerate(texts):
        images[k % (n_images - 2)]["sentences"].append({"raw": text, "tokens": text.rstrip(".").split()})
    path.write_text(json.dumps({"images": [im for im in images if im["sentences"] or im["split"] != "train"]}))


def captioner(size: dict, tokenizer, device: str, classes: int, dropout: float = 0.0, seed: int = 0):
    from clid.model.captioner import Captioner, CaptionerConfig

    torch.manual_seed(seed)
    config = CaptionerConfig(vocab_size=VOCAB, region_dim=size["feature_dim"], num_classes=classes, dropout=dropout,
                             preset="labert", **size["model"])
    model = Captioner(config)
    model.tokenizer = tokenizer
    return model.to(device)


class Data:
    """The shared inputs of the captioner's rows, written once into a temporary folder."""

    def __init__(self, folder: Path, size: dict):
        from clid.features.store import FeatureStore
        from clid.model.inputs import make_examples

        self.folder, self.size = folder, size
        self.tokenizer = write_vocabulary(folder / "vocab")
        self.features_path = folder / "features.h5"
        write_features(self.features_path, size, size["images"])
        self.features = FeatureStore(self.features_path)
        self.texts = caption_texts(size["score_levels"], size["score_per_level"], seed=1)
        items = [(str(k), str(k % (size["images"] - 2)), text) for k, (_, text) in enumerate(self.texts)]
        self.examples, skipped = make_examples(items, self.tokenizer, "caption", "selfgen", self.features)
        assert not skipped and len(self.examples) == len(items), skipped


# ---------------------------------------------------------------------------------------------
# The sections


def kernels(table: Table, size: dict, device: str) -> None:
    gen = torch.Generator().manual_seed(0)
    N, T, V = size["seq_shape"]
    logits = (torch.randn(N, T, V, generator=gen) * 3).to(device, torch.bfloat16)
    targets = torch.randint(0, V, (N, T), generator=gen).to(device)
    mask = torch.ones(N, T, dtype=torch.bool, device=device)

    def eager():
        logp = torch.log_softmax(logits, -1).gather(-1, targets[..., None])[..., 0]
        return (logp * mask).sum(1) / mask.sum(1)

    ours = median_seconds(lambda: ops.seq_logprob(logits, targets, mask), device, size["repeats"])
    peer = median_seconds(eager, device, size["repeats"])
    table.add(f"seq_logprob {list(size['seq_shape'])} bf16", ours * 1e3, "ms", "eager", peer * 1e3, peer / ours,
              ">= 1x eager", peer / ours >= 1 if device != "cpu" else None)
    if runtime.device_type(device) == "cuda":
        read_once = logits.numel() * logits.element_size() / gpu_copy_bandwidth() * 2  # (a copy reads and writes)
        table.add("seq_logprob against one read of the logits", ours * 1e3, "ms", "read once", read_once * 1e3,
                  ours / read_once, "<= 2x the read", ours <= 2 * read_once)

    P, H, V = size["hidden_shape"]
    hidden = torch.randn(P, H, generator=gen).to(device, torch.bfloat16)
    weight = (torch.randn(V, H, generator=gen) / math.sqrt(H)).to(device, torch.bfloat16)
    y = torch.randint(0, V, (P,), generator=gen).to(device)
    ours = median_seconds(lambda: ops.token_logprob_hidden(hidden, weight, None, y), device, size["repeats"])
    bare = median_seconds(lambda: hidden @ weight.T, device, size["repeats"])
    table.add(f"token_logprob_hidden P={P} H={H} V={V} bf16", ours * 1e3, "ms", "bare h @ W.T", bare * 1e3,
              ours / bare, "<= 1.25x the product", ours <= 1.25 * bare if device != "cpu" else None)
    if runtime.device_type(device) == "cuda":
        extra = gpu_peak_extra(lambda: ops.token_logprob_hidden(hidden, weight, None, y)) - P * 4  # (less the output)
        logits_bytes = P * V * 2
        table.add("token_logprob_hidden extra memory", extra / 2**20, "MiB", "the logits", logits_bytes / 2**20,
                  extra / logits_bytes, "<= 5% of the logits", extra <= 0.05 * logits_bytes)


def train(table: Table, size: dict, device: str, data: Data) -> float:
    """The training-step rows; returns the staged bound's seconds per step."""
    from functools import partial

    from clid.features.store import RegionCache
    from clid.model.captioner import Captioner
    from clid.model.train import StepBatches, Trainer, TrainSettings, epoch_batches, masked_lm_loss

    model = captioner(size, data.tokenizer, device, size["classes"], dropout=0.1)
    regions = RegionCache.for_model(data.features, model.config)
    n, batch = len(data.examples), size["batch"]
    steps = size["train_steps"]
    batches = StepBatches(data.examples, model, regions, lambda step: epoch_batches(n, batch, step, 0),
                          range(steps + 2), seed=0)
    # every region read once (the cache is warm), each batch in pinned memory as the loader's workers hand it over
    made = [(runtime.pin(inputs, device), *runtime.pin([places, classes], device))
            for inputs, places, classes in (batches[i] for i in range(steps + 2))]
    host = median_seconds(lambda: batches[0], "cpu", size["repeats"])
    table.add("host share: collate + region padding of one batch", host * 1e3, "ms")

    def trainer_step_time(precision: str, grouped: bool | None, defer: bool | None) -> float:
        settings = TrainSettings(precision=precision, workers=0, warmup=10, max_steps=10**6)
        with tempfile.TemporaryDirectory() as out:
            trainer = Trainer(model, data.examples, regions, settings, out, {}, torch.device(device),
                              defer_checks=defer)
            model.encode = partial(Captioner.encode, model, grouped=grouped)
            it = iter(made)
            seconds = loop_seconds(lambda: trainer.train_step(next(it)), device, steps)
            trainer.check_finite()
            del model.encode
        return seconds

    before = trainer_step_time("fp32", grouped=True, defer=False)
    table.add("training step (Trainer.train_step), before: one pass per text length, fp32, host checks", before * 1e3, "ms")
    padded = trainer_step_time("fp32", grouped=None, defer=None)
    table.add("training step, one padded pass (on a GPU), fp32", padded * 1e3, "ms", "before", before * 1e3, before / padded)
    auto = trainer_step_time("auto", grouped=None, defer=None)
    table.add("training step, --precision auto", auto * 1e3, "ms", "before", before * 1e3, before / auto)

    # the staged bound: the same model and batches on the device, one padded pass, bf16, no host work
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, eps=1e-6, weight_decay=0.01, fused=True)
    staged = [runtime.to_device([*inputs, places, classes], device) for inputs, places, classes in made]
    it = iter(staged)

    def bound_step():
        *inputs, places, classes = next(it)
        with runtime.autocast("bf16" if runtime.device_type(device) == "cuda" else "fp32", device):
            logits = model(*inputs, places)
        loss_sum, weight_sum = masked_lm_loss(logits, classes, 1012)
        optimizer.zero_grad(set_to_none=True)
        (loss_sum / weight_sum).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    model.train()
    bound = loop_seconds(bound_step, device, steps)
    table.add("training step, staged bound (batches on the device, padded, bf16, no sync)", bound * 1e3, "ms",
              "--precision auto", auto * 1e3, auto / bound, "", None)
    return bound


def run_04(size: dict, data: Data, folder: Path, device: str, torchrun: bool) -> float:
    """Seconds per step of 04_train_base.py on the HDF5 file (from its train_log.jsonl), past its first
    logged steps."""
    bert = folder / "bert"
    if not (bert / "config.json").exists():
        from transformers import BertConfig, BertModel

        m = size["model"]
        config = BertConfig(vocab_size=VOCAB, hidden_size=m["hidden_size"], num_hidden_layers=m["num_layers"],
                            num_attention_heads=m["num_heads"], intermediate_size=m["intermediate_size"])
        BertModel(config).save_pretrained(bert)
        data.tokenizer.save_pretrained(bert)
        write_captions(folder / "captions.json", data.texts, size["images"])
    out = folder / ("run-torchrun" if torchrun else "run")
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1"] if torchrun \
        else [sys.executable]
    command = [*launcher, str(ROOT / "04_train_base.py"), "--captions", folder / "captions.json", "--features",
               data.features_path, "--out", out, "--preset", "labert", "--bert", bert, "--max-steps", size["run_steps"],
               "--log-every", size["log_every"], "--save-every", 10**6, "--eval-every", 0, "--warmup", 10,
               "--batch-size", size["batch"], "--max-left-out", 1, "--region-dropout", "on"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run([str(c) for c in command], cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"04 failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    log = [r for r in log if "loss" in r]
    first, last = log[0], log[-1]
    return (last["seconds"] - first["seconds"]) / (last["step"] - first["step"])


def train04(table: Table, size: dict, device: str, data: Data, folder: Path, bound: float | None) -> float:
    plain = run_04(size, data, folder, device, torchrun=False)
    cuda = runtime.device_type(device) == "cuda"
    table.add("training step as 04 runs it from an HDF5 file", plain * 1e3, "ms", "staged bound",
              None if bound is None else bound * 1e3, None if bound is None else plain / bound,
              "<= 1.2x the bound", plain <= 1.2 * bound if cuda and bound else None)
    if size is SMOKE:  # (a second start of 04 adds nothing to the smoke test but its time)
        return plain
    launched = run_04(size, data, folder, device, torchrun=True)
    table.add("training step as 04 runs it under torchrun --nproc_per_node 1", launched * 1e3, "ms", "04 alone",
              plain * 1e3, launched / plain, "<= 1.05x 04 alone", launched <= 1.05 * plain if cuda else None)
    return plain


def score(table: Table, size: dict, device: str, data: Data) -> tuple[float, float]:
    """05's rows; returns (captions/s before, captions/s with today's defaults), one model each."""
    from clid.features.store import RegionCache
    from clid.model.scoring import caption_logprobs, caption_logprobs_eager, default_head

    trusted = captioner(size, data.tokenizer, device, size["classes"], seed=1).eval()
    regions = RegionCache.for_model(data.features, trusted.config)
    examples = data.examples
    n = len(examples)
    positions = size["regions"] + trusted.levels[-1][1]
    auto_batch = runtime.batch_size("auto", device, runtime.encoder_bytes(trusted.config, positions, "bf16"), 64)

    def rate(captions, **options) -> tuple[float, np.ndarray]:
        # warm-up on a whole batch of the longest level: the allocator and the attention kernels see the sizes
        # they will run (a warm-up of a few captions left the first row measured slower than the next)
        warm = [k for k in range(len(captions)) if captions.levels[k] == captions.levels.max()][:options["batch_size"]]
        caption_logprobs(trusted, captions.subset(warm), regions, device=device, **options)
        sync(device)
        start = time.perf_counter()
        logp = caption_logprobs(trusted, captions, regions, device=device, **options)
        sync(device)
        return len(captions) / (time.perf_counter() - start), logp

    per_level = size["score_per_level"]  # (the captions are in level order: "before" takes the first of each)
    first = [k for k in range(n) if k % per_level < size["before_per_level"]]
    before, fp32 = rate(examples.subset(first), batch_size=64, precision="fp32")
    table.add("05 prefix scoring, levels 1-7, fp32, batch 64 (before)", before, "captions/s")
    goal, goal_text = target_for(device, 250, 180)
    now, auto = rate(examples, batch_size=auto_batch, precision="auto")
    auto = auto[first]  # (compared with float32 on the captions both scored)
    diff = float(np.max(np.abs(auto - fp32)))
    table.add(f"05 prefix scoring, --precision auto, --batch-size auto ({auto_batch})", now, "captions/s", "fp32",
              before, now / before, goal_text, now >= goal if goal else None, max_logp_difference=diff,
              rank_correlation=rank_correlation(auto, fp32))
    names = {"fused": "the fused op token_logprob_hidden", "eager": "linear + log_softmax + gather"}
    default = default_head(device)
    other = "fused" if default == "eager" else "eager"
    other_rate, _ = rate(examples, batch_size=auto_batch, precision="auto", head=other)
    table.add(f"05 with {names[other]} for the head", other_rate, "captions/s", f"{names[default]} (the default)",
              now, now / other_rate)
    subset = examples.subset(range(0, n, max(1, n // size["eager_captions"])))
    caption_logprobs_eager(trusted, subset.subset(range(2)), regions, device=device)
    sync(device)
    start = time.perf_counter()
    caption_logprobs_eager(trusted, subset, regions, device=device)
    sync(device)
    authors = len(subset) / (time.perf_counter() - start)
    table.add("05, the authors' eager loop (fp32)", authors, "captions/s", "--precision auto", now, now / authors)
    return before, now


def rank_correlation(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def caption(table: Table, size: dict, device: str, data: Data) -> None:
    from clid.caption import CaptionWriter, MemoryRegions
    from clid.features.store import Regions

    model = captioner(size, data.tokenizer, device, 0).eval()
    rng = np.random.default_rng(2)

    def regions(n: int) -> MemoryRegions:
        R = size["caption_regions"]
        out = {}
        for i in range(n):
            xy = rng.uniform(0, 400, (R, 2))
            boxes = np.concatenate([xy, xy + rng.uniform(20, 200, (R, 2))], axis=1).astype(np.float32)
            out[str(i)] = Regions(rng.normal(size=(R, size["feature_dim"])).astype(np.float32), boxes, 640.0, 640.0)
        return MemoryRegions(out, size["feature_dim"])

    def rate(writer: CaptionWriter, level: int, n: int) -> float:
        source = regions(n)
        ids = list(source.regions)
        writer.decode(ids[:2], [level], features=source)  # warm-up
        sync(device)
        start = time.perf_counter()
        writer.decode(ids, [level], features=source)
        sync(device)
        return n / (time.perf_counter() - start)

    steps = size["decode_steps"]
    before = CaptionWriter(model, device=device, batch_size=64, precision="fp32", steps=steps)
    now = CaptionWriter(model, device=device, batch_size="auto", precision="auto", steps=steps)
    goal, goal_text = target_for(device, 150, 100)
    for level in size["caption_levels"]:
        old = rate(before, level, size["caption_images"])
        table.add(f"caption decoding, labert, L{level}, fp32, batch 64 (before)", old, "captions/s")
        batch = now.decode_batch_size(regions(1), ["0"], [level])
        new = rate(now, level, max(size["caption_images"], batch))
        table.add(f"caption decoding, L{level}, --precision auto, --batch-size auto ({batch})", new, "captions/s",
                  "before", old, new / old, goal_text if level == 7 else "",
                  (new >= goal if goal else None) if level == 7 else None)


def paraphrase(table: Table, size: dict, device: str) -> tuple[float, float]:
    """03's rows; returns (pieces/s before, pieces/s with today's defaults)."""
    from transformers import PegasusConfig, PegasusForConditionalGeneration

    spec = importlib.util.spec_from_file_location("stage03", ROOT / "03_paraphrase.py")
    stage03 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stage03)
    config = PegasusConfig(max_position_embeddings=128, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
                           **size["pegasus"])
    torch.manual_seed(0)
    with torch.device(device):
        model = PegasusForConditionalGeneration(config).eval()
    beams, new = size["beams"], size["new_tokens"]

    def rate(batch: int, n: int) -> float:
        gen = torch.Generator().manual_seed(3)
        ids = torch.randint(2, config.vocab_size, (n, size["piece_tokens"]), generator=gen).to(device)

        def run(rows):
            with torch.no_grad():
                for start in range(0, len(rows), batch):
                    model.generate(input_ids=rows[start:start + batch], num_beams=beams, max_new_tokens=new,
                                   min_new_tokens=new, num_return_sequences=1)
        run(ids[:2])
        sync(device)
        start = time.perf_counter()
        run(ids)
        sync(device)
        return n / (time.perf_counter() - start)

    before = rate(32, size["pieces"] * 2)
    table.add("03 Pegasus, 10 beams, 32 new tokens, fp32, batch 32 (before)", before, "pieces/s")
    precision = runtime.resolve("auto", device)
    if precision == "bf16":
        model = model.to(torch.bfloat16)
    per_piece = stage03.bytes_per_piece(config, beams, size["piece_tokens"] + new, precision)
    batch = runtime.batch_size("auto", device, per_piece, stage03.BATCH_SIZE, most=256)
    goal, goal_text = target_for(device, 300, 200)
    now = rate(batch, max(size["pieces"] * 2, batch))
    table.add(f"03 Pegasus, --precision auto ({precision}), --batch-size auto ({batch})", now, "pieces/s", "before",
              before, now / before, goal_text, now >= goal if goal else None)
    return before, now


# ---------------------------------------------------------------------------------------------


def recipe_hours(table: Table, train_now: float | None, train_before: float | None, score_rates, paraphrase_rates) -> None:
    """GPU-hours of the COCO recipe per million self-generated captions: 03 (a piece each), 04 + 06
    (300,000 steps), 05 (both models)."""
    print("\nThe COCO recipe, GPU-hours per million self-generated captions (03 a piece each, 04 + 06 300,000 steps, "
          "05 with both models):")
    for name, index, step in (("before", 0, train_before), ("now", 1, train_now)):
        parts = {"03": MILLION / paraphrase_rates[index] / 3600 if paraphrase_rates else None,
                 "04+06": RECIPE_STEPS * step / 3600 if step else None,
                 "05": 2 * MILLION / score_rates[index] / 3600 if score_rates else None}
        known = [v for v in parts.values() if v is not None]
        print(f"  {name:6s} " + ", ".join(f"{k} {v:.2f} h" if v is not None else f"{k} not measured"
                                          for k, v in parts.items()) + f"; total {sum(known):.2f} h")
        table.rows.append({"path": f"recipe GPU-hours ({name})", **parts, "total": sum(known)})


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    p.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU, the GPU-only rows skipped (the tests)")
    p.add_argument("--device", default=None, help="the device measured (default: cuda; cpu with --smoke)")
    p.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS),
                   help="the parts of the table to measure, in this order")
    p.add_argument("--budget", type=float, default=460, help="seconds: a section that would start later is skipped")
    p.add_argument("--json", default=None, help="also write the rows to this file")
    args = p.parse_args(argv)
    device = args.device or ("cpu" if args.smoke else "cuda")
    if runtime.device_type(device) == "cuda" and not torch.cuda.is_available():
        p.error("no GPU here: give --smoke (tiny sizes on the CPU)")
    size = SMOKE if args.smoke else FULL
    if args.smoke:
        torch.set_num_threads(1)  # (tiny matrices: more threads only wait for each other)
    started = time.time()
    name = torch.cuda.get_device_name() if runtime.device_type(device) == "cuda" else "CPU"
    print(f"{time.strftime('%Y-%m-%d %H:%M')}: {name}, torch {torch.__version__}, {ops.build_info()}")
    table = Table(device)
    bound = train_before = train_now = None
    score_rates = paraphrase_rates = None
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        data = Data(folder, size) if set(args.sections) & {"train", "train04", "score", "caption"} else None
        for section in args.sections:
            if time.time() - started > args.budget:
                print(f"== {section}: skipped, past the budget of {args.budget:g} s")
                continue
            print(f"== {section} (at {time.time() - started:.0f} s)", flush=True)
            with torch.inference_mode(False):
                if section == "kernels":
                    kernels(table, size, device)
                elif section == "train":
                    bound = train(table, size, device, data)
                    train_before = table.value("training step (Trainer.train_step), before: one pass per text "
                                               "length, fp32, host checks") / 1e3
                elif section == "train04":
                    train_now = train04(table, size, device, data, folder, bound)
                elif section == "score":
                    score_rates = score(table, size, device, data)
                elif section == "caption":
                    caption(table, size, device, data)
                elif section == "paraphrase":
                    paraphrase_rates = paraphrase(table, size, device)
    recipe_hours(table, train_now, train_before, score_rates, paraphrase_rates)
    print(f"done in {time.time() - started:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(table.rows, indent=1))


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        run_main(main)
