#!/usr/bin/env bash
# A leader cut off from the network, then a leader paused past its lease, on real network stacks
# (docs/decisions/022 and 023): etcd on host 0, syncer candidates a and b on hosts 1 and 2 (each
# follows the leader's commits), 4 learners on hosts 3-6 given both candidates (learner links
# 20 Mbit/s), per-learner tokens, TLS, a 2 s lease.
#  1. a leads, b is in its replica set. a's host link goes down (its namespace cut off: no etcd, no
#     learners): a fences itself, b leads from its own copy of the commits (no rebuild, no version
#     a learner held is lost) and the learners move to b. The link comes back: a is fenced — it
#     exits 3 without serving again (no split brain).
#  2. a is started again on its host (a standby following b; its old folder is moved aside). b is
#     paused (SIGSTOP) past its lease: a leads from its copy; b, continued, is fenced and exits 3.
# Every learner finishes all its steps; a finishes the run. Prints each takeover's delay.
# Usage: failover_cut_test.sh ATOLL NETBED SCRATCH   (exit 77 = skipped: not root / no netbed)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=cluster_lib.sh
source "$(dirname "$0")/cluster_lib.sh"
nbc_init "$1" "$2" "$3" nbk
command -v etcd >/dev/null || nbc_fail "etcd not installed: run scripts/setup"
export NBC_LEARNER_TIMEOUT=480 NBC_SYNCER_TIMEOUT=500
nbc_bed 7 --rate 20mbit
# The candidates' hosts are syncer machines: their links are not shaped (as netbed leaves host 0's).
# A standby follows every commit in full (Θ and the public copy of the fragment: about 8 bytes a
# parameter), which a 20 Mbit/s learner link could not carry at this run's rate of rounds.
for h in 1 2; do "$NETBED" shape "$NAME" "$h" --rate 0 --loss 0% >/dev/null; done
nbc_data
nbc_credentials 4
nbc_shard_certs 3  # certificates for hosts 0-2; the candidates use hosts 1 and 2
NBC_SYNCERS="$("$NETBED" addr "$NAME" 1):$NBC_PORT|$("$NETBED" addr "$NAME" 2):$NBC_PORT"
nbc_run_file 4 "steps = 600"

nbc_start_etcd 0
nbc_start_candidate a 1
nbc_await 120 nbc_logged a "candidate a leads" || nbc_fail "a did not lead: $(tail -5 "$OUT/cand-a.log")"
nbc_start_candidate b 2
for m in 0 1 2 3; do
  echo '{"speed": 0.5}' >"$DIR/control-$m.json"
  nbc_start_learner "$m" --control-file "$DIR/control-$m.json"
done
nbc_await 240 nbc_in_sync b || nbc_fail "b is not in a's replica set: $(tail -5 "$OUT/cand-b.log")"
sleep 3  # rounds under a, pulled by the learners

# 1. a's namespace is cut off.
"$NETBED" link "$NAME" 1 down
cut=$(date +%s.%N)
nbc_copies_at_loss 4
nbc_await 60 nbc_logged b "candidate b leads" || nbc_fail "b did not take over: $(tail -5 "$OUT/cand-b.log")"
led_b=$(date +%s.%N)
nbc_await 60 nbc_logged a "leadership lapsed" || nbc_fail "a did not fence itself: $(tail -5 "$OUT/cand-a.log")"
held_b=$(nbc_resumed_replica b)
"$NETBED" link "$NAME" 1 up
rc=0
wait "${NBC_CAND_PID[a]}" || rc=$?
[[ $rc -eq 3 ]] || nbc_fail "a (cut off, fenced) exited $rc, not 3: $(tail -5 "$OUT/cand-a.log")"
closed_rounds() { [[ $(jq -c 'select(.kind == "round")' "$OUT/cand-$1/metrics-syncer.jsonl" 2>/dev/null | wc -l) -gt 0 ]]; }
nbc_await 60 closed_rounds b || nbc_fail "b closed no round after the takeover"

# 2. a again, as a standby following b; then b paused past its lease.
nbc_start_candidate a 1
nbc_await 120 nbc_in_sync a || nbc_fail "a is not in b's replica set: $(tail -5 "$OUT/cand-a.log")"
sleep 3
b_pids=$(ip netns pids "nb-$NAME-2")
# shellcheck disable=SC2086
kill -STOP $b_pids
paused=$(date +%s.%N)
nbc_copies_at_loss 4
leads_again() { [[ $(grep -c "candidate $1 leads" "$OUT/cand-$1.log") -ge 2 ]]; }
nbc_await 60 leads_again a ||
  nbc_fail "a did not take over from the paused b: $(tail -5 "$OUT/cand-a.log")"
led_a=$(date +%s.%N)
held_a=$(nbc_resumed_replica a)
# shellcheck disable=SC2086
kill -CONT $b_pids
rc=0
wait "${NBC_CAND_PID[b]}" || rc=$?
[[ $rc -eq 3 ]] || nbc_fail "b (paused past its lease, fenced) exited $rc, not 3: $(tail -5 "$OUT/cand-b.log")"
nbc_logged b "leadership lapsed" || nbc_fail "b does not say its leadership lapsed"

nbc_finish_under a
summary=$(jq -c '.leadership' "$OUT/cand-a/syncer-summary.json")
[[ $(jq .from_replica <<<"$summary") == true ]] || nbc_fail "a's summary does not report the takeover from its replica: $summary"
gaps=$(nbc_all_steps 4 600)
printf 'PASS: leader cut off: b led %.2f s later from its replica (versions %s), a fenced and exited 3; leader paused: a led %.2f s later from its replica (versions %s), b fenced and exited 3; every learner ran 600 steps, longest gap between steps (s):%s; a'"'"'s summary: %s\n' \
  "$(awk "BEGIN { print $led_b - $cut }")" "$held_b" "$(awk "BEGIN { print $led_a - $paused }")" "$held_a" "$gaps" "$summary"
[[ -n ${NETBED_KEEP:-} ]] || rm -rf "$DIR"
