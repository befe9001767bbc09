#!/usr/bin/env bash
# README command (1): install dependencies, build (Release), and run the main job.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release -DKVX_BUILD_TESTS=OFF >/dev/null
cmake --build build-release -j "$(nproc)"
# Until `kvxfer-perf trace` lands, the main job is the ring benchmark (issue: foundation).
./build-release/bench/kvxfer-perf ring "$@"
