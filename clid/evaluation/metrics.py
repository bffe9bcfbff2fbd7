"""Caption metrics per length level: length control, diversity and the COCO caption metrics.

Generated captions are held as ``{level: {image_id: caption}}`` (levels numbered from 1, as in
:mod:`clid.base.text`). For each level of a level set:

- **control precision**: the share of ALL evaluated images whose caption length (counted as in
  docs/method.md, :func:`clid.base.text.caption_lengths`) falls inside the level's [low, high] range; a
  missing or empty caption (no word left after Karpathy preprocessing) counts as a miss. This is
  how the authors' code counts it (in-range captions / 5000 test images). A caption that *filled*
  its level (the model wrote no "." in any position) is counted as the authors' code counts it:
  its tokens without a final "." (their decoder appends "." only where the model wrote one), so a
  caption filling all ``high`` positions has length ``high`` and is a hit. ``strict=True`` appends
  the "." to it too (one token over the level: a miss).
- **length error**: mean absolute distance of the length to the [low, high] range (0 inside),
  over the images that have a caption.
- **distinct-1 / distinct-2**: unique n-grams over all n-grams of the level's captions (Karpathy
  words), over every caption generated at that level.
- **quality**: BLEU-1..4, METEOR, ROUGE-L, CIDEr (and SPICE when it can run) from pycocoevalcap,
  with its PTB tokenizer, on the in-range captions only, exactly as ``COCOEvalCap`` calls them.

CIDEr's document frequencies (its IDF) are computed over the references of the images being
scored. Each level's in-range subset is scored as given, as the authors' code does, so a level
with few in-range captions gets a CIDEr computed on few documents: CIDEr needs several images to
be meaningful (it is 0 for a single image), and is comparable between runs only with care when
their in-range subsets differ much in size.

SPICE needs the Stanford CoreNLP 3.6.0 jars, which pycocoevalcap downloads on first use. Without
them and without a network, :func:`spice_status` says why in a line starting with "n/a:" after a
few seconds at most, and SPICE is reported as missing; nothing crashes.

Also here: the generated-captions file (JSONL lines ``{"image_id", "level", "caption"}``) and the
references of the evaluated images (:func:`load_refs`, :func:`load_long_refs`).
"""
from __future__ import annotations

import shutil
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path

from clid.base.files import DataError, natural_key, read_json, read_jsonl, write_jsonl
from clid.base.hub import is_offline
from clid.base.text import LEVEL_SETS, caption_lengths, get_levels, karpathy_tokens
from clid.data.captions import (
    detect_format,
    load_coco_captions,
    load_jsonl_captions,
    load_karpathy,
    load_paragraphs,
    read_id_list,
)
from clid.data.splits import karpathy_test_ids
from clid.run.cli import is_whole_number

BLEU = ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4")

# CIC-BART-SSA's length levels (their eval_length_precision.py): < 10, 10-19, 20-29, 30-39 and >= 40
# words (whitespace-separated), for evaluation only; 07 --levels ssa
SSA_LEVELS = ((1, 9), (10, 19), (20, 29), (30, 39), (40, 100_000))
QUALITY_METRICS = BLEU + ("METEOR", "ROUGE_L", "CIDEr", "SPICE")

# Characters that Java's line reader (behind the PTB tokenizer's -preserveLines) treats as line
# breaks while Python's "\n".join does not; they would shift captions onto the wrong image.
_LINE_BREAKS = str.maketrans({c: " " for c in "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"})


# ---------------------------------------------------------------------------------------------
# Length control and diversity (pure Python, cheap: training calls these on validation images)

def counts_sentences(levels) -> bool:
    """Paragraph levels count sentence breaks as "." tokens; caption levels do not."""
    return get_levels(levels) == LEVEL_SETS["paragraph"]


def has_words(caption) -> bool:
    return isinstance(caption, str) and bool(karpathy_tokens(caption))


def length_error(length: int, low: int, high: int) -> int:
    """Distance in tokens from ``length`` to the inclusive range [low, high] (0 inside)."""
    return max(low - length, 0, length - high)


def distinct_n(captions, n: int) -> float | None:
    """Distinct-n: unique n-grams / all n-grams over the captions (Karpathy words); None if none."""
    seen, total = set(), 0
    for caption in captions:
        words = karpathy_tokens(caption)
        grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
        seen.update(grams)
        total += len(grams)
    return len(seen) / total if total else None


