"""07's report: metrics tables in report.md and the plots (control precision, quality against
control precision per level as the paper's Figure 5, length histograms)."""
from __future__ import annotations

from .files import atomic_path
from .metrics import QUALITY_METRICS

FIGURES = ("control_precision.png", "quality_vs_control.png", "length_histograms.png")
MARKERS = "osD^vP"


# ---------------------------------------------------------------------------------------------
# Report

def fmt(value, scale=1.0, digits=1) -> str:
    return "–" if value is None else f"{value * scale:.{digits}f}"


def level_header(levels, numbers) -> str:
    cols = [f"L{n} ({levels[n - 1][0]}-{levels[n - 1][1]})" for n in numbers]
    return "| run | " + " | ".join(cols) + " |\n|---|" + "---:|" * len(cols) + "\n"


def table(title, runs, table_key, field, levels, numbers, scale=1.0, digits=1, counts=False) -> str:
    text = f"**{title}**\n\n" + level_header(levels, numbers)
    for name, result in runs.items():
        cells = []
        for n in numbers:
            row = result[table_key].get(n)
            if row is None:
                cells.append("–")
            elif counts:
                cells.append(f"{row['n_scored']}/{row['n_images']}")
            else:
                cells.append(fmt(row.get(field), scale, digits))
        text += f"| {name} | " + " | ".join(cells) + " |\n"
    return text + "\n"


QUALITY_TITLES = {"Bleu_1": "BLEU-1", "Bleu_2": "BLEU-2", "Bleu_3": "BLEU-3", "Bleu_4": "BLEU-4",
                  "METEOR": "METEOR", "ROUGE_L": "ROUGE-L", "CIDEr": "CIDEr", "SPICE": "SPICE"}


def write_report(path, meta, results, generated, refs, long_refs, levels, example_ids, lengths_of):
    numbers = list(range(1, len(levels) + 1))
    scored = "in-range captions" if meta["score_captions"] == "in-range" else "all captions"
    lines = ["# Length-controlled captioning: evaluation\n",
             f"{meta['n_test_images']} test images (`{meta['refs']}`, {meta['evaluated']}), "
             f"{meta['level_set']} levels. Runs:\n"]
    lines += [f"- **{name}**: {meta['runs'][name]['source']}" for name in results]
    lines += ["",
              "Control precision: share of all test images whose caption length (WordPiece tokens of "
              "the preprocessed caption plus the final \".\") falls inside the requested level; a "
              "missing caption is a miss. Quality scores (pycocoevalcap, PTB tokenizer, x100) are "
              f"computed on the {scored} of each level only, against that level's subset of images; "
              "CIDEr's document frequencies therefore come from that subset, and few scored captions "
              "make it noisy. Length error: mean distance in tokens to the level's range (0 inside). "
              "Distinct-n: unique n-grams / all n-grams of the level's captions (x100).",
              f"\nSPICE: {meta['spice']}\n"]
    skipped = {k: v for k, v in meta["skipped"].items() if v}
    for name in results:
        skipped.update({f"{name}: {k}": v for k, v in meta["runs"][name]["skipped"].items() if v})
    if skipped:
        lines.append("Left out: " + "; ".join(f"{k}: {v}" for k, v in skipped.items()) + "\n")

    lines.append("## Length control\n")
    lines.append(table("Control precision (%)", results, "levels", "control_precision", levels, numbers, 100))
    lines.append(table("Length error (tokens)", results, "levels", "length_error", levels, numbers, 1, 2))
    lines.append(table("Mean caption length (tokens)", results, "levels", "mean_length", levels, numbers))
    lines.append(table("Scored captions / test images", results, "levels", None, levels, numbers, counts=True))
    lines.append(f"## Quality on the {scored} (x100)\n")
    for metric in QUALITY_METRICS:
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
    lines += [f"![{f}]({f})\n" for f in FIGURES]

    lines.append("## Example captions\n")
    for image_id in example_ids:
        lines.append(f"### Image {image_id}\n")
        lines += [f"- reference: {r}" for r in refs[image_id][:3]]
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

    numbers = np.arange(1, len(levels) + 1)
    width = 0.8 / len(results)
    fig, ax = plt.subplots(figsize=(1.2 + 1.1 * len(levels), 3.6))
    for k, (name, result) in enumerate(results.items()):
        values = [100 * (result["levels"][n]["control_precision"] or 0.0) for n in numbers]
        ax.bar(numbers - 0.4 + width * (k + 0.5), values, width, label=name)
    ax.set_xticks(numbers, [f"L{n}\n{lo}-{hi}" for n, (lo, hi) in zip(numbers, levels)])
    ax.set_ylabel("control precision (%)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize="small")
    ax.set_title("Control precision per length level")
    save_figure(fig, path)


def plot_quality_vs_control(path, results, levels) -> None:
    """CIDEr against control precision, one panel per level (as the paper's Figure 5)."""
    import matplotlib.pyplot as plt

    cols = min(4, len(levels))
    rows = -(-len(levels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.9 * rows), squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for n, ax in enumerate(axes.flat, 1):
        if n > len(levels):
            ax.axis("off")
            continue
        top = 0.0
        for k, (name, result) in enumerate(results.items()):
            style = dict(color=colours[k % len(colours)], marker=MARKERS[k % len(MARKERS)], s=70 - 8 * min(k, 5))
            row = result["levels"][n]
            if row["CIDEr"] is not None:
                top = max(top, 100 * row["CIDEr"])
                ax.scatter(100 * row["control_precision"], 100 * row["CIDEr"], alpha=0.85, **style)
            long = result["long_refs"].get(n)
            if long and long["CIDEr"] is not None:  # the same captions against the long references
                top = max(top, 100 * long["CIDEr"])
                ax.scatter(100 * row["control_precision"], 100 * long["CIDEr"], facecolors="none",
                           edgecolors=style.pop("color"), **style)
        if top == 0.0:
            ax.text(50, 0.5, "no in-range caption", ha="center", va="center", color="0.4")
        ax.set_xlim(-3, 103)
        ax.set_ylim(0, max(top * 1.15, 1.0))
        ax.set_title(f"level {n} ({levels[n - 1][0]}-{levels[n - 1][1]} tokens)", fontsize="medium")
        ax.set_xlabel("control precision (%)")
        ax.set_ylabel("CIDEr x100 (in range)")
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

    top = levels[-1][1] + 10
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
