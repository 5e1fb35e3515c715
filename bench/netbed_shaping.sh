#!/usr/bin/env bash
# Kernel shaping vs atoll's user-space WAN shaper at the same settings, side by side.
#
# The same short job runs twice on a scripts/netbed bed (a syncer and 2 learners, each in its own
# namespace): once with the learner links shaped by the kernel (netbed shape --rate R [--delay D])
# and the learners unshaped inside, once with the links unshaped and the learners' own shaper
# (--bandwidth-mbps, --latency-ms) at the same settings. It prints, per learner, the time from
# one step to the next, the compute part of it, and the time blocked on the exchange per step
# ("sync"; 0 in decoupled mode, where fragments travel in the background). Not a
# test: there is no threshold (docs/deployment.md records the numbers). Needs root.
#
# Usage: bench/netbed_shaping.sh ATOLL [RATE_MBIT=20] [DELAY_MS=0] [MODE=ddp] [STEPS=12]
#   MODE ddp: every step exchanges the whole gradient, so the link sets the step time;
#   MODE decoupled: fragments travel in the background, the step time should not move.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source-path=SCRIPTDIR source=../tests/netbed/cluster_lib.sh
source "$here/../tests/netbed/cluster_lib.sh"
atoll=$(realpath "$1")
rate=${2:-20} delay=${3:-0} mode=${4:-ddp} steps=${5:-12}
nbc_init "$atoll" "$here/../scripts/netbed" "${TMPDIR:-/tmp}" nbs
nbc_bed 3
nbc_data
nbc_credentials 2
nbc_run_file 2 "steps = $steps" "mode = \"$mode\""

# One run: learners 0 and 1 with extra learner flags; prints one table row.
run_once() {
  local label=$1
  shift
  OUT="$DIR/$label"
  mkdir -p "$OUT"
  nbc_start_syncer
  nbc_start_learner 0 "$@"
  nbc_start_learner 1 "$@"
  nbc_wait_learners
  nbc_stop_syncer
  local m metrics compute interval sync
  for m in 0 1; do
    metrics="$OUT/learner-$m/metrics-learner-$m.jsonl"
    # From the third step on (start-up excluded): compute time, and time from one step to the next.
    compute=$(jq -s '[.[] | select(.kind == null) | .step_s] | .[2:] | add / length' "$metrics")
    interval=$(jq -s '[.[] | select(.kind == null) | .t] | .[2:] | (.[-1] - .[0]) / (length - 1)' "$metrics")
    sync=$(jq '.barrier_wait_seconds / .steps' "$OUT/learner-$m/learner-$m.json")
    printf "%-12s %7d %11.3f %11.3f %11.3f\n" "$label" "$m" "$interval" "$compute" "$sync"
  done
}

shape=(--rate "${rate}mbit")
user=(--bandwidth-mbps "$rate")
if [[ $delay != 0 ]]; then
  shape+=(--delay "${delay}ms")
  user+=(--latency-ms "$delay")
fi
echo "mode $mode, $steps steps, 2 learners; link: $rate Mbit/s each way, ${delay} ms one-way delay"
printf "%-12s %7s %11s %11s %11s\n" "shaping" "learner" "s/step" "compute_s" "sync_s/step"
for h in 1 2; do "$NETBED" shape "$NAME" "$h" "${shape[@]}" >/dev/null; done
run_once kernel
for h in 1 2; do "$NETBED" shape "$NAME" "$h" --rate 0 --delay 0 >/dev/null; done
run_once user-space "${user[@]}"
