#!/usr/bin/env bash
# Records real Slurm outputs from the dev cluster for parser tests.
#   tests/slurm/data/record.sh [DEVCLUSTER_DIR]
# Run as root with the dev cluster up (scripts/devcluster up). Writes
# tests/slurm/data/slurm-<version>/ (see README.md for every command).
# Takes ~2 minutes (a job has to hit its 1-minute time limit).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
REPO=$(cd "$HERE/../../../.." && pwd -P)
DIR=${1:-${DEVCLUSTER_DIR:-$REPO/var/devcluster}}
ENV_FILE=$DIR/gantry.env
[ -f "$ENV_FILE" ] || { echo "no $ENV_FILE: run scripts/devcluster up first" >&2; exit 1; }
SLURM_CONF=$(sed -n 's/^SLURM_CONF=//p' "$ENV_FILE")
USER_=$(sed -n 's/^GANTRY_CLUSTER_USER=//p' "$ENV_FILE")
export SLURM_CONF

RUN_START=$(date +%Y-%m-%dT%H:%M:%S)
VERSION=$(sinfo -V | awk '{print $2}')
OUT=$HERE/slurm-$VERSION
mkdir -p "$OUT"
echo "recording into $OUT"

FMT_NODES='%N|%P|%T|%c|%m|%G|%f|%E|%C|%e'
FMT_SQUEUE='%i|%j|%u|%P|%T|%r|%M|%l|%D|%N|%b|%S|%V'
FMT_GRES='NodeList:0|,Partition:0|,StateLong:0|,Gres:0|,GresUsed:0'
FMT_SACCT=JobID,JobName,User,Account,Partition,State,ExitCode,Elapsed,Submit,Start,End,NodeList,AllocTRES,ReqTRES,Timelimit

# run as the cluster user, from its work directory (like Gantry over SSH)
WORK=$(sed -n 's/^GANTRY_CLUSTER_WORKDIR=//p' "$ENV_FILE")
mkdir -p "$WORK/record" && chown "$USER_:" "$WORK/record"
as_user() { (cd "$WORK/record" && runuser -u "$USER_" -- env SLURM_CONF="$SLURM_CONF" PATH=/usr/bin:/bin "$@"); }
submit() { as_user sbatch --parsable "$@"; }
rec() { local f=$1; shift; "$@" >"$OUT/$f"; }

job_state() { squeue -h -j "$1" -o %T 2>/dev/null || true; }
wait_state() {  # wait_state ID STATE SECONDS
    local i
    for ((i = 0; i < $3 * 5; i++)); do
        [ "$(job_state "$1")" = "$2" ] && return 0
        sleep 0.2
    done
    echo "job $1 did not reach $2 (is: $(job_state "$1"))" >&2
    return 1
}
sacct_final() {  # wait until sacct shows a final state for the allocation
    local i st
    for ((i = 0; i < 300; i++)); do
        st=$(sacct -n -X -P -j "$1" -o State 2>/dev/null | head -1)
        case "$st" in
            COMPLETED|FAILED|CANCELLED*|TIMEOUT|OUT_OF_MEMORY|NODE_FAIL) return 0 ;;
        esac
        sleep 0.5
    done
    echo "job $1 has no final state in sacct" >&2
    return 1
}

