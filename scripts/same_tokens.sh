#!/usr/bin/env bash
# Greedy tokens of two builds of infer, compared over every expert-read path: each --io mode,
# O_DIRECT with a host cache, a clustered repack of the model (each build its own), cache-aware routing (tolerance 0
# and > 0) and, with GPU=1, the GPU pass (plain, look-ahead, cache-aware). Prints one line per
# case and exits 1 when any case differs or fails, so a refactor can show it changed nothing.
# Usage: scripts/same_tokens.sh OLD_BIN_DIR NEW_BIN_DIR [MODEL_DIR]   (default models/demo)
# Env: N (tokens, default 32), GPU=1 (add the --gpu cases), OUT_DIR (keep the token files).
set -uo pipefail
[ $# -ge 2 ] || { sed -n 2,7p "$0" >&2; exit 2; }
OLD=$1 NEW=$2 M=${3:-models/demo}
N=${N:-32}
for b in "$OLD" "$NEW"; do
  [ -x "$b/infer" ] || { echo "same_tokens: no infer in $b" >&2; exit 2; }
done
for b in "$OLD" "$NEW"; do
  [ -x "$b/cluster_experts" ] || { echo "same_tokens: no cluster_experts in $b" >&2; exit 2; }
done
W=${OUT_DIR:-$(mktemp -d /tmp/same_tokens.XXXXXX)}
mkdir -p "$W"
PROMPT="Elizabeth looked at Mr. Darcy and"

# Repacked copies: routing collected on held-out text, then each build clusters and repacks its
# own copy (the two may choose other orders, and a newer map format need not load in an older
# build); a repack never changes the tokens, so each build on its own repack must agree.
"$NEW/infer" -m "$M" -p "$(head -c 2000 "$M/heldout.txt")" -n 1 --temp 0 \
  --collect-routing "$W/routing.log" >/dev/null 2>"$W/collect.err" ||
  { echo "same_tokens: collecting routing failed (see $W/collect.err)" >&2; exit 1; }
for side in old new; do
  b=$OLD; [ $side = new ] && b=$NEW
  rm -rf "$W/model-repacked.$side"; cp -r "$M" "$W/model-repacked.$side"
  "$b/cluster_experts" --routing "$W/routing.log" --model "$W/model-repacked.$side" --repack \
    >/dev/null 2>"$W/cluster.$side.err" ||
    { echo "same_tokens: repacking with the $side build failed (see $W/cluster.$side.err)" >&2; exit 1; }
done
R="$W/model-repacked.@SIDE@"  # each build reads its own repack

CASES=(
  "io-auto|-m $M --io auto"
  "io-uring|-m $M --io uring"
  "io-pread|-m $M --io pread"
  "io-mmap|-m $M --io mmap"
  "io-simple|-m $M --io simple"
  "direct-host-cache|-m $M --io-direct --host-cache-mb 4"
  "repacked|-m $R"
  "cache-aware-0|-m $M --cache-aware --cache-tolerance 0"
  "cache-aware-0.3|-m $M --cache-aware --cache-tolerance 0.3"
  "cache-aware-direct-0.5|-m $M --io-direct --host-cache-mb 8 --cache-aware --cache-tolerance 0.5"
)
if [ "${GPU:-0}" = 1 ]; then
  CASES+=(
    "gpu|-m $M --gpu"
    "gpu-small-cache-lookahead|-m $M --gpu --gpu-cache-mb 8 --moe-lookahead 4"
    "gpu-repacked|-m $R --gpu"
  )
fi

# Cache-aware routing over the page cache routes by what is resident, and the first run of a case
# makes resident what the second then finds: each run starts with the model's experts in the page
# cache, so both builds see the same residency (the O_DIRECT case starts from an empty host cache).
warm() { cat "$M"/experts/* >/dev/null; }
rc=0
for c in "${CASES[@]}"; do
  name=${c%%|*}; args=${c#*|}
  warm
  # shellcheck disable=SC2086  # args are word lists by design
  "$OLD/infer" ${args//@SIDE@/old} -p "$PROMPT" -n "$N" --temp 0 --print-ids >"$W/$name.old" 2>"$W/$name.old.err"; a=$?
  warm
  # shellcheck disable=SC2086
  "$NEW/infer" ${args//@SIDE@/new} -p "$PROMPT" -n "$N" --temp 0 --print-ids >"$W/$name.new" 2>"$W/$name.new.err"; b=$?
  if [ $a -ne 0 ] || [ $b -ne 0 ]; then
    echo "FAILED    $name (exit $a / $b; $W/$name.*.err)"; rc=1
  elif cmp -s "$W/$name.old" "$W/$name.new" && [ -s "$W/$name.new" ]; then
    echo "same      $name ($(tr ',' '\n' <"$W/$name.new" | grep -c .) tokens)"
  else
    echo "DIFFERENT $name"; rc=1
  fi
done
# GPU with cache-aware routing exists only in the new build: tolerance 0 must equal plain --gpu.
if [ "${GPU:-0}" = 1 ]; then
  "$NEW/infer" -m "$M" --gpu --cache-aware --cache-tolerance 0 -p "$PROMPT" -n "$N" --temp 0 \
    --print-ids >"$W/gpu-cache-aware-0.new" 2>"$W/gpu-cache-aware-0.err"
  if cmp -s "$W/gpu-cache-aware-0.new" "$W/gpu.new"; then
    echo "same      gpu --cache-aware --cache-tolerance 0 (new) vs gpu (new)"
  else
    echo "DIFFERENT gpu --cache-aware --cache-tolerance 0 (new) vs gpu (new)"; rc=1
  fi
fi
echo "same_tokens: token files in $W"
exit $rc
