"""Stage 03: paraphrase the self-generated captions (CLID step 3).

In:  the JSONL of stage 02.
Out: the same JSONL with ``caption`` paraphrased, the original kept as ``raw_caption``, the
     paraphraser named in ``paraphraser``, and ``n_tokens`` / ``level`` recomputed.

    python 03_paraphrase.py --in selfgen.jsonl --out paraphrased.jsonl                 # Pegasus, as the paper
    python 03_paraphrase.py --in selfgen.jsonl --out paraphrased.jsonl --model rules   # offline rules

``--model NAME_OR_PATH`` (default ``tuner007/pegasus_paraphrase``, the paper's) loads a seq2seq
paraphraser with transformers and decodes with beam search, in batches, on the GPU when there is
one. It never sees the image. Pegasus reads about 60 tokens while long captions are the point, so
each caption is split at sentence breaks and then at "and" into pieces that fit; the pieces are
paraphrased and joined again. A piece's paraphrase is rejected, and the piece kept as it was,
when it loses one of the piece's object nouns or shrinks below ``--min-ratio`` (half) of its
token length; rejections are counted.

``--model rules`` is a deterministic rule-based paraphraser that works offline: it groups
repeated objects ("a dog and a dog" -> "two dogs", up to ten), merges repeated predicates
("wearing a hat and wearing a shirt" -> "wearing a hat and a shirt"), fixes articles, "and and"
and the final punctuation.
"""
from __future__ import annotations

import argparse
import re
import sys
import time
from collections import Counter
from typing import Callable

from clid.base import files
from clid.run import runs, runtime, shard
from clid.run.cli import HelpFormatter, add_download_arg, non_negative_float, positive_int, run_main
from clid.data.records import report_wordless
from clid.base.files import DataError
from clid.method import english as en
from clid.method.paraphrase import head_nouns, lemma, rules_paraphrase, sentences_of
from clid.data.stats import format_table, length_stats
from clid.base.text import caption_lengths, karpathy_tokens, length_to_level, load_tokenizer

DEFAULT_MODEL = "tuner007/pegasus_paraphrase"
BATCH_SIZE = 32  # pieces per generate() call on the CPU (--batch-size auto)

# ---------------------------------------------------------------------------------------------
# Splitting long captions for a model that reads ~60 tokens, and joining them again

def split_caption(caption: str, count_tokens: Callable[[list[str]], list[int]], budget: int) -> list[list[str]]:
    """Sentences, each a list of pieces: "and"-joined runs of the sentence packed greedily while
    the piece stays within ``budget`` model tokens."""
    out = []
    for sentence in sentences_of(caption):
        segments = [s.strip() for s in re.split(r"\band\b", sentence) if s.strip()]
        pieces = [segments[0]]
        for seg in segments[1:]:
            candidate = f"{pieces[-1]} and {seg}"
            if count_tokens([candidate])[0] <= budget:
                pieces[-1] = candidate
            else:
                pieces.append(seg)
        out.append(pieces)
    return out


def join_caption(sentences: list[list[str]]) -> str:
    """Pieces back into one caption: pieces joined with "and", sentences with periods."""
    out = []
    for pieces in sentences:
        parts = []
        for n, piece in enumerate(pieces):
            piece = piece.strip().rstrip(".!?, ").strip()
            if n and piece[:1].isupper() and not piece.startswith("I "):
                piece = piece[0].lower() + piece[1:]
            if piece:
                parts.append(piece)
        out.append(en.finish_sentence(" and ".join(parts)))
    return " ".join(s for s in out if s)


def check_paraphrase(original: str, paraphrase: str, tokenizer, min_ratio: float) -> str | None:
    """Why a paraphrase is rejected, or None: it lost an object noun, or it is too short."""
    have = {lemma(w) for w in karpathy_tokens(paraphrase)}
    lost = [n for n in dict.fromkeys(head_nouns(original)) if lemma(n) not in have]
    if lost:
        return "lost noun"
    before, after = caption_lengths([original, paraphrase], tokenizer)
    if after < min_ratio * before:
        return "too short"
    return None


def bytes_per_piece(config, num_beams: int, max_length: int, precision: str) -> float:
    """GPU memory of one piece's beam search: its beams' keys and values (self- and cross-attention) in every
    decoder layer, twice over for what generate() keeps beside them."""
    layers, width = getattr(config, "decoder_layers", 12), getattr(config, "d_model", 1024)
    return 2 * num_beams * layers * 4 * max_length * width * (2 if precision == "bf16" else 4)


ENGINES = ("auto", "transformers", "ctranslate2")


