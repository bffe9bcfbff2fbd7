"""The caption gallery: one self-contained HTML page showing each image beside its captions at every
requested length level, one column per run (as in Figure 1 of the paper), under a table of each run's
control precision and mean length per level.

Images are embedded as JPEG thumbnails in data URIs, so the page is a single file that opens in any
browser, offline: each re-encoded from its pixels alone (upright, in sRGB), so no EXIF block (a phone's
GPS position, its owner), JPEG comment or colour profile of the photo reaches the page; files are named
relative to the page, or by their names, never by a path of the machine that wrote it. Each caption shows
its length as counted (green: inside its level, red: outside).
"""
from __future__ import annotations

import base64
import html
import io
from pathlib import Path

from clid.base.files import DataError, atomic_path

THUMBNAIL_SIDE = 256  # pixels, the longer side of an embedded image
LEGEND = 'Length in tokens (WordPiece, with the final "."):'  # the header of every page: it marks them


def is_gallery(path) -> bool:
    """Whether the file at ``path`` is a gallery page this command wrote (its header holds LEGEND)."""
    try:
        with open(path, "rb") as f:
            return LEGEND.encode() in f.read(8192)
    except OSError:
        return False


def match_files(image_ids, listing, names: dict[str, str] | None = None, ids: str = "auto") -> dict:
    """Image id -> its :class:`~clid.data.images.ImageFile` among ``listing``'s files: the file ``names``
    gives (from a captions file) when it is there, else the file whose name without extension is the id,
    else the one whose name ``--ids auto`` reads as the id (:func:`~clid.data.images.auto_key`: a COCO file
    name or a zero-padded number) unless ``ids`` is "keep". An id without a file is one DataError."""
    from clid.data.images import auto_key, keep_key, name_problem, shown

    names = names or {}
    # a file whose name cannot be an id ("a\\b.png": the backslash is no folder here) is matched by its whole name only
    no_id = [(f.name, problem) for f in listing.files if (problem := name_problem(keep_key(f.path.name)))]
    unnamed = {name for name, _ in no_id}
    by_key: dict[str, object] = {}
    for readers in ([lambda f: f.name, lambda f: f.path.name], [lambda f: keep_key(f.path.name)],
                    [lambda f: auto_key(f.path.name)] if ids == "auto" else []):
        for f in listing.files:
            for read in readers:
                if f.name not in unnamed or read(f) in (f.name, f.path.name):
                    by_key.setdefault(read(f), f)
    found = {}
    for image_id in image_ids:
        wanted = names.get(image_id)
        hit = by_key.get(wanted) if wanted else None
        hit = hit or (by_key.get(Path(wanted).name) if wanted else None) or by_key.get(image_id)
        if hit is None:
            named = f"neither {wanted} (as the captions file names it) nor " if wanted else ""
            skipped = [f"; {shown(name)} was skipped: {shown(reason)}" for name, reason in listing.skipped + no_id
                       if image_id in (Path(name).stem, keep_key(Path(name).name),
                                       auto_key(Path(name).name) if ids == "auto" else None)]
            raise DataError("--images", f"image {image_id}", f"no image file: {named}{image_id}.jpg, {image_id}.png, "
                                                             "... (an image's id is its file name without extension)"
                                                             + "".join(skipped[:1]))
        found[image_id] = hit
    return found


def page_name(path, page) -> str:
    """How the page names a file: relative to the page's folder when it lies below it, else its name alone."""
    from clid.base.files import resolved

    target, folder = resolved(path), resolved(page).parent
    return target.relative_to(folder).as_posix() if target.is_relative_to(folder) else target.name


def thumbnail(path: Path, image_id: str, side: int = THUMBNAIL_SIDE) -> str:
    """A JPEG thumbnail of the image as a data URI, encoded from its pixels alone (upright, sRGB: no EXIF,
    comment or colour profile of the file); an image that cannot be read is one DataError."""
    from clid.data.images import read_image

    try:
        image, _ = read_image(path, str(path))
    except DataError as err:
        raise DataError(path, f"image {image_id}", err.problem) from None
    image.thumbnail((side, side))
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=85)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


