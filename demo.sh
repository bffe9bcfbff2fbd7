#!/usr/bin/env bash
# The whole CLID pipeline on the demo world, stage by stage (called by `make demo`).
#
#   bash demo.sh [DEMO_DIR] [RUNS_DIR]        (defaults: data/demo, runs/demo)
#   SEEDS=3 bash demo.sh                      (three seeds: seed k >= 1 in DEMO_DIR-seedK, RUNS_DIR/seedK)
#   TASK=paragraph bash demo.sh data/demo-paragraph runs/demo-paragraph   (the paper's second task:
#                                             `make demo-paragraph`; paragraph-only baseline vs CLID)
#   COMPARE=1 bash demo.sh data/demo runs/demo-compare   (`make demo-compare`: CLID against its peers on equal
#                                             footing, and the world's ground truth; see below)
#   QUICK=1 bash demo.sh data/demo runs/quick   (`make checkpoint`: 00 to 03, then one model, M_theta~, trained
#                                             with 04 --recipe demo and the recipe's [quick] settings in
#                                             runs/quick/model: a checkpoint in minutes)
#
# Every stage resumes or skips finished work, so running it again is quick. About 37 minutes a seed on 2 idle
# CPU cores (2,244 s, seed 0, 2026-11-27: docs/demo-notes.md; README.md, "What the demo shows", the results). Seed k
# seeds the demo world (00 --seed k) and every stage after it (--seed k); with SEEDS > 1, 07
# --combine reports each method as the mean ± standard deviation of its seeds in RUNS_DIR/eval-seeds.
# The settings are recipes/demo.toml's (TASK=paragraph: recipes/paragraph.toml's), the paper's except where a
# CPU laptop needs smaller numbers; the file says why for each. As in the authors' code, the scoring model
# M_theta continues M_theta~ (04 --continue-from: its weights, optimizer state and schedule) for as many steps
# as M_theta~ trained, on one cosine three times M_theta~'s steps long (the authors': 100,000 + 100,000 steps of
# a 300,000-step cosine); 06's cosine ends with its steps. docs/running.md ("The demo") has the measurements.
set -euo pipefail
cd "$(dirname "$0")"
DEMO_DIR=${1:-data/demo}
RUNS_DIR=${2:-runs/demo}
SEEDS=${SEEDS:-1}                # independent repetitions (world and training seeds 0 .. SEEDS-1)
PY=${PY:-.venv/bin/python}
SMALL=${SMALL:-}                 # SMALL=1: the tiny world of the tests, for a quick look
TASK=${TASK:-caption}            # caption, or paragraph: 13 levels up to 129 tokens, sentence joins, eta scaled alike
COMPARE=${COMPARE:-}             # COMPARE=1: 06 also trains loss-remove, loss-replacecap, a curriculum and the whole
                                 # extended set, all as CLID trains; 07 reports them; python -m clid.demo.truth the truth
QUICK=${QUICK:-}                 # QUICK=1: stop after one model, M_theta~ with 04 --recipe demo ([quick] steps)
TABLES=${TABLES:-}               # with SEEDS > 1: also write the README's demo tables as files into this folder
                                 # (07 --combine --tables; e.g. docs/measurements/<date>-demo; python -m clid.tables)
case "$TASK" in
  caption) RECIPE=demo; baseline_name=trusted-only ;;
  paragraph) RECIPE=paragraph; baseline_name=paragraph-only ;;
  *) echo "error: TASK must be caption or paragraph, not '$TASK'"; exit 2 ;;
esac
if [ -n "$COMPARE" ] && [ "$TASK" != caption ]; then echo "error: COMPARE=1 runs the caption task only"; exit 2; fi
if [ -n "$QUICK" ] && { [ -n "$COMPARE" ] || [ "$SEEDS" != 1 ]; }; then echo "error: QUICK=1 trains one model of one seed"; exit 2; fi

