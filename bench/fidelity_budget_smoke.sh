#!/bin/sh
# CI smoke check of bench_fidelity's budget part (no quality thresholds): budget on the
# byte-level corpus in quick mode with a few steps, one seed (the frontier and outer parts run the
# same arms over more points: minutes here, so they are checked by hand); then the same budget
# command again, which must find every run done and run nothing (resumable --out); and bad flags,
# which must be refused. Usage: fidelity_budget_smoke.sh BENCH_FIDELITY SCRATCH_DIR
set -eu
bench=$1
scratch=$2
rm -rf "$scratch"
mkdir -p "$scratch"
common="--quick --corpora bytes --steps 8 --out $scratch/runs --bytes-data $scratch/data-mhcc"
"$bench" --only budget --confirm 1 $common
test -s "$scratch/runs/budget.md"
test -s "$scratch/runs/budget-bytes.svg"
grep -q "## bytes corpus" "$scratch/runs/budget.md"
grep -q "tuned" "$scratch/runs/budget.md"
"$bench" --only budget --confirm 1 $common > "$scratch/again.log"
grep -q "already done" "$scratch/again.log"
if grep -q ": exit " "$scratch/again.log"; then echo "a finished run ran again"; exit 1; fi
rc=0
"$bench" --only budget --dp-lrs 0.003,x $common 2> "$scratch/bad.log" || rc=$?
test "$rc" -eq 2
grep -q "not a positive number" "$scratch/bad.log"
rc=0
"$bench" --only budget --corpora bytes,nope 2> "$scratch/bad.log" || rc=$?
test "$rc" -eq 2
grep -q "corpus must be project or bytes (got 'nope')" "$scratch/bad.log"
rm -rf "$scratch"
