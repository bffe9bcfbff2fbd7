"""07's report: metrics tables in report.md and the plots (control precision, quality against
control precision per level as the paper's Figure 5, length histograms).

A *method* is one or more runs (e.g. seeds) evaluated alike; its row per level holds each number's
mean over the runs that have it, and ``<number>_std``, the sample standard deviation (ddof 1), when
two or more runs have it. The report writes ``mean ± std``; a method of one run shows its value.

It also names 07's runs (:func:`run_list`, :func:`run_ids`), reports which images each run captions
(:func:`report_coverage`) and says which files 07 writes into its folder (:func:`eval_files`).
"""
from __future__ import annotations

import os
import statistics
from pathlib import Path

from clid.base.files import (
    WRITTEN,
    DataError,
    atomic_path,
    name_problem,
    natural_key,
    not_written,
    write_json,
    written_record,
)
from clid.base.text import caption_lengths
from clid.evaluation.metrics import QUALITY_METRICS

# The paper's Table 1: control precision (%) at the 7 caption levels, and their average (COCO)
PAPER_TABLE1 = {"LaBERT (the paper's COCO numbers, for reference)": (100, 98.03, 93.75, 83.78, 49.92, 51.19, 0, 68.10),
                "CLID (the paper's COCO numbers, for reference)": (100, 98.64, 92.6, 84.17, 76.99, 69.18, 22.13, 77.67)}
CIDER_NOTE = ("CIDEr at the long levels is depressed by its length penalty (CIDEr-D multiplies each "
              "reference's similarity by exp(-d^2 / 72), d the difference in words) against the short "
              "references (COCO's are about 10 words): a correct 40-token caption loses most of its CIDEr. "
              "This is why the paper reads SPICE across the levels (its Figure 5).")

FIGURES = ("control_precision.png", "quality_vs_control.png", "length_histograms.png")
PER_IMAGE = "per_image.jsonl"  # each run's per-image values, for --combine's intervals (clid.evaluation.intervals)
MARKERS = "osD^vP"


# ---------------------------------------------------------------------------------------------
# Report

def fmt(value, scale=1.0, digits=1) -> str:
    return "–" if value is None else f"{value * scale:.{digits}f}"


def level_header(levels, numbers) -> str:
    cols = [f"L{n} ({levels[n - 1][0]}-{levels[n - 1][1]})" for n in numbers]
    return "| run | " + " | ".join(cols) + " |\n|---|" + "---:|" * len(cols) + "\n"


def summarise_runs(rows: list[dict]) -> dict:
    """One method's row from its runs' rows: mean of each number over the runs that have it, and
    ``<name>_std`` (sample standard deviation) when two or more have it; a single run's row as is."""
    if len(rows) == 1:
        return dict(rows[0])
    out = {"n_runs": len(rows)}
    for key in rows[0]:
        values = [r.get(key) for r in rows if isinstance(r.get(key), (int, float))]
        out[key] = statistics.fmean(values) if values else None
        if len(values) > 1:
            out[f"{key}_std"] = statistics.stdev(values)
    return out


def method_results(methods: dict[str, list[str]], results: dict) -> dict:
    """``{method: {"runs", "levels": {L: row}, "long_refs": {L: row}, "average": row}}`` (see the
    module docstring); ``average``: control precision averaged over the levels, per run, then summarised."""
    out = {}
    for name, runs in methods.items():
        entry = {"runs": list(runs)}
        for part in ("levels", "long_refs"):
            numbers = sorted({n for run in runs for n in results[run][part]})
            entry[part] = {n: summarise_runs([results[run][part][n] for run in runs if n in results[run][part]])
                           for n in numbers}
        averages = []
        for run in runs:
            shares = [row["control_precision"] for row in results[run]["levels"].values()]
            averages.append({"control_precision": sum(shares) / len(shares) if None not in shares else None})
        entry["average"] = summarise_runs(averages)
        out[name] = entry
    return out


def cell(row, field, scale=1.0, digits=1) -> str:
    """``mean ± std`` of a method's row, or its value."""
    text = fmt(row.get(field), scale, digits)
    std = row.get(f"{field}_std")
    return text if std is None else f"{text} ± {std * scale:.{digits}f}"


def count(value) -> str:
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.1f}"


def table(title, runs, table_key, field, levels, numbers, scale=1.0, digits=1, counts=False) -> str:
    text = f"**{title}**\n\n" + level_header(levels, numbers)
    for name, result in runs.items():
        cells = []
        for n in numbers:
            row = result[table_key].get(n)
            if row is None:
                cells.append("–")
            elif counts:
                cells.append(f"{count(row['n_scored'])}/{count(row['n_images'])}")
            else:
                cells.append(cell(row, field, scale, digits))
        text += f"| {name} | " + " | ".join(cells) + " |\n"
    return text + "\n"


