# Settings shared by the sbatch scripts (sourced). Override any of them in the environment.
# Paths follow README.md, "Reproducing the paper on COCO".
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
mkdir -p "$RUNS/logs"
cd "$CLID_ROOT"