@dataclass
class LevelControl:
    """Length control of one level over a fixed set of images."""

    level: int
    low: int
    high: int
    n_images: int  # the denominator: every evaluated image
    lengths: dict[str, int] = field(default_factory=dict)  # image id -> length, captions with words
    n_empty: int = 0  # captions given but with no word in them (counted as misses)

    @property
    def in_range(self) -> list[str]:
        return [i for i, n in self.lengths.items() if self.low <= n <= self.high]

    def summary(self) -> dict:
        lengths = list(self.lengths.values())
        n_in = len(self.in_range)
        return {
            "low": self.low, "high": self.high,
            "n_images": self.n_images,
            "n_captions": len(lengths),
            "n_missing": self.n_images - len(lengths),
            "n_empty": self.n_empty,
            "n_in_range": n_in,
            "control_precision": n_in / self.n_images if self.n_images else None,
            "length_error": (sum(length_error(n, self.low, self.high) for n in lengths) / len(lengths)
                             if lengths else None),
            "mean_length": sum(lengths) / len(lengths) if lengths else None,
        }


def normalise_generated(generated) -> dict[int, dict[str, str]]:
    """``{level: {image_id: caption}}`` with int levels and str image ids."""
    return {int(level): {str(i): c for i, c in captions.items()} for level, captions in generated.items()}


def length_control(generated, image_ids, levels="caption", tokenizer=None,
                   keep_sentences: bool | None = None, filled=None, strict: bool = False,
                   words: bool = False) -> dict[int, LevelControl]:
    """Per level, the lengths of the captions of ``image_ids`` and what falls in range.

    ``filled``: ``{level: image ids}`` of the captions that filled their level without "."; unless
    ``strict``, their length has no final "." (the authors' count, see the module docstring).
    ``words``: lengths are whitespace-separated words instead (CIC-BART-SSA's count, :data:`SSA_LEVELS`).
    Captions of images outside ``image_ids`` are ignored (the caller counts them).
    """
    levels = get_levels(levels)
    generated = normalise_generated(generated)
    keep_sentences = counts_sentences(levels) if keep_sentences is None else keep_sentences
    image_ids = list(dict.fromkeys(str(i) for i in image_ids))
    out = {}
    for index, (low, high) in enumerate(levels, 1):
        captions = generated.get(index, {})
        given = [i for i in image_ids if i in captions]
        present = [i for i in given if has_words(captions[i])]
        if words:
            lengths = [len(captions[i].split()) for i in present]
        else:
            lengths = caption_lengths([captions[i] for i in present], tokenizer, keep_sentences)
        if not strict and filled and not words:
            no_end = {str(i) for i in filled.get(index, ())}
            lengths = [n - (i in no_end) for i, n in zip(present, lengths)]
        out[index] = LevelControl(index, low, high, len(image_ids), dict(zip(present, lengths)),
                                  n_empty=len(given) - len(present))
    return out


def control_precision(generated, image_ids, levels="caption", tokenizer=None) -> dict[int, float]:
    """Share of ``image_ids`` whose level-L caption is inside level L, for every level L."""
    return {level: c.summary()["control_precision"]
            for level, c in length_control(generated, image_ids, levels, tokenizer).items()}


# ---------------------------------------------------------------------------------------------
# SPICE availability

_CORENLP_JARS = ("stanford-corenlp-3.6.0.jar", "stanford-corenlp-3.6.0-models.jar")


def _spice_lib() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("pycocoevalcap")
    return Path(list(spec.submodule_search_locations)[0]) / "spice" / "lib"


def _reachable(host: str, port: int, timeout: float) -> tuple[bool, str]:
    """Can we open a TCP connection? Bounded by ``timeout`` seconds, name lookup included."""
    result = [False, f"no answer within {timeout:g} s"]

    def probe():
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            result[:] = [True, ""]
        except OSError as err:
            result[:] = [False, f"{type(err).__name__}: {err}"]

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout)
    return result[0], result[1]


