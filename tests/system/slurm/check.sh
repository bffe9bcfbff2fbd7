#!/usr/bin/env bash
# make slurm-check: the SLURM recipe on a real Slurm. Brings up a one-machine Slurm with two nodes
# (tests/system/slurm/start.sh; installs Debian's packages where missing; needs root), then on the demo world at a
# tiny size, with the real stages:
#   1. slurm/submit_all.sh --dry-run, then submit_all.sh: every job completes, after the jobs it depends on,
#      with every output and a log free of tracebacks; the training and evaluation jobs stage the features;
#   2. the recipe's 04 trusted job is told to stop (scancel --batch --signal=TERM) mid-run: it saves, is
#      requeued and resumes; its log keeps both attempts; its weights equal an uninterrupted twin's;
#   3. submit_all.sh on a world without data: the 00 jobs fail naming their shards, every later job is cancelled;
#   4. (CHECK_NODES=1, the default) 04 on 2 nodes x 1 CPU process (gloo) against 1 process, dropout off:
#      the loss at every step within 1e-5, the final weights within 1e-4 of each tensor's largest value;
#   5. (CHECK_KILL=1, the default) a 2-node run whose rank 1 is killed (SIGKILL) after a checkpoint:
#      torchrun restarts it from there and the run still ends equal.
# Stops the daemons it started, also on failure. Work files: a fresh /tmp/clid-slurm-check.* (kept on failure,
# or with KEEP=1).
set -euo pipefail
cd "$(dirname "$0")/../../.."
ROOT=$PWD
HERE=$ROOT/tests/system/slurm
PY=${PY:-$ROOT/.venv/bin/python}
CHECK_NODES=${CHECK_NODES:-1}
CHECK_KILL=${CHECK_KILL:-1}
export PYTHONPATH=$ROOT SLURM_CONF=$HERE/slurm.conf OMP_NUM_THREADS=1 CLID_PROGRESS_SECONDS=0 TMPDIR=/tmp
WORK=$(mktemp -d /tmp/clid-slurm-check.XXXXXX)
started=$(date +%s)
say() { printf '[slurm-check %3d s] %s\n' $(( $(date +%s) - started )) "$*"; }
verify() { "$PY" "$HERE/verify.py" "$@"; }

bash "$HERE/start.sh"
finish() {
    local status=$?
    bash "$HERE/stop.sh" >/dev/null
    if (( status == 0 )); then [ -n "${KEEP:-}" ] || rm -rf "$WORK"; say "passed ($(cut -d' ' -f1-3 /proc/loadavg): load average 1, 5, 15 min)"
    else say "FAILED: the work files are in $WORK (Slurm's own logs were in /tmp/clid-slurm/log)"; fi
}
trap finish EXIT

# The demo world at a tiny size: 24 train, 6 val, 6 test images; 40 steps of a batch of 8 per model, 2 shards.
export WORLD=demo DATA=$WORK/data SHARDS=2 STEPS=40 BATCH=8 NODES=1 GPUS=1 STAGE=$WORK/node-local
mkdir -p "$STAGE"
"$PY" 00_demo_data.py --out "$DATA" --n-train 24 --n-val 6 --n-test 6 --workers 1 > "$WORK/00_demo_data.log"
say "demo world written to $DATA"

RUNS=$WORK/runs bash slurm/submit_all.sh --dry-run > "$WORK/dry-run.txt"
grep -q '^eval  *after selection trusted ' "$WORK/dry-run.txt" && [ "$(grep -c ' slurm/' "$WORK/dry-run.txt")" = 16 ] \
    || { cat "$WORK/dry-run.txt"; say "the dry run does not list the 16 jobs"; exit 1; }
[ ! -e "$WORK/runs/logs/submitted.tsv" ] || { say "the dry run recorded jobs"; exit 1; }
say "dry run: 16 jobs and their dependencies, nothing submitted"

RUNS=$WORK/runs bash slurm/submit_all.sh
RUNS=$WORK/broken DATA=$WORK/no-data bash slurm/submit_all.sh
flags=$(RUNS=$WORK/twin bash -c 'source slurm/common.sh; training_job_flags' | tr '\n' ' ')
mkdir -p "$WORK/twin/logs"
twin=$(RUNS=$WORK/twin sbatch --parsable $flags --output="$WORK/twin/logs/%x-%j.out" slurm/04_train_base.sbatch trusted)
nodes=()
runs=()
if (( CHECK_NODES )); then runs+=(1 2); fi
if (( CHECK_KILL )); then (( CHECK_NODES )) || runs+=(1); runs+=(2-killed); fi
for run in ${runs[@]+"${runs[@]}"}; do   # nodes1, nodes2, nodes2-killed: 04 trusted on 1, 2 and 2 nodes
    mkdir -p "$WORK/nodes$run/logs"
    nodes+=("$(RUNS=$WORK/nodes$run NODES=${run:0:1} GPUS=0 LOG_EVERY=1 SAVE_EVERY=5 sbatch --parsable --time=20 \
               --nodes=${run:0:1} --ntasks-per-node=1 --output="$WORK/nodes$run/logs/%x-%j.out" \
               slurm/04_train_base.sbatch trusted)")
done

# Tell the recipe's 04 trusted job to stop once it has trained a few steps.
trusted=$(awk -F'\t' '$1 == "trusted" {print $2}' "$WORK/runs/logs/submitted.tsv")
log=$WORK/runs/logs/clid-04-base-$trusted.out
for _ in $(seq 600); do grep -qE '^04 trusted: step ([3-9]|[1-9][0-9])/' "$log" 2>/dev/null && break; sleep 0.5; done
grep -q 'checkpoint:' "$log" && { say "04 trusted finished before it could be told to stop: raise STEPS"; exit 1; }
scancel --batch --signal=TERM "$trusted"
say "told job $trusted (04 trusted) to stop at: $(grep -E '^04 trusted: step' "$log" | tail -n 1)"

if (( CHECK_KILL )); then  # kill rank 1 of nodes2-killed once a checkpoint is saved and a step after it trained
    log=$WORK/nodes2-killed/logs/clid-04-base-${nodes[-1]}.out
    for _ in $(seq 1200); do grep -qE '^04 trusted: step ([7-9]|[1-9][0-9])/' "$log" 2>/dev/null && break; sleep 0.5; done
    rank1=""
    for pid in $(pgrep -f 04_train_base.py); do   # (the candidates; the one with this job's id and RANK=1 is killed)
        environment=$(tr '\0' '\n' < /proc/$pid/environ 2>/dev/null) || continue
        grep -qx "SLURM_JOB_ID=${nodes[-1]}" <<< "$environment" && grep -qx RANK=1 <<< "$environment" && rank1=$pid
    done
    [ -n "$rank1" ] && ! grep -q 'checkpoint:' "$log" || { say "no rank 1 of job ${nodes[-1]} to kill: $(tail -n 2 "$log")"; exit 1; }
    kill -KILL "$rank1"
    say "killed rank 1 (pid $rank1) of job ${nodes[-1]} at: $(grep -E '^04 trusted: step' "$log" | tail -n 1)"
fi

verify wait "$WORK/runs" "$WORK/broken" --jobs "$twin" ${nodes[@]+"${nodes[@]}"} --timeout 900
say "every job is over"
verify recipe "$WORK/runs" --stopped trusted --twin "$WORK/twin" --stage "$STAGE"
verify cancelled "$WORK/broken"
if (( CHECK_NODES )); then verify nodes "$WORK/nodes1" "$WORK/nodes2"; fi
if (( CHECK_KILL )); then verify nodes "$WORK/nodes1" "$WORK/nodes2-killed" --killed; fi
