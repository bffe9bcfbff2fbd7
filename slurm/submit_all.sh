#!/usr/bin/env bash
# Submit the whole COCO pipeline (Visual Genome + generated scene graphs) with afterok dependencies:
#   00 convert -> 01 (array) -> merge -> 02 (array) -> merge -> 03 (array) -> merge
#   -> 04 extended (M_theta~) -> 04 scoring (M_theta, continuing M_theta~) -> 05 (array) -> merge
#   -> 06 -> 07 (with 04 trusted, the trusted-only baseline, trained meanwhile after 00)
# where every 04 also waits for the region features: 00 features (array, the VLP release converted) -> merge.
# Run from the repository root after `make venv` (on a node with the GPU nodes' CUDA toolkit, so
# that clid._C has CUDA kernels) and the downloads of docs/running.md. Flags given to this script go to
# every sbatch call (account, partition, QOS, ...):
#   bash slurm/submit_all.sh --account=proj123 --partition=gpu --qos=normal
#   bash slurm/submit_all.sh --dry-run      (prints the jobs and their dependencies; submits nothing)
# Settings (nodes, GPUs, shards, paths) are environment variables: slurm/common.sh. Each job's id, name,
# dependencies and command go to RUNS/logs/submitted.tsv; a job whose dependency fails is cancelled.
set -euo pipefail
DRY_RUN=0
SBATCH_FLAGS=()
for arg in "$@"; do
    if [ "$arg" = --dry-run ]; then DRY_RUN=1; else SBATCH_FLAGS+=("$arg"); fi
done
source slurm/common.sh                          # (creates $RUNS/logs, where every job's log goes)
if (( ! DRY_RUN )) && ! command -v sbatch > /dev/null; then
    echo "error: sbatch not found: run this on a SLURM login node (or see the jobs with --dry-run)" >&2; exit 1
fi
# the recipe's settings, checked as 04 and 06 will check them, before a job is planned (a dry run fails alike)
"${PYTHON[0]}" "$CLID_ROOT/clid/run/recipes.py" check "$WORLD" || exit 1
read -ra TRAINING <<< "$(training_job_flags | tr '\n' ' ')"
ONE_GPU=(); if (( GPUS > 0 )); then ONE_GPU=(--gres=gpu:1); fi
declare -A ID
RECORD=$RUNS/logs/submitted.tsv
SUBMITTED=0
# However the script ends (sbatch failing, Ctrl-C), the jobs already submitted are in $RECORD; with none, an earlier
# record stays as it was
keep_record() {
    [ -f "$RECORD.part" ] || return 0
    if (( SUBMITTED > 0 )); then mv "$RECORD.part" "$RECORD"; else rm -f "$RECORD.part"; fi
}
stopped() {
    keep_record
    echo "error: stopped by $1 after submitting $SUBMITTED of the 16 jobs$( (( SUBMITTED == 0 )) || echo \
         ", which are in $RECORD: cancel them (scancel) before submitting again")" >&2
    exit 1
}
STOP=""  # a signal's name: the script stops once the job being submitted is recorded
if (( ! DRY_RUN )); then
    trap keep_record EXIT; trap 'STOP=SIGINT' INT; trap 'STOP=SIGTERM' TERM; trap 'STOP=SIGHUP' HUP
    printf 'name\tjob\tafter\tcommand\n' > "$RECORD.part"
fi

# submit NAME "DEPENDENCY NAMES" [sbatch flags] SCRIPT [ARGS]: the job's id goes to ID[NAME]
submit() {
    local name=$1 after=$2 ids="" dep
    shift 2
    for dep in $after; do ids+=":${ID[$dep]}"; done
    local command=(sbatch --parsable "${SBATCH_FLAGS[@]}" --kill-on-invalid-dep=yes ${ids:+--dependency=afterok$ids} "$@")
    if (( DRY_RUN )); then
        ID[$name]=$name
        printf '%-18s after %-28s %s\n' "$name" "${after:--}" "${command[*]}"
    else
        local status=0 answer
        answer=$("${command[@]}") || status=$?
        ID[$name]=${answer%%;*}                      # (--parsable: the job id, then ";CLUSTER" on a federation)
        if (( status != 0 )) && [ -n "$STOP" ]; then stopped "$STOP"; fi
        if (( status != 0 )) || ! [[ ${ID[$name]} =~ ^[0-9]+$ ]]; then
            local why="exit $status"
            (( status != 0 )) || why="it answered ${answer@Q}, not a job id"
            (( status != 127 )) || why="sbatch not found"
            keep_record
            echo "error: sbatch failed on job $name ($why); $( (( SUBMITTED == 0 )) && echo "no job was submitted" \
                 || echo "the $SUBMITTED jobs submitted before it are in $RECORD: cancel them (scancel) before submitting again")" >&2
            exit 1
        fi
        printf '%s\t%s\t%s\t%s\n' "$name" "${ID[$name]}" "$after" "${command[*]}" >> "$RECORD.part"
        SUBMITTED=$(( SUBMITTED + 1 ))
        [ -z "$STOP" ] || stopped "$STOP"
    fi
}
job() { submit "$1" "$2" --output="$RUNS/logs/%x-%j.out" "${@:3}"; }
array() { submit "$1" "$2" --output="$RUNS/logs/%x-%A_%a.out" --array=0-$((SHARDS - 1)) "${@:3}"; }

job convert "" slurm/00_convert.sbatch
array features "" slurm/00_features.sbatch
job features-merge "features" slurm/merge.sbatch "$FEATURES" "$SHARDS"
array saliency "convert" "${ONE_GPU[@]}" slurm/01_saliency.sbatch
job saliency-merge "saliency" slurm/merge.sbatch "$RUNS/saliency.h5" "$SHARDS"
array captions "saliency-merge" slurm/02_captions.sbatch
job captions-merge "captions" slurm/merge.sbatch "$RUNS/selfgen.jsonl" "$SHARDS"
array paraphrase "captions-merge" "${ONE_GPU[@]}" slurm/03_paraphrase.sbatch
job paraphrase-merge "paraphrase" slurm/merge.sbatch "$RUNS/paraphrased.jsonl" "$SHARDS"
job trusted "convert features-merge" "${TRAINING[@]}" slurm/04_train_base.sbatch trusted
job extended "paraphrase-merge features-merge" "${TRAINING[@]}" slurm/04_train_base.sbatch extended
job scoring "extended" "${TRAINING[@]}" slurm/04_train_base.sbatch scoring
array score "scoring" "${ONE_GPU[@]}" slurm/05_score.sbatch
job score-merge "score" slurm/merge.sbatch "$RUNS/quality.h5" "$SHARDS"
job selection "score-merge" "${TRAINING[@]}" slurm/06_train_selection.sbatch
job eval "selection trusted" "${ONE_GPU[@]}" slurm/07_eval.sbatch
if (( DRY_RUN )); then
    echo "dry run: 16 jobs, not submitted ($NODES node(s) x $GPUS GPU(s) a training job, $SHARDS shards; logs would go to $RUNS/logs)"
    exit 0
fi
keep_record
echo "submitted: 00=${ID[convert]} features=${ID[features]},${ID[features-merge]} 01=${ID[saliency]} 02=${ID[captions]}" \
     "03=${ID[paraphrase]} 04=${ID[trusted]},${ID[extended]},${ID[scoring]} 05=${ID[score]} 06=${ID[selection]}" \
     "07=${ID[eval]} (logs and $(basename "$RECORD") in $RUNS/logs)"
