"""The paraphrasers of stage 03 (CLID step 3): the offline rule-based one (``--model rules``), and a
seq2seq model's (:class:`ModelParaphraser`, Pegasus as the paper) with the noun-phrase rules that check
its paraphrases.

The model reads about 60 tokens while long captions are the point, so :func:`paraphrase_captions` splits
each caption at sentence breaks and then at "and" into pieces that fit, paraphrases the pieces and joins
them again; a piece's paraphrase that loses an object noun or shrinks below ``min_ratio`` of its length is
rejected (:func:`check_paraphrase`) and the piece kept as it was.

The rules paraphraser groups repeated objects ("a dog and a dog" -> "two dogs", "a dog and a dog on
the grass" -> "two dogs on the grass", up to ten), merges repeated predicates ("wearing a hat and wearing
a shirt" -> "wearing a hat and a shirt"), fixes articles, "and and" and the final punctuation. It does
not reword: no synonyms, no reordering, no relative clauses; a repeat that is not adjacent ("a man on the
snow and a man") or not the same phrase ("a man and a tall man") stays as written. The sentence paraphraser
(``--model sentences``, :func:`sentences_paraphrase`) also rewrites each walk as clauses with finite verbs.
"""
from __future__ import annotations

import re
from collections import Counter
from typing import Callable

from clid.base import english as en
from clid.base.files import DataError
from clid.base.text import caption_lengths, karpathy_tokens
from clid.run import runtime

# ---------------------------------------------------------------------------------------------
# Noun phrases, as far as rules can find them

ARTICLES = {"a", "an"}
DETERMINERS = ARTICLES | {"the"} | set(en.NUMBER_WORDS.values())
PREPOSITIONS = {"on", "in", "at", "of", "with", "near", "behind", "under", "above", "beside", "besides", "by",
                "next", "along", "across", "over", "inside", "outside", "against", "beneath", "below", "between",
                "from", "into", "onto", "to", "around", "for", "atop", "underneath", "within", "without",
                "through", "toward", "towards", "beyond", "past", "among", "up", "down", "off", "out", "like",
                "as", "top", "front", "and", "or", "while", "is", "are", "has", "have", "that", "which", "who"}
ING_NOUNS = en.ING_NOUNS


def is_predicate_word(words: list[str], i: int) -> bool:
    """True where a noun phrase ends: a preposition, a determiner, or a verb form (-ing, -ed)
    that follows a noun rather than an article or another adjective ("a man riding", "a standing man")."""
    w = words[i]
    if w in PREPOSITIONS or w in DETERMINERS:
        return True
    if w.endswith(("ing", "ed")) and w not in ING_NOUNS and len(w) > 4:
        before = words[i - 1] if i else ""
        return not (before in DETERMINERS or before in en.SIZE_WORDS or before in en.COLOUR_WORDS
                    or before.endswith(("ing", "ed")))
    return False


def noun_phrase_end(words: list[str], start: int) -> int:
    """Index after the noun phrase that starts with the determiner at ``start``."""
    j = start + 1
    while j < len(words) and not is_predicate_word(words, j):
        j += 1
    return j


def head_nouns(text: str) -> list[str]:
    """The head noun (last word) of each noun phrase: each maximal run of words between
    determiners, prepositions and verbs, e.g. "a man riding a brown horse next to trees" ->
    ["man", "horse", "trees"]."""
    words = karpathy_tokens(text)
    nouns, run = [], []
    for i in range(len(words) + 1):
        if i == len(words) or is_predicate_word(words, i):
            if run:
                nouns.append(run[-1])
            run = []
        else:
            run.append(words[i])
    return nouns


def lemma(word: str) -> str:
    return en.singularize(word) if en.is_plural(word) else word


# ---------------------------------------------------------------------------------------------
# The rule-based paraphraser

_SENTENCE = re.compile(r"(?<=[.!?])\s+")


def sentences_of(text: str) -> list[str]:
    return [s for s in (x.strip().rstrip(".!? ").strip() for x in _SENTENCE.split(text.strip())) if s]