def spice_status(probe_timeout: float = 4.0) -> tuple[bool, str]:
    """Whether SPICE can run here, and a line saying why not ("n/a: ...")."""
    if shutil.which("java") is None:
        return False, "n/a: java is not installed (SPICE is a Java program)"
    lib = _spice_lib()
    missing = [jar for jar in _CORENLP_JARS if not (lib / jar).exists()]
    if not missing:
        return True, "ok"
    if is_offline():
        return False, (f"n/a: SPICE needs Stanford CoreNLP 3.6.0 ({', '.join(missing)} in {lib}), which pycocoevalcap "
                       "downloads from nlp.stanford.edu on first use, and this run is offline (--allow-download or "
                       "CLID_ALLOW_DOWNLOAD=1 lets it download)")
    ok, why = _reachable("nlp.stanford.edu", 80, probe_timeout)
    if ok:
        return True, "ok (pycocoevalcap downloads Stanford CoreNLP 3.6.0 on first use)"
    return False, (f"n/a: SPICE needs Stanford CoreNLP 3.6.0 ({', '.join(missing)} in {lib}), which "
                   f"pycocoevalcap downloads from nlp.stanford.edu on first use, and that host cannot "
                   f"be reached ({why})")


# ---------------------------------------------------------------------------------------------
# pycocoevalcap scoring

class CocoScorer:
    """The pycocoevalcap scorers behind PTB tokenization, as ``COCOEvalCap.evaluate`` runs them.

    Tokenization is memoised per text (the PTB tokenizer handles each line on its own, so this
    changes nothing) and done in one Java call per :meth:`tokenize`; one METEOR process serves
    every call. ``spice="auto"`` runs SPICE when :func:`spice_status` allows, ``"off"`` never.
    """

    def __init__(self, spice: str = "auto"):
        if spice not in ("auto", "off"):
            raise ValueError(f"spice must be 'auto' or 'off', not {spice!r}")
        if shutil.which("java") is None:
            raise DataError(None, None, "pycocoevalcap's PTB tokenizer and METEOR need Java 8 or newer on the "
                                        "PATH (e.g. apt-get install openjdk-17-jre-headless)")
        self._tokens: dict[str, str] = {}
        self._meteor = None
        self._spice = None
        if spice == "off":
            self.spice_ok, self.spice_reason = False, "n/a: turned off (--spice off)"
        else:
            self.spice_ok, self.spice_reason = spice_status()

    def tokenize(self, texts) -> list[str]:
        """PTB-tokenized, lower-cased texts without punctuation (pycocoevalcap's PTBTokenizer)."""
        from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

        texts = [str(t).translate(_LINE_BREAKS) for t in texts]
        new = list(dict.fromkeys(t for t in texts if t not in self._tokens))
        if new:
            done = PTBTokenizer().tokenize({k: [{"caption": t}] for k, t in enumerate(new)})
            if len(done) != len(new):
                raise RuntimeError(f"the PTB tokenizer returned {len(done)} lines for {len(new)} captions")
            self._tokens.update((t, done[k][0]) for k, t in enumerate(new))
        return [self._tokens[t] for t in texts]

    def score(self, refs: dict[str, list[str]], hyps: dict[str, str], per_image: dict | None = None) -> dict[str, float | None]:
        """Corpus scores of the captions ``hyps`` (image id -> text) against ``refs`` (raw texts). ``per_image``: a
        dict that receives each image's CIDEr (their mean is the corpus CIDEr)."""
        from pycocoevalcap.bleu.bleu import Bleu
        from pycocoevalcap.cider.cider import Cider
        from pycocoevalcap.meteor.meteor import Meteor
        from pycocoevalcap.rouge.rouge import Rouge

        ids = [i for i in hyps]
        if not ids:
            return {m: None for m in QUALITY_METRICS}
        missing = [i for i in ids if not refs.get(i)]
        if missing:
            raise ValueError(f"no reference captions for image(s) {missing[:5]}")
        tokens = iter(self.tokenize([hyps[i] for i in ids] + [r for i in ids for r in refs[i]]))
        res = {i: [next(tokens)] for i in ids}
        gts = {i: [next(tokens) for _ in refs[i]] for i in ids}

        out: dict[str, float | None] = {}
        bleu, _ = Bleu(4).compute_score(gts, res, verbose=0)
        out.update(zip(BLEU, map(float, bleu)))
        if self._meteor is None:
            self._meteor = Meteor()
        out["METEOR"] = float(self._meteor.compute_score(gts, res)[0])
        out["ROUGE_L"] = float(Rouge().compute_score(gts, res)[0])
        cider, each = Cider().compute_score(gts, res)  # (each: in the order of gts's images)
        out["CIDEr"] = float(cider)
        if per_image is not None:
            per_image.update(zip(gts, map(float, each)))
        out["SPICE"] = self._score_spice(gts, res)
        return out

    def _score_spice(self, gts, res) -> float | None:
        if not self.spice_ok:
            return None
        try:
            if self._spice is None:
                from pycocoevalcap.spice.spice import Spice

                self._spice = Spice()
            return float(self._spice.compute_score(gts, res)[0])
        except Exception as err:  # a broken SPICE set-up must not cost the other metrics
            self.spice_ok = False
            self.spice_reason = f"n/a: SPICE failed ({type(err).__name__}: {str(err)[:300]})"
            return None

    def close(self) -> None:
        self._meteor = None  # Meteor.__del__ stops its Java process


