#!/usr/bin/env bash
# A syncer and 4 learners in 5 network namespaces (scripts/netbed), every learner link shaped by
# the kernel: 20 Mbit/s, 0.1 % loss each way (where nftables can filter the bridge), and 25 ms
# each way (50 ms RTT): by netem where the kernel has it, else by the learners' own shaper
# (--latency-ms 25 on every call; the kernel still shapes rate and loss). Started by hand as in docs/deployment.md (run
# file, per-learner tokens, TLS), over the namespace addresses. The run completes, every learner
# contributes to merged rounds through its shaped link, and the global model exports.
# Usage: four_learners_test.sh ATOLL NETBED SCRATCH   (exit 77 = skipped: not root / no netbed)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=cluster_lib.sh
source "$(dirname "$0")/cluster_lib.sh"
nbc_init "$1" "$2" "$3" nb4
shape=(--rate 20mbit)
learner_flags=()
can=$("$NETBED" check)
if grep -q "nftables bridge): yes" <<<"$can"; then
  shape+=(--loss 0.1%)
else
  echo "NOTE: no nftables bridge filtering here: links without loss"
fi
if grep -q "netem): yes" <<<"$can"; then
  shape+=(--delay 25ms)
else
  echo "NOTE: this kernel has no netem: the 25 ms each way are added by the learners' shaper (--latency-ms)"
  learner_flags+=(--latency-ms 25)
fi
nbc_bed 5 "${shape[@]}"
nbc_data
nbc_credentials 4
nbc_run_file 4 "steps = 40"
nbc_start_syncer
for m in 0 1 2 3; do nbc_start_learner "$m" "${learner_flags[@]}"; done
nbc_wait_learners
nbc_stop_syncer
"$NETBED" status "$NAME" >/dev/null 2>&1 || true
for m in 0 1 2 3; do
  steps=$(jq .steps "$DIR/learner-$m/learner-$m.json")
  [[ $steps -eq 40 ]] || nbc_fail "learner $m ran $steps steps, not 40"
  joins=$(jq .joins "$DIR/learner-$m/learner-$m.json")
  [[ $joins -ge 1 ]] || nbc_fail "learner $m never joined the syncer: $(jq -c . "$DIR/learner-$m/learner-$m.json")"
  rounds=$(nbc_rounds_with "$m")
  [[ $rounds -gt 0 ]] || nbc_fail "learner $m contributed to no round: $(tail -5 "$DIR/syncer.log")"
  up=$(jq .wire_bytes_up "$DIR/learner-$m/learner-$m.json")
  sent=$(nbc_link_sent_bytes $((m + 1)))
  # The learner's traffic went through its shaped link (headers make the link count larger).
  [[ $sent -ge $up ]] || nbc_fail "learner $m sent $up bytes but its shaped link carried only $sent"
  echo "learner $m: 40 steps, contributed to $rounds rounds, $up bytes up, $sent bytes through its shaped link"
done
# The syncer wrote the global model when it was stopped; the committed state exports to the same
# model, as docs/deployment.md says.
[[ -s $DIR/syncer/global.safetensors ]] || nbc_fail "the stopped syncer wrote no global.safetensors"
"$ATOLL" export --config "$DIR/run.toml" --state "$DIR/syncer/state" --out "$DIR/syncer/exported.safetensors" \
  >"$DIR/export.log" 2>&1 || nbc_fail "export: $(tail -5 "$DIR/export.log")"
[[ -s $DIR/syncer/exported.safetensors ]] || nbc_fail "export wrote no model"
total=$(jq -c 'select(.kind == "round")' "$DIR/syncer/metrics-syncer.jsonl" | wc -l)
echo "PASS: $total rounds merged; every learner contributed over shaped links"
[[ -n ${NETBED_KEEP:-} ]] || rm -rf "$DIR"
