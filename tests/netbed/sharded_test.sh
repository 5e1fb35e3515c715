#!/usr/bin/env bash
# A syncer sharded two ways on separate hosts, as docs/deployment.md says: shard 0 on host 0,
# shard 1 on host 1, 2 learners on hosts 2 and 3 (links 20 Mbit/s, 0.1 % loss where nftables can
# filter the bridge), one run file, per-learner tokens, TLS with a certificate per shard. Shard 1
# is SIGKILLed mid-run and restarted from its state: shard 0's fragments advance while it is
# down, it resumes at every version it committed, every learner finishes, and the shards' states
# export to the global model.
# Usage: sharded_test.sh ATOLL NETBED SCRATCH   (exit 77 = skipped: not root / no netbed)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=cluster_lib.sh
source "$(dirname "$0")/cluster_lib.sh"
nbc_init "$1" "$2" "$3" nbs
export NBC_LEARNER_TIMEOUT=420 NBC_SYNCER_TIMEOUT=450
shape=(--rate 20mbit)
grep -q "nftables bridge): yes" <<<"$("$NETBED" check)" && shape+=(--loss 0.1%)
nbc_bed 4 "${shape[@]}"
nbc_data
nbc_credentials 2
nbc_shard_certs 2
nbc_run_file 2 "steps = 300" "syncer_shards = 2"
nbc_start_shard 0 2 --finish-when-done
nbc_start_shard 1 2 --finish-when-done
rounds() { jq -c 'select(.kind == "round")' "$OUT/shard-$1/metrics-syncer.jsonl" 2>/dev/null | wc -l; }
# Both learners slowed down (a chaos control file) while the shard is killed and restarted.
for m in 0 1; do
  echo '{"speed": 0.25}' >"$DIR/control-$m.json"
  nbc_start_learner "$m" --control-file "$DIR/control-$m.json"
done
at_least() { [[ $(rounds "$1") -ge $2 ]]; }
nbc_await 200 at_least 1 4 || nbc_fail "shard 1 committed no rounds: $(tail -5 "$OUT/shard-1.log")"
# SIGKILL to the shard itself (every process of host 1's namespace: timeout(1) and atoll; a
# SIGKILL to timeout alone would orphan atoll).
ip netns pids "nb-$NAME-1" | xargs -r kill -KILL
{ wait "${NBC_SHARD_PID[1]}" || true; } 2>/dev/null
killed_at0=$(rounds 0)
committed=$(jq -s -c '[.[] | select(.kind == "round")] | group_by(.fragment) | map({(.[0].fragment | tostring): (map(.version) | max)}) | add' \
  "$OUT/shard-1/metrics-syncer.jsonl")
nbc_await 120 at_least 0 $((killed_at0 + 4)) || nbc_fail "shard 0 stalled while shard 1 was down"
echo "while shard 1 was down shard 0 merged $(($(rounds 0) - killed_at0)) rounds"
# The learners are stopped while it restarts, so that however long that takes they have steps left.
learners_signal() { for h in 2 3; do ip netns pids "nb-$NAME-$h" | xargs -r kill "-$1"; done; }
learners_signal STOP
nbc_start_shard 1 2 --finish-when-done
learners_signal CONT
at1=$(rounds 1)
nbc_await 120 at_least 1 $((at1 + 2)) || nbc_fail "restarted shard 1 merged nothing: $(tail -5 "$OUT/shard-1.log")"
for m in 0 1; do echo '{"speed": 1.0}' >"$DIR/control-$m.json"; done
nbc_wait_learners
for i in 0 1; do  # --finish-when-done: each shard stops by itself once both learners left it
  rc=0
  wait "${NBC_SHARD_PID[$i]}" || rc=$?
  [[ $rc -eq 0 ]] || nbc_fail "shard $i exited $rc: $(tail -5 "$OUT/shard-$i.log")"
done
resumed=$(jq -c 'select(.kind == "resumed") | .versions' "$OUT/shard-1/metrics-syncer.jsonl" | sed -n 1p)
[[ -n $resumed ]] || nbc_fail "shard 1 did not resume from its state: $(tail -5 "$OUT/shard-1.log")"
for p in $(jq -r 'keys[]' <<<"$committed"); do
  want=$(jq ".\"$p\"" <<<"$committed")
  got=$(jq ".[$p]" <<<"$resumed")
  [[ $got -ge $want ]] || nbc_fail "fragment $p: shard 1 committed version $want but resumed at $got"
done
for m in 0 1; do
  steps=$(jq .steps "$DIR/learner-$m/learner-$m.json")
  [[ $steps -eq 300 ]] || nbc_fail "learner $m ran $steps steps, not 300"
done
"$ATOLL" export --config "$DIR/run.toml" --state "$DIR/shard-0/state,$DIR/shard-1/state" \
  --out "$DIR/global.safetensors" >"$DIR/export.log" 2>&1 || nbc_fail "export: $(tail -5 "$DIR/export.log")"
echo "PASS: resumed at $resumed (committed before the kill: $committed); $(tail -1 "$DIR/export.log")"
[[ -n ${NETBED_KEEP:-} ]] || rm -rf "$DIR"
