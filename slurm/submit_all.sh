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
set -euo pipefail
SBATCH_FLAGS=("$@")
source slurm/common.sh                          # (creates $RUNS/logs, where every job's log goes)
submit() { sbatch --parsable "${SBATCH_FLAGS[@]}" --output="$RUNS/logs/%x-%j.out" "$@"; }
array() { sbatch --parsable "${SBATCH_FLAGS[@]}" --output="$RUNS/logs/%x-%A_%a.out" --array=0-$((SHARDS - 1)) "$@"; }

c00=$(submit slurm/00_convert.sbatch)
f00=$(array slurm/00_features.sbatch)
feats=$(submit --dependency=afterok:$f00 slurm/merge.sbatch "$DATA/features.h5" "$SHARDS")
s01=$(array --dependency=afterok:$c00 slurm/01_saliency.sbatch)
m01=$(submit --dependency=afterok:$s01 slurm/merge.sbatch "$RUNS/saliency.h5" "$SHARDS")
s02=$(array --dependency=afterok:$m01 slurm/02_captions.sbatch)
m02=$(submit --dependency=afterok:$s02 slurm/merge.sbatch "$RUNS/selfgen.jsonl" "$SHARDS")
s03=$(array --dependency=afterok:$m02 slurm/03_paraphrase.sbatch)
m03=$(submit --dependency=afterok:$s03 slurm/merge.sbatch "$RUNS/paraphrased.jsonl" "$SHARDS")
t04=$(submit --dependency=afterok:$c00:$feats slurm/04_train_base.sbatch trusted)
e04=$(submit --dependency=afterok:$m03:$feats slurm/04_train_base.sbatch extended)
c04=$(submit --dependency=afterok:$e04 slurm/04_train_base.sbatch scoring)
s05=$(array --dependency=afterok:$c04 slurm/05_score.sbatch)
m05=$(submit --dependency=afterok:$s05 slurm/merge.sbatch "$RUNS/quality.h5" "$SHARDS")
s06=$(submit --dependency=afterok:$m05 slurm/06_train_selection.sbatch)
s07=$(submit --dependency=afterok:$s06:$t04 slurm/07_eval.sbatch)
echo "submitted: 00=$c00 features=$f00,$feats 01=$s01 02=$s02 03=$s03 04=$t04,$e04,$c04 05=$s05 06=$s06 07=$s07 (logs in $RUNS/logs)"
