# shellcheck shell=bash
# A syncer and learners, each in its own namespace of a scripts/netbed bed, started by hand the
# way docs/deployment.md says: one run file, per-learner tokens from a run secret, TLS with a
# certificate for the syncer's address. Sourced by the netbed tests and bench/netbed_shaping.sh.
#
#   nbc_init ATOLL NETBED SCRATCH TAG   (exits 77 = skipped when this machine cannot run a bed)
#   nbc_bed HOSTS SHAPE...              the bed; host 0 = syncer, host m+1 = learner m
#   nbc_data; nbc_credentials M; nbc_run_file M KEY=VALUE...
#   nbc_start_syncer [FLAGS...]; nbc_start_learner M [FLAGS...]; nbc_wait_learners; nbc_stop_syncer
#   nbc_start_etcd HOST; nbc_start_candidate ID HOST [FLAGS...]; nbc_logged ID TEXT; nbc_in_sync ID
#     (a shard's leader and standbys through etcd, docs/decisions/022 and 023)
# Inputs (data, credentials, run file) live in $DIR, process outputs and logs in $OUT (= $DIR).
# Every process runs under timeout(1), and the EXIT trap kills what is left and removes the bed,
# so a test stops by itself and leaves nothing behind even when it fails.

readonly NBC_PORT=7070
NBC_PIDS=()
declare -A NBC_LEARNER_PID=()
declare -A NBC_SHARD_PID=()
declare -A NBC_CAND_PID=()
declare -A NEWEST=()

nbc_fail() { echo "FAIL: $*" >&2; exit 1; }

# nbc_await SECONDS CONDITION...: polls CONDITION every 0.1 s until it holds (0) or SECONDS pass (1).
nbc_await() {
  local n=$(($1 * 10))
  shift
  for ((; n > 0; n--)); do "$@" && return 0; sleep 0.1; done
  return 1
}

nbc_init() {
  ATOLL=$1 NETBED=$2
  if [[ $(id -u) -ne 0 ]]; then
    echo "SKIP: needs root (CAP_NET_ADMIN) to create network namespaces"
    exit 77
  fi
  local why
  if ! why=$("$NETBED" check 2>&1); then
    echo "SKIP: scripts/netbed cannot run here: $why"
    exit 77
  fi
  for tool in jq openssl; do
    command -v "$tool" >/dev/null || nbc_fail "'$tool' not found: run scripts/setup"
  done
  NAME="$4$$"
  DIR="$3/netbed-$4-$$"
  OUT=$DIR  # where processes write (syncer/, learner-<m>/, logs); a bench points it per run
  rm -rf "$DIR"
  mkdir -p "$DIR"
  trap nbc_cleanup EXIT
}

# Each pid is a timeout(1) wrapping an atoll process: SIGTERM reaches atoll through it, and
# timeout kills atoll 5 s later if it is still running (a SIGKILL to timeout would orphan it).
nbc_cleanup() {
  local pid
  for pid in "${NBC_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${NBC_PIDS[@]}"; do { wait "$pid" || true; } 2>/dev/null; done
  "$NETBED" down "$NAME" >/dev/null 2>&1 || true
}

nbc_bed() {
  local hosts=$1
  shift
  "$NETBED" up "$NAME" --hosts "$hosts" "$@"
  SYNCER_ADDR="$("$NETBED" addr "$NAME" 0):$NBC_PORT"
}

# A small byte-level corpus (the fortunes package, twice) prepared once per test.
nbc_data() {
  local f=/usr/share/games/fortunes/fortunes
  [[ -s $f ]] || nbc_fail "$f missing: run scripts/setup"
  cat "$f" "$f" >"$DIR/corpus.txt"
  "$ATOLL" data prepare --input "$DIR/corpus.txt" --tokenizer byte --out "$DIR/data" >"$DIR/data.log" 2>&1 ||
    nbc_fail "data prepare: $(tail -5 "$DIR/data.log")"
}

