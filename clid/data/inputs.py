"""Captions and region features as the models read them, shared by training (04, 06), scoring (05)
and evaluation (07).

- :class:`clid.data.examples.Examples` (the table every reader below returns);
- :class:`CaptionFiles`: the caption files of a run, each read, preprocessed and tokenised once (with
  ``cache``, the tokens of a JSONL file are kept beside it for the next run: clid/data/token_cache.py);
- :func:`training_items`: the trusted captions of the train split and the self-generated ones;
- :func:`usable` / :func:`make_examples`: the captions that can train (too-long captions counted, not hidden);
- :func:`training_examples` / :func:`report_skipped`: the examples of :func:`training_items`, every caption
  left out counted by reason, and the lines that report them;
- :func:`load_regions` / :func:`pad_regions`: one image's region inputs, a padded batch of them;
- :class:`RegionCache`: region features of the images, loaded once.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from clid.base.files import DataError, id_problem
from clid.base.text import FlatEncoder, caption_words, get_levels, keeps_sentences, length_levels
from clid.data.examples import Examples, text_digest, text_digests
from clid.data.store import FeatureStore
from clid.data.token_cache import tokenizer_digest


def tokenize_table(caption_ids: list[str], image_ids: list[str], texts, tokenizer, keep_sentences: bool,
                   source: str, preprocessed: bool = False) -> Examples:
    """Every caption of a file as :class:`Examples` (levels 0: see :func:`usable`). ``preprocessed``: the texts
    are the loaders' preprocessed captions (words and "." only), so they are split, not preprocessed again."""
    texts = list(texts)
    encoder = FlatEncoder(tokenizer)
    for text in texts:
        if preprocessed:
            words = text.split()
            encoder.add(words if keep_sentences else [w for w in words if w != "."])
        else:
            encoder.add(caption_words(text, keep_sentences))
    token_ids, offsets = encoder.finish()
    return Examples(image_ids, caption_ids, token_ids, offsets, np.zeros(len(texts), np.int64), [source] * len(texts),
                    text_digests(texts))


def usable(table: Examples, levels, source: str, features: FeatureStore | None = None) -> tuple[Examples, Counter]:
    """The captions of ``table`` that can be trained on or scored, with their levels, and the skip counts by
    reason: no word left after preprocessing, a length outside the levels, no region features for the image
    (checked in that order)."""
    lengths = table.lengths
    found = length_levels(lengths, levels)
    wordless = lengths == 1  # only the final ".": no word was left after preprocessing
    outside = ~wordless & (found == 0)
    keep = ~wordless & ~outside
    if features is not None:
        candidates = np.flatnonzero(keep).tolist()
        image_ids = table.image_ids
        with_features = {i: i in features for i in dict.fromkeys(image_ids[k] for k in candidates)}
        keep[candidates] = [with_features[image_ids[k]] for k in candidates]
    skipped = Counter()
    if wordless.any():
        skipped[f"{source}: no word left after preprocessing"] = int(wordless.sum())
    values, first, counts = np.unique(lengths[outside], return_index=True, return_counts=True)
    for k in np.argsort(first):  # (in the order the lengths first appear)
        skipped[f"{source}: length {values[k]} outside the levels"] = int(counts[k])
    if n_missing := int((~wordless & ~outside & ~keep).sum()):
        skipped[f"{source}: no region features for the image"] = n_missing
    return replace(table.select(keep), levels=found[keep]), skipped


def make_examples(items: list[tuple[str, str, str]], tokenizer, levels, source: str,
                  features: FeatureStore | None = None) -> tuple[Examples, Counter]:
    """Tokenise ``(caption id, image id, text)`` triples. Returns the examples and skip counts by reason.

    With the paragraph levels, sentence breaks stay in the text as "." tokens (they count).
    """
    table = tokenize_table([str(c) for c, _, _ in items], [str(i) for _, i, _ in items], [t for _, _, t in items],
                           tokenizer, keeps_sentences(levels), source)
    return usable(table, levels, source, features)


# ---------------------------------------------------------------------------------------------
# The share of the data left out: more than --max-left-out stops the run with one line

MAX_LEFT_OUT = 0.05  # the default of --max-left-out


