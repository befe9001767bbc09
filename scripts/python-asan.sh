#!/usr/bin/env bash
# The Python binding under AddressSanitizer + UBSan: builds libkvxfer with KVX_SANITIZE=address
# (build dir build-asan-py: the library only), installs the extension compiled and linked with
# -fsanitize=address,undefined into a throw-away target, and runs the binding tests (including
# the 10,000-cycle growth test) with the sanitizer runtimes preloaded into Debian's python.
# Leak detection is off: CPython and torch keep allocations until exit by design, and LSan would
# report those; growth is bounded by the tests themselves (tracemalloc for the Python heap, and
# for the C heap ASan's allocator statistics in place of glibc's mallinfo2). Any ASan/UBSan
# report aborts the run; the script exits non-zero when pytest fails or collects nothing.
# A stage of README command (2) (scripts/test.sh).
# Usage: bash scripts/python-asan.sh [pytest args...]   (default: tests/test_binding.py)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=/usr/bin/python3
B=build-asan-py
cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVX_SANITIZE=address -DKVX_BUILD_TESTS=OFF \
  -DKVX_BUILD_BENCH=OFF -DKVX_BUILD_EXAMPLES=OFF >/dev/null
cmake --build "$B" -j "${KVX_JOBS:-2}" --target kvxfer_static
TARGET="$(mktemp -d /tmp/kvxfer-asan.XXXXXX)"
trap 'rm -rf "$TARGET"' EXIT
SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
rm -rf python/build  # setuptools would reuse objects compiled with other flags
KVXFER_BUILD_DIR="$PWD/$B" KVXFER_EXT_CFLAGS="$SAN" KVXFER_EXT_LDFLAGS="$SAN" \
  "$PY" -m pip install -q --no-build-isolation --no-deps --no-cache-dir --target "$TARGET" ./python
rm -rf python/build
export PYTHONPATH="$TARGET"
export LD_PRELOAD="$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so)"
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:halt_on_error=1:alloc_dealloc_mismatch=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export KVX_PY_ASAN=1
cd python
[ "$#" -gt 0 ] || set -- tests/test_binding.py
set +e
"$PY" -m pytest -p no:cacheprovider -q -ra "$@"
rc=$?
set -e
case "$rc" in
  0) echo "python-asan: pytest passed under ASan+UBSan" ;;
  5) echo "python-asan: pytest collected no tests (exit 5)" >&2; exit 1 ;;
  *) echo "python-asan: pytest failed (exit $rc; 134 = an ASan/UBSan report aborted it)" >&2; exit "$rc" ;;
esac
