#!/usr/bin/env bash
# README command (1): install dependencies, build (Release), and replay the Mooncake FAST'25
# conversation trace with Llama-3.1-8B's KV layout through kvxfer: producer and consumer as two
# processes on this machine, best transport available (-t auto), WRITE mode then READ mode.
# Each replay prints its summary; the exit code is non-zero unless both end with 0 failures and
# verification OK. Results (JSON, CSV, PNG) go to out/. Extra arguments go to both replays,
# e.g. `bash scripts/main.sh --requests 20`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release -DKVX_BUILD_TESTS=OFF >/dev/null
cmake --build build-release -j "$(nproc)"
mkdir -p out
PERF=./build-release/bench/kvxfer-perf
TRACE=bench/data/traces/mooncake_fast25_conversation_trace.head3MB.jsonl
rc=0
for mode in write read; do
  echo
  echo "===== kvxfer-perf trace: Llama-3.1-8B, Mooncake conversation trace, ${mode^^} mode ====="
  "$PERF" trace --local --model Llama-3.1-8B --trace "$TRACE" -t auto -m "$mode" --prefix-cache \
    --json "out/trace-$mode.json" --csv "out/trace-$mode.csv" --plot "out/trace-$mode.png" "$@" || rc=1
done
if [ "$rc" -ne 0 ]; then
  echo "main: a replay failed (see the failed transfer ids above)" >&2
fi
exit "$rc"
