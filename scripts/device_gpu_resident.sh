#!/usr/bin/env bash
# Run THERE (device machine, .deps carried): resident decode (issue 19, docs/gpu.md) against the
# per-layer synced path (--gpu-sync-layers) on a Qwen3-30B-A3B-shaped q8 pack of LAYERS layers
# (default 6) with every expert in VRAM: ROUNDS interleaved rounds (default 3) of NTOK greedy
# tokens (default 256) each after a 512-token prompt (whose prefill loads almost every expert, so
# decode runs warm), decode tok/s and phase times per mode, the median ratio. Then the GPU kernel
# and forward tests (gpu_kernels_test, gpu_decode_gemv_test, gpu_fused_ops_test,
# gpu_forward_test; SKIP_TESTS=1 skips them). Output:
# $OUT/summary.txt, the runs' stats JSON and the test logs.
source "$(dirname "$0")/device_gpu_env.sh" device_resident
LAYERS=${LAYERS:-6}
ROUNDS=${ROUNDS:-3}
NTOK=${NTOK:-256}
t0=$(date +%s)
gpu_build 60 infer synth_model gpu_forward_test gpu_kernels_test gpu_decode_gemv_test gpu_fused_ops_test
say "build: $(( $(date +%s) - t0 )) s"
synth_q30
say "model: qwen3-30b-a3b shape, $LAYERS layers, q8 experts, $(du -sh "$M" | cut -f1)"
PF=(--prompt-ids "$(q30_prompt 512)")
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
import sys
sys.path.insert(0, "scripts")
from decode_rounds import print_medians
rounds = int(sys.argv[2])
res = print_medians(sys.argv[1], rounds, ("resident", "synced"), ("resident_steps", "resident_redone", "gpu_misses"))
if "resident" in res and "synced" in res:
    print(f"resident / synced decode: {res['resident'] / res['synced']:.2f}x (medians of {rounds} interleaved rounds)")
PY
[ "${SKIP_TESTS:-0}" = 1 ] && exit 0
for t in gpu_kernels_test gpu_decode_gemv_test gpu_fused_ops_test gpu_forward_test; do
  say "-- $t"
  "$B/$t" --gtest_brief=1 >"$O/$t.log" 2>&1; say "$t exit $?"
  grep -E "resident steps|FAILED|PASSED|Failure|error" "$O/$t.log" | head -40 | tee -a "$S"
done
