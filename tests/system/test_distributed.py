"""Training across nodes: 04 under two torchrun agents joined by a c10d rendezvous (two "nodes" of one process
each, on this machine, gloo) against one process at the same seed and global batch: with dropout off, one of
the two ranks killed (SIGKILL) after the first checkpoint, ``--max-restarts 1`` restarting both from it; and with
dropout on (keyed per example). The runs end where the single process ends: the loss of every step within 1e-5,
the final weights within 1e-4 of each tensor's largest value. Every wait is bounded, so a hung rendezvous fails
the test instead of hanging it.

``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (for the torchrun agents): without it, the restarted workers meet in
the agents' shared store and may read the dead workers' addresses from the round before (gloo's
"connectFullMesh ... Connection refused"), which uses up the restarts.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from badinput import run_stage
from conftest import ROOT
from toyworld import make_toy_world

STEPS, SAVE_EVERY = 16, 4
LIMIT = 400  # seconds any one run may take


def train_args(world: Path, out: Path, steps: int = STEPS, dropout: bool = False) -> list[str]:
    off = [] if dropout else ["--dropout", "0", "--region-dropout", "off"]
    return [str(a) for a in ("--captions", world / "captions.json", "--features", world / "features.h5", "--out", out,
                             "--preset", "tiny", "--warmup", "1", "--lr", "1e-3", "--batch-size", "8", *off,
                             "--eval-every", "0", "--max-steps", steps, "--log-every", "1",
                             "--save-every", SAVE_EVERY, "--seed", "3")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        text = (task / "children").read_text() if (task / "children").exists() else ""
        found += [int(p) for p in text.split()]
    return found


def losses(out: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in map(json.loads, (out / "train_log.jsonl").read_text().splitlines()) if "loss" in r}


def toy(tmp_path: Path) -> Path:
    world = tmp_path / "world"
    world.mkdir()
    make_toy_world(world, n_train=16, n_val=2, n_test=2, dim=16)
    return world


def two_nodes(tmp_path: Path, args: list[str], kill: bool) -> str:
    """04 under two torchrun agents of one process each; ``kill``: rank 1's worker SIGKILLed after the first
    checkpoint. Returns both agents' output; both must end with 0."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", CLID_PROGRESS_SECONDS="0", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    port = free_port()
    agent = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
             "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "two-nodes",
             "--max-restarts", "1", "--monitor-interval", "0.2", "04_train_base.py", *args]
    logs = [open(tmp_path / f"node{k}.log", "w") for k in (0, 1)]
    nodes = [subprocess.Popen(agent, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
             for log in logs]  # (each agent and its workers a process group, which a failed test ends whole)
    out = Path(args[args.index("--out") + 1])
    try:
        state, deadline = out / "train_state.json", time.time() + LIMIT
        while kill and not state.exists():  # the first checkpoint
            assert time.time() < deadline and all(n.poll() is None for n in nodes), "no checkpoint was written"
            time.sleep(0.02)
        if kill:
            killed = children(nodes[1].pid)
            assert killed, "node 1 has no worker process"
            os.kill(killed[0], signal.SIGKILL)
        for node in nodes:
            node.wait(timeout=max(1, deadline - time.time()))
    finally:
        for node in nodes:
            try:
                os.killpg(node.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            node.wait()
        for log in logs:
            log.close()
    text = "".join((tmp_path / f"node{k}.log").read_text() for k in (0, 1))
    assert [n.returncode for n in nodes] == [0, 0], text[-4000:]
    return text


def assert_the_same_run(one: Path, two: Path, steps: int) -> None:
    """Every step's loss within 1e-5, every final weight within 1e-4 of its tensor's largest value."""
    from safetensors.torch import load_file

    expected, got = losses(one), losses(two)
    assert sorted(got) == list(range(1, steps + 1)) and sorted(expected) == sorted(got)
    assert max(abs(expected[s] - got[s]) for s in expected) <= 1e-5, (expected, got)
    a, b = load_file(one / "model.safetensors"), load_file(two / "model.safetensors")
    for name in a:
        scale = float(a[name].abs().max()) or 1.0
        assert float((a[name] - b[name]).abs().max()) <= 1e-4 * scale, name


@pytest.mark.slow
def test_two_nodes_with_a_killed_rank_end_where_one_process_ends(tmp_path):
    world = toy(tmp_path)
    one = run_stage("04", train_args(world, tmp_path / "one"))
    assert one.code == 0, one.text
    text = two_nodes(tmp_path, train_args(world, tmp_path / "two"), kill=True)
    resumed = [line for line in text.splitlines() if "resumed from" in line]
    assert resumed and f"at step {STEPS}" not in resumed[0], text[-4000:]  # restarted from a checkpoint mid-run
    assert_the_same_run(tmp_path / "one", tmp_path / "two", STEPS)


@pytest.mark.slow
def test_two_nodes_with_dropout_train_what_one_process_trains(tmp_path):
    """Dropout on (04's default 0.1, the region MLPs' too), drawn per example (--dropout-draws example): 2 ranks
    train the run one process trains. (With --dropout-draws rank they do not: the masks are drawn per process.)"""
    world, steps = toy(tmp_path), 6
    one = run_stage("04", train_args(world, tmp_path / "one", steps, dropout=True))
    assert one.code == 0, one.text
    two_nodes(tmp_path, train_args(world, tmp_path / "two", steps, dropout=True), kill=False)
    assert_the_same_run(tmp_path / "one", tmp_path / "two", steps)


def test_the_masks_of_a_global_batch_do_not_depend_on_the_world_size():
    """The token masks of a step are drawn per example (keyed by its place in the global batch): the shares of
    a batch on 2 or 4 ranks are the rows of the one process's batch."""
    from types import SimpleNamespace

    from clid.base.text import get_levels, load_tokenizer
    from clid.training.batches import collate

    model = SimpleNamespace(tokenizer=load_tokenizer(), levels=get_levels("caption"))
    tokens = [[1996, 3899] * k + [1012] for k in range(1, 9)]
    examples = SimpleNamespace(tokens=tokens, levels=[1 + len(t) // 10 for t in tokens])
    indices = [5, 0, 7, 2, 2, 6, 1, 3]
    whole = collate(examples, indices, model, 11, 4)
    for world in (2, 4):
        for rank in range(world):
            places = list(range(rank, 8, world))
            part = collate(examples, [indices[p] for p in places], model, 11, 4, places)
            for got, want in zip(part[:3], whole[:3]):
                width = got.shape[1]
                assert (got == want[places][:, :width]).all()
                assert (want[places][:, width:] == (model.tokenizer.pad_token_id if want.dtype == torch.long else 0)).all()