# A setting of the recipe; a variable given wins. (The reader runs as a file: `python -m` would load torch.)
recipe() { "${PYTHON[@]}" clid/run/recipes.py get "$RECIPE" "$1"; }
recipe_eta() { "${PYTHON[@]}" clid/run/recipes.py eta "$RECIPE"; }
# PY as a command: a path to python (spaces allowed), or python and its first arguments (PY="python -X dev")
if [ -x "$PY" ]; then PYTHON=("$PY"); else read -ra PYTHON <<< "$PY"; fi
[ -x "${PYTHON[0]:-}" ] || { echo "error: ${PYTHON[0]:-PY (empty)} not found: run \`make venv\` first, or set PY"; exit 2; }
"${PYTHON[@]}" clid/run/recipes.py check "$RECIPE"      # every setting, as 04 and 06 will check it, before anything runs
if [ -n "$SMALL" ]; then                        # the tests' tiny world, either task
    STEPS=${STEPS_SMALL:-$(recipe small.steps)}; ETA=${ETA_SMALL:-$(recipe small.eta)}
    FT_STEPS=${FT_SMALL:-$(recipe small.scoring_steps)}
elif [ "$TASK" = paragraph ]; then
    STEPS=${STEPS_PARAGRAPH:-$(recipe resolved.steps)}; ETA=${ETA_PARAGRAPH:-$(recipe_eta)}
    FT_STEPS=${FT_PARAGRAPH:-$(recipe demo.scoring_steps)}
else
    STEPS=${STEPS:-$(recipe resolved.steps)}    # optimizer steps of each model
    ETA=${ETA:-$(recipe_eta)}                   # steps per selection iteration at the recipe's steps (06 --eta)
    FT_STEPS=${FT_STEPS:-$STEPS}                # steps of the scoring model M_theta on trusted captions: as many as M_theta~'s
fi
PER_IMAGE=${PER_IMAGE:-$(recipe world.per_image)}  # self-generated captions per image
BATCH=${BATCH:-$(recipe train.batch_size)}
LR=${LR:-$(recipe train.lr)}
levels=(--levels "$(recipe train.levels)")
world=(--n-train "${N_TRAIN:-$(recipe world.n_train)}")  # train images of the demo world
if [ -n "$SMALL" ]; then world=(--small); fi
decode_extra=()
if [ "$TASK" = paragraph ]; then world+=(--paragraphs); decode_extra=(--decode-steps "$(recipe demo.decode_steps)"); fi
# Each number, given or the recipe's, checked before the shell computes with it (inside $(( )) the shell would
# evaluate a variable's text, running what it holds) and before any stage runs
for setting in SEEDS STEPS ETA FT_STEPS PER_IMAGE BATCH ${N_TRAIN:+N_TRAIN} ${CURATE_EVERY:+CURATE_EVERY} \
               ${EXT_HORIZON:+EXT_HORIZON} ${CLID_DEMO_STEPS:+CLID_DEMO_STEPS}; do
    [[ ${!setting} =~ ^[1-9][0-9]{0,8}$ ]] || { echo "error: $setting must be a positive whole number (digits, at most 9), not ${!setting@Q}"; exit 2; }
done
[[ $LR =~ ^([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]{1,2})?$ && ${LR%%[eE]*} =~ [1-9] ]] || {
    echo "error: LR must be a positive number (as 2e-3), not ${LR@Q}"; exit 2; }
case ${PARAPHRASER:-rules} in  # 03 --model: the offline ones, or a Pegasus folder
  rules|sentences) ;;
  *) [ -d "$PARAPHRASER" ] || { echo "error: PARAPHRASER must be rules, sentences or a model folder, not ${PARAPHRASER@Q}"; exit 2; } ;;
esac
[[ -z ${OMP_NUM_THREADS:-} || $OMP_NUM_THREADS =~ ^[1-9][0-9]{0,3}$ ]] || {
    echo "error: OMP_NUM_THREADS must be a positive whole number (threads, at most 4 digits), not ${OMP_NUM_THREADS@Q}"; exit 2; }