# ---------------------------------------------------------------------------------------------
# One run's evaluation (both modes of 07_eval.py, and anything else that has captions)

def length_rows(generated, control: dict[int, LevelControl]) -> dict[int, dict]:
    """Per level: its length control (:meth:`LevelControl.summary`) and the distinct-1/2 of its captions."""
    rows = {}
    for level, c in control.items():
        captions = [generated.get(level, {})[i] for i in c.lengths]
        rows[level] = dict(c.summary(), distinct_1=distinct_n(captions, 1), distinct_2=distinct_n(captions, 2))
    return rows


def evaluate_lengths(generated, image_ids, levels="caption", *, tokenizer=None, keep_sentences: bool | None = None,
                     filled=None, strict: bool = False, words: bool = False) -> dict:
    """Length control without references, at the levels the run has captions of: per level, control precision
    over ``image_ids`` (a missing caption is a miss), length error, mean length and distinct-n; shaped as
    :func:`evaluate`'s result."""
    levels = get_levels(levels)
    generated = normalise_generated(generated)
    control = length_control(generated, image_ids, levels, tokenizer, keep_sentences, filled, strict, words)
    control = {level: c for level, c in control.items() if generated.get(level)}
    return {"levels": length_rows(generated, control), "long_refs": {},
            "lengths": {level: dict(c.lengths) for level, c in control.items()}, "n_outside": 0}


def evaluate(generated, refs: dict[str, list[str]], levels="caption", *,
             long_refs: dict[int, dict[str, list[str]]] | None = None,
             scorer: CocoScorer | None = None, tokenizer=None, keep_sentences: bool | None = None,
             score_captions: str = "in-range", progress: bool = False, desc: str = "",
             filled=None, strict: bool = False, words: bool = False) -> dict:
    """Every metric of one run, per level.

    ``generated``: ``{level: {image_id: caption}}``. ``refs``: image id -> raw reference captions;
    its keys are the evaluated images (the test split). ``long_refs``: ``{level: {image_id:
    [captions]}}``, scored against that level's captions, reported under ``"long_refs"``.
    ``score_captions``: "in-range" (the paper) scores only the captions inside their level;
    "all" scores every caption. ``filled``, ``strict``, ``words``: how lengths are counted (:func:`length_control`).
    Returns ``{"levels": {L: {...}}, "long_refs": {L: {...}}, "lengths": {L: {image_id: length as
    counted}}, "per_image": {"levels" | "long_refs": {L: {image_id: CIDEr}}} (the scored captions), "n_outside":
    captions of images that are not evaluated}``.
    """
    from clid.base.progress import Progress

    if score_captions not in ("in-range", "all"):
        raise ValueError(f"score_captions must be 'in-range' or 'all', not {score_captions!r}")
    levels = get_levels(levels)
    generated = normalise_generated(generated)
    unknown = sorted(set(generated) - set(range(1, len(levels) + 1)))
    if unknown:
        raise ValueError(f"captions for level(s) {unknown}, outside the {len(levels)} levels {levels}")
    refs = {str(i): list(r) for i, r in refs.items()}
    bare = [i for i, r in refs.items() if not any(has_words(t) for t in r)]
    if bare:
        raise ValueError(f"{len(bare)} evaluated images have no reference caption (first: {bare[0]})")
    image_ids = sorted(refs, key=natural_key)
    control = length_control(generated, image_ids, levels, tokenizer, keep_sentences, filled, strict, words)
    long_refs = {int(level): {str(i): list(r) for i, r in by_image.items() if str(i) in refs}
                 for level, by_image in (long_refs or {}).items() if 1 <= int(level) <= len(levels)}
    own_scorer = scorer is None
    scorer = scorer or CocoScorer()

    def chosen(level: int) -> list[str]:
        c = control[level]
        return c.in_range if score_captions == "in-range" else list(c.lengths)

    # every text in one PTB tokenizer call
    scorer.tokenize([r for rs in refs.values() for r in rs]
                    + [r for by_image in long_refs.values() for rs in by_image.values() for r in rs]
                    + [generated[level][i] for level in control for i in chosen(level)])

    result = {"levels": {}, "long_refs": {}, "lengths": {level: dict(c.lengths) for level, c in control.items()},
              "per_image": {"levels": {}, "long_refs": {}},
              "n_outside": sum(1 for caps in generated.values() for i in caps if i not in refs)}
    jobs = [("levels", level) for level in control] + [("long_refs", level) for level in sorted(long_refs)]
    bar = Progress(len(jobs), desc or "scoring", "level", disable=not progress, leave=False)
    for table, level in jobs:
        ids = chosen(level)
        if table == "levels":
            row = dict(length_rows(generated, {level: control[level]})[level], n_scored=len(ids))
            by_image = refs
        else:
            by_image = long_refs[level]
            ids = [i for i in ids if by_image.get(i)]
            row = {"low": control[level].low, "high": control[level].high,
                   "n_images": sum(1 for i in by_image if by_image[i]), "n_scored": len(ids)}
        each = result["per_image"][table].setdefault(level, {})
        row.update(scorer.score({i: by_image[i] for i in ids}, {i: generated[level][i] for i in ids}, per_image=each))
        result[table][level] = row
        bar.update(1)
    bar.close()
    if own_scorer:
        scorer.close()
    return result


