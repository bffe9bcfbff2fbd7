# Settings shared by the sbatch scripts and submit_all.sh (sourced). Override any of them in the environment;
# they are read at submission and again by each job. docs/running.md ("On a SLURM cluster") explains them.
: "${CLID_ROOT:=$PWD}"                          # the repository (submit from it)
: "${WORLD:=coco}"                              # coco: the paper's run; demo: the demo world (make slurm-check)
if [ "$WORLD" = coco ]; then
    : "${DATA:=$CLID_ROOT/data/coco}"           # downloaded data
    : "${CAPTIONS:=$DATA/karpathy.json}"        # trusted captions, converted from the official files by 00_convert
    : "${RUNS:=$CLID_ROOT/runs/coco}"           # everything this pipeline writes
else
    : "${DATA:=$CLID_ROOT/data/demo}"           # written by 00_demo_data.py before submitting
    : "${CAPTIONS:=$DATA/captions.json}"
    : "${RUNS:=$CLID_ROOT/runs/demo-slurm}"
fi
: "${KARPATHY:=}"                               # optional: the Karpathy split file dataset_coco.json, for its val/restval split
: "${FEATURES:=$DATA/features.h5}"              # region features (00_features converts the VLP release into it)
: "${IMAGES:=$DATA/images}"
: "${PY:=$CLID_ROOT/.venv/bin/python}"
: "${SHARDS:=32}"                               # array size of the per-item stages
: "${NODES:=1}"                                 # nodes per training job (04, 06)
: "${GPUS:=1}"                                  # GPUs per node of a training job; 0: one CPU process per node
: "${MAX_RESTARTS:=3}"                          # torchrun restarts a crashed training from its last checkpoint
: "${STAGE:=${TMPDIR:-}}"                       # node-local folder for a copy of $FEATURES (training, 07); empty: none
: "${BERT:=$DATA/bert-base-uncased}"            # local BERT-base folder (config.json, weights, vocab.txt)
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# torchrun's restarted workers meet in a fresh store, not the dead workers' one (--max-restarts works only so)
export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1

# PY as a command: a path to python (spaces allowed, as in a checkout under "my dir"), or python and its first
# arguments (PY="python -X faulthandler"); the recipe reader runs python alone
if [ -x "$PY" ]; then PYTHON=("$PY"); else read -ra PYTHON <<< "$PY"; fi
[ -x "${PYTHON[0]:-}" ] || { echo "error: ${PYTHON[0]:-PY (empty)} not found: run \`make venv\` in $CLID_ROOT first, or set PY" >&2; exit 1; }
# A setting of a recipe, recipes/NAME.toml (run as a file: `python -m clid...` would load torch for one number)
recipe() { "${PYTHON[0]}" "$CLID_ROOT/clid/run/recipes.py" get "$@"; }
# Check that the variable NAME holds a whole number of at most 9 digits, without a leading 0, from LOW (0 or 1), before
# the shell computes with it (inside $(( )) the shell would evaluate its text, running what it holds): one error line
# naming it, else. Usage: whole_number NAME LOW
whole_number() {
    [[ ${!1} =~ ^(0|[1-9][0-9]{0,8})$ ]] && (( ${!1} >= $2 )) && return 0
    local what="a whole number"; (( $2 < 1 )) || what="a positive whole number"
    echo "error: $1 must be $what (digits, at most 9), not ${!1@Q}" >&2; exit 1
}

# Each stage's own settings. coco: the paper's models and the authors' schedule, recipes/coco.toml (the global
# batch, M_theta~'s cosine, M_theta's steps). demo: the demo world's offline stand-ins for COCO's models, with
# recipes/demo.toml's training settings (docs/running.md, "The demo").
case "$WORLD" in
coco)
    PRESET=${PRESET:-$(recipe coco train.preset)}
    SALIENCY=(--method emlnet --weights "$DATA/emlnet/res_imagenet.pth" "$DATA/emlnet/res_places.pth"
              "$DATA/emlnet/res_decoder.pth")
    # Visual Genome graphs for the COCO images in VG, generated graphs (Scene Graph Benchmark) for the rest
    GRAPHS=(--scene-graphs "$DATA/scene_graphs.json" "$DATA/sgg/predictions.tsv" --image-data "$DATA/image_data.json"
            --labelmap "$DATA/sgg/labelmap.json" --sizes "$DATA/sgg/hw.tsv")
    PARAPHRASER=(--model "$DATA/pegasus_paraphrase")
    TRAIN=(--preset "$PRESET" --bert "$BERT" --batch-size "$(recipe coco train.batch_size)")
    TRUSTED=(); EXTENDED=(--lr-horizon "$(recipe coco extended.lr_horizon)")
    SCORING=(--max-steps "$(recipe coco scoring.max_steps)"); SELECTION=()
    EVAL=(--device cuda) ;;
