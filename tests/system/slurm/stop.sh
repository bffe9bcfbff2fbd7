#!/usr/bin/env bash
# Stop what start.sh started, by the pids it recorded in /tmp/clid-slurm/started (the jobs first), then remove
# /tmp/clid-slurm. A daemon start.sh found running (munged) is left alone.
set -uo pipefail
CONF_DIR=$(cd "$(dirname "$0")" && pwd)
export SLURM_CONF=$CONF_DIR/slurm.conf
RUN=/tmp/clid-slurm
[ -f $RUN/started ] || { echo "nothing recorded in $RUN/started"; exit 0; }
if grep -q '^slurmctld ' $RUN/started; then          # cancel the jobs, so that no slurmstepd outlives slurmd
    scancel --quiet --user=root 2>/dev/null || true
    for _ in $(seq 100); do [ -z "$(squeue -h -t R,CG 2>/dev/null)" ] && break; sleep 0.2; done
fi
stop() {  # NAME PID: SIGTERM, then wait up to 10 s
    local name=$1 pid=$2
    kill -0 "$pid" 2>/dev/null || return 0
    [ "$(cat /proc/$pid/comm)" = "$name" ] || { echo "pid $pid is not $name: left alone" >&2; return 0; }
    kill -TERM "$pid"
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
    echo "$name ($pid) still running" >&2
}
for name in slurmd slurmctld munged; do
    awk -v n=$name '$1 == n {print $2}' $RUN/started | while read -r pid; do stop $name "$pid"; done
done
grep -qx 'dir /run/munge' $RUN/started && rm -rf /run/munge
rm -rf $RUN
echo "slurm stopped"
