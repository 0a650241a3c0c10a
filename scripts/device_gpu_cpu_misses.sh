#!/usr/bin/env bash
# Run THERE (device machine, .deps carried): --gpu-cpu-misses against the two copy modes of a
# VRAM cache of a quarter of the experts over the warm page cache, on a Qwen3-30B-A3B-shaped q8
# pack of LAYERS layers (default 6; synth_model), -t THREADS (default: the cores), a PROMPT-id
# prompt (default 512: its prefill fills the cache) then NTOK greedy tokens (default 64), ROUNDS
# interleaved rounds (default 2, order reversed every other round). Decode tok/s per run, medians,
# ratios to --gpu-pin-page-cache, and whether the three modes chose the same tokens, in
# $OUT/summary.txt; each run's stats JSON beside it.
source "$(dirname "$0")/device_gpu_env.sh" device_cpu_misses
LAYERS=${LAYERS:-6}
ROUNDS=${ROUNDS:-2}
NTOK=${NTOK:-64}
PROMPT=${PROMPT:-512}
THREADS=${THREADS:-$(nproc)}
t0=$(date +%s)
gpu_build 40 infer synth_model
say "build: $(( $(date +%s) - t0 )) s"
synth_q30
EXP_MB=$(du -sm --apparent-size "$M"/experts* 2>/dev/null | awk '{s+=$1} END {print s}')
C25=$((EXP_MB / 4))
say "model: qwen3-30b-a3b shape, $LAYERS layers, q8 experts $EXP_MB MiB; cache $C25 MiB; -t $THREADS"
cat "$M"/* "$M"/*/* >/dev/null 2>&1  # warm the page cache
PF=(--prompt-ids "$(q30_prompt "$PROMPT")")
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
import sys
sys.path.insert(0, "scripts")
from decode_rounds import print_medians
med = print_medians(sys.argv[1], int(sys.argv[2]), ("copy", "pin", "cpu"),
                    ("cpu_miss_experts", "cpu_miss_layers", "h2d_bytes", "h2d_direct_bytes", "demand_wait_s"),
                    prefill=True)
for m in ("copy", "cpu"):
    if m in med and "pin" in med:
        print(f"{m} / pin: {med[m] / med['pin']:.2f}x")
PY