demo)
    STEPS=${STEPS:-$(recipe demo resolved.steps)}  # optimizer steps of each model
    BATCH=${BATCH:-$(recipe demo train.batch_size)}
    : "${LOG_EVERY:=20}"                        # a train_log.jsonl line every N steps
    SAVE_EVERY=${SAVE_EVERY:-$(recipe demo train.save_every)}  # a checkpoint every N steps
    for setting in STEPS BATCH LOG_EVERY SAVE_EVERY; do whole_number "$setting" 1; done
    SALIENCY=(--scene-graphs "$DATA/scene_graphs.json" --image-data "$DATA/image_data.json")
    GRAPHS=(--scene-graphs "$DATA/scene_graphs.json" --image-data "$DATA/image_data.json" --levels caption)
    PARAPHRASER=(--model rules --levels caption)
    TRAIN=(--recipe demo --batch-size "$BATCH" --warmup $((STEPS / 10)) --log-every "$LOG_EVERY" --save-every "$SAVE_EVERY"
           --levels caption)
    TRUSTED=(--max-steps "$STEPS"); EXTENDED=(--max-steps "$STEPS" --lr-horizon $(( $(recipe demo resolved.extended_horizon) * STEPS )))
    SCORING=(--max-steps $((2 * STEPS))); SELECTION=(--max-steps "$STEPS" --lr-horizon "$STEPS" --eta $((STEPS / 55 + 1)))
    EVAL=(--long-refs "$DATA/long_refs.json") ;;
*) echo "error: WORLD must be coco or demo, not '$WORLD'" >&2; exit 1 ;;
esac
for setting in SHARDS NODES GPUS MAX_RESTARTS; do whole_number "$setting" 0; done
(( SHARDS >= 1 && NODES >= 1 )) || { echo "error: SHARDS and NODES must be at least 1 (SHARDS=$SHARDS, NODES=$NODES)" >&2; exit 1; }
[ -z "$STAGE" ] || [ -d "$STAGE" ] || { echo "error: STAGE=$STAGE is not a folder (the node-local copy of the features goes there)" >&2; exit 1; }
mkdir -p "$RUNS/logs"                           # the jobs' logs (sbatch does not create the folder)
cd "$CLID_ROOT"

# The sbatch flags of a training job: NODES nodes, one task each (torchrun), GPUS GPUs a node.
training_job_flags() {
    echo "--nodes=$NODES --ntasks-per-node=1"
    if (( GPUS > 0 )); then echo "--gres=gpu:$GPUS"; fi
}

# Inside a job: a failure names the job and, in an array, its shard; a staged copy of the features is removed
# at the end, unless the job was told to stop (its requeued attempt reuses the copy).
if [ -n "${SLURM_JOB_ID:-}" ]; then
    at_exit() {
        local status=$? what="job $SLURM_JOB_ID"
        [ -n "${SLURM_ARRAY_TASK_ID:-}" ] && what="shard $SLURM_ARRAY_TASK_ID of ${SLURM_ARRAY_TASK_COUNT:-?} (job ${SLURM_ARRAY_JOB_ID}_$SLURM_ARRAY_TASK_ID)"
        [ "${STOPPED:-0}" = 1 ] && return
        (( status == 0 )) || echo "error: ${SLURM_JOB_NAME:-clid} $what failed with exit code $status on $(hostname); $(date '+%F %T')" >&2
        unstage_features
    }
    trap at_exit EXIT
    if [ -n "${SLURM_ARRAY_TASK_ID:-}" ]; then this="job ${SLURM_ARRAY_JOB_ID}_$SLURM_ARRAY_TASK_ID (shard $SLURM_ARRAY_TASK_ID of ${SLURM_ARRAY_TASK_COUNT:-?})"
    else this="job $SLURM_JOB_ID"; fi
    echo "${SLURM_JOB_NAME:-clid} $this on ${SLURM_JOB_NODELIST:-$(hostname)}, attempt $(( ${SLURM_RESTART_COUNT:-0} + 1 )); $(date '+%F %T')"
