#!/usr/bin/env bash
# The cache-policy comparison of issue 23 for any packed model: routing traces with router inputs
# (held-out text for the tables, other text for tuning), the expert prior learned on the tuning
# traces only, then cache_sim's table (LRU, LFRU, host LFU, static top-C, the foresight policy with
# and without guesses and prior, its upper bounds, Belady) on each held-out trace.
# Usage: bench/cache_policy.sh MODEL OUT_DIR [BUILD_DIR=build]
# Writes OUT_DIR/{decode,ppl}.md (no prior) and {decode,ppl}_prior.md (with the prior), and keeps
# the traces (*.bin) and the prior (tune.prior) beside them. A step whose output exists is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:?model dir}; O=${2:?output dir}; B=${3:-build}
TEXT=models/demo/heldout.txt          # the held-out text of every model trained here
PERCENT=(10 15 20 25 30 40 50)
mkdir -p "$O"
step() { [ -s "$1" ] && { echo "cache_policy: $1 exists, kept" >&2; return 1; }; echo "cache_policy: $1" >&2; }
ppl_trace() {  # text, log
  "$B/bin/infer" -m "$MODEL" -t 1 --perplexity "$1" --ctx 512 --stride 512 --batch 1 \
    --collect-routing "$2.tmp" --collect-router-inputs >/dev/null
  mv "$2.tmp" "$2"
}
decode_trace() {  # log, prompts, tokens, [TEXT SEED0 from the environment]
  ROUTER_INPUTS=1 MODEL="$MODEL" bench/gpu_cache_trace.sh "$B" "$1.tmp" "$2" "$3"
  mv "$1.tmp" "$1"
}
# Held-out: 32 generations of 256 tokens prompted from the held-out text, and a perplexity run.
step "$O/decode.bin" && decode_trace "$O/decode.bin" 32 256
step "$O/ppl.bin" && ppl_trace models/demo/heldout_head.txt "$O/ppl.bin"
# Tuning: prompts between the held-out ones, other seeds, and another slice of the text.
tail -c +21500 "$TEXT" >"$O/tune.txt"
head -c 764246 "$TEXT" | tail -c 64246 >"$O/tune_ppl.txt"   # bytes 700,000-764,246 (no SIGPIPE)
step "$O/tune_decode.bin" && TEXT=$O/tune.txt SEED0=1000 decode_trace "$O/tune_decode.bin" 32 256
step "$O/tune_long.bin" && TEXT=$O/tune.txt SEED0=2000 decode_trace "$O/tune_long.bin" 8 512
step "$O/tune_ppl.bin" && ppl_trace "$O/tune_ppl.txt" "$O/tune_ppl.bin"
# (--method identity: only the prior is wanted, not a layout search.)
step "$O/tune.prior" && "$B/bin/cluster_experts" --model "$MODEL" --method identity --routing \
  "$O/tune_decode.bin" "$O/tune_long.bin" "$O/tune_ppl.bin" --prior-out "$O/tune.prior"
for t in decode ppl; do
  phases=(); [ "$t" = ppl ] && phases=(--all-phases)
  sim=("$B/bin/cache_sim" --routing "$O/$t.bin" --percent "${PERCENT[@]}" --foresight-only --model "$MODEL"
       --oracle-noise 0 0.2 "${phases[@]}")
  step "$O/$t.md" && "${sim[@]}" >"$O/$t.md"
  step "$O/${t}_prior.md" && "${sim[@]}" --prior "$O/tune.prior" >"$O/${t}_prior.md"
done
echo "cache_policy: tables in $O/{decode,ppl}{,_prior}.md" >&2