if [ -n "$TABLES" ]; then  # 07 --combine --tables writes them at the very end: checked now, not after hours
    [ "$SEEDS" -gt 1 ] || { echo "error: TABLES holds the tables of several seeds (07 --combine): give SEEDS=2 or more"; exit 2; }
    said=$("${PYTHON[@]}" -m clid.tables --can-write "$TABLES" 2>&1) || { echo "${said##*$'\n'}"; exit 2; }
fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
CURATE_EVERY=${CURATE_EVERY:-$(( STEPS / 10 ))}  # COMPARE: ten loss curations in a run, as their ten epochs (docs/running.md)
# M_theta~'s cosine, which the scoring model continues: the authors' proportions, the recipe's extended_horizon
# (3) times M_theta~'s steps; the miniature and the paragraph demo keep the short scoring model they were measured
# with, M_theta~'s cosine ending with its last step (docs/running.md)
if [ -n "$SMALL" ] || [ "$TASK" = paragraph ]; then horizon=$(( STEPS + FT_STEPS ))
else horizon=$(( $(recipe resolved.extended_horizon) * STEPS )); fi
EXT_HORIZON=${EXT_HORIZON:-$horizon}

banner() { printf '\n==== %s ====  (%s)\n' "$*" "$(date +%H:%M:%S)"; }
# wait for a background stage; on failure show the end of its log and stop
await() { wait "$1" || { tail -n 20 "$2"; echo "error: $3 failed (log: $2)"; exit 1; }; }
started=$(date +%s)
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT   # no background stage outlives the script

