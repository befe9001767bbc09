#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Side-by-side comparison of kvxfer's tcp and shm providers with their peers, in one run on
# loopback (docs/architecture.md §6: performance is reported as ratios against a peer measured in the
# same run):
#   1. iperf3 single stream, 1 MiB writes          vs  kvxfer-perf bw -t tcp -m write -s 1M
#   2. ucx_perftest UCX_TLS=tcp ucp_put_bw, 64 KiB  vs  kvxfer-perf bw -t tcp -m write -s 64K
#      ucx_perftest UCX_TLS=tcp ucp_put_bw, 1 MiB   vs  kvxfer-perf bw -t tcp -m write -s 1M
#   3. plain process_vm_readv loop, 1 MiB           vs  kvxfer-perf bw -t shm -m read -s 1M
#      single-core memcpy, 1 MiB                    (reference ceiling for shm)
#   4. process_vm_readv loop, 128 x 4 KiB iovecs per call  vs  kvxfer-perf bw -t shm -m read
#      -s 4K --batch 1 (one op per post, 128 in flight: small ops, issue 16). Same working set
#      (one 4 KiB page each side: all ops and all iovecs at offset 0), same pinning, and the same
#      iovecs per call: the provider keeps growing its pending group while bw's polls (64) are
#      filled by finished completions, so each process_vm_readv carries 128 (bw prints "CMA
#      calls"). The gap left is kvxfer's per-op post/poll work (docs/performance.md §4).
#   5. plain ZMQ DEALER/ROUTER echo                vs  kvxfer-perf notify's round trip (p50; the
#      median of its alternating rounds' ratios, both measured by that one command)
#   6. iperf3 single stream, 1 MiB writes          vs  kvxfer-perf trace --local -t tcp, WRITE and
#      READ (the main job: default trace, Llama-3.1-8B, 6 requests, --no-verify; host pools on
#      transparent huge pages, trace's default --hugepages on); throughput and CPU per GB
#      (iperf3: client + server CPU from its JSON; kvxfer: both engines' threads, trace JSON
#      summary.engine_cpu_s_per_gb)
#   6b. the same runs' --peer tcp: a plain streaming send/recv loop moving the trace's bytes
#      between the same pools (producer -> consumer, one connection). iperf3 reuses one 1 MiB
#      buffer that stays in cache; the trace reads and writes gigabytes of pool memory, so this
#      row separates what the memory costs from what kvxfer costs (docs/performance.md §12)
#   7. streaming process_vm_writev (WRITE) / process_vm_readv (READ) loop moving the trace's
#      bytes (same requests, block ids and extents; up to IOV_MAX iovecs per call)  vs
#      kvxfer-perf trace --local -t shm (same options as 6): both from one `--peer cma` run
# Each pair runs back to back with the same pinning (client CPU A, server CPU B) and the
# same duration. Targets (2-core machine): tcp >= 0.9x iperf3 and >= 1.5x ucx_perftest;
# shm >= 0.9x the process_vm_readv loop; shm 4 KiB ops >= 0.8x the batched loop; notify round
# trip <= 1.2x the ZMQ echo; trace over tcp >= 0.8x iperf3 at <= 1.5x its CPU/GB; trace over
# shm >= 0.8x the streaming CMA loop.
#
# Usage: bash bench/compare.sh [BUILD_DIR]       (default: build; builds kvxfer-perf there)
# Env:   KVX_CMP_SECONDS (default 5) per measurement, KVX_CMP_CPUS (default "0,1"),
#        KVX_CMP_ROUNDS (default 1): repeat every pair and report the median ratio.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${1:-build}"
SECS="${KVX_CMP_SECONDS:-5}"
CPUS="${KVX_CMP_CPUS:-0,1}"
ROUNDS="${KVX_CMP_ROUNDS:-1}"
CA="${CPUS%,*}"
CB="${CPUS#*,}"