def add_left_out_arg(parser) -> None:
    from clid.run.cli import unit_interval

    parser.add_argument("--max-left-out", type=unit_interval, default=MAX_LEFT_OUT, metavar="SHARE",
                        help="stop when more than this share of the trusted, or of the self-generated, captions would "
                             "be left out (no region features, no word left, a length outside the levels; "
                             "self-generated captions longer than the last level, and of images outside the training "
                             "split, are left out by design and not counted); 1: never stop")


def add_token_cache_arg(parser) -> None:
    parser.add_argument("--token-cache", action="store_true",
                        help="keep the tokens of the self-generated captions beside their file (FILE.tokens-LEVELS.npz) "
                             "and read them from there in the next run of 04, 05 or 06, rebuilt when the file, the "
                             "tokenizer or the levels change; without it, every run tokenises the file")


def counts_as_lost(reason: str) -> bool:
    """Whether a skip reason of :func:`make_examples` / :func:`training_items` is data lost (counted against
    --max-left-out), not a caption left out by design."""
    source, _, why = reason.partition(": ")
    return not (why == "image not in the training split" or (source == "selfgen" and why.endswith("outside the levels")))


def check_left_out(source: str, offered: int, skipped: Counter, max_share: float, path, image_ids=None,
                   features: FeatureStore | None = None, levels=None) -> None:
    """A DataError (how many, why, and a likely cause) when more than ``max_share`` of the ``offered``
    captions of ``source`` were left out for reasons that count (:func:`counts_as_lost`).

    ``image_ids`` (the captions' images) and ``features`` show a few caption image ids beside a few
    feature ids when most are missing features (an id-scheme mismatch); ``levels`` names
    ``--levels paragraph`` when most are longer than the last level.
    """
    lost = {reason: n for reason, n in skipped.items() if reason.startswith(source + ": ") and counts_as_lost(reason)}
    total = sum(lost.values())
    if not offered or total <= max_share * offered:
        return
    outside = {int(r.split("length ")[1].split()[0]): n for r, n in lost.items() if r.endswith("outside the levels")}
    grouped = Counter()
    for reason, n in lost.items():
        why = reason.split(": ", 1)[1]
        grouped["length outside the levels" if why.endswith("outside the levels") else why] += n
    why = ", ".join(f"{n} {reason}" for reason, n in grouped.most_common())
    main = grouped.most_common(1)[0][0]
    hint = ""
    if main.startswith("no region features") and image_ids is not None and features is not None:
        missing = []
        for image_id in image_ids:
            if not features.holds(image_id) and str(image_id) not in missing:
                missing.append(str(image_id))
                if len(missing) == 3:
                    break
        if missing:
            hint = (f". Its images are named {', '.join(missing)}, the feature file's {', '.join(features.ids()[:3])}: do "
                    "the captions and the features use one id scheme (COCO ids, VG ids, file names)?")
        elif bad := features.bad_images:
            first = next(iter(bad))
            hint = f". {len(bad)} image(s) have bad region features (--bad-features skip), e.g. image {first}: {bad[first]}"
    elif main == "length outside the levels" and levels is not None:
        last = get_levels(levels)[-1][1]
        longer = sum(n for length, n in outside.items() if length > last)
        if longer > total / 2:
            caption_levels = get_levels(levels) != get_levels("paragraph")
            hint = (f". {longer} are longer than the last level ({last} tokens)"
                    + (": paragraphs? Give --levels paragraph" if caption_levels else ""))
    elif main.startswith("no word left"):
        hint = ". The preprocessing keeps words of a-z and 0-9 (accents folded): is the text in another script?"
    raise DataError(path, None, f"{total} of {offered} {source} captions ({100 * total / offered:.0f}%) would be left "
                                f"out ({why}), more than --max-left-out {max_share:g} (a larger share goes on with "
                                f"the rest){hint}")