def choose_engine(engine: str, device: str) -> str:
    """``auto``: CTranslate2 where it is installed and runs on ``device`` (its beam search is faster, see
    bench/bench_gpu.py), else transformers; a named engine that cannot run here is an error."""
    from clid.method import ct2_pegasus

    why_not = ct2_pegasus.available(device) if engine != "transformers" else None
    if engine == "auto":
        return "transformers" if why_not else "ctranslate2"
    if engine == "ctranslate2" and why_not:
        raise SystemExit(f"error: --engine ctranslate2: {why_not} (docs/gpu.md); use --engine transformers")
    return engine


def pad_vocabulary(model, multiple: int = 64):
    """The output layer padded to a multiple of ``multiple`` ids (so that its product runs on the GPU's fast
    kernels: 96,103 rows ran on an sm75 one), the padding's logits at -inf through ``final_logits_bias``: no
    padded id is ever chosen and the real ids' scores are unchanged. Models without that bias are left as
    they are."""
    import torch

    real = model.config.vocab_size
    bias = getattr(model, "final_logits_bias", None)
    if real % multiple == 0 or bias is None:
        return model
    model.resize_token_embeddings(real, pad_to_multiple_of=multiple, mean_resizing=False)
    with torch.no_grad():
        model.final_logits_bias.data = model.final_logits_bias.data.to(bias.dtype)
        model.final_logits_bias[:, real:] = float("-inf")
    return model


def reorder_self_attention_only(model):
    """Beam search reorders only the decoder's self-attention cache: the cross-attention cache holds the encoder's
    keys and values, the same for every beam of a piece, and beams move only among their piece's rows, so its
    reorder (a copy of it each step) changes nothing. transformers asks a model's ``_reorder_cache`` first."""
    def reorder(cache, beam_idx):
        if getattr(cache, "self_attention_cache", None) is None:  # (another cache: reordered whole)
            cache.reorder_cache(beam_idx)
            return cache
        cache.self_attention_cache.reorder_cache(beam_idx)
        model.cache_reorders = getattr(model, "cache_reorders", 0) + 1
        return cache
    model._reorder_cache = reorder
    return model


class ModelParaphraser:
    """A transformers seq2seq paraphraser (Pegasus and the like), beam search, batched.

    ``engine`` "transformers" runs transformers' ``generate``, the cross-attention cache left in place
    (:func:`reorder_self_attention_only`), on a GPU with the output layer padded to a multiple of 64
    (:func:`pad_vocabulary`); "ctranslate2" the same checkpoint converted into CTranslate2 (clid.method.ct2_pegasus: Pegasus only), with the same tokenizer and ids.
    ``precision`` "bf16" holds the model in bfloat16 (Pegasus was trained in it); ``batch_size`` "auto"
    (clid.run.runtime): 32 on the CPU, on a GPU as many pieces as half its free memory holds for their beams'
    caches, at most 256."""

    def __init__(self, name: str, device: str, num_beams: int, batch_size, max_length: int, precision: str = "fp32",
                 engine: str = "transformers"):
        import torch
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        from clid.method import ct2_pegasus

        hf_logging.set_verbosity_error()
        self.name, self.device, self.num_beams, self.engine = name, device, num_beams, engine
        self.model = None
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(name)
            if engine == "ctranslate2":
                load = lambda: AutoModelForSeq2SeqLM.from_pretrained(name).eval()  # noqa: E731 (on the CPU)
                path = ct2_pegasus.converted(name, load)
                from transformers import AutoConfig, GenerationConfig

                self.config = AutoConfig.from_pretrained(name)
                try:
                    self.generation_config = GenerationConfig.from_pretrained(name)
                except OSError:  # (none saved: the model config's defaults, as transformers does)
                    self.generation_config = GenerationConfig.from_model_config(self.config)
                self.translator = ct2_pegasus.Translator(path, device, precision, torch.get_num_threads())
            else:
                self.model = AutoModelForSeq2SeqLM.from_pretrained(name).to(device).eval()
                self.config = self.model.config
                reorder_self_attention_only(self.model)
                if runtime.device_plan(device).gpu:  # (on the CPU the padding would only cost time)
                    pad_vocabulary(self.model)
        except Exception as err:  # OSError (not found), ValueError / ImportError (cannot convert)
            from clid.base.hub import is_local, load_problem

            detail = load_problem(name, err)
            if ("protobuf" in str(err) or "tiktoken" in str(err)) and "folder" not in detail:
                detail = "its sentencepiece tokenizer needs the 'protobuf' package to load"
            hub = DEFAULT_MODEL if is_local(name) else name
            raise SystemExit(
                f"error: the paraphraser '{name}' cannot be loaded: {detail}. Use --model rules, or download it once "
                f"with --allow-download (its source: {hub} on the Hugging Face hub; where there is internet: "
                f"huggingface-cli download {hub} --local-dir DIR, then --model DIR).") from None
        if precision == "bf16" and self.model is not None:
            self.model = self.model.to(torch.bfloat16)
        self.max_length = min(max_length, getattr(self.tokenizer, "model_max_length", max_length) or max_length)
        per_piece = bytes_per_piece(self.config, num_beams, self.max_length, precision)
        self.batch_size = runtime.batch_size(batch_size, device, per_piece, BATCH_SIZE, most=256)
        self.torch = torch
        self.calls = 0  # generate() calls, for the log

    def count_tokens(self, texts: list[str]) -> list[int]:
        return [len(ids) for ids in self.tokenizer(texts)["input_ids"]]

    def generate(self, texts: list[str]) -> list[str]:
        """One batch's best beams, decoded."""
        if self.engine == "ctranslate2":
            ids = self.tokenizer(texts, truncation=True, max_length=self.max_length)["input_ids"]
            generated = self.translator.generate(ids, self.num_beams, self.max_length, self.generation_config,
                                                 self.batch_size)
        else:
            batch = self.tokenizer(texts, return_tensors="pt", padding=True, truncation=True,
                                   max_length=self.max_length).to(self.device)
            with self.torch.no_grad():
                generated = self.model.generate(**batch, num_beams=self.num_beams, num_return_sequences=1,
                                                max_length=self.max_length)
        return [text.strip() for text in self.tokenizer.batch_decode(generated, skip_special_tokens=True)]

    def __call__(self, pieces: list[str]) -> list[str]:
        """Paraphrase pieces in batches (sorted by length to limit padding), in the input order."""
        order = sorted(range(len(pieces)), key=lambda i: len(pieces[i]))
        out = [""] * len(pieces)
        for start in range(0, len(order), self.batch_size):
            idx = order[start:start + self.batch_size]
            self.calls += 1
            for i, text in zip(idx, self.generate([pieces[i] for i in idx])):
                out[i] = text
        return out