def ssa_requests(levels) -> list[int]:
    """For each of :data:`SSA_LEVELS`, the level of ``levels`` a model is asked for: the one holding the SSA
    level's lowest word count as tokens, else the nearest to it (caption levels: L1-L5)."""
    levels = get_levels(levels)
    return [min(range(1, len(levels) + 1), key=lambda n: length_error(low, *levels[n - 1])) for low, _ in SSA_LEVELS]


def to_ssa_levels(generated: dict, filled: dict, levels, kind: str = "checkpoint", path=None) -> tuple[dict, dict]:
    """A run's captions at the SSA levels: a checkpoint's, made at its own ``levels``, by :func:`ssa_requests`;
    a generated file's are at the SSA levels already (a level beyond them is an error)."""
    generated = normalise_generated(generated)
    if kind != "checkpoint":
        beyond = sorted(n for n in generated if n > len(SSA_LEVELS))
        if beyond:
            raise DataError(path, None, f"level {beyond[0]} is outside the {len(SSA_LEVELS)} SSA levels (--levels ssa)")
        return generated, filled
    pick = ssa_requests(levels)
    return ({k: dict(generated.get(n, {})) for k, n in enumerate(pick, 1)},
            {k: set(filled.get(n, ())) for k, n in enumerate(pick, 1)})


# ---------------------------------------------------------------------------------------------
# The generated-captions file: JSONL lines {"image_id", "level", "caption"}, optionally "filled"
# (true: the model wrote no "." in the level, see length_control) and "length" (as counted by 07)

def read_generated(path, num_levels: int | None = None, with_filled: bool = False):
    """``{level: {image_id: caption}}`` from a generated-captions JSONL file, checked line by line.

    ``with_filled``: also return ``{level: {image ids whose line says "filled": true}}``.
    """
    out: dict[int, dict[str, str]] = {}
    filled: dict[int, set[str]] = {}
    for number, record in enumerate(read_jsonl(path, required=("image_id", "level", "caption")), 1):
        where = f"record {number} (image {record['image_id']})"
        level = record["level"]
        if isinstance(level, bool) or not (isinstance(level, int) or (isinstance(level, str) and is_whole_number(level))):
            raise DataError(path, where, f"'level' must be a level number, got {level!r}")
        level = int(level)
        if level < 1 or (num_levels is not None and level > num_levels):
            raise DataError(path, where, f"level {level} is outside 1..{num_levels or 'N'}")
        if not isinstance(record["caption"], str):
            raise DataError(path, where, f"'caption' must be a string, got {type(record['caption']).__name__}")
        image_id = str(record["image_id"])
        if image_id in out.setdefault(level, {}):
            raise DataError(path, where, f"a second caption for image {image_id} at level {level}")
        out[level][image_id] = record["caption"]
        if not isinstance(record.get("filled", False), bool):
            raise DataError(path, where, f"'filled' must be true or false, got {record['filled']!r}")
        if record.get("filled"):
            filled.setdefault(level, set()).add(image_id)
    return (out, filled) if with_filled else out


