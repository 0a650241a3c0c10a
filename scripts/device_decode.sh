#!/usr/bin/env bash
# Run THERE (device machine), after carrying .deps: builds the tools, writes a synthetic
# model (SHAPE, default qwen3-30b-a3b; QUANT, default q4 (gpt-oss: MXFP4); as many layers as fit
# ~20 GB: all 48 of Qwen3-30B-A3B q4 are 19.4 GB) and runs bench/decode.py under a memory cap of
# ~8 GB, or an expert budget of CAP_MB (cgroup v2 where possible, else O_DIRECT + host budget; it
# says which). Idempotent: the model and traces under $WORK_DIR are reused, so a timed-out call can be
# rerun. Results land in $OUT: decode.json, decode.txt, machine.txt, logs. INFER_ARGS=--gpu (with
# DEVICE_CMAKE_ARGS for the CUDA build) runs every decode on the GPU path; LAYERS, TOKENS, ROUNDS,
# SWEEP_MB (extra expert budgets, MiB), METHODS and MEMORY_MAX_MB override the defaults.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/moestream_out}
mkdir -p "$O"
W=${WORK_DIR:-$PWD/.work/decode}  # on the machine's disk: O_DIRECT needs a real filesystem
mkdir -p "$W"
{ uname -a; nproc; free -g; df -hT "$W"; bash scripts/with_memory_cap.sh --check; } >"$O/machine.txt" 2>&1
t0=$(date +%s)
bash scripts/device_build.sh synth_model infer cluster_experts bench_io >"$O/build.log" 2>&1 ||
  { tail -40 "$O/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
B=${BUILD_DIR:-build-device}/bin
# Layers: all 48 when ~20 GB fit on the disk beside the run, else as many as fit.
avail_gb=$(df -BG --output=avail "$W" | tail -1 | tr -dc 0-9)
layers=${LAYERS:-48}
[ "$avail_gb" -lt 24 ] && layers=$(( (avail_gb - 4) * 48 / 20 ))
t0=$(date +%s)
shape=${SHAPE:-qwen3-30b-a3b}
quant=${QUANT:-q4}
case "$shape" in gpt-oss-*) quant=${QUANT:-MXFP4} ;; esac
if [ -n "${CAP_MB:-}" ]; then cap=(--cap-mb "$CAP_MB"); else cap=(--memory-max-mb "${MEMORY_MAX_MB:-8192}"); fi
timeout "${DECODE_TIMEOUT:-540}" python3 bench/decode.py --bin "$B" --work "$W" --shape "$shape" \
  --layers "$layers" --quant "$quant" "${cap[@]}" --tokens "${TOKENS:-64}" \
  --sweep-mb "${SWEEP_MB:-}" --methods "${METHODS:-mmap,pread,engine,warm}" --rounds "${ROUNDS:-1}" --infer-args="${INFER_ARGS:-}" --io-bench-mb 4096 --json "$O/decode.json" >"$O/decode.txt" 2>"$O/decode.log"
echo "decode: rc $? in $(( $(date +%s) - t0 )) s"
cat "$O/decode.txt"
tail -5 "$O/decode.log"