def paper_table(methods, levels) -> str:
    """Control precision per level and on average, with the paper's COCO numbers (Table 1) for reference."""
    numbers = list(range(1, len(levels) + 1))
    text = ("**Control precision (%), with the paper's COCO numbers for reference** (its Table 1: the COCO "
            "Karpathy test split, the mean of 3 runs; not measured on these test images, so they compare "
            "only with a COCO run)\n\n")
    text += level_header(levels, numbers).replace(" |\n|---|", " | average |\n|---|---:|", 1)
    for name, result in methods.items():
        cells = [cell(result["levels"][n], "control_precision", 100) for n in numbers]
        text += f"| {name} | " + " | ".join(cells + [cell(result["average"], "control_precision", 100)]) + " |\n"
    for name, values in PAPER_TABLE1.items():
        text += f"| {name} | " + " | ".join(f"{v:.2f}" for v in values) + " |\n"
    return text + "\n"


def side_by_side(methods, levels) -> str:
    """One row per method: control precision at every level, CIDEr at L1 and L2 (trusted references),
    and CIDEr against the long references at their levels (mean ± std over a method's runs, x100)."""
    numbers = list(range(1, len(levels) + 1))
    long_numbers = sorted({n for r in methods.values() for n in r["long_refs"]})
    short = [n for n in (1, 2) if n in numbers]
    cols = ([f"CP L{n}" for n in numbers] + [f"CIDEr L{n}" for n in short]
            + [f"CIDEr long L{n}" for n in long_numbers])
    text = ("**Side by side** (CP: control precision, %; CIDEr x100 on the in-range captions, against the trusted "
            "references at L1-L2 and against the long references at their levels)\n\n")
    text += "| method | " + " | ".join(cols) + " |\n|---|" + "---:|" * len(cols) + "\n"
    for name, result in methods.items():
        cells = [cell(result["levels"][n], "control_precision", 100) for n in numbers]
        cells += [cell(result["levels"][n], "CIDEr", 100) for n in short]
        cells += [cell(result["long_refs"][n], "CIDEr", 100) if n in result["long_refs"] else "–" for n in long_numbers]
        text += f"| {name} | " + " | ".join(cells) + " |\n"
    return text + "\n"


def iv_cell(iv, scale=100.0, digits=1) -> str:
    """``value [low, high]`` of an interval (:func:`clid.evaluation.intervals.interval`), or its value alone."""
    if not iv or iv.get("value") is None:
        return "–"
    text = f"{iv['value'] * scale:.{digits}f}"
    return text if iv["low"] is None else f"{text} [{iv['low'] * scale:.{digits}f}, {iv['high'] * scale:.{digits}f}]"


def interval_columns(intervals, levels) -> list[tuple[str, str, int | None]]:
    """The columns of the interval tables: (title, kind, level): control precision at every level and on
    average, CIDEr at the short levels, CIDEr against the long references at their levels."""
    from clid.evaluation.intervals import SHORT_QUALITY

    rows = [*intervals["methods"].values(), *intervals["differences"].values()]
    longs = sorted({int(n) for r in rows for n in r["long"]})
    return ([(f"CP L{n}", "cp", n) for n in range(1, len(levels) + 1)] + [("CP average", "cp_average", None)]
            + [(f"CIDEr L{n}", "cider", n) for n in SHORT_QUALITY if n <= len(levels)]
            + [(f"CIDEr long L{n}", "long", n) for n in longs])


def interval_table(rows: dict, columns) -> str:
    text = "| method | " + " | ".join(c for c, _, _ in columns) + " |\n|---|" + "---:|" * len(columns) + "\n"
    for name, row in rows.items():
        cells = [iv_cell(row[kind] if n is None else row[kind].get(n, row[kind].get(str(n)))) for _, kind, n in columns]
        text += f"| {name} | " + " | ".join(cells) + " |\n"
    return text


def claim_lines(claims) -> list[str]:
    """A line per claim: its verdict, what it says, and the interval that decides it."""
    lines = []
    for c in claims:
        if c["kind"] == "ratio":
            shown = "; ".join(f"L{n}: {iv_cell(iv, 100, 0)}%" for n, iv in c["levels"].items())
            decided = f"{c['statistic']}: {shown} (bound {c['bound']:.0%})"
        else:
            decided = f"{c['statistic']}: {iv_cell(c['interval'])} (x100; bound 0)"
        lines.append(f"- **({c['claim']}) {c['verdict']}**: {c['text']}. {decided}.")
    return lines


def interval_section(intervals, levels) -> list[str]:
    """report.md's intervals, differences against CLID and the paper's claims (07 --combine)."""
    from clid.evaluation.intervals import REFERENCE

    b = intervals["bootstrap"]
    columns = interval_columns(intervals, levels)
    lines = ["## 95% intervals and the paper's claims\n",
             f"Each number is the mean over the {len(b['seeds'])} seeds (evaluation folders), x100, with its 95% "
             f"interval: a bootstrap of {b['resamples']} resamples (numpy seed {b['seed']}) that draws the seeds with "
             "replacement, then each drawn seed's test images with replacement "
             f"({', '.join(map(str, b['images']))} images); percentile interval. Every method is measured on the same "
             "draw, so a difference is paired by seed and image. CIDEr: the mean of the in-range captions' per-image "
             "CIDEr (their document frequencies those of the subset 07 scored).\n",
             "### The claims\n",
             "Held: the interval lies beyond the claim's bound; not held: it lies on the other side; undecided: it "
             "holds the bound.\n", *claim_lines(intervals["claims"]), "",
             "### Each method\n", interval_table(intervals["methods"], columns)]
    if intervals["differences"]:
        lines += [f"### Each method minus {REFERENCE}, paired by seed and image\n",
                  interval_table(intervals["differences"], columns)]
    return lines


