#!/usr/bin/env bash
# Sanitizer builds for CI (docs/testing.md). Each mode has its own build dir; no CUDA, no Python.
#   scripts/sanitize.sh asan   ASan+UBSan build of the whole unit suite, all of ctest
#   scripts/sanitize.sh tsan   TSan build of the concurrency suites (I/O engine, stores, caches,
#                              thread pool, forward's worker threads, server queue)
# Builds with gcc (its sanitizer runtimes ship with build-essential); CXX=clang++ works as well.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:?usage: scripts/sanitize.sh asan|tsan}
jobs=${JOBS:-$(nproc)}
common=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOESTREAM_CUDA=OFF -DMOESTREAM_PYTHON=OFF
        # -O1: sanitized -O2/-O3 builds of the Eigen kernels compile slowly and gain little here.
        # No -DNDEBUG: assertions stay on in the sanitized builds.
        "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1")
command -v ccache >/dev/null && common+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)

# Concurrency suites run under TSan (the test binaries that start threads around shared state).
TSAN_TESTS=(common_test io_engine_test expert_store_uring_test store_options_test lfu_policy_test
            lfru_policy_test forward_test server_test batch_scheduler_test expert_store_lookahead_test)

case "$mode" in
  asan)
    build=${BUILD_DIR:-build-asan}
    cmake -S . -B "$build" "${common[@]}" -DMOESTREAM_SANITIZE=ON >/dev/null
    cmake --build "$build" -j "$jobs"
    # detect_leaks: a leak fails the test. halt_on_error/abort: the first report is the failure.
    export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1
    export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
    ctest --test-dir "$build" --output-on-failure -j "$jobs"
    ;;
  tsan)
    build=${BUILD_DIR:-build-tsan}
    cmake -S . -B "$build" "${common[@]}" -DMOESTREAM_TSAN=ON >/dev/null
    cmake --build "$build" -j "$jobs" --target "${TSAN_TESTS[@]}"
    export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp"
    status=0
    for t in "${TSAN_TESTS[@]}"; do
      echo "== tsan: $t"
      (cd "$build" && "bin/$t" --gtest_brief=1) || { echo "tsan: $t FAILED"; status=1; }
    done
    exit $status
    ;;
  *) echo "usage: scripts/sanitize.sh asan|tsan" >&2; exit 2 ;;
esac