# The whole pipeline for one seed: run_seed SEED DEMO RUNS
run_seed() {
SEED=$1 DEMO=$2 RUNS=$3
CAPTIONS=$DEMO/captions.json     # the trusted set: the world's captions, or its paragraphs
eval_extra=(--long-refs "$DEMO/long_refs.json")
if [ "$TASK" = paragraph ]; then CAPTIONS=$DEMO/paragraphs/paragraphs_v1.json; eval_extra=("${decode_extra[@]}"); fi
mkdir -p "$RUNS"
banner "00 demo world: rendered scenes, scene graphs, trusted captions, region features"
"${PYTHON[@]}" 00_demo_data.py --out "$DEMO" --preview 16 "${world[@]}" --seed "$SEED"
"${PYTHON[@]}" -m clid.stats "$CAPTIONS" --split train "${levels[@]}"

banner "01 saliency (spectral residual)"
"${PYTHON[@]}" 01_saliency.py --images "$DEMO/images" --list "$CAPTIONS" --out "$RUNS/saliency.h5" \
    --preview 8 --scene-graphs "$DEMO/scene_graphs.json" --image-data "$DEMO/image_data.json"

# with COMPARE, each caption records what it states wrongly against the world's true graphs (its 'truth')
truth=(); include_trusted=()
if [ -n "$COMPARE" ]; then truth=(--clean-graphs "$DEMO/scene_graphs_clean.json"); include_trusted=(--include-trusted); fi
banner "02 self-generated captions from the scene graphs (saliency-guided walks)"
"${PYTHON[@]}" 02_scenegraph_captions.py --scene-graphs "$DEMO/scene_graphs.json" --image-data "$DEMO/image_data.json" \
    --saliency "$RUNS/saliency.h5" --out "$RUNS/selfgen.jsonl" --per-image "$PER_IMAGE" --seed "$SEED" "${levels[@]}" \
    ${truth[@]+"${truth[@]}"}

# offline rules stand in for Pegasus; the quick checkpoint's ([quick] of the recipe) also write each walk as
# clauses with verbs, since its long levels learn from these captions alone (docs/decoding.md)
default_paraphraser=rules
if [ -n "$QUICK" ]; then default_paraphraser=$(recipe quick.paraphraser); fi
PARAPHRASER=${PARAPHRASER:-$default_paraphraser}   # 03 --model: rules or sentences
banner "03 paraphrase (rule-based, offline: --model $PARAPHRASER)"
"${PYTHON[@]}" 03_paraphrase.py --in "$RUNS/selfgen.jsonl" --out "$RUNS/paraphrased.jsonl" --model "$PARAPHRASER" --seed "$SEED" "${levels[@]}"

if [ -n "$QUICK" ]; then
    # one thread: this tiny model's matrices are small, and a second thread costs more than it gives
    # (30 steps on 2 cores: 2.6 steps/s with one thread, 1.7 with two)
    # [quick] steps on M_theta~'s cosine (CLID_DEMO_STEPS, a smoke test's, scales both)
    quick_steps=${CLID_DEMO_STEPS:-$(recipe quick.steps)}
    quick_horizon=$(( quick_steps * $(recipe quick.lr_horizon) / $(recipe quick.steps) ))
    banner "04 a quick checkpoint: M_theta~ on trusted + self-generated captions, --recipe demo, $quick_steps steps"
    OMP_NUM_THREADS=1 "${PYTHON[@]}" 04_train_base.py --recipe demo --captions "$CAPTIONS" --features "$DEMO/features.h5" --data extended \
        --selfgen "$RUNS/paraphrased.jsonl" --out "$RUNS/model" --seed "$SEED" "${levels[@]}" \
        --max-steps "$quick_steps" --lr-horizon "$quick_horizon"
    return
fi

# every model shares the output shortlist: the tokens of the trusted and self-generated captions; --recipe demo
# sets the rest (tiny model, warm-up 100, no dropout, standardized regions: recipes/demo.toml)
train=(--features "$DEMO/features.h5" --recipe demo --output-vocab "$CAPTIONS" "$RUNS/paraphrased.jsonl"
       --max-steps "$STEPS" --batch-size "$BATCH" --lr "$LR" --seed "$SEED" "${levels[@]}")

# Two one-thread trainings run 1.3x faster on two cores than one two-thread training after the other
# (these matrices are small), so the pipeline runs in two lanes: the trusted-only baseline, then its
# evaluation captions (07 caches them in eval/generated/), in the background; M_theta~, then the
# scoring model M_theta fine-tuned from it, in the foreground. 05 runs as two shards, as it would
# on a cluster (here as fast as one two-thread process). One seed gives one result: every 04, 05, 06 and
# 07 runs on one torch thread (04/06: the recipe's threads = 1; 07: --threads 1), in `make demo`, `make
# demo-compare` and `make checkpoint` alike, whatever OMP_NUM_THREADS says (docs/demo-notes.md)
evaluate=(07_eval.py --refs "$CAPTIONS" --features "$DEMO/features.h5" --selfgen "$RUNS/paraphrased.jsonl"
          --out "$RUNS/eval" --threads 1 "${eval_extra[@]}")
banner "04 trusted-only baseline (M_theta of the paper, trusted captions alone): in the background, log $RUNS/trusted.log"
( export OMP_NUM_THREADS=1
  "${PYTHON[@]}" 04_train_base.py --captions "$CAPTIONS" --data trusted --out "$RUNS/trusted" "${train[@]}"
  "${PYTHON[@]}" "${evaluate[@]}" --checkpoint "$RUNS/trusted" --name "$baseline_name" ) > "$RUNS/trusted.log" 2>&1 &
baseline=$!

# M_theta~'s cosine (EXT_HORIZON) is the one schedule the scoring model continues, as in the authors' code
banner "04 M_theta~ on trusted + self-generated captions (also the extended-only baseline)"
OMP_NUM_THREADS=1 "${PYTHON[@]}" 04_train_base.py --captions "$CAPTIONS" --data extended \
    --selfgen "$RUNS/paraphrased.jsonl" --out "$RUNS/extended" "${train[@]}" --lr-horizon "$EXT_HORIZON"

banner "04 scoring model M_theta: M_theta~ continued on the trusted captions (the authors' code)"
OMP_NUM_THREADS=1 "${PYTHON[@]}" 04_train_base.py --captions "$CAPTIONS" --data trusted --continue-from "$RUNS/extended" \
    --out "$RUNS/trusted_ft" "${train[@]}" --max-steps $(( STEPS + FT_STEPS ))
await "$baseline" "$RUNS/trusted.log" "the trusted-only baseline"
grep -E "^checkpoint|already trained" "$RUNS/trusted.log" || true

banner "05 quality scores u = log p(y|x; theta) - log p(y|x; theta~), two shards (shard 1 log: $RUNS/quality.log)"
score=(05_score_quality.py --trusted "$RUNS/trusted_ft" --extended "$RUNS/extended" --selfgen "$RUNS/paraphrased.jsonl"
       --features "$DEMO/features.h5" --captions "$CAPTIONS" --out "$RUNS/quality.h5" --num-shards 2 --seed "$SEED"
       ${include_trusted[@]+"${include_trusted[@]}"})
OMP_NUM_THREADS=1 "${PYTHON[@]}" "${score[@]}" --shard-id 1 > "$RUNS/quality.log" 2>&1 &
shard1=$!
OMP_NUM_THREADS=1 "${PYTHON[@]}" "${score[@]}" --shard-id 0
await "$shard1" "$RUNS/quality.log" "05 shard 1"
[ -f "$RUNS/quality.h5" ] || "${PYTHON[@]}" -m clid.shard merge "$RUNS/quality.h5" --num-shards 2

selection=(06_train_selection.py --captions "$CAPTIONS" --selfgen "$RUNS/paraphrased.jsonl" --quality "$RUNS/quality.h5"
        --eta "$ETA" "${train[@]}" --lr-horizon "$STEPS")
if [ -n "$COMPARE" ]; then compare_seed; return; fi
banner "06 CLID: training with gradual data selection (c=2, s=1, eta=$ETA)"
OMP_NUM_THREADS=1 "${PYTHON[@]}" "${selection[@]}" --out "$RUNS/clid"

banner "07 evaluation: $baseline_name vs extended-only vs CLID"
"${PYTHON[@]}" "${evaluate[@]}" --checkpoint "$RUNS/trusted" --checkpoint "$RUNS/extended" --checkpoint "$RUNS/clid" \
    --name "$baseline_name" --name extended-only --name CLID

banner "gallery: $baseline_name and CLID side by side on 8 test images ($RUNS/gallery.html)"
gallery=(--features "$DEMO/features.h5" --ids "$CAPTIONS" --split test --limit 8 --threads 1 "${decode_extra[@]}")
"${PYTHON[@]}" -m clid.caption --checkpoint "$RUNS/trusted" "${gallery[@]}" --out "$RUNS/gallery/$baseline_name.jsonl"
"${PYTHON[@]}" -m clid.caption --checkpoint "$RUNS/clid" --name CLID "${gallery[@]}" --out "$RUNS/gallery/CLID.jsonl" \
    --gallery "$RUNS/gallery.html" --images "$DEMO/images" --compare "$baseline_name=$RUNS/gallery/$baseline_name.jsonl"
}

