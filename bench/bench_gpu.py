"""Every row of the COCO recipe's GPU table in one command, each timed beside its bound or peer in the same
run, A/B interleaved, and the recipe's GPU-hours.

In:  nothing: models of the real shapes with random weights (the captioner as the `labert` preset, BERT-base;
     Pegasus as pegasus-large), random region features (100 regions of 2048 dimensions and 1,601 class
     probabilities per image, as the VLP release), captions of every level 1 to 7, and a vocabulary of
     30,522 made-up words (the GPU machine has no offline vocabulary package; nothing is downloaded).
Out: one line per row as it is measured, then the GPU-hours; --json FILE also writes the rows.

    python bench/bench_gpu.py                          # one H100 or H200: about 5 minutes (--budget)
    python bench/bench_gpu.py --smoke                  # tiny sizes on the CPU, the GPU-only rows skipped (a test)
    python bench/bench_gpu.py --sections train04       # some of: kernels train train04 paraphrase score caption
    python bench/bench_gpu.py --device cpu --sections paraphrase   # 03's two engines on the CPU, full size

Timing: every row and its bound or peer are measured in the same rounds, interleaved (each round runs each
of them once, in an order rotated round by round), after a warm-up, wall-clock closed by a device
synchronisation; a row prints the median of its rounds and their spread [lowest-highest]; a ratio is of the
medians, ours / the peer's in the row's unit (ms: below 1 is faster; a rate: above 1 is faster). --repeats rounds (at least 5 unless the budget runs short, which the row then says).

Rows (a "target" is the one set for one H200 in docs/gpu.md, the H100's on an H100; the CPU smoke test checks none):
- kernels: seq_logprob [64, 24, 30522] bf16 against eager log_softmax + gather and one read of the logits at the
  copy bandwidth measured in the run; token_logprob_hidden (P = 16,384, H = 768, bf16) at V = 30,522 and at
  the vocabulary padded to 30,528 (a multiple of 64, the padding's logits at -inf), each against the bare cuBLAS
  product h @ W.T and linear + log_softmax + gather at the same V; its extra memory; Cut Cross-Entropy
  (`cut_cross_entropy.linear_cross_entropy`, where it is installed and runs) at V = 30,522. The tensor-core
  fused head token_logprob_hidden_tc at V = 30,522 (GPU only), in one run beside the bare product at V and
  at the padded V, linear + log_softmax + gather, token_logprob_hidden and Cut Cross-Entropy: its ratio to
  the padded product (its bound) and to each of the others.
- train: Trainer.train_step on batches of 64 (levels 1-7) with --precision auto (on the CPU also as the code ran
  on the CPU before the GPU rework of 2026-11-27: one encoder pass per text length, float32, a host check in every step) beside the staged bound (the batches already on the GPU, one padded pass, bf16 autocast, no host synchronisation);
  the host's share (collate and region padding of one batch); the loader alone (batches a second from the
  HDF5 file through 04's loader workers, no step) beside the bound's steps a second.
- train04: 04_train_base.py itself from an HDF5 file (a fresh process each round, its step time from
  train_log.jsonl) beside the staged bound; under torchrun --nproc_per_node N where N > 1 GPUs are present.
- paraphrase: 03's beam search (10 beams, 32 new tokens, pegasus-large) with transformers' generate() as 03 runs
  it (on a GPU the output layer padded to a multiple of 64 and the cross-attention cache left in place, beside
  the plain model) and with CTranslate2
  (clid.selfgen.ct2_pegasus), the same ids, 03's --precision auto and --batch-size auto; how many pieces
  decode alike.
- score: 05's prefix scoring, levels 1-7, at the pass size 05 runs at COCO scale (--batch-size auto: every pass
  full, a pass per level and round), beside float32 at batch 64 (before) and the authors' eager loop; bf16's
  largest log p difference and rank correlation against float32; the two heads at a level-1 pass.
- caption: clid.caption's decoding, 36 regions per image, levels 1, 4, 7, --precision auto --batch-size auto
  beside float32 at batch 64 (before).
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import itertools
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from bench_score import gpu_copy_bandwidth, gpu_peak_extra  # noqa: E402

from clid import ops  # noqa: E402
from clid.run import runtime
from clid.run.cli import HelpFormatter, positive_int, run_main  # noqa: E402

SECTIONS = ("kernels", "train", "train04", "paraphrase", "score", "caption")
BERT_BASE = dict(hidden_size=768, num_layers=12, num_heads=12, intermediate_size=3072, region_hidden=2048)
PEGASUS_LARGE = dict(d_model=1024, encoder_layers=16, decoder_layers=16, encoder_attention_heads=16,
                     decoder_attention_heads=16, encoder_ffn_dim=4096, decoder_ffn_dim=4096, vocab_size=96103)
VOCAB = 30522
FULL = dict(model=BERT_BASE, regions=100, feature_dim=2048, classes=1601, batch=64, train_steps=10, images=128,
            run_steps=40, log_every=10, loader_batches=40, score_levels=(1, 2, 3, 4, 5, 6, 7), score_per_level=256,
            before_per_level=64, eager_captions=32, caption_images=64, caption_regions=36,
            caption_levels=(1, 4, 7), decode_steps=None,
            pegasus=PEGASUS_LARGE, piece_tokens=32, new_tokens=32, beams=10,
            seq_shape=(64, 24, VOCAB), hidden_shape=(16384, 768, VOCAB), kernel_repeats=20)
SMOKE = dict(model=dict(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, region_hidden=32),
             regions=6, feature_dim=16, classes=5, batch=8, train_steps=2, images=12, run_steps=2, log_every=1,
             loader_batches=2, score_levels=(1,), score_per_level=2, before_per_level=2, eager_captions=2,
             caption_images=2, caption_regions=5, caption_levels=(7,), decode_steps=(2,) * 7,
             pegasus=dict(d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                          decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, vocab_size=200),
             piece_tokens=8, new_tokens=4, beams=2, seq_shape=(4, 6, 301), hidden_shape=(64, 16, 301),
             kernel_repeats=5)
WEIGHT = dict(kernels=1, train=2, train04=4, paraphrase=2, score=5, caption=2)  # (of the budget's seconds)
MILLION = 1e6
RECIPE_STEPS = 300_000  # the authors' 04 + 06 steps


# ---------------------------------------------------------------------------------------------
# Rows and timing


def median(values) -> float:
    return statistics.median(values) if isinstance(values, (list, tuple)) else values


def shown(values, unit: str) -> str:
    """"12.3 ms [11.9-12.8, 5x]": the median, the lowest and highest, the count."""
    if not isinstance(values, (list, tuple)):
        return f"{values:.4g} {unit}"
    return f"{median(values):.4g} {unit} [{min(values):.4g}-{max(values):.4g}, {len(values)}x]"


class Table:
    """The measured rows, each printed as soon as it is known."""

    def __init__(self, device: str, json_path: str | None = None):
        self.device, self.rows, self.json_path = device, [], json_path

    def write(self) -> None:
        """The rows so far into the --json file (after every row: a run stopped by a time limit keeps them)."""
        if self.json_path:
            Path(self.json_path).write_text(json.dumps(self.rows, indent=1))

    def add(self, path: str, ours, unit: str, peer: str = "", theirs=None, target: str = "", met: bool | None = None,
            **extra) -> dict:
        """A row: ``ours`` and ``theirs`` (the peer or bound named ``peer``) are a value or the list of a value per
        round (median and spread printed); the ratio is of the medians, ours / theirs."""
        ratio = None if theirs is None else median(ours) / median(theirs)
        row = {"path": path, "ours": median(ours), "unit": unit, "peer": peer,
               "peer_value": None if theirs is None else median(theirs), "ratio": ratio, "target": target, "met": met,
               "ours_rounds": ours if isinstance(ours, list) else None,
               "peer_rounds": theirs if isinstance(theirs, list) else None, **extra}
        self.rows.append(row)
        self.write()
        print(" | ".join([path, shown(ours, unit), f"{peer} {shown(theirs, unit)}" if theirs is not None else peer,
                          f"{ratio:.3g}x" if ratio is not None else "", target,
                          "" if met is None else ("met" if met else "missed")]), flush=True)
        return row

    def note(self, path: str, text: str) -> None:
        self.rows.append({"path": path, "note": text})
        self.write()
        print(f"{path} | {text}", flush=True)

    def value(self, path: str) -> float | None:
        return next((r["ours"] for r in self.rows if r["path"].startswith(path) and "ours" in r), None)


def sync(device: str) -> None:
    if runtime.device_plan(device).gpu:
        torch.cuda.synchronize()


def interleaved(fns: dict, device: str, rounds: int, warmup: int = 1, per_call: dict | None = None,
                stop_after: float | None = None) -> dict[str, list[float]]:
    """Seconds per call of each of ``fns`` (name -> function), measured in ``rounds`` rounds that call each
    function once, the order rotated round by round, after ``warmup`` calls of each. A function may return
    its own seconds (a float: what it timed itself); else its wall time counts, closed by a device
    synchronisation. ``per_call[name]`` divides a call's seconds (the steps of a loop). ``stop_after``: no new
    round starts after that many seconds (at least two rounds run)."""
    names = list(fns)
    for name in names:
        for _ in range(warmup):
            fns[name]()
    sync(device)
    times: dict[str, list[float]] = {name: [] for name in names}
    started = time.perf_counter()
    for r in range(rounds):
        if stop_after is not None and r >= 2 and time.perf_counter() - started > stop_after:
            break
        for name in names[r % len(names):] + names[:r % len(names)]:
            sync(device)
            start = time.perf_counter()
            own = fns[name]()
            sync(device)
            seconds = own if isinstance(own, float) else time.perf_counter() - start
            times[name].append(seconds / (per_call or {}).get(name, 1))
    return times


def ms(values: list[float]) -> list[float]:
    return [v * 1e3 for v in values]


def rates(values: list[float], items: int) -> list[float]:
    return [items / v for v in values]


def target_for(device: str, h200: float, h100: float, relation: str = ">=") -> tuple[float | None, str]:
    """(the target set for this GPU in docs/gpu.md, its text): H200's, or H100's on an H100; none on the CPU."""
    if not runtime.device_plan(device).gpu:
        return None, ""
    name = torch.cuda.get_device_name()
    value = h100 if "H100" in name else h200
    return value, f"{relation} {value:g} ({'H100' if 'H100' in name else 'H200'})"


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
    from clid.base.text import get_levels

    rng = np.random.default_rng(seed)
    out = []
    for level in levels:
        low, high = get_levels("caption")[level - 1]
        for _ in range(n_per_level):
            n_words = int(rng.integers(low, high + 1)) - 1  # the final "." is a token
            out.append((level, " ".join(f"w{i}" for i in rng.integers(2000, 29000, max(1, n_words))) + "."))
    return out


def write_features(path: Path, size: dict, n_images: int, seed: int = 0, classes: bool = True) -> None:
    from clid.data.store import Regions
    from clid.data.store import write_features as write

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
        from clid.data.inputs import make_examples
        from clid.data.store import FeatureStore

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


def kernels(table: Table, size: dict, device: str, rounds: int) -> None:
    gen = torch.Generator().manual_seed(0)
    cuda = runtime.device_plan(device).gpu
    rounds = max(rounds, size["kernel_repeats"])
    N, T, V = size["seq_shape"]
    logits = (torch.randn(N, T, V, generator=gen) * 3).to(device, torch.bfloat16)
    targets = torch.randint(0, V, (N, T), generator=gen).to(device)
    mask = torch.ones(N, T, dtype=torch.bool, device=device)

    def eager():
        logp = torch.log_softmax(logits, -1).gather(-1, targets[..., None])[..., 0]
        return (logp * mask).sum(1) / mask.sum(1)

    t = interleaved({"ours": lambda: ops.seq_logprob(logits, targets, mask), "eager": eager}, device, rounds)
    ours, peer = median(t["ours"]), median(t["eager"])
    table.add(f"seq_logprob {list(size['seq_shape'])} bf16", ms(t["ours"]), "ms", "eager", ms(t["eager"]),
              "<= 1x eager", ours <= peer if cuda else None)
    if cuda:
        read_once = logits.numel() * logits.element_size() / gpu_copy_bandwidth() * 2  # (a copy reads and writes)
        table.add("seq_logprob against one read of the logits", ms(t["ours"]), "ms", "read once at the copy bandwidth",
                  read_once * 1e3, "<= 2x the read", ours <= 2 * read_once)

    P, H, V = size["hidden_shape"]
    hidden = torch.randn(P, H, generator=gen).to(device, torch.bfloat16)
    weight = (torch.randn(V, H, generator=gen) / math.sqrt(H)).to(device, torch.bfloat16)
    y = torch.randint(0, V, (P,), generator=gen).to(device)
    padded_v = -(-V // 64) * 64  # (30,528: a multiple of 64; the padding's logits at -inf)
    padded = torch.cat([weight, torch.zeros(padded_v - V, H, dtype=weight.dtype, device=device)])
    bias = torch.zeros(padded_v, device=device)
    bias[V:] = -math.inf
    first = ops.token_logprob_hidden(hidden, weight, None, y).float()
    difference = float((ops.token_logprob_hidden(hidden, padded, bias, y).float() - first).abs().max())
    unpadded_cce = None
    for v, w, b in ((V, weight, None), (padded_v, padded, bias)):
        def eager_head(w=w, b=b):
            return torch.log_softmax(torch.nn.functional.linear(hidden, w, None if b is None else b.to(w.dtype)).float(),
                                     -1).gather(1, y[:, None])[:, 0]

        fns = {"ours": lambda w=w, b=b: ops.token_logprob_hidden(hidden, w, b, y), "bare": lambda w=w: hidden @ w.T,
               "eager": eager_head}
        cce = cut_cross_entropy(table, hidden, w, y) if cuda and b is None else None
        unpadded_cce = cce if b is None else unpadded_cce
        if cce:
            fns["cce"] = lambda w=w: cce(hidden, w, y, reduction="none")
        t = interleaved(fns, device, rounds)
        ours, bare = median(t["ours"]), median(t["bare"])
        name = f"token_logprob_hidden P={P} H={H} V={v} bf16"
        extra = {"max_difference_from_unpadded": difference} if b is not None else {}
        table.add(name, ms(t["ours"]), "ms", "bare h @ W.T", ms(t["bare"]), "<= 1.25x the product",
                  ours <= 1.25 * bare if cuda else None, **extra)
        table.add(f"{name}: linear + log_softmax + gather", ms(t["eager"]), "ms", "the fused op", ms(t["ours"]))
        if cce:
            table.add(f"{name}: Cut Cross-Entropy (linear_cross_entropy, no reduction)", ms(t["cce"]), "ms",
                      "the fused op", ms(t["ours"]))
    tensor_core_head(table, hidden, weight, padded, y, device, rounds, unpadded_cce)
    if cuda:
        extra = gpu_peak_extra(lambda: ops.token_logprob_hidden(hidden, weight, None, y)) - P * 4  # (less the output)
        logits_bytes = P * V * 2
        table.add("token_logprob_hidden extra memory", extra / 2**20, "MiB", "the logits", logits_bytes / 2**20,
                  "<= 5% of the logits", extra <= 0.05 * logits_bytes)


def tensor_core_head(table: Table, hidden, weight, padded, y, device: str, rounds: int, cce) -> None:
    """The tensor-core fused head (ops.token_logprob_hidden_tc) at the unpadded V, in one interleaved run beside
    the bare product at V and at the padded V, linear + log_softmax + gather, token_logprob_hidden and Cut
    Cross-Entropy (``cce``, where it runs): a row against the padded product, one against each of the others.
    A CUDA kernel: a note on the CPU."""
    if not runtime.device_plan(device).gpu:
        table.note("token_logprob_hidden_tc", "not measured: a CUDA kernel, and no GPU here")
        return
    (P, H), V, padded_v = hidden.shape, weight.shape[0], padded.shape[0]
    rows = slice(0, min(P, 2048))  # its largest difference from float32 logits, on the first rows
    exact = torch.log_softmax(torch.nn.functional.linear(hidden[rows].float(), weight.float()), -1)
    difference = float((ops.token_logprob_hidden_tc(hidden[rows], weight, None, y[rows])
                        - exact.gather(1, y[rows, None])[:, 0]).abs().max())
    del exact

    def eager():
        return torch.log_softmax(torch.nn.functional.linear(hidden, weight).float(), -1).gather(1, y[:, None])[:, 0]

    fns = {"tc": lambda: ops.token_logprob_hidden_tc(hidden, weight, None, y), "padded": lambda: hidden @ padded.T,
           "bare": lambda: hidden @ weight.T, "eager": eager, "cublas": lambda: ops.token_logprob_hidden(hidden, weight, None, y)}
    if cce:
        fns["cce"] = lambda: cce(hidden, weight, y, reduction="none")
    t = interleaved(fns, device, rounds)
    ours, bound = median(t["tc"]), median(t["padded"])
    name = f"token_logprob_hidden_tc P={P} H={H} V={V} bf16 (tensor-core fused head)"
    table.add(name, ms(t["tc"]), "ms", f"bare h @ W.T at V={padded_v} (padded)", ms(t["padded"]),
              "<= 1.25x the padded product", ours <= 1.25 * bound, max_difference_from_float32=difference)
    peers = {"cce": "Cut Cross-Entropy (linear_cross_entropy, no reduction)", "bare": f"bare h @ W.T at V={V}",
             "eager": "linear + log_softmax + gather", "cublas": "token_logprob_hidden (cuBLAS tiles)"}
    for key, peer in peers.items():
        if key in t:
            table.add(f"{name}: against {peer}", ms(t["tc"]), "ms", peer, ms(t[key]))


def cut_cross_entropy(table: Table, hidden, weight, targets):
    """``cut_cross_entropy.linear_cross_entropy`` where the package is installed and runs here, else None (a note
    says why). Its per-position loss is -log p: checked against linear + log_softmax + gather."""
    try:
        from cut_cross_entropy import linear_cross_entropy

        loss = linear_cross_entropy(hidden, weight, targets, reduction="none").float()
        reference = -torch.log_softmax((hidden @ weight.T).float(), -1).gather(1, targets[:, None])[:, 0]
        difference = float((loss - reference).abs().max())
        if difference > 0.1:
            raise ValueError(f"its loss differs from -log p by up to {difference:.3g}")
    except Exception as err:  # (absent, or its Triton kernels do not run here)
        table.note("Cut Cross-Entropy", f"not measured: {type(err).__name__}: {str(err)[:160]}")
        return None
    return linear_cross_entropy


class TrainRig:
    """The training rows' model, batches and staged bound, shared by the sections train and train04."""

    def __init__(self, size: dict, device: str, data: Data):
        from clid.data.store import RegionCache
        from clid.training.batches import StepBatches, epoch_batches

        self.size, self.device, self.data = size, device, data
        self.model = captioner(size, data.tokenizer, device, size["classes"], dropout=0.1)
        self.regions = RegionCache.for_model(data.features, self.model.config)
        n, batch = len(data.examples), size["batch"]
        self.schedule = lambda step: epoch_batches(n, batch, step, 0)
        count = size["train_steps"] + 2
        self.batches = StepBatches(data.examples, self.model, self.regions, self.schedule, range(count), seed=0)
        # every region read once (the cache is warm), each batch in pinned memory as the loader's workers hand
        # it over
        self.made = [(runtime.pin(inputs, device), *runtime.pin([places, classes, keys], device))
                     for inputs, places, classes, keys in (self.batches[i] for i in range(count))]
        staged = [runtime.to_device([*inputs, places, classes, keys], device) for inputs, places, classes, keys in self.made]
        self.staged = itertools.cycle(staged)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-5, eps=1e-6, weight_decay=0.01, fused=True)

    def bound_steps(self) -> None:
        """``train_steps`` steps of the staged bound: the batches on the device, one padded pass, bf16 autocast
        on a GPU, no host synchronisation."""
        from clid.training.loss import masked_lm_loss

        model = self.model
        model.train()
        runtime.use_precision("auto", self.device)
        for _ in range(self.size["train_steps"]):
            *inputs, places, classes, keys = next(self.staged)
            with runtime.autocast("auto", self.device):
                logits = model(*inputs, places, dropout_keys=keys)  # (keyed dropout, as 04's default)
            loss_sum, weight_sum = masked_lm_loss(logits, classes, 1012)
            self.optimizer.zero_grad(set_to_none=True)
            (loss_sum / weight_sum).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            self.optimizer.step()


