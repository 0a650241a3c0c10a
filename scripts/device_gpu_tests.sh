#!/usr/bin/env bash
# Run THERE (device machine), after carrying .deps (scripts/device_deps.sh): builds the CUDA tier
# with tests and runs every GPU test binary that tests/CMakeLists.txt declares (gpu_*_test; the
# *_fake_test ones run in CI already), each under a timeout, then the demo model's greedy tokens
# on the CPU pass against --gpu and --gpu --parallel through the batched pass. Prints, and keeps in
# $OUT/summary.txt, each binary's verdict, its failures and the measured lines the tests print
# ("[ gpu_vs_cpu ... ]", "[ measured ] ..."); full logs in $OUT/logs.tgz.
# TESTS="a b" runs only those binaries; FILTER passes --gtest_filter to each.
source "$(dirname "$0")/device_gpu_env.sh" device_gpu_tests
keep_logs
say "== $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1); $(nproc) cores"
read -r -a tests <<<"${TESTS:-$(grep -o 'moestream_test(gpu_[a-z0-9_]*_test' tests/CMakeLists.txt | cut -d'(' -f2 | grep -v '_fake_test$' | sort -u | tr '\n' ' ')}"
t0=$(date +%s)
gpu_build 80 "${tests[@]}" infer
say "build: $(( $(date +%s) - t0 )) s (${tests[*]})"
rc=0
for t in "${tests[@]}"; do
  t1=$(date +%s)
  timeout "${TEST_TIMEOUT:-300}" "$B/$t" --gtest_brief=1 ${FILTER:+--gtest_filter="$FILTER"} >"$W/$t.log" 2>&1
  r=$?
  [ $r -eq 0 ] || rc=1
  say "$t: exit $r in $(( $(date +%s) - t1 )) s; $(grep -E '^\[  PASSED  \]' "$W/$t.log" | head -1) $(grep -cE '^\[  FAILED  \] [A-Za-z]' "$W/$t.log") failed"
  grep -E '^\[  FAILED  \] [A-Za-z]|Failure$' -A4 "$W/$t.log" | head -40 | tee -a "$S"
  grep -E '^\[ (gpu_vs_cpu|gpu batch|measured|resident)' "$W/$t.log" | head -60 | tee -a "$S"
done

say "== demo model, 48 greedy tokens: CPU pass | --gpu"
M=models/demo
P=$(head -c 400 "$M/heldout_head.txt")
timeout 60 "$B/infer" -m $M -p "$P" -n 48 --temp 0 --ignore-eos --print-ids -t 16 >"$W/demo_cpu.txt" 2>"$W/demo_cpu.err"
timeout 60 "$B/infer" -m $M -p "$P" -n 48 --temp 0 --ignore-eos --print-ids --gpu >"$W/demo_gpu.txt" 2>"$W/demo_gpu.err"
if [ -s "$W/demo_cpu.txt" ] && cmp -s "$W/demo_cpu.txt" "$W/demo_gpu.txt"; then say "identical"; else rc=1; say "DIFFERENT"; tail -3 "$W/demo_gpu.err" | tee -a "$S"; fi
say "exit $rc"
exit $rc