def _leading_np(words: list[str]) -> int:
    """Length of the noun phrase at the start of a segment (0 unless it opens with "a"/"an")."""
    if not words or words[0] not in ARTICLES:
        return 0
    end = noun_phrase_end(words, 0)
    return end if end > 1 else 0


def _trailing_np(words: list[str]) -> int:
    """Start of a segment's final noun phrase ("a"/"an" ... up to the end), or -1."""
    for k in range(len(words) - 1, -1, -1):
        if words[k] in ARTICLES:
            return k if noun_phrase_end(words, k) == len(words) and k + 1 < len(words) else -1
        if words[k] in DETERMINERS:
            return -1
    return -1


def _counted(np_words: list[str], count: int) -> list[str]:
    """ "a red car" x 3 -> "three red cars"."""
    return en.count_phrase(count, " ".join(np_words[1:])).split() if count > 1 else np_words


def rules_sentence(sentence: str) -> str:
    words = re.sub(r"[^a-z0-9' -]+", " ", sentence.lower()).split()
    segments = en.and_parts(en.remove_doubled_words(" ".join(words)).split())

    # each output segment: [words, count, which noun phrase is counted ("lead" or "tail")]
    out: list[list] = []
    for seg in segments:
        if out:
            prev, prev_count, prev_mode = out[-1]
            # merge a repeated predicate: "wearing a hat" + "wearing a shirt" -> "wearing a hat and a shirt"
            shared = False
            first = next((i for i, w in enumerate(seg) if w in ARTICLES), 0)  # seg = predicate + "a ..."
            tail = _trailing_np(prev)
            if 0 < first and tail >= first and prev[tail - first:tail] == seg[:first]:
                seg, shared = seg[first:], True
            # group repeated objects, up to ten: "a dog" + "a dog" -> "two dogs"; a repeated clause
            # counts its subject: "a man riding a horse" x 2 -> "two men riding a horse";
            # "wearing a hat" + "(wearing) a hat" -> "wearing two hats"
            lead = _leading_np(seg)
            if lead and prev_count < 10:
                if shared and lead == len(seg) and tail >= 0 and prev[tail:] == seg and prev_mode in ("tail", None):
                    out[-1][1:] = [prev_count + 1, "tail"]
                    continue
                if not shared and prev == seg and prev_mode in ("lead", None):
                    out[-1][1:] = [prev_count + 1, "lead"]
                    continue
                # the last repeat may go on: "a dog" + "a dog on the grass" -> "two dogs on the grass", and
                # "two men" + "a man on the snow" -> "three men on the snow", never "two men and a man on the snow"
                if not shared and prev_mode in ("lead", None) and seg[:lead] == prev and _leading_np(prev) == len(prev):
                    out[-1] = [seg, prev_count + 1, "lead"]
                    continue
        out.append([seg, 1, None])

    pieces = []
    for seg, count, mode in out:
        if mode == "lead":
            lead = _leading_np(seg)
            seg = _counted(seg[:lead], count) + seg[lead:]
        elif mode == "tail":
            tail = _trailing_np(seg)
            seg = seg[:tail] + _counted(seg[tail:], count)
        pieces.append(" ".join(seg))
    text = " and ".join(pieces)
    # articles: "a" / "an" by the next word; none before a plural or a mass noun phrase
    words = text.split()
    fixed = []
    for i, w in enumerate(words):
        if w in ARTICLES and i + 1 < len(words):
            end = noun_phrase_end(words, i)
            head = words[end - 1] if end > i + 1 else ""
            if head and (en.is_plural(head) or en.is_mass_noun(head)) and end - i <= 4:
                continue
            w = en.article(words[i + 1])
        fixed.append(w)
    return en.finish_sentence(en.remove_doubled_words(" ".join(fixed)))


def rules_paraphrase(caption: str) -> str:
    """The offline paraphrase of one caption (each sentence on its own)."""
    return " ".join(rules_sentence(s) for s in sentences_of(caption)) or caption


# ---------------------------------------------------------------------------------------------
# The offline paraphraser that writes sentences (``--model sentences``)

