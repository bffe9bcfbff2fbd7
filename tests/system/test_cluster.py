"""What a cluster run meets: logs written to a file, SIGTERM before a time limit, a full disk, and two
copies of one shard.

The disk-full tests run twice: on a real, small tmpfs when this machine lets the test mount one (root
with CAP_SYS_ADMIN), and always with the writer made to fail with ENOSPC (the same OSError).
"""
from __future__ import annotations

import errno
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from badinput import run_stage
from conftest import FIXTURES, ROOT, import_script, run_script
from toyworld import make_toy_world

from clid.base import files
from clid.run.shard import ShardLock
from clid.selection.quality import eq1_quality

ENV = {"OMP_NUM_THREADS": "1", "CLID_PROGRESS_SECONDS": "0"}  # a plain progress line at every update


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A toy world with self-generated captions and their scores (for 04, 05, 06)."""
    root = tmp_path_factory.mktemp("cluster")
    captions, features = make_toy_world(root, n_train=8, n_val=2, n_test=3, dim=16)
    data = json.loads(captions.read_text())
    records = [{"id": f"{im['cocoid']}-{k}", "image_id": im["cocoid"], "caption": f"a dog and a {word} ball"}
               for im in data["images"] if im["split"] == "train" for k, word in enumerate(["red", "big"])]
    files.write_jsonl(root / "selfgen.jsonl", records)
    logp = np.linspace(-2, -1, len(records)), np.full(len(records), -1.5)
    files.write_quality(root / "quality.h5", [r["id"] for r in records], *logp, eq1_quality(*logp))
    for name, seed in (("trusted", "0"), ("extended", "1")):  # two models for 05
        outcome = run_stage("04", train_args(root, root / name, "--max-steps", "2", "--seed", seed))
        assert outcome.code == 0, outcome.text
    return root


def train_args(world: Path, out, *extra) -> list:
    return ["--captions", world / "captions.json", "--features", world / "features.h5", "--out", out, "--preset", "tiny",
            "--warmup", "1", "--batch-size", "4", "--eval-every", "0", *extra]


def selection_args(world: Path, out, *extra) -> list:
    return train_args(world, out, "--selfgen", world / "selfgen.jsonl", "--quality", world / "quality.h5", *extra)


# ---------------------------------------------------------------------------------------------
# Progress in a log file


PLAIN_STEP = re.compile(r"^04 trusted: step (\d+)/3 \(\d+%\), loss \d+\.\d+, lr \d\.\d\de-\d\d, [\d.]+ step/s, \d+s elapsed")


@pytest.mark.slow
def test_a_stage_writing_to_a_file_logs_plain_lines(world, tmp_path, monkeypatch):
    log_file = tmp_path / "slurm-1234.out"
    with open(log_file, "w") as log:  # stdout and stderr into one file, as sbatch --output writes them
        subprocess.run([sys.executable, "04_train_base.py", *map(str, train_args(world, tmp_path / "run", "--max-steps", "3"))],
                       cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT), **ENV), stdout=log, stderr=subprocess.STDOUT,
                       check=True)
    log = log_file.read_text()
    assert "\r" not in log  # no bar redrawn in place
    steps = [int(m.group(1)) for line in log.splitlines() if (m := PLAIN_STEP.match(line))]
    assert steps == [1, 2, 3]
    assert re.search(r"^04 trusted: step 1/3 \(33%\), .* left$", log, re.M)  # time left while it runs
    # a per-item stage: the same lines, from the same place
    monkeypatch.setenv("CLID_PROGRESS_SECONDS", "0")
    outcome = run_stage("02", ["--scene-graphs", FIXTURES / "vg_scene_graphs_sample.json", "--image-data",
                               FIXTURES / "vg_image_data_sample.json", "--saliency", "none", "--out", tmp_path / "s.jsonl"])
    assert "\r" not in outcome.text
    assert re.search(r"^captions: graph 2/2 \(100%\), [\d.]+ graph/s, \d+s elapsed$", outcome.text, re.M)


def test_progress_is_a_bar_on_a_terminal_and_lines_in_a_file(monkeypatch, capsys):
    from clid.base import progress

    monkeypatch.setattr(progress, "plain_output", lambda: True)
    with progress.Progress(10, "work", "item", seconds=1e9, every=4) as bar:
        for k in range(10):
            bar.update(1, loss=1.0 / (k + 1))
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(",")[0] for line in lines] == ["work: item 1/10 (10%)", "work: item 4/10 (40%)",
                                                      "work: item 8/10 (80%)", "work: item 10/10 (100%)"]
    assert "loss 0.100" in lines[-1] and "left" not in lines[-1]
    monkeypatch.setattr(progress, "plain_output", lambda: False)
    with progress.Progress(3, "work", "item") as bar:
        assert bar.bar is not None  # tqdm's bar
        bar.update(3, loss=0.5)
    assert "work: item" not in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# SIGTERM: checkpoint, exit, resume


@pytest.mark.parametrize("stage", ["04", "06"])
def test_sigterm_saves_a_checkpoint_and_the_same_command_resumes(world, tmp_path, stage, monkeypatch):
    """SIGTERM is sent to this process (the stage runs in it) while step 2 is being computed."""
    from clid.training.loop import Trainer

    out = tmp_path / "run"
    argv = (train_args(world, out, "--max-steps", "12", "--save-every", "1000") if stage == "04"
            else selection_args(world, out, "--max-steps", "12", "--save-every", "1000", "--eta", "5"))
    real = Trainer.train_step

    def terminated_in_step_2(self, indices):
        if self.step == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(self, indices)

    monkeypatch.setattr(Trainer, "train_step", terminated_in_step_2)
    outcome = run_stage(stage, argv)
    assert outcome.code == 128 + signal.SIGTERM and "Traceback" not in outcome.text, outcome.text + outcome.error
    assert f"stopped by SIGTERM at step 2 of {12 if stage == '04' else 5}; the checkpoint in {out} is saved" in outcome.text
    assert json.loads((out / "train_state.json").read_text())["step"] == 2
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # (the handler lives only while training)
    monkeypatch.setattr(Trainer, "train_step", real)
    resumed = run_stage(stage, argv)
    assert resumed.code == 0 and f"resumed from {out} at step 2" in resumed.text
    assert json.loads((out / "train_state.json").read_text())["step"] == 12


# ---------------------------------------------------------------------------------------------
# A full disk: one clear line, no half-written final file, and a resume


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs (skipped where mounting is not permitted); yields (folder, fill), where
    ``fill(free_kib)`` leaves about that much space."""
    folder = tmp_path / "disk"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (the ENOSPC tests below simulate it)")

    def fill(free_kib: int) -> None:
        filler = folder / ".filler"
        filler.unlink(missing_ok=True)
        stat = os.statvfs(folder)
        size = stat.f_bavail * stat.f_frsize - free_kib * 1024
        with open(filler, "wb") as f:
            f.write(b"\0" * max(size, 0))

    try:
        yield folder, fill
    finally:
        # (lazily: a process of the test that still holds a file there must not leave the mount behind)
        subprocess.run(["umount", "--lazy", str(folder)], check=True)