def keyed_intervals(intervals: dict) -> dict:
    """The intervals with their level keys as text (JSON)."""
    def keyed(rows):
        return {kind: ({str(n): iv for n, iv in v.items()} if kind in ("cp", "cider", "long") else v)
                for kind, v in rows.items()}

    claims = [dict(c, levels={str(n): iv for n, iv in c["levels"].items()}) if "levels" in c else c
              for c in intervals["claims"]]
    return dict(intervals, methods={m: keyed(r) for m, r in intervals["methods"].items()},
                differences={m: keyed(r) for m, r in intervals["differences"].items()}, claims=claims)


QUALITY_TITLES = {"Bleu_1": "BLEU-1", "Bleu_2": "BLEU-2", "Bleu_3": "BLEU-3", "Bleu_4": "BLEU-4",
                  "METEOR": "METEOR", "ROUGE_L": "ROUGE-L", "CIDEr": "CIDEr", "SPICE": "SPICE"}


def write_report(path, meta, results, generated, refs, long_refs, levels, example_ids, lengths_of, figures=FIGURES,
                 intervals=None):
    """report.md. ``results``: per method (:func:`method_results`); ``generated`` and ``lengths_of``:
    the captions and counted lengths of each method's first run (the examples); ``intervals`` (07 --combine):
    :func:`clid.evaluation.intervals.method_intervals`' result, or a line saying why there are none."""
    numbers = sorted({n for result in results.values() for n in result["levels"]})  # (without refs: those asked for)
    scored = "in-range captions" if meta["score_captions"] == "in-range" else "all captions"
    images = (f"{meta['n_test_images']} test images (`{meta['refs']}`, {meta['evaluated']})" if refs is not None
              else f"{meta['n_test_images']} images ({meta['evaluated']})")
    several = any(len(result["runs"]) > 1 for result in results.values())
    lines = ["# Length-controlled captioning: evaluation\n",
             f"{images}, {meta['level_set']} levels. Methods "
             + ("(several runs: mean ± sample standard deviation over the runs):\n" if several else
                "(one run each: its own values):\n")]
    for name, result in results.items():
        runs = result["runs"]
        lines.append(f"- **{name}**" + (f" ({len(runs)} runs)" if len(runs) > 1 else "") + ": "
                     + "; ".join(meta["runs"][run]["source"] for run in runs))
    counted = ("a caption that filled its level without \".\" counts one more, the \".\" (--length-count strict)"
               if meta["length_count"] == "strict" else
               "a caption that filled its level without \".\" counts its tokens only, as the authors' code does")
    lines += ["",
              "Control precision: share of all evaluated images whose caption length (WordPiece tokens of "
              f"the preprocessed caption plus the final \".\"; {counted}) falls inside the requested level; a "
              "missing caption is a miss. Length error: mean distance in tokens to the level's range (0 inside). "
              "Distinct-n: unique n-grams / all n-grams of the level's captions (x100)."]
    if refs is None:
        lines.append("\nNo references were given (--refs), so there are no quality scores.\n")
    else:
        lines += [f"Quality scores (pycocoevalcap, PTB tokenizer, x100) are computed on the {scored} of each level "
                  "only, against that level's subset of images; CIDEr's document frequencies therefore come from "
                  "that subset, and few scored captions make it noisy.", f"\nSPICE: {meta['spice']}\n"]
    skipped = {k: v for k, v in meta["skipped"].items() if v}
    for run in meta["runs"]:
        skipped.update({f"{run}: {k}": v for k, v in meta["runs"][run]["skipped"].items() if v})
    if skipped:
        lines.append("Left out: " + "; ".join(f"{k}: {v}" for k, v in skipped.items()) + "\n")

    if isinstance(intervals, dict):
        lines += interval_section(intervals, levels)
    elif intervals:
        lines.append(f"No intervals: {intervals}.\n")
    if len(results) > 2 and refs is not None:
        lines.append("## Side by side\n")
        lines.append(side_by_side(results, levels))
    lines.append("## Length control\n")
    if meta["level_set"] == "caption" and refs is not None:
        lines.append(paper_table(results, levels))
    lines.append(table("Control precision (%)", results, "levels", "control_precision", levels, numbers, 100))
    lines.append(table("Length error (tokens)", results, "levels", "length_error", levels, numbers, 1, 2))
    lines.append(table("Mean caption length (tokens)", results, "levels", "mean_length", levels, numbers))
    if refs is not None:
        lines.append(table("Scored captions / test images", results, "levels", None, levels, numbers, counts=True))
        lines.append(f"## Quality on the {scored} (x100)\n")
        lines.append(CIDER_NOTE + "\n")
    for metric in QUALITY_METRICS if refs is not None else ():
        if metric == "SPICE" and not any(r["levels"][n].get("SPICE") is not None for r in results.values() for n in numbers):
            lines.append("**SPICE**: n/a (see above)\n")
            continue
        lines.append(table(QUALITY_TITLES[metric], results, "levels", metric, levels, numbers, 100))
    lines.append("## Diversity (x100)\n")
    lines.append(table("Distinct-1", results, "levels", "distinct_1", levels, numbers, 100))
    lines.append(table("Distinct-2", results, "levels", "distinct_2", levels, numbers, 100))

    long_numbers = sorted({n for r in results.values() for n in r["long_refs"]})
    if long_numbers:
        lines.append(f"## Against the long references (levels {long_numbers[0]}-{long_numbers[-1]}, x100)\n")
        lines.append(f"Each level's {scored} scored against the long references of that level only.\n")
        lines.append(table("Scored captions / test images with long references", results, "long_refs", None,
                           levels, long_numbers, counts=True))
        for metric in ("CIDEr", "Bleu_4", "METEOR", "ROUGE_L", "SPICE"):
            if metric == "SPICE" and not any(r["long_refs"][n].get("SPICE") is not None
                                             for r in results.values() for n in long_numbers):
                continue
            lines.append(table(QUALITY_TITLES[metric], results, "long_refs", metric, levels, long_numbers, 100))

    lines.append("## Plots\n")
    lines += [f"![{f}]({f})\n" for f in figures]

    lines.append("## Example captions\n")
    for image_id in example_ids:
        lines.append(f"### Image {image_id}\n")
        lines += [f"- reference: {r}" for r in (refs or {}).get(image_id, [])[:3]]
        for n, by_image in long_refs.items():
            if by_image.get(image_id):
                lines.append(f"- long reference, level {n}: {by_image[image_id][0]}")
        lines.append("\n| level | " + " | ".join(results) + " |\n|---|" + "---|" * len(results))
        for n in numbers:
            cells = []
            for name in results:
                caption = generated[name].get(n, {}).get(image_id)
                length = lengths_of[name].get((n, image_id))
                if caption is None:
                    cells.append("(no caption)")
                    continue
                inside = length is not None and levels[n - 1][0] <= length <= levels[n - 1][1]
                cells.append(f"{caption.replace('|', '/')} *({length} tokens{'' if inside else ', out of range'})*")
            lines.append(f"| {n} ({levels[n - 1][0]}-{levels[n - 1][1]}) | " + " | ".join(cells) + " |")
        lines.append("")
    with atomic_path(path) as tmp:
        tmp.write_text("\n".join(lines) + "\n")


