#!/bin/sh
# End to end through the `atoll` binary on a tiny byte-level corpus: data prepare, train with
# checkpoints and report.html, resume from a mid-run checkpoint (with and without the model flags),
# sample, eval.
# Usage: model_cmd_e2e.sh ATOLL SCRATCH_DIR
set -eu
A="$1"
D="$2/e2e"
rm -rf "$D"
mkdir -p "$D"
i=0
while [ $i -lt 300 ]; do
  echo "the king said unto his people: lo, a great light came upon the land."
  i=$((i + 1))
done > "$D/corpus.txt"
TINY="--steps 6 --batch 4 --seq 32 --d-model 32 --layers 1 --heads 2 --d-ff 32 --eval-every 3
      --eval-batches 1 --checkpoint-every 3"
"$A" data prepare --input "$D/corpus.txt" --tokenizer byte --out "$D/data"
# shellcheck disable=SC2086
"$A" train --data "$D/data" --out "$D/run" $TINY
test -s "$D/run/summary.json"
test "$(grep -c '"kind":"train"' "$D/run/metrics.jsonl")" -eq 6
test -s "$D/run/checkpoints/step_000003/checkpoint.json"
# The report with its plot, written at the end of the run.
test "$(grep -c '<svg' "$D/run/report.html")" -eq 1
"$A" report "$D/run" | grep -q "report of the atoll train"
# shellcheck disable=SC2086
"$A" train --data "$D/data" --out "$D/run2" $TINY --resume "$D/run/checkpoints/step_000003"
grep -q '"steps_this_run": 3' "$D/run2/summary.json"
# The resumed run ends with the same training loss as the uninterrupted one (bit-exact resume).
loss1=$(grep '"train_loss"' "$D/run/summary.json")
loss2=$(grep '"train_loss"' "$D/run2/summary.json")
test "$loss1" = "$loss2"
# Resuming with no model flags, --data or --seed: they follow the checkpoint.
"$A" train --out "$D/run3" --steps 6 --batch 4 --eval-every 3 --eval-batches 1 \
  --resume "$D/run/checkpoints/step_000003" > "$D/run3.log"
grep -q "resume from checkpoint" "$D/run3.log"
loss3=$(grep '"train_loss"' "$D/run3/summary.json")
test "$loss1" = "$loss3"
"$A" sample --checkpoint "$D/run" --prompt "the king" --tokens 20 | grep -q "^the king"
# Eval of the run folder: the lines for people and the JSON line agree with the run's last eval.
"$A" eval --checkpoint "$D/run" --batches 1 > "$D/eval.txt"
grep -q "^eval loss [0-9.]*, perplexity" "$D/eval.txt"
"$A" eval --checkpoint "$D/run" --batches 1 --json > "$D/eval.json"
want=$(grep '"eval_loss"' "$D/run/summary.json" | sed 's/.*: *//; s/,$//')
grep -q "\"eval_loss\":$want," "$D/eval.json"
echo "cli_e2e: ok"
