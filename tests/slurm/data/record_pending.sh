#!/usr/bin/env bash
# Records the pending-queue outputs (squeue --start, scontrol hold/release) from the dev
# cluster into tests/slurm/data/slurm-<version>/ (see README.md, "Pending jobs").
#   tests/slurm/data/record_pending.sh [DEVCLUSTER_DIR]
# Run as root with the dev cluster up and idle (take /tmp/gantry-tests.lock first: it fills
# the gpu partition for about a minute). Leaves the other recordings alone.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
REPO=$(cd "$HERE/../../../.." && pwd -P)
DIR=${1:-${DEVCLUSTER_DIR:-$REPO/var/devcluster}}
ENV_FILE=$DIR/gantry.env
[ -f "$ENV_FILE" ] || { echo "no $ENV_FILE: run scripts/devcluster up first" >&2; exit 1; }
SLURM_CONF=$(sed -n 's/^SLURM_CONF=//p' "$ENV_FILE")
USER_=$(sed -n 's/^GANTRY_CLUSTER_USER=//p' "$ENV_FILE")
WORK=$(sed -n 's/^GANTRY_CLUSTER_WORKDIR=//p' "$ENV_FILE")
export SLURM_CONF
VERSION=$(sinfo -V | awk '{print $2}')
OUT=$HERE/slurm-$VERSION
mkdir -p "$OUT" "$WORK/record" && chown "$USER_:" "$WORK/record"
echo "recording into $OUT"

# The format of slurm.parsers.queue.SQUEUE_START_FORMAT.
FMT_START='%i|%P|%T|%Q|%S|%V|%Y|%r'
as_user() { (cd "$WORK/record" && runuser -u "$USER_" -- env SLURM_CONF="$SLURM_CONF" PATH=/usr/bin:/bin "$@"); }
submit() { as_user sbatch --parsable "$@"; }
ids=()
cleanup() { [ ${#ids[@]} -gt 0 ] && as_user scancel "${ids[@]}" 2>/dev/null || true; }
trap cleanup EXIT

# The gpu partition full (both nodes, all their GPUs), then jobs waiting behind it.
BLOCK=$(submit -p gpu -N2 --gres=gpu:h100:2 -t 10 -J rec-block-gpu --wrap 'sleep 300'); ids+=("$BLOCK")
for ((i = 0; i < 150; i++)); do
    [ "$(squeue -h -j "$BLOCK" -o %T)" = RUNNING ] && break
    sleep 0.2
done
RES=$(submit -p gpu -N1 --gres=gpu:h100:1 -t 5 -J rec-pend-resources --wrap true); ids+=("$RES")
PRIO=$(submit -p gpu -N1 --gres=gpu:h100:2 -t 5 -J rec-pend-priority --wrap true); ids+=("$PRIO")
UHELD=$(submit -p gpu -H -t 5 -J rec-pend-held-user --wrap true); ids+=("$UHELD")
AHELD=$(submit -p gpu -N1 --gres=gpu:h100:1 -t 5 -J rec-pend-held-admin --wrap true); ids+=("$AHELD")
BEGIN=$(submit -p batch --begin=now+1hour -t 5 -J rec-pend-begin --wrap true); ids+=("$BEGIN")

rc=0; as_user scontrol hold "$AHELD" >"$OUT/scontrol_hold.txt" 2>&1 || rc=$?
echo "$rc" >"$OUT/scontrol_hold.rc"
rc=0; as_user scontrol hold 99999999 >"$OUT/scontrol_hold_unknown.txt" 2>&1 || rc=$?
echo "$rc" >"$OUT/scontrol_hold_unknown.rc"
rc=0; as_user scontrol release 99999999 >"$OUT/scontrol_release_unknown.txt" 2>&1 || rc=$?
echo "$rc" >"$OUT/scontrol_release_unknown.rc"

# The backfill scheduler plans start times every bf_interval (30 s by default): wait for one.
for ((i = 0; i < 90; i++)); do
    start=$(env SLURM_TIME_FORMAT=%s squeue -h -j "$RES" -o %S)
    [ -n "$start" ] && [ "$start" != "N/A" ] && break
    sleep 1
done
rec() { local f=$1; shift; "$@" >"$OUT/$f"; }
rec squeue_start.txt env SLURM_TIME_FORMAT=%s squeue --all --noheader --start --states=PENDING \
    --partition=batch,gpu --format "$FMT_START"
rec squeue_start_default.txt squeue --start
rc=0; as_user scontrol release "$AHELD" >"$OUT/scontrol_release.txt" 2>&1 || rc=$?
echo "$rc" >"$OUT/scontrol_release.rc"

cat >"$OUT/jobs_pending.txt" <<JOBS
rec-block-gpu=$BLOCK
rec-pend-resources=$RES
rec-pend-priority=$PRIO
rec-pend-held-user=$UHELD
rec-pend-held-admin=$AHELD
rec-pend-begin=$BEGIN
JOBS
echo "recorded squeue_start.txt and the hold/release outputs into $OUT"
