#!/usr/bin/env bash
# Bring up the check's Slurm (slurm.conf beside this script: munged, slurmctld, one slurmd per NodeName) from
# nothing, as root, without systemd; installs Debian's packages where they are missing. Runtime state goes to
# /tmp/clid-slurm, and what this script starts is recorded in /tmp/clid-slurm/started for stop.sh.
# Afterwards: export SLURM_CONF=<this folder>/slurm.conf.
set -euo pipefail
CONF_DIR=$(cd "$(dirname "$0")" && pwd)
export SLURM_CONF=$CONF_DIR/slurm.conf
RUN=/tmp/clid-slurm
[ "$(id -u)" = 0 ] || { echo "error: the check's Slurm runs its daemons as root; run as root" >&2; exit 1; }
[ ! -e $RUN/started ] || { echo "error: $RUN/started exists: a check's Slurm is up (stop it: bash $CONF_DIR/stop.sh)" >&2; exit 1; }
t() { date +%s.%N; }
T0=$(t)
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
    install() { DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null; }
    install || { apt-get update -q >/dev/null && install; }
fi
T1=$(t)
NODES=$(sed -n 's/^NodeName=\([^ ]*\).*/\1/p' "$SLURM_CONF")
mkdir -p $RUN/state $RUN/log
for n in $NODES; do mkdir -p $RUN/spool-$n; done
for i in 0 1 2 3 4 5 6 7; do   # fake GPUs for gres.conf (a plain file also works, with an error logged)
    [ -e $RUN/fakegpu$i ] || mknod $RUN/fakegpu$i c 1 3 2>/dev/null || touch $RUN/fakegpu$i
done
: > $RUN/started
if ! munge -n >/dev/null 2>&1; then                  # munged, as the munge user (as its service would)
    [ -d /run/munge ] || { mkdir -p /run/munge; echo "dir /run/munge" >> $RUN/started; }
    chown munge:munge /run/munge; chmod 755 /run/munge
    [ -s /etc/munge/munge.key ] || runuser -u munge -- mungekey --verbose
    runuser -u munge -- /usr/sbin/munged
    for _ in $(seq 50); do munge -n >/dev/null 2>&1 && break; sleep 0.1; done
    echo "munged $(cat /run/munge/munged.pid)" >> $RUN/started
fi
munge -n | unmunge >/dev/null
slurmctld -i                                         # daemonises; -i: no saved state expected
for _ in $(seq 100); do [ -s $RUN/slurmctld.pid ] && break; sleep 0.1; done
echo "slurmctld $(cat $RUN/slurmctld.pid)" >> $RUN/started
for _ in $(seq 100); do scontrol ping 2>/dev/null | grep -q UP && break; sleep 0.1; done
for n in $NODES; do
    slurmd -N "$n"
    for _ in $(seq 50); do [ -s $RUN/slurmd-$n.pid ] && break; sleep 0.1; done
    echo "slurmd $(cat $RUN/slurmd-$n.pid) $n" >> $RUN/started
done
for _ in $(seq 200); do [ -z "$(sinfo -h -o %T | grep -vx idle)" ] && break; sleep 0.1; done
if [ -n "$(sinfo -h -o %T | grep -vx idle)" ]; then sinfo -N -l >&2; exit 1; fi
T2=$(t)
awk -v n="$(echo $NODES)" -v a="$T0" -v b="$T1" -v c="$T2" \
    'BEGIN { printf "slurm up (nodes %s): install %.1f s, start %.1f s\n", n, b - a, c - b }'
