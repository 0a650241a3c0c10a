#!/usr/bin/env bash
# Run THERE (device machine, .deps carried): resident decode (issue 19, docs/gpu.md) against the
# per-layer synced path (--gpu-sync-layers) on a Qwen3-30B-A3B-shaped q8 pack of LAYERS layers
# (default 6) with every expert in VRAM: ROUNDS interleaved rounds (default 3) of NTOK greedy
# tokens (default 256) each after a 512-token prompt (whose prefill loads almost every expert, so
# decode runs warm), decode tok/s and phase times per mode, the median ratio. Then the GPU kernel
# and forward tests (gpu_kernels_test, gpu_decode_gemv_test, gpu_fused_ops_test,
# gpu_forward_test; SKIP_TESTS=1 skips them). Output:
# $OUT/summary.txt, the runs' stats JSON and the test logs.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/moestream_out}
W=$(mktemp -d /tmp/device_resident.XXXXXX)
LAYERS=${LAYERS:-6}
ROUNDS=${ROUNDS:-3}
NTOK=${NTOK:-256}
mkdir -p "$O"
S="$O/summary.txt"
say() { echo "$*" | tee -a "$S"; }
t0=$(date +%s)
DEVICE_CMAKE_ARGS="-DMOESTREAM_CUDA=ON -DMOESTREAM_TESTS=ON -DGTest_DIR=${DEPS_DIR:-/tmp/deps}/usr/lib/x86_64-linux-gnu/cmake/GTest" \
  BUILD_DIR=build-device-gpu bash scripts/device_build.sh infer synth_model gpu_forward_test gpu_kernels_test gpu_decode_gemv_test gpu_fused_ops_test >"$W/build.log" 2>&1 ||
  { tail -60 "$W/build.log" | tee -a "$S"; exit 1; }
say "build: $(( $(date +%s) - t0 )) s"
B=build-device-gpu/bin
M=$W/q30
"$B/synth_model" --shape qwen3-30b-a3b --layers "$LAYERS" --quant q8 -q --max-context 4096 "$M" >"$W/synth.log" 2>&1 ||
  { tail -5 "$W/synth.log" | tee -a "$S"; exit 1; }
say "model: qwen3-30b-a3b shape, $LAYERS layers, q8 experts, $(du -sh "$M" | cut -f1)"
PF=(--prompt-ids "$(python3 -c "print(','.join(str((7919 * i + 11) % 151936) for i in range(512)))")")
for r in $(seq 1 "$ROUNDS"); do
  for mode in resident synced; do
    extra=(); [ "$mode" = synced ] && extra=(--gpu-sync-layers)
    "$B/infer" -m "$M" "${PF[@]}" -n "$NTOK" --temp 0 --ignore-eos --print-ids --gpu --timing \
      --stats-json "$O/$mode.$r.json" "${extra[@]}" >"$W/$mode.$r.ids" 2>"$W/$mode.$r.err" ||
      { say "$mode round $r failed"; tail -5 "$W/$mode.$r.err" | tee -a "$S"; }
  done
  cmp -s "$W/resident.$r.ids" "$W/synced.$r.ids" && say "round $r: identical tokens" || say "round $r: TOKENS DIFFER"
done
python3 - "$O" "$ROUNDS" <<'PY' | tee -a "$S"
import json, statistics, sys
o, rounds = sys.argv[1], int(sys.argv[2])
res = {}
for mode in ("resident", "synced"):
    runs = [json.load(open(f"{o}/{mode}.{r}.json")) for r in range(1, rounds + 1)]
    tps = [x["decode"]["tokens_per_s"] for x in runs]
    res[mode] = statistics.median(tps)
    d = runs[-1]["decode"]
    print(f"{mode:9s} decode tok/s {' '.join(f'{t:.1f}' for t in tps)} (median {res[mode]:.1f});"
          f" last run phases_s {json.dumps({k: round(v, 3) for k, v in d['phases_s'].items()})}; gpu {json.dumps({k: d['gpu_cache'].get(k) for k in ('resident_steps', 'resident_redone', 'gpu_misses')})}")
print(f"resident / synced decode: {res['resident'] / res['synced']:.2f}x (medians of {rounds} interleaved rounds)")
PY
[ "${SKIP_TESTS:-0}" = 1 ] && exit 0
for t in gpu_kernels_test gpu_decode_gemv_test gpu_fused_ops_test gpu_forward_test; do
  say "-- $t"
  "$B/$t" --gtest_brief=1 >"$O/$t.log" 2>&1; say "$t exit $?"
  grep -E "resident steps|FAILED|PASSED|Failure|error" "$O/$t.log" | head -40 | tee -a "$S"
done
