"""LaBERT's mask-predict decoding at a length level, batched over images.

For a level (low, high) the caption is decoded at length ``high``:

1. all text positions start as [MASK]; predict every position;
2. for step s = 1 .. T-1: re-mask the ``max(1, int(high * (1 - s / T)))`` least confident tokens and
   predict only those positions again (the LM head runs only where a prediction is needed);
3. the text is cut at the first "." (the end-of-sentence and padding token).

Confidences are averaged as in LaBERT's and the authors' inference (``labert_average``, the
default; the paper does not describe decoding): each step predicts every position, and every
position's confidence becomes the mean of its old and its new confidence. ``labert_average=False``
re-predicts only the re-masked positions and keeps the other confidences (the LM head then runs
only where a prediction is needed). Options: an end-of-sentence penalty (LaBERT's ``eos_decay``:
the probability of "." at positions ``low-1 .. high-1`` is multiplied by ``decay ** (high -
position)``; 1.0 = off, the default). Repeated words ("a a dog") are collapsed as LaBERT's
inference does (``dedupe``). A caption that fills every position of its level without a "." is
reported as *filled* (``return_filled``): the authors' count of its length has no final "."
(:func:`clid.evaluation.metrics.length_control`).

Repeated n-grams (``block_ngram`` = n, 0 = off, the authors'): a non-autoregressive model predicts its
positions independently, so mask-predict tends to repeat a phrase ("a dress and a dress and a ...").
Trigram blocking (Paulus et al., 2018, "A Deep Reinforced Model for Abstractive Summarization", for
beam search) is carried over to mask-predict: whenever positions are (re-)predicted, they are filled
left to right, each with its most confident candidate (of the ``BLOCK_CANDIDATES`` best) that completes
no n-gram already in the sequence and doubles no word. A blocked word is replaced by a word, never by
"." (the end), and before the level's shortest length "." is no candidate at all, so that a blocked
phrase does not turn into a shorter caption, nor one too short for its level (captions only: in a
paragraph "." also ends a sentence). N-grams
holding a [MASK] or "." (the end and the padding) do not count. With blocking, a candidate that breaks a
phrase with a neighbour is passed over too (no article before a function word, no function word at the end,
no adjective before an article, no word piece after a function word: clid.base.english.breaks_phrase),
and "a"/"an" are mended after decoding, the length unchanged.
An exact length (``length`` = N tokens, the project's count: N - 1 words and the final "."): the caption is decoded
at the level that holds N (the first level above N when none does), at that level's length as always, but only its
first N - 1 positions are predicted; position N - 1 and the rest hold "." from the start (the padding the model
was trained with), and the N - 1 positions take only whole words that count as one token each (no ".", no word
piece, no punctuation, no special token) and never double a neighbour (which the clean-up would collapse): the
caption's text then counts N tokens (:func:`exact_classes`). In a paragraph it is one sentence.
docs/decoding.md has its measurements on the demo world.
"""
from __future__ import annotations

import re
import weakref

import torch

from clid.base.english import ADJECTIVES, FUNCTION_WORDS, breaks_phrase, fix_articles, remove_doubled_words
from clid.base.text import content_end, decode, eos_id, get_levels, keeps_sentences
from clid.data.store import FeatureStore, load_regions, pad_regions
from clid.model.captioner import Captioner

# mask-predict steps per level: the 7 caption levels, then +5 per further level
DEFAULT_STEPS = (10, 15, 20, 25, 30, 35, 40)
LABERT_STEPS = (10, 15, 20, 20)
BLOCK_CANDIDATES = 16  # with block_ngram: the most confident tokens tried at a position, best first


def default_steps(levels) -> tuple[int, ...]:
    levels = get_levels(levels)
    if levels == get_levels("labert"):
        return LABERT_STEPS
    return tuple(DEFAULT_STEPS[i] if i < len(DEFAULT_STEPS) else DEFAULT_STEPS[-1] + 5 * (i - 6)
                 for i in range(len(levels)))


def exact_level(levels, length: int) -> int:
    """The level (from 1) an exact ``length`` is decoded at: the one that holds it, else the first above it."""
    levels = get_levels(levels)
    return next((n for n, (_, high) in enumerate(levels, 1) if length <= high), len(levels))


