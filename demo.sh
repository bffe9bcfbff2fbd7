#!/usr/bin/env bash
# The whole pipeline on the demo world, stage by stage (called by `make demo`).
# Stages that do not exist yet are skipped with a note.
set -euo pipefail
cd "$(dirname "$0")"
DEMO=${1:-data/demo}
RUNS=${2:-runs/demo}
PY=${PY:-.venv/bin/python}
banner() { printf '\n==== %s ====\n' "$*"; }

banner "length statistics of the real COCO 2014 train captions (the method's motivation)"
jar=$($PY -c "import importlib.util,os; print(os.path.join(importlib.util.find_spec('pycocoevalcap').submodule_search_locations[0], 'spice', 'spice-1.0.jar'))")
mkdir -p "$RUNS"
[ -f "$RUNS/captions_train2014.json" ] || unzip -p "$jar" coco/annotations/captions_train2014.json > "$RUNS/captions_train2014.json"
$PY -m clid.stats "$RUNS/captions_train2014.json"