def train(table: Table, size: dict, device: str, rig: TrainRig, rounds: int) -> None:
    """The training-step rows and the loader alone, each beside the staged bound."""
    from clid.data.store import FeatureStore, RegionCache
    from clid.training.flags import TrainSettings
    from clid.training.loop import Trainer

    model, steps = rig.model, size["train_steps"]
    t = interleaved({"host": lambda: rig.batches[0]}, "cpu", max(rounds, 5))
    table.add("host share: collate + region padding of one batch", ms(t["host"]), "ms")

    folder = Path(tempfile.mkdtemp(prefix="bench-train-"))
    made = itertools.cycle(rig.made)

    def trainer_steps(plan: runtime.DevicePlan):
        settings = TrainSettings(precision=plan.precision, workers=0, warmup=10, max_steps=10**6)
        trainer = Trainer(model, rig.data.examples, rig.regions, settings, folder / plan.precision, {}, plan)

        def run():
            plan.use()  # (TF32 for auto only: the rounds interleave)
            for _ in range(steps):
                trainer.train_step(next(made))
            trainer.check_finite()
        return run

    plan = runtime.device_plan(device, "auto")
    fns = {"auto": trainer_steps(plan), "bound": rig.bound_steps}
    if not plan.gpu:  # (on a GPU the rows of the code before the GPU rework would only cost time)
        before = runtime.device_plan(device, "fp32").replace(grouped_encoding=True, defer_checks=False)
        fns["before"] = trainer_steps(before)
    t = interleaved(fns, device, rounds, per_call={k: steps for k in fns})
    for key, name in (("before", "training step (Trainer.train_step), before: one pass per text length, fp32, "
                                 "host checks"),
                      ("auto", "training step, Trainer.train_step, --precision auto")):
        if key in t:
            table.add(name, ms(t[key]), "ms", "staged bound", ms(t["bound"]))
    table.add("training step, staged bound (batches on the device, padded, bf16, no sync)", ms(t["bound"]), "ms")

    # the loader alone: 04's loader workers reading the HDF5 file (a fresh region cache: nothing read before)
    settings = TrainSettings(precision="auto", warmup=10, max_steps=10**6)
    store = FeatureStore(rig.data.features_path)
    reader = Trainer(model, rig.data.examples, RegionCache.for_model(store, model.config), settings,
                     folder / "loader", {}, plan)
    count, first = size["loader_batches"], itertools.count(0, size["loader_batches"] + 1)

    def loader() -> float:
        start_step = next(first)
        it = iter(reader.batches(rig.schedule, range(start_step, start_step + count + 1)))
        next(it)  # (the workers' start-up is not the loader's rate)
        start = time.perf_counter()
        for _ in range(count):
            next(it)
        seconds = time.perf_counter() - start
        del it
        return seconds

    t = interleaved({"loader": loader, "bound": rig.bound_steps}, device, rounds, warmup=0,
                    per_call={"loader": count, "bound": steps})
    loaded, bound = rates(t["loader"], 1), rates(t["bound"], 1)
    table.add(f"loader alone: batches/s from the HDF5 file ({reader.workers} workers, no step)", loaded,
              "batches/s", "the staged bound's steps/s", bound,
              ">= 1x the bound's steps/s", median(loaded) >= median(bound) if plan.gpu else None)


