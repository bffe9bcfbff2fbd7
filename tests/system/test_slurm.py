"""The SLURM recipes without a Slurm (make slurm-check runs them on a real one): every command of
slurm/*.sbatch is recorded (with stand-ins for python, srun and scontrol) and parsed by its script's own
argument parser and torchrun's; submit_all.sh's jobs, flags and dry run; the settings' checks; a stop under
torchrun; the node-local staging."""
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, import_script

from clid.captions import parse_args

RECORD = "import json, os, sys\nwith open(os.environ['CALLS'], 'a') as f:\n    f.write(json.dumps(sys.argv[1:]) + '\\n')\n"
# srun and scontrol as a one-node job sees them: srun runs its command once, here
SRUN = 'while [[ $1 == -* ]]; do shift; done; exec "$@"'
SCONTROL = ('case "$1 $2" in "show hostnames") echo gpu-node-7 ;; "show node") echo "NodeName=gpu-node-7 '
            'NodeAddr=10.1.2.7 NodeHostName=gpu-node-7" ;; *) echo "$*" >> "$SCONTROL_CALLS" ;; esac')


def fake_commands(tmp_path, **scripts) -> dict:
    """A folder of stand-in commands (name -> bash body) put first on the PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in scripts.items():
        (bin_dir / name).write_text("#!/usr/bin/env bash\n" + body + "\n")
        (bin_dir / name).chmod(0o755)
    return dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", CLID_ROOT=str(ROOT), PY=sys.executable,
                SCONTROL_CALLS=str(tmp_path / "scontrol.txt"))


def job_env(tmp_path, **settings) -> dict:
    """The environment of a job on one node with 4 GPUs: stand-in srun and scontrol, DATA=/data/coco."""
    env = fake_commands(tmp_path, srun=SRUN, scontrol=SCONTROL)
    env.update(DATA="/data/coco", RUNS=str(tmp_path / "runs"), GPUS="4", SLURM_JOB_ID="1234", SLURM_NNODES="1",
               SLURM_JOB_NODELIST="gpu-node-7", SLURM_GPUS_ON_NODE="4", STAGE="")
    env.update(settings)
    return env


def recorded_calls(tmp_path, script, *args, **settings):
    recorder = tmp_path / "record.py"
    recorder.write_text(RECORD)
    calls = tmp_path / "calls.jsonl"
    env = job_env(tmp_path, PY=f"{sys.executable} {recorder}", CALLS=str(calls), **settings)
    subprocess.run(["bash", str(ROOT / "slurm" / script), *args], env=env, check=True, cwd=ROOT, capture_output=True,
                   text=True)
    return [json.loads(line) for line in calls.read_text().splitlines()]


def torchrun_and_script(call: list):
    """``slurm/torchrun.py [torchrun flags] SCRIPT.py ...`` -> (torchrun's parsed flags, ``SCRIPT.py ...``)."""
    from torch.distributed.run import get_args_parser

    assert call[0] == "slurm/torchrun.py"
    launcher = get_args_parser().parse_args(call[1:])
    return launcher, [launcher.training_script, *launcher.training_script_args]


@pytest.mark.parametrize("script, args", [("00_convert.sbatch", ()), ("00_features.sbatch", ()), ("01_saliency.sbatch", ()),
                                          ("02_captions.sbatch", ()), ("03_paraphrase.sbatch", ()),
                                          ("04_train_base.sbatch", ("trusted",)), ("04_train_base.sbatch", ("extended",)),
                                          ("04_train_base.sbatch", ("scoring",)),
                                          ("05_score.sbatch", ()), ("06_train_selection.sbatch", ()),
                                          ("07_eval.sbatch", ())])
def test_sbatch_commands_parse(tmp_path, monkeypatch, script, args):
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)  # (parsed as on the cluster: --device cuda is checked)
    (call,) = recorded_calls(tmp_path, script, *args)
    if script.startswith(("04", "06")):  # torchrun through the project's Python on every node, never a bare torchrun
        launcher, call = torchrun_and_script(call)
        assert (launcher.nnodes, launcher.nproc_per_node, launcher.rdzv_backend) == ("1", "4", "c10d")
        assert launcher.rdzv_endpoint == f"10.1.2.7:{20000 + 1234}" and launcher.rdzv_id == "1234"
        assert launcher.max_restarts == 3 and not launcher.standalone
    if call[:2] == ["-m", "clid.captions"]:
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
    if args == ("scoring",):  # (parsed only beside a checkpoint to continue)
        assert call[call.index("--continue-from") + 1].endswith("/extended")
        assert call[call.index("--max-steps") + 1] == "200000" and call[call.index("--batch-size") + 1] == "64"
        return
    module = import_script(call[0], "slurm_" + call[0][:2])
    parsed = module.parse_args(call[1:])
    if hasattr(parsed, "captions") or hasattr(parsed, "refs"):  # the converted captions, never the raw files
        assert (getattr(parsed, "captions", None) or parsed.refs) == "/data/coco/karpathy.json"
    if hasattr(parsed, "features"):
        assert parsed.features == "/data/coco/features.h5"
    if script == "02_captions.sbatch":  # both graph sources
        assert parsed.scene_graphs == ["/data/coco/scene_graphs.json", "/data/coco/sgg/predictions.tsv"]
        assert parsed.labelmap and parsed.sizes and parsed.image_data
    if script.startswith("04"):  # the authors' schedule (slurm/common.sh): global batch 64, one 300,000-step cosine
        assert parsed.batch_size == 64
        if args[0] == "extended":
            assert parsed.lr_horizon == 300000


