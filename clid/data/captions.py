"""Caption files, all returning :class:`clid.data.records.ImageCaptions`:

- Karpathy JSON (``dataset_coco.json``, ``dataset_flickr30k.json``, and the files 00 writes);
- the official COCO captions JSON plus split lists (``python -m clid.captions convert-coco`` turns it
  into a Karpathy JSON);
- the Stanford image-paragraph file (``paragraphs_v1.json`` plus its split id lists);
- our own JSONL (self-generated, paraphrased, generated captions).
"""
from __future__ import annotations

import sys
from pathlib import Path

from clid.base.files import DataError, id_problem, natural_key, read_json, read_jsonl
from clid.base.progress import LARGE, Progress
from clid.base.text import preprocess
from clid.data.records import ImageCaptions, _first_time, _image_id, _list, _need, _show, _string, report_wordless

SPLITS = ("train", "restval", "val", "test")  # the Karpathy split's names


def load_karpathy(path, data=None) -> list[ImageCaptions]:
    """Karpathy JSON: ``{"images": [{"cocoid"|"image_id", "filename", "split", "sentences"}]}``.

    The image id is ``cocoid``, else ``image_id``, else the file name without its extension
    (Flickr30k's own id). Karpathy ``filepath`` (e.g. "val2014") is prefixed to the file name.
    ``data`` is the already parsed JSON, if the caller has it.
    """
    data = read_json(path) if data is None else data
    images = _need(data, "images", path, "top level")
    if not isinstance(images, list):
        raise DataError(path, "top level", "'images' must be a list")
    out, seen, wordless = [], {}, []
    with Progress(len(images), f"reading {Path(path).name}", "image", disable=len(images) < LARGE) as bar:
        for index, item in enumerate(images):
            bar.update(1)
            where = f"images[{index}]"
            filename = _string(item, "filename", path, where)
            if "cocoid" in item:
                image_id = _image_id(item, "cocoid", path, where)
            elif "image_id" in item:
                image_id = _image_id(item, "image_id", path, where)
            else:
                image_id = Path(filename).stem
            _first_time(seen, image_id, path, where)
            where = f"images[{index}] (image {image_id})"
            split = _string(item, "split", path, where)
            if split not in SPLITS:
                raise DataError(path, where, f"unknown split {split!r} (expected one of {', '.join(SPLITS)}: "
                                             "split names are lower case)")
            sentences = _list(item, "sentences", path, where)
            captions, raw, n_wordless = [], [], 0
            for j, sentence in enumerate(sentences):
                at = f"{where} sentences[{j}]"
                if not isinstance(sentence, dict) or ("raw" not in sentence and "tokens" not in sentence):
                    raise DataError(path, at, "a sentence needs 'raw' or 'tokens'")
                tokens = sentence.get("tokens")
                if tokens is not None and not (isinstance(tokens, list) and all(isinstance(t, str) for t in tokens)):
                    raise DataError(path, at, f"'tokens' must be a list of words (strings), got {_show(tokens)}")
                if "raw" in sentence and not isinstance(sentence["raw"], str):
                    raise DataError(path, at, f"'raw' must be a string, got {_show(sentence['raw'])}")
                text = sentence.get("raw") or " ".join(tokens or [])
                caption = preprocess(" ".join(tokens)) if tokens else preprocess(text)
                if not caption:
                    wordless.append(at)
                    n_wordless += 1
                    continue
                captions.append(caption)
                raw.append(text)
            if item.get("filepath"):
                filename = f"{item['filepath']}/{filename}"
            out.append(ImageCaptions(image_id, filename, split, captions, raw, n_wordless))
    report_wordless(path, wordless)
    return out


