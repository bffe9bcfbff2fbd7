"""Stage 01: a saliency map per image (CLID step 1).

In:  a folder of images, and optionally the image list (``--list``): a Karpathy or COCO captions
     JSON (ids are COCO ids), a VG ``image_data.json`` (ids are VG ids), a VG ``scene_graphs.json``
     or a text file of file names (ids are file-name stems). Without ``--list``, every image in
     the folder, keyed by its file-name stem.
Out: HDF5, one group per image id: ``map`` [h, w] float16 in [0, 1] (the longer side is
     ``--map-side`` cells, the image's aspect ratio kept), attrs ``width``, ``height`` (of the
     image), ``method``; groups read from a VG list also carry ``vg_image_id`` (and ``coco_id``).

    python 01_saliency.py --images data/demo/images --list data/demo/captions.json --out saliency.h5

Methods:
- ``spectral`` (default, no weights): spectral-residual saliency (Hou & Zhang, CVPR 2007). The
  grey image at 64 x 64: the log amplitude spectrum minus its 3 x 3 local mean is the "spectral
  residual"; transformed back with the original phase, squared, smoothed by a Gaussian
  (``--sigma`` cells) and normalised to [0, 1]. The image is first extended by its mirror image
  (``--border mirror``), which removes the bright borders the FFT's wrap-around gives.
- ``emlnet --weights IMAGENET PLACES DECODER`` (or one file: a single encoder with its own
  head): EML-Net (Jia & Bruce, 2020): ResNet-50 encoders read out at five depths and a small
  decoder, on the RGB image resized to 480 x 640 in [0, 1]; the prediction is blurred
  (sigma 5 px) and normalised, as the official evaluation does. Module names follow the official
  checkpoints, so the released ``res_imagenet.pth``, ``res_places.pth`` and ``res_decoder.pth``
  load unchanged. Weights are never unpickled: ``.safetensors`` or a ``.pth`` of plain tensors; a
  ``.pth`` holding a pickled module is refused (convert it once: ``python -m clid.emlnet convert
  --trust-pickle IN.pth --out OUT.safetensors``).

A missing or unreadable image is reported by path and listed in ``OUT.failed.tsv``; the run goes
on and exits non-zero at the end. Runs are sharded (``--shard-id/--num-shards``) and resume after
a kill; a resume with other inputs or flags is refused unless ``--restart`` (see clid/run/shard.py).
"""
from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from tqdm import tqdm

from clid.base import files
from clid.data.images import Item, list_items, try_load, unique_items
from clid.run import runs, runtime, shard
from clid.run.cli import HelpFormatter, non_negative_float, non_negative_int, positive_int, run_main
from clid.selfgen.saliency import EMLNET_SIZE, SPECTRAL_SIZE, map_shape, resize_map, spectral_residual

# ---------------------------------------------------------------------------------------------
# Preview

def preview_boxes(scene_graphs, image_data) -> dict[str, tuple[list, float | None, float | None]]:
    """image id -> (boxes, frame width, frame height) from a scene-graph file, by VG and COCO id."""
    from clid.data.scenegraphs import load_scene_graphs

    graphs, _ = load_scene_graphs(scene_graphs, image_data, strict=False)
    out = {}
    for g in graphs:
        entry = ([o.box for o in g.objects], g.width, g.height)
        out[g.image_id] = entry
        if g.coco_id is not None:
            out[g.coco_id] = entry
    return out


def write_preview(path: Path, image_path: Path, smap: np.ndarray, boxes=None) -> None:
    """PNG: the image, and the image under its heat map with the objects' boxes."""
    from matplotlib import colormaps
    from PIL import Image, ImageDraw
    from PIL.PngImagePlugin import PngInfo

    with Image.open(image_path) as img:
        img = img.convert("RGB")
    width, height = img.size
    scale = 256 / height
    img = img.resize((max(1, round(width * scale)), 256), Image.BILINEAR)
    heat = Image.fromarray((smap * 255).astype(np.uint8)).resize(img.size, Image.BILINEAR)
    colours = (colormaps["jet"](np.asarray(heat) / 255.0)[..., :3] * 255).astype(np.uint8)
    overlay = Image.blend(img, Image.fromarray(colours), 0.5)
    if boxes:
        box_list, frame_w, frame_h = boxes
        sx, sy = img.size[0] / (frame_w or width), img.size[1] / (frame_h or height)
        draw = ImageDraw.Draw(overlay)
        for x1, y1, x2, y2 in box_list:
            draw.rectangle([x1 * sx, y1 * sy, x2 * sx, y2 * sy], outline=(255, 255, 255), width=2)
    canvas = Image.new("RGB", (img.size[0] * 2 + 8, img.size[1]), (255, 255, 255))
    canvas.paste(img, (0, 0))
    canvas.paste(overlay, (img.size[0] + 8, 0))
    mark = PngInfo()  # the digest of its pixels: how a later run tells its own preview from a file of the user's
    mark.add_text(PREVIEW_MARK, pixel_digest(canvas))
    path.parent.mkdir(parents=True, exist_ok=True)
    with files.atomic_path(path) as tmp:
        canvas.save(tmp, format="PNG", pnginfo=mark)