# ---------------------------------------------------------------------------------------------
# Plots

def save_figure(fig, path) -> None:
    import matplotlib.pyplot as plt

    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)


def plot_control_precision(path, results, levels) -> None:
    import matplotlib.pyplot as plt
    import numpy as np

    numbers = np.array(sorted({n for result in results.values() for n in result["levels"]}))  # (levels asked for)
    width = 0.8 / len(results)
    fig, ax = plt.subplots(figsize=(1.2 + 1.1 * len(numbers), 3.6))
    for k, (name, result) in enumerate(results.items()):
        rows = [result["levels"].get(n, {}) for n in numbers]
        values = [100 * (row.get("control_precision") or 0.0) for row in rows]
        spread = [100 * (row.get("control_precision_std") or 0.0) for row in rows]  # the runs' standard deviation
        ax.bar(numbers - 0.4 + width * (k + 0.5), values, width, label=name,
               yerr=spread if any(spread) else None, capsize=2)
    ax.set_xticks(numbers, [f"L{n}\n{levels[n - 1][0]}-{levels[n - 1][1]}" for n in numbers])
    ax.set_ylabel("control precision (%)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize="small")
    ax.set_title("Control precision per length level")
    save_figure(fig, path)


def quality_metric(results) -> str:
    """SPICE when it ran (the paper's Figure 5 reads SPICE), CIDEr otherwise."""
    ran = any(row.get("SPICE") is not None for r in results.values() for row in r["levels"].values())
    return "SPICE" if ran else "CIDEr"


def plot_quality_vs_control(path, results, levels) -> None:
    """Quality (SPICE, or CIDEr without SPICE) against control precision, one panel per level (as the
    paper's Figure 5); error bars: the standard deviation over a method's runs."""
    import matplotlib.pyplot as plt

    metric = quality_metric(results)

    cols = min(4, len(levels))
    rows = -(-len(levels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.9 * rows), squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for n, ax in enumerate(axes.flat, 1):
        if n > len(levels):
            ax.axis("off")
            continue
        top, plotted = 0.0, 0
        for k, (name, result) in enumerate(results.items()):
            colour, marker = colours[k % len(colours)], MARKERS[k % len(MARKERS)]
            row = result["levels"][n]
            x, x_err = 100 * (row["control_precision"] or 0.0), 100 * (row.get("control_precision_std") or 0.0)
            long = result["long_refs"].get(n)  # the same captions against the long references: hollow
            for quality, hollow in ((row, False), (long, True)):
                if not quality or quality.get(metric) is None:
                    continue
                y, y_err = 100 * quality[metric], 100 * (quality.get(f"{metric}_std") or 0.0)
                top, plotted = max(top, y + y_err), plotted + 1
                ax.errorbar(x, y, xerr=x_err or None, yerr=y_err or None, color=colour, marker=marker,
                            markersize=8 - min(k, 5) * 0.5, markerfacecolor="none" if hollow else colour,
                            alpha=0.85, capsize=2, ls="")
        if not any((result["levels"][n].get("n_scored") or 0) for result in results.values()):
            ax.text(50, 0.5, "no scored caption", ha="center", va="center", color="0.4")
        elif not plotted:  # (captions were scored, but this metric has no value for them)
            ax.text(50, 0.5, f"no {metric} value", ha="center", va="center", color="0.4")
        ax.set_xlim(-3, 103)
        ax.set_ylim(0, max(top * 1.15, 1.0))
        ax.set_title(f"level {n} ({levels[n - 1][0]}-{levels[n - 1][1]} tokens)", fontsize="medium")
        ax.set_xlabel("control precision (%)")
        ax.set_ylabel(f"{metric} x100 (in range)")
        ax.grid(alpha=0.3)
    handles = [plt.Line2D([], [], marker=MARKERS[k % len(MARKERS)], ls="", color=colours[k % len(colours)])
               for k in range(len(results))]
    labels = list(results)
    if any(r["long_refs"] for r in results.values()):
        handles.append(plt.Line2D([], [], marker="o", ls="", markerfacecolor="none", color="0.3"))
        labels.append("hollow: against the long references")
    fig.legend(handles, labels, loc="upper center", ncol=min(len(labels), 5), fontsize="small")
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    save_figure(fig, path)


def plot_length_histograms(path, sources: dict[str, list[int] | dict[int, list[int]]], levels) -> None:
    """One histogram per source (trusted, self-generated, each run), level ranges shaded.

    A run's source is ``{requested level: lengths}``, stacked with one colour per requested level.
    """
    import matplotlib.pyplot as plt
    import numpy as np

    top = min(levels[-1][1], 2 * levels[-1][0]) + 10  # (an open-ended last level, as SSA's >= 40 words)
    bins = np.arange(0.5, top + 1.5)
    fig, axes = plt.subplots(len(sources), 1, figsize=(8, 1.7 * len(sources) + 0.6), sharex=True, squeeze=False)
    for ax, (label, lengths) in zip(axes[:, 0], sources.items()):
        for k, (lo, hi) in enumerate(levels):
            ax.axvspan(lo - 0.5, hi + 0.5, color="0.93" if k % 2 else "0.86", lw=0)
        stacks = lengths if isinstance(lengths, dict) else {None: lengths}
        stacks = {n: np.minimum(np.asarray(v, dtype=float), top) for n, v in stacks.items() if len(v)}  # long: last bin
        total = sum(len(v) for v in stacks.values())
        if stacks:
            ax.hist(list(stacks.values()), bins=bins, stacked=True, weights=[np.full(len(v), 1 / total) for v in stacks.values()],
                    label=[f"L{n}" for n in stacks] if isinstance(lengths, dict) else None,
                    color=None if isinstance(lengths, dict) else ["tab:blue"])
        if isinstance(lengths, dict) and stacks:
            ax.legend(title="requested", fontsize="x-small", title_fontsize="x-small", ncol=2, loc="upper right")
        ax.set_ylabel("share", fontsize="small")
        ax.set_title(f"{label} ({total} captions)", fontsize="medium", loc="left")
    axes[-1, 0].set_xlabel(f"caption length in tokens (shaded: the levels; the last bin holds >= {top})")
    fig.tight_layout()
    save_figure(fig, path)


# ---------------------------------------------------------------------------------------------
# Everything 07 writes

def selfgen_captions(path) -> list[str] | None:
    """The captions of a self-generated JSONL (``--selfgen``), or None without one."""
    from clid.base.files import read_jsonl

    return [r["caption"] for r in read_jsonl(path, required=("caption",), unique_id=True)] if path else None


def length_histograms(trusted, selfgen_texts, tokenizer, keep_sentences) -> dict:
    """Lengths of the trusted training captions and of the self-generated ones (their texts)."""
    histograms = {}
    trusted_texts = [c for r in trusted for c in r.captions]
    if trusted_texts:
        histograms["trusted captions"] = caption_lengths(trusted_texts, tokenizer, keep_sentences=True)
    if selfgen_texts:
        histograms["self-generated captions"] = caption_lengths(selfgen_texts, tokenizer, keep_sentences)
    return histograms


def write_outputs(out, meta, methods, results, generated, refs, long_refs, levels, histograms, examples,
                  image_ids=None) -> None:
    """metrics.json (per run and per method), report.md, the plots, and a summary on the terminal.

    ``methods``: method -> its run ids; ``results``: run -> :func:`clid.evaluation.metrics.evaluate`'s result
    (with its counted ``lengths``); ``generated``: run -> ``{level: {image_id: caption}}``. ``refs`` None:
    length control alone (:func:`clid.evaluation.metrics.evaluate_lengths`; no quality plot) over ``image_ids``.
    """
    summary = method_results(methods, results)
    first = {name: runs[0] for name, runs in methods.items()}  # the examples show each method's first run
    image_ids = sorted(refs, key=natural_key) if refs is not None else image_ids
    evaluated = set(image_ids)
    captioned = [i for i in image_ids if any(i in by_image for g in generated.values() for by_image in g.values())]
    with_long = [i for i in captioned if any(i in by_image for by_image in long_refs.values())]
    pool = with_long or captioned or image_ids
    n = min(examples, len(pool))
    example_ids = [pool[k * len(pool) // n] for k in range(n)] if n else []
    lengths_of = {name: {(level, i): length for level, by_image in results[run]["lengths"].items()
                         for i, length in by_image.items()} for name, run in first.items()}

    def keyed(rows):
        return {str(n): row for n, row in rows.items()}

    metrics = dict(meta, runs={run: dict(meta["runs"][run], levels=keyed(r["levels"]), long_refs=keyed(r["long_refs"]))
                               for run, r in results.items()},
                   methods={name: dict(m, levels=keyed(m["levels"]), long_refs=keyed(m["long_refs"]))
                            for name, m in summary.items()})
    write_json(out / "metrics.json", metrics, indent=1)
    if refs is not None:
        write_per_image(out / PER_IMAGE, results, image_ids, levels)
    else:
        (out / PER_IMAGE).unlink(missing_ok=True)
    write_report(out / "report.md", meta, summary, {name: generated[run] for name, run in first.items()}, refs,
                 long_refs, levels, example_ids, lengths_of, FIGURES if refs is not None else FIGURES[::2])
    for name, runs in methods.items():  # each method's lengths as counted, its runs pooled
        by_level = {level: [] for level in range(1, len(levels) + 1)}
        for run in runs:
            for level, by_image in results[run]["lengths"].items():
                by_level[level] += [length for i, length in by_image.items() if i in evaluated]
        histograms[f"{name}: generated"] = by_level
    plot_control_precision(out / FIGURES[0], summary, levels)
    if refs is not None:
        plot_quality_vs_control(out / FIGURES[1], summary, levels)
    else:  # (a quality plot of an earlier run with references would not belong to this report)
        (out / FIGURES[1]).unlink(missing_ok=True)
    plot_length_histograms(out / FIGURES[2], histograms, levels)
    print_summary(out, summary, meta["level_set"], 3 if refs is not None else 2, quality=refs is not None)


def print_summary(out, summary, level_set, n_plots, quality: bool = True) -> None:
    """A line per method: control precision and CIDEr (``quality``) or the mean length, per level."""
    second, title = ("CIDEr", "CIDEr x100 on in-range captions") if quality else ("mean_length", "mean length")
    print(f"\ncontrol precision % / {title}, per level ({level_set} levels)")
    for name, result in summary.items():
        cells = [f"L{n} {cell(row, 'control_precision', 100)}/{cell(row, second, 100 if quality else 1)}"
                 for n, row in result["levels"].items()]
        print(f"  {name:<16} " + "  ".join(cells))
    print(f"wrote {out / 'metrics.json'}, {out / 'report.md'} and {n_plots} plots")


def write_per_image(path, results, image_ids, levels) -> None:
    """``per_image.jsonl``: a line per run and level over every evaluated image, in one order: whether its caption's
    length is in the level (a missing caption is not), and its CIDEr against the trusted and the long references
    (None where it was not scored)."""
    from clid.base.files import write_jsonl

    rows = []
    for run, result in results.items():
        scored = result.get("per_image", {})
        for level, (low, high) in enumerate(levels, 1):
            lengths = result["lengths"].get(level, {})
            cider = scored.get("levels", {}).get(level, {})
            long = scored.get("long_refs", {}).get(level, {})
            rows.append({"run": run, "level": level, "image_ids": list(image_ids),
                         "in_range": [low <= lengths.get(i, -1) <= high for i in image_ids],
                         "CIDEr": [cider.get(i) for i in image_ids], "CIDEr_long": [long.get(i) for i in image_ids]})
    write_jsonl(path, rows)


def per_image_problem(row: dict, n_levels: int) -> str | None:
    """What is wrong with a line of :data:`PER_IMAGE`, or None."""
    level, n = row["level"], len(row["image_ids"]) if isinstance(row["image_ids"], list) else None
    if isinstance(level, bool) or not isinstance(level, int) or not 1 <= level <= n_levels:
        return f"'level' must be a level number 1..{n_levels}, got {level!r}"
    if n is None:
        return "'image_ids' must be a list"
    for key, ok, what in (("in_range", lambda v: isinstance(v, bool), "true or false"),
                          ("CIDEr", is_score, "numbers or null"), ("CIDEr_long", is_score, "numbers or null")):
        if not isinstance(row[key], list) or len(row[key]) != n:
            return f"'{key}' must be a list of {n} values, one per image of 'image_ids'"
        if not all(map(ok, row[key])):
            return f"'{key}' must hold {what}"
    return None


def is_score(value) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool) and value == value)


def read_per_image(folder, metrics: dict):
    """A 07 folder's :data:`PER_IMAGE` as :class:`clid.evaluation.intervals.SeedValues` (a method's several runs in
    one folder: its first), or None when the folder has none (a 07 of an earlier version)."""
    from pathlib import Path

    from clid.base.files import DataError, read_jsonl
    from clid.evaluation.intervals import SeedValues

    path = Path(folder) / PER_IMAGE
    if not path.is_file():
        return None
    first = {m["runs"][0]: name for name, m in metrics["methods"].items()}
    values, image_ids = SeedValues(str(folder), 0), None
    n_levels = len(metrics["levels"])
    for row in read_jsonl(path, required=("run", "level", "image_ids", "in_range", "CIDEr", "CIDEr_long")):
        where = f"run {row['run']!r} level {row['level']!r}"
        if problem := per_image_problem(row, n_levels):
            raise DataError(path, where, problem)
        if row["run"] not in first:
            continue
        if image_ids is None:
            image_ids = row["image_ids"]
        elif row["image_ids"] != image_ids:
            raise DataError(path, where, "its images differ from the first line's")
        values.add(first[row["run"]], row["level"], row["in_range"], row["CIDEr"], row["CIDEr_long"])
    if not image_ids:
        raise DataError(path, "", f"holds no line with images of the runs {', '.join(first)} (metrics.json)")
    values.n_images = len(image_ids)
    return values


def combine(eval_dirs, out, tables=None) -> None:
    """Several 07 evaluations of the same methods (e.g. one per seed, each on its own demo world)
    reported together: every run of a method in any folder is one of its runs (mean ± std); with every folder's
    per-image values, each method's 95% intervals, its differences against CLID and the paper's claims
    (:mod:`clid.evaluation.intervals`). ``tables``: a folder that receives the README's tables
    (:mod:`clid.evaluation.tables`)."""
    from pathlib import Path

    from clid.base.files import DataError, read_json
    from clid.evaluation.intervals import method_intervals

    out = Path(out)
    results, methods, meta, seeds = {}, {}, None, []
    for folder in map(Path, eval_dirs):
        metrics = read_json(folder / "metrics.json")
        meta = meta or dict(metrics, refs=[], n_test_images=[], skipped={}, runs={})
        for key in ("levels", "length_count", "score_captions"):
            if metrics.get(key) != meta.get(key):
                raise DataError(folder / "metrics.json", None, f"its {key} ({metrics.get(key)}) differs from "
                                                                f"the first folder's ({meta.get(key)})")
        meta["refs"].append(metrics["refs"])
        meta["n_test_images"].append(metrics["n_test_images"])
        for name, method in metrics["methods"].items():
            for run in method["runs"]:
                row = metrics["runs"][run]
                run_id = f"{folder}:{run}"
                results[run_id] = {part: {int(n): r for n, r in row[part].items()} for part in ("levels", "long_refs")}
                methods.setdefault(name, []).append(run_id)
                meta["runs"][run_id] = dict(row, source=f"`{folder}` {run}: {row['source']}")
        seeds.append(read_per_image(folder, metrics))
    meta.update(refs=", ".join(map(str, meta["refs"])), evaluated=f"{len(eval_dirs)} evaluations combined",
                n_test_images=" + ".join(map(str, meta["n_test_images"])))
    levels = [tuple(level) for level in meta["levels"]]
    summary = method_results(methods, results)

    def keyed(rows):
        return {str(n): row for n, row in rows.items()}

    lacking = [str(d) for d, v in zip(eval_dirs, seeds) if v is None]
    intervals = None if lacking else method_intervals(seeds, levels)
    metrics = dict(meta, combined=[str(d) for d in eval_dirs],
                   methods={name: dict(m, levels=keyed(m["levels"]), long_refs=keyed(m["long_refs"]))
                            for name, m in summary.items()},
                   intervals=intervals and keyed_intervals(intervals),
                   **({"no_intervals": f"no {PER_IMAGE} in {', '.join(lacking)} (07 of an earlier version: run 07 on "
                                       "it again, which reuses its generated captions)"} if lacking else {}))
    write_json(out / "metrics.json", metrics, indent=1)
    if tables:
        from clid.evaluation.tables import write_tables

        written = write_tables(read_json(out / "metrics.json"), tables)
        print(f"wrote {', '.join(map(str, written))} (`python -m clid.tables {tables}` prints them)")
    write_report(out / "report.md", meta, summary, {}, {}, {}, levels, [], {}, figures=FIGURES[:2],
                 intervals=intervals if intervals else metrics.get("no_intervals"))
    plot_control_precision(out / FIGURES[0], summary, levels)
    plot_quality_vs_control(out / FIGURES[1], summary, levels)
    print_summary(out, summary, meta["level_set"], 2)
    if intervals:
        print("the paper's claims (95% intervals, report.md):")
        print("\n".join(claim_lines(intervals["claims"])) or "- none: the runs lack CLID or the methods it is compared to")
    else:
        print(f"no intervals: {metrics['no_intervals']}")


# ---------------------------------------------------------------------------------------------
# 07's runs, the images they caption, and the files 07 writes

def report_coverage(name: str, path, captions: dict[int, dict[str, str]], image_ids: list[str], num_levels: int,
                    what: str = "test images") -> None:
    """Print how many of the evaluated images (``what``) have a caption of this run and how many have none
    (misses); raise :class:`DataError` naming the first unmatched image id when no caption is of a test image."""
    test = set(image_ids)
    captioned = {i for by_image in captions.values() for i in by_image if i in test}
    if not captioned:
        first = next((i for by_image in captions.values() for i in by_image), None)  # the file's first
        if first is None:
            raise DataError(path, None, "holds no captions")
        raise DataError(path, None, f"none of its captions is of a test image (first unmatched image id: {first!r}; "
                                    f"test image ids look like {image_ids[0]!r})")
    held = [n for n in range(1, num_levels + 1) if captions.get(n)]  # the levels this run has captions at
    everywhere = sum(1 for i in image_ids if all(i in captions[n] for n in held))
    print(f"{name}: {len(captioned)} of {len(image_ids)} {what} have a caption, {everywhere} at each of the "
          f"{len(held)} levels it holds ({', '.join(f'L{n}' for n in held)}); {len(image_ids) - len(captioned)} "
          "have none (they count as misses)")


NAMES_FILES = "a run's name names its files in --out (generated/NAME.jsonl)"


def run_list(args) -> list[tuple[str, str, str]]:
    """(name, "checkpoint" | "generated", path) per entry, checkpoints first. A name given as
    NAME=PATH or by --name may repeat (runs of one method); two bare paths with one name may not. A name that is no
    file name of its own ("../x", "a/b", "", ".."; clid.base.files.name_problem) is refused: it names the run's files."""
    entries = [("checkpoint", e) for e in args.checkpoint] + [("generated", e) for e in args.generated]
    if not entries:
        raise DataError(None, None, "nothing to evaluate; give --checkpoint CKPT or --generated FILE")
    if args.name and len(args.name) != len(entries):
        raise DataError(None, None, f"{len(args.name)} --name for {len(entries)} runs (checkpoints first, then generated files)")
    for name in args.name:
        if problem := name_problem(name):
            raise DataError(None, None, f"--name {name!r}: a run's name {problem}; {NAMES_FILES}")
    runs, bare = [], []
    for k, (kind, entry) in enumerate(entries):
        name, sep, path = entry.partition("=")
        given = bool(sep and name) and not os.path.exists(entry)
        if not given:  # a bare path (which may hold "=")
            whole = Path(os.path.abspath(entry))  # ("." and ".." are named after the folders they stand for)
            name, path = (whole.name if kind == "checkpoint" else whole.stem), entry
            if not args.name:
                bare.append(name)
        if not args.name and (problem := name_problem(name)):
            how = "the run name" if given else "the name taken from the path"
            shown = entry if entry.isprintable() else repr(entry)  # (one line, whatever the name holds)
            raise DataError(None, None, f"--{kind} {shown}: {how} {problem}; {NAMES_FILES}" + ("" if given else
                             ": name the run, NAME=PATH or --name"))
        runs.append((args.name[k] if args.name else name, kind, path))
    names = [n for n, _, _ in runs]
    duplicates = sorted({n for n in bare if names.count(n) > 1})
    if duplicates:
        raise DataError(None, None, f"several runs are named {duplicates}; name them as NAME=PATH or with --name")
    return runs


def run_ids(runs) -> list[str]:
    """A unique id per run: the method's name, or NAME-runK when the method has several runs."""
    names = [name for name, _, _ in runs]
    return [name if names.count(name) == 1 else f"{name}-run{names[:k].count(name) + 1}"
            for k, name in enumerate(names)]


OWN_FILES = ("metrics.json", "report.md", PER_IMAGE, *FIGURES)  # 07's files in --out, beside generated/
# what 07 wrote into --out: ``written.json`` (clid.base.files) holds each of OWN_FILES's sha256, to tell a file edited since


def edited_files(out: Path) -> list[str]:
    """The files an earlier 07 run wrote into ``out`` that were changed since (their digest is not the recorded one)."""
    record = written_record(out) or {}
    return [name for name in not_written(out, OWN_FILES) if name in record]


def eval_files(out: Path) -> set[str]:
    """The names 07 wrote into its output folder: those ``written.json`` records, unedited since (an earlier
    version's folder, without it: 07's names, where its metrics.json is there), and generated/."""
    if not (out / "metrics.json").is_file():
        return {"generated"}
    record = written_record(out)
    if record is None:
        return {"generated", *OWN_FILES}
    edited = edited_files(out)
    return {"generated", WRITTEN, *(name for name in OWN_FILES if name in record and name not in edited)}