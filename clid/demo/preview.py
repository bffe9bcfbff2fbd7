"""The demo world's preview: a contact sheet of the first images with their graphs and a caption."""
from __future__ import annotations

import math
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

from clid.base.files import atomic_path, read_json
from clid.demo.world import BACKGROUND_NAMES


def write_preview(path: Path, out: Path, records: list, n: int) -> None:
    """A contact sheet: each image at 2x with the noisy graph's boxes (hallucinated ones red), a few
    edges and a trusted caption underneath."""
    cell_w, text_h, scale = 340, 96, 2
    records = records[:n]
    cols = min(4, len(records))
    rows = math.ceil(len(records) / cols)
    font = ImageFont.load_default(size=11)
    sheet = Image.new("RGB", (cols * cell_w, rows * (cell_w + text_h)), "white")
    draw = ImageDraw.Draw(sheet)
    for k, r in enumerate(records):
        x0, y0 = (k % cols) * cell_w + 10, (k // cols) * (cell_w + text_h) + 10
        image = Image.open(out / "images" / r["filename"]).convert("RGB")
        big = image.resize((image.width * scale, image.height * scale), Image.Resampling.NEAREST)
        sheet.paste(big, (x0, y0))
        true_ids = {o["object_id"] for o in r["clean"]["objects"]}
        names = {o["object_id"]: o["names"][0] for o in r["noisy"]["objects"]}
        for o in r["noisy"]["objects"]:
            if o["names"][0] in BACKGROUND_NAMES:
                continue
            colour = (0, 200, 0) if o["object_id"] in true_ids else (230, 0, 0)
            box = [x0 + o["x"] * scale, y0 + o["y"] * scale, x0 + (o["x"] + o["w"]) * scale, y0 + (o["y"] + o["h"]) * scale]
            draw.rectangle(box, outline=colour)
            label = " ".join([*o["attributes"][:2], o["names"][0]])
            draw.text((box[0] + 2, box[1] + 1), label, fill=colour, font=font)
        lines = [f"#{r['image_id']} ({', '.join(x for x in (r['split'], r.get('kind')) if x)})"]
        for rel in r["noisy"]["relationships"][:3]:
            lines.append(f"{names[rel['subject_id']]} {rel['predicate']} {names[rel['object_id']]}")
        caption = r["captions"][0]
        lines += [caption[:52], caption[52:104]] if len(caption) > 52 else [caption]
        for j, line in enumerate(lines):
            draw.text((x0, y0 + image.height * scale + 3 + 14 * j), line, fill=(0, 0, 0), font=font)
    with atomic_path(path) as tmp:
        sheet.save(tmp, format="PNG")


def read_preview_records(out: Path, n: int) -> list:
    """The first n images' records, read back from the files (for --preview on a finished world)."""
    captions = read_json(out / "captions.json")["images"][:n]
    noisy = read_json(out / "scene_graphs.json")[:n]
    clean = read_json(out / "scene_graphs_clean.json")[:n]
    return [{"image_id": c["cocoid"], "split": c["split"], "filename": c["filename"], "noisy": g, "clean": t,
             "captions": [s["raw"] for s in c["sentences"]]} for c, g, t in zip(captions, noisy, clean)]
