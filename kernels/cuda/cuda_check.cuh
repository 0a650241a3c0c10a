// Internal to kernels/: CUDA error checks that throw moestream::Error naming the call, and the
// launchers' declarations (each takes an explicit cudaStream_t).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "common/error.h"

namespace moestream::gpu {

[[noreturn]] inline void throw_cuda(cudaError_t e, const char* what, const char* file, int line) {
  throw Error(std::string(what) + " failed at " + file + ":" + std::to_string(line) + ": " +
              cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

}  // namespace moestream::gpu

#define MOE_CUDA_CHECK(call)                                                       \
  do {                                                                             \
    cudaError_t moe_cuda_err_ = (call);                                            \
    if (moe_cuda_err_ != cudaSuccess)                                              \
      ::moestream::gpu::throw_cuda(moe_cuda_err_, #call, __FILE__, __LINE__);      \
  } while (0)

// After a <<<>>> launch: a bad configuration shows up here, not at the next sync.
#define MOE_CUDA_CHECK_LAUNCH(name)                                                \
  do {                                                                             \
    cudaError_t moe_cuda_err_ = cudaPeekAtLastError();                             \
    if (moe_cuda_err_ != cudaSuccess)                                              \
      ::moestream::gpu::throw_cuda(moe_cuda_err_, "launch of " name, __FILE__, __LINE__); \
  } while (0)

namespace moestream::gpu {

// Launchers: preconditions checked with MOE_ASSERT (the op wrappers already validated shapes).
void rms_norm_cuda(const float* x, const float* w, int rows, int n, float eps, float* out,
                   cudaStream_t s);
void rope_neox_cuda(float* x, int n_tokens, int n_heads, int half_dim, const float* cos,
                    const float* sin, cudaStream_t s);
void rope_neox_partial_cuda(float* x, int n_tokens, int n_heads, int half_dim, int head_dim, const float* cos,
                            const float* sin, cudaStream_t s);
void router_topk_cuda(const float* logits, int n_tokens, int n_experts, int k, bool normalize,
                      int* ids, float* weights, cudaStream_t s);
void swiglu_cuda(const float* gate, const float* up, size_t n, float* out, cudaStream_t s);
void expert_matvec_q8_cuda(const uint8_t* w, int rows, int cols, const float* x, float* y,
                           cudaStream_t s);
void expert_matvec_q4_cuda(const uint8_t* w, int rows, int cols, const float* x, float* y,
                           cudaStream_t s);
void expert_matvec_bf16_cuda(const uint8_t* w, int rows, int cols, const float* x, float* y,
                             cudaStream_t s);
void attention_cuda(const float* q, const float* k_cache, const float* v_cache, int n_q, int pos0,
                    int n_heads, int n_kv_heads, int head_dim, float scale, float* out,
                    cudaStream_t s, const float* sinks = nullptr, int window = 0, int ring = 0,
                    float* scratch = nullptr, size_t scratch_floats = 0);
void gather_rows_cuda(const float* src, const int* idx, int n, int dim, float* out, cudaStream_t s);
void moe_combine_cuda(const float* y, const int* pair_row, const float* weights, int n_tokens,
                      int k, int dim, float* out, bool add, cudaStream_t s);
void add_inplace_cuda(float* y, const float* x, size_t n, cudaStream_t s);

}  // namespace moestream::gpu
