#!/usr/bin/env bash
# Run THERE (device machine), after carrying .deps (scripts/device_deps.sh): builds the CUDA tier
# and gpu_kernels_test, gpu_decode_gemv_test, gpu_fused_ops_test and gpu_ggml_test, runs them,
# and prints a table of each kernel's worst error / tolerance, then bench_gpu_kernels' bandwidth
# table (decode attention, grouped expert GEMM, the decode GEMV's fused gate+up and q/k/v, dense
# GEMM).
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/moestream_out}
mkdir -p "$O"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nvcc --version | tail -1; } >"$O/gpu_machine.txt" 2>&1
t0=$(date +%s)
DEVICE_CMAKE_ARGS="-DMOESTREAM_CUDA=ON -DMOESTREAM_TESTS=ON -DGTest_DIR=${DEPS_DIR:-/tmp/deps}/usr/lib/x86_64-linux-gnu/cmake/GTest" BUILD_DIR=build-device-cuda \
  bash scripts/device_build.sh gpu_kernels_test gpu_decode_gemv_test gpu_fused_ops_test gpu_ggml_test bench_gpu_kernels >"$O/gpu_build.log" 2>&1 || { tail -60 "$O/gpu_build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
B=build-device-cuda/bin
"$B/gpu_kernels_test" --gtest_output=json:"$O/gpu_kernels_test.json" >"$O/gpu_kernels_test.txt" 2>&1
rc=$?
"$B/gpu_ggml_test" --gtest_output=json:"$O/gpu_ggml_test.json" >>"$O/gpu_kernels_test.txt" 2>&1
rc=$(( rc | $? ))
for t in gpu_decode_gemv_test gpu_fused_ops_test; do
  "$B/$t" --gtest_output=json:"$O/$t.json" >>"$O/gpu_kernels_test.txt" 2>&1
  rc=$(( rc | $? ))
done
cat "$O/gpu_machine.txt"
echo
echo "| kernel check | elements | worst error / tolerance |"
echo "|---|---|---|"
sed -nE 's/^\[ (.*) \] n=([0-9]+) worst error \/ tolerance = ([0-9.]+)$/| \1 | \2 | \3 |/p' "$O/gpu_kernels_test.txt"
echo
grep -E "^\[ +(OK|FAILED|SKIPPED|PASSED) +\]|tests? ran|FAILED" "$O/gpu_kernels_test.txt"
echo
"$B/bench_gpu_kernels" 2>&1 | tee "$O/bench_gpu_kernels.txt"
exit $rc
