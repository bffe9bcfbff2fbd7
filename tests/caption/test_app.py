"""The web page (python -m clid.app), served by the command on a free port: through its HTTP API
(gradio_client) and in headless Chromium, on a tiny checkpoint trained on features of the test's own images.

Both need the optional install (`make app-check` installs gradio and Debian's chromium, then runs this file);
without them the tests skip with their reason."""
from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest
from conftest import ROOT, import_script
from toyworld import COLOURS, make_toy_world

RGB = {"red": (210, 40, 40), "blue": (40, 60, 210), "green": (40, 170, 60), "yellow": (230, 210, 40)}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A demo world's folder (captions.json, images/NNNNNN.jpg: 20 train, 1 val, 4 test images, each filled
    with the colour its captions name first), the region features clid.features computes from its images
    (4 x 4 grid, 2 colour bins: the encoder the page runs) and a tiny checkpoint trained 150 steps on them; only
    where gradio is installed (every test that uses it serves the page)."""
    pytest.importorskip("gradio", reason="gradio is not installed (make app installs it)")
    import torch
    from PIL import Image, ImageDraw

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("app_world")
    captions, _ = make_toy_world(root, n_train=20, n_val=1, n_test=4, dim=16)
    (root / "images").mkdir()
    for record in json.loads(captions.read_text())["images"]:
        colour = next(w for w in record["sentences"][0]["tokens"] if w in COLOURS)
        image = Image.new("RGB", (96, 96), RGB[colour])
        ImageDraw.Draw(image).ellipse((20, 30, 70, 80), fill=(250, 250, 250))
        image.save(root / "images" / record["filename"], quality=95)
    from clid.features.__main__ import main as features

    features(["--images", str(root / "images"), "--boxes", "grid", "4", "--colour-bins", "2",
              "--out", str(root / "pixels.h5")])  # (--ids auto: 000025.jpg is image 25, as captions.json says)
    train = import_script("04_train_base.py", "train_for_app_tests")
    train.main(["--captions", str(captions), "--features", str(root / "pixels.h5"), "--out", str(root / "ck"),
                "--preset", "tiny", "--max-steps", "150", "--warmup", "10", "--batch-size", "16", "--eval-every", "0",
                "--lr", "2e-3", "--dropout", "0", "--output-vocab", str(captions)])
    yield root
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def writer(world):
    """The caption API on the tiny checkpoint: what the page must show."""
    from clid.caption import CaptionWriter

    return CaptionWriter.from_checkpoint(world / "ck", "cpu")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(world):
    """``python -m clid.app --checkpoint ... --demo WORLD`` on a free port; its URL once the page answers."""
    pytest.importorskip("gradio", reason="gradio is not installed (make app installs it)")
    port = free_port()
    log = (world / "server.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "clid.app", "--checkpoint", str(world / "ck"), "--demo", str(world),
                             "--device", "cpu", "--port", str(port)], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, (world / "server.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the page did not answer in 300 s"
            try:
                with urllib.request.urlopen(url, timeout=5) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                time.sleep(1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


@pytest.mark.slow
def test_the_http_api_gives_the_caption_apis_captions(server, world, writer):
    from gradio_client import Client, handle_file

    client = Client(server, verbose=False)
    assert list(client.view_api(print_info=False, return_format="dict")["named_endpoints"]) == ["/caption"]
    image = world / "images" / "000022.jpg"
    for level in (1, 2):
        text, length, asked = client.predict(handle_file(str(image)), "level", level, api_name="/caption")
        expected = writer.caption_images(image, levels=[level])[level]
        assert (text, length) == (str(expected), expected.length) and text
        low, high = writer.levels[level - 1]
        assert asked.startswith(f"level {level} ({low}-{high} tokens): {expected.length} tokens")
    for n in (1, 7, 16):  # exact lengths, as clid.caption --length N
        text, length, asked = client.predict(handle_file(str(image)), "length", n, api_name="/caption")
        expected = writer.caption_images(image, length=n)
        assert (text, length) == (str(expected), n)
        assert asked.startswith(f"exactly {n} tokens asked: {n} tokens")
    # bad requests: one line on the page (the client's AppError) and in the server's log, no traceback
    from gradio_client.exceptions import AppError

    (world / "not-an-image.png").write_text("text")
    bad = [(image, "level", 9, f"level 9 is not one of the levels of the checkpoint .*: 1..{len(writer.levels)} "),
           (image, "level", 1.5, "level 1.5 is not one of the levels"),
           (image, "length", 500, f"length 500 is outside 1..{writer.longest}, "),
           (image, "words", 3, "mode 'words' is not 'level' or 'length'"),
           (world / "not-an-image.png", "level", 1, r"^not-an-image.png: cannot be read as an image \(UnidentifiedImageError")]
    for upload, mode, value, message in bad:
        with pytest.raises(AppError, match=message):
            client.predict(handle_file(str(upload)), mode, value, api_name="/caption")
    log = (world / "server.log").read_text()
    assert "Traceback" not in log and len([line for line in log.splitlines() if line.startswith("error: ")]) == len(bad)
    assert "error: not-an-image.png: cannot be read as an image" in log  # (the upload's name, not the server's folder)



@pytest.mark.slow
def test_each_event_of_the_page_captions_and_the_mode_switches_the_slider(world, writer):
    """In process: the page captions its image on load, on a new image, when the slider is let go and after the
    mode is switched; the switch moves the slider to the other scale, where the shown value lands."""
    pytest.importorskip("gradio", reason="gradio is not installed (make app installs it)")
    from clid.app import build_page

    image = str(world / "images" / "000022.jpg")
    page = build_page(writer, [image], "tiny")
    fns = list(page.fns.values())
    assert sorted(event for f in fns if f.name == "show" for _, event in f.targets) == \
        ["change", "change", "load", "release", "then"]  # (one "change": the HTTP endpoint's)
    slider_for = next(f.fn for f in fns if f.name == "slider_for")
    to_length = slider_for("length", 2)  # level 2 (10-19 tokens) -> its end, on 1..longest
    assert (to_length.minimum, to_length.maximum, to_length.value) == (1, writer.longest, writer.levels[1][1])
    to_level = slider_for("level", 25)  # 25 tokens -> the level that holds them
    assert (to_level.minimum, to_level.maximum, to_level.value) == (1, len(writer.levels), 3)
    show = next(f.fn for f in fns if f.name == "show")
    assert show(None, "level", 1) == ("", None, "pick or upload an image")
    assert show(image, "length", 12.0)[:2] == (str(writer.caption_images(image, length=12)), 12)  # (a slider's float)


CHROMIUM = shutil.which("chromium")


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (make app-check installs it)")
def test_the_page_shows_a_caption_in_a_real_browser(server, world, writer, tmp_path):
    """Headless Chromium opens the page: it shows the first example (the demo world's first test image)
    with its caption at level 1, and the screenshot is not a blank page."""
    from PIL import Image

    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
             "--virtual-time-budget=30000", "--window-size=1280,900"]
    expected = writer.caption_images(world / "images" / "000022.jpg", levels=[1])[1]
    dom = subprocess.run([CHROMIUM, *flags, "--dump-dom", server], capture_output=True, text=True, timeout=180,
                         check=True).stdout
    assert str(expected) in dom and "Captions of a chosen length" in dom, dom[-3000:]
    shot = tmp_path / "page.png"
    subprocess.run([CHROMIUM, *flags, f"--screenshot={shot}", server], capture_output=True, timeout=180, check=True)
    pixels = np.asarray(Image.open(shot).convert("RGB"), dtype=np.float32)
    assert pixels.shape[:2] == (900, 1280) and pixels.std() > 20  # not a blank page


def test_without_gradio_the_command_says_how_to_install_it(monkeypatch, capsys, tmp_path):
    """Without the optional install: one line with the fix, before the checkpoint is read."""
    from clid.app import main
    from clid.run.cli import run_main

    monkeypatch.setitem(sys.modules, "gradio", None)  # (import gradio: ImportError)
    with pytest.raises(SystemExit) as stop:
        run_main(main, ["--checkpoint", str(tmp_path / "none")])
    assert stop.value.code == 1
    err = capsys.readouterr().err
    assert err == ("error: the web page needs gradio, an optional install: run `make app` (or `pip install "
                   "--no-build-isolation -e .[app]` in this environment)\n")


@pytest.mark.parametrize("argv, line", [
    (["--checkpoint", "{tmp}/none"], "error: {tmp}/none: no such checkpoint folder"),
    (["--checkpoint", "{tmp}/none", "--demo", "{tmp}"], "error: {tmp}/captions.json: --demo: no captions.json here"),
    (["--checkpoint", "{tmp}/none", "--images", "{tmp}/*.png"], "error: {tmp}/*.png: image_files: no file or folder "
                                                                 "matches this pattern"),
])
def test_bad_arguments_are_one_line(argv, line, capsys, tmp_path):
    pytest.importorskip("gradio", reason="gradio is not installed (make app installs it)")
    from clid.app import main
    from clid.run.cli import run_main

    with pytest.raises(SystemExit) as stop:
        run_main(main, [a.format(tmp=tmp_path) for a in argv])
    err = capsys.readouterr().err
    assert stop.value.code == 1 and err.startswith(line.format(tmp=tmp_path)) and err.count("\n") == 1, err


@pytest.mark.slow
def test_a_port_taken_is_one_line(world):
    pytest.importorskip("gradio", reason="gradio is not installed (make app installs it)")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "clid.app", "--checkpoint", str(world / "ck"), "--device", "cpu",
                               "--port", str(port)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and proc.stderr == (f"error: --port {port}: the page cannot listen on 127.0.0.1:{port} "
                                                    "(another program has the port?): give another --port\n"), proc.stderr
