#!/usr/bin/env bash
# Run THERE (device machine), after carrying .deps (scripts/device_deps.sh): builds the CUDA tier
# with tests, measures `infer --gpu` on the demo model (GPU vs CPU
# greedy tokens, look-ahead recall and decode tokens/s with lookahead 0/4/8 on a 25% GPU cache,
# on the demo and a synthetic Qwen3-30B-A3B shape), then runs every gpu_*_test (last, so a slow
# test cannot cost the measurements). Fits about 5 minutes of device time.
# Logs go to $OUT (summary.txt + logs.tgz); the summary is also printed.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/moestream_out}
W=$(mktemp -d /tmp/device_gpu.XXXXXX)
mkdir -p "$O"
S="$O/summary.txt"
say() { echo "$*" | tee -a "$S"; }
finish() { tar -czf "$O/logs.tgz" -C "$W" . 2>/dev/null; }
trap finish EXIT
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nvcc --version | tail -1; nproc; } >"$W/machine.txt" 2>&1
say "== machine"; cat "$W/machine.txt" | tee -a "$S"

t0=$(date +%s)
DEVICE_CMAKE_ARGS="-DMOESTREAM_CUDA=ON -DMOESTREAM_TESTS=ON -DGTest_DIR=${DEPS_DIR:-/tmp/deps}/usr/lib/x86_64-linux-gnu/cmake/GTest" BUILD_DIR=build-device-gpu \
  bash scripts/device_build.sh gpu_kernels_test gpu_expert_cache_test gpu_forward_test gpu_fixtures_test infer synth_model >"$W/build.log" 2>&1 ||
  { tail -80 "$W/build.log" | tee -a "$S"; exit 1; }
say "build: $(( $(date +%s) - t0 )) s"
B=build-device-gpu/bin
rc=0