def test_the_demo_world_settings_parse(tmp_path):
    """WORLD=demo (what make slurm-check runs) gives each stage the demo world's offline stand-ins."""
    data = tmp_path / "demo"
    calls = {}
    for script, args in [("01_saliency.sbatch", ()), ("03_paraphrase.sbatch", ()), ("04_train_base.sbatch", ("extended",)),
                         ("06_train_selection.sbatch", ()), ("07_eval.sbatch", ())]:
        (calls[script],) = recorded_calls(tmp_path, script, *args, WORLD="demo", DATA=str(data), STEPS="40", BATCH="8",
                                          GPUS="0", SLURM_GPUS_ON_NODE="")
        (tmp_path / "calls.jsonl").unlink()
    assert "--method" not in calls["01_saliency.sbatch"]  # the spectral residual, no weights to download
    assert calls["03_paraphrase.sbatch"][calls["03_paraphrase.sbatch"].index("--model") + 1] == "rules"
    launcher, extended = torchrun_and_script(calls["04_train_base.sbatch"])
    assert launcher.nproc_per_node == "1"  # GPUS=0: one CPU process a node
    parsed = import_script("04_train_base.py", "slurm_04").parse_args(extended[1:])
    assert (parsed.recipe, parsed.max_steps, parsed.lr_horizon, parsed.batch_size) == ("demo", 40, 120, 8)
    assert parsed.captions == str(data / "captions.json")
    _, selection = torchrun_and_script(calls["06_train_selection.sbatch"])
    assert import_script("06_train_selection.py", "slurm_06").parse_args(selection[1:]).max_steps == 40
    assert import_script("07_eval.py", "slurm_07").parse_args(calls["07_eval.sbatch"][1:]).long_refs == \
        str(data / "long_refs.json")


def test_every_sbatch_appends_to_its_log_and_asks_for_no_fixed_gpu_count():
    for path in (ROOT / "slurm").glob("*.sbatch"):
        text = path.read_text()
        assert "#SBATCH --open-mode=append" in text, path  # a requeued job's log keeps its first attempt
        assert "--gres" not in re.sub(r"#(?!SBATCH).*", "", text), path  # submit_all.sh asks for GPUS


def test_no_sbatch_script_calls_a_bare_torchrun():
    for path in list((ROOT / "slurm").glob("*.sbatch")) + list((ROOT / "slurm").glob("*.sh")):
        commands = [line.split("#")[0] for line in path.read_text().splitlines()]
        assert not any(re.search(r"(^|[;&|(]\s*)torchrun\b", line.strip()) for line in commands), path