class CaptionFiles:
    """The caption files of one run, each read, preprocessed and tokenised once (per tokenizer; the sentence
    breaks kept as ``levels`` say): :meth:`table` holds every caption of a file, :meth:`records` a caption
    JSON's records. With ``cache``, a JSONL file's table is kept beside it (clid/data/token_cache.py)."""

    def __init__(self, levels="caption", cache: bool = False):
        self.levels, self.cache = get_levels(levels), cache
        self._records: dict[Path, tuple] = {}
        self._tables: dict[tuple, tuple[Examples, tuple | None]] = {}

    def records(self, path) -> tuple:
        """(records, format, whether the images are COCO images) of a caption file (:func:`split_info`)."""
        from clid.data.splits import split_info

        key = Path(path).resolve()
        if key not in self._records:
            self._records[key] = split_info(path)
        return self._records[key]

    def table(self, path, tokenizer) -> Examples:
        """Every caption of the file, tokenised: :meth:`selfgen_table` for our JSONL, else :meth:`trusted_table`."""
        jsonl = str(path).endswith(".jsonl") or self.records(path)[1] == "jsonl"
        return self.selfgen_table(path, tokenizer) if jsonl else self.trusted_table(path, tokenizer)

    def trusted_table(self, path, tokenizer) -> Examples:
        """Every caption of every image of a caption file (:meth:`records`), tokenised; caption j of image i is
        ``i#j``."""
        key = ("trusted", Path(path).resolve(), tokenizer_digest(tokenizer))
        if key not in self._tables:
            records = self.records(path)[0]
            self._tables[key] = (tokenize_table(
                [f"{r.image_id}#{j}" for r in records for j in range(len(r.captions))],
                [r.image_id for r in records for _ in r.captions], (text for r in records for text in r.captions),
                tokenizer, keeps_sentences(self.levels), "trusted", preprocessed=True), None)
        return self._tables[key][0]

    def selfgen_table(self, path, tokenizer) -> Examples:
        """Every record of our JSONL captions, tokenised; its records need not have an ``id`` here (see
        :meth:`check_ids`)."""
        return self._selfgen(path, tokenizer)[0]

    def check_ids(self, path, tokenizer) -> None:
        """Refuse a JSONL file with a record whose ``id`` is missing or not a string or an integer."""
        if fault := self._selfgen(path, tokenizer)[1]:
            record, problem = fault
            with open(path, "rb") as f:  # the line of the record-th record (blank lines hold none)
                line = next(n for n, text in enumerate(f, 1) if text.strip() and (record := record - 1) == 0)
            raise DataError(path, f"line {line}", problem)

    def _selfgen(self, path, tokenizer) -> tuple[Examples, tuple | None]:
        key = ("selfgen", Path(path).resolve(), tokenizer_digest(tokenizer))
        if key not in self._tables:
            self._tables[key] = self._jsonl_table(path, tokenizer)
        return self._tables[key]

    def _jsonl_table(self, path, tokenizer) -> tuple[Examples, tuple | None]:
        """(table, (record number, problem) of the first record without a valid id, or None), from the cache if
        asked."""
        from clid.data import token_cache
        from clid.run.runs import file_state

        if not self.cache:
            return read_jsonl_table(path, tokenizer, keeps_sentences(self.levels))
        before, key = file_state(path), token_cache.cache_key(path, tokenizer, self.levels)
        if (found := token_cache.load(path, key, len(tokenizer))) is not None:
            return found
        found = read_jsonl_table(path, tokenizer, keeps_sentences(self.levels))
        if file_state(path) == before:  # (a file rewritten while it was read is not cached)
            token_cache.save(path, key, *found)
        return found


PROGRESS_FROM = 100_000  # lines of a JSONL file read with a progress bar
PARALLEL_FROM = 200_000  # lines of a JSONL file read by several processes, where there are cores for them


