#!/usr/bin/env bash
# Run THERE (device machine, .deps carried): --gpu-cpu-misses against the two copy modes of a
# VRAM cache of a quarter of the experts over the warm page cache, on a Qwen3-30B-A3B-shaped q8
# pack of LAYERS layers (default 6; synth_model), -t THREADS (default: the cores), a PROMPT-id
# prompt (default 512: its prefill fills the cache) then NTOK greedy tokens (default 64), ROUNDS
# interleaved rounds (default 2, order reversed every other round). Decode tok/s per run, medians,
# ratios to --gpu-pin-page-cache, and whether the three modes chose the same tokens, in
# $OUT/summary.txt; each run's stats JSON beside it.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/moestream_out}
W=$(mktemp -d /tmp/device_cpu_misses.XXXXXX)
LAYERS=${LAYERS:-6}
ROUNDS=${ROUNDS:-2}
NTOK=${NTOK:-64}
PROMPT=${PROMPT:-512}
THREADS=${THREADS:-$(nproc)}
mkdir -p "$O"
S="$O/summary.txt"
say() { echo "$*" | tee -a "$S"; }
t0=$(date +%s)
DEVICE_CMAKE_ARGS="-DMOESTREAM_CUDA=ON -DMOESTREAM_TESTS=ON -DGTest_DIR=${DEPS_DIR:-/tmp/deps}/usr/lib/x86_64-linux-gnu/cmake/GTest" \
  BUILD_DIR=build-device-gpu bash scripts/device_build.sh infer synth_model >"$W/build.log" 2>&1 ||
  { tail -40 "$W/build.log" | tee -a "$S"; exit 1; }
say "build: $(( $(date +%s) - t0 )) s"
B=build-device-gpu/bin
M=$W/q30
"$B/synth_model" --shape qwen3-30b-a3b --layers "$LAYERS" --quant q8 -q --max-context 4096 "$M" >"$W/synth.log" 2>&1 ||
  { tail -5 "$W/synth.log" | tee -a "$S"; exit 1; }
EXP_MB=$(du -sm --apparent-size "$M"/experts* 2>/dev/null | awk '{s+=$1} END {print s}')
C25=$((EXP_MB / 4))
say "model: qwen3-30b-a3b shape, $LAYERS layers, q8 experts $EXP_MB MiB; cache $C25 MiB; -t $THREADS"
cat "$M"/* "$M"/*/* >/dev/null 2>&1  # warm the page cache
PF=(--prompt-ids "$(python3 -c "print(','.join(str((7919 * i + 11) % 151936) for i in range($PROMPT)))")")
run() {  # mode round flags...
  local m=$1 r=$2; shift 2
  "$B/infer" -m "$M" "${PF[@]}" -n "$NTOK" --temp 0 --ignore-eos --print-ids --gpu --gpu-cache-mb "$C25" -t "$THREADS" \
    --stats-json "$O/$m.$r.json" "$@" >"$W/$m.$r.ids" 2>"$W/$m.$r.err" || { say "$m round $r failed"; tail -5 "$W/$m.$r.err" | tee -a "$S"; }
}
for r in $(seq 1 "$ROUNDS"); do
  if [ $((r % 2)) = 1 ]; then order="copy pin cpu"; else order="cpu pin copy"; fi
  for m in $order; do
    case $m in
      copy) run copy "$r" ;;
      pin) run pin "$r" --gpu-pin-page-cache ;;
      cpu) run cpu "$r" --gpu-cpu-misses ;;
    esac
  done
  for m in copy cpu; do
    cmp -s "$W/pin.$r.ids" "$W/$m.$r.ids" && say "round $r: $m tokens = pin's" || say "round $r: $m tokens DIFFER from pin's"
  done
done
python3 - "$O" "$ROUNDS" <<'PY' | tee -a "$S"
import json, statistics, sys
o, rounds = sys.argv[1], int(sys.argv[2])
med = {}
for m in ("copy", "pin", "cpu"):
    runs = []
    for r in range(1, rounds + 1):
        try:
            runs.append(json.load(open(f"{o}/{m}.{r}.json")))
        except OSError:
            pass
    if not runs:
        print(f"{m}: no run"); continue
    tps = [x["decode"]["tokens_per_s"] for x in runs]
    med[m] = statistics.median(tps)
    d = runs[-1]["decode"]
    g = d.get("gpu_cache", {})
    keys = ("cpu_miss_experts", "cpu_miss_layers", "h2d_bytes", "h2d_direct_bytes", "demand_wait_s")
    print(f"{m:5s} decode tok/s {' '.join(f'{t:.1f}' for t in tps)} (median {med[m]:.1f}); prefill "
          f"{runs[-1]['prefill']['tokens_per_s']:.0f} tok/s; phases_s {json.dumps({k: round(v, 3) for k, v in d['phases_s'].items()})}; "
          f"gpu {json.dumps({k: g.get(k) for k in keys})}")
for m in ("copy", "cpu"):
    if m in med and "pin" in med:
        print(f"{m} / pin: {med[m] / med['pin']:.2f}x")
PY