def submit(tmp_path, *args, **settings):
    runs = tmp_path / "runs"
    env = fake_commands(tmp_path, sbatch=f'echo "$* logs:$([ -d {runs}/logs ] && echo yes || echo no)" >> {tmp_path}/sbatch.txt; '
                                          'echo $RANDOM')
    env.update(RUNS=str(runs), **settings)
    done = subprocess.run(["bash", "slurm/submit_all.sh", *args], env=env, cwd=ROOT, capture_output=True, text=True)
    sbatch = tmp_path / "sbatch.txt"
    return done, sbatch.read_text().splitlines() if sbatch.exists() else []


def by_script(calls: list) -> dict:
    return {line.split(".sbatch")[0].rsplit("/", 1)[-1] + line.split(".sbatch")[1].split(" logs:")[0]: line
            for line in calls}


def test_submit_all_passes_extra_flags_to_every_job_and_makes_the_log_folder_first(tmp_path):
    done, calls = submit(tmp_path, "--account=proj123", "--partition=gpu", "--qos=normal")
    assert done.returncode == 0, done.stderr
    scripts = {line.split(".sbatch")[0].rsplit("/", 1)[-1] for line in calls}
    assert len(calls) == 16 and {"00_convert", "00_features", "01_saliency", "04_train_base", "06_train_selection", "07_eval",
                                 "merge"} <= scripts
    for line in calls:
        assert "--account=proj123 --partition=gpu --qos=normal" in line and f"--output={tmp_path}/runs/logs/" in line
        assert "--kill-on-invalid-dep=yes" in line  # a job whose dependency failed is cancelled, not left pending
        assert line.endswith("logs:yes")
    record = (tmp_path / "runs" / "logs" / "submitted.tsv").read_text().splitlines()
    assert len(record) == 17 and record[0].split("\t") == ["name", "job", "after", "command"]
    assert record[-1].split("\t")[:3][0::2] == ["eval", "selection trusted"]


@pytest.mark.parametrize("gpus, nodes", [("1", "1"), ("2", "1"), ("4", "2"), ("0", "3")])
def test_gpus_and_nodes_set_the_training_jobs_resources(tmp_path, gpus, nodes):
    done, calls = submit(tmp_path, GPUS=gpus, NODES=nodes)
    assert done.returncode == 0, done.stderr
    for name, line in by_script(calls).items():
        training = name.startswith(("04_train_base", "06_train_selection"))
        one_gpu = name.startswith(("01_", "03_", "05_", "07_"))
        expected = f"--gres=gpu:{gpus}" if training else "--gres=gpu:1" if one_gpu else None
        gres = re.findall(r"--gres=\S+", line)
        assert gres == ([expected] if expected and gpus != "0" else []), line
        assert (f"--nodes={nodes} --ntasks-per-node=1" in line) == training, line


def test_dry_run_prints_the_jobs_and_their_dependencies_and_submits_nothing(tmp_path):
    done, calls = submit(tmp_path, "--dry-run", "--account=proj123", GPUS="2")
    assert done.returncode == 0, done.stderr
    assert calls == []  # sbatch never ran
    assert not (tmp_path / "runs" / "logs" / "submitted.tsv").exists()
    lines = done.stdout.splitlines()
    jobs = {line.split()[0]: line for line in lines if " sbatch " in line}
    assert len(jobs) == 16
    assert re.match(r"eval +after selection trusted +sbatch ", jobs["eval"])
    assert "--dependency=afterok:score-merge" in jobs["selection"] and "--gres=gpu:2" in jobs["selection"]
    assert "--account=proj123" in jobs["convert"] and "--dependency" not in jobs["convert"]
    assert "not submitted" in lines[-1]