# COMPARE=1: CLID and its peers, each trained by 06 on the same data, model, steps, batch and seed, and all
# reusing this seed's trusted-only baseline, M_theta~, scoring model and u. Extended-only is 06 on the whole
# extended set (--strategy none), so it trains as the others do; the curriculum's difficulty is the loss under
# the trusted-only baseline (Simi-CL's Bootstrap-CL). Two lanes of one-thread trainings, as the 04s above.
compare_seed() {
banner "06 in two lanes: CLID, loss-remove, extended-only | loss-replacecap, curriculum (lane 2 log: $RUNS/lane2.log)"
( export OMP_NUM_THREADS=1
  "${PYTHON[@]}" "${selection[@]}" --strategy loss-replacecap --curate-every "$CURATE_EVERY" --out "$RUNS/loss-replacecap"
  "${PYTHON[@]}" "${selection[@]}" --strategy curriculum --difficulty "bootstrap:$RUNS/trusted" --out "$RUNS/curriculum"
) > "$RUNS/lane2.log" 2>&1 &
lane2=$!
OMP_NUM_THREADS=1 "${PYTHON[@]}" "${selection[@]}" --out "$RUNS/clid"
OMP_NUM_THREADS=1 "${PYTHON[@]}" "${selection[@]}" --strategy loss-remove --curate-every "$CURATE_EVERY" --out "$RUNS/loss-remove"
OMP_NUM_THREADS=1 "${PYTHON[@]}" "${selection[@]}" --strategy none --out "$RUNS/extended-06"
await "$lane2" "$RUNS/lane2.log" "lane 2 (loss-replacecap, curriculum)"
grep -E "^curation time|^checkpoint|already trained" "$RUNS/lane2.log" || true

banner "07 evaluation: $baseline_name, extended-only, CLID, loss-remove, loss-replacecap, curriculum"
"${PYTHON[@]}" "${evaluate[@]}" --checkpoint "$RUNS/trusted" --checkpoint "$RUNS/extended-06" --checkpoint "$RUNS/clid" \
    --checkpoint "$RUNS/loss-remove" --checkpoint "$RUNS/loss-replacecap" --checkpoint "$RUNS/curriculum" \
    --name "$baseline_name" --name "extended-only (06 --strategy none)" --name CLID --name loss-remove \
    --name loss-replacecap --name curriculum

banner "ground truth: every scorer and every run against the captions known to be wrong"
"${PYTHON[@]}" -m clid.demo.truth --selfgen "$RUNS/paraphrased.jsonl" --quality "$RUNS/quality.h5" --seed "$SEED" \
    --difficulty "$RUNS/curriculum/difficulty.h5" --run "CLID=$RUNS/clid" --run "loss-remove=$RUNS/loss-remove" \
    --run "loss-replacecap=$RUNS/loss-replacecap" --run "curriculum=$RUNS/curriculum" \
    --run "extended-only (06 --strategy none)=$RUNS/extended-06" --out "$RUNS/truth"
}

