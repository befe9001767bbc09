#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# What authentication costs (issue 17), measured in one session on this machine:
#   1. tcp bandwidth: `kvxfer-perf bw --local -t tcp` without and with --auth-dir, alternating
#      (plain, auth) KVX_AUTH_ROUNDS times; the medians and their ratio (auth / plain);
#   2. notification round trip and handshake time: `kvxfer-perf notify --auth-dir`, which
#      measures both ways between the same two processes and prints the auth/plain ratios.
# A fresh key directory (kvxfer-perf keygen) that allows its own key serves both sides.
#
# Usage: bash bench/auth_cost.sh [BUILD_DIR]        (default: build)
# Env:   KVX_AUTH_ROUNDS (3), KVX_AUTH_SIZE (1M), KVX_AUTH_ITERS (2000) for bw;
#        KVX_AUTH_NOTIFY_ARGS ("--iters 5000 --msgs 20000 --hs-iters 100") for notify.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${1:-build}"
ROUNDS="${KVX_AUTH_ROUNDS:-3}"
SIZE="${KVX_AUTH_SIZE:-1M}"
ITERS="${KVX_AUTH_ITERS:-2000}"
read -r -a NOTIFY_ARGS <<<"${KVX_AUTH_NOTIFY_ARGS:---iters 5000 --msgs 20000 --hs-iters 100}"
PERF="$BUILD/bench/kvxfer-perf"
[ -x "$PERF" ] || { echo "auth_cost.sh: $PERF not built" >&2; exit 2; }
tmp=$(mktemp -d /tmp/kvx_auth_cost.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
"$PERF" keygen "$tmp/auth" >/dev/null
cp "$tmp/auth/engine.key" "$tmp/auth/allowed/self.key"

median() { printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

plain=() auth=()
echo "== tcp bw, -s $SIZE -n $ITERS, $ROUNDS alternating rounds ($(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg))"
for r in $(seq "$ROUNDS"); do
	p=$("$PERF" bw --local -t tcp -s "$SIZE" -n "$ITERS" --output=bandwidth)
	a=$("$PERF" bw --local -t tcp -s "$SIZE" -n "$ITERS" --output=bandwidth --auth-dir "$tmp/auth")
	echo "round $r: plain $p GB/s, authenticated $a GB/s"
	plain+=("$p")
	auth+=("$a")
done
mp=$(median "${plain[@]}")
ma=$(median "${auth[@]}")
awk -v p="$mp" -v a="$ma" 'BEGIN { printf "tcp bw median: plain %.3f GB/s, authenticated %.3f GB/s, auth/plain %.2fx\n", p, a, a / p }'

echo "== notify round trip and handshake (kvxfer-perf notify ${NOTIFY_ARGS[*]} --auth-dir DIR)"
"$PERF" notify "${NOTIFY_ARGS[@]}" --auth-dir "$tmp/auth"