# The peers come from Debian (also listed in scripts/install-deps.sh).
need=()
command -v iperf3 >/dev/null || need+=(iperf3)
command -v ucx_perftest >/dev/null || need+=(ucx-utils)
if [ "${#need[@]}" -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

if [ ! -x "$BUILD/bench/kvxfer-perf" ]; then
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
cmake --build "$BUILD" -j2 --target kvxfer-perf >/dev/null
PERF="$BUILD/bench/kvxfer-perf"

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Wait (bounded, 10 s) until a server listens on TCP port $1.
listening() {
  for _ in $(seq 200); do
    ss -Htln "sport = :$1" | grep -q . && return 0
    sleep 0.05
  done
  return 1
}

iperf3_gbs() { # size -> "GB/s CPU-seconds-per-GB" (client + server CPU)
  local p; p=$(port)
  iperf3 -s -1 -p "$p" -A "$CB" >/dev/null 2>&1 &
  local srv=$!
  local out=""
  listening "$p" && out=$(iperf3 -c 127.0.0.1 -p "$p" -l "$1" -t "$SECS" -A "$CA" -J 2>/dev/null) || out=""
  kill "$srv" 2>/dev/null || true
  wait "$srv" 2>/dev/null || true
  [ -n "$out" ] || { echo "iperf3 run failed" >&2; echo 0 0; return; }
  python3 -c 'import json,sys
e = json.loads(sys.argv[1])["end"]; r = e["sum_received"]; u = e["cpu_utilization_percent"]
cpu = (u["host_total"] + u["remote_total"]) / 100 * r["seconds"]
print("%.4f %.4f" % (r["bits_per_second"] / 8e9, cpu / (r["bytes"] / 1e9)))' "$out"
}

TRACE_JSON=$(mktemp)
trap 'rm -f "$TRACE_JSON"' EXIT
kvx_trace() { # write|read -> "GB/s CPU-seconds-per-GB loop-GB/s" of the main job over tcp
  "$PERF" trace --local -t tcp -m "$1" --speed 0 --requests 6 --pool-blocks 1100 --no-verify \
    --peer tcp --json "$TRACE_JSON" >/dev/null 2>&1 || { echo "trace $1 failed" >&2; echo 0 0 0; return; }
  python3 -c 'import json,sys; s = json.load(open(sys.argv[1]))["summary"]
print("%.4f %.4f %.4f" % (s["throughput_gbps"] or 0, s["engine_cpu_s_per_gb"] or 0,
                          s["peer"]["throughput_gbps"] or 0))' "$TRACE_JSON"
}

kvx_trace_shm() { # write|read -> "kvxfer-GB/s loop-GB/s" of the main job over shm (--peer cma)
  "$PERF" trace --local -t shm -m "$1" --speed 0 --requests 6 --pool-blocks 1100 --no-verify \
    --peer cma --json "$TRACE_JSON" >/dev/null 2>&1 || { echo "trace shm $1 failed" >&2; echo 0 0; return; }
  python3 -c 'import json,sys; s = json.load(open(sys.argv[1]))["summary"]
print("%.4f %.4f" % (s["throughput_gbps"] or 0, s["peer"]["throughput_gbps"] or 0))' "$TRACE_JSON"
}

ucx_gbs() { # size
  local p; p=$(port)
  # ucx_perftest has no duration option: size the run for about SECS seconds at ~0.1 GB/s.
  local n=$(( $1 >= 1048576 ? 100 * SECS : 1500 * SECS ))
  UCX_TLS=tcp taskset -c "$CB" ucx_perftest -p "$p" >/dev/null 2>&1 &
  local srv=$!
  local out=""
  listening "$p" && out=$(UCX_TLS=tcp taskset -c "$CA" timeout $((SECS * 10 + 30)) ucx_perftest \
        127.0.0.1 -p "$p" -t ucp_put_bw -s "$1" -n "$n" -w 100 2>/dev/null) || out=""
  kill "$srv" 2>/dev/null || true
  wait "$srv" 2>/dev/null || true
  [ -n "$out" ] || { echo "ucx_perftest run failed" >&2; echo 0; return; }
  # "Final:" row: overall bandwidth in MB/s (2^20 bytes) is the 7th field.
  echo "$out" | awk '/^Final:/ { printf "%.4f\n", $7 * 1048576 / 1e9 }'
}

kvx_gbs() { # transport mode size
  "$PERF" bw --local -t "$1" -m "$2" -s "$3" -D "$SECS" -l "$CA,$CB" --output=bandwidth
}

peer_gbs() { # cma|memcpy size [batch]
  "$PERF" bw --peer "$1" -s "$2" --batch "${3:-1}" -D "$SECS" -l "$CA,$CB" --output=bandwidth
}

# kvxfer-perf notify: median over its alternating rounds of p50(kvxfer) / p50(ZMQ echo).
notify_ratio() {
  "$PERF" notify --iters 6000 --msgs 2000 --hs-iters 2 --json - 2>/dev/null |
    python3 -c 'import json,sys; print("%.2f" % json.load(sys.stdin)["zmq_rtt_ratio_p50"])'
}

declare -A RAT
row() { # label kvx peer key [unit]
  local r u=${5:-GB/s}; r=$(python3 -c 'import sys; p = float(sys.argv[2]); print("%.2f" % (float(sys.argv[1]) / p) if p > 0 else "nan")' "$2" "$3")
  printf '  %-58s kvxfer %8.3f %s   peer %8.3f %s   ratio %sx\n' "$1" "$2" "$u" "$3" "$u" "$r"
  RAT[$4]+="$r "
}

echo "kvxfer compare: $(nproc) CPUs, client CPU $CA, server CPU $CB, ${SECS}s per measurement, $ROUNDS round(s)"
echo "  kernel $(uname -r); iperf3 $(iperf3 --version | head -1 | awk '{print $2}'); ucx $(ucx_info -v 2>/dev/null | awk '/Version/ {print $3; exit}')"
for r in $(seq "$ROUNDS"); do
  echo "round $r"
  read -r a acpu <<<"$(iperf3_gbs 1M)"
  b=$(kvx_gbs tcp write 1M);  row "tcp 1 MiB: kvxfer-perf bw -t tcp vs iperf3 (1 stream)" "$b" "$a" iperf3
  for m in write read; do
    read -r b bcpu loop <<<"$(kvx_trace $m)"
    row "trace tcp $m (main job) vs iperf3 (1 stream)" "$b" "$a" "trace_$m"
    row "trace tcp $m vs plain send/recv loop, same bytes" "$b" "$loop" "tcp_loop_$m"
    # CPU rows: the ratio is kvxfer's CPU per GB over iperf3's (lower is better).
    row "trace tcp $m CPU per GB vs iperf3's" "$bcpu" "$acpu" "cpu_$m" "s/GB"
  done
  a=$(ucx_gbs 65536);             b=$(kvx_gbs tcp write 64K); row "tcp 64 KiB WRITE vs ucx_perftest ucp_put_bw UCX_TLS=tcp" "$b" "$a" ucx64k
  a=$(ucx_gbs 1048576);           b=$(kvx_gbs tcp write 1M);  row "tcp 1 MiB WRITE vs ucx_perftest ucp_put_bw UCX_TLS=tcp" "$b" "$a" ucx1m
  a=$(peer_gbs cma 1M);           b=$(kvx_gbs shm read 1M);   row "shm 1 MiB READ vs plain process_vm_readv loop" "$b" "$a" cma
  a=$(peer_gbs memcpy 1M);                                     row "shm 1 MiB READ vs single-core memcpy (ceiling)" "$b" "$a" memcpy
  a=$(peer_gbs cma 4K 128);       b=$(kvx_gbs shm read 4K);   row "shm 4 KiB READ, 1 op/post vs process_vm_readv, 128 iovecs/call" "$b" "$a" cma4k
  for m in write read; do
    read -r b a <<<"$(kvx_trace_shm $m)"
    row "trace shm $m (main job) vs streaming CMA loop, same bytes" "$b" "$a" "shm_trace_$m"
  done
  r=$(notify_ratio)
  printf '  %-58s ratio %sx (kvxfer-perf notify, p50 round trip)\n' "notify round trip vs ZMQ DEALER/ROUTER echo" "$r"
  RAT[notify]+="$r "
done
med() { python3 -c 'import sys,statistics; print("%.2f" % statistics.median(map(float, sys.argv[1:])))' $1; }
echo "summary (median ratio over rounds; target in brackets):"
printf '  tcp vs iperf3        %sx  [>= 0.9]\n' "$(med "${RAT[iperf3]}")"
printf '  trace tcp write      %sx  [>= 0.8], CPU/GB %sx [<= 1.5]\n' "$(med "${RAT[trace_write]}")" "$(med "${RAT[cpu_write]}")"
printf '  trace tcp read       %sx  [>= 0.8], CPU/GB %sx [<= 1.5]\n' "$(med "${RAT[trace_read]}")" "$(med "${RAT[cpu_read]}")"
printf '  trace tcp write      %sx  vs the same-bytes socket loop (reference)\n' "$(med "${RAT[tcp_loop_write]}")"
printf '  trace tcp read       %sx  vs the same-bytes socket loop (reference)\n' "$(med "${RAT[tcp_loop_read]}")"
printf '  tcp vs ucx 64 KiB    %sx  [>= 1.5]\n' "$(med "${RAT[ucx64k]}")"
printf '  tcp vs ucx 1 MiB     %sx  [>= 1.5]\n' "$(med "${RAT[ucx1m]}")"
printf '  shm vs cma loop      %sx  [>= 0.9]\n' "$(med "${RAT[cma]}")"
printf '  shm vs memcpy        %sx  (reference)\n' "$(med "${RAT[memcpy]}")"
printf '  shm 4 KiB vs batched %sx  [>= 0.8]\n' "$(med "${RAT[cma4k]}")"
printf '  trace shm write      %sx  [>= 0.8]\n' "$(med "${RAT[shm_trace_write]}")"
printf '  trace shm read       %sx  [>= 0.8]\n' "$(med "${RAT[shm_trace_read]}")"
printf '  notify vs ZMQ echo   %sx  [<= 1.2]\n' "$(med "${RAT[notify]}")"