PREVIEW_MARK = "clid-01-preview"  # a preview's PNG text: the sha256 of its RGB pixels


def pixel_digest(image) -> str:
    import hashlib

    return hashlib.sha256(image.convert("RGB").tobytes()).hexdigest()


def own_preview(path: Path) -> bool:
    """Whether ``path`` is a preview 01 wrote, its pixels unchanged since (a file of the user's is not)."""
    from PIL import Image

    try:
        with Image.open(path) as img:
            return img.format == "PNG" and img.text.get(PREVIEW_MARK) == pixel_digest(img)
    except (OSError, ValueError, Image.DecompressionBombError):
        return False


# ---------------------------------------------------------------------------------------------

def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=HelpFormatter)
    io = parser.add_argument_group("input and output", "the images, the saliency file and its previews")
    method = parser.add_argument_group("saliency", "how saliency is computed")
    run = parser.add_argument_group("run", "batches, devices, shards and resuming")
    io.add_argument("--images", required=True, help="image folder")
    io.add_argument("--list", default=None,
                    help="captions JSON, VG image_data.json / scene_graphs.json, or a text list")
    io.add_argument("--out", required=True, help="output HDF5")
    method.add_argument("--method", default="spectral", choices=["spectral", "emlnet"],
                        help="spectral: the spectral residual (offline, no weights); emlnet: EML-Net, as the paper "
                             "(needs --weights)")
    method.add_argument("--weights", nargs="+", default=None,
                        help="EML-Net checkpoints: IMAGENET PLACES DECODER, or a single encoder")
    method.add_argument("--emlnet-size", type=positive_int, nargs=2, default=list(EMLNET_SIZE), metavar=("H", "W"),
                        help="EML-Net input size")
    method.add_argument("--sigma", type=non_negative_float, default=2.5, help="spectral residual: Gaussian blur, in 64-px cells")
    method.add_argument("--border", default="mirror", choices=["mirror", "wrap"],
                        help="spectral residual: extend the image by its mirror image before the FFT, or not")
    method.add_argument("--map-side", type=positive_int, default=64, help="longer side of the stored map, in cells")
    run.add_argument("--batch-size", type=positive_int, default=32, help="images per EML-Net batch")
    run.add_argument("--workers", type=positive_int, default=2, help="image-decoding threads")
    shard.add_chunk_size_arg(run, 1000, "images")
    io.add_argument("--preview", type=non_negative_int, default=0, metavar="N", help="write PNG previews of the first N images")
    io.add_argument("--preview-dir", default=None, help="preview folder (default: OUT without suffix + _preview)")
    io.add_argument("--scene-graphs", default=None, help="scene_graphs.json whose boxes the previews draw")
    io.add_argument("--image-data", default=None, help="image_data.json for --scene-graphs (sizes, COCO ids)")
    runtime.add_device_arg(run)
    shard.add_shard_args(run)
    args = parser.parse_args(argv)
    args.device = str(runtime.device_plan(args.device).device)
    if args.method == "emlnet" and not args.weights:
        parser.exit(2, "error: --method emlnet needs --weights IMAGENET PLACES DECODER (the released EML-Net "
                       "checkpoints res_imagenet.pth res_places.pth res_decoder.pth), or use --method spectral\n")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch  # (after the flags: --help and a bad flag answer without loading torch)

    from clid.selfgen.emlnet import EMLNet

    record = runs.run_record(args, inputs=("images", "list", "weights"), settings=(
        "images", "method", "emlnet_size", "sigma", "border", "map_side"))
    items = read_items(args)
    check_paths(args, items)
    job = shard.Job(args.out, shard.Shard.from_args(args), args.chunk_size, record, args.restart, (".h5", ".hdf5"))
    started = time.time()
    by_id = {item.image_id: item for item in items}

    # the saliency function: a batch of loaded images -> [B, H, W] maps
    if args.method == "spectral":
        mode, size = "L", (SPECTRAL_SIZE, SPECTRAL_SIZE)

        def saliency(batch: list[np.ndarray]) -> torch.Tensor:
            return spectral_residual(torch.from_numpy(np.stack(batch)), args.sigma, args.border == "mirror")
    else:
        mode, size = "RGB", tuple(args.emlnet_size)
        model = EMLNet(args.weights, size, args.device) if not job.done else None

        def saliency(batch: list[np.ndarray]) -> torch.Tensor:
            return model(torch.from_numpy(np.stack(batch)).permute(0, 3, 1, 2).contiguous())

    previews = Previews(args)
    pool = ThreadPoolExecutor(max(1, args.workers))

    def process(chunk):  # each batch: load the images, compute their maps, store them at --map-side
        groups, failed = [], []
        for start in range(0, len(chunk.items), args.batch_size):
            batch = [by_id[i] for i in chunk.items[start:start + args.batch_size]]
            loaded = list(pool.map(lambda item: try_load(item, mode, size), batch))
            good = []
            for item, (result, error) in zip(batch, loaded):
                if error:
                    failed.append((item.image_id, item.path, error))
                    tqdm.write(f"failed: {item.path}: {error}")
                else:
                    good.append((item, result))
            maps = saliency([array for _, (array, _) in good]) if good else []
            for (item, (_, (width, height))), smap in zip(good, maps):
                stored = resize_map(smap, map_shape(width, height, args.map_side))
                attrs = {"width": width, "height": height, "method": args.method, **item.attrs}
                groups.append((item.image_id, {"map": stored.astype(np.float16)}, attrs))
                previews.add(item, stored)
            chunk.progress(len(batch))
        shard.write_table(chunk.table("failed.tsv"), FAILED, failed)
        files.write_h5_groups(chunk.path, groups, compression="gzip")

    final = job.run([item.image_id for item in items], process, f"saliency ({args.method})", "img")
    pool.shutdown()
    return report(job, final, previews, time.time() - started)


