#!/usr/bin/env bash
# Greedy tokens of two builds of infer on every family's fixture: each Hugging Face fixture
# (tests/fixtures/<family>, packed once by the NEW build's convert_model) and each GGUF fixture run
# in place (tests/fixtures/gguf*/), plain and with cache-aware routing at tolerance 0; with GPU=1
# also --gpu and --gpu --gpu-preload (resident decode). The companion of scripts/same_tokens.sh
# (the demo model over every read path) for the families the demo is not: MLA, gpt-oss, GLM-4.5,
# Qwen2-MoE, GGUF in place. Prints one line per case; exits 1 when any case differs or fails
# (a combination both builds refuse, with the same exit status, is a `refused` line, not a failure).
# Usage: scripts/same_tokens_families.sh OLD_BIN_DIR NEW_BIN_DIR   Env: N (tokens, default 12), GPU=1
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 2 ] || { sed -n 2,8p "$0" >&2; exit 2; }
OLD=$1 NEW=$2 N=${N:-12}
W=$(mktemp -d /tmp/same_tokens_families.XXXXXX)
variants=("plain|" "cache-aware-0|--cache-aware --cache-tolerance 0")
[ "${GPU:-}" = 1 ] && variants+=("gpu|--gpu" "gpu-preload|--gpu --gpu-preload" "gpu-cache-aware-0|--gpu --cache-aware --cache-tolerance 0")
models=()
for d in tests/fixtures/*/; do
  f=$(basename "$d")
  [ -f "$d/config.json" ] && [ -f "$d/model.safetensors" ] || continue
  "$NEW/convert_model" -q --quant q8 "$d" "$W/$f" >"$W/$f.convert.log" 2>&1 ||
    { echo "FAILED    $f: convert_model (see $W/$f.convert.log)"; continue; }
  models+=("$W/$f")
done
for g in tests/fixtures/gguf/*.gguf tests/fixtures/gguf_hf/*.gguf; do
  case $g in *-0000[2-9]-of-*) continue ;; esac  # a split set opens from its first shard
  models+=("$g")
done
rc=0
for m in "${models[@]}"; do
  for v in "${variants[@]}"; do
    name=${v%%|*} flags=${v#*|}
    for side in old new; do
      b=$OLD; [ $side = new ] && b=$NEW
      # shellcheck disable=SC2086
      "$b/infer" -m "$m" --prompt-ids 1,5,9,2,7,3 -n "$N" --temp 0 --print-ids $flags \
        >"$W/out.$side" 2>"$W/err.$side"
      echo "exit $?" >>"$W/out.$side"
    done
    label="$(basename "$m") $name"
    if ! grep -q "exit 0" "$W/out.new"; then
      if cmp -s "$W/out.old" "$W/out.new"; then
        echo "refused   $label (both builds: $(tail -1 "$W/err.new"))"  # a combination neither computes
      else
        echo "FAILED    $label: $(tail -1 "$W/err.new")"; rc=1
      fi
    elif cmp -s "$W/out.old" "$W/out.new"; then
      echo "same      $label"
    else
      echo "DIFFERENT $label"; rc=1
    fi
  done
done
exit $rc
