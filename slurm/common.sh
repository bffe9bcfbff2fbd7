# Settings shared by the sbatch scripts (sourced). Override any of them in the environment.
# Paths follow docs/running.md, "Reproducing the paper on COCO".
: "${CLID_ROOT:=$PWD}"                          # the repository (submit from it)
: "${DATA:=$CLID_ROOT/data/coco}"               # downloaded data
: "${CAPTIONS:=$DATA/karpathy.json}"            # trusted captions, converted from the official files by 00_convert
: "${KARPATHY:=}"                               # optional: the Karpathy split file dataset_coco.json, for its val/restval split
: "${RUNS:=$CLID_ROOT/runs/coco}"               # everything this pipeline writes
: "${PY:=$CLID_ROOT/.venv/bin/python}"
: "${SHARDS:=32}"                               # array size of the per-item stages
: "${GPUS:=4}"                                  # GPUs per training job
: "${PRESET:=labert}"
: "${BERT:=$DATA/bert-base-uncased}"            # local BERT-base folder (config.json, weights, vocab.txt)
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
[ -x "${PY%% *}" ] || { echo "error: ${PY%% *} not found: run \`make venv\` in $CLID_ROOT first, or set PY" >&2; exit 1; }
mkdir -p "$RUNS/logs"                           # the jobs' logs (sbatch does not create the folder)
cd "$CLID_ROOT"

# Run a training command (04, 06) so that the SIGTERM sbatch sends before the time limit
# (#SBATCH --signal=B:TERM@600, to this shell) reaches it: the stage saves a checkpoint and stops, and
# the job is requeued, keeping its id (later jobs still wait for it); the requeued job resumes.
run_requeueable() {
    local pid status=0
    TERMINATED=0
    trap 'TERMINATED=1; kill -TERM "$pid" 2>/dev/null' TERM
    "$@" &
    pid=$!
    wait "$pid" || status=$?
    if [ "$TERMINATED" = 1 ]; then
        wait "$pid" || status=$?
        echo "job ${SLURM_JOB_ID:-?} was told to stop before its time limit; requeued: it resumes from the checkpoint"
        scontrol requeue "${SLURM_JOB_ID:?}"
    fi
    return "$status"
}
