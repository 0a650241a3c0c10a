# Sourced by the device_gpu_* and device_gguf scripts (run THERE, on the device machine, .deps
# carried) with a scratch name: strict mode, the repo root as working directory, $O for the
# results that come back ($OUT) and $S its summary.txt, $W a fresh scratch folder /tmp/NAME.XXXXXX,
# say() to print a line and keep it in the summary, and the steps these scripts share: the CUDA
# tier's build into build-device-gpu ($B its binaries), a Qwen3-30B-A3B-shaped pack, its prompt.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
O=${OUT:-/tmp/moestream_out}
W=$(mktemp -d "/tmp/$1.XXXXXX")
mkdir -p "$O"
S="$O/summary.txt"
B=build-device-gpu/bin
say() { echo "$*" | tee -a "$S"; }

# keep_logs: $W's files go to $OUT/logs.tgz when the script exits.
keep_logs() {
  finish() { tar -czf "$O/logs.tgz" -C "$W" . 2>/dev/null; }
  trap finish EXIT
}

# gpu_build LINES TARGET...: scripts/device_build.sh with CUDA and the tests on; when it fails, the
# build log's last LINES lines go to the summary and the script exits 1.
gpu_build() {
  local lines=$1
  shift
  DEVICE_CMAKE_ARGS="-DMOESTREAM_CUDA=ON -DMOESTREAM_TESTS=ON -DGTest_DIR=${DEPS_DIR:-/tmp/deps}/usr/lib/x86_64-linux-gnu/cmake/GTest" \
    BUILD_DIR=build-device-gpu bash scripts/device_build.sh "$@" >"$W/build.log" 2>&1 ||
    { tail -"$lines" "$W/build.log" | tee -a "$S"; exit 1; }
}

# synth_q30: $M, a Qwen3-30B-A3B-shaped pack of $LAYERS layers with q8 experts (synth_model);
# when it fails, its log's tail goes to the summary and the script exits 1.
synth_q30() {
  M=$W/q30
  "$B/synth_model" --shape qwen3-30b-a3b --layers "$LAYERS" --quant q8 -q --max-context 4096 "$M" >"$W/synth.log" 2>&1 ||
    { tail -5 "$W/synth.log" | tee -a "$S"; exit 1; }
}

# q30_prompt N: the ids of an N-token prompt spread over Qwen3's vocabulary, comma-separated.
q30_prompt() {
  python3 -c "print(','.join(str((7919 * i + 11) % 151936) for i in range($1)))"
}
