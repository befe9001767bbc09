#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Lcore scaling of the main job (issue 16, docs/performance.md §7): kvxfer-perf trace --local
# over shm and tcp, WRITE and READ, at -l 1, 2 and 4 lcores on a 2-CPU layout, with the layer
# spread on and off at 4 lcores (the only form with 2 pollers per engine), ROUNDS rounds, on/off
# order alternated between rounds. One TSV line per run on stdout: round, transport, mode,
# lcores, spread, GB/s, load average, bytes per lcore, lcore utilization, failures.
# Usage: bash bench/lcore_scaling.sh BUILD_DIR [ROUNDS]   (run it under nice -n -15, never chrt)
# KVX_SCALE_CONC=N: --concurrency N, 4 lcores only (default: the trace's default, all forms).
set -u
B=${1:?usage: lcore_scaling.sh BUILD_DIR [ROUNDS]}/bench/kvxfer-perf
ROUNDS=${2:-3}
CONC=${KVX_SCALE_CONC:-}
declare -A LF=([1]='0@(0,1)' [2]='0-1' [4]='0@0,1@1,2@0,3@1')
FORMS="1 2 4"
EXTRA=()
if [ -n "$CONC" ]; then FORMS=4; EXTRA=(--concurrency "$CONC"); fi
for round in $(seq 1 "$ROUNDS"); do
  for t in shm tcp; do
    for m in write read; do
      for L in $FORMS; do
        S=on
        if [ "$L" = 4 ]; then
          if [ $((round % 2)) = 1 ]; then S="on off"; else S="off on"; fi
        fi
        for sp in $S; do
          load=$(cut -d' ' -f1 /proc/loadavg)
          o=$(timeout 300 "$B" trace --local -t "$t" -m "$m" --speed 0 --requests 6 --pool-blocks 1100 \
                --no-verify -l "${LF[$L]}" --spread "$sp" --quiet "${EXTRA[@]}" 2>&1)
          gbs=$(echo "$o" | awk '/^  throughput/{print $2}')
          bpl=$(echo "$o" | awk -F'bytes per lcore' '/bytes per lcore/{gsub(/^ +/,"",$2); print $2}')
          util=$(echo "$o" | awk -F'lcore util' '/lcore util/{gsub(/^ +/,"",$2); print $2}')
          fail=$(echo "$o" | awk '/^  failures/{print $2}')
          printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$t" "$m" "$L" "$sp" "${gbs:-ERR}" \
            "$load" "$bpl" "$util" "${fail:-?}"
        done
      done
    done
  done
done