def read_jsonl_table(path, tokenizer, keep_sentences: bool) -> tuple[Examples, tuple | None]:
    """Every record of our JSONL captions (``id``, ``image_id``, ``caption``), tokenised, and (record number,
    problem) of the first record without a valid ``id`` (None when every record has one). A long file is
    read by several processes (clid/data/parallel_read.py), a file with a fault by this one."""
    from clid.base.files import check_unchanged, read_jsonl, read_state
    from clid.base.progress import Progress
    from clid.data import parallel_read

    caption_ids, image_ids, digests, names = [], [], [], {}
    encoder, id_fault = FlatEncoder(tokenizer), None
    with open(path, "rb") as f:  # (the bar's total: lines, counted fast)
        lines = sum(block.count(b"\n") for block in iter(lambda: f.read(1 << 24), b""))
    found = None
    if lines >= PARALLEL_FROM and parallel_read.processes() > 1:
        try:
            with Progress(lines, f"reading {Path(path).name} ({parallel_read.processes()} processes)", "line") as bar:
                found = parallel_read.read_parts(path, tokenizer, keep_sentences, bar.update)
        except OSError as err:  # (no process could start: read by this one, as on one core)
            print(f"note: {path}: cannot start the reading processes ({err.strerror or err}); this process reads "
                  "the file alone", flush=True)
        if found is not None:
            caption_ids, image_ids, token_ids, offsets, digests = found
            n = len(caption_ids)
            return Examples(image_ids, caption_ids, token_ids, offsets, np.zeros(n, np.int64), ["selfgen"] * n,
                            digests), None
    before = read_state(path)
    with Progress(lines, f"reading {Path(path).name}", "line", disable=lines < PROGRESS_FROM) as bar:
        for record in read_jsonl(path, required=("image_id", "caption"), unique_id=True):
            caption_id = record.get("id")
            if id_fault is None and (problem := "missing key(s) ['id']" if caption_id is None and "id" not in record
                                     else id_problem(caption_id)):
                id_fault = (len(caption_ids) + 1, problem if problem.startswith("missing") else f"'id' {problem}")
            image_id = str(record["image_id"])
            caption_ids.append(str(caption_id))
            image_ids.append(names.setdefault(image_id, image_id))  # (one string per image)
            encoder.add(caption_words(record["caption"], keep_sentences))
            digests.append(text_digest(record["caption"]))
            if len(digests) % 10_000 == 0:
                bar.update(10_000)
    check_unchanged(path, before)
    token_ids, offsets = encoder.finish()
    n = len(caption_ids)
    table = Examples(image_ids, caption_ids, token_ids, offsets, np.zeros(n, np.int64), ["selfgen"] * n,
                     np.array(digests, dtype=np.uint64))
    return table, id_fault


@dataclass
class CaptionItems:
    """Training captions, tokenised: trusted (train split), self-generated (of train-split images), validation."""

    trusted: Examples
    selfgen: Examples
    val_ids: list[str]  # validation images (for the quick control-precision check)
    skipped: Counter
    notes: list[str] = field(default_factory=list)  # what the split guard held out
    val: Examples = field(default_factory=Examples)  # the validation images' trusted captions
    filenames: dict[str, str] = field(default_factory=dict)  # image id -> image file name (train and val images)

    def offered(self, source: str) -> int:
        """The captions of ``source`` ("trusted", "selfgen") the files hold: those kept and those left out here."""
        return len(getattr(self, source)) + sum(n for r, n in self.skipped.items() if r.startswith(source + ": "))

    def check_left_out(self, skipped: Counter, max_share: float, captions_path, selfgen_path, features, levels) -> None:
        """:func:`check_left_out` for the trusted and the self-generated captions (``skipped``: every skip count)."""
        check_left_out("trusted", self.offered("trusted"), skipped, max_share, captions_path, self.trusted.image_ids,
                       features, levels)
        check_left_out("selfgen", self.offered("selfgen"), skipped, max_share, selfgen_path, self.selfgen.image_ids,
                       features, levels)