def no_space(text: str) -> bool:
    last = text.strip().splitlines()[-1]
    return last.startswith("error:") and ("no space left" in last or "is the disk full" in last)


def vg_world(folder: Path) -> Path:
    from test_scenegraph_captions import write_world

    folder.mkdir(parents=True, exist_ok=True)
    write_world(folder, n_images=40)
    return folder


def sg_command(world: Path, out: Path) -> list:
    return ["02_scenegraph_captions.py", "--scene-graphs", world / "scene_graphs.json", "--image-data",
            world / "image_data.json", "--saliency", world / "saliency.h5", "--chunk-size", "4", "--out", out]


def score_args(world: Path, out) -> list:
    return ["--trusted", world / "trusted", "--extended", world / "extended", "--selfgen", world / "selfgen.jsonl",
            "--features", world / "features.h5", "--mode", "onepass", "--chunk-size", "4", "--out", out]


def test_a_full_tmpfs_stops_02_04_05_in_one_line_and_02_resumes(world, tmp_path, small_disk):
    disk, fill = small_disk
    graphs = vg_world(tmp_path / "vg")
    whole = tmp_path / "whole.jsonl"
    assert run_stage("02", sg_command(graphs, whole)[1:]).code == 0
    fill(40)  # room for two chunks (a chunk of 4 graphs: ~5 kB, two 4 kB pages, and a page for its table)
    full = run_stage("02", sg_command(graphs, disk / "selfgen.jsonl")[1:])
    assert full.code == 1 and "Traceback" not in full.text and no_space(full.text), full.text
    assert not (disk / "selfgen.jsonl").exists() and not list(disk.glob(".*.tmp-*"))
    (disk / ".filler").unlink()
    resumed = run_stage("02", sg_command(graphs, disk / "selfgen.jsonl")[1:])
    assert resumed.code == 0 and "resuming: 2 of 10 chunks already done" in resumed.text
    assert (disk / "selfgen.jsonl").read_bytes() == whole.read_bytes()
    assert (disk / "selfgen.jsonl.problems.tsv").read_bytes() == whole.with_name("whole.jsonl.problems.tsv").read_bytes()
    (disk / "selfgen.jsonl").unlink()

    fill(0)
    trained = run_stage("04", train_args(world, disk / "run", "--max-steps", "2"))
    assert trained.code == 1 and "Traceback" not in trained.text and no_space(trained.text), trained.text
    assert not (disk / "run" / "model.safetensors").exists() and not list(disk.glob(".run.staging*"))

    fill(8)
    scored = run_stage("05", score_args(world, disk / "quality.h5"))
    assert scored.code == 1 and "Traceback" not in scored.text and no_space(scored.text), scored.text
    assert not (disk / "quality.h5").exists()


def enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_enospc_stops_02_04_05_in_one_line_without_a_half_written_file(world, tmp_path, monkeypatch):
    """The same as on the tmpfs, with the writers made to fail as a full disk makes them fail."""
    import safetensors.torch

    graphs = vg_world(tmp_path / "vg")
    monkeypatch.setattr(files, "write_jsonl", enospc)
    outcome = run_stage("02", sg_command(graphs, tmp_path / "selfgen.jsonl")[1:])
    assert outcome.code == 1 and "no space left on the device" in outcome.text and "Traceback" not in outcome.text
    assert not (tmp_path / "selfgen.jsonl").exists()
    monkeypatch.undo()

    monkeypatch.setattr(safetensors.torch, "save_model", enospc)
    outcome = run_stage("04", train_args(world, tmp_path / "run", "--max-steps", "2"))
    assert outcome.code == 1 and "cannot write the checkpoint into" in outcome.text and "is the disk full?" in outcome.text
    assert not (tmp_path / "run" / "model.safetensors").exists() and not (tmp_path / ".run.staging").exists()
    monkeypatch.undo()

    monkeypatch.setattr(files, "write_arrays", enospc)
    outcome = run_stage("05", score_args(world, tmp_path / "quality.h5"))
    assert outcome.code == 1 and "no space left on the device" in outcome.text and "Traceback" not in outcome.text
    assert not (tmp_path / "quality.h5").exists()


# ---------------------------------------------------------------------------------------------
# Two copies of one shard; the side tables of a killed and resumed run


def test_two_copies_of_one_shard_refuse_each_other(tmp_path):
    out = tmp_path / "selfgen.jsonl"
    command = ["02_scenegraph_captions.py", "--scene-graphs", FIXTURES / "vg_scene_graphs_sample.json", "--image-data",
               FIXTURES / "vg_image_data_sample.json", "--saliency", "none", "--out", out]
    first = ShardLock(out)  # this process is the first copy, still running
    assert first.acquire()
    second = run_script(*command, env=ENV)
    assert second.returncode == 0 and f"process {os.getpid()} on " in second.stdout
    assert "is already running shard 0 of 1" in second.stdout and not out.exists()
    first.release()
    assert run_stage("02", command[1:]).code == 0
    assert out.exists() and not list(tmp_path.glob(".*.lock"))  # the lock is gone with its run
    # a shard of several: only that shard is held
    held = ShardLock(tmp_path / "three.jsonl.part-00001-of-00003")
    assert held.acquire()
    refused = run_script(*command[:-1], tmp_path / "three.jsonl", "--shard-id", 1, "--num-shards", 3, env=ENV)
    assert refused.returncode == 0 and "is already running shard 1 of 3" in refused.stdout
    held.release()
    for k in (0, 1, 2):  # (in this process: a POSIX lock never refuses its own process)
        assert run_stage("02", [*command[1:-1], tmp_path / "three.jsonl", "--shard-id", k, "--num-shards", 3]).code == 0
    assert (tmp_path / "three.jsonl").read_bytes() == out.read_bytes()


def test_the_problems_table_of_a_killed_and_resumed_run_is_the_uninterrupted_ones(tmp_path, monkeypatch):
    """Killed between a chunk's side table and its data (the worst place), then while joining."""
    graphs = vg_world(tmp_path)
    stage02 = import_script("02_scenegraph_captions.py", "stage02_cluster")
    argv = [str(x) for x in sg_command(graphs, tmp_path / "whole.jsonl")[1:]]
    stage02.main(argv)
    problems = (tmp_path / "whole.jsonl.problems.tsv").read_bytes()
    assert problems.count(b"\n") > 1  # (the random graphs have cycles: noted)
    real, calls = files.write_jsonl, []
    again = [a if a != str(tmp_path / "whole.jsonl") else str(tmp_path / "again.jsonl") for a in argv]
    for kill_at in (3, 9):  # (chunk 2's data; then, of the 8 chunks left, the final join, after its tables)
        calls.clear()

        def killed(path, records, kill_at=kill_at):
            calls.append(path)
            if len(calls) == kill_at:
                raise KeyboardInterrupt("killed")
            return real(path, records)

        monkeypatch.setattr(files, "write_jsonl", killed)
        with pytest.raises(KeyboardInterrupt):
            stage02.main(again)
        monkeypatch.setattr(files, "write_jsonl", real)
    stage02.main(again)
    assert (tmp_path / "again.jsonl").read_bytes() == (tmp_path / "whole.jsonl").read_bytes()
    assert (tmp_path / "again.jsonl.problems.tsv").read_bytes() == problems
