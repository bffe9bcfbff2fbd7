"""Caption length statistics per level: the counting and the tables behind ``python -m clid.stats``
(:mod:`clid.stats`, whose docstring says what it reads and prints), and the paper's paragraph length bands."""
from __future__ import annotations

import numpy as np

from clid.base.text import caption_lengths, get_levels


def length_stats(lengths, levels="caption") -> dict:
    """Count, mean, standard deviation and the per-level histogram of caption lengths."""
    lengths = np.asarray(list(lengths), dtype=np.int64)
    levels = get_levels(levels)
    n = int(lengths.size)
    rows = []
    for index, (low, high) in enumerate(levels, 1):
        count = int(((lengths >= low) & (lengths <= high)).sum())
        rows.append({"level": index, "low": low, "high": high, "count": count,
                     "pct": round(100.0 * count / n, 3) if n else 0.0})
    above = int((lengths > levels[-1][1]).sum())
    below = int((lengths < levels[0][0]).sum())
    return {"n": n,
            "mean": round(float(lengths.mean()), 4) if n else 0.0,
            "std": round(float(lengths.std()), 4) if n else 0.0,
            "min": int(lengths.min()) if n else 0,
            "max": int(lengths.max()) if n else 0,
            "levels": rows,
            "below": below,
            "above": above}


# The paper's length shares of the Stanford paragraphs, in four bands of the 13 paragraph levels
# (levels 1-3, 4-6, 7-9 and 10-13): 2% up to 29 tokens, 32% at 30-59, 52% at 60-89, 14% at 90-129.
PAPER_PARAGRAPH_BANDS = (((1, 29), 2.0), ((30, 59), 32.0), ((60, 89), 52.0), ((90, 129), 14.0))


def paragraph_bands(lengths) -> list[dict]:
    """The share of paragraphs in each of the paper's four length bands, beside the paper's share."""
    lengths = np.asarray(list(lengths), dtype=np.int64)
    n = max(int(lengths.size), 1)
    return [{"low": low, "high": high, "count": int(((lengths >= low) & (lengths <= high)).sum()),
             "pct": round(100.0 * int(((lengths >= low) & (lengths <= high)).sum()) / n, 3), "paper_pct": paper}
            for (low, high), paper in PAPER_PARAGRAPH_BANDS]


def format_bands(bands: list[dict]) -> str:
    lines = ["paragraph bands (the paper's shares of the Stanford paragraphs beside this file's)",
             f"{'tokens':>9}  {'count':>9}  {'pct':>7}  {'paper':>7}"]
    for band in bands:
        lines.append(f"{band['low']:>4}-{band['high']:<4}  {band['count']:>9}  {band['pct']:>6.2f}%  {band['paper_pct']:>6.1f}%")
    return "\n".join(lines)


def format_table(stats: dict, title: str = "") -> str:
    lines = []
    if title:
        lines.append(title)
    lines.append(f"captions: {stats['n']}   length mean {stats['mean']:.2f}  std {stats['std']:.2f}  "
                 f"min {stats['min']}  max {stats['max']}")
    lines.append(f"{'level':>5}  {'tokens':>9}  {'count':>9}  {'pct':>7}")
    for row in stats["levels"]:
        lines.append(f"{row['level']:>5}  {row['low']:>4}-{row['high']:<4}  {row['count']:>9}  {row['pct']:>6.2f}%")
    n = max(stats["n"], 1)
    for name in ("below", "above"):
        if stats[name]:
            label = "< first" if name == "below" else "> last"
            lines.append(f"{label:>5}  {'':>9}  {stats[name]:>9}  {100.0 * stats[name] / n:>6.2f}%")
    return "\n".join(lines)


def above_note(stats: dict, levels) -> str | None:
    """A warning when more than the training stages' --max-left-out default of the captions are longer than the
    last level (04 and 06 would stop on such a file), naming --levels paragraph for what looks like paragraphs."""
    from clid.data.inputs import MAX_LEFT_OUT

    if not stats["n"] or stats["above"] <= MAX_LEFT_OUT * stats["n"]:
        return None
    last = get_levels(levels)[-1][1]
    hint = ": paragraphs? Give --levels paragraph" if get_levels(levels) != get_levels("paragraph") else ""
    return (f"warning: {stats['above']} of {stats['n']} captions ({100 * stats['above'] / stats['n']:.0f}%) are longer "
            f"than the last level ({last} tokens); training leaves them out, and stops on more than "
            f"{100 * MAX_LEFT_OUT:g}% (--max-left-out){hint}")


def file_lengths(path, split: str | None = None, tokenizer=None) -> list[int]:
    """Lengths of every caption in a supported caption file (optionally of one split, "train" with
    the Karpathy split's "restval"). A file without splits, or no caption at all, raises :class:`DataError`."""
    from clid.base.files import DataError
    from clid.data.captions import load_any
    from clid.data.splits import FORMAT_NAMES, PARAGRAPH_SPLIT_FIX, has_splits

    kind, _, records = load_any(path)
    if split is not None:
        if not has_splits(kind, records):
            fix = PARAGRAPH_SPLIT_FIX if kind == "paragraphs" else "convert it with `python -m clid.captions convert-coco`"
            raise DataError(path, None, f"this {FORMAT_NAMES[kind]} file has no splits, so --split {split} selects "
                                        f"nothing; {fix}, or leave out --split")
        present = sorted({r.split for r in records})
        records = [r for r in records if r.split in ({split, "restval"} if split == "train" else {split})]
        if not any(r.captions for r in records):
            raise DataError(path, None, f"no caption of split '{split}' (splits here: {present})")
    texts = [c for r in records for c in r.captions]
    if not texts:
        raise DataError(path, None, "no captions")
    # the loaders already preprocessed the text; paragraphs keep their "." sentence breaks
    return caption_lengths(texts, tokenizer, keep_sentences=True)