evals=(); truths=()
for (( seed = 0; seed < SEEDS; seed++ )); do
    if (( seed == 0 )); then run_seed 0 "$DEMO_DIR" "$RUNS_DIR"; evals+=("$RUNS_DIR/eval"); truths+=("$RUNS_DIR/truth")
    else run_seed "$seed" "$DEMO_DIR-seed$seed" "$RUNS_DIR/seed$seed"; evals+=("$RUNS_DIR/seed$seed/eval")
         truths+=("$RUNS_DIR/seed$seed/truth"); fi
done
report="$RUNS_DIR/eval/report.md"
if [ -n "$QUICK" ]; then
    banner "done in $(( $(date +%s) - started )) s: the checkpoint $RUNS_DIR/model (README.md: captions of your photos)"
    exit 0
fi
if (( SEEDS > 1 )); then
    banner "07 the $SEEDS seeds together: each method's mean ± standard deviation, 95% intervals and the claims"
    "${PYTHON[@]}" 07_eval.py --combine "${evals[@]}" --out "$RUNS_DIR/eval-seeds" ${TABLES:+--tables "$TABLES"}
    report="$RUNS_DIR/eval-seeds/report.md"
    if [ -n "$COMPARE" ]; then "${PYTHON[@]}" -m clid.demo.truth --combine "${truths[@]}" --out "$RUNS_DIR/truth-seeds"
                               report="$report and $RUNS_DIR/truth-seeds/truth.md"; fi
elif [ -n "$COMPARE" ]; then report="$report and $RUNS_DIR/truth/truth.md"
fi
banner "done in $(( $(date +%s) - started )) s: see $report and $RUNS_DIR/gallery.html"
