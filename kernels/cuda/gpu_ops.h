// The CUDA tier's public operations, callable from plain C++ (no CUDA include): each wrapper checks
// shapes, then launches one kernel on the given stream. All pointers are device pointers.
#pragma once

#include <cstddef>
#include <cstdint>

#include "loader/format/expert_file.h"

struct CUstream_st;  // cudaStream_t is CUstream_st*; declared here so callers need no CUDA header

namespace moestream::gpu {

using Stream = CUstream_st*;  // nullptr is the legacy default stream

// Number of CUDA devices usable by this process; 0 (never throws) when the driver or a GPU is
// missing, with the runtime's reason in *why when given.
int device_count(const char** why = nullptr);

// out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w for each of `rows` rows of n floats (HF RMSNorm).
void rms_norm(const float* x, const float* w, int rows, int n, float eps, float* out, Stream s);

// Rotates x [n_tokens, n_heads, 2*half_dim] in place, rotate_half (neox) layout: pairs
// (i, i + half_dim). cos/sin are [n_tokens, half_dim] tables as runtime/model/rope.h Rope::fill makes.
void rope_neox(float* x, int n_tokens, int n_heads, int half_dim, const float* cos,
               const float* sin, Stream s);
// The same on heads of head_dim >= 2*half_dim floats: only the first 2*half_dim dims of each head
// rotate, the rest pass (GLM-4.5's partial rotary, runtime/model/attention.cpp).
void rope_neox_partial(float* x, int n_tokens, int n_heads, int half_dim, int head_dim, const float* cos,
                       const float* sin, Stream s);

// Per-head QK-norm then full RoPE (Qwen3) of a chunk in one launch: q_out [n_tokens, n_q_heads,
// head_dim] = rope(rms_norm(q_in head, q_norm)), k_out likewise from k_in with k_norm; cos/sin
// as rope_neox with half_dim = head_dim / 2. The arithmetic of rms_norm then rope_neox (within
// FMA contraction). head_dim even and <= 1024; outputs must not alias the inputs.
void qk_norm_rope(const float* q_in, const float* k_in, const float* q_norm, const float* k_norm,
                  int n_tokens, int n_q_heads, int n_k_heads, int head_dim, float eps,
                  const float* cos, const float* sin, float* q_out, float* k_out, Stream s);

// Router of n_tokens tokens: softmax over n_experts logits, the k largest probabilities (ties:
// lower id first), renormalised to sum 1 when `normalize` (norm_topk_prob). ids/weights get
// n_tokens*k entries, token-major, as runtime/model/routing.h route_token.
void router_topk(const float* logits, int n_tokens, int n_experts, int k, bool normalize,
                 int* ids, float* weights, Stream s);
// The grouped sigmoid router (GLM-4.5, DeepSeek-V3) of n_tokens tokens, as
// runtime/model/routing.h route_sigmoid_grouped: sigmoid scores, `bias` [n_experts] (device, may
// be null) added for selection only, the topk_group best of n_group groups (by the sum of each
// group's two best), the k best experts in them (ties: lower id), weights the chosen unbiased
// scores, normalised when `normalize`, times `scaling`. ids/weights n_tokens*k, token-major.
void router_grouped(const float* logits, const float* bias, int n_tokens, int n_experts, int k,
                    int n_group, int topk_group, bool normalize, float scaling, int* ids,
                    float* weights, Stream s);
// DeepSeek-V2's group-limited greedy router (kernels/cuda/router_grouped_softmax.cu), as
// runtime/model/routing.h route_softmax_grouped: softmax over all experts, the topk_group of
// n_group groups with the best maximum probability (ties: lower group), the k best probabilities
// in them (ties: lower id), weights those probabilities (normalised when `normalize`) times
// `scaling`. n_group 1: router_topk, then the scaling. ids/weights n_tokens*k, token-major.
void router_grouped_softmax(const float* logits, int n_tokens, int n_experts, int k, int n_group,
                            int topk_group, bool normalize, float scaling, int* ids, float* weights, Stream s);

// out[i] = silu(gate[i]) * up[i] for n elements (the expert's fused SwiGLU).
void swiglu(const float* gate, const float* up, size_t n, float* out, Stream s);

// y[r] = sum_c W[r][c] * x[c] for r in [0, rows), W one matrix in the encoding of
// loader/format/expert_file.h (q8, q4 or bf16; each row its own f16 scales then its quants), or
// a ggml block type (through dense_gemm with one token: x 16-byte aligned).
void expert_matvec(QuantType q, const uint8_t* w, int rows, int cols, const float* x, float* y,
                   Stream s);
void expert_matvec_q8(const uint8_t* w, int rows, int cols, const float* x, float* y, Stream s);
void expert_matvec_q4(const uint8_t* w, int rows, int cols, const float* x, float* y, Stream s);
void expert_matvec_bf16(const uint8_t* w, int rows, int cols, const float* x, float* y, Stream s);

// Causal grouped-query attention of n_q query tokens at positions pos0..pos0+n_q-1 against this
// layer's KV cache, which already holds positions [0, pos0+n_q). q: [n_q, n_heads, head_dim];
// k_cache, v_cache: [max_ctx, n_kv_heads, head_dim] (position-major, one layer); query head h
// reads kv head h / (n_heads / n_kv_heads); out: [n_q, n_heads, head_dim]. Softmax in f32 with
// scale applied to q·k. n_q == 1 is the decode case and must be fast (split the context across
// blocks; contexts up to 40k positions).
// gpt-oss: `sinks` (device, [n_heads], or null) adds exp(sinks[h]) to each softmax's denominator
// (a logit attended to with value zero); `window` > 0 limits a query at position p to keys
// [p - window + 1, p] (a sliding layer; 0: all earlier keys).
// Bounded sliding-window cache (gpt-oss): `ring` > 0 says k_cache/v_cache hold `ring` rows and
// position p sits in row p % ring; it needs window > 0 and ring >= window + n_q - 1 (every key
// the chunk reads still there; Error otherwise). 0: row p is position p.
// `scratch` (device, 16-byte aligned, `scratch_floats` long; attention_scratch_floats() bounds
// what a call needs) holds the partials of a context split over blocks; without it, or when too
// small, they come from the device's stream-ordered pool (which a CUDA graph update cannot take).
void attention(const float* q, const float* k_cache, const float* v_cache, int n_q, int pos0,
               int n_heads, int n_kv_heads, int head_dim, float scale, float* out, Stream s,
               const float* sinks = nullptr, int window = 0, int ring = 0, float* scratch = nullptr,
               size_t scratch_floats = 0);
// Floats of split partials attention() needs at most for n_q rows over at most max_keys keys.
size_t attention_scratch_floats(int n_q, int n_heads, int head_dim, int max_keys);

// Grouped expert GEMM (prefill) that is also the decode path (groups of one row): for group g,
// rows [row_start[g], row_start[g+1]) of x ([n_rows, cols], grouped contiguously) times the
// matrix at byte offset matrix_offset inside expert payload w[g] (q8/q4/bf16 row encoding of
// loader/format/expert_file.h, or a ggml block type: F32, F16, BF16, Q4_0..Q8_0, Q2_K..Q6_K,
// IQ4_NL, IQ4_XS, MXFP4, rows of whole blocks; others are a ConfigError naming the type;
// `rows` x `cols`) -> y rows [row_start[g], row_start[g+1]) of [n_rows, rows].
// w and row_start are DEVICE arrays (n_groups and n_groups+1 entries); max_rows_per_group is a
// host-side upper bound used for the launch grid. One launch for all groups.
// Which kernel the products over several token rows take. kAuto: the rules below (today the
// float tile loop for every type). kInt8Mma: the q8 types' product on the int8 tensor cores
// (kernels/cuda/gemm_q8_mma.cu) for the pack's q8 and ggml's Q8_0 with cols % 128 == 0 on
// compute capability 8.0 and later (Error otherwise); it rounds its input as round_activations
// does. Not kAuto's choice until it has been checked and measured on a device (docs/results.md,
// issue 19): only its tests and bench_gpu_kernels take it.
enum class GemmKernel { kAuto, kInt8Mma };
void expert_gemm(QuantType q, const uint8_t* const* w, size_t matrix_offset, const int* row_start,
                 int n_groups, int max_rows_per_group, int rows, int cols, const float* x, float* y,
                 Stream s, GemmKernel kernel = GemmKernel::kAuto);
// Groups of one token row (max_rows_per_group 1) whose shape decode_gemv fits (bf16 with cols
// % 8 == 0, ggml Q8_0 with cols % 256 == 0) take the wide-load GEMV (kernels/cuda/decode_gemv.cuh);
// every other call the tile-loop GEMM. Either way each output row's float does not depend on
// the other groups of the call. Q8_0's GEMV rounds its input to q8_0 itself (the CPU kernel's
// rounding; the tile loop takes it already rounded): see gemv_rounds_input.
// Gate and up of the same experts (both type q, rows x cols, at gate_offset / up_offset in each
// payload), each with its own input, in one launch where expert_gemm would take the GEMV; else
// two expert_gemm calls. Each output equals expert_gemm's bit for bit.
void expert_gemm_gate_up(QuantType q, const uint8_t* const* w, size_t gate_offset,
                         size_t up_offset, const int* row_start, int n_groups,
                         int max_rows_per_group, int rows, int cols, const float* x_gate,
                         const float* x_up, float* y_gate, float* y_up, Stream s);
// What the two wrappers above check or need: attention: head_dim % 4 == 0 and <= 256
// (ConfigError otherwise), q/k_cache/v_cache/out 16-byte aligned. expert_gemm: q8/q4 need
// cols % 32 == 0 (ConfigError), matrix_offset % 16 == 0, x 16-byte aligned, and each w[g]
// 16-byte aligned (device memory: not checked). max_rows_per_group only picks the token tile,
// so any positive value gives the right result; empty groups are allowed.

// One matrix W (rows x cols, stored in type q) times n_tokens activation rows: y [n_tokens, rows]
// = x [n_tokens, cols] * W^T. The dense weights' path (attention, router, lm_head) in stored
// precision; q: any type expert_gemm takes (pack q8/q4/bf16 and the ggml block types). The weight
// rows are read once per tile of tokens, as in expert_gemm. x 16-byte aligned, w 16-byte aligned.
void dense_gemm(QuantType q, const uint8_t* w, int rows, int cols, const float* x, int n_tokens,
                float* y, Stream s, GemmKernel kernel = GemmKernel::kAuto);
// At one token, q8/q4 (cols % 256 == 0), bf16 (cols % 8 == 0) and ggml Q8_0 (cols % 256 == 0)
// matrices take the wide-load GEMV (kernels/cuda/decode_gemv.cuh), one warp per output row; other
// shapes the tile loop (or the int8 tensor-core product: GemmKernel).
// Up to three matrices of type q and width cols that share the input x: y_i = x * W_i^T, in one
// launch at one token where dense_gemm would take the GEMV (the q/k/v projections), else one
// dense_gemm each. Each output equals dense_gemm's bit for bit. `add`: y += the product (the
// bits of dense_gemm into a buffer and add_inplace of it: o_proj's residual add); only where
// dense_gemv_takes(q, cols) and n_tokens is 1 (Error otherwise).
struct DenseOut {
  const uint8_t* w;
  int rows;
  float* y;
  bool add = false;
};
bool dense_gemv_takes(QuantType q, int cols);
// y [rows] = W x (`add`: y + W x) for one float32 row x [cols] and a float32 W [rows, cols]: the
// GEMV above, a warp per row, in one launch (cuBLAS's sgemv takes two). cols % 4 == 0, w and x
// 16-byte aligned (Error otherwise).
void gemv_f32(const float* w, int rows, int cols, const float* x, float* y, bool add, Stream s);
// True when a one-token product of type q and width cols (dense_gemm at one token, expert_gemm
// at max_rows_per_group 1) rounds its input as the CPU's kernel does by itself (ggml Q8_0's GEMV).
// Rounding is idempotent, so an input rounded first gives the same bits: callers skip the launch.
bool gemv_rounds_input(QuantType q, int cols);
void dense_gemm_shared_input(QuantType q, const DenseOut* outs, int n_outs, int cols,
                             const float* x, int n_tokens, Stream s);
// Rows ids[0..n) of a rows x cols matrix stored in type q, dequantised to f32 out [n, cols] (the
// embedding lookup of a quantised table). kF32 and every type dense_gemm takes; ids must be in
// range (checked on the host by the caller).
void dequantize_rows(QuantType q, const uint8_t* w, int cols, const int* ids, int n, float* out,
                     Stream s);

// out[i] = src[idx[i]] row-wise: n rows of dim floats (token rows -> grouped expert rows).
void gather_rows(const float* src, const int* idx, int n, int dim, float* out, Stream s);
// MoE combine in a fixed order (deterministic, same order as the CPU): for token t,
// out[t] = sum_{j<k} weights[t*k+j] * y[pair_row[t*k+j]], y: [n_rows, dim] grouped expert outputs.
void moe_combine(const float* y, const int* pair_row, const float* weights, int n_tokens, int k,
                 int dim, float* out, Stream s);
// x[t] += the same sum, in one launch: equal bit for bit to moe_combine into a buffer and
// add_inplace of it (the residual add after the MoE).
void moe_combine_add(const float* y, const int* pair_row, const float* weights, int n_tokens,
                     int k, int dim, float* x, Stream s);
// moe_combine_add of one token into x [dim], then out = rms_norm(x, w, eps) [dim], in one launch:
// the bits of the two launches (the resident decode step ends a MoE layer with it, out being the
// next layer's attention input or lm_head's). k <= kMaxFusedCombineK.
constexpr int kMaxFusedCombineK = 64;
void moe_combine_add_norm(const float* y, const int* pair_row, const float* weights, int k, int dim,
                          float* x, const float* w, float eps, float* out, Stream s);
// y[i] += x[i] (the residual stream).
void add_inplace(float* y, const float* x, size_t n, Stream s);
// Device state of argmax on one stream: its owner zeroes it once (cudaMemset); each launch
// leaves it zeroed again, with the result in `id`.
struct ArgmaxState {
  unsigned long long best;
  unsigned int done;
  int id;
};
// state->id (device) = the index of x's largest value [n], the lowest on a tie, NaN never (all
// NaN: 0): runtime/model/sampler.h Sampler::argmax, for greedy decoding without copying the
// logits. Launches on one state are ordered by their stream; two streams need two states.
void argmax(const float* x, int n, ArgmaxState* state, Stream s);
// The MoE plan of one decode token from its top-k `ids` [k] (device), as CudaForward::moe lays
// it out for an all-hit token: groups in ascending id, one row each (gather_idx [k] all 0,
// pair_row [k], row_start [k+1]), ptrs[g] = table[id] (`table` [n_experts]: a layer's payload
// pointers, nullptr where not resident). *miss = 1 when an expert is absent from the table, an id
// is out of range or repeated (its pointer is then `fallback`, a valid payload), else 0. Also
// copies x [dim] to x_snap (the residual before the MoE, from which the host can redo the layer).
void moe_plan_decode(const int* ids, int k, const uint8_t* const* table, int n_experts,
                     const uint8_t* fallback, int* gather_idx, int* pair_row, int* row_start,
                     const uint8_t** ptrs, int* miss, const float* x, float* x_snap, int dim,
                     Stream s);
// y[t] += sigmoid(gate[t]) * x[t] for n_tokens rows of dim floats (Qwen2-MoE's gated shared
// expert; the sigmoid in float32 as the CPU's 1 / (1 + exp(-g))).
void gated_add(float* y, const float* x, const float* gate, int n_tokens, int dim, Stream s);
// out[i] = table[ids[i]] row-wise (embedding lookup); ids must be in [0, n_table_rows) (checked
// on the host before the call by the caller).
void embed_rows(const float* table, const int* ids, int n, int dim, float* out, Stream s);

// gpt-oss (kernels/cuda/gpt_oss.cu). Router: the k largest logits (ties: lower id first), weights
// the softmax over those k (runtime/model/routing.h route_token_topk_softmax); k <= 64.
void router_topk_softmax(const float* logits, int n_tokens, int n_experts, int k, int* ids, float* weights,
                         Stream s);
// out[i] = (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g), g = min(gate, limit).
void swiglu_clamped(const float* gate, const float* up, size_t n, float limit, float alpha, float* out, Stream s);
// Grouped expert rows: for each row r in [r0, r1) of y [*, dim], its group g in [g0, g1) by the
// DEVICE array row_start, y[r] += the float32 vector at payloads[g] + bias_offset (the expert
// payload's bias section, loader/format/expert_file.h).
void expert_bias_add(float* y, int dim, const int* row_start, int g0, int g1, int r0, int r1,
                     const uint8_t* const* payloads, size_t bias_offset, Stream s);

}  // namespace moestream::gpu
