#!/usr/bin/env bash
# README command (2): install dependencies, build, and run every test.
#   1. release build + all tests through ctest: the Criterion tests and the fault soak's short form
#      (tests/soak, ctest label "soak": READ/WRITE x tcp/shm with the fault kinds that pass today),
#      then the Python package (kvxfer and its vLLM connector) installed with pip against that
#      build + its pytest suite (scripts/test-python.sh)
#   2. the Python binding's tests (with the 10,000-cycle no-growth test) against an ASan+UBSan
#      libkvxfer and extension (scripts/python-asan.sh), then the ASan+UBSan build + all tests
#   3. TSan build + the multi-threaded tests: ring/lcore, control lcore, device staging, engine (label "tsan"),
#      and the metrics endpoint scraped during a trace replay (tests/ops/metrics_tsan.sh)
#   4. libFuzzer targets for a bounded time each (tests/fuzz/run.sh, needs clang)
#   5. the verbs conformance suite and perftest comparison inside the Soft-RoCE VM (tests/rxe/run-vm.sh)
# Env: KVX_JOBS (build parallelism, default nproc), KVX_SKIP_SANITIZERS=1, KVX_SKIP_FUZZ=1,
#      KVX_SKIP_VM=1 to leave out stages when iterating locally (CI runs everything).
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS="${KVX_JOBS:-$(nproc)}"
bash scripts/install-deps.sh --vm

stage() { printf '\n===== %s =====\n' "$*"; }
build() { # build DIR [cmake args...]
  local dir="$1"; shift
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
  cmake --build "$dir" -j "$JOBS"
}

stage "release build + tests"
build build
(cd build && ctest --output-on-failure)

stage "Python package (kvxfer, vLLM connector) + pytest"
bash scripts/test-python.sh build

if [ "${KVX_SKIP_SANITIZERS:-0}" != 1 ]; then
  stage "Python binding under ASan+UBSan (10,000-cycle no-growth test)"
  KVX_JOBS="$JOBS" bash scripts/python-asan.sh

  stage "ASan+UBSan build + tests"
  build build-asan -DKVX_SANITIZE=address
  (cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
     UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest --output-on-failure)

  # Criterion cannot start under TSan (Snaipe/Criterion#274, see tests/lcore/tsan_runner.h), so
  # the TSan build builds and runs the multi-threaded test files (ring/lcore stress, control
  # lcore, device staging threads, tcp progress groups, engine with 2 polling lcores) with the
  # in-process runner (ctest label "tsan").
  stage "TSan build + multi-threaded tests"
  cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVX_SANITIZE=thread \
    -DKVX_BUILD_BENCH=OFF >/dev/null
  cmake --build build-tsan -j "$JOBS" --target test_lcore_ring test_lcore_lcore \
    test_lcore_waiter test_lcore_rcu test_control_ctl_tsan test_control_auth_tsan test_devmem_mt_tsan test_tcp_groups_tsan test_runtime_fence_tsan \
    test_runtime_engine_tsan test_runtime_spread_tsan
  (cd build-tsan && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
     ctest --output-on-failure -L tsan)
  # The metrics endpoint's thread against the engines' application threads: a TSan kvxfer-perf
  # replays a trace while curl scrapes both engines' /metrics (tests/ops/metrics_tsan.sh).
  cmake -S . -B build-tsan-bench -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVX_SANITIZE=thread \
    -DKVX_BUILD_TESTS=OFF -DKVX_BUILD_EXAMPLES=OFF >/dev/null
  cmake --build build-tsan-bench -j "$JOBS" --target kvxfer-perf
  cat tests/lcore/tsan.supp tests/control/tsan.supp > build-tsan-bench/tsan.supp
  bash tests/ops/metrics_tsan.sh build-tsan-bench/bench/kvxfer-perf build-tsan-bench/tsan.supp
fi

if [ "${KVX_SKIP_FUZZ:-0}" != 1 ] && [ -x tests/fuzz/run.sh ]; then
  stage "fuzz targets"
  bash tests/fuzz/run.sh
fi

if [ "${KVX_SKIP_VM:-0}" != 1 ] && [ -x tests/rxe/run-vm.sh ]; then
  stage "verbs on Soft-RoCE (QEMU VM)"
  # The full verbs job takes ~8-9 min under TCG emulation; allow headroom on a loaded machine.
  KVX_VM_TIMEOUT="${KVX_VM_TIMEOUT:-1200}" bash tests/rxe/run-vm.sh
fi
stage "all test stages passed"