def _is_predicate_start(words: list[str]) -> bool:
    """Whether a walk's segment opens with its predicate ("on a tree", "wearing a dress")."""
    w = words[0]
    return w not in DETERMINERS and (w in PREPOSITIONS or is_predicate_word(["dog"] + words, 1))


def _np_count(np_words: list[str]) -> int:
    return en.WORD_NUMBERS.get(np_words[0], 1) if np_words else 1


def _finite(predicate: list[str], plural: bool) -> list[str]:
    """A walk's predicate after its subject: "wearing" -> "is wearing", "on" -> "are on", "with" -> "has"."""
    if predicate[0] == "with":
        return ["have" if plural else "has"] + predicate[1:]
    return ["are" if plural else "is"] + predicate


def _subject_plural(np_words: list[str]) -> bool:
    return _np_count(np_words) > 1 or (bool(np_words) and en.is_plural(np_words[-1]))


def _there(bare: list[list[str]]) -> list[str]:
    """ "there is snow and a tree", "there are two dogs and a tree": bare noun phrases, repeats counted, the
    verb agreeing with the first (as people say it)."""
    counted: list[list] = []  # [noun phrase, count]
    for np_words in bare:
        if counted and counted[-1][0] == np_words and np_words[0] in ARTICLES:
            counted[-1][1] += 1
        else:
            counted.append([np_words, 1])
    phrases = [_counted(np_words, n) for np_words, n in counted]
    return ["there", "are" if _subject_plural(phrases[0]) else "is"] + " and ".join(" ".join(p) for p in phrases).split()


def sentence_rewrite(sentence: str) -> str:
    """One walk's sentence rewritten as clauses with finite verbs.

    The walk joins its mentions with "and": a segment that opens with a noun phrase and goes on with a
    predicate is a clause ("a woman wearing a dress" -> "a woman is wearing a dress"), one that opens with
    its predicate continues the last clause ("and is on a tree"; the same predicate again only adds its
    object: "is wearing a hat and a shirt"), and bare noun phrases are introduced ("there is snow and ...";
    repeats counted: "there are two dogs and a tree"). A lone noun phrase is left to :func:`rules_sentence`.
    """
    words = en.remove_doubled_words(" ".join(re.sub(r"[^a-z0-9' -]+", " ", sentence.lower()).split())).split()
    segments = en.and_parts(words)
    clauses: list[list[str]] = []  # each clause's words
    bare: list[list[str]] = []  # bare noun phrases waiting to be introduced
    plural, last_predicate = False, None
    for seg in segments:
        k = next((i for i, w in enumerate(seg) if w in DETERMINERS), len(seg))  # where the predicate's object starts
        if _is_predicate_start(seg):
            if not clauses and not bare:  # nothing to hang from: keep the words
                clauses.append(seg)
            elif bare:  # the bare noun phrase before it is its subject
                subject = bare.pop()
                if bare:
                    clauses.append(_there(bare))
                    bare = []
                plural = _subject_plural(subject)
                clauses.append(subject + _finite(seg, plural))
            elif seg[:k] == last_predicate:  # "is wearing a hat and a shirt"
                clauses[-1] += ["and"] + seg[k:]
            else:
                clauses[-1] += ["and"] + _finite(seg, plural)
            last_predicate = seg[:k]
            continue
        end = noun_phrase_end(seg, 0) if seg[0] in DETERMINERS else noun_phrase_end(["a"] + seg, 0) - 1
        if end >= len(seg):
            bare.append(seg)
            continue
        subject, rest = seg[:end], seg[end:]
        count = 1
        while bare and bare[-1] == subject and subject[0] in ARTICLES:  # "a dog and a dog on the grass"
            bare.pop()
            count += 1
        subject = _counted(subject, count)
        if bare:
            clauses.append(_there(bare))
            bare = []
        plural = _subject_plural(subject)
        k = next((i for i, w in enumerate(rest) if w in DETERMINERS), len(rest))
        last_predicate = rest[:k]
        clauses.append(subject + _finite(rest, plural))
    if not clauses and len(bare) < 2:
        return rules_sentence(sentence)
    if bare:
        clauses.append(_there(bare))
    return en.finish_sentence(en.fix_articles(" and ".join(" ".join(c) for c in clauses)))


