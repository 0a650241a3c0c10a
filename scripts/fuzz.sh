#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz, clang) and runs each for a bounded time on its seed
# corpus (docs/testing.md). FUZZ_SECONDS per target (default 60); FUZZ_TARGETS to pick some;
# FUZZ_SEED for libFuzzer's -seed (default 1: CI runs are reproducible).
# Inputs under tests/fuzz/known_crashes/<target>/ are crashes whose fix belongs to another change:
# they are never in the corpus, and a crash with the same signature (summary() below) as one of
# them is reported but not a failure (it is that bug again).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build-fuzz}
secs=${FUZZ_SECONDS:-60}
seed=${FUZZ_SEED:-1}
jobs=${JOBS:-$(nproc)}
args=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1"
      "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1" -DCMAKE_C_COMPILER="${FUZZ_CC:-clang-14}" -DCMAKE_CXX_COMPILER="${FUZZ_CXX:-clang++-14}"
      -DMOESTREAM_FUZZ=ON -DMOESTREAM_CUDA=OFF -DMOESTREAM_PYTHON=OFF)
command -v ccache >/dev/null && args+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
cmake -S . -B "$build" "${args[@]}" >/dev/null
cmake --build "$build" -j "$jobs" --target fuzz_targets

targets=${FUZZ_TARGETS:-$(cd tests/fuzz && ls fuzz_*.cpp | sed 's/\.cpp$//')}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# What identifies a crash's bug: the error kind and the first frame in moestream's sources
# (function and file, no line numbers, which shift). Any stack overflow in a target is one bug:
# unbounded recursion, wherever the stack happens to run out.
summary() {
  local kind frame
  kind=$(grep -m1 -oE '(Sanitizer|libFuzzer): [a-z-]+( [a-z-]+)?|runtime error: [a-z ]+' "$1" || true)
  case "$kind" in *stack-overflow*) echo "$kind"; return ;; esac
  kind+=$(grep -m1 -oE " throwing an instance of '[^']+'" "$1" || true)  # an escaped exception
  frame=$(grep -m1 -oE ' in [^ ]+ [^ ]*/(common|loader|runtime|kernels|cluster|tools)/[^ :]+' "$1" |
          sed -E 's# /[^ ]*/((common|loader|runtime|kernels|cluster|tools)/)# \1#' || true)
  echo "$kind$frame"
}
known_summaries() {
  local t=$1 f
  for f in tests/fuzz/known_crashes/"$t"/*; do
    [ -f "$f" ] || continue
    "$build/bin/$t" "$f" >"$work/known.log" 2>&1 || true
    summary "$work/known.log"
  done
}
status=0
for t in $targets; do
  corpus="$work/$t"  # a scratch copy: new inputs found in CI are not written into the checkout
  mkdir -p "$corpus"
  cp tests/fuzz/corpus/"$t"/* "$corpus"/ 2>/dev/null || true
  echo "== fuzz: $t for ${secs}s ($(ls "$corpus" | wc -l) seeds)"
  log="$work/$t.log"
  # -rss_limit_mb/-malloc_limit_mb: an input that makes a parser allocate gigabytes is a finding.
  if "$build/bin/$t" "$corpus" -seed="$seed" -max_total_time="$secs" -timeout=10 \
       -rss_limit_mb=2048 -malloc_limit_mb=1024 -max_len=65536 -print_final_stats=1 \
       -artifact_prefix="$work/$t-" >"$log" 2>&1; then
    grep -E "^stat::number_of_executed_units" "$log" || true
    continue
  fi
  crash=$(ls "$work/$t-"* 2>/dev/null | head -1 || true)
  if [ -n "$crash" ]; then mkdir -p "$build/fuzz-artifacts/$t" && cp "$crash" "$build/fuzz-artifacts/$t/"; fi
  sum=$(summary "$log")
  known=$(known_summaries "$t")  # not piped into grep -q: pipefail would see its SIGPIPE
  if [ -n "$sum" ] && grep -qxF "$sum" <<<"$known"; then
    echo "fuzz: $t hit a known crash ($sum): tests/fuzz/known_crashes/$t/, fixed in another branch"
    continue
  fi
  tail -60 "$log"
  echo "fuzz: $t FAILED; the input is kept as $build/fuzz-artifacts/$t/$(basename "${crash:-none}")"
  status=1
done
# The known crashes still crash (until their fix is merged) or no longer do: report which.
for dir in tests/fuzz/known_crashes/*/; do
  [ -d "$dir" ] || continue
  t=$(basename "$dir")
  for f in "$dir"*; do
    [ -f "$f" ] || continue
    if "$build/bin/$t" "$f" >/dev/null 2>&1; then
      echo "fuzz: known crash $f no longer crashes: move it into tests/fuzz/corpus/$t/"
    else
      echo "fuzz: known crash $f still crashes (its fix is in another branch)"
    fi
  done
done
exit $status