_WHOLE_WORD = re.compile(r"[a-z0-9]+")
_EXACT_CLASSES: "weakref.WeakKeyDictionary[Captioner, torch.Tensor]" = weakref.WeakKeyDictionary()


def exact_classes(model: Captioner) -> torch.Tensor:
    """Bool [classes of the head]: the tokens an exact-length caption is written with, those whose text counts
    one token: whole words of ASCII letters and digits (no ".", no word piece "##s" that would join its
    neighbour into another word, no punctuation the preprocessing drops, no special token)."""
    allowed = _EXACT_CLASSES.get(model)
    if allowed is None:
        vocab = model.tokenizer.convert_ids_to_tokens(list(range(len(model.tokenizer))))
        ok = torch.tensor([bool(_WHOLE_WORD.fullmatch(word or "")) for word in vocab])
        ids = model.output_ids.cpu() if model.output_ids is not None else torch.arange(len(ok))
        allowed = ok[ids.clamp(max=len(ok) - 1)] & (ids < len(ok))
        _EXACT_CLASSES[model] = allowed
    return allowed


@torch.no_grad()
def mask_predict(model: Captioner, regions, region_pos, region_mask, level: int, steps: int,
                 eos_decay: float = 1.0, labert_average: bool = True, block_ngram: int = 0,
                 length: int | None = None) -> torch.Tensor:
    """Token ids [B, high] decoded at ``level`` (1-based); ``block_ngram`` n > 0: no n-gram twice; ``length``
    N: a caption of exactly N tokens, "." from position N - 1 on (module docstring)."""
    low, high = model.levels[level - 1]
    B, device = regions.shape[0], regions.device
    mask_id = model.tokenizer.mask_token_id
    end_token = int(eos_id(model.tokenizer))
    end = int(model.to_output(torch.tensor(end_token)))  # the head's class of "."
    levels = torch.full((B,), level, dtype=torch.long, device=device)
    phrase = PhraseIds(model.tokenizer) if block_ngram else None
    exact = length is not None
    if exact and not 1 <= length <= high:
        raise ValueError(f"length {length} does not fit level {level} ({low}-{high} tokens)")
    words = length - 1 if exact else high  # the positions decoded; with an exact length the rest hold "."
    fixed = torch.zeros(B, high, dtype=torch.bool, device=device)
    fixed[:, words:] = True
    allowed = exact_classes(model).to(device) if exact else None
    fill_n = block_ngram or (high + 1 if exact else 0)  # (exact: no doubled word; n-grams longer than the row)
    # penalty on "." at positions low-1 .. high-1: decay ** (high - position)
    eos_scale = torch.ones(high, device=device)
    if eos_decay != 1.0:
        exponents = torch.arange(high - low + 1, 0, -1, device=device, dtype=torch.float32)
        eos_scale[low - 1:] = eos_decay ** exponents

    def predict(ids, where):
        """(confidence, token id) of the best class at the ``where`` positions of ``ids``, and with
        ``block_ngram`` (or an exact length) the candidates filled in left to right at the [MASK] positions among
        them."""
        states = model.encode(regions, region_pos, region_mask, ids, levels)
        probs = model.logits_from_hidden(model.hidden(states, where)).softmax(-1)
        if exact:  # only whole words, renormalised; any other class ranks below them all
            probs = probs * allowed
            probs = (probs / probs.sum(-1, keepdim=True).clamp_min(1e-30)).masked_fill(~allowed, -1.0)
        else:
            probs[:, end] *= eos_scale.expand(B, high)[where]
        confidence, classes = probs.max(-1)
        predicted = model.from_output(classes)
        if fill_n:
            k = min(BLOCK_CANDIDATES, probs.shape[-1], max(1, int(allowed.sum())) if exact else probs.shape[-1])
            top_conf, top_classes = probs.topk(k, dim=-1)
            full_conf = torch.zeros(B, high, k, device=device, dtype=top_conf.dtype)
            full_ids = torch.zeros(B, high, k, device=device, dtype=torch.long)
            full_conf[where], full_ids[where] = top_conf, model.from_output(top_classes)
            ends = None if keeps_sentences(model.levels) and not exact else end_token  # (in a paragraph "." also ends a sentence)
            chosen_conf, chosen_ids = fill_without_repeats(ids, ids == mask_id, full_ids, full_conf, fill_n,
                                                           {mask_id, end_token}, ends, words if exact else low - 1, phrase)
            fill = (ids == mask_id)[where]
            confidence, predicted = confidence.clone(), predicted.clone()
            confidence[fill], predicted[fill] = chosen_conf[where][fill], chosen_ids[where][fill]
        return confidence, predicted

    tokens = torch.full((B, high), mask_id, dtype=torch.long, device=device).masked_fill(fixed, end_token)
    if words == 0:  # length 1: the "." alone
        return tokens
    everywhere = torch.ones(B, high, dtype=torch.bool, device=device)
    confidence, predicted = predict(tokens, everywhere)
    tokens = torch.where(fixed, tokens, predicted.view(B, high))
    confidence = confidence.view(B, high).masked_fill(fixed, float("inf"))  # (never re-masked)
    for step in range(1, steps):
        n_mask = max(1, int(words * (1.0 - step / steps)))
        remask = torch.zeros(B, high, dtype=torch.bool, device=device)
        remask.scatter_(1, confidence.topk(n_mask, dim=1, largest=False).indices, True)
        tokens = tokens.masked_fill(remask, mask_id)
        if labert_average:
            new_conf, new_tokens = (t.view(B, high) for t in predict(tokens, everywhere))
            tokens = torch.where(remask, new_tokens, tokens)
            confidence = torch.where(remask, new_conf, confidence)
            confidence = (confidence + new_conf) / 2
        else:
            new_conf, new_tokens = predict(tokens, remask)
            tokens[remask] = new_tokens
            confidence[remask] = new_conf
        confidence = confidence.masked_fill(fixed, float("inf"))
    return tokens


