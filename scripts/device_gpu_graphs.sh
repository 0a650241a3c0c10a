#!/usr/bin/env bash
# Run THERE (device machine, .deps carried): issue 19's GPU decode changes on a Qwen3-30B-A3B-shaped
# q8 pack of LAYERS layers (default 6; synth_model): ROUNDS interleaved rounds (default 3) of
#   resident  every expert in VRAM (--gpu-preload): CUDA graphs (default) against --gpu-no-graphs,
#             NTOK greedy tokens after a 64-token prompt;
#   gpu25     a VRAM cache of a quarter of the experts over the warm page cache: misses copied once
#             from the page cache's pages (default) against --gpu-pin-page-cache (no host copy),
#             NTOK25 tokens.
# Decode tok/s per run, medians and ratios in $OUT/summary.txt with each run's stats JSON; then the
# GPU tests of the change (SKIP_TESTS=1 skips them).
source "$(dirname "$0")/device_gpu_env.sh" device_graphs
LAYERS=${LAYERS:-6}
ROUNDS=${ROUNDS:-3}
NTOK=${NTOK:-256}
NTOK25=${NTOK25:-64}
t0=$(date +%s)
TESTS=(gpu_graphs_test gpu_forward_test gpu_preload_test gpu_expert_cache_test gpu_batch_test)
gpu_build 60 infer synth_model "${TESTS[@]}"
say "build: $(( $(date +%s) - t0 )) s"
synth_q30
EXP_MB=$(du -sm --apparent-size "$M"/experts* 2>/dev/null | awk '{s+=$1} END {print s}')
[ -n "$EXP_MB" ] && [ "$EXP_MB" -gt 0 ] || EXP_MB=$(du -sm --apparent-size "$M" | cut -f1)
C25=$((EXP_MB / 4))
say "model: qwen3-30b-a3b shape, $LAYERS layers, q8 experts, $(du -sh "$M" | cut -f1); experts $EXP_MB MiB, gpu25 cache $C25 MiB"
cat "$M"/* "$M"/*/* >/dev/null 2>&1  # warm the page cache
PF=(--prompt-ids "$(q30_prompt 64)")
run() {  # name round tokens flags...
  local name=$1 r=$2 n=$3; shift 3
  "$B/infer" -m "$M" "${PF[@]}" -n "$n" --temp 0 --ignore-eos --print-ids --gpu --timing \
    --stats-json "$O/$name.$r.json" "$@" >"$W/$name.$r.ids" 2>"$W/$name.$r.err" ||
    { say "$name round $r failed"; tail -5 "$W/$name.$r.err" | tee -a "$S"; }
}
for r in $(seq 1 "$ROUNDS"); do
  if [ $((r % 2)) = 1 ]; then order="graphs plain pin copy"; else order="copy pin plain graphs"; fi
  for mode in $order; do
    case $mode in
      graphs) run graphs "$r" "$NTOK" --gpu-preload ;;
      plain) run plain "$r" "$NTOK" --gpu-preload --gpu-no-graphs ;;
      copy) run copy "$r" "$NTOK25" --gpu-cache-mb "$C25" ;;
      pin) run pin "$r" "$NTOK25" --gpu-cache-mb "$C25" --gpu-pin-page-cache ;;
    esac
  done
  cmp -s "$W/graphs.$r.ids" "$W/plain.$r.ids" && say "round $r: graphs/plain identical tokens" || say "round $r: graphs/plain TOKENS DIFFER"
  cmp -s "$W/copy.$r.ids" "$W/pin.$r.ids" && say "round $r: copy/pin identical tokens" || say "round $r: copy/pin TOKENS DIFFER"
done
grep -h "page cache pinned" "$W"/pin.*.err | head -1 | tee -a "$S"
python3 - "$O" "$ROUNDS" <<'PY' | tee -a "$S"
import sys
sys.path.insert(0, "scripts")
from decode_rounds import print_medians
med = print_medians(sys.argv[1], int(sys.argv[2]), ("graphs", "plain", "copy", "pin"),
                    ("resident_steps", "resident_redone", "graph_launches", "graph_updates", "graph_instantiations",
                     "h2d_bytes", "h2d_direct_bytes", "demand_wait_s"))
if "graphs" in med and "plain" in med:
    print(f"graphs / no graphs (resident): {med['graphs'] / med['plain']:.2f}x")
if "pin" in med and "copy" in med:
    print(f"pinned / one copy (gpu25): {med['pin'] / med['copy']:.2f}x")
PY
[ "${SKIP_TESTS:-0}" = 1 ] && exit 0
for t in "${TESTS[@]}"; do
  say "-- $t"
  "$B/$t" --gtest_brief=1 >"$O/$t.log" 2>&1; say "$t exit $?"
  grep -E "graphs|resident steps|FAILED|Failure|error" "$O/$t.log" | head -30 | tee -a "$S"
done
