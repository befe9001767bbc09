#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Cost of the block leases over verbs (docs/protocol.md §5.11 "Cost", docs/performance.md), run
# inside the Soft-RoCE VM:
#   tests/rxe/run-vm.sh tests/rxe/payload-lease-cost.sh [PERF_BINARY]
# A leased transfer adds, on the connection it moves data over, one RDMA READ of the owner's
# 128-byte lease window before its first data op and (READ only) one 8-byte READ of the word
# after its last. This payload measures those two reads as kvxfer-perf lat READ post->completion
# (8 and 128 bytes) and the per-transfer time of a trace replay (READ and WRITE, back to back,
# one transfer at a time), alternating, KVX_VM_PERF_REPS rounds (default 3); the lease's share
# is lat(128) [+ lat(8) for READ] over the replay's median transfer latency. Raw outputs go to
# $KVX_VM_OUT (lease-*.txt, lease-trace-*.json); the summary is printed and kept in
# $KVX_VM_OUT/lease-cost.txt. Informational: nothing is enforced.
set -uo pipefail
B="$KVX_BUILD_DIR"
OUT="${KVX_VM_OUT:-/tmp}"
PERF="${1:-$B/bench/kvxfer-perf}"
REPS=${KVX_VM_PERF_REPS:-3}
REQS=${KVX_LEASE_REQUESTS:-12}
cd /tmp
rc=0
sum="$OUT/lease-cost.txt"
: > "$sum"
med() { printf '%s\n' "$@" | grep -v '^$' | sort -g | awk '{v[NR]=$1} END{ if (NR) print v[int((NR+1)/2)] }'; }
l8=(); l128=(); m8=(); m128=(); tr=(); tw=()
for i in $(seq 1 "$REPS"); do
  for s in 8 128; do
    row=$("$PERF" lat -t verbs -m read -s $s -n 1000 --local 2>>"$OUT/lease-err.txt" | tee -a "$OUT/lease-lat.txt" | awk -v s=$s '$1 == s')
    [ -n "$row" ] || { echo "lat $s failed"; rc=1; }
    if [ $s = 8 ]; then l8+=("$(echo "$row" | awk '{print $5}')"); m8+=("$(echo "$row" | awk '{print $3}')")
    else l128+=("$(echo "$row" | awk '{print $5}')"); m128+=("$(echo "$row" | awk '{print $3}')"); fi
  done
  for mode in read write; do
    j="$OUT/lease-trace-$mode-$i.json"
    "$PERF" trace --local -t verbs -m $mode --model Llama-3.1-8B --requests "$REQS" --concurrency 1 \
      --trace "$KVX_REPO/bench/data/traces/azure_llm_2023_conv.csv" --speed 0 --quiet --json "$j" \
      >>"$OUT/lease-trace.txt" 2>&1 || { echo "trace $mode failed"; rc=1; }
    p50=$(/usr/bin/python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["summary"]["latency_ms"]["p50"])' "$j" 2>/dev/null)
    [ $mode = read ] && tr+=("$p50") || tw+=("$p50")
  done
done
k8=$(med "${l8[@]}"); k128=$(med "${l128[@]}"); r=$(med "${tr[@]}"); w=$(med "${tw[@]}")
{
  echo "lease cost over verbs (rxe0, TCG VM), median of $REPS rounds"
  echo "  lat READ 8 B post->cpl typical us:   ${l8[*]} -> $k8 (t_min ${m8[*]})"
  echo "  lat READ 128 B post->cpl typical us: ${l128[*]} -> $k128 (t_min ${m128[*]})"
  echo "  trace READ p50 transfer ms ($REQS requests, concurrency 1):  ${tr[*]} -> $r"
  echo "  trace WRITE p50 transfer ms ($REQS requests, concurrency 1): ${tw[*]} -> $w"
  awk -v a="$k8" -v b="$k128" -v r="$r" -v w="$w" 'BEGIN{
    if (r > 0) printf "  READ lease (128 B + 8 B READ) %.1f us = %.3f%% of the median READ transfer\n", a + b, (a + b) / (r * 10);
    if (w > 0) printf "  WRITE lease (128 B READ) %.1f us = %.3f%% of the median WRITE transfer\n", b, b / (w * 10) }'
} | tee "$sum"
exit $rc
