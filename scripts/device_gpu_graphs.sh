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
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/moestream_out}
W=$(mktemp -d /tmp/device_graphs.XXXXXX)
LAYERS=${LAYERS:-6}
ROUNDS=${ROUNDS:-3}
NTOK=${NTOK:-256}
NTOK25=${NTOK25:-64}
mkdir -p "$O"
S="$O/summary.txt"
say() { echo "$*" | tee -a "$S"; }
t0=$(date +%s)
TESTS=(gpu_graphs_test gpu_forward_test gpu_preload_test gpu_expert_cache_test gpu_batch_test)
DEVICE_CMAKE_ARGS="-DMOESTREAM_CUDA=ON -DMOESTREAM_TESTS=ON -DGTest_DIR=${DEPS_DIR:-/tmp/deps}/usr/lib/x86_64-linux-gnu/cmake/GTest" \
  BUILD_DIR=build-device-gpu bash scripts/device_build.sh infer synth_model "${TESTS[@]}" >"$W/build.log" 2>&1 ||
  { tail -60 "$W/build.log" | tee -a "$S"; exit 1; }
say "build: $(( $(date +%s) - t0 )) s"
B=build-device-gpu/bin
M=$W/q30
"$B/synth_model" --shape qwen3-30b-a3b --layers "$LAYERS" --quant q8 -q --max-context 4096 "$M" >"$W/synth.log" 2>&1 ||
  { tail -5 "$W/synth.log" | tee -a "$S"; exit 1; }
EXP_MB=$(du -sm --apparent-size "$M"/experts* 2>/dev/null | awk '{s+=$1} END {print s}')
[ -n "$EXP_MB" ] && [ "$EXP_MB" -gt 0 ] || EXP_MB=$(du -sm --apparent-size "$M" | cut -f1)
C25=$((EXP_MB / 4))
say "model: qwen3-30b-a3b shape, $LAYERS layers, q8 experts, $(du -sh "$M" | cut -f1); experts $EXP_MB MiB, gpu25 cache $C25 MiB"
cat "$M"/* "$M"/*/* >/dev/null 2>&1  # warm the page cache
PF=(--prompt-ids "$(python3 -c "print(','.join(str((7919 * i + 11) % 151936) for i in range(64)))")")
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
import json, statistics, sys
o, rounds = sys.argv[1], int(sys.argv[2])
med = {}
for mode in ("graphs", "plain", "copy", "pin"):
    runs = []
    for r in range(1, rounds + 1):
        try:
            runs.append(json.load(open(f"{o}/{mode}.{r}.json")))
        except OSError:
            pass
    if not runs:
        print(f"{mode}: no run"); continue
    tps = [x["decode"]["tokens_per_s"] for x in runs]
    med[mode] = statistics.median(tps)
    d = runs[-1]["decode"]
    g = d.get("gpu_cache", {})
    keys = ("resident_steps", "resident_redone", "graph_launches", "graph_updates", "graph_instantiations",
            "h2d_bytes", "h2d_direct_bytes", "demand_wait_s")
    print(f"{mode:7s} decode tok/s {' '.join(f'{t:.1f}' for t in tps)} (median {med[mode]:.1f}); last run phases_s "
          f"{json.dumps({k: round(v, 3) for k, v in d['phases_s'].items()})}; gpu {json.dumps({k: g.get(k) for k in keys})}")
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
