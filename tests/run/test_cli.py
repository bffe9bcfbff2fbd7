"""The typed argparse helpers of clid.run.cli: a bad number is argparse's one error line naming the flag."""
import argparse

import pytest

from clid.run.cli import (
    finite_float,
    non_negative_float,
    non_negative_int,
    number,
    positive_float,
    positive_int,
    probability,
    unit_interval,
)

GOOD = [(positive_int, "3", 3), (non_negative_int, "0", 0), (finite_float, "-2.5", -2.5), (positive_float, "1e-4", 1e-4),
        (non_negative_float, "0", 0.0), (probability, "0", 0.0), (probability, "0.999", 0.999), (unit_interval, "1", 1.0),
        (number(float, low=0, high=100, low_open=True), "100", 100.0)]
BAD = [(positive_int, "0"), (positive_int, "-1"), (positive_int, "1.5"), (positive_int, "ten"), (non_negative_int, "-1"),
       (finite_float, "nan"), (finite_float, "inf"), (finite_float, "-inf"), (positive_float, "0"), (positive_float, "nan"),
       (non_negative_float, "-0.1"), (probability, "1"), (probability, "-0.1"), (probability, "1.5"), (unit_interval, "1.01"),
       (number(float, low=0, high=100, low_open=True), "0"), (number(float, low=0, high=100, low_open=True), "101")]


@pytest.mark.parametrize("parse, text, value", GOOD)
def test_accepts(parse, text, value):
    assert parse(text) == value


@pytest.mark.parametrize("parse, text", BAD)
def test_refuses_in_one_line_naming_the_flag(parse, text, capsys):
    parser = argparse.ArgumentParser(prog="stage")
    parser.add_argument("--flag", type=parse)
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args([f"--flag={text}"])
    assert exit_.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1 and "argument --flag: must be" in errors[0] and repr(text) in errors[0]


def test_a_string_default_is_checked_too():
    """(argparse converts a string default with type=, which is how SLURM variables are read)"""
    parser = argparse.ArgumentParser()
    parser.add_argument("--shard-id", type=non_negative_int, default="4")
    assert parser.parse_args([]).shard_id == 4


def test_a_hub_that_accepts_and_never_answers_is_given_up_in_seconds(monkeypatch, capsys):
    """--allow-download (here abbreviated) against a hub that accepts the connection and never answers: one warning
    line after HUB_TIMEOUT seconds, and the run goes on offline (a model that is not on disk is then one error line)."""
    import os
    import socket
    import time

    from clid.run import cli

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)  # (the kernel accepts the connection; nothing ever answers it)
    try:
        monkeypatch.setattr(cli, "HUB_TIMEOUT", 1)
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
        started = time.monotonic()
        assert cli.stay_offline(["--model", "some-org/some-model", "--allow-d"]) is True
        assert time.monotonic() - started < 5 and os.environ["HF_HUB_OFFLINE"] == "1"
        warning = capsys.readouterr().err
        assert warning.count("\n") == 1 and "did not answer within 1 s: going on offline" in warning
    finally:
        server.close()
