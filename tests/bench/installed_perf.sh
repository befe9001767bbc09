#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# `cmake --install` puts kvxfer-perf in <prefix>/bin and its data in <prefix>/share/kvxfer; the
# installed binary uses that data from any directory and after the prefix is moved; the binary
# in the build tree uses the source tree's bench/data.
# usage: installed_perf.sh BUILD_DIR BUILD_TREE_BINARY SOURCE_DIR
set -euo pipefail
build=$1 built_bin=$2 src=$3
tmp=$(mktemp -d /tmp/kvx_perf_install.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$tmp/a" >/dev/null
[[ -x $tmp/a/bin/kvxfer-perf ]] || fail "bin/kvxfer-perf not installed"
[[ -f $tmp/a/share/kvxfer/models.csv ]] || fail "share/kvxfer/models.csv not installed"
[[ -f $tmp/a/share/kvxfer/traces/mooncake_fast25_conversation_trace.head3MB.jsonl ]] ||
	fail "share/kvxfer/traces not installed"
[[ -f $tmp/a/share/kvxfer/README.md ]] || fail "the data's attribution README is not installed"

# Defaults resolve to the installed share dir, whatever the current directory.
out=$(cd / && "$tmp/a/bin/kvxfer-perf" trace --help)
grep -qF "$tmp/a/share/kvxfer/models.csv" <<<"$out" || fail "trace --help default models.csv: $out"
grep -qF "$tmp/a/share/kvxfer/traces/" <<<"$out" || fail "trace --help default trace: $out"
out=$(cd / && "$tmp/a/bin/kvxfer-perf" plan --help)
grep -qF "$tmp/a/share/kvxfer/models.csv" <<<"$out" || fail "plan --help: $out"
[[ -f $tmp/a/share/kvxfer/plan_numpy_ref.py ]] || fail "share/kvxfer/plan_numpy_ref.py not installed"
grep -qF "$tmp/a/share/kvxfer/plan_numpy_ref.py under" <<<"$out" || fail "plan --help: numpy peer script: $out"
(cd / && "$tmp/a/bin/kvxfer-perf" plan --model Llama-3.1-8B --blocks 64 --min-ms 1 >"$tmp/plan.txt" 2>&1) ||
	{ cat "$tmp/plan.txt"; fail "installed plan with the installed models.csv"; }
grep -qF "/usr/bin/python3 $tmp/a/share/kvxfer/plan_numpy_ref.py;" "$tmp/plan.txt" ||
	{ cat "$tmp/plan.txt"; fail "installed plan did not run the installed numpy peer"; }
# With numpy present the installed peer must have run and agreed (no failure note).
if /usr/bin/python3 -c 'import numpy' 2>/dev/null; then
	! grep -q "numpy peer failed\|plans differ" "$tmp/plan.txt" ||
		{ cat "$tmp/plan.txt"; fail "the installed numpy peer did not run"; }
fi

# Relocated prefix: the data path follows the binary.
mv "$tmp/a" "$tmp/b"
out=$(cd / && "$tmp/b/bin/kvxfer-perf" trace --help)
grep -qF "$tmp/b/share/kvxfer/models.csv" <<<"$out" || fail "after moving the prefix: $out"
(cd / && "$tmp/b/bin/kvxfer-perf" trace --local -t tcp --requests 1 --speed 0 --quiet >"$tmp/trace.txt" 2>&1) ||
	{ cat "$tmp/trace.txt"; fail "installed trace replay"; }
grep -q "verification           OK" "$tmp/trace.txt" || { cat "$tmp/trace.txt"; fail "installed trace replay not verified"; }
grep -qF "$tmp/b/share/kvxfer/traces/" "$tmp/trace.txt" || { cat "$tmp/trace.txt"; fail "replayed a trace outside the prefix"; }

# KVX_PERF_DATA_DIR overrides both.
out=$(KVX_PERF_DATA_DIR=/some/data "$tmp/b/bin/kvxfer-perf" plan --help)
grep -qF "/some/data/models.csv" <<<"$out" || fail "KVX_PERF_DATA_DIR: $out"

# The build-tree binary uses the source tree.
out=$(cd / && "$built_bin" trace --help)
grep -qF "$src/bench/data/models.csv" <<<"$out" || fail "build tree binary: $out"
out=$(cd / && "$built_bin" plan --help)
grep -qF "$src/bench/plan_numpy_ref.py under" <<<"$out" || fail "build tree binary's numpy peer: $out"
echo "installed kvxfer-perf OK"