def sentences_paraphrase(caption: str) -> str:
    """``--model sentences``: each walk's sentence rewritten as clauses (:func:`sentence_rewrite`)."""
    return " ".join(sentence_rewrite(s) for s in sentences_of(caption)) or caption


# ---------------------------------------------------------------------------------------------
# A seq2seq model's paraphrases (Pegasus, as the paper)

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
    """``auto``: the faster engine on ``device`` as bench/bench_gpu.py measured them (docs/gpu.md): on the CPU
    CTranslate2 where it is installed (2.1x transformers), on a GPU transformers (CTranslate2 0.77x on an H200);
    a named engine that cannot run here is an error."""
    from clid.selfgen import ct2_pegasus

    if engine == "auto" and runtime.device_plan(device).gpu:
        return "transformers"
    why_not = ct2_pegasus.available(device) if engine != "transformers" else None
    if engine == "auto":
        return "transformers" if why_not else "ctranslate2"
    if engine == "ctranslate2" and why_not:
        raise DataError(None, None, f"--engine ctranslate2: {why_not} (docs/gpu.md); use --engine transformers")
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


def first_line(err: Exception) -> str:
    """An exception's message on one short line."""
    return (str(err).splitlines() or [type(err).__name__])[0][:200]


class ModelParaphraser:
    """A transformers seq2seq paraphraser (Pegasus and the like), beam search, batched.

    ``engine`` "transformers" runs transformers' ``generate``, the cross-attention cache left in place
    (:func:`reorder_self_attention_only`), on a GPU with the output layer padded to a multiple of 64
    (:func:`pad_vocabulary`); "ctranslate2" the same checkpoint converted into CTranslate2 (clid.selfgen.ct2_pegasus: Pegasus only), with the same tokenizer and ids.
    ``precision`` "bf16" holds the model in bfloat16 (Pegasus was trained in it); ``batch_size`` "auto"
    (clid.run.runtime): 32 on the CPU, on a GPU as many pieces as half its free memory holds for their beams'
    caches, at most 256."""

    def __init__(self, name: str, device: str, num_beams: int, batch_size, max_length: int, precision: str = "fp32",
                 engine: str = "transformers"):
        import torch
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        from clid.selfgen import ct2_pegasus

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
                try:
                    self.translator = ct2_pegasus.Translator(path, device, precision, torch.get_num_threads())
                except Exception as err:  # a copy that does not load (cut short, converted before sizes were recorded)
                    path = ct2_pegasus.converted(name, load, again=f"CTranslate2 cannot load it ({first_line(err)})")
                    try:
                        self.translator = ct2_pegasus.Translator(path, device, precision, torch.get_num_threads())
                    except Exception as err:
                        raise DataError(path, None, f"CTranslate2 cannot load this copy of the paraphraser '{name}', "
                                                    f"converted again just now ({first_line(err)}): give --engine "
                                                    "transformers") from None
            else:
                self.model = AutoModelForSeq2SeqLM.from_pretrained(name).to(device).eval()
                self.config = self.model.config
                reorder_self_attention_only(self.model)
                if runtime.device_plan(device).gpu:  # (on the CPU the padding would only cost time)
                    pad_vocabulary(self.model)
        except DataError:
            raise
        except Exception as err:  # OSError (not found), ValueError / ImportError (cannot convert)
            from clid.base.hub import is_local, load_problem

            detail = load_problem(name, err)
            if ("protobuf" in str(err) or "tiktoken" in str(err)) and "folder" not in detail:
                detail = "its sentencepiece tokenizer needs the 'protobuf' package to load"
            hub = DEFAULT_MODEL if is_local(name) else name
            raise DataError(None, None, f"the paraphraser '{name}' cannot be loaded: {detail}. Use --model "
                                        "rules or sentences (offline), or download it once with "
                                        f"--allow-download (its source: {hub} on the Hugging Face hub; "
                                        f"where there is internet: huggingface-cli download {hub} "
                                        "--local-dir DIR, then --model DIR).") from None
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