STYLE = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 24px; color: #222; background: #fafafa; }
h1 { font-size: 22px; margin: 0 0 4px; }
header p { margin: 4px 0; color: #555; font-size: 14px; }
section.figure { display: flex; gap: 20px; align-items: flex-start; background: #fff; border: 1px solid #ddd;
                 border-radius: 6px; padding: 14px; margin: 16px 0; }
.photo { flex: 0 0 auto; width: 256px; text-align: center; }
.photo img { max-width: 256px; max-height: 256px; border-radius: 4px; display: block; margin: 0 auto; }
.photo .id { font-size: 13px; color: #555; margin-top: 6px; font-family: monospace; }
.photo .file { font-size: 12px; color: #888; margin-top: 2px; font-family: monospace; overflow-wrap: anywhere; }
.photo .noimage { width: 256px; height: 120px; background: #eee; color: #888; display: flex; align-items: center;
                  justify-content: center; border-radius: 4px; font-size: 13px; }
table { border-collapse: collapse; flex: 1 1 auto; font-size: 14px; table-layout: fixed; width: 100%; }
thead th:first-child { width: 90px; }
th, td { border-bottom: 1px solid #eee; padding: 5px 8px; text-align: left; vertical-align: top; }
thead th { border-bottom: 2px solid #ccc; }
tbody th { white-space: nowrap; font-weight: 600; width: 90px; }
tbody th small { font-weight: normal; color: #777; }
.len { display: inline-block; font-size: 11px; padding: 0 5px; border-radius: 8px; margin-left: 4px; color: #fff; }
.len.in { background: #2e8b57; }
.len.out { background: #c0392b; }
.len.unknown { background: #999; }
.missing { color: #aaa; }
table.control { width: auto; margin: 8px 0; background: #fff; }
"""


def _cell(record: dict | None) -> str:
    if record is None:
        return '<td class="missing">–</td>'
    text = html.escape(record["caption"])
    if "length" not in record:
        return f"<td>{text}</td>"
    state = {True: "in", False: "out"}.get(record.get("in_range"), "unknown")
    return f'<td>{text} <span class="len {state}" title="length in tokens">{int(record["length"])}</span></td>'


def gallery_title(levels, shown_levels: list[int]) -> str:
    """"Captions at every length level", or at the levels shown: "Captions at length levels 1, 3 and 6"."""
    if list(shown_levels) == list(range(1, len(levels) + 1)):
        return "Captions at every length level"
    numbers = [str(n) for n in shown_levels]
    listed = numbers[0] if len(numbers) == 1 else ", ".join(numbers[:-1]) + " and " + numbers[-1]
    return f"Captions at length level{'s' if len(numbers) > 1 else ''} {listed}"


def control_table(image_ids: list[str], columns: list[tuple[str, dict]], levels, shown_levels: list[int]) -> str:
    """HTML table: per level and run, the control precision over the images shown (a caption without a
    known length, or none, is a miss) and the mean length of its captions."""
    head = "".join(f"<th>{html.escape(name)}</th>" for name, _ in columns)
    rows = []
    for level in shown_levels:
        cells = []
        for _, records in columns:
            found = [records.get((i, level)) for i in image_ids]
            lengths = [r["length"] for r in found if r is not None and "length" in r]
            inside = sum(1 for r in found if r is not None and r.get("in_range") is True)
            mean = f", mean length {sum(lengths) / len(lengths):.1f}" if lengths else ""
            cells.append(f"<td>{100 * inside / len(image_ids):.0f}% ({inside} of {len(image_ids)}){mean}</td>")
        low, high = levels[level - 1]
        rows.append(f'<tr data-control="{level}"><th>L{level} <small>{low}-{high}</small></th>{"".join(cells)}</tr>')
    return (f'<table class="control">\n<thead><tr><th>control precision</th>{head}</tr></thead>\n<tbody>\n'
            + "\n".join(rows) + "\n</tbody>\n</table>\n")


def write_gallery(path, image_ids: list[str], columns: list[tuple[str, dict]], levels, shown_levels: list[int],
                  thumbnails: dict[str, str] | None = None, title: str | None = None, notes: list[str] = (),
                  files: dict[str, str] | None = None) -> None:
    """Write the gallery page atomically.

    ``columns``: ``(name, {(image_id, level): record})`` per run, records as in the generated-captions
    JSONL (``caption``; ``length`` and ``in_range`` when known). ``levels``: the level set (token
    ranges); ``shown_levels``: the level numbers shown. ``thumbnails``: image id -> data URI. ``title``:
    by default it names the levels shown. Above the images, a table of each run's control precision.
    ``files``: image id -> its file name, shown under the id.
    """
    title = title or gallery_title(levels, shown_levels)
    head = "".join(f"<th>{html.escape(name)}</th>" for name, _ in columns)
    parts = ['<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n',
             f"<title>{html.escape(title)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n<header>\n",
             f"<h1>{html.escape(title)}</h1>\n"]
    for note in notes:
        parts.append(f"<p>{html.escape(note)}</p>\n")
    parts.append(f'<p>{html.escape(LEGEND, quote=False)} <span class="len in">inside</span> '
                 '<span class="len out">outside</span> the level asked for.</p>\n')
    if image_ids:
        parts.append(control_table(image_ids, columns, levels, shown_levels))
    parts.append("</header>\n<main>\n")
    for image_id in image_ids:
        escaped = html.escape(image_id)
        if thumbnails and image_id in thumbnails:
            picture = f'<img src="{thumbnails[image_id]}" alt="image {escaped}">'
        else:
            picture = '<div class="noimage">no image given</div>'
        file = f'<div class="file">{html.escape(files[image_id])}</div>' if files and image_id in files else ""
        parts.append(f'<section class="figure" data-image-id="{escaped}">\n<div class="photo">{picture}'
                     f'<div class="id">{escaped}</div>{file}</div>\n<table>\n<thead><tr><th>level</th>{head}</tr>'
                     '</thead>\n<tbody>\n')
        for level in shown_levels:
            low, high = levels[level - 1]
            cells = "".join(_cell(records.get((image_id, level))) for _, records in columns)
            parts.append(f'<tr data-level="{level}"><th>L{level}<br><small>{low}-{high} tokens</small></th>{cells}</tr>\n')
        parts.append("</tbody>\n</table>\n</section>\n")
    parts.append("</main>\n</body>\n</html>\n")
    with atomic_path(path) as tmp:
        tmp.write_text("".join(parts), encoding="utf-8")