FAILED = ("image_id", "path", "reason")  # the columns of OUT.failed.tsv


def read_items(args) -> list[Item]:
    """The images of ``--images`` / ``--list``, each once; a bad list is one line and exit 1."""
    images = Path(args.images)
    if not images.is_dir():
        sys.exit(f"error: {images}: image folder not found")
    items = unique_items(list_items(images, args.list))
    for item in items:  # an id names its group in --out and its preview file: "a/b" or ".." would leave them
        if problem := files.name_problem(item.image_id):
            raise files.DataError(args.list or item.path, f"image {item.image_id!r}",
                                  f"the image id {problem}; an id names its group in {args.out}: give it another id")
    return items


def preview_folder(args) -> Path:
    """Where the previews go: --preview-dir, or beside --out (``OUT_preview``)."""
    out = Path(args.out)
    return Path(args.preview_dir) if args.preview_dir else out.with_name(out.stem + "_preview")


def check_paths(args, items: list[Item]) -> None:
    """Refuse, before any work, an output (--out, its side files, the preview folder and the previews) that is an
    input (--images, an image, --list, --weights, the previews' scene graphs) or another output, links followed;
    and a preview folder inside --images, whose previews the next run would read as images."""
    out = Path(args.out)
    outputs = {"--out": out, **{f"(--out's {name})": shard.side_path(out, name) for name in ("run.json", "failed.tsv")}}
    if args.preview:
        folder = preview_folder(args)
        files.check_folder_place(folder, "--preview-dir" if args.preview_dir else "the preview folder")
        outputs["the preview folder"] = folder
        outputs.update({f"the preview of image {item.image_id}": folder / f"{item.image_id}.png" for item in items})
        if files.resolved(folder).is_relative_to(files.resolved(args.images)):
            raise files.DataError(None, None, f"the preview folder {folder} is inside --images {args.images}: the next "
                                              "run would read the previews as images; give --preview-dir elsewhere")
        for item in items:  # (a file there of the user's, or a preview changed since, is theirs: never replaced)
            preview = folder / f"{item.image_id}.png"
            if (preview.exists() or preview.is_symlink()) and not own_preview(preview):
                raise files.DataError(preview, None, "is not a preview this stage wrote (or was changed since): it is "
                                                     "kept; give another --preview-dir, or move the file away yourself")
    files.check_outputs(outputs, {"--images": [args.images, *(item.path for item in items)], "--list": args.list,
                                  "--weights": args.weights, "--scene-graphs": args.scene_graphs,
                                  "--image-data": args.image_data})


class Previews:
    """PNG previews of the first ``--preview`` images (in the order they are computed)."""

    def __init__(self, args):
        self.requested = self.left = args.preview
        self.folder = preview_folder(args)
        self.boxes = preview_boxes(args.scene_graphs, args.image_data) if args.preview and args.scene_graphs else {}

    def add(self, item: Item, smap: np.ndarray) -> None:
        if self.left > 0:
            write_preview(self.folder / f"{item.image_id}.png", item.path, smap, self.boxes.get(item.image_id))
            self.left -= 1


def report(job: shard.Job, final, previews: Previews, elapsed: float) -> int:
    """Print what the output (or this shard's part) holds; list the images that failed. Returns the exit code."""
    written = job.written()
    failed = shard.read_table(shard.side_path(written, "failed.tsv"))
    print(f"{len(files.h5_group_ids(written))} images have a map in {written} ({elapsed:.1f}s, "
          f"{(job.shard_items - job.done_before) / max(elapsed, 1e-9):.1f} img/s)")
    if previews.requested:
        print(f"previews in {previews.folder}")
    if final is None:
        print(f"shard {job.spec.shard_id} done; the output appears when all {job.spec.num_shards} shards are done")
    if failed:
        print(f"error: {len(failed)} image(s) failed (missing or unreadable), listed in "
              f"{shard.side_path(written, 'failed.tsv')}", file=sys.stderr)
        for _, path, reason in failed[:10]:
            print(f"  {path}: {reason}", file=sys.stderr)
        return 1
    return 0

if __name__ == "__main__":
    sys.exit(run_main(main))