# ------------------------------------------------------------- idle cluster
rec sinfo_V.txt sinfo -V
rec scontrol_ping.txt scontrol ping
rec sinfo.json sinfo --json
rec sinfo.txt sinfo
rec sinfo_nodes.txt sinfo -N -h -o "$FMT_NODES"
rec sinfo_gres.txt sinfo -N -h -O "$FMT_GRES"
rec sinfo_partitions.txt sinfo -h -o '%P|%a|%l|%D|%T|%N|%G'
rec scontrol_show_node.txt scontrol show node
rec scontrol_show_node_oneliner.txt scontrol -o show node
rec scontrol_show_topology.txt scontrol show topology
rec scontrol_show_partition.txt scontrol show partition
rec scontrol_show_partition_oneliner.txt scontrol -o show partition
# unknown names: scontrol prints "Node ... not found" on STDOUT (rc 1), the job error on stderr
rc=0; scontrol show node nosuchnode >"$OUT/scontrol_show_node_unknown.txt" 2>&1 || rc=$?
echo "$rc" >"$OUT/scontrol_show_node_unknown.rc"
rc=0; scontrol show node nosuchnode >"$OUT/scontrol_show_node_unknown.stdout.txt" 2>/dev/null || rc=$?
rc=0; scontrol show job 99999999 >/dev/null 2>"$OUT/scontrol_show_job_unknown.txt" || rc=$?
echo "$rc" >"$OUT/scontrol_show_job_unknown.rc"
rec sacctmgr_show_cluster.txt sacctmgr -P show cluster format=Cluster,ControlHost,ControlPort,RPC

# ------------------------------------------------------------ drained node
scontrol update nodename=n2 state=drain reason="maintenance test"
trap 'scontrol update nodename=n2 state=resume 2>/dev/null || true' EXIT
sleep 0.5
rec sinfo_drained.json sinfo --json
rec sinfo_nodes_drained.txt sinfo -N -h -o "$FMT_NODES"
rec sinfo_reasons_drained.txt sinfo -R -h -o '%N|%T|%E|%U|%H'
rec scontrol_show_node_drained.txt scontrol show node n2
rec scontrol_show_node_drained_oneliner.txt scontrol -o show node n2
scontrol update nodename=n2 state=resume
trap - EXIT
sleep 0.5

# ------------------------------------------------------------- submissions
# the TIMEOUT job first: it needs ~1-1.5 minutes
T_TIMEOUT=$(submit -p gpu -N1 -t 1 -J rec-timeout --wrap 'sleep 300')
T_COMPLETED=$(submit -p gpu -N1 -t 5 -J rec-completed --wrap 'true')
T_FAILED=$(submit -p gpu -N1 -t 5 -J rec-failed --wrap 'exit 3')
T_OOM=$(submit -p gpu -N1 -t 5 --mem=100M -J rec-oom \
    --wrap 'python3 -c "import time; a = bytearray(1 << 30); time.sleep(2)"')
T_2N=$(submit -p gpu -N2 --ntasks-per-node=1 -t 5 -J rec-2n-completed --wrap 'srun hostname')
as_user sbatch --parsable -p gpu -t 5 -J rec-sbatch-parsable --wrap true >"$OUT/sbatch_parsable.txt"
T_PARSABLE=$(cat "$OUT/sbatch_parsable.txt")
as_user sbatch -p gpu -t 5 -J rec-sbatch --wrap true >"$OUT/sbatch.txt"

rc=0; as_user sbatch --parsable -p batch -N1 --gpus-per-node=3 -J rec-too-many-gpus --wrap true \
    >/dev/null 2>"$OUT/sbatch_error_too_many_gpus.txt" || rc=$?
echo "$rc" >"$OUT/sbatch_error_too_many_gpus.rc"
rc=0; as_user sbatch --parsable -p nosuch -J rec-bad-partition --wrap true \
    >/dev/null 2>"$OUT/sbatch_error_bad_partition.txt" || rc=$?
echo "$rc" >"$OUT/sbatch_error_bad_partition.rc"
rc=0; as_user sbatch --parsable -p batch --gres=gpu:h100:1 -J rec-bad-gres-type --wrap true \
    >/dev/null 2>"$OUT/sbatch_error_bad_gres_type.txt" || rc=$?
