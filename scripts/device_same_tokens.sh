#!/usr/bin/env bash
# Run THERE (device machine, .deps carried): builds this tree with the CUDA tier and a baseline
# source tree (BASE_SRC, e.g. `git archive <rev>` unpacked into an ignored folder and carried),
# then compares their greedy tokens with scripts/same_tokens.sh over every read path and the GPU
# cases (GPU=1), and runs the GPU test suites. Summary in $OUT/summary.txt.
# Usage: BASE_SRC=.base bash scripts/device_same_tokens.sh
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/moestream_out}; mkdir -p "$O"
S="$O/summary.txt"
: "${BASE_SRC:?BASE_SRC: a baseline source tree to build and compare with}"
GT="-DGTest_DIR=${DEPS_DIR:-/tmp/deps}/usr/lib/x86_64-linux-gnu/cmake/GTest"
t0=$(date +%s)
DEVICE_CMAKE_ARGS="-DMOESTREAM_CUDA=ON -DMOESTREAM_TESTS=ON $GT" BUILD_DIR=build-device-gpu \
  bash scripts/device_build.sh infer cluster_experts gpu_kernels_test gpu_expert_cache_test \
  gpu_forward_test >"$O/build.log" 2>&1 || { tail -40 "$O/build.log"; exit 1; }
cp -r .deps "$BASE_SRC/" 2>/dev/null
(cd "$BASE_SRC" && DEVICE_CMAKE_ARGS="-DMOESTREAM_CUDA=ON" BUILD_DIR=build-base \
  bash scripts/device_build.sh infer cluster_experts) >"$O/build_base.log" 2>&1 ||
  { tail -40 "$O/build_base.log"; exit 1; }
echo "builds: $(( $(date +%s) - t0 )) s" | tee "$S"
GPU=1 OUT_DIR=/tmp/same_tokens bash scripts/same_tokens.sh "$BASE_SRC/build-base/bin" \
  build-device-gpu/bin 2>&1 | tee -a "$S"
rc=${PIPESTATUS[0]}
for t in gpu_kernels_test gpu_expert_cache_test gpu_forward_test; do
  timeout 300 "build-device-gpu/bin/$t" >"$O/$t.log" 2>&1; r=$?
  echo "$t: exit $r; $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$O/$t.log" | tr '\n' ' ')" | tee -a "$S"
  [ $r -eq 0 ] || { rc=1; grep -E '^\[  FAILED' "$O/$t.log" | head -20 | tee -a "$S"; }
done
tar -czf "$O/tokens.tgz" -C /tmp same_tokens 2>/dev/null
exit $rc