fi

# Copy $FEATURES to a job folder under $STAGE on every node of the job, once per job (a requeued job finds
# its copy), when it fits in the space there; FEATURES then names the copy. The copy is removed at the end.
stage_features() {
    [ -n "$STAGE" ] || return 0
    local dest="$STAGE/clid-job-$SLURM_JOB_ID" size
    size=$(stat -c %s "$FEATURES")
    if srun --ntasks-per-node=1 --ntasks="${SLURM_NNODES:-1}" bash slurm/stage.sh "$FEATURES" "$dest" "$size"; then
        FEATURES=$dest/$(basename "$FEATURES")
        STAGED=$dest
    else
        srun --ntasks-per-node=1 --ntasks="${SLURM_NNODES:-1}" rm -rf "$dest" || true
        echo "reading $FEATURES in place (not staged)"
    fi
}

unstage_features() {
    [ -n "${STAGED:-}" ] || return 0
    srun --ntasks-per-node=1 --ntasks="${SLURM_NNODES:-1}" rm -rf "$STAGED" || true
}

# Run a training stage (04, 06) under torchrun on every node of the job (srun, one task a node): NODES x GPUS
# processes (one per node without a GPU), rendezvous at the first node, restarts after a crash. SIGTERM (sent to
# this shell ten minutes before the time limit, #SBATCH --signal=B:TERM@600, or by scancel --batch) reaches the
# torchrun of every node (run_requeueable), which passes it on: the stage saves a checkpoint and stops, and the
# job is requeued, keeping its id (later jobs still wait for it); the requeued job resumes.
# Usage: run_training SCRIPT.py ARGS...
run_training() {
    local nproc=$GPUS first host port
    if (( GPUS > 0 )); then
        local got=${SLURM_GPUS_ON_NODE:-0}
        (( got >= GPUS )) || { echo "error: GPUS=$GPUS but the job has $got GPUs a node: submit it with --gres=gpu:$GPUS (submit_all.sh does)" >&2; return 1; }
    else
        nproc=1
    fi
    first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
    host=$(scontrol show node "$first" | sed -n 's/.*NodeAddr=\([^ ]*\).*/\1/p')
    port=$((20000 + SLURM_JOB_ID % 20000))       # one port per job: two jobs on one node do not meet
    stage_features
    run_requeueable srun --ntasks-per-node=1 --ntasks="$SLURM_NNODES" --kill-on-bad-exit=1 \
        "${PYTHON[@]}" slurm/torchrun.py --nnodes "$SLURM_NNODES" --nproc_per_node "$nproc" \
        --rdzv-backend c10d --rdzv-endpoint "${host:-$first}:$port" --rdzv-id "$SLURM_JOB_ID" \
        --max-restarts "$MAX_RESTARTS" --shutdown-timeout 300 "$@" --features "$FEATURES"
}

# Run a command so that a SIGTERM to this shell reaches it; when it stops for that reason, say so in one line
# and requeue the job. An srun command's tasks get the signal through Slurm (scancel --signal=TERM signals the
# job's steps, not this shell); a SIGTERM to srun itself would end them at once.
run_requeueable() {
    local pid status=0
    STOPPED=0
    if [ "$1" = srun ]; then trap 'STOPPED=1; scancel --signal=TERM "$SLURM_JOB_ID"' TERM
    else trap 'STOPPED=1; kill -TERM "$pid" 2>/dev/null' TERM; fi
    "$@" &
    pid=$!
    wait "$pid" || status=$?
    if [ "$STOPPED" = 1 ]; then
        wait "$pid" || status=$?
        echo "job ${SLURM_JOB_ID:-?} was told to stop (SIGTERM) and saved its checkpoint; requeued: it resumes from there"
        scontrol requeue "${SLURM_JOB_ID:?}"
        return 0
    fi
    trap - TERM
    return "$status"
}