def paraphrase_captions(captions: list[str], model: ModelParaphraser, tokenizer, budget: int,
                        min_ratio: float, counts: Counter) -> list[str]:
    """Split, paraphrase all pieces at once, check each piece, join again."""
    split = [split_caption(c, model.count_tokens, budget) for c in captions]
    pieces = [p for sentences in split for pieces in sentences for p in pieces]
    fits = [n <= model.max_length for n in model.count_tokens(pieces)] if pieces else []
    todo = [p for p, ok in zip(pieces, fits) if ok]
    done = iter(model(todo)) if todo else iter(())
    results = iter([next(done) if ok else None for ok in fits])
    out = []
    for sentences in split:
        joined, rejected = [], 0
        for piece_list in sentences:
            new = []
            for piece in piece_list:
                candidate = next(results)
                counts["pieces"] += 1
                reason = "too long for the model" if candidate is None else \
                    check_paraphrase(piece, candidate, tokenizer, min_ratio)
                if reason:
                    counts[f"piece kept: {reason}"] += 1
                    rejected += 1
                    new.append(piece)
                else:
                    new.append(candidate)
            joined.append(new)
        counts["captions with a kept piece" if rejected else "captions fully paraphrased"] += 1
        out.append(join_caption(joined))
    return out


# ---------------------------------------------------------------------------------------------

