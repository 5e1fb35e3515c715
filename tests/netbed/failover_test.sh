#!/usr/bin/env bash
# A shard served by a leader and a standby through etcd on separate hosts (docs/deployment.md,
# docs/decisions/022 and 023): etcd on host 0, syncer candidates a and b on hosts 1 and 2, 4
# learners on hosts 3-6 given both candidates (learner links 20 Mbit/s, 0.1 % loss where nftables
# can filter the bridge), per-learner tokens, TLS with a certificate per candidate, a 2 s lease, and b
# following a's commits over TLS. Once b is in a's replica set the leader's host is lost (every
# process of its namespace SIGKILLed, its state folder deleted): the standby leads from its own copy
# of the commits — no rebuild, and every version any learner held is there (no published round
# lost) —, rounds go on, every learner finishes all its steps, and the standby finishes the run.
# Prints how long after the loss the standby led and served, the commits it held, and each
# learner's longest gap between two steps.
# Usage: failover_test.sh ATOLL NETBED SCRATCH   (exit 77 = skipped: not root / no netbed)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=cluster_lib.sh
source "$(dirname "$0")/cluster_lib.sh"
nbc_init "$1" "$2" "$3" nbf
command -v etcd >/dev/null || nbc_fail "etcd not installed: run scripts/setup"
export NBC_LEARNER_TIMEOUT=400 NBC_SYNCER_TIMEOUT=420
shape=(--rate 20mbit)
grep -q "nftables bridge): yes" <<<"$("$NETBED" check)" && shape+=(--loss 0.1%)
nbc_bed 7 "${shape[@]}"
# The candidates' hosts are syncer machines: their links are not shaped (as netbed leaves host 0's).
# A standby follows every commit in full (Θ and the public copy of the fragment: about 8 bytes a
# parameter), which a 20 Mbit/s learner link could not carry at this run's rate of rounds.
for h in 1 2; do "$NETBED" shape "$NAME" "$h" --rate 0 --loss 0% >/dev/null; done
nbc_data
nbc_credentials 4
nbc_shard_certs 3  # certificates for hosts 0-2; the candidates use hosts 1 and 2
CANDIDATES="$("$NETBED" addr "$NAME" 1):$NBC_PORT|$("$NETBED" addr "$NAME" 2):$NBC_PORT"
NBC_SYNCERS=$CANDIDATES
nbc_run_file 4 "steps = 400"

nbc_start_etcd 0
nbc_start_candidate a 1
nbc_await 120 nbc_logged a "candidate a leads" || nbc_fail "a did not lead: $(tail -5 "$OUT/cand-a.log")"
nbc_start_candidate b 2
nbc_await 120 nbc_logged b "waiting for the leadership" || nbc_fail "b did not stand by: $(tail -5 "$OUT/cand-b.log")"
for m in 0 1 2 3; do
  echo '{"speed": 0.5}' >"$DIR/control-$m.json"
  nbc_start_learner "$m" --control-file "$DIR/control-$m.json"
done
fragments_with_rounds() {
  [[ $(jq -s '[.[] | select(.kind == "round") | .fragment] | unique | length' "$OUT/cand-a/metrics-syncer.jsonl" 2>/dev/null || echo 0) -ge 8 ]]
}
nbc_await 240 fragments_with_rounds || nbc_fail "a committed no round of every fragment: $(tail -5 "$OUT/cand-a.log")"
nbc_await 120 nbc_in_sync b || nbc_fail "b is not in a's replica set: $(tail -5 "$OUT/cand-b.log")"
sleep 5  # a few more rounds, pulled by the learners
# The leader's host is lost: every process of its namespace, and its disk.
ip netns pids "nb-$NAME-1" | xargs -r kill -KILL
lost=$(date +%s.%N)
rm -rf "$OUT/cand-a/state"
nbc_copies_at_loss 4
nbc_await 60 nbc_logged b "candidate b leads" || nbc_fail "b did not take over: $(tail -5 "$OUT/cand-b.log")"
led=$(date +%s.%N)
nbc_await 60 nbc_logged b "listening on port" || nbc_fail "b does not serve: $(tail -5 "$OUT/cand-b.log")"
served=$(date +%s.%N)
held=$(nbc_resumed_replica b)
nbc_finish_under b
took_over=$(jq -c '.leadership' "$OUT/cand-b/syncer-summary.json")
[[ $(jq .took_over <<<"$took_over") == true && $(jq .from_replica <<<"$took_over") == true ]] ||
  nbc_fail "b's summary does not report the takeover from its replica: $took_over"
rounds_b=$(jq -c 'select(.kind == "round")' "$OUT/cand-b/metrics-syncer.jsonl" | wc -l)
[[ $rounds_b -gt 0 ]] || nbc_fail "b closed no round after the takeover"
gaps=$(nbc_all_steps 4 400)
printf 'PASS: the standby led %.2f s and served %.2f s after the leader host was lost (lease 2 s); it held versions %s, the learners at most %s; %d rounds after; every learner ran 400 steps, longest gap between steps (s):%s; its summary: %s\n' \
  "$(awk "BEGIN { print $led - $lost }")" "$(awk "BEGIN { print $served - $lost }")" "$held" "$(declare -p NEWEST | sed 's/declare -A NEWEST=//')" \
  "$rounds_b" "$gaps" "$took_over"
[[ -n ${NETBED_KEEP:-} ]] || rm -rf "$DIR"
