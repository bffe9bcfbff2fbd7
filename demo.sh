#!/usr/bin/env bash
# The whole CLID pipeline on the demo world, stage by stage (called by `make demo`).
#
#   bash demo.sh [DEMO_DIR] [RUNS_DIR]        (defaults: data/demo, runs/demo)
#
# Every stage resumes or skips finished work, so running it again is quick.
# The settings below are the paper's, except where a CPU laptop needs smaller numbers: the tiny
# model, a shortlisted output vocabulary, fewer self-generated captions per image and fewer
# optimizer steps (eta scaled with them). One choice is the authors' code rather than the paper:
# the trusted model that scores the captions (05) continues from the extended one (04 --init-from);
# README.md, "What the demo shows", says why.
set -euo pipefail
cd "$(dirname "$0")"
DEMO=${1:-data/demo}
RUNS=${2:-runs/demo}
PY=${PY:-.venv/bin/python}
SMALL=${SMALL:-}                 # SMALL=1: the tiny world of the tests, for a quick look
STEPS=${STEPS:-1500}             # optimizer steps of each model
ETA=${ETA:-18}                   # steps per selection iteration (the paper: 1200 of 100,000 = 1.2%)
FT_STEPS=${FT_STEPS:-300}        # fine-tuning steps of the scoring model M_theta on trusted captions
PER_IMAGE=${PER_IMAGE:-3}        # self-generated captions per image (the paper: 5)
BATCH=${BATCH:-64}
LR=${LR:-1e-3}                   # a randomly initialised tiny model learns faster than BERT fine-tuning's 5e-5
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
small=()
if [ -n "$SMALL" ]; then small=(--small); STEPS=${STEPS_SMALL:-200}; ETA=${ETA_SMALL:-3}; FT_STEPS=${FT_SMALL:-40}; fi

banner() { printf '\n==== %s ====  (%s)\n' "$*" "$(date +%H:%M:%S)"; }
started=$(date +%s)
mkdir -p "$RUNS"

banner "00 demo world: rendered scenes, scene graphs, trusted captions, region features"
$PY 00_demo_data.py --out "$DEMO" --preview 16 "${small[@]}"
$PY -m clid.stats "$DEMO/captions.json" --split train

banner "01 saliency (spectral residual)"
$PY 01_saliency.py --images "$DEMO/images" --list "$DEMO/captions.json" --out "$RUNS/saliency.h5" \
    --preview 8 --scene-graphs "$DEMO/scene_graphs.json" --image-data "$DEMO/image_data.json"

banner "02 self-generated captions from the scene graphs (saliency-guided walks)"
$PY 02_scenegraph_captions.py --scene-graphs "$DEMO/scene_graphs.json" --image-data "$DEMO/image_data.json" \
    --saliency "$RUNS/saliency.h5" --out "$RUNS/selfgen.jsonl" --per-image "$PER_IMAGE"

banner "03 paraphrase (rule-based, offline)"
$PY 03_paraphrase.py --in "$RUNS/selfgen.jsonl" --out "$RUNS/paraphrased.jsonl" --model rules
$PY -m clid.stats "$RUNS/paraphrased.jsonl"

# all three models share the output shortlist: the tokens of the trusted and self-generated captions
train=(--features "$DEMO/features.h5" --preset tiny --output-vocab "$DEMO/captions.json" "$RUNS/paraphrased.jsonl"
       --max-steps "$STEPS" --batch-size "$BATCH" --lr "$LR" --warmup 100 --save-every 500
       --eval-every 0 --log-every 50)

banner "04 trusted-only baseline (M_theta of the paper, trained on the trusted captions alone)"
$PY 04_train_base.py --captions "$DEMO/captions.json" --data trusted --out "$RUNS/trusted" "${train[@]}"

banner "04 M_theta~ on trusted + self-generated captions (also the extended-only baseline)"
$PY 04_train_base.py --captions "$DEMO/captions.json" --data extended --selfgen "$RUNS/paraphrased.jsonl" \
    --out "$RUNS/extended" "${train[@]}"

banner "04 scoring model M_theta: M_theta~ fine-tuned on the trusted captions (the authors' code)"
$PY 04_train_base.py --captions "$DEMO/captions.json" --data trusted --init-from "$RUNS/extended" \
    --out "$RUNS/trusted_ft" "${train[@]}" --max-steps "$FT_STEPS" --warmup $(( FT_STEPS / 10 ))

banner "05 quality scores u = log p(y|x; theta) - log p(y|x; theta~)"
$PY 05_score_quality.py --trusted "$RUNS/trusted_ft" --extended "$RUNS/extended" --selfgen "$RUNS/paraphrased.jsonl" \
    --features "$DEMO/features.h5" --captions "$DEMO/captions.json" --out "$RUNS/quality.h5"

banner "06 CLID: training with gradual data selection (c=2, s=1, eta=$ETA)"
$PY 06_train_selection.py --captions "$DEMO/captions.json" --selfgen "$RUNS/paraphrased.jsonl" \
    --quality "$RUNS/quality.h5" --out "$RUNS/clid" --eta "$ETA" "${train[@]}"

banner "07 evaluation: trusted-only vs extended-only vs CLID"
$PY 07_eval.py --refs "$DEMO/captions.json" --long-refs "$DEMO/long_refs.json" --features "$DEMO/features.h5" \
    --selfgen "$RUNS/paraphrased.jsonl" --checkpoint "$RUNS/trusted" --checkpoint "$RUNS/extended" \
    --checkpoint "$RUNS/clid" --name trusted-only --name extended-only --name CLID --out "$RUNS/eval"

banner "done in $(( $(date +%s) - started )) s: see $RUNS/eval/report.md"