def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=HelpFormatter)
    io = parser.add_argument_group("input and output", "the self-generated captions in and their paraphrases out")
    model = parser.add_argument_group("paraphraser", "the model and how it rewrites each caption")
    run = parser.add_argument_group("run", "batches, devices, precision, shards and resuming")
    io.add_argument("--in", dest="inp", required=True, help="self-generated captions (JSONL of 02)")
    io.add_argument("--out", required=True, help="output JSONL")
    model.add_argument("--model", default=DEFAULT_MODEL,
                       help="'rules' (offline: tidies the walks' text, no rewording), or a seq2seq model folder or hub "
                            "name (the paper: Pegasus; a hub name needs --allow-download or a copy in the hub cache)")
    add_download_arg(model)
    model.add_argument("--num-beams", type=positive_int, default=10, help="beam width")
    model.add_argument("--engine", choices=ENGINES, default="auto",
                       help="the beam search: transformers' generate(), or CTranslate2's (Pegasus, converted once into a "
                            "folder beside the model; faster); auto: ctranslate2 where it is installed and runs here")
    runtime.add_batch_size_arg(run, BATCH_SIZE, "pieces per generate() call")
    runtime.add_precision_arg(run)
    model.add_argument("--max-length", type=positive_int, default=60, help="model tokens read and written per piece")
    model.add_argument("--piece-tokens", type=positive_int, default=50,
                       help="split captions into pieces of at most this many model tokens")
    model.add_argument("--min-ratio", type=non_negative_float, default=0.5,
                       help="reject paraphrases shorter than this share of the original")
    io.add_argument("--levels", default="caption", choices=["caption", "paragraph", "labert"],
                    help="length levels for 'level' (paragraph: sentence breaks count as tokens)")
    run.add_argument("--chunk-size", type=positive_int, default=2000, help="captions per resumable chunk")
    io.add_argument("--tokenizer", default=None, help="length tokenizer folder (default: offline bert-base-uncased)")
    runtime.add_device_arg(run)
    shard.add_shard_args(run)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.model != "rules":  # what --precision auto means on this device (recorded: it changes the paraphrases)
        plan = runtime.device_plan(args.device, args.precision)
        args.device, args.precision = str(plan.device), plan.use()
        args.engine = choose_engine(args.engine, args.device)  # (recorded: the engines' beams can differ)
    record = runs.run_record(args, inputs=("inp", "tokenizer"), settings=(
        "model", "num_beams", "max_length", "piece_tokens", "min_ratio", "levels", "tokenizer")
        + (("precision", "engine") if args.model != "rules" else ()))
    job = shard.Job(args.out, shard.Shard.from_args(args), args.chunk_size, record, args.restart, (".jsonl",))
    if job.done:
        print(f"{job.written()} already exists; nothing to do")
        return 0
    started = time.time()
    by_id = read_captions(args.inp)
    tokenizer = load_tokenizer(args.tokenizer)
    keep_sentences = args.levels == "paragraph"
    counts: Counter = Counter()
    name, paraphrase = make_paraphraser(args, tokenizer, counts)

    def process(chunk):  # paraphrase, then recount each caption's length and level
        batch = [by_id[i] for i in chunk.items]
        raw = [r["caption"] for r in batch]
        new = paraphrase(raw)
        lengths = caption_lengths(new, tokenizer, keep_sentences)
        out_records = []
        for r, original, caption, n in zip(batch, raw, new, lengths):
            out_records.append({**r, "caption": caption, "raw_caption": original, "paraphraser": name,
                                "n_tokens": n, "level": length_to_level(n, args.levels)})
            counts["changed" if caption != original else "unchanged"] += 1
        files.write_jsonl(chunk.path, out_records)

    run_started = time.time()
    final = job.run(list(by_id), process, f"paraphrase ({name})", "caption")
    run_time = time.time() - run_started
    todo = len(job.spec.select(list(by_id))) - job.done_before
    print(f"{todo} captions paraphrased by {name} in {run_time:.1f}s ({todo / max(run_time, 1e-9):.0f} captions/s): "
          + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    lengths = [r["n_tokens"] for r in files.read_jsonl(job.written())]
    print(format_table(length_stats(lengths, args.levels), f"{job.written()} ({args.levels} levels)"))
    if final is None:
        print(f"shard {job.spec.shard_id} done; the output appears when all {job.spec.num_shards} shards are done")
    print(f"done in {time.time() - started:.1f}s")
    return 0


def read_captions(path) -> dict[str, dict]:
    """The captions of stage 02 by caption id; a repeated id is an error."""
    try:
        records = list(files.read_jsonl(path, required=("id", "image_id", "caption")))
    except (DataError, FileNotFoundError) as err:
        sys.exit(f"error: {err}")
    by_id = {}
    for number, r in enumerate(records, 1):
        if str(r["id"]) in by_id:
            sys.exit(f"error: {path}: line {number}: id {r['id']} appears twice")
        by_id[str(r["id"])] = r
    wordless = {i for i, r in by_id.items() if not karpathy_tokens(r["caption"])}
    report_wordless(path, [f"caption {i}" for i in by_id if i in wordless])  # counted and left out
    return {i: r for i, r in by_id.items() if i not in wordless}


def make_paraphraser(args, tokenizer, counts: Counter):
    """(name, function from captions to paraphrases) for ``--model``."""
    if args.model == "rules":
        return "rules", lambda captions: [rules_paraphrase(c) for c in captions]
    plan = runtime.device_plan(args.device, args.precision)
    device = str(plan.device)
    model = ModelParaphraser(args.model, device, args.num_beams, args.batch_size, args.max_length, args.precision,
                             args.engine)
    print(f"beam search: {args.engine}")
    if args.batch_size == "auto" and plan.batch_by_memory:
        print(f"--batch-size auto: {model.batch_size} pieces a batch")
    return args.model.rstrip("/"), lambda captions: paraphrase_captions(
        captions, model, tokenizer, args.piece_tokens, args.min_ratio, counts)

if __name__ == "__main__":
    sys.exit(run_main(main))
