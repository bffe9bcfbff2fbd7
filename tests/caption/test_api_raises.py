"""The Python API raises what ``except Exception`` catches (a DataError or a ValueError naming the file), never
SystemExit, which would end a notebook's cell; ``python -m clid.caption`` prints the same problem as one line."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
from PIL import Image

from clid.base.files import DataError
from clid.caption import CaptionWriter, Regions


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """An untrained tiny checkpoint (what it writes does not matter here)."""
    import torch

    from clid.model.captioner import build_model, preset_config
    from clid.model.checkpoints import save_model

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("api") / "ck"
    save_model(build_model(preset_config("tiny", region_dim=16)), folder)
    return folder


def caught(call) -> Exception:
    """What ``call`` raised, caught as a notebook's code catches it."""
    try:
        call()
    except Exception as err:  # noqa: BLE001 - what a caller of the API writes
        return err
    raise AssertionError("nothing was raised")


def damaged(checkpoint, tmp_path, name: str, content: bytes | None):
    """A copy of ``checkpoint`` whose file ``name`` holds ``content`` (None: the file is removed)."""
    folder = tmp_path / f"damaged-{name}-{'removed' if content is None else len(content)}"
    shutil.copytree(checkpoint, folder)
    if content is None:
        (folder / name).unlink()
    else:
        (folder / name).write_bytes(content)
    return folder


def test_a_missing_or_damaged_checkpoint_is_a_data_error_naming_it(checkpoint, tmp_path):
    cases = [
        (tmp_path / "nowhere", "nowhere: no such checkpoint folder"),
        (damaged(checkpoint, tmp_path, "model.safetensors", None), "is not a checkpoint (needs config.json and "
                                                                   "model.safetensors)"),
        (damaged(checkpoint, tmp_path, "config.json", b"{not json"), "config.json: line 1"),
        (damaged(checkpoint, tmp_path, "model.safetensors", b"\x00" * 40), "model.safetensors: cannot load these weights"),
    ]
    for folder, says in cases:
        err = caught(lambda: CaptionWriter.from_checkpoint(folder, device="cpu"))
        assert isinstance(err, DataError) and str(folder) in str(err) and says in str(err), repr(err)
        assert "\n" not in str(err) and not str(err).startswith("error:")


def test_bad_images_and_arguments_are_exceptions_naming_them(checkpoint, tmp_path):
    writer = CaptionWriter.from_checkpoint(checkpoint, device="cpu")
    text = tmp_path / "notes.jpg"
    text.write_text("not an image")
    err = caught(lambda: writer.caption_images([text]))
    assert isinstance(err, ValueError) and f"{text}: cannot be read as an image" in str(err), repr(err)
    # a checkpoint whose features no encoder here computes: said for the checkpoint, before any work
    photo = tmp_path / "photo.png"
    Image.new("RGB", (32, 24), (200, 40, 40)).save(photo)
    err = caught(lambda: writer.caption_images(photo))
    assert isinstance(err, DataError) and f"the checkpoint {checkpoint} was trained on" in str(err), repr(err)
    # a bad argument: a level the checkpoint lacks, for regions held in memory
    regions = Regions(np.ones((3, 16), np.float32), np.array([[0, 0, 32, 24]] * 3, np.float32), 32, 24)
    err = caught(lambda: writer.caption(regions, levels=[99]))
    assert isinstance(err, ValueError) and f"level 99 is not one of the levels of the checkpoint {checkpoint}" in str(err)
    err = caught(lambda: CaptionWriter.from_checkpoint(checkpoint, device="tpu"))
    assert isinstance(err, ValueError) and str(err).startswith("device: ") and "'tpu'" in str(err), repr(err)
    err = caught(lambda: CaptionWriter.from_checkpoint(checkpoint, device="cpu", steps=None).use_features(text))
    assert isinstance(err, (DataError, OSError)) and str(text) in str(err), repr(err)


def test_the_command_prints_the_problem_as_one_line_and_exits_1(checkpoint, tmp_path, capsys):
    from clid.caption.__main__ import main
    from clid.run.cli import run_main

    folder = tmp_path / "gallery"
    folder.mkdir()
    argv = ["--checkpoint", str(checkpoint), "--features", str(tmp_path / "f.h5"), "--out", str(tmp_path / "c.jsonl"),
            "--gallery", str(folder), "--device", "cpu"]
    assert isinstance(caught(lambda: main(argv)), DataError)  # main itself raises, as the library does
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        run_main(main, argv)  # what `python -m clid.caption` runs
    assert stop.value.code == 1
    assert capsys.readouterr().err.splitlines() == [f"error: --gallery {folder} is a folder; give the HTML file "
                                                    "to write"]
    assert not (tmp_path / "c.jsonl").exists() and list(folder.iterdir()) == []