def read_id_list(path) -> list[str]:
    """Image ids from a JSON list, a JSON ``{"ids": [...]}`` or a text file of one id a line (the whole line)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as err:
        raise DataError(path, f"byte {err.start}", "not UTF-8 text (expected image ids, one a line, or a JSON list)") from None
    if text.lstrip().startswith(("[", "{")):
        data = read_json(path)
        if isinstance(data, dict):
            data = data.get("ids", data.get("images", list(data.keys())))
        if not isinstance(data, list):
            raise DataError(path, "top level", "expected a list of image ids")
        ids = []
        for index, x in enumerate(data):
            value = x.get("id") if isinstance(x, dict) else x
            if problem := id_problem(value):
                raise DataError(path, f"[{index}]", f"an image id {problem}")
            ids.append(str(value))
        return ids
    return [line.strip() for line in text.splitlines() if line.strip()]  # (an id may hold spaces: "my photo")


def load_coco_captions(path, splits: dict[str, list] | None = None, default_split: str = "train",
                       data=None) -> list[ImageCaptions]:
    """Official COCO captions JSON (``images`` + ``annotations``).

    ``splits`` maps a split name to image ids (a list, or a path to an id list); images in no
    listed split get ``default_split``. ``splits={"test": karpathy_test_ids()}`` gives the
    Karpathy test split.
    """
    data = read_json(path) if data is None else data
    images = _list(data, "images", path, "top level")
    annotations = _list(data, "annotations", path, "top level")
    split_of = {}
    for name, ids in (splits or {}).items():
        ids = read_id_list(ids) if isinstance(ids, (str, Path)) else ids
        split_of.update({str(i): name for i in ids})
    records: dict[str, ImageCaptions] = {}
    seen, wordless = {}, []
    for index, image in enumerate(images):
        image_id = _image_id(image, "id", path, f"images[{index}]")
        _first_time(seen, image_id, path, f"images[{index}]")
        filename = _string(image, "file_name", path, f"images[{index}] (image {image_id})")
        records[image_id] = ImageCaptions(image_id, filename, split_of.get(image_id, default_split), [], [])
    annotation_at, repeats, reused = {}, [], []  # annotation id -> (where, image id, caption); exact repeats read once
    with Progress(len(annotations), f"reading {Path(path).name}", "caption", disable=len(annotations) < LARGE) as bar:
        for index, ann in enumerate(annotations):
            bar.update(1)
            where = f"annotations[{index}]"
            image_id = _image_id(ann, "image_id", path, where)
            caption = _string(ann, "caption", path, where)
            if image_id not in records:
                raise DataError(path, where, f"caption of image {image_id}, which is not in 'images'")
            if isinstance(ann.get("id"), (int, str)) and not isinstance(ann["id"], bool):
                first = annotation_at.setdefault(str(ann["id"]), (where, image_id, caption))
                if first[0] != where and first[1:] == (image_id, caption):
                    repeats.append(where)
                    continue
                if first[0] != where:
                    reused.append(f"{where} (also {first[0]})")
            text = preprocess(caption)
            if not text:
                wordless.append(f"{where} (image {image_id})")
                records[image_id].wordless += 1
                continue
            records[image_id].raw.append(caption)
            records[image_id].captions.append(text)
    report_wordless(path, wordless)
    if repeats:
        print(f"warning: {path}: {len(repeats)} annotation(s) repeat an earlier one (the same id, image and caption), "
              f"read once: {', '.join(repeats[:5])}{', ...' if len(repeats) > 5 else ''}", file=sys.stderr)
    if reused:
        print(f"warning: {path}: {len(reused)} annotation(s) reuse the id of another caption (both kept): "
              f"{', '.join(reused[:3])}{', ...' if len(reused) > 3 else ''}", file=sys.stderr)
    return sorted(records.values(), key=lambda r: natural_key(r.image_id))


PARAGRAPH_SPLIT_FILES = {"train": "train_split.json", "val": "val_split.json", "test": "test_split.json"}


def paragraph_split_files(path) -> dict[str, Path]:
    """The split id lists the Stanford paragraphs ship beside ``paragraphs_v1.json``, if present."""
    folder = Path(path).parent
    return {name: folder / file for name, file in PARAGRAPH_SPLIT_FILES.items() if (folder / file).exists()}


def load_paragraphs(path, splits: dict[str, str | list] | None = None, data=None) -> list[ImageCaptions]:
    """Stanford image-paragraph file: a list of ``{"url", "image_id", "paragraph"}``.

    ``splits`` maps a split name to its id list (a list, or a path to ``train_split.json`` etc.);
    by default the three split files are read from beside the paragraphs file. Without any split
    file every image's split is None (no split information: training refuses such a file). With
    split files, an image in none of them is left out and counted. The real file repeats a few
    image ids with the same paragraph: the first is kept and the repeats are counted. Sentence
    breaks are kept as "." tokens (paragraph levels count them).
    """
    import sys

    data = read_json(path) if data is None else data
    if not isinstance(data, list):
        raise DataError(path, "top level", "expected a list of {image_id, paragraph}")
    splits = paragraph_split_files(path) if splits is None else splits
    split_of = {}
    for name, ids in splits.items():
        ids = read_id_list(ids) if isinstance(ids, (str, Path)) else ids
        split_of.update({str(i): name for i in ids})
    out, seen, repeats, unlisted, wordless = [], set(), [], 0, []
    for index, item in enumerate(data):
        image_id = _image_id(item, "image_id", path, f"[{index}]")
        paragraph = _string(item, "paragraph", path, f"[{index}] (image {image_id})")
        if image_id in seen:
            repeats.append(image_id)
            continue
        seen.add(image_id)
        if split_of and image_id not in split_of:
            unlisted += 1
            continue
        text = preprocess(paragraph, keep_sentences=True)
        if not text:
            wordless.append(f"[{index}] (image {image_id})")
            continue
        url = str(item.get("url", ""))
        filename = url.rsplit("/", 1)[-1] if url else f"{image_id}.jpg"
        out.append(ImageCaptions(image_id, filename, split_of.get(image_id), [text], [paragraph]))
    if repeats or unlisted:
        shown = f" ({', '.join(repeats[:5])}{', ...' if len(repeats) > 5 else ''}: the first of each kept)" if repeats else ""
        print(f"{path}: left out {len(repeats)} repeated image id(s){shown} and {unlisted} image(s) in no split file",
              file=sys.stderr)
    report_wordless(path, wordless)
    return out


def load_jsonl_captions(path, split: str = "train") -> list[ImageCaptions]:
    """Our JSONL captions (``image_id``, ``caption``), grouped per image in file order."""
    by_image: dict[str, ImageCaptions] = {}
    wordless = []
    for number, record in enumerate(read_jsonl(path, required=("image_id", "caption"), unique_id=True), 1):
        image_id = str(record["image_id"])
        entry = by_image.setdefault(image_id, ImageCaptions(image_id, "", split, [], []))
        text = preprocess(record["caption"], keep_sentences="." in record["caption"].rstrip(". "))
        if not text:
            wordless.append(f"caption {record.get('id', f'#{number}')} (image {image_id})")
            entry.wordless += 1
            continue
        entry.raw.append(record["caption"])
        entry.captions.append(text)
    report_wordless(path, wordless)
    return list(by_image.values())


def detect_format(path) -> tuple[str, object]:
    """Sniff a caption file: ("jsonl" | "karpathy" | "coco" | "paragraphs", parsed JSON or None)."""
    path = Path(path)
    if path.suffix == ".jsonl":
        return "jsonl", None
    with open(path, encoding="utf-8-sig", errors="replace") as f:  # (only sniffed here; read_json names a non-UTF-8 file)
        first_line = f.readline()
    try:
        data = read_json(path)
    except DataError:
        if first_line.lstrip().startswith("{") and '"caption"' in first_line:
            return "jsonl", None
        raise
    if isinstance(data, list) and data and isinstance(data[0], dict) and "paragraph" in data[0]:
        return "paragraphs", data
    if isinstance(data, dict) and "images" in data:
        return ("coco" if "annotations" in data else "karpathy"), data
    raise DataError(path, None, "unknown caption format (expected Karpathy JSON, COCO captions JSON, "
                                "paragraphs JSON or JSONL)")


def load_any(path) -> tuple[str, object, list[ImageCaptions]]:
    """Any supported caption file: (its format, the parsed JSON or None, the records)."""
    kind, data = detect_format(path)
    if kind == "jsonl":
        return kind, None, load_jsonl_captions(path)
    loader = {"karpathy": load_karpathy, "coco": load_coco_captions, "paragraphs": load_paragraphs}[kind]
    return kind, data, loader(path, data=data)


def load_captions(path, split_filter: str | None = None) -> list[ImageCaptions]:
    """Any supported caption file; ``split_filter`` keeps one split ("train" also takes "restval")."""
    records = load_any(path)[2]
    if split_filter is not None:
        wanted = {split_filter, "restval"} if split_filter == "train" else {split_filter}
        records = [r for r in records if r.split in wanted]
    return records
