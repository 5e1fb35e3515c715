#!/usr/bin/env bash
# scripts/netbed itself: usage errors, a bed's life cycle (up, addr, exec, shape, link, status,
# down twice), and the kernel state each command leaves (namespaces, tbf rates, link state).
# Usage: cli_test.sh NETBED   (exit 77 = skipped: not root / netbed cannot run here)
set -euo pipefail
NETBED=$1
# grep reads to the end (never -q or -m) in pipelines: under pipefail a grep that stops early
# kills a writer that writes in small pieces (nft does) with SIGPIPE, and the check fails.
fail() { echo "FAIL: $*" >&2; exit 1; }
# expect CODE TEXT CMD...: CMD exits CODE and says TEXT.
expect() {
  local code=$1 text=$2 out rc=0
  shift 2
  out=$("$@" 2>&1) || rc=$?
  [[ $rc -eq $code ]] || fail "'$*' exited $rc, not $code: $out"
  [[ $out == *"$text"* ]] || fail "'$*' did not say '$text': $out"
}
expect 0 "netbed up NAME --hosts N" "$NETBED" --help
expect 2 "unknown command" "$NETBED" frobnicate
expect 2 "bad bed name" "$NETBED" up Bad_Name --hosts 2
expect 2 "--hosts must be 2..200" "$NETBED" up x --hosts 1
expect 2 "bad --rate" "$NETBED" up x --hosts 2 --rate 20mbps
expect 2 "bad --loss" "$NETBED" up x --hosts 2 --loss 0.1
expect 2 "--jitter needs --delay" "$NETBED" up x --hosts 2 --jitter 5ms
if [[ $(id -u) -ne 0 ]]; then
  echo "SKIP: needs root (CAP_NET_ADMIN) for the rest"
  exit 77
fi
if ! why=$("$NETBED" check 2>&1); then
  echo "SKIP: scripts/netbed cannot run here: $why"
  exit 77
fi
NAME="cli$$"
trap '"$NETBED" down "$NAME" >/dev/null 2>&1 || true' EXIT
expect 1 "no bed named" "$NETBED" status "$NAME"
expect 0 "3 hosts" "$NETBED" up "$NAME" --hosts 3 --rate 20mbit
expect 1 "exists already" "$NETBED" up "$NAME" --hosts 3
for ns in "nb-$NAME-br" "nb-$NAME-0" "nb-$NAME-1" "nb-$NAME-2"; do
  ip netns list | grep "^$ns\b" >/dev/null || fail "namespace $ns missing"
done
[[ $("$NETBED" addr "$NAME" 2) == 10.77.0.3 ]] || fail "host 2 is not 10.77.0.3"
expect 1 "hosts 0..2" "$NETBED" addr "$NAME" 3
# exec runs inside the host's namespace: its eth0 has the host's address.
"$NETBED" exec "$NAME" 1 -- ip -4 -o addr show dev eth0 | grep "10.77.0.2/24" >/dev/null || fail "exec: wrong namespace"
# Both directions of a learner link carry the rate; the syncer's link carries none.
rate_of() { tc -n "$1" qdisc show dev "$2" | grep -o 'rate [0-9]*[KMG]*bit' || true; }
[[ $(rate_of "nb-$NAME-1" eth0) == "rate 20Mbit" ]] || fail "upload of host 1: $(rate_of "nb-$NAME-1" eth0)"
[[ $(rate_of "nb-$NAME-br" h1) == "rate 20Mbit" ]] || fail "download of host 1: $(rate_of "nb-$NAME-br" h1)"
[[ -z $(rate_of "nb-$NAME-0" eth0) ]] || fail "the syncer's link is shaped"
expect 0 "rate 5mbit" "$NETBED" shape "$NAME" 2 --rate 5mbit --loss 1%
[[ $(rate_of "nb-$NAME-br" h2) == "rate 5Mbit" ]] || fail "shape did not change the rate: $(rate_of "nb-$NAME-br" h2)"
ip netns exec "nb-$NAME-br" nft list chain bridge netbed port2 | grep "< 10000 drop" >/dev/null ||
  fail "no 1 % loss rule on host 2's port"
expect 1 "host 0 is the syncer" "$NETBED" shape "$NAME" 0 --rate 1mbit
expect 0 "link down" "$NETBED" link "$NAME" 2 down
"$NETBED" status "$NAME" | grep -E "^2 " | grep " down " >/dev/null || fail "status does not show host 2 down"
expect 0 "link up" "$NETBED" link "$NAME" 2 up
expect 2 "down or up" "$NETBED" link "$NAME" 2 sideways
expect 0 "4 namespaces removed" "$NETBED" down "$NAME"
expect 0 "0 namespaces removed" "$NETBED" down "$NAME"
! ip netns list | grep "^nb-$NAME-" >/dev/null || fail "namespaces left after down"
echo "PASS: netbed usage, life cycle and kernel state"
