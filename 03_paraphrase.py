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
and the final punctuation. ``--model sentences`` does the same and rewrites each walk as clauses with
finite verbs, the fluency Pegasus adds ("a woman wearing a dress and on the snow" -> "a woman is wearing a
dress and is on the snow"; bare objects: "there is ..."): the quick checkpoint's paraphraser.
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import Counter

from clid.base import files
from clid.base.text import caption_lengths, karpathy_tokens, length_to_level, load_tokenizer
from clid.data.records import report_wordless
from clid.data.stats import format_table, length_stats
from clid.run import runs, runtime, shard
from clid.run.cli import (
    HelpFormatter,
    add_download_arg,
    add_levels_arg,
    add_tokenizer_arg,
    non_negative_float,
    positive_int,
    run_main,
)
from clid.selfgen.paraphrase import (
    BATCH_SIZE,
    DEFAULT_MODEL,
    ENGINES,
    ModelParaphraser,
    choose_engine,
    paraphrase_captions,
    rules_paraphrase,
    sentences_paraphrase,
)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=HelpFormatter)
    io = parser.add_argument_group("input and output", "the self-generated captions in and their paraphrases out")
    model = parser.add_argument_group("paraphraser", "the model and how it rewrites each caption")
    run = parser.add_argument_group("run", "batches, devices, precision, shards and resuming")
    io.add_argument("--in", dest="inp", required=True, help="self-generated captions (JSONL of 02)")
    io.add_argument("--out", required=True, help="output JSONL")
    model.add_argument("--model", default=DEFAULT_MODEL,
                       help="'rules' (offline: tidies the walks' text, no rewording), 'sentences' (offline: the same, each "
                            "walk rewritten as clauses with verbs), or a seq2seq model folder or hub "
                            "name (the paper: Pegasus; a hub name needs --allow-download or a copy in the hub cache)")
    add_download_arg(model)
    model.add_argument("--num-beams", type=positive_int, default=10, help="beam width")
    model.add_argument("--engine", choices=ENGINES, default="auto",
                       help="the beam search: transformers' generate(), or CTranslate2's (Pegasus, converted once into a "
                            "folder beside the model); auto: the faster here, ctranslate2 on the CPU where it is installed, "
                            "transformers on a GPU")
    runtime.add_batch_size_arg(run, BATCH_SIZE, "pieces per generate() call")
    runtime.add_precision_arg(run)
    model.add_argument("--max-length", type=positive_int, default=60, help="model tokens read and written per piece")
    model.add_argument("--piece-tokens", type=positive_int, default=50,
                       help="split captions into pieces of at most this many model tokens")
    model.add_argument("--min-ratio", type=non_negative_float, default=0.5,
                       help="reject paraphrases shorter than this share of the original")
    add_levels_arg(io, "length levels for 'level' (paragraph: sentence breaks count as tokens)")
    shard.add_chunk_size_arg(run, 2000, "captions")
    add_tokenizer_arg(io, "length tokenizer folder")
    runtime.add_device_arg(run)
    shard.add_shard_args(run)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.model not in RULES:  # what --precision auto means on this device (recorded: it changes the paraphrases)
        plan = runtime.device_plan(args.device, args.precision)
        args.device, args.precision = str(plan.device), plan.use()
        args.engine = choose_engine(args.engine, args.device)  # (recorded: the engines' beams can differ)
    record = runs.run_record(args, inputs=("inp", "tokenizer"), settings=(
        "model", "num_beams", "max_length", "piece_tokens", "min_ratio", "levels", "tokenizer")
        + (("precision", "engine") if args.model not in RULES else ()))
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
    records = list(files.read_jsonl(path, required=("id", "image_id", "caption")))
    by_id = {}
    for number, r in enumerate(records, 1):
        if str(r["id"]) in by_id:
            sys.exit(f"error: {path}: line {number}: id {r['id']} appears twice")
        by_id[str(r["id"])] = r
    wordless = {i for i, r in by_id.items() if not karpathy_tokens(r["caption"])}
    report_wordless(path, [f"caption {i}" for i in by_id if i in wordless])  # counted and left out
    return {i: r for i, r in by_id.items() if i not in wordless}


RULES = {"rules": rules_paraphrase, "sentences": sentences_paraphrase}  # the offline paraphrasers by --model name


def make_paraphraser(args, tokenizer, counts: Counter):
    """(name, function from captions to paraphrases) for ``--model``."""
    if args.model in RULES:
        rewrite = RULES[args.model]
        return args.model, lambda captions: [rewrite(c) for c in captions]
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
