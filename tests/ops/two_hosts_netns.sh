#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The README's two-host sections (plain, then with authentication), replayed across two network
# namespaces joined by a veth pair
# that this script creates (10.231.<n>.1 = producer host, .2 = consumer host). Nothing outside
# those namespaces is touched. Exit 77 (ctest SKIP) with the reason when not root or without
# `ip netns`.
#
# Both namespaces share one kernel, so `-t auto` would pick shm (same boot id): the replays use
# -t tcp, the provider two real hosts without RDMA use.
# usage: two_hosts_netns.sh KVXFER_PERF_BINARY
set -uo pipefail
perf=$1
skip() { echo "SKIP: $*"; exit 77; }
[[ $(id -u) == 0 ]] || skip "needs root to create network namespaces"
command -v ip >/dev/null || skip "no ip(8) (iproute2)"

n=$(( ($$ % 200) + 20 ))
A=kvxA$$ B=kvxB$$ VA=kva$$ VB=kvb$$
PA=10.231.$n.1 PB=10.231.$n.2
tmp=$(mktemp -d /tmp/kvx_netns.XXXXXX)
srv_pid=
cleanup() {
	[[ -n $srv_pid ]] && kill "$srv_pid" 2>/dev/null && wait "$srv_pid" 2>/dev/null
	ip netns del "$A" 2>/dev/null
	ip netns del "$B" 2>/dev/null
	rm -rf "$tmp"
}
trap cleanup EXIT
ip netns add "$A" 2>"$tmp/err" || skip "ip netns add failed: $(cat "$tmp/err")"
ip netns add "$B" || exit 1
ip link add "$VA" type veth peer name "$VB" 2>"$tmp/err" || skip "no veth support: $(cat "$tmp/err")"
ip link set "$VA" netns "$A"
ip link set "$VB" netns "$B"
ip -n "$A" addr add "$PA/24" dev "$VA"
ip -n "$B" addr add "$PB/24" dev "$VB"
for ns in "$A" "$B"; do ip -n "$ns" link set lo up; done
ip -n "$A" link set "$VA" up
ip -n "$B" link set "$VB" up

