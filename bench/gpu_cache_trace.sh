#!/usr/bin/env bash
# Makes the decode routing trace bench/cache_sim replays: N_PROMPTS generations on the demo
# model (MODEL=dir for another), each prompted with a slice of the held-out text (models/demo/heldout.txt), one log.
# Usage: bench/gpu_cache_trace.sh BUILD_DIR OUT.bin [N_PROMPTS=32] [N_PREDICT=256]
# TEXT=file and SEED0=n (seed of prompt i: SEED0 + i) make other traces, e.g. for tuning a policy
# on text other than the one its results are reported on. ROUTER_INPUTS=1 also records each
# layer's router input (--collect-router-inputs), from which cache_sim recomputes the look-ahead.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:?build dir}; OUT=${2:?output log}; N=${3:-32}; PRED=${4:-256}
TEXT=${TEXT:-models/demo/heldout.txt}; SEED0=${SEED0:-0}; MODEL=${MODEL:-models/demo}
extra=(); [[ ${ROUTER_INPUTS:-0} == 1 ]] && extra=(--collect-router-inputs)
rm -f "$OUT"
size=$(stat -c %s "$TEXT")
for ((i = 0; i < N; i++)); do
  # Prompt i: 400 bytes starting at the line after offset i*size/N (spread over the whole text).
  # (head closes the pipe early: the SIGPIPE of the commands before it is expected.)
  prompt=$(set +o pipefail; tail -c +$((i * size / N + 1)) "$TEXT" | tail -n +2 | head -c 400 |
           iconv -c -f utf-8 -t utf-8 2>/dev/null || true)  # -c drops a cut character: not an error
  "$BUILD/bin/infer" -m "$MODEL" -p "$prompt" -n "$PRED" --ignore-eos --seed "$((SEED0 + i))" -t 1 \
    --collect-routing "$OUT" "${extra[@]}" >/dev/null
done
echo "gpu_cache_trace: $N generations of $PRED tokens -> $OUT" >&2
