// The CUDA tier's public operations, callable from plain C++ (no CUDA include): each wrapper checks
// shapes, then launches one kernel on the given stream. All pointers are device pointers.
#pragma once

#include <cstddef>
#include <cstdint>

#include "loader/expert_file.h"

struct CUstream_st;  // cudaStream_t is CUstream_st*; declared here so callers need no CUDA header

namespace moestream::gpu {

using Stream = CUstream_st*;  // nullptr is the legacy default stream

// Number of CUDA devices usable by this process; 0 (never throws) when the driver or a GPU is
// missing, with the runtime's reason in *why when given.
int device_count(const char** why = nullptr);

// out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w for each of `rows` rows of n floats (HF RMSNorm).
void rms_norm(const float* x, const float* w, int rows, int n, float eps, float* out, Stream s);

// Rotates x [n_tokens, n_heads, 2*half_dim] in place, rotate_half (neox) layout: pairs
// (i, i + half_dim). cos/sin are [n_tokens, half_dim] tables as runtime/rope.h Rope::fill makes.
void rope_neox(float* x, int n_tokens, int n_heads, int half_dim, const float* cos,
               const float* sin, Stream s);

// Router of n_tokens tokens: softmax over n_experts logits, the k largest probabilities (ties:
// lower id first), renormalised to sum 1 when `normalize` (norm_topk_prob). ids/weights get
// n_tokens*k entries, token-major, as runtime/moe_layer.h route_token.
void router_topk(const float* logits, int n_tokens, int n_experts, int k, bool normalize,
                 int* ids, float* weights, Stream s);

// out[i] = silu(gate[i]) * up[i] for n elements (the expert's fused SwiGLU).
void swiglu(const float* gate, const float* up, size_t n, float* out, Stream s);

// y[r] = sum_c W[r][c] * x[c] for r in [0, rows), W one matrix in the encoding of
// loader/expert_file.h (q8, q4 or bf16; each row its own f16 scales then its quants).
void expert_matvec(QuantType q, const uint8_t* w, int rows, int cols, const float* x, float* y,
                   Stream s);
void expert_matvec_q8(const uint8_t* w, int rows, int cols, const float* x, float* y, Stream s);
void expert_matvec_q4(const uint8_t* w, int rows, int cols, const float* x, float* y, Stream s);
void expert_matvec_bf16(const uint8_t* w, int rows, int cols, const float* x, float* y, Stream s);

}  // namespace moestream::gpu
