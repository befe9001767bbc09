#!/usr/bin/env bash
# Python stage of README command (2): install the kvxfer package (C extension + vLLM connector)
# from this source tree against a CMake build, the way a user does (pip, --no-build-isolation,
# Debian's setuptools), into a throw-away target, then run its pytest suite with Debian's
# interpreter. Usage: bash scripts/test-python.sh [BUILD_DIR]   (default: build)
# Fails when pytest fails, collects nothing (exit code 5) or collects fewer tests than expected.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="$(cd "${1:-build}" && pwd)"
PY=/usr/bin/python3   # Debian's python (apt's torch, pytest); not the first python3 on PATH
MIN_TESTS=52          # tests/*.py hold more than this; fewer means files were skipped
TARGET="$(mktemp -d /tmp/kvxfer-py.XXXXXX)"
trap 'rm -rf "$TARGET"' EXIT

rm -rf python/build  # setuptools would reuse objects compiled with other flags (python-asan.sh)
KVXFER_BUILD_DIR="$BUILD" "$PY" -m pip install -q --no-build-isolation --no-deps --no-cache-dir \
  --target "$TARGET" ./python
export PYTHONPATH="$TARGET"
where="$(cd /tmp && "$PY" -c 'import kvxfer, kvxfer._kvxfer as m; print(m.__file__)')"
case "$where" in
  "$TARGET"/*) echo "test-python: kvxfer installed at $where" ;;
  *) echo "test-python: imported kvxfer from $where, not the install" >&2; exit 1 ;;
esac

cd python
n="$("$PY" -m pytest -p no:cacheprovider --collect-only -q tests | grep -c '::' || true)"
if [ "$n" -lt "$MIN_TESTS" ]; then
  echo "test-python: collected $n tests, expected at least $MIN_TESTS" >&2
  exit 1
fi
set +e
"$PY" -m pytest -p no:cacheprovider -q -ra tests
rc=$?
set -e
case "$rc" in
  0) echo "test-python: pytest passed ($n tests collected)" ;;
  5) echo "test-python: pytest collected no tests (exit 5)" >&2; exit 1 ;;
  *) echo "test-python: pytest failed (exit $rc)" >&2; exit "$rc" ;;
esac