class PhraseIds:
    """Which neighbouring token ids break a phrase, for :func:`fill_without_repeats`: the pairs of words
    clid.base.english.breaks_phrase names (the stop "." as the end), and a word piece ("##ered") after a
    function word ("a" + "##ered" reads "aered")."""

    def __init__(self, tokenizer):
        self.words = {i: w for w, i in tokenizer.get_vocab().items()}
        self.stop = eos_id(tokenizer)

    def breaks(self, left: int, right: int) -> bool:
        word, next_word = self.words.get(left, ""), self.words.get(right, "")
        if word not in FUNCTION_WORDS and word not in ADJECTIVES:
            return False
        if next_word.startswith("##"):
            return word in FUNCTION_WORDS
        return breaks_phrase(word, None if right == self.stop else next_word, sound=False)


def fill_without_repeats(tokens: torch.Tensor, holes: torch.Tensor, candidates: torch.Tensor,
                         candidate_conf: torch.Tensor, n: int, exempt: set[int], end: int | None = None,
                         first_end: int = 0, phrase: "PhraseIds | None" = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(confidence [B, T], token id [B, T]) for the ``holes`` of ``tokens`` [B, T], filled left to right:
    at each hole the first of its ``candidates`` [B, T, K] (best first) that completes no n-gram already
    in the row (n-grams holding a token of ``exempt`` do not count), doubles no neighbour ("a a", which
    the caption's clean-up would collapse to a shorter caption), breaks no phrase with a neighbour
    (``phrase``: no function word before the stop, none after an article) and is not ``end`` before
    position ``first_end``, nor ``end`` in place of a better candidate that was blocked (a blocked phrase
    does not shorten the caption); the first candidate that is not such an ``end`` when every one repeats."""
    rows, holes_at = tokens.tolist(), holes.tolist()
    options, option_conf = candidates.tolist(), candidate_conf.tolist()
    out_ids = [[0] * len(row) for row in rows]
    out_conf = [[0.0] * len(row) for row in rows]
    for b, row in enumerate(rows):
        length = len(row)

        def countable(starts):  # the n-grams starting at ``starts`` that hold no exempt token
            for start in starts:
                gram = tuple(row[start:start + n])
                if not exempt.intersection(gram):
                    yield gram

        def windows(at):  # the countable n-grams through position ``at``
            return countable(range(max(0, at - n + 1), min(at, length - n) + 1))

        seen = {}
        for gram in countable(range(length - n + 1)):
            seen[gram] = seen.get(gram, 0) + 1
        for at in (i for i in range(length) if holes_at[b][i]):
            allowed = [j for j, token in enumerate(options[b][at]) if token != end or at >= first_end] or [0]
            pick = allowed[0]
            for j in allowed:
                row[at] = token = options[b][at][j]
                if token == end and j != allowed[0]:  # a blocked word is replaced by a word, not by the end
                    continue
                doubled = token not in exempt and token in row[max(0, at - 1):at] + row[at + 1:at + 2]
                after = row[at + 1] if at + 1 < length else None if phrase is None else phrase.stop  # (the row's end)
                broken = phrase is not None and ((at > 0 and phrase.breaks(row[at - 1], token)) or
                                                 phrase.breaks(token, after))
                grams = list(windows(at))
                if not doubled and not broken and all(seen.get(g, 0) == 0 for g in grams) and len(set(grams)) == len(grams):
                    pick = j
                    break
            row[at] = options[b][at][pick]
            for gram in windows(at):
                seen[gram] = seen.get(gram, 0) + 1
            out_ids[b][at], out_conf[b][at] = row[at], option_conf[b][at][pick]
    return (torch.tensor(out_conf, dtype=candidate_conf.dtype, device=tokens.device),
            torch.tensor(out_ids, dtype=torch.long, device=tokens.device))


def generate_captions(model: Captioner, features: FeatureStore, image_ids: list[str], levels: list[int],
                      batch_size: int = 64, device="cpu", steps: tuple[int, ...] | None = None,
                      eos_decay: float = 1.0, labert_average: bool = True, dedupe: bool = True,
                      progress: bool = False, return_filled: bool = False, precision: str = "fp32",
                      block_ngram: int = 0, length: int | None = None):
    """Captions at each requested level for each image: ``{level: {image_id: caption}}``.

    ``length`` N: instead of the levels, one caption of exactly N tokens per image, under the level it is
    decoded at (:func:`exact_level`; ``levels`` must then be None or that level).

    ``features``: a :class:`FeatureStore`, or any object with its ``path`` and ``get(image_id)``.
    ``progress``: True for a bar, or a function called with the number of images of each decoded
    batch. ``return_filled``: also return ``{level: {image ids whose decoded sequence holds no "."}}``.
    ``block_ngram``: n > 0 fills re-masked positions so that no n-gram repeats (module docstring).
    ``precision`` (clid.run.runtime): bf16 decodes under bfloat16 autocast. Towards a GPU the next batch's
    regions are read in a second thread and copied from pinned memory while the GPU decodes.
    """
    from clid.base.progress import Progress
    from clid.run import runtime

    model.eval()
    if length is not None:
        level = exact_level(model.levels, length)
        if levels not in (None, [level]):
            raise ValueError(f"an exact length ({length}) is decoded at level {level} alone, not at levels {levels}")
        levels = [level]
    steps = steps or default_steps(model.levels)
    end = eos_id(model.tokenizer)
    out: dict[int, dict[str, str]] = {level: {} for level in levels}
    paragraphs = keeps_sentences(model.levels)  # a paragraph keeps its sentences (text.content_end)
    filled: dict[int, set[str]] = {level: set() for level in levels}
    batches = [image_ids[i:i + batch_size] for i in range(0, len(image_ids), batch_size)]
    report = progress if callable(progress) else None
    bar = Progress(len(batches) * len(levels), "decode", "batch", disable=not progress or report is not None)

    def batch_regions(batch):
        regions = [load_regions(features, i, model.config.num_classes, model.config.box_input) for i in batch]
        return runtime.pin(pad_regions(regions), device)

    for batch, regions in zip(batches, runtime.prefetch(batches, batch_regions, device)):
        feats, pos, mask = runtime.to_device(regions, device)
        for level in levels:
            with runtime.autocast(precision, device):
                ids = mask_predict(model, feats, pos, mask, level, steps[level - 1], eos_decay, labert_average,
                                   block_ngram=block_ngram, length=length)
            for image_id, row in zip(batch, ids.tolist()):
                text = decode(row, model.tokenizer, keep_sentences=paragraphs)
                text = remove_doubled_words(text) if dedupe else text
                out[level][str(image_id)] = fix_articles(text) if block_ngram else text
                if content_end(row, end, paragraphs) == len(row):  # filled the level without "." padding
                    filled[level].add(str(image_id))
            bar.update(1)
        if report is not None:
            report(len(batch))
    bar.close()
    if hasattr(features, "check_unchanged"):  # (no caption comes from a feature file that changed meanwhile)
        features.check_unchanged()
    return (out, filled) if return_filled else out