def run_04(size: dict, data: Data, folder: Path, torchrun: int = 0) -> float:
    """Seconds per step of a fresh 04_train_base.py on the HDF5 file (from its train_log.jsonl), past its first
    logged steps; ``torchrun``: under torchrun with that many processes."""
    bert = folder / "bert"
    if not (bert / "config.json").exists():
        from transformers import BertConfig, BertModel

        m = size["model"]
        config = BertConfig(vocab_size=VOCAB, hidden_size=m["hidden_size"], num_hidden_layers=m["num_layers"],
                            num_attention_heads=m["num_heads"], intermediate_size=m["intermediate_size"])
        BertModel(config).save_pretrained(bert)
        data.tokenizer.save_pretrained(bert)
        write_captions(folder / "captions.json", data.texts, size["images"])
    out = Path(tempfile.mkdtemp(prefix="run-", dir=folder))
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(torchrun)] \
        if torchrun else [sys.executable]
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


def train04(table: Table, size: dict, device: str, rig: TrainRig, folder: Path, rounds: int,
            stop_after: float) -> float:
    """04 from the HDF5 file beside the staged bound (and under torchrun where several GPUs are); returns 04's
    median seconds per step."""
    cuda = runtime.device_plan(device).gpu
    gpus = torch.cuda.device_count() if cuda else 0
    fns = {"04": lambda: run_04(size, rig.data, folder), "bound": rig.bound_steps}
    if gpus > 1:
        fns["torchrun"] = lambda: run_04(size, rig.data, folder, torchrun=gpus)
    t = interleaved(fns, device, rounds, warmup=0, per_call={"bound": size["train_steps"]}, stop_after=stop_after)
    plain, bound = median(t["04"]), median(t["bound"])
    goal, goal_text = target_for(device, 1.1, 1.1, "<=")
    short = "" if len(t["04"]) >= rounds else f" (only {len(t['04'])} rounds: the budget)"
    table.add(f"training step as 04 runs it from an HDF5 file{short}", ms(t["04"]), "ms", "staged bound", ms(t["bound"]),
              goal_text and f"{goal_text.split(' (')[0]}x the bound", plain <= goal * bound if goal else None)
    if gpus > 1:
        table.add(f"training step as 04 runs it under torchrun --nproc_per_node {gpus}", ms(t["torchrun"]), "ms",
                  "04 alone", ms(t["04"]), "<= 1.05x 04 alone",
                  median(t["torchrun"]) <= 1.05 * plain)
    else:
        table.note("training step under torchrun --nproc_per_node N", f"skipped: {gpus} GPU{'s' if gpus != 1 else ''}")
    return plain