echo "$rc" >"$OUT/sbatch_error_bad_gres_type.rc"
rc=0; as_user scancel 99999999 >/dev/null 2>"$OUT/scancel_invalid.txt" || rc=$?
echo "$rc" >"$OUT/scancel_invalid.rc"
rc=0; as_user scancel -v 99999999 >/dev/null 2>"$OUT/scancel_invalid_verbose.txt" || rc=$?
echo "$rc" >"$OUT/scancel_invalid_verbose.rc"
# the rejected request burned a job id: find it in accounting by name
# (sacct lags the scheduler by a few seconds: poll)
T_REJECTED=""
for ((i = 0; i < 40; i++)); do
    T_REJECTED=$(sacct -n -X -P -u "$USER_" --name rec-too-many-gpus -o JobID -S "$RUN_START" 2>/dev/null | tail -1 || true)
    [ -n "$T_REJECTED" ] && break
    sleep 0.5
done

# ---------------------------------------------------------- jobs in queue
R_2N=$(submit -p batch -N2 --ntasks-per-node=1 --gpus-per-node=1 -t 5 -J rec-running-2n --wrap 'srun sleep 120')
R_H100=$(submit -p gpu -N1 --gres=gpu:h100:2 -t 5 -J rec-running-h100 --wrap 'sleep 120')
P_RES=$(submit -p batch -N2 --gpus-per-node=2 -t 5 -J rec-pending-res --wrap true)
P_BEGIN=$(submit -p gpu --begin=now+1hour -t 5 -J rec-pending-begin --wrap true)
P_HELD=$(submit -p gpu -H -t 5 -J rec-pending-held --wrap true)
wait_state "$R_2N" RUNNING 30
wait_state "$R_H100" RUNNING 60
sleep 2  # let the srun step start and the pending reasons settle
rec squeue.json squeue --json
rec squeue.txt squeue -h -o "$FMT_SQUEUE"
rec squeue_default.txt squeue
rec scontrol_show_job.txt scontrol show job "$R_2N"
rec scontrol_show_job_oneliner.txt scontrol -o show job "$R_2N"
rec scontrol_show_job_pending.txt scontrol show job "$P_RES"
rec sinfo_busy.json sinfo --json
rec sinfo_nodes_busy.txt sinfo -N -h -o "$FMT_NODES"
rec sinfo_gres_busy.txt sinfo -N -h -O "$FMT_GRES"
rec scontrol_show_node_busy_oneliner.txt scontrol -o show node

as_user scancel "$R_2N"
as_user scancel "$P_RES"
as_user scancel "$R_H100" "$P_BEGIN" "$P_HELD"

# ------------------------------------------------------------ accounting
IDS=("$T_COMPLETED" "$T_FAILED" "$T_OOM" "$T_2N" "$T_PARSABLE" "$R_2N" "$P_RES" "$T_TIMEOUT")
[ -n "$T_REJECTED" ] && IDS+=("$T_REJECTED")
echo "waiting for final states in sacct (the TIMEOUT job takes ~1-1.5 min)"
for id in "${IDS[@]}"; do sacct_final "$id"; done
sleep 1
ID_LIST=$(IFS=,; echo "${IDS[*]}")
rec sacct.json sacct --json -j "$ID_LIST"
rec sacct.txt sacct -P -n -j "$ID_LIST" -o "$FMT_SACCT"
rec sacct_allocations.txt sacct -P -n -X -j "$ID_LIST" -o "$FMT_SACCT"
rec sacct_header.txt sacct -P -j "$T_COMPLETED" -o "$FMT_SACCT"

cat >"$OUT/jobs.txt" <<EOF
rec-completed=$T_COMPLETED
rec-failed=$T_FAILED
rec-oom=$T_OOM
rec-2n-completed=$T_2N
rec-sbatch-parsable=$T_PARSABLE
rec-timeout=$T_TIMEOUT
rec-running-2n=$R_2N
rec-running-h100=$R_H100
rec-pending-res=$P_RES
rec-pending-begin=$P_BEGIN
rec-pending-held=$P_HELD
rec-too-many-gpus=$T_REJECTED
EOF
echo "recorded $(ls "$OUT" | wc -l) files into $OUT"
