#!/bin/sh
# CI smoke check of bench_syncer_grpc (no timing or memory thresholds): a real `atoll syncer` from a
# small spec under two gRPC learners for one round of each fragment, with the syncer's default
# outer step and with outer momentum; then bad flags, which must be refused.
# Usage: syncer_grpc_smoke.sh BENCH_SYNCER_GRPC SCRATCH_DIR
set -eu
bench=$1
scratch=$2
rm -rf "$scratch"
mkdir -p "$scratch"
small="--params 131072 --learners 2 --fragments 2 --rounds 1"
"$bench" $small --dir "$scratch/default" > "$scratch/default.log"
grep -q "outer momentum: the syncer's default" "$scratch/default.log"
grep -q "the syncer's pass and commit of a fragment's round" "$scratch/default.log"
"$bench" $small --outer-momentum 0.5 --dir "$scratch/momentum" --json > "$scratch/momentum.json"
grep -q '"outer_momentum": 0.5,' "$scratch/momentum.json"
grep -q '"syncer_exit": 0,' "$scratch/momentum.json"
for bad in 1.5 -0.1 x; do
  rc=0
  "$bench" $small --outer-momentum "$bad" 2> "$scratch/bad.log" || rc=$?
  test "$rc" -eq 2
  grep -q "outer-momentum takes a number in \[0, 1), not '$bad'" "$scratch/bad.log"
done
rm -rf "$scratch"