def score(table: Table, size: dict, device: str, data: Data, rounds: int, stop_after: float) -> float:
    """05's rows; returns captions/s with today's defaults (one model)."""
    from clid.data.store import RegionCache
    from clid.model.scoring import caption_logprobs, caption_logprobs_eager

    trusted = captioner(size, data.tokenizer, device, size["classes"], seed=1).eval()
    regions = RegionCache.for_model(data.features, trusted.config)
    examples = data.examples
    positions = size["regions"] + trusted.levels[-1][1]
    batch = runtime.batch_size("auto", device, runtime.encoder_bytes(trusted.config, positions, "bf16"), 64)
    # at COCO scale every level holds far more captions than a pass: one full pass per level (captions repeated)
    levels = np.asarray(examples.levels)
    per_level = {lv: np.flatnonzero(levels == lv) for lv in size["score_levels"]}
    full = examples.subset(np.concatenate([np.resize(ids, batch) for ids in per_level.values()]))
    before_set = examples.subset(np.concatenate([ids[:size["before_per_level"]] for ids in per_level.values()]))
    eager_set = examples.subset(np.arange(0, len(examples), max(1, len(examples) // size["eager_captions"])))
    outputs = {}

    plan = runtime.device_plan(device)

    def run(name, captions, head=plan.head, **options):
        def call():
            outputs[name] = caption_logprobs(trusted, captions, regions, device=plan.replace(head=head), **options)
        return call

    fns = {"auto": run("auto", full, batch_size=batch, precision="auto"),
           "before": run("before", before_set, batch_size=64, precision="fp32"),
           "eager": lambda: caption_logprobs_eager(trusted, eager_set, regions, device=device)}
    # warm-up: a whole pass of the longest level (the allocator and the attention kernels see the sizes they will
    # run: a warm-up of a few captions left the first row measured slower than the next), a pass of the others
    run("warm", examples.subset(np.resize(per_level[size["score_levels"][-1]], batch)), batch_size=batch,
        precision="auto")()
    fns["before"]()
    caption_logprobs_eager(trusted, eager_set.subset(range(2)), regions, device=device)
    t = interleaved(fns, device, rounds, warmup=0, stop_after=stop_after)
    now, before = rates(t["auto"], len(full)), rates(t["before"], len(before_set))
    authors = rates(t["eager"], len(eager_set))
    # bf16 against float32 on the captions both scored (the first of each level)
    firsts = np.concatenate([np.arange(k * batch, k * batch + min(size["before_per_level"], len(ids)))
                             for k, ids in enumerate(per_level.values())])
    auto, fp32 = outputs["auto"][firsts], outputs["before"]
    goal, goal_text = target_for(device, 250, 180)
    short = "" if len(t["auto"]) >= rounds else f" (only {len(t['auto'])} rounds: the budget)"
    table.add(f"05 prefix scoring, levels 1-7, --precision auto, a full pass of {batch} a level{short}", now,
              "captions/s", "fp32, batch 64 (before)", before, goal_text,
              median(now) >= goal if goal else None, max_logp_difference=float(np.max(np.abs(auto - fp32))),
              rank_correlation=rank_correlation(auto, fp32))
    table.add("05, the authors' eager loop (fp32)", authors, "captions/s", "--precision auto", now)

    names = {"fused": "the fused op token_logprob_hidden", "eager": "linear + log_softmax + gather"}
    default = plan.head
    other = "fused" if default == "eager" else "eager"
    one_pass = examples.subset(np.resize(per_level[size["score_levels"][0]], batch))
    t = interleaved({head: run(head, one_pass, batch_size=batch, precision="auto", head=head)
                     for head in (default, other)}, device, rounds, stop_after=stop_after / 4)
    table.add(f"05 head, one level-{size['score_levels'][0]} pass of {batch}: {names[other]}",
              rates(t[other], batch), "captions/s", f"{names[default]} (the default)", rates(t[default], batch))
    return median(now)


def rank_correlation(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def caption(table: Table, size: dict, device: str, data: Data, rounds: int) -> None:
    from clid.caption import CaptionWriter, MemoryRegions
    from clid.data.store import Regions

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

    steps = size["decode_steps"]
    before = CaptionWriter(model, device=device, batch_size=64, precision="fp32", steps=steps)
    now = CaptionWriter(model, device=device, batch_size="auto", precision="auto", steps=steps)
    goal, goal_text = target_for(device, 150, 100)
    for level in size["caption_levels"]:
        batch = now.decode_batch_size(regions(1), ["0"], [level])
        old_source, new_source = regions(size["caption_images"]), regions(max(size["caption_images"], batch))

        def decode(writer, source, precision, level=level):
            def call():
                runtime.use_precision(precision, device)
                writer.decode(list(source.regions), [level], features=source)
            return call

        t = interleaved({"before": decode(before, old_source, "fp32"), "now": decode(now, new_source, "auto")},
                        device, rounds)
        old, new = rates(t["before"], len(old_source.regions)), rates(t["now"], len(new_source.regions))
        table.add(f"caption decoding, labert, L{level}, --precision auto, --batch-size auto ({batch})", new,
                  "captions/s", "fp32, batch 64 (before)", old,
                  goal_text if level == 7 else "", (median(new) >= goal if goal else None) if level == 7 else None)


def paraphrase(table: Table, size: dict, device: str, rounds: int) -> float:
    """03's beam search on its two engines, the same ids; returns pieces/s of the faster one."""
    from transformers import PegasusConfig, PegasusForConditionalGeneration

    from clid.selfgen import ct2_pegasus
    from clid.selfgen import paraphrase as paraphrasers

    config = PegasusConfig(max_position_embeddings=128, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
                           forced_eos_token_id=None, **size["pegasus"])
    torch.manual_seed(0)
    with torch.device(device):  # (initialised where it runs: pegasus-large's 570M weights)
        model = PegasusForConditionalGeneration(config).eval()
    precision = runtime.use_precision("auto", device)
    beams, new = size["beams"], size["new_tokens"]
    per_piece = paraphrasers.bytes_per_piece(config, beams, size["piece_tokens"] + new, precision)
    batch = runtime.batch_size("auto", device, per_piece, paraphrasers.BATCH_SIZE, most=256)
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(2, config.vocab_size, (batch, size["piece_tokens"]), generator=gen)
    ids[:, -1] = config.eos_token_id
    outputs: dict[str, list] = {}
    fns = {}
    why_not = ct2_pegasus.available(device)
    if why_not is None:
        try:
            folder = Path(tempfile.mkdtemp(prefix="bench-ct2-"))
            converted = ct2_pegasus.model_spec(model)
            converted.validate()
            converted.optimize(quantization=None)
            converted.save(str(folder))
            translator = ct2_pegasus.Translator(folder, device, precision, torch.get_num_threads())
            settings = copy.deepcopy(model.generation_config)
            settings.min_length = new + 1  # (the start token counts: exactly ``new`` tokens, as generate() below)
            translator.generate(ids[:2].tolist(), beams, new + 1, settings, 2)

            def ct2():
                outputs["ctranslate2"] = translator.generate(ids.tolist(), beams, new + 1, settings, batch)
            fns["ctranslate2"] = ct2
        except Exception as err:  # (CTranslate2 loads, but cannot run here: said, and transformers measured alone)
            why_not = f"{type(err).__name__}: {str(err)[:200]}"
    if why_not is not None:
        table.note("03 Pegasus on CTranslate2", f"skipped: {why_not}")
    model = model.to(device, torch.bfloat16 if precision == "bf16" else torch.float32)
    on_device = ids.to(device)
    cuda = runtime.device_plan(device).gpu
    # 03's transformers path: the cross-attention cache left in place, on a GPU the output layer padded to a
    # multiple of 64 (there the plain model beside it)
    padded = paraphrasers.reorder_self_attention_only(paraphrasers.pad_vocabulary(copy.deepcopy(model)) if cuda else model)

    def transformers(which, m):
        def call():
            with torch.no_grad():
                out = m.generate(input_ids=on_device, attention_mask=torch.ones_like(on_device), num_beams=beams,
                                 max_new_tokens=new, min_new_tokens=new, num_return_sequences=1)
            outputs[which] = [row[1:].tolist() for row in out.cpu()]
        return call
    fns["transformers"] = transformers("transformers", padded)
    if cuda:
        fns["unpadded"] = transformers("unpadded", model)
    t = interleaved(fns, device, rounds)
    goal, goal_text = target_for(device, 300, 200)
    hf = rates(t["transformers"], batch)
    name = f"03 Pegasus, {beams} beams, {new} new tokens, {precision}, batch {batch}"

    def alike(a, b):
        return sum(x == y for x, y in zip(outputs[a], outputs[b]))
    if cuda:
        v = padded.config.vocab_size
        table.add(f"{name}: transformers, the output layer padded to {v:,}, the cross-attention cache in place",
                  hf, "pieces/s", f"the plain model ({config.vocab_size:,}, every cache reordered)", rates(t["unpadded"], batch),
                  same_beams=alike("transformers", "unpadded"), pieces=batch)
    if "ctranslate2" not in t:
        table.add(f"{name}: transformers (as 03 runs it)", hf, "pieces/s", "", None, goal_text,
                  median(hf) >= goal if goal else None)
        return median(hf)
    ct = rates(t["ctranslate2"], batch)
    same = alike("ctranslate2", "transformers")
    table.add(f"{name}: CTranslate2", ct, "pieces/s", "transformers' generate() (as 03 runs it)", hf,
              goal_text, median(ct) >= goal if goal else None, same_beams=same, pieces=batch)
    table.add(f"{name}: transformers (as 03 runs it)", hf, "pieces/s", "CTranslate2", ct)
    print(f"  the best beams alike on both engines: {same} of {batch} pieces (random weights; bf16 on a GPU)")
    return max(median(ct), median(hf))


# ---------------------------------------------------------------------------------------------


def recipe_hours(table: Table, step_04: float | None, score_rate: float | None, paraphrase_rate: float | None) -> None:
    """The COCO recipe's GPU-hours as two sums: 04 + 06 at 300,000 steps (a fixed cost), and 03 (a piece a
    caption) + 05 (both models) per million self-generated captions."""
    fixed = RECIPE_STEPS * step_04 / 3600 if step_04 else None
    parts = {"03": MILLION / paraphrase_rate / 3600 if paraphrase_rate else None,
             "05": 2 * MILLION / score_rate / 3600 if score_rate else None}

    def h(v):
        return f"{v:.2f} h" if v is not None else "not measured"
    per_million = sum(v for v in parts.values() if v is not None) if any(parts.values()) else None
    print("\nThe COCO recipe's GPU-hours (medians above):")
    print(f"  fixed: 04 + 06, {RECIPE_STEPS:,} steps at 04's step from HDF5: {h(fixed)}")
    print(f"  per million self-generated captions: 03 (a piece each, the faster engine) {h(parts['03'])} + "
          f"05 (both models) {h(parts['05'])} = {h(per_million)}")
    if fixed is not None and per_million is not None and all(v is not None for v in parts.values()):
        print(f"  one million captions in all: {h(fixed + per_million)}")
    table.rows.append({"path": "recipe GPU-hours", "04+06 fixed": fixed, **parts, "per million": per_million})


def stopped(signum, frame):
    """SIGTERM (a time limit): stop the section measured now; main's finally prints what was measured."""
    raise SystemExit(f"error: stopped by signal {signal.Signals(signum).name} after the rows above")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    p.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU, the GPU-only rows skipped (the tests)")
    p.add_argument("--device", default=None, help="the device measured (default: cuda; cpu with --smoke)")
    p.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS),
                   help="the parts of the table to measure, in this order; each keeps its bound or peer")
    p.add_argument("--repeats", type=positive_int, default=5, help="interleaved rounds of every row and its peer")
    p.add_argument("--budget", type=float, default=460,
                   help="seconds: a section that would start later is skipped, and 05 and 04 run fewer rounds "
                        "(at least two) rather than overrun")
    p.add_argument("--json", default=None, help="also write the rows to this file")
    args = p.parse_args(argv)
    device = args.device or ("cpu" if args.smoke else "cuda")
    if runtime.device_plan(device).gpu and not torch.cuda.is_available():
        p.error("no GPU here: give --smoke (tiny sizes on the CPU) or --device cpu")
    if args.budget <= 0:
        p.error(f"--budget must be a positive number of seconds, not {args.budget:g}")
    size = SMOKE if args.smoke else FULL
    if args.smoke:
        torch.set_num_threads(1)  # (tiny matrices: more threads only wait for each other)
    started = time.time()
    name = torch.cuda.get_device_name() if runtime.device_plan(device).gpu else "CPU"
    print(f"{time.strftime('%Y-%m-%d %H:%M')}: {name}, torch {torch.__version__}, {ops.build_info()}, "
          f"{args.repeats} interleaved rounds a row")
    table = Table(device, args.json)
    step_04 = score_rate = paraphrase_rate = None
    rig, failed = None, []
    signal.signal(signal.SIGTERM, stopped)  # (a time limit: the GPU-hours of the rows measured are still printed)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            data = Data(folder, size) if set(args.sections) & {"train", "train04", "score", "caption"} else None
            for k, section in enumerate(args.sections):
                left = args.budget - (time.time() - started)
                if left <= 0:
                    print(f"== {section}: skipped, past the budget of {args.budget:g} s")
                    continue
                # 04's and 05's rounds stop within their share of what is left (they take the longest)
                share = left * WEIGHT[section] / sum(WEIGHT[s] for s in args.sections[k:])
                print(f"== {section} (at {time.time() - started:.0f} s)", flush=True)
                try:  # (a section that fails is reported; the others still run)
                    with torch.inference_mode(False):
                        if section in ("train", "train04") and rig is None:
                            rig = TrainRig(size, device, data)
                        if section == "kernels":
                            kernels(table, size, device, args.repeats)
                        elif section == "train":
                            train(table, size, device, rig, args.repeats)
                        elif section == "train04":
                            step_04 = train04(table, size, device, rig, folder, args.repeats, share)
                        elif section == "score":
                            score_rate = score(table, size, device, data, args.repeats, share)
                        elif section == "caption":
                            caption(table, size, device, data, args.repeats)
                        elif section == "paraphrase":
                            paraphrase_rate = paraphrase(table, size, device, args.repeats)
                except Exception:
                    traceback.print_exc()
                    failed.append(section)
                    table.note(f"section {section}", "failed (the traceback above)")
    finally:
        recipe_hours(table, step_04, score_rate, paraphrase_rate)
        table.write()
    print(f"done in {time.time() - started:.0f} s")
    if failed:
        raise SystemExit(f"error: the sections {', '.join(failed)} failed")


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        run_main(main)
