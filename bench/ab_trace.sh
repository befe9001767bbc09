#!/usr/bin/env bash
# A/B throughput of two kvxfer-perf builds on the same machine, in the same session.
#
#   bash bench/ab_trace.sh OLD_PERF NEW_PERF [ROUNDS] [-- extra trace options]
#
# For each round, each case (tcp/shm x write/read, plus the scripts/main.sh configuration:
# -t auto --prefix-cache at trace speed) runs `kvxfer-perf trace --local` with both binaries, in
# alternating order (A,B then B,A), so slow drift of the machine's load hits both alike. Prints
# one row per case: the per-round NEW/OLD throughput ratios and their median. Verification is off
# (--no-verify) so the figure is the engine's, not the checker's; the harness still fails a run
# with transfer failures, and such a run is reported as "fail".
set -uo pipefail
old=${1:?usage: ab_trace.sh OLD_PERF NEW_PERF [ROUNDS] [-- trace options]}
new=${2:?usage: ab_trace.sh OLD_PERF NEW_PERF [ROUNDS] [-- trace options]}
rounds=${3:-3}
shift $(($# < 3 ? $# : 3))
[ "${1:-}" = "--" ] && shift
py=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

cases=("tcp write --speed 0" "tcp read --speed 0" "shm write --speed 0" "shm read --speed 0"
       "auto write --prefix-cache" "auto read --prefix-cache")

# run BIN CASE -> prints GB/s or "fail"
run() {
	local bin=$1 t m rest
	read -r t m rest <<<"$2"
	shift 2
	# shellcheck disable=SC2086
	if "$bin" trace --local -t "$t" -m "$m" $rest --requests 6 --pool-blocks 1100 --no-verify \
		--json "$tmp/r.json" "$@" >"$tmp/log" 2>&1; then
		"$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["summary"]["throughput_gbps"])' \
			"$tmp/r.json"
	else
		echo fail
	fi
}

declare -A ratios
for ((r = 0; r < rounds; r++)); do
	for c in "${cases[@]}"; do
		if ((r % 2 == 0)); then
			a=$(run "$old" "$c" "$@"); b=$(run "$new" "$c" "$@")
		else
			b=$(run "$new" "$c" "$@"); a=$(run "$old" "$c" "$@")
		fi
		q=$("$py" -c 'import sys
a, b = sys.argv[1], sys.argv[2]
print("fail" if "fail" in (a, b) else "%.3f" % (float(b) / float(a)))' "$a" "$b")
		echo "round $r  $c  old $a GB/s  new $b GB/s  new/old $q" >&2
		ratios[$c]+="$q "
	done
done
printf '%-28s %-24s %s\n' case "ratios (new/old)" median
for c in "${cases[@]}"; do
	med=$("$py" -c 'import statistics,sys
v = sys.argv[1:]
print("fail" if "fail" in v else "%.3f" % statistics.median(map(float, v)))' ${ratios[$c]})
	printf '%-28s %-24s %s\n' "$c" "${ratios[$c]}" "$med"
done