# The run secret, learner m's token HMAC-SHA256(secret, "atoll-learner\n<run id>\n<m>") for
# m < M, and a CA with a server certificate for the syncer's address.
nbc_credentials() {
  local m learners=$1 run_id=netbed c="$DIR/creds"
  mkdir -p "$c"
  chmod 700 "$c"
  openssl rand -hex 32 | tr -d '\n' >"$c/run.secret"
  for ((m = 0; m < learners; m++)); do
    printf 'atoll-learner\n%s\n%d' "$run_id" "$m" |
      openssl dgst -sha256 -hmac "$(cat "$c/run.secret")" -r | cut -d' ' -f1 | tr -d '\n' >"$c/learner-$m.token"
  done
  (
    cd "$c"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 -subj /CN=atoll-ca
    openssl req -newkey rsa:2048 -nodes -keyout syncer.key -out syncer.csr -subj /CN=syncer
    printf 'subjectAltName=DNS:syncer,IP:%s\n' "${SYNCER_ADDR%:*}" >san.ext
    openssl x509 -req -in syncer.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out syncer.pem -days 2 \
      -extfile san.ext
  ) >"$DIR/openssl.log" 2>&1 || nbc_fail "openssl: $(tail -5 "$DIR/openssl.log")"
  chmod 600 "$c"/*
}

# The run file every process is started from: a tiny model, few steps, M learners; extra lines
# (KEY = VALUE, [run] section) from the arguments.
nbc_run_file() {
  local learners=$1
  shift
  {
    echo "[run]"
    echo "learners = $learners"
    echo "run_id = \"netbed\""
    echo "data = \"$DIR/data\""
    local kv
    for kv in "$@"; do echo "$kv"; done
    echo "[model]"
    echo "preset = \"tiny\""
    echo "batch = 8"
    echo "seq = 64"
    echo "[diloco]"
    echo "fragments = 8"
    echo "H = 8"
    echo "tau = 1"
    echo "[eval]"
    echo "eval_batches = 4"
    echo "eval_every = 0"
  } >"$DIR/run.toml"
}

# shellcheck disable=SC2120  # extra syncer flags are optional
nbc_start_syncer() {
  mkdir -p "$OUT/syncer"
  "$NETBED" exec "$NAME" 0 -- timeout -k 5 "${NBC_SYNCER_TIMEOUT:-170}" \
    "$ATOLL" syncer -c "$DIR/run.toml" --listen "$SYNCER_ADDR" --out "$OUT/syncer" \
    --secret-file "$DIR/creds/run.secret" --tls-cert "$DIR/creds/syncer.pem" --tls-key "$DIR/creds/syncer.key" \
    --port-file "$OUT/syncer/port" "$@" >"$OUT/syncer.log" 2>&1 &
  SYNCER_PID=$!
  NBC_PIDS+=("$SYNCER_PID")
  # Wait (bounded) until it listens: the evaluator is built and the port bound.
  local i
  for ((i = 0; i < 600; i++)); do
    [[ -s $OUT/syncer/port ]] && return 0
    kill -0 "$SYNCER_PID" 2>/dev/null || nbc_fail "syncer exited: $(tail -20 "$OUT/syncer.log")"
    sleep 0.1
  done
  nbc_fail "syncer not listening after 60 s: $(tail -20 "$OUT/syncer.log")"
}

# A sharded syncer (docs/deployment.md): shard i of S on host i, port NBC_PORT, its own --out
# ($OUT/shard-i) and certificate. nbc_shard_certs S after nbc_credentials (the CA); then learners
# start on hosts S.. with every shard's address (NBC_SYNCERS, NBC_LEARNER_HOST0).
nbc_shard_certs() {
  local i shards=$1 c="$DIR/creds"
  NBC_SYNCERS=""
  for ((i = 0; i < shards; i++)); do
    local addr
    addr=$("$NETBED" addr "$NAME" "$i")
    NBC_SYNCERS+="${NBC_SYNCERS:+,}$addr:$NBC_PORT"
    (
      cd "$c"
      openssl req -newkey rsa:2048 -nodes -keyout "shard-$i.key" -out "shard-$i.csr" -subj "/CN=shard-$i"
      printf 'subjectAltName=IP:%s\n' "$addr" >"shard-$i.ext"
      openssl x509 -req -in "shard-$i.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -out "shard-$i.pem" -days 2 \
        -extfile "shard-$i.ext"
    ) >>"$DIR/openssl.log" 2>&1 || nbc_fail "openssl (shard $i): $(tail -5 "$DIR/openssl.log")"
    chmod 600 "$c/shard-$i".*
  done
  NBC_LEARNER_HOST0=$shards
}

# nbc_start_shard I S [FLAGS...]: shard I of S, listening on host I; waits until it listens.
nbc_start_shard() {
  local i=$1 shards=$2
  shift 2
  mkdir -p "$OUT/shard-$i"
  rm -f "$OUT/shard-$i/port"
  "$NETBED" exec "$NAME" "$i" -- timeout -k 5 "${NBC_SYNCER_TIMEOUT:-170}" \
    "$ATOLL" syncer -c "$DIR/run.toml" --shard "$i/$shards" --listen "$("$NETBED" addr "$NAME" "$i"):$NBC_PORT" \
    --out "$OUT/shard-$i" --secret-file "$DIR/creds/run.secret" --tls-cert "$DIR/creds/shard-$i.pem" \
    --tls-key "$DIR/creds/shard-$i.key" --port-file "$OUT/shard-$i/port" "$@" >>"$OUT/shard-$i.log" 2>&1 &
  NBC_SHARD_PID[$i]=$!
  NBC_PIDS+=("$!")
  local n
  for ((n = 0; n < 600; n++)); do
    [[ -s $OUT/shard-$i/port ]] && return 0
    kill -0 "${NBC_SHARD_PID[$i]}" 2>/dev/null || nbc_fail "shard $i exited: $(tail -20 "$OUT/shard-$i.log")"
    sleep 0.1
  done
  nbc_fail "shard $i not listening after 60 s: $(tail -20 "$OUT/shard-$i.log")"
}

nbc_start_learner() {
  local m=$1
  shift
  mkdir -p "$OUT/learner-$m"
  "$NETBED" exec "$NAME" $((m + ${NBC_LEARNER_HOST0:-1})) -- timeout -k 5 "${NBC_LEARNER_TIMEOUT:-150}" \
    "$ATOLL" learner -c "$DIR/run.toml" --id "$m" --syncer "${NBC_SYNCERS:-$SYNCER_ADDR}" --out "$OUT/learner-$m" \
    --token-file "$DIR/creds/learner-$m.token" --tls-ca "$DIR/creds/ca.pem" "$@" \
    >"$OUT/learner-$m.log" 2>&1 &
  NBC_LEARNER_PID[$m]=$!
  NBC_PIDS+=("$!")
}

# Waits for every learner started (each is bounded by its timeout) and checks it exited 0.
nbc_wait_learners() {
  local m rc
  for m in "${!NBC_LEARNER_PID[@]}"; do
    rc=0
    wait "${NBC_LEARNER_PID[$m]}" || rc=$?
    [[ $rc -eq 0 ]] || nbc_fail "learner $m exited $rc: $(tail -20 "$OUT/learner-$m.log")"
  done
  NBC_LEARNER_PID=()
}

# SIGTERM: the syncer stops cleanly (timeout(1) passes the signal on, and kills it 5 s later if
# it has not stopped).
nbc_stop_syncer() {
  kill -TERM "$SYNCER_PID" 2>/dev/null || true
  { wait "$SYNCER_PID" || true; } 2>/dev/null
}

# Rounds of the syncer in which learner m contributed.
nbc_rounds_with() {
  jq -c "select(.kind == \"round\" and (.contributors | index($1)))" "$OUT/syncer/metrics-syncer.jsonl" | wc -l
}

# Largest gap, in seconds, between two consecutive steps of learner m.
nbc_max_step_gap() {
  jq -s '[.[] | select(.kind == null) | .t] | [range(1; length) as $i | .[$i] - .[$i - 1]] | max // 0' \
    "$OUT/learner-$1/metrics-learner-$1.jsonl"
}

# Bytes the kernel sent out of host h's interface (its upload queue), from tc's statistics.
nbc_link_sent_bytes() {
  ip netns exec "nb-$NAME-$1" tc -s qdisc show dev eth0 | grep -o 'Sent [0-9]* bytes' | sed -n '1s/Sent \([0-9]*\) bytes/\1/p'
}

# etcd in host h's namespace (ETCD_ADDR), one member, for the candidates' leadership.
nbc_start_etcd() {
  ETCD_ADDR=$("$NETBED" addr "$NAME" "$1")
  "$NETBED" exec "$NAME" "$1" -- timeout -k 5 "${NBC_SYNCER_TIMEOUT:-420}" etcd --name e --data-dir "$DIR/etcd" \
    --listen-client-urls "http://$ETCD_ADDR:2379" --advertise-client-urls "http://$ETCD_ADDR:2379" \
    --listen-peer-urls "http://$ETCD_ADDR:2380" --initial-advertise-peer-urls "http://$ETCD_ADDR:2380" \
    --initial-cluster "e=http://$ETCD_ADDR:2380" >"$DIR/etcd.log" 2>&1 &
  NBC_PIDS+=("$!")
}

# Candidate ID of shard 0 on host h (its certificate shard-h from nbc_shard_certs, its own folder
# $OUT/cand-ID, log $OUT/cand-ID.log appended across starts), with a 2 s lease; it follows the
# leader's commits over TLS.
nbc_start_candidate() {
  local id=$1 host=$2
  shift 2
  mkdir -p "$OUT/cand-$id"
  "$NETBED" exec "$NAME" "$host" -- timeout -k 5 "${NBC_SYNCER_TIMEOUT:-420}" \
    "$ATOLL" syncer -c "$DIR/run.toml" --listen "$("$NETBED" addr "$NAME" "$host"):$NBC_PORT" --out "$OUT/cand-$id" \
    --secret-file "$DIR/creds/run.secret" --tls-cert "$DIR/creds/shard-$host.pem" \
    --tls-key "$DIR/creds/shard-$host.key" --tls-ca "$DIR/creds/ca.pem" --etcd "http://$ETCD_ADDR:2379" \
    --candidate-id "$id" --lease-ttl 2 --finish-when-done "$@" >>"$OUT/cand-$id.log" 2>&1 &
  NBC_CAND_PID[$id]=$!
  NBC_PIDS+=("$!")
}

nbc_logged() { grep -q "$2" "$OUT/cand-$1.log" 2>/dev/null; }

# The leader's replica set in etcd names candidate ID (read from etcd's host).
nbc_in_sync() {
  "$NETBED" exec "$NAME" 0 -- etcdctl --endpoints "http://$ETCD_ADDR:2379" get --prefix /atoll/ 2>/dev/null |
    grep -A1 '/replicas$' | tail -1 | jq -e ".in_sync | index(\"$1\")" >/dev/null 2>&1
}

# Newest version of each fragment learners 0..M-1 hold (their state files: version at byte 8), into
# the associative array NEWEST.
nbc_newest_copies() {
  local m f p v
  NEWEST=()
  for ((m = 0; m < $1; m++)); do
    for f in "$OUT/learner-$m/learner-$m-state"/fragment-*.bin; do
      p=$((10#$(basename "$f" .bin | sed 's/fragment-//')))
      v=$(od -An -t d8 -j 8 -N 8 "$f" | tr -d ' ')
      if [[ $v -gt ${NEWEST[$p]:--1} ]]; then NEWEST[$p]=$v; fi
    done
  done
}

# The versions the learners held when the leader was lost (NEWEST), read before the standby can
# lead: it waits out the old leader's lease (2 s) and then publishes rounds of its own, which a read
# after the takeover would count as versions the old leader published. A learner saves a fragment
# as soon as it pulls it; 0.3 s lets a pull that was already answered reach its file.
nbc_copies_at_loss() {
  sleep 0.3
  nbc_newest_copies "$1"
}

nbc_has_resumed() { jq -e -s '[.[] | select(.kind == "resumed")] | length > 0' "$OUT/cand-$1/metrics-syncer.jsonl" >/dev/null 2>&1; }

# Candidate ID resumed from the commits it followed (no rebuild) holding at least every version
# in NEWEST; prints the versions it resumed with.
nbc_resumed_replica() {
  local id=$1 p held
  nbc_await 120 nbc_has_resumed "$id" || nbc_fail "$id did not resume from the commits it followed: $(tail -5 "$OUT/cand-$id.log")"
  nbc_logged "$id" "from the leader's commits it followed" || nbc_fail "$id did not lead from its replica"
  ! nbc_logged "$id" "syncer: rebuild:" || nbc_fail "$id rebuilt from the learners instead of resuming its replica"
  held=$(jq -c -s '[.[] | select(.kind == "resumed")] | last | .versions' "$OUT/cand-$id/metrics-syncer.jsonl")
  for p in "${!NEWEST[@]}"; do
    [[ $(jq ".[$p]" <<<"$held") -ge ${NEWEST[$p]} ]] ||
      nbc_fail "fragment $p: $id holds version $(jq ".[$p]" <<<"$held"), a learner held ${NEWEST[$p]}"
  done
  echo "$held"
}

# The learners at full speed to their last step; candidate ID, which finishes the run, must exit 0.
nbc_finish_under() {
  local m rc=0
  for m in "${!NBC_LEARNER_PID[@]}"; do echo '{"speed": 1.0}' >"$DIR/control-$m.json"; done
  nbc_wait_learners
  wait "${NBC_CAND_PID[$1]}" || rc=$?
  [[ $rc -eq 0 ]] || nbc_fail "$1 exited $rc: $(tail -5 "$OUT/cand-$1.log")"
}

# Every learner 0..M-1 ran STEPS steps; prints each one's longest gap between two steps.
nbc_all_steps() {
  local m steps gaps=""
  for ((m = 0; m < $1; m++)); do
    steps=$(jq .steps "$DIR/learner-$m/learner-$m.json")
    [[ $steps -eq $2 ]] || nbc_fail "learner $m ran $steps steps, not $2"
    gaps+=" $(printf '%.2f' "$(nbc_max_step_gap "$m")")"
  done
  echo "$gaps"
}
