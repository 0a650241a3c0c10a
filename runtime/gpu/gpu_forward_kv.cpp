// The GPU pass's KV cache (issue 21): a full layer keeps max_context positions, a sliding-window
// layer (gpt-oss) a ring of window + max_batch - 1 (position p in row p % rows), as the CPU's
// runtime/model/attention.cpp, so its device memory does not grow with the context.
#include <algorithm>

#include "common/checked.h"
#include "kernels/cuda/cuda_check.cuh"
#include "runtime/gpu/gpu_forward_impl.h"

namespace moestream::detail {

void CudaForward::init_kv() {
  const int max_ctx = opts.max_context;
  size_t floats = 0;
  for (int l = 0; l < cfg.n_layers; ++l) {
    const int window = plan[size_t(l)].attention.window;
    // A chunk of B tokens reads its first query's window and its own keys: window + B - 1 rows.
    const int rows = window > 0 ? int(std::min<int64_t>(max_ctx, int64_t(window) + B - 1)) : max_ctx;
    kv_rows.push_back(rows);
    kv_offset.push_back(floats);
    floats += checked_product({2, uint64_t(rows), uint64_t(KV), uint64_t(hd_p)}, "--gpu: the KV cache");
  }
  kv = DeviceBuffer(floats * sizeof(float));
  info_.kv_bytes = kv.bytes();
  if (padded) MOE_CUDA_CHECK(cudaMemset(kv.get(), 0, kv.bytes()));  // pad columns stay zero
}

float* CudaForward::kv_keys(int l) { return kv.as<float>() + kv_offset[size_t(l)]; }
float* CudaForward::kv_values(int l) { return kv_keys(l) + size_t(kv_rows[size_t(l)]) * KV * hd_p; }

// The chunk's T rows of k and v ([T, KV, hd], contiguous) into layer l's cache at positions
// n_past..n_past+T-1: one copy, or two where a ring wraps; rows are padded to hd_p.
void CudaForward::append_kv(int l, int T, int n_past, const float* k_src, const float* v_src) {
  const int rows = kv_rows[size_t(l)];
  const int slot0 = n_past % rows, run = std::min(T, rows - slot0);
  const size_t w_b = size_t(hd) * 4, wp = size_t(hd_p) * 4, row = size_t(KV) * hd_p, src_row = size_t(KV) * hd;
  for (int part = 0; part < 2; ++part) {
    float* dst = part == 0 ? kv_keys(l) : kv_values(l);
    const float* src = part == 0 ? k_src : v_src;
    MOE_CUDA_CHECK(cudaMemcpy2DAsync(dst + size_t(slot0) * row, wp, src, w_b, w_b, size_t(run) * KV,
                                     cudaMemcpyDeviceToDevice, stream));
    if (run < T)  // the ring wrapped: the rest from row 0
      MOE_CUDA_CHECK(cudaMemcpy2DAsync(dst, wp, src + size_t(run) * src_row, w_b, w_b, size_t(T - run) * KV,
                                       cudaMemcpyDeviceToDevice, stream));
  }
}

}  // namespace moestream::detail
