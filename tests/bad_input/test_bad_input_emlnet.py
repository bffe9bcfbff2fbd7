"""Bad input of python -m clid.emlnet: one row per malformed input (tests/badinput.py runs and checks them)."""
from __future__ import annotations

import pickle
from pathlib import Path

import pytest
from badinput import BINARY, Payload, Row, Table, World, after, check_row, write

table = Table()
row = table.row

row("emlnet", "source-missing", lambda w, d: ["convert", d / "nope.pth", "--out", d / "w.safetensors"], "not found")

row("emlnet", "source-folder", lambda w, d: ["convert", d, "--out", d / "w.safetensors"], "a folder")

row("emlnet", "source-garbage", lambda w, d: ["convert", write(d, "w.pth", BINARY), "--out", d / "w.safetensors"], "cannot read")

row("emlnet", "source-pickle-payload", lambda w, d: ["convert", write(d, "w.pth", pickle.dumps(Payload(d / "pwned"))),
                                                      "--out", d / "w.safetensors"], "--trust-pickle")

row("emlnet", "out-is-source", lambda w, d: ["convert", (p := write(d, "w.pth", BINARY)), "--out", p], "is also the input")

row("emlnet", "out-is-a-folder", lambda w, d: ["convert", write(d, "w.pth", BINARY), "--out", d], "is a folder")

row("emlnet", "out-not-its-own", lambda w, d: ["convert", write(d, "w.pth", BINARY), "--out", write(d, "w.safetensors", "mine")],
    "did not write it")


def converted_then_edited(w: World, d: Path) -> list:
    """A conversion into w.safetensors, which the user then replaced with a file of their own."""
    import torch

    torch.save({"w": torch.ones(2)}, d / "w.pth")
    args = ["convert", d / "w.pth", "--out", d / "w.safetensors"]
    after("emlnet", args, [])
    write(d, "w.safetensors", "mine")
    return args

row("emlnet", "out-its-own-replaced-since", converted_then_edited, "w.safetensors was changed since python -m clid.emlnet convert")


@pytest.mark.parametrize("row", table.params())
def test_bad_input(row: Row, world: World, tmp_path):
    check_row(row, world, tmp_path)