M=models/demo
PROMPT=$(head -c 600 "$M/heldout_head.txt")
# Expert bytes of the whole demo model, from the layer files' headers (expert_bytes at offset 32).
EB=$(python3 -c "
import struct, glob
fs = sorted(glob.glob('$M/experts/layer_*.bin'))
h = open(fs[0], 'rb').read(64)
print(struct.unpack_from('<Q', h, 32)[0] * struct.unpack_from('<I', h, 20)[0] * len(fs))")
SMALL_MB=$(( EB / 4 / 1048576 ))
[ "$SMALL_MB" -lt 1 ] && SMALL_MB=1
say "== demo model: experts $EB bytes in all; small GPU cache = 25% = $SMALL_MB MiB"

say "-- greedy tokens, 64 after a $(echo "$PROMPT" | wc -c)-byte prompt: CPU vs GPU"
timeout 30 "$B/infer" -m $M -p "$PROMPT" -n 64 --temp 0 --ignore-eos --print-ids -t 16 >"$W/greedy_cpu.txt" 2>"$W/greedy_cpu.err"
timeout 30 "$B/infer" -m $M -p "$PROMPT" -n 64 --temp 0 --ignore-eos --print-ids --gpu >"$W/greedy_gpu.txt" 2>"$W/greedy_gpu.err"
if cmp -s "$W/greedy_cpu.txt" "$W/greedy_gpu.txt" && [ -s "$W/greedy_cpu.txt" ]; then
  say "identical: $(tr ',' '\n' <"$W/greedy_cpu.txt" | grep -c .) tokens"
else
  rc=1; say "DIFFERENT"; head -c 600 "$W/greedy_cpu.txt" "$W/greedy_gpu.txt" "$W/greedy_gpu.err" | tee -a "$S"
fi
grep '^infer: gpu:' "$W/greedy_gpu.err" | tee -a "$S"

# Decode speed and look-ahead: 256 tokens, best of 3 runs per setting (the first warms the page
# cache; each run is a fresh process, so the GPU cache starts cold every time).
NPRED=256
run() {  # name, then infer flags (model $M, prompt flags $PF, $NPRED tokens)
  local name=$1; shift
  for i in 1 2 3; do
    timeout 30 "$B/infer" -m $M "${PF[@]}" -n $NPRED --temp 0 --ignore-eos --print-ids "$@" \
      --timing --stats-json "$W/$name.$i.json" >/dev/null 2>"$W/$name.$i.err" || { rc=1; tail -5 "$W/$name.$i.err" | tee -a "$S"; }
  done
  python3 - "$name" "$W" <<'EOF' | tee -a "$S"
import json, sys
name, w = sys.argv[1], sys.argv[2]
runs = [json.load(open(f"{w}/{name}.{i}.json")) for i in (1, 2, 3)]
best = max(runs, key=lambda j: j["decode"]["tokens_per_s"])
d = best["decode"]; g = d.get("gpu_cache")
line = f"{name:24s} decode {d['tokens_per_s']:8.1f} tok/s (runs: " + \
       ", ".join(f"{j['decode']['tokens_per_s']:.1f}" for j in runs) + f"), prefill {best['prefill']['tokens_per_s']:.1f} tok/s"
if g:
    line += (f"; gpu hits {g['demand_hits']} misses {g['demand_misses']} evictions {g['evictions']}"
             f" H2D {g['h2d_bytes']/2**20:.1f} MiB/{g['h2d_copies']} copies, demand wait {g['demand_wait_s']*1e3:.1f} ms"
             f"; prefetch issued {g['prefetch_issued']} used {g['prefetch_used']} dropped {g['prefetch_dropped']}"
             f" cancelled {g.get('prefetch_cancelled', 0)} waited {g.get('prefetch_waits', 0)} ({g.get('prefetch_wait_s', 0)*1e3:.1f} ms)"
             f"; recall {g['lookahead_recall']:.3f} ({g['lookahead_demanded_predicted']}/{g['lookahead_demanded']})")
print(line)
EOF
}
PF=(-p "$PROMPT")
say "-- decode, 256 tokens (best of 3)"
run gpu_small_la0 --gpu --gpu-cache-mb $SMALL_MB
for n in 4 8; do run gpu_small_la$n --gpu --gpu-cache-mb $SMALL_MB --moe-lookahead $n; done
run gpu_small_la0_again --gpu --gpu-cache-mb $SMALL_MB   # drift check: same setting, later
say "-- same tokens with every look-ahead width (output never changes)"
for n in 0 4 8 12; do timeout 30 "$B/infer" -m $M -p "$PROMPT" -n 64 --temp 0 --ignore-eos --print-ids --gpu --gpu-cache-mb $SMALL_MB --moe-lookahead $n >"$W/la_ids_$n.txt" 2>/dev/null; done
for n in 4 8 12; do cmp -s "$W/la_ids_0.txt" "$W/la_ids_$n.txt" && say "lookahead $n: identical" || { rc=1; say "lookahead $n: DIFFERENT"; }; done
say "-- --timing of gpu_small_la8 (run 3)"
tail -12 "$W/gpu_small_la8.3.err" | tee -a "$S"

# A released shape at true byte size (random weights, so routing is not a trained model's):
# Qwen3-30B-A3B's first 8 layers, q4 experts; 64 prompt ids, 32 decoded tokens.
Q=/tmp/q30b_8l
t1=$(date +%s)
if timeout 150 "$B/synth_model" --shape qwen3-30b-a3b --layers 8 --quant q4 -q --max-context 4096 $Q >"$W/synth.log" 2>&1; then
  say "== synthetic qwen3-30b-a3b, 8 layers, q4 ($(du -sh $Q | cut -f1), written in $(( $(date +%s) - t1 )) s)"
  EB=$(python3 -c "
import struct, glob
fs = sorted(glob.glob('$Q/experts/layer_*.bin'))
h = open(fs[0], 'rb').read(64)
print(struct.unpack_from('<Q', h, 32)[0] * struct.unpack_from('<I', h, 20)[0] * len(fs))")
  SMALL_MB=$(( EB / 4 / 1048576 ))
  M=$Q; NPRED=32
  PF=(--prompt-ids "$(python3 -c "print(','.join(str((7919 * i + 11) % 151936) for i in range(64)))")")
  say "-- decode, 32 tokens (best of 3); experts $EB bytes, small cache 25% = $SMALL_MB MiB"
  run q30_gpu_small_la0 --gpu --ctx 1024 --gpu-cache-mb $SMALL_MB
  run q30_gpu_small_la4 --gpu --ctx 1024 --gpu-cache-mb $SMALL_MB --moe-lookahead 4
  run q30_gpu_small_la8 --gpu --ctx 1024 --gpu-cache-mb $SMALL_MB --moe-lookahead 8
  grep '^infer: gpu:' "$W/q30_gpu_small_la8.1.err" | tee -a "$S"
  tail -9 "$W/q30_gpu_small_la8.3.err" | tee -a "$S"
else
  say "synth_model failed or timed out: $(tail -3 "$W/synth.log")"
fi
# The tests run last, so a slow one cannot cost the measurements above.
run_tests() {
  say "== tests"
  for t in gpu_expert_cache_test gpu_forward_test gpu_fixtures_test gpu_kernels_test; do
    t1=$(date +%s)
    timeout 80 "$B/$t" >"$W/$t.txt" 2>&1
    r=$?
    [ $r -ne 0 ] && rc=1
    say "$t: exit $r in $(( $(date +%s) - t1 )) s; $(grep -E '^\[  (PASSED|FAILED) ' "$W/$t.txt" | tr '\n' ' ')"
    grep -E '^\[  FAILED  \]|Failure|error:' "$W/$t.txt" | head -20 | tee -a "$S"
  done
  say "-- kernel checks (worst error / tolerance)"
  grep -E '^\[ .* \] n=[0-9]+ worst error' "$W/gpu_kernels_test.txt" | tee -a "$S"
  grep -E '^\[ (bench|perf)' "$W/gpu_kernels_test.txt" | tee -a "$S"
  say "-- forward checks"
  grep -E '^\[ gpu' "$W/gpu_forward_test.txt" "$W/gpu_fixtures_test.txt" | tee -a "$S"
}
run_tests
exit $rc
