"""The SLURM recipes call the stages with flags the stages accept: every command of slurm/*.sbatch is
recorded (with stand-ins for python and torchrun) and parsed by its script's own argument parser."""
import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, import_script

from clid.data.__main__ import parse_args

RECORD = "import json, os, sys\nwith open(os.environ['CALLS'], 'a') as f:\n    f.write(json.dumps(sys.argv[1:]) + '\\n')\n"
TORCHRUN = 'torchrun() { while [ "${1%.py}" = "$1" ]; do shift; done; $PY "$@"; }; export -f torchrun; '


def recorded_calls(tmp_path, script, *args):
    recorder = tmp_path / "record.py"
    recorder.write_text(RECORD)
    calls = tmp_path / "calls.jsonl"
    env = dict(os.environ, PY=f"{sys.executable} {recorder}", CALLS=str(calls), CLID_ROOT=str(ROOT),
               DATA="/data/coco", RUNS=str(tmp_path / "runs"), GPUS="4")
    subprocess.run(["bash", "-c", TORCHRUN + 'bash "$@"', "bash", str(ROOT / "slurm" / script), *args],
                   env=env, check=True, cwd=ROOT, capture_output=True, text=True)
    return [json.loads(line) for line in calls.read_text().splitlines()]


@pytest.mark.parametrize("script, args", [("00_convert.sbatch", ()), ("00_features.sbatch", ()), ("01_saliency.sbatch", ()),
                                          ("02_captions.sbatch", ()), ("03_paraphrase.sbatch", ()),
                                          ("04_train_base.sbatch", ("trusted",)), ("04_train_base.sbatch", ("extended",)),
                                          ("05_score.sbatch", ()), ("06_train_selection.sbatch", ()),
                                          ("07_eval.sbatch", ()), ("build_ops.sbatch", ())])
def test_sbatch_commands_parse(tmp_path, script, args):
    (call,) = recorded_calls(tmp_path, script, *args)
    if call[:2] == ["-m", "clid.ops"]:
        from clid import ops

        assert ops.parse_args(call[2:]).command == "build"
        return
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
