#!/usr/bin/env bash
# The WAN experiment (issue 14; docs/experiments.md "Across a WAN"): data-parallel (`--mode ddp`),
# synchronous DiLoCo (`--mode diloco`) and Decoupled DiLoCo (the defaults) across a scripts/netbed
# bed — a syncer and 4 learners in 5 network namespaces, every learner link shaped by the kernel
# (tbf) — run one after another on the same bed, data and model. It reports, per mode, seconds per
# step, tokens/s, the final eval loss, and the wall-clock time to a target eval loss (the worst of
# the three final losses, so that every mode reaches it), and the ratios to data-parallel.
#
# The link is derived, not picked: a first unshaped decoupled run measures the compute time of a
# step, t_c; data-parallel moves 2N bytes of bf16 gradient up and 2N bytes of bf16 parameter delta
# down per step and learner (N parameters), so at R bit/s each way its exchange takes
# 2·(2N·8)/R. The link is set so that this is F·t_c — data-parallel communication-bound by the
# factor F a 12 B model has across regions at 2–5 Gbps (F = 30 by default; the derivation is in
# docs/experiments.md). Not a test: no thresholds. Needs root (network namespaces).
#
# Usage: bench/bench_wan.sh ATOLL [--quick] [--factor F] [--steps N] [--out DIR]
#   --quick   12 steps per mode and F = 10: a smoke check of the pipeline (a few minutes)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source-path=SCRIPTDIR source=../tests/netbed/cluster_lib.sh
source "$here/../tests/netbed/cluster_lib.sh"
usage() { echo "usage: bench_wan.sh ATOLL [--quick] [--factor F] [--steps N] [--out DIR]" >&2; exit 2; }
[[ $# -ge 1 ]] || usage
atoll=$(realpath "$1")
shift
quick=0 factor="" steps="" out=""
while (($#)); do
  case $1 in
    --quick) quick=1; shift ;;
    --factor) [[ $# -ge 2 ]] || usage; factor=$2; shift 2 ;;
    --steps) [[ $# -ge 2 ]] || usage; steps=$2; shift 2 ;;
    --out) [[ $# -ge 2 ]] || usage; out=$2; shift 2 ;;
    *) usage ;;
  esac
done
if ((quick)); then factor=${factor:-10} steps=${steps:-12}; else factor=${factor:-30} steps=${steps:-120}; fi
[[ $factor =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "bench_wan: --factor must be a number" >&2; exit 2; }
[[ $steps =~ ^[0-9]+$ && $steps -ge 12 ]] || { echo "bench_wan: --steps must be an integer >= 12" >&2; exit 2; }
command -v python3 >/dev/null || { echo "bench_wan: python3 not found (scripts/setup)" >&2; exit 2; }
out=${out:-runs/bench-wan-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out"
out=$(realpath "$out")
nbc_init "$atoll" "$here/../scripts/netbed" "$out" wan
NBC_SYNCER_TIMEOUT=14400 NBC_LEARNER_TIMEOUT=14400
nbc_bed 5
nbc_data
nbc_credentials 4
log() { echo "bench_wan: $*"; }

# The run file of one mode: the tiny byte-level model on a short sequence (a step is short, so
# a shaped link makes data-parallel communication-bound at a link speed the kernel shapes well).
run_file() {  # MODE STEPS EVAL_EVERY [KEY=VALUE...]
  local mode=$1 n=$2 every=$3
  shift 3
  {
    echo "[run]"
    echo "mode = \"$mode\""
    echo "learners = 4"
    echo "steps = $n"
    echo "run_id = \"netbed\""
    echo "data = \"$DIR/data\""
    echo "[model]"
    echo "preset = \"tiny\""
    echo "batch = 8"
    echo "seq = 64"
    echo "warmup = 5"
    echo "[diloco]"
    local kv
    for kv in "$@"; do echo "$kv"; done
    echo "[eval]"
    echo "eval_batches = 8"
    echo "eval_every = $every"
  } >"$DIR/run.toml"
}

# One run across the bed; its folder is $DIR/<label>.
run_mode() {  # LABEL
  OUT="$DIR/$1"
  mkdir -p "$OUT"
  nbc_start_syncer
  local m
  for m in 0 1 2 3; do nbc_start_learner "$m"; done
  nbc_wait_learners
  nbc_stop_syncer
}

log "calibration: decoupled, unshaped links, 12 steps"
run_file decoupled 12 0
run_mode calibration
read -r params t_compute < <(python3 - "$DIR/calibration" <<'EOF'
import glob, json, statistics, sys
d = sys.argv[1]
params = json.load(open(f"{d}/syncer/syncer-summary.json"))["params"]
steps = []
for f in glob.glob(f"{d}/learner-*/metrics-learner-*.jsonl"):
    rows = [json.loads(l) for l in open(f)]
    steps += [r["step_s"] for r in rows if "step_s" in r][2:]
print(params, statistics.median(steps))
EOF
)
rate=$(python3 -c "print(max(100000, round(32 * $params / ($factor * $t_compute))))")
log "N = $params parameters, compute t_c = ${t_compute} s/step; data-parallel moves 2N bf16 bytes each way per step:"
log "link R = 2*(2N*8)/(F*t_c) = $rate bit/s each way (F = $factor), so its exchange takes about F*t_c"
for h in 1 2 3 4; do "$NETBED" shape "$NAME" "$h" --rate "${rate}bit" >/dev/null; done

# diloco: every fragment at the end of each period of H = steps/3 steps (three outer steps), as
# synchronous DiLoCo does with H ≫ 1; ddp: the whole gradient every step.
H=$((steps / 3))
run_file ddp "$steps" $((steps / 10 > 0 ? steps / 10 : 1))
log "data-parallel (ddp), $steps steps"
run_mode ddp
run_file diloco "$steps" 1 "fragments = 1" "H = $H"
log "synchronous DiLoCo (P = 1, H = $H), $steps steps"
run_mode diloco
run_file decoupled "$steps" 24
log "decoupled (defaults: P = H = 24, tau = 2, K = 1 + grace, int4), $steps steps"
run_mode decoupled

python3 - "$DIR" "$out" "$rate" "$factor" "$t_compute" "$params" "$steps" <<'EOF'
import glob, json, sys
d, out, rate, factor, t_c, params, steps = sys.argv[1:8]
rows = {}
for mode in ["ddp", "diloco", "decoupled"]:
    s = json.load(open(f"{d}/{mode}/syncer/syncer-summary.json"))
    starts, ends, tokens, step_s = [], [], 0, []
    for f in glob.glob(f"{d}/{mode}/learner-*/metrics-learner-*.jsonl"):
        r = [json.loads(l) for l in open(f)]
        r = [x for x in r if "step_s" in x]
        starts.append(r[0]["t"] - r[0]["step_s"]); ends.append(r[-1]["t"]); tokens += r[-1]["tokens"]
        step_s.append((r[-1]["t"] - r[0]["t"]) / max(1, len(r) - 1))
    t0 = min(starts)
    curve = [(0.0, s["eval_loss_start"])] + [(e["t"] - t0, e["eval_loss"]) for e in s.get("global_eval_curve", [])]
    curve.append((max(ends) - t0, s["eval_loss"]))
    rows[mode] = dict(wall=max(ends) - t0, tokens=tokens, step_s=sum(step_s) / len(step_s),
                      loss=s["eval_loss"], curve=curve, bytes=s.get("bytes_up", 0) + s.get("bytes_down", 0))
target = max(r["loss"] for r in rows.values())
def reach(curve, y):
    for (t0, a), (t1, b) in zip(curve, curve[1:]):
        if b <= y:
            return t1 if a == b or a <= y else t0 + (t1 - t0) * (a - y) / (a - b)
    return float("nan")
for r in rows.values():
    r["to_target"] = reach(r["curve"], target)
names = {"ddp": "data-parallel (ddp)", "diloco": "synchronous DiLoCo", "decoupled": "decoupled"}
dp = rows["ddp"]
lines = [f"link {int(rate)/1e6:.2f} Mbit/s each way per learner (F = {factor}, t_c = {float(t_c):.3f} s, N = {params}), "
         f"{steps} steps per learner, target eval loss {target:.4f} (the worst final loss)", "",
         "| mode | s/step | tokens/s | final eval loss | wall s | s to target | data-parallel ÷ this (time to target) |",
         "|---|---|---|---|---|---|---|"]
for m, r in rows.items():
    lines.append(f"| {names[m]} | {r['step_s']:.2f} | {r['tokens']/r['wall']:.0f} | {r['loss']:.4f} | {r['wall']:.0f} | "
                 f"{r['to_target']:.0f} | {dp['to_target']/r['to_target']:.1f}× |")
text = "\n".join(lines)
print(text)
open(f"{out}/wan.md", "w").write(text + "\n")
json.dump({m: {k: v for k, v in r.items()} for m, r in rows.items()} | {"target": target, "rate_bps": int(rate),
          "factor": float(factor), "t_compute": float(t_c)}, open(f"{out}/wan.json", "w"), indent=1)
EOF
log "table in $out/wan.md, numbers in $out/wan.json, runs in $DIR"
