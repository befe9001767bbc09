#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# TSan stage (scripts/test.sh): a real trace replay with both engines serving /metrics while curl
# scrapes both endpoints as fast as it can, so libmicrohttpd's thread reads snapshots while the
# application threads publish them. Fails on any ThreadSanitizer report, a failed replay, or
# scrapes that never saw the counters.
# usage: metrics_tsan.sh TSAN_KVXFER_PERF SUPPRESSIONS_FILE
set -uo pipefail
perf=$1 supp=$2
command -v curl >/dev/null || { echo "SKIP: curl is not installed"; exit 77; }
tmp=$(mktemp -d /tmp/kvx_metrics_tsan.XXXXXX)
pid=
trap '[[ -n $pid ]] && kill "$pid" 2>/dev/null; rm -rf "$tmp"' EXIT
: >"$tmp/out"; : >"$tmp/err" # exist before `tail -f` looks at them
TSAN_OPTIONS="halt_on_error=1:exitcode=66:suppressions=$supp" "$perf" trace --local -t tcp --requests 3 \
	--timeout-ms 600000 --metrics 127.0.0.1:0 >>"$tmp/out" 2>>"$tmp/err" &
pid=$!
# Block until both roles printed their endpoint (observable state).
timeout 300 grep -q -m1 "consumer metrics at" <(tail --pid="$pid" -n +1 -f "$tmp/err") || { cat "$tmp/err"; exit 1; }
timeout 300 grep -q -m1 "producer metrics at" <(tail --pid="$pid" -n +1 -f "$tmp/err") || { cat "$tmp/err"; exit 1; }
pu=$(grep -o 'producer metrics at http://[^ ]*' "$tmp/err" | awk '{print $4}')
cu=$(grep -o 'consumer metrics at http://[^ ]*' "$tmp/err" | awk '{print $4}')
seen=0 n=0
while kill -0 "$pid" 2>/dev/null; do
	curl -s --max-time 10 "$pu" >/dev/null
	curl -s --max-time 10 "$cu" >"$tmp/scrape" && grep -q '^kvxfer_transfers_total{outcome="done"}' "$tmp/scrape" && seen=1
	n=$((n + 1))
done
wait "$pid"; rc=$?; pid=
if grep -q "ThreadSanitizer" "$tmp/err" || [[ $rc != 0 || $seen != 1 ]]; then
	echo "FAIL: replay exit $rc, counters seen $seen, $n scrapes" >&2
	cat "$tmp/out" "$tmp/err" >&2
	exit 1
fi
echo "metrics under TSan OK ($n scrapes during the replay)"