# Bad settings: one line naming the setting, exit 1, nothing submitted (the bad-input table of slurm/common.sh).
@pytest.mark.parametrize("setting, value, says", [
    ("WORLD", "imagenet", "WORLD must be coco or demo"),
    ("GPUS", "two", "GPUS must be a whole number"),
    ("NODES", "0", "SHARDS and NODES must be at least 1"),
    ("NODES", "-1", "NODES must be a whole number"),
    ("SHARDS", "0", "SHARDS and NODES must be at least 1"),
    ("MAX_RESTARTS", "1.5", "MAX_RESTARTS must be a whole number"),
    ("STAGE", "/no/such/folder", "STAGE=/no/such/folder is not a folder"),
    ("PY", "/no/such/python", "/no/such/python not found"),
    ("STEPS", "0", "STEPS must be a positive whole number"),
    ("BATCH", "8x", "BATCH must be a positive whole number"),
    ("LOG_EVERY", "-5", "LOG_EVERY must be a positive whole number"),
    ("SAVE_EVERY", "0", "SAVE_EVERY must be a positive whole number"),
    ("SHARDS", "08", "SHARDS must be a whole number (digits, at most 9), not '08'"),  # (bash would read octal)
    ("SHARDS", "99999999999999999999", "SHARDS must be a whole number"),  # (bash's arithmetic would wrap round)
    ("GPUS", "1\n2", "GPUS must be a whole number (digits, at most 9), not $'1\\n2'"),
    ("NODES", "HOME[$(touch x)]", "NODES must be a whole number"),
    ("STEPS", "99999999999", "STEPS must be a positive whole number"),
    ("PY", "  ", "PY (empty) not found"),
])
def test_a_bad_setting_is_one_line_and_submits_nothing(tmp_path, setting, value, says):
    demo = {"WORLD": "demo"} if setting in ("STEPS", "BATCH", "LOG_EVERY", "SAVE_EVERY") else {}  # (the demo world's settings)
    done, calls = submit(tmp_path, **{setting: value}, **demo)
    assert done.returncode == 1 and calls == []
    assert done.stderr.strip().count("\n") == 0 and done.stderr.startswith("error: ") and says in done.stderr


