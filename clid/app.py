"""A web page that captions an image at the length a slider sets (Gradio).

    python -m clid.app --checkpoint runs/quick/model --demo data/demo      (then open http://127.0.0.1:7860)

Pick an example image (the demo world's test images with ``--demo``, the images of ``--images``) or upload
one, choose levels or exact lengths, move the slider, and read the caption with its length in tokens (the
project's count: WordPiece tokens and the final "."). Levels are the checkpoint's; an exact length is any N
from 1 to its longest level's end, as ``python -m clid.caption --length N``. Each image is captioned by the
caption API (:meth:`clid.caption.CaptionWriter.caption_images`: read upright in 8-bit RGB, its region features
computed with the checkpoint's encoder, a 4 x 4 grid of boxes), so the page writes what the command writes.

The same captions over HTTP: the endpoint ``/caption`` takes (image, mode, value), mode ``level`` or ``length``,
and returns (caption, its length in tokens, what was asked), e.g. with ``gradio_client``::

    from gradio_client import Client, handle_file
    Client("http://127.0.0.1:7860/").predict(handle_file("photo.png"), "length", 12, api_name="/caption")

An optional install: ``make app`` (or ``pip install --no-build-isolation -e .[app]``) adds gradio to the
environment; without it the command says so in one line.
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
from pathlib import Path

from clid.base.files import DataError
from clid.caption import describe_levels, image_files
from clid.run import runtime
from clid.run.cli import HelpFormatter, number, positive_int, run_main

MODES = [("levels", "level"), ("exact lengths", "length")]  # (shown, the API's value)
GRADIO_MISSING = ("the web page needs gradio, an optional install: run `make app` (or `pip install "
                  "--no-build-isolation -e .[app]` in this environment)")


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m clid.app", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    inputs = p.add_argument_group("input", "the checkpoint and the example images")
    inputs.add_argument("--checkpoint", required=True, help="checkpoint folder (04_train_base.py, 06_train_selection.py)")
    inputs.add_argument("--demo", default=None, metavar="FOLDER",
                        help="a demo world (00_demo_data.py, e.g. data/demo): its test images are the examples")
    inputs.add_argument("--images", default=None, nargs="+", metavar="PATH",
                        help="image folders, files or globs offered as examples (as clid.caption --images finds them)")
    inputs.add_argument("--examples", type=positive_int, default=8, metavar="N",
                        help="the most example images shown (the first N)")
    runtime.add_device_arg(inputs)
    server = p.add_argument_group("server", "where the page is served")
    server.add_argument("--host", default="127.0.0.1",
                        help="the address to listen on (0.0.0.0: every network interface, for other machines)")
    server.add_argument("--port", type=number(int, low=1, high=65535, what="a port number in 1..65535"), default=7860,
                        help="the port to listen on")
    return p.parse_args(argv)


def example_images(demo, images, count: int) -> list[str]:
    """The first ``count`` example images: the test images of the demo world ``demo`` (its captions.json's
    test split, under images/), then the image files of ``images``. A missing world or file is a DataError."""
    found = []
    if demo is not None:
        from clid.data.captions import load_captions

        captions = Path(demo) / "captions.json"
        if not captions.is_file():
            raise DataError(captions, None, "--demo: no captions.json here: give a demo world's folder (00_demo_data.py)")
        for record in load_captions(captions, "test"):
            path = Path(demo) / "images" / record.filename
            if not path.is_file():
                raise DataError(path, f"image {record.image_id}", "--demo: the test image is missing")
            found.append(str(path))
    if images:
        found += [str(p) for p in image_files(*images)]
    return found[:count]


def caption_one(writer, image, mode: str, value) -> tuple[str, int, str]:
    """(caption, its length in tokens, what was asked, in words) of one image (a file's path) by
    :meth:`~clid.caption.CaptionWriter.caption_images`: at level ``value`` (mode ``level``) or of exactly
    ``value`` tokens (mode ``length``). A bad mode or value is a ValueError naming it."""
    if mode not in dict(MODES).values():
        raise ValueError(f"mode {mode!r} is not 'level' or 'length'")
    if isinstance(value, float) and value.is_integer():  # (a slider sends a number)
        value = int(value)
    if mode == "level":
        caption = writer.caption_images(image, levels=[value])[value]
        low, high = writer.levels[value - 1]
        where = "in range" if caption.in_range else "outside its range"
        asked = f"level {value} ({low}-{high} tokens): {caption.length} tokens, {where}"
    else:
        caption = writer.caption_images(image, length=value)
        asked = f"exactly {value} tokens asked: {caption.length} tokens (decoded at level {caption.level})"
    return str(caption), caption.length, asked


def build_page(writer, examples: list[str], title: str):
    """The page: the image (an example or an upload), the mode and its slider, the caption and its length."""
    import gradio as gr

    from clid.model.decode import exact_level

    levels, longest = writer.levels, writer.longest
    busy = threading.Lock()

    def slider_for(mode, value):
        """The slider of ``mode``: at the level that holds the length shown, or at the end of the level shown."""
        value = int(value)
        if mode == "level":
            return gr.Slider(minimum=1, maximum=len(levels), step=1, value=exact_level(levels, value),
                             label="level", info=describe_levels(levels))
        return gr.Slider(minimum=1, maximum=longest, step=1, value=levels[value - 1][1],
                         label="exact length, in tokens", info=f"1 to {longest} tokens, the final '.' counted")

    def show(image, mode, value):
        if image is None:
            return "", None, "pick or upload an image"
        try:
            with busy:  # one image at a time: the page's load event is answered outside gradio's queue
                return caption_one(writer, image, mode, value)
        except (ValueError, OSError) as err:  # an unreadable upload, a value out of range: one line, page and log
            message = str(err).replace(str(Path(image).parent) + os.sep, "")  # (the upload's name, not the server's folder)
            print(f"error: {message}", file=sys.stderr, flush=True)
            raise gr.Error(message, print_exception=False) from None

    notes = [f"warning: {writer.checkpoint_state.warning()}"] if writer.unfinished else []
    with gr.Blocks(title="CLID captions", analytics_enabled=False) as page:
        gr.Markdown(f"## Captions of a chosen length\n{title}: levels {describe_levels(levels)}"
                    + "".join(f"\n\n**{note}**" for note in notes))
        with gr.Row():
            with gr.Column():
                image = gr.Image(value=examples[0] if examples else None, type="filepath", image_mode=None,
                                 sources=["upload", "clipboard"], label="image", height=320)
                # the uploaded file handed over unread (gradio has checked it is an upload): the caption API reads
                # it as the caption command does (upright, 8-bit RGB) and names what is wrong with it, in one line
                image.preprocess = lambda payload: None if payload is None else payload.path
                if examples:
                    gr.Examples([[path] for path in examples], inputs=[image], label="examples")
            with gr.Column():
                mode = gr.Radio(MODES, value="level", label="length by")
                slider = slider_for("level", levels[0][0])
                # (Markdown: the page's text, where a browser's DOM holds it; plain words, no formula)
                text = gr.Markdown(label="caption", show_label=True, container=True, latex_delimiters=[],
                                   elem_id="caption", min_height=60)
                length = gr.Number(label="length in tokens", precision=0, interactive=False, elem_id="length")
                asked = gr.Markdown(label="asked", show_label=True, container=True, latex_delimiters=[],
                                    elem_id="asked")
        run = {"fn": show, "inputs": [image, mode, slider], "outputs": [text, length, asked],
               "concurrency_id": "caption", "concurrency_limit": 1, "api_visibility": "private"}
        page.load(**run, queue=False)  # (answered at once: a browser that only loads the page sees the caption)
        image.change(**run)
        slider.release(**run)
        mode.change(slider_for, [mode, slider], [slider], api_visibility="private").then(**run)
        # the HTTP API: (image, mode, value), its value free of the slider's range (that moves with the mode), its
        # mode and value checked by caption_one (one line)
        api_mode, value = gr.Textbox(visible=False, label="mode"), gr.Number(visible=False, label="value")
        value.change(**{**run, "inputs": [image, api_mode, value], "api_visibility": "public"}, api_name="caption")
    return page


def main(argv=None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    try:
        import gradio  # noqa: F401  (checked before the checkpoint loads)
    except ImportError:
        raise DataError(None, None, GRADIO_MISSING) from None
    examples = example_images(args.demo, args.images, args.examples)
    from clid.caption import CaptionWriter

    writer = CaptionWriter.from_checkpoint(args.checkpoint, args.device)
    page = build_page(writer, examples, "/".join(Path(args.checkpoint).resolve().parts[-2:]))
    folders = sorted({str(Path(p).resolve().parent) for p in examples})
    try:
        page.queue().launch(server_name=args.host, server_port=args.port, allowed_paths=folders, ssr_mode=False,
                            quiet=True, show_error=True, footer_links=["api"], prevent_thread_lock=True)
    except OSError:
        raise DataError(None, None, f"--port {args.port}: the page cannot listen on {args.host}:{args.port} (another "
                                    "program has the port?): give another --port") from None
    print(f"serving the page of {args.checkpoint} on http://{args.host}:{args.port} ({len(examples)} example images; "
          "Ctrl+C stops it)", flush=True)
    page.block_thread()

if __name__ == "__main__":
    run_main(main)
