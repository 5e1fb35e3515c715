#!/usr/bin/env bash
# A partition on real network stacks: a syncer and 3 learners in 4 namespaces (scripts/netbed,
# links shaped to 20 Mbit/s by the kernel); learner 1's link is taken down mid-run for 30 s, six
# times the learner timeout (5 s), so the syncer stops counting it as live. The others never
# stall (no gap between two of their steps beyond the grace cap plus an allowance for start-up
# noise), and after the link is back learner 1 contributes to merged rounds again.
# Usage: partition_test.sh ATOLL NETBED SCRATCH   (exit 77 = skipped: not root / no netbed)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=cluster_lib.sh
source "$(dirname "$0")/cluster_lib.sh"
nbc_init "$1" "$2" "$3" nbp
readonly PARTITIONED=1 AT_STEP=20 DOWN_S=30 STEPS=900
# 900 steps take 150-250 s where training runs in fp32 (no AVX-512-BF16) beside other tests.
export NBC_LEARNER_TIMEOUT=330 NBC_SYNCER_TIMEOUT=350
nbc_bed 4 --rate 20mbit
nbc_data
nbc_credentials 3
nbc_run_file 3 "steps = $STEPS"
nbc_start_syncer --learner-timeout 5
for m in 0 1 2; do nbc_start_learner "$m"; done
# Partition once learner 1 has trained AT_STEP steps (bounded wait on its metrics file).
metrics="$DIR/learner-$PARTITIONED/metrics-learner-$PARTITIONED.jsonl"
for ((i = 0; i < 900; i++)); do
  [[ -s $metrics ]] && (($(jq -s '[.[] | select(.kind == null)] | length' "$metrics") >= AT_STEP)) && break
  kill -0 "${NBC_LEARNER_PID[$PARTITIONED]}" 2>/dev/null || nbc_fail "learner $PARTITIONED exited early"
  sleep 0.1
done
"$NETBED" link "$NAME" $((PARTITIONED + 1)) down
t_down=$(date +%s.%N)
sleep "$DOWN_S"   # the partition itself
"$NETBED" link "$NAME" $((PARTITIONED + 1)) up
t_up=$(date +%s.%N)
nbc_wait_learners
nbc_stop_syncer
steps_left=$(jq -s "[.[] | select(.kind == null and .t > $t_up)] | length" "$metrics")
[[ $steps_left -gt 0 ]] || nbc_fail "learner $PARTITIONED had finished before the link came back: raise STEPS"
for m in 0 2; do
  gap=$(nbc_max_step_gap "$m")
  echo "learner $m: longest gap between two steps ${gap} s"
  awk -v g="$gap" 'BEGIN { exit !(g < 5.0 + 3.0) }' || nbc_fail "learner $m stalled for $gap s"
  during=$(jq -s "[.[] | select(.kind == null and .t > $t_down and .t < $t_up)] | length" \
    "$DIR/learner-$m/metrics-learner-$m.jsonl")
  [[ $during -gt 0 ]] || nbc_fail "learner $m took no step during the partition"
done
after=$(jq -c "select(.kind == \"round\" and .t > $t_up and (.contributors | index($PARTITIONED)))" \
  "$DIR/syncer/metrics-syncer.jsonl" | wc -l)
# A round that holds a push sent just before the cut may close up to the grace cap (5 s) later.
during=$(jq -c "select(.kind == \"round\" and .t > $t_down + 6 and .t < $t_up and (.contributors | index($PARTITIONED)))" \
  "$DIR/syncer/metrics-syncer.jsonl" | wc -l)
others=$(jq -c "select(.kind == \"round\" and .t > $t_down and .t < $t_up)" "$DIR/syncer/metrics-syncer.jsonl" | wc -l)
back=$(jq -s "[.[] | select(.kind == \"round\" and .t > $t_up and (.contributors | index($PARTITIONED))) | .t] | (min // $t_up) - $t_up" \
  "$DIR/syncer/metrics-syncer.jsonl")
echo "rounds during the partition: $others (with learner $PARTITIONED: $during); after it with learner $PARTITIONED: $after, the first ${back} s after the link came back"
[[ $others -gt 0 ]] || nbc_fail "no round merged during the partition: the others stalled"
[[ $during -eq 0 ]] || nbc_fail "learner $PARTITIONED contributed while partitioned: the link was not down"
[[ $after -gt 0 ]] || nbc_fail "learner $PARTITIONED never contributed after the link came back: $(tail -5 "$DIR/learner-$PARTITIONED.log")"
joins=$(jq .joins "$DIR/learner-$PARTITIONED/learner-$PARTITIONED.json")
[[ $joins -ge 2 ]] || nbc_fail "learner $PARTITIONED joined $joins time(s): the syncer never dropped it, or it never rejoined"
echo "PASS: the others kept training through a ${DOWN_S} s partition; learner $PARTITIONED rejoined and contributed"
[[ -n ${NETBED_KEEP:-} ]] || rm -rf "$DIR"