def test_without_sbatch_one_line_and_nothing_submitted(tmp_path):
    env = fake_commands(tmp_path)
    env.update(RUNS=str(tmp_path / "runs"))
    if any((Path(folder) / "sbatch").exists() for folder in env["PATH"].split(":")):
        pytest.skip("a real sbatch is installed here (make slurm-check installs Slurm): this needs a machine without")
    done = subprocess.run(["bash", "slurm/submit_all.sh"], env=env, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 1 and done.stderr.startswith("error: sbatch not found") and done.stderr.count("\n") == 1
    assert not list((tmp_path / "runs" / "logs").glob("submitted*"))


def test_sbatch_failing_midway_keeps_the_record_of_the_jobs_submitted(tmp_path):
    """The third sbatch call fails: one line of the script's own, and submitted.tsv names the two jobs before it."""
    count = tmp_path / "count"
    env = fake_commands(tmp_path, sbatch=f'echo x >> {count}; (( $(wc -l < {count}) < 3 )) || '
                                         '{ echo "sbatch: error: QOSMaxSubmitJobPerUserLimit" >&2; exit 1; }; echo $RANDOM')
    env.update(RUNS=str(tmp_path / "runs"))
    done = subprocess.run(["bash", "slurm/submit_all.sh"], env=env, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1].startswith("error: sbatch failed on job features-merge (exit 1); the 2 jobs")
    record = (tmp_path / "runs" / "logs" / "submitted.tsv").read_text().splitlines()
    assert [line.split("\t")[0] for line in record] == ["name", "convert", "features"]
    assert not (tmp_path / "runs" / "logs" / "submitted.tsv.part").exists()


def test_a_dry_run_fails_on_the_recipe_as_the_real_run_would(tmp_path):
    """submit_all.sh checks the world's recipe (clid/run/recipes.py check) before it plans a job, dry run or not."""
    wrapper = tmp_path / "py"
    wrapper.write_text(f'#!/usr/bin/env bash\nif [ "$2" = check ]; then echo "error: recipes/$3.toml: [train] '
                       f'batch_size = \\"64\\": must be a number" >&2; exit 1; fi\nexec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    done, calls = submit(tmp_path, "--dry-run", PY=str(wrapper))
    assert done.returncode == 1 and calls == [] and " sbatch " not in done.stdout
    assert done.stderr.strip() == 'error: recipes/coco.toml: [train] batch_size = "64": must be a number'


def test_a_training_job_with_fewer_gpus_than_asked_says_how_to_submit_it(tmp_path):
    done = subprocess.run(["bash", "slurm/04_train_base.sbatch", "trusted"], env=job_env(tmp_path, GPUS="4",
                          SLURM_GPUS_ON_NODE="1"), cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 1
    assert "error: GPUS=4 but the job has 1 GPUs a node: submit it with --gres=gpu:4" in done.stderr


def test_a_failed_array_task_names_its_shard(tmp_path):
    env = job_env(tmp_path, WORLD="demo", DATA=str(tmp_path / "no-data"), SLURM_JOB_NAME="clid-00-features",
                  SLURM_ARRAY_JOB_ID="77", SLURM_ARRAY_TASK_ID="3", SLURM_ARRAY_TASK_COUNT="8", SLURM_JOB_ID="80")
    done = subprocess.run(["bash", "slurm/00_features.sbatch"], env=env, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 1
    assert done.stdout.startswith("clid-00-features job 77_3 (shard 3 of 8) on gpu-node-7, attempt 1;")
    assert "features.h5 not found: write the demo world first" in done.stderr
    assert "error: clid-00-features shard 3 of 8 (job 77_3) failed with exit code 1 on " in done.stderr


def test_a_training_job_told_to_stop_passes_sigterm_on_and_is_requeued(tmp_path):
    """sbatch --signal=B:TERM@600 signals the batch shell: the stage gets it, saves, and the job is requeued."""
    stage = tmp_path / "stage.py"
    stage.write_text("import signal, sys, time\n"
                     "signal.signal(signal.SIGTERM, lambda *a: (print('saved', flush=True), sys.exit(143)))\n"
                     "print('started', flush=True)\n"
                     "time.sleep(60)\n")
    env = job_env(tmp_path)
    shell = subprocess.Popen(["bash", "-c", f"source slurm/common.sh; run_requeueable {sys.executable} {stage}"],
                             env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert shell.stdout.readline().startswith("clid job 1234 on gpu-node-7, attempt 1;")
    assert shell.stdout.readline().strip() == "started"
    shell.send_signal(signal.SIGTERM)
    rest = shell.stdout.read()
    assert shell.wait(timeout=60) == 0
    assert "saved" in rest and "was told to stop (SIGTERM) and saved its checkpoint; requeued" in rest
    assert (tmp_path / "scontrol.txt").read_text().split() == ["requeue", "1234"]


@pytest.mark.slow
def test_torchrun_told_to_stop_ends_in_one_line_not_a_traceback(tmp_path):
    """slurm/torchrun.py: the workers get the SIGTERM and save; the launcher ends with one line and 143."""
    worker = tmp_path / "worker.py"
    worker.write_text("import signal, sys, time\n"
                      "signal.signal(signal.SIGTERM, lambda *a: (print('worker saved', flush=True), sys.exit(143)))\n"
                      "print('worker started', flush=True)\n"
                      "time.sleep(120)\n")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    launcher = subprocess.Popen([sys.executable, "slurm/torchrun.py", "--standalone", "--nproc_per_node", "1", str(worker)],
                                env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert launcher.stdout.readline().strip() == "worker started"
    launcher.send_signal(signal.SIGTERM)
    out, err = launcher.communicate(timeout=120)
    assert launcher.returncode == 143
    assert "worker saved" in out
    assert "torchrun: stopped by SIGTERM: the workers were told to save and stop" in err
    assert "Traceback" not in err and "SignalException" not in err


def test_a_signal_while_torchrun_starts_its_workers_reaches_them(tmp_path):
    """slurm/torchrun.py: a SIGTERM that comes while torchrun is still starting its workers (its SignalException
    raised before it knows them, as on a loaded node) still reaches every worker, which saves and stops; the
    launcher waits for it and ends in one line and 143, leaving no process behind."""
    launcher = tmp_path / "launcher.py"
    launcher.write_text(f"""import importlib.util, subprocess, sys
from torch.distributed.elastic.multiprocessing.api import SignalException
spec = importlib.util.spec_from_file_location("torchrun", {str(ROOT / "slurm" / "torchrun.py")!r})
torchrun = importlib.util.module_from_spec(spec)
spec.loader.exec_module(torchrun)
worker = ("import signal, sys, time\\n"
          "signal.signal(signal.SIGTERM, lambda *a: (open({str(tmp_path / 'saved')!r}, 'w').close(), sys.exit(143)))\\n"
          "print('worker started', flush=True)\\n"
          "time.sleep(120)\\n")

def main():  # torchrun's main, told to stop between starting a worker and knowing it
    started = subprocess.Popen([sys.executable, "-c", worker], stdout=subprocess.PIPE, text=True)
    assert started.stdout.readline().strip() == "worker started"
    print(started.pid, flush=True)
    import signal
    raise SignalException("told to stop", signal.SIGTERM)

torchrun.launch(main)
""")
    done = subprocess.run([sys.executable, str(launcher)], capture_output=True, text=True, timeout=100)
    assert done.returncode == 143, done.stdout + done.stderr
    assert done.stderr.strip().splitlines()[-1] == "torchrun: stopped by SIGTERM: the workers were told to save and stop"
    assert (tmp_path / "saved").exists(), "the worker never got the signal"
    worker = int(done.stdout.split()[0])
    assert not Path(f"/proc/{worker}").exists(), "the worker outlived the launcher"


@pytest.mark.slow
def test_a_failing_worker_ends_torchrun_in_one_line_not_a_traceback(tmp_path):
    """slurm/torchrun.py: a worker's one-line error (rank 0 prints it) is followed by one line of the launcher's,
    naming the rank and its exit code, and exit code 1; not torchrun's ChildFailedError traceback."""
    worker = tmp_path / "worker.py"
    worker.write_text("import os, sys\n"
                      "if os.environ['RANK'] == '0':\n"
                      "    print('error: data.json: no such file', file=sys.stderr, flush=True)\n"
                      "sys.exit(1)\n")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    done = subprocess.run([sys.executable, "slurm/torchrun.py", "--standalone", "--nproc_per_node", "2", str(worker)],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert done.stderr.count("error: data.json: no such file") == 1
    assert re.search(r"torchrun: \S+: rank [01] exited with code 1 \(its error is above; 2 of the job's processes "
                     r"failed\)", done.stderr), done.stderr
    assert "Traceback" not in done.stderr and "ChildFailedError" not in done.stderr, done.stderr


def test_staging_copies_the_features_once_and_says_when_they_do_not_fit(tmp_path):
    features = tmp_path / "features.h5"
    features.write_bytes(os.urandom(4096))
    dest = tmp_path / "node-local" / "clid-job-1"
    first = subprocess.run(["bash", "slurm/stage.sh", str(features), str(dest), "4096"], cwd=ROOT, capture_output=True,
                           text=True, check=True)
    assert "staged" in first.stdout and (dest / "features.h5").read_bytes() == features.read_bytes()
    # the copy keeps the file's time: a run resumed on the file itself, or on another copy, reads the same input
    assert (dest / "features.h5").stat().st_mtime_ns == features.stat().st_mtime_ns
    again = subprocess.run(["bash", "slurm/stage.sh", str(features), str(dest), "4096"], cwd=ROOT, capture_output=True,
                           text=True, check=True)
    assert "already staged" in again.stdout  # a requeued job reuses its copy
    other = tmp_path / "node-local" / "clid-job-2"
    huge = str(1 << 60)  # more than any disk has free
    full = subprocess.run(["bash", "slurm/stage.sh", str(features), str(other), huge], cwd=ROOT, capture_output=True,
                          text=True)
    assert full.returncode == 1 and "does not fit in" in full.stdout and not other.exists()


def test_a_training_job_reads_the_staged_copy_and_removes_it_at_its_end(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "features.h5").write_bytes(b"x" * 1000)
    stage = tmp_path / "node-local"
    stage.mkdir()
    (call,) = recorded_calls(tmp_path, "06_train_selection.sbatch", DATA=str(tmp_path / "data"), STAGE=str(stage))
    _, script = torchrun_and_script(call)
    assert script[script.index("--features") + 1] == str(stage / "clid-job-1234" / "features.h5")
    assert list(stage.iterdir()) == []


def test_a_checkout_and_a_python_whose_paths_hold_a_space(tmp_path):
    """CLID_ROOT and PY with a space ("my dir"): read whole, not cut at the space."""
    folder = tmp_path / "my dir"
    folder.mkdir()
    (folder / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')  # (a link would lose the venv)
    (folder / "python").chmod(0o755)
    (folder / "checkout").symlink_to(ROOT)
    done, calls = submit(tmp_path, "--dry-run", PY=str(folder / "python"), CLID_ROOT=str(folder / "checkout"))
    assert done.returncode == 0 and "dry run: 16 jobs" in done.stdout, done.stderr


def submit_with(tmp_path, sbatch: str, earlier: str | None = "an earlier submission's record\n"):
    """submit_all.sh with a stand-in sbatch (a bash body), and an earlier run's submitted.tsv there."""
    logs = tmp_path / "runs" / "logs"
    logs.mkdir(parents=True)
    if earlier is not None:
        (logs / "submitted.tsv").write_text(earlier)
    env = fake_commands(tmp_path, sbatch=sbatch)
    env.update(RUNS=str(tmp_path / "runs"))
    done = subprocess.run(["bash", "slurm/submit_all.sh"], env=env, cwd=ROOT, capture_output=True, text=True)
    return done, (logs / "submitted.tsv").read_text().splitlines(), sorted(p.name for p in logs.iterdir())


def test_sbatch_failing_at_once_keeps_the_earlier_record(tmp_path):
    done, record, files = submit_with(tmp_path, 'echo "sbatch: error: Invalid account" >&2; exit 1')
    assert done.returncode == 1 and done.stderr.splitlines()[-1] == "error: sbatch failed on job convert (exit 1); " \
                                                                    "no job was submitted"
    assert record == ["an earlier submission's record"] and files == ["submitted.tsv"]


def test_sbatch_answering_no_job_id_is_one_line(tmp_path):
    """sbatch that exits 0 without a job id (a wrapper's chatter): no dependency is built on it."""
    done, record, files = submit_with(tmp_path, 'echo "Submitted batch job 12"')
    assert done.returncode == 1 and done.stderr.strip() == "error: sbatch failed on job convert (it answered " \
                                                           "'Submitted batch job 12', not a job id); no job was submitted"
    assert files == ["submitted.tsv"]


def test_a_federation_job_id_and_its_cluster(tmp_path):
    done, record, _ = submit_with(tmp_path, 'echo "$RANDOM;cluster-a"')
    assert done.returncode == 0, done.stderr
    assert len(record) == 17 and all(re.fullmatch(r"[0-9]+", line.split("\t")[1]) for line in record[1:])


def test_sbatch_vanishing_midway_is_one_line_of_the_script_and_the_record_kept(tmp_path):
    """The third sbatch call finds no sbatch: bash's status 127, which the stand-in gives itself, since removing it
    would let a real sbatch later on PATH (one `make slurm-check` installed) answer instead."""
    count = tmp_path / "count"
    done, record, files = submit_with(tmp_path, f'echo x >> {count}; (( $(wc -l < {count}) < 3 )) || exit 127; '
                                                'echo $RANDOM')
    assert done.returncode == 1 and done.stderr.splitlines()[-1].startswith(
        "error: sbatch failed on job features-merge (sbatch not found); the 2 jobs submitted before it are in ")
    assert [line.split("\t")[0] for line in record] == ["name", "convert", "features"] and files == ["submitted.tsv"]


def test_a_stopped_submission_keeps_the_record_of_its_jobs(tmp_path):
    """SIGTERM (or Ctrl-C) between two sbatch calls: one line, and submitted.tsv names the jobs submitted."""
    count = tmp_path / "count"
    done, record, files = submit_with(tmp_path, f'echo x >> {count}; (( $(wc -l < {count}) < 3 )) || kill -TERM $PPID; '
                                                'echo $RANDOM')
    assert done.returncode == 1 and done.stderr.strip().startswith("error: stopped by SIGTERM after submitting 3 of the "
                                                                   "16 jobs, which are in ")
    assert len(record) == 4 and files == ["submitted.tsv"]
