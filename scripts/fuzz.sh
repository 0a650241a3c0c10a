#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz, clang) and runs each on its seed corpus for a fixed
# number of inputs (docs/testing.md): FUZZ_RUNS per target (default 200000, about 3 to 115 s each
# here) from libFuzzer's -seed FUZZ_SEED (default 1), so a run explores the same inputs on every
# machine and a CI verdict does not depend on the machine's speed. FUZZ_SECONDS (default 120) is
# only a ceiling per target; FUZZ_RUNS=-1 with FUZZ_SECONDS fuzzes by time instead (longer local
# sessions). FUZZ_TARGETS picks some targets.
# Every crash fails the job; once fixed, its input joins tests/fuzz/corpus/<target>/ as
# regression_<what> so every later run replays it first.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build-fuzz}
secs=${FUZZ_SECONDS:-120}
runs=${FUZZ_RUNS:-200000}
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
status=0
for t in $targets; do
  corpus="$work/$t"  # a scratch copy: new inputs found in CI are not written into the checkout
  mkdir -p "$corpus"
  cp tests/fuzz/corpus/"$t"/* "$corpus"/ 2>/dev/null || true
  echo "== fuzz: $t, $runs inputs from seed $seed (at most ${secs}s; $(ls "$corpus" | wc -l) seed files)"
  log="$work/$t.log"
  # -rss_limit_mb/-malloc_limit_mb: an input that makes a parser allocate gigabytes is a finding.
  if "$build/bin/$t" "$corpus" -seed="$seed" -runs="$runs" -max_total_time="$secs" -timeout=30 \
       -rss_limit_mb=2048 -malloc_limit_mb=1024 -max_len=65536 -print_final_stats=1 \
       -artifact_prefix="$work/$t-" >"$log" 2>&1; then
    grep -E "^stat::number_of_executed_units" "$log" || true
    continue
  fi
  crash=$(ls "$work/$t-"* 2>/dev/null | head -1 || true)
  if [ -n "$crash" ]; then mkdir -p "$build/fuzz-artifacts/$t" && cp "$crash" "$build/fuzz-artifacts/$t/"; fi
  sum=$(summary "$log")
  tail -60 "$log"
  echo "fuzz: $t FAILED ($sum); the input is kept as $build/fuzz-artifacts/$t/$(basename "${crash:-none}")"
  status=1
done
exit $status