def training_items(captions_path, selfgen_path=None, test_ids=None, split_check: bool = True,
                   files: CaptionFiles | None = None, tokenizer=None) -> CaptionItems:
    """Trusted captions of the train split (Karpathy "restval" included) and the self-generated
    captions of train-split images; self-generated captions of other images are counted, not used.
    The split guard (:func:`clid.data.splits.training_records`) refuses files that would train on test images.
    ``files``: the run's :class:`CaptionFiles` (default: caption levels); ``tokenizer``: the model's (default:
    the offline one)."""
    from clid.base.text import load_tokenizer
    from clid.data.records import report_wordless
    from clid.data.splits import training_records

    files, tokenizer = files or CaptionFiles(), tokenizer or load_tokenizer()
    train, val, notes = training_records(captions_path, test_ids, split_check, files.records(captions_path))
    table = files.trusted_table(captions_path, tokenizer)
    train_ids, val_ids = {r.image_id for r in train}, {r.image_id for r in val}
    skipped = Counter()
    if n := sum(r.wordless for r in train):  # (the loader warned, naming them)
        skipped["trusted: no word left after preprocessing"] = n
    selfgen = Examples()
    if selfgen_path:
        files.check_ids(selfgen_path, tokenizer)
        pool = files.selfgen_table(selfgen_path, tokenizer)
        wordless = pool.lengths == 1
        in_train = np.fromiter((i in train_ids for i in pool.image_ids), dtype=bool, count=len(pool))
        if wordless.any():
            skipped["selfgen: no word left after preprocessing"] = int(wordless.sum())
            report_wordless(selfgen_path, [f"caption {pool.caption_ids[k]}" for k in np.flatnonzero(wordless)])
        if n_other := int((~wordless & ~in_train).sum()):
            skipped["selfgen: image not in the training split"] = n_other
        selfgen = pool.select(~wordless & in_train)
    def captions_of(ids: set) -> Examples:
        return table.select(np.fromiter((i in ids for i in table.image_ids), dtype=bool, count=len(table)))

    filenames = {r.image_id: r.filename for r in (*train, *val)}
    return CaptionItems(captions_of(train_ids), selfgen, [r.image_id for r in val], skipped, notes, captions_of(val_ids),
                        filenames)


def caption_texts(caption_ids: list[str], records, selfgen_path, digests=None) -> list[str]:
    """The text of each caption id: a trusted caption's (``i#j``, of ``records``) as preprocessed, a
    self-generated one's as written in ``selfgen_path`` (read again: the tables keep tokens, not text).
    ``digests`` (the table's :func:`text_digest` of each caption): a file changed since the table was read
    is refused, never mixed."""
    from clid.base.files import read_jsonl

    texts = {f"{r.image_id}#{j}": text for r in records for j, text in enumerate(r.captions)}
    wanted = set(caption_ids) - texts.keys()
    texts.update((str(r["id"]), r["caption"]) for r in read_jsonl(selfgen_path, required=("id", "image_id", "caption"))
                 if str(r["id"]) in wanted)
    missing = next((c for c in caption_ids if c not in texts), None)
    changed = missing or next((c for c, d in zip(caption_ids, digests if digests is not None else ())
                               if text_digest(texts[c]) != int(d)), None)
    if changed is not None:
        raise DataError(selfgen_path, f"caption {changed}", "the file changed since this run read it (its text is "
                                                            "not the one trained on); run again once nothing writes it")
    return [texts[c] for c in caption_ids]


def training_examples(items: CaptionItems, levels, features: FeatureStore) -> tuple[Examples, Examples, Counter]:
    """(trusted examples, self-generated examples, skip counts by reason) of ``items``; the counts include
    those of ``items`` itself."""
    trusted, skipped = usable(items.trusted, levels, "trusted", features)
    selfgen, selfgen_skipped = usable(items.selfgen, levels, "selfgen", features)
    skipped.update(items.skipped + selfgen_skipped)
    return trusted, selfgen, skipped


def report_skipped(skipped: Counter, features: FeatureStore, word: str = "skipped") -> None:
    """Print each skip count (``  skipped N: reason``, by reason; the lengths outside the levels of one
    source in one line, ``length: count`` each), then the images of ``features`` with bad region features."""
    lengths: dict[str, dict[int, int]] = {}  # source -> {length: count}
    for reason, count in sorted(skipped.items()):
        source, _, why = reason.partition(": ")
        if why.startswith("length ") and why.endswith(" outside the levels"):
            lengths.setdefault(source, {})[int(why.split()[1])] = count
        else:
            print(f"  {word} {count}: {reason}")
    for source, counts in lengths.items():
        table = ", ".join(f"{length}: {n}" for length, n in sorted(counts.items()))
        print(f"  {word} {sum(counts.values())}: {source}: a length outside the levels (tokens: captions) {table}")
    if bad_line := features.skip_report():
        print(f"  {bad_line}")
