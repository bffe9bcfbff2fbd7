"""The SLURM recipes call the stages with flags the stages accept: every command of slurm/*.sbatch is
recorded (with stand-ins for python and torchrun) and parsed by its script's own argument parser."""
import json
import os
import re
import signal
import subprocess
import sys

import pytest
from conftest import ROOT, import_script

from clid.data.__main__ import parse_args

RECORD = "import json, os, sys\nwith open(os.environ['CALLS'], 'a') as f:\n    f.write(json.dumps(sys.argv[1:]) + '\\n')\n"


def recorded_calls(tmp_path, script, *args):
    recorder = tmp_path / "record.py"
    recorder.write_text(RECORD)
    calls = tmp_path / "calls.jsonl"
    env = dict(os.environ, PY=f"{sys.executable} {recorder}", CALLS=str(calls), CLID_ROOT=str(ROOT),
               DATA="/data/coco", RUNS=str(tmp_path / "runs"), GPUS="4")
    subprocess.run(["bash", str(ROOT / "slurm" / script), *args], env=env, check=True, cwd=ROOT, capture_output=True,
                   text=True)
    return [json.loads(line) for line in calls.read_text().splitlines()]


def script_of(call: list) -> list:
    """A stage's own command line: ``-m torch.distributed.run [its flags] SCRIPT.py ...`` -> ``SCRIPT.py ...``."""
    if call[:2] == ["-m", "torch.distributed.run"]:
        call = call[2:]
        while not call[0].endswith(".py"):
            call = call[1:]
    return call


@pytest.mark.parametrize("script, args", [("00_convert.sbatch", ()), ("00_features.sbatch", ()), ("01_saliency.sbatch", ()),
                                          ("02_captions.sbatch", ()), ("03_paraphrase.sbatch", ()),
                                          ("04_train_base.sbatch", ("trusted",)), ("04_train_base.sbatch", ("extended",)),
                                          ("05_score.sbatch", ()), ("06_train_selection.sbatch", ()),
                                          ("07_eval.sbatch", ())])
def test_sbatch_commands_parse(tmp_path, monkeypatch, script, args):
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)  # (parsed as on the cluster: --device cuda is checked)
    (call,) = recorded_calls(tmp_path, script, *args)
    if script.startswith(("04", "06")):  # DDP through the project's Python, never a torchrun on the PATH
        assert call[:2] == ["-m", "torch.distributed.run"] and "--nproc_per_node" in call
    call = script_of(call)
    if call[:2] == ["-m", "clid.data"]:
        parsed = parse_args(call[2:])
        assert parsed.command == "convert-coco" and parsed.out == "/data/coco/karpathy.json"
        assert parsed.captions == ["/data/coco/annotations/captions_train2014.json",
                                   "/data/coco/annotations/captions_val2014.json"]
        return
    if call[:3] == ["-m", "clid.features", "convert"]:
        from clid.features.convert import parse_args as convert_args

        parsed = convert_args(call[3:])
        assert (parsed.format, parsed.inputs, parsed.out) == ("vlp", ["/data/coco/region_feat_gvd_wo_bgd"],
                                                              "/data/coco/features.h5")
        return
    module = import_script(call[0], "slurm_" + call[0][:2])
    parsed = module.parse_args(call[1:])
    if hasattr(parsed, "captions") or hasattr(parsed, "refs"):  # the converted captions, never the raw files
        assert (getattr(parsed, "captions", None) or parsed.refs) == "/data/coco/karpathy.json"
    if script == "02_captions.sbatch":  # both graph sources
        assert parsed.scene_graphs == ["/data/coco/scene_graphs.json", "/data/coco/sgg/predictions.tsv"]
        assert parsed.labelmap and parsed.sizes and parsed.image_data


def test_no_sbatch_script_calls_a_bare_torchrun():
    for path in (ROOT / "slurm").iterdir():
        commands = [line.split("#")[0] for line in path.read_text().splitlines()]
        assert not any(re.search(r"(^|[;&|(]\s*)torchrun\b", line.strip()) for line in commands), path


def fake_commands(tmp_path, **scripts) -> dict:
    """A folder of stand-in commands (name -> bash body) put first on the PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in scripts.items():
        (bin_dir / name).write_text("#!/usr/bin/env bash\n" + body + "\n")
        (bin_dir / name).chmod(0o755)
    return dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", CLID_ROOT=str(ROOT), PY=sys.executable)


def test_submit_all_passes_extra_flags_to_every_job_and_makes_the_log_folder_first(tmp_path):
    runs = tmp_path / "runs"
    env = fake_commands(tmp_path, sbatch=f'echo "$* logs:$([ -d {runs}/logs ] && echo yes || echo no)" >> {tmp_path}/sbatch.txt; '
                                          'echo $RANDOM')
    env["RUNS"] = str(runs)
    subprocess.run(["bash", "slurm/submit_all.sh", "--account=proj123", "--partition=gpu", "--qos=normal"], env=env,
                   cwd=ROOT, check=True, capture_output=True, text=True)
    calls = (tmp_path / "sbatch.txt").read_text().splitlines()
    scripts = {line.split(".sbatch")[0].rsplit("/", 1)[-1] for line in calls}
    assert len(calls) == 16 and {"00_convert", "00_features", "01_saliency", "04_train_base", "06_train_selection", "07_eval",
                                 "merge"} <= scripts
    for line in calls:
        assert "--account=proj123 --partition=gpu --qos=normal" in line and f"--output={runs}/logs/" in line
        assert line.endswith("logs:yes")


def test_a_training_job_told_to_stop_passes_sigterm_on_and_is_requeued(tmp_path):
    """sbatch --signal=B:TERM@600 signals the batch shell: the stage gets it, saves, and the job is requeued."""
    stage = tmp_path / "stage.py"
    stage.write_text("import signal, sys, time\n"
                     "signal.signal(signal.SIGTERM, lambda *a: (print('saved', flush=True), sys.exit(143)))\n"
                     "print('started', flush=True)\n"
                     "time.sleep(60)\n")
    env = fake_commands(tmp_path, scontrol=f'echo "$*" >> {tmp_path}/scontrol.txt')
    env.update(RUNS=str(tmp_path / "runs"), SLURM_JOB_ID="4242")
    shell = subprocess.Popen(["bash", "-c", f"source slurm/common.sh; run_requeueable {sys.executable} {stage}"],
                             env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert shell.stdout.readline().strip() == "started"
    shell.send_signal(signal.SIGTERM)
    rest = shell.stdout.read()
    assert shell.wait(timeout=60) == 143
    assert "saved" in rest and "requeued" in rest
    assert (tmp_path / "scontrol.txt").read_text().split() == ["requeue", "4242"]
