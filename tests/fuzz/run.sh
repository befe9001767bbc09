#!/usr/bin/env bash
# Build every control-plane decoder fuzz target with clang (libFuzzer + ASan + UBSan) and run
# each for a bounded time over its seed corpus. Any crash, leak, sanitizer report or
# round-trip mismatch (the targets abort on one) fails the script.
# Env: KVX_FUZZ_SECONDS (per target, default 30), KVX_FUZZ_DIR (default build-fuzz),
#      KVX_FUZZ_TARGETS (space-separated subset, default all).
set -euo pipefail
cd "$(dirname "$0")/../.."
CC="${CC_FUZZ:-clang}"
if ! command -v "$CC" >/dev/null; then
  echo "fuzz: $CC not found (install clang); cannot run the fuzz stage" >&2
  exit 1
fi
SECS="${KVX_FUZZ_SECONDS:-30}"
OUT="${KVX_FUZZ_DIR:-build-fuzz}"
TARGETS="${KVX_FUZZ_TARGETS:-notify heartbeat meta layers connect address peer_regions tcp_conn}"
mkdir -p "$OUT"
# shellcheck disable=SC2046
MSGP="$(pkg-config --cflags --libs msgpack)"
XPORT_LIBS="$(pkg-config --cflags --libs libsodium liburcu-qsbr liburcu-cds numa) -lpthread -ldl"
for t in $TARGETS; do
  echo "fuzz: building fuzz_$t"
  if [ "$t" = tcp_conn ]; then # tcp data-connection decoder through a real tcp context
    # shellcheck disable=SC2086
    "$CC" -std=c11 -D_GNU_SOURCE -g -O1 -Wall -Wextra -Werror \
      -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
      -Iinclude -Itransport -Ilcore transport/*.c transport/tcp/*.c transport/shm/*.c \
      lcore/*.c "tests/fuzz/fuzz_$t.c" $XPORT_LIBS -o "$OUT/fuzz_$t"
    continue
  fi
  # shellcheck disable=SC2086
  "$CC" -std=c11 -D_GNU_SOURCE -g -O1 -Wall -Wextra -Werror \
    -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -Iinclude -Icontrol control/codec.c control/codec_hs.c control/wire.c control/ports.c \
    runtime/layout.c "tests/fuzz/fuzz_$t.c" \
    $MSGP -o "$OUT/fuzz_$t"
done
for t in $TARGETS; do
  work="$OUT/corpus-$t"
  rm -rf "$work" && mkdir -p "$work" "$OUT/artifacts"
  echo "fuzz: running fuzz_$t for ${SECS}s"
  log="$OUT/fuzz_$t.log"
  if ! ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=0 \
       UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
       "$OUT/fuzz_$t" -max_total_time="$SECS" -max_len=65536 -rss_limit_mb=2048 \
         -timeout=10 -print_final_stats=1 -artifact_prefix="$OUT/artifacts/$t-" \
         "$work" "tests/fuzz/corpus/$t" >"$log" 2>&1; then
    tail -n 60 "$log" >&2
    echo "fuzz: fuzz_$t FAILED; reproducer in $OUT/artifacts/, log in $log" >&2
    exit 1
  fi
  grep -E '^(Done|stat::(number_of_executed_units|new_units_added|peak_rss_mb))' "$log"
done
echo "fuzz: all targets passed"