fail() { echo "FAIL: $*" >&2; for f in "$tmp"/*.out "$tmp"/*.err; do echo "--- $f"; cat "$f"; done >&2; exit 1; }
inA() { ip netns exec "$A" "$@"; }
inB() { ip netns exec "$B" "$@"; }
wait_listening() { # block until the server says it waits for a client (observable state)
	timeout 120 grep -q -m1 -F "$1" <(tail --pid="$srv_pid" -n +1 -f "$tmp/srv.err") ||
		fail "the server never printed '$1'"
}

# 1. README: producer host runs the server (two runs), consumer host drives WRITE then READ.
#    No --host on either side: each engine advertises the address its driver connection uses.
( : >"$tmp/srv.out"; : >"$tmp/srv.err" ); inA "$perf" trace --server --port 7500 --runs 2 --port-range 7600-7602 >>"$tmp/srv.out" 2>>"$tmp/srv.err" &
srv_pid=$!
wait_listening "(run 1 of 2)"
inB "$perf" trace --client "$PA" --port 7500 --port-range 7600-7602 -t tcp -m write --requests 2 \
	--speed 0 --verify --quiet >"$tmp/c1.out" 2>"$tmp/c1.err" || fail "client WRITE run"
grep -q "verification           OK" "$tmp/c1.out" || fail "WRITE run not verified"
grep -q "transport tcp" "$tmp/c1.out" || fail "WRITE run not over tcp"
wait_listening "(run 2 of 2)"
inB "$perf" trace --client "$PA" --port 7500 --port-range 7600-7602 -t tcp -m read --requests 2 \
	--speed 0 --verify --quiet >"$tmp/c2.out" 2>"$tmp/c2.err" || fail "client READ run"
grep -q "verification           OK" "$tmp/c2.out" || fail "READ run not verified"
wait "$srv_pid"; rc=$?; srv_pid=
[[ $rc == 0 ]] || fail "server exit $rc after two good runs"
grep -q "run 1 OK" "$tmp/srv.out" && grep -q "run 2 OK" "$tmp/srv.out" || fail "server verdicts"
grep -q "== kvxfer-perf trace: READ mode, transport tcp ==" "$tmp/srv.out" || fail "server lacks the results"

# 2. A server told to advertise loopback: the client warns and names the listener it cannot reach.
( : >"$tmp/srv.out"; : >"$tmp/srv.err" ); inA "$perf" trace --server --port 7500 --host 127.0.0.1 >>"$tmp/srv.out" 2>>"$tmp/srv.err" &
srv_pid=$!
wait_listening "(run 1 of 1)"
inB "$perf" trace --client "$PA" --port 7500 -t tcp --requests 1 --quiet >"$tmp/c3.out" 2>"$tmp/c3.err" &&
	fail "a producer advertising loopback must fail the run"
grep -q "advertises 127.0.0.1" "$tmp/c3.err" || fail "no loopback warning"
grep -q "cannot reach the producer's notify listener at 127.0.0.1:" "$tmp/c3.err" || fail "unreachable listener not named"
wait "$srv_pid"; rc=$?; srv_pid=
[[ $rc != 0 ]] || fail "server exit 0 after a failed run"

# 3. Nobody at that address: a bounded wait and an error that names host:port and the listener.
inB "$perf" trace --client "10.231.$n.9" --port 7500 --connect-timeout-ms 1000 --requests 1 --quiet \
	>"$tmp/c4.out" 2>"$tmp/c4.err" && fail "client to a missing host succeeded"
grep -q "cannot reach the --server's driver channel (--port) at 10.231.$n.9:7500" "$tmp/c4.err" ||
	fail "unreachable server not named"
# 4. README, Authentication: a key directory per host, public keys swapped under the peers'
#    addresses, then the trace and bw two-host runs with --auth-dir on both sides.
inA "$perf" keygen "$tmp/authA" >/dev/null || fail "keygen A"
inB "$perf" keygen "$tmp/authB" >/dev/null || fail "keygen B"
cp "$tmp/authA/engine.key" "$tmp/authB/allowed/$PA.key"
cp "$tmp/authB/engine.key" "$tmp/authA/allowed/$PB.key"
( : >"$tmp/srv.out"; : >"$tmp/srv.err" ); inA "$perf" trace --server --port 7500 --port-range 7600-7602 \
	--auth-dir "$tmp/authA" >>"$tmp/srv.out" 2>>"$tmp/srv.err" &
srv_pid=$!
wait_listening "(run 1 of 1)"
inB "$perf" trace --client "$PA" --port 7500 --port-range 7600-7602 -t tcp --requests 1 --quiet \
	>"$tmp/c5.out" 2>"$tmp/c5.err" && fail "a client without --auth-dir ran against an authenticated server"
wait_listening "(1 refused so far; still listening)"
inB "$perf" trace --client "$PA" --port 7500 --port-range 7600-7602 -t tcp -m read --requests 2 --speed 0 \
	--verify --quiet --auth-dir "$tmp/authB" >"$tmp/c6.out" 2>"$tmp/c6.err" || fail "authenticated client run"
grep -q "verification           OK" "$tmp/c6.out" || fail "authenticated run not verified"
wait "$srv_pid"; rc=$?; srv_pid=
[[ $rc == 0 ]] || fail "authenticated server exit $rc"
grep -q -- "--client authenticated (key $PB.key)" "$tmp/srv.err" || fail "server did not name the client key"
( : >"$tmp/srv.out"; : >"$tmp/srv.err" ); inA "$perf" bw -t tcp -p 7700 --auth-dir "$tmp/authA" \
	>>"$tmp/srv.out" 2>>"$tmp/srv.err" &
srv_pid=$!
timeout 120 grep -q -m1 -F "listening on TCP port 7700" <(tail --pid="$srv_pid" -n +1 -f "$tmp/srv.out") ||
	fail "bw server never listened"
inB "$perf" bw -t tcp -s 64K -n 50 -p 7700 --auth-dir "$tmp/authB" "$PA" >"$tmp/c7.out" 2>"$tmp/c7.err" ||
	fail "authenticated bw client"
grep -q "authenticated (--auth-dir keys) and sealed" "$tmp/c7.out" || fail "bw header does not say authenticated"
wait "$srv_pid"; rc=$?; srv_pid=
[[ $rc == 0 ]] || fail "bw server exit $rc"
echo "two hosts (network namespaces) OK"