def write_generated(path, generated, filled=None, lengths=None) -> int:
    """Write ``{level: {image_id: caption}}`` as JSONL, ordered by image id then level; with
    ``filled`` (``{level: image ids}``) each line says whether its caption filled its level, with
    ``lengths`` (``{level: {image_id: length}}``) its length as counted."""
    generated = normalise_generated(generated)
    rows = []
    for level, captions in generated.items():
        for i, c in captions.items():
            row = {"image_id": i, "level": level, "caption": c}
            if filled is not None:
                row["filled"] = i in filled.get(level, ())
            if lengths is not None and i in lengths.get(level, {}):
                row["length"] = lengths[level][i]
            rows.append(row)
    rows.sort(key=lambda r: (natural_key(r["image_id"]), r["level"]))
    return write_jsonl(path, rows)


# ---------------------------------------------------------------------------------------------
# The references of the evaluated images (07_eval.py)

def load_refs(path, split: str, test_ids_arg: str | None):
    """(test image id -> raw references, trusted records for the histogram, skip counts, what was evaluated).

    The test images are the ``split`` of the file, or the ids of ``--test-ids``; for an official
    COCO captions file (no split inside) the Karpathy 5k test ids by default.
    """
    kind, data = detect_format(path)
    loaders = {"karpathy": load_karpathy, "coco": load_coco_captions, "paragraphs": load_paragraphs}
    records = load_jsonl_captions(path) if kind == "jsonl" else loaders[kind](path, data=data)
    skipped = {}
    if kind == "coco" or test_ids_arg:
        ids = karpathy_test_ids() if test_ids_arg in (None, "karpathy") else read_id_list(test_ids_arg)
        wanted = set(map(str, ids))
        test = [r for r in records if r.image_id in wanted]
        trusted = [r for r in records if r.image_id not in wanted]
        skipped["test ids without an image in --refs"] = len(wanted - {r.image_id for r in records})
        evaluated = f"the ids of {test_ids_arg or 'the Karpathy test split'}"
    else:
        test = [r for r in records if r.split == split]
        trusted = [r for r in records if r.split in ("train", "restval")] or [r for r in records if r.split != split]
        evaluated = f"split '{split}'"
        if not test:
            splits = sorted({r.split for r in records})
            raise DataError(path, None, f"no image of split '{split}' (splits here: {splits}); "
                                        "choose --split or give --test-ids")
    refs = {}
    for r in test:
        if r.image_id in refs:
            raise DataError(path, f"image {r.image_id}", "listed twice")
        refs[r.image_id] = [t for t in r.raw if has_words(t)]
    skipped["test images without reference captions"] = sum(1 for rs in refs.values() if not rs)
    refs = {i: rs for i, rs in refs.items() if rs}
    if not refs:
        raise DataError(path, None, f"no test image with a reference caption ({evaluated})")
    return refs, trusted, skipped, evaluated


def load_long_refs(path) -> dict[int, dict[str, list[str]]]:
    """``{level: {image_id: [raw descriptions]}}`` from a Karpathy JSON whose sentences carry "level"."""
    data = read_json(path)
    records = load_karpathy(path, data=data)
    out: dict[int, dict[str, list[str]]] = {}
    for index, (item, record) in enumerate(zip(data["images"], records)):
        for j, sentence in enumerate(item["sentences"]):
            level = sentence.get("level")
            if isinstance(level, bool) or not isinstance(level, int):
                raise DataError(path, f"images[{index}] (image {record.image_id}) sentences[{j}]",
                                f"needs an integer 'level', got {level!r}")
            raw = sentence.get("raw") or " ".join(sentence.get("tokens") or [])
            if has_words(raw):  # (load_karpathy reported the others)
                out.setdefault(level, {}).setdefault(record.image_id, []).append(raw)
    return dict(sorted(out.items()))


def long_refs_for(path, refs, levels, skipped: dict) -> dict:
    """The long references of the test images at the levels of the level set (skips counted)."""
    if not path:
        return {}
    long_refs = load_long_refs(path)
    outside = {i for by_image in long_refs.values() for i in by_image if i not in refs}
    skipped["long-reference images not among the test images"] = len(outside)
    unused = [n for n in long_refs if not 1 <= n <= len(levels)]
    if unused:
        raise DataError(path, None, f"level(s) {unused} outside the level set 1..{len(levels)}")
    reason = "long-reference images not among the test images"
    if skipped[reason]:
        print(f"warning: left out {skipped[reason]} {reason}")
    return {n: {i: r for i, r in by_image.items() if i in refs} for n, by_image in long_refs.items()}
