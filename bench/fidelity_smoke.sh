#!/bin/sh
# CI smoke check of bench_fidelity (no quality thresholds): the parity part on the byte-level
# corpus in quick mode, a few steps, one seed. Passes when every run finished and the table and
# curves were written. Usage: fidelity_smoke.sh BENCH_FIDELITY SCRATCH_DIR
set -eu
bench=$1
scratch=$2
rm -rf "$scratch"
mkdir -p "$scratch"
"$bench" --quick --only parity --corpora bytes --steps 6 --out "$scratch/runs" --bytes-data "$scratch/data-mhcc"
test -s "$scratch/runs/parity.md"
test -s "$scratch/runs/parity.svg"
grep -q "| bytes |" "$scratch/runs/parity.md"
rm -rf "$scratch"
