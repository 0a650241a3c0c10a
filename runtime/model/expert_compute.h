// Routed experts' products on the CPU for a set of (expert, token) pairs, computed from the
// expert matrices where they lie (page cache, host cache or a read buffer): gate and up, SwiGLU
// (gpt-oss: the experts' biases and the clamped form), down; row slices of fixed length spread
// over the pool, so a row's result does not depend on the thread count. MoeLayer computes every
// selected expert of the CPU pass with it; the GPU pass the experts its VRAM cache misses when it
// computes them on the host (docs/gpu.md, "Misses on the CPU").
#pragma once

#include <span>
#include <vector>

#include "common/thread_pool.h"
#include "kernels/cpu/matvec_input.h"
#include "loader/format/model_config.h"
#include "loader/store/expert_store.h"
#include "runtime/model/dense_ops.h"

namespace moestream {

// gpt-oss's clamped SwiGLU, in place into gate[0, n): g = min(gate, limit), u = clamp(up, +-limit),
// gate = (u + 1) * g * sigmoid(alpha * g) (transformers' GptOssExperts._apply_gate).
void clamped_swiglu(float* gate, const float* up, size_t n, float limit, float alpha);

// Pair p multiplies expert payloads[expert_of_pair[p]] with row token_of_pair[p] of x and writes
// row y_row_of_pair[p] of y.
struct ExpertPairs {
  std::span<const ExpertMatrices> payloads;
  std::span<const int> expert_of_pair;
  std::span<const int> token_of_pair;
  std::span<const int> y_row_of_pair;
};

class ExpertCompute {
 public:
  // Scratch for up to max_pairs pairs at a time (decode: top-k).
  ExpertCompute(const ModelConfig& cfg, int max_pairs);

  // Decode (one token row x of D floats): rounds it once for the gate and up products of every
  // expert of `lay` that run() computes until the next call, instead of once per product.
  void set_token(const ExpertLayout& lay, const float* x);

  // y rows [y_row_of_pair[p]] ([*, D]) = down(swiglu(gate x, up x)) of each pair. decode: x is
  // set_token's row (every token_of_pair 0) and each activation is rounded once for its down
  // product; otherwise each product rounds its input itself. Same bits either way.
  void run(ThreadPool& pool, const ExpertLayout& lay, const ExpertPairs& pairs, const float* x, bool decode,
           float* y);

 private:
  // Several tokens (prefill) in ggml types: an expert's pairs, consecutive in `pairs` (MoeLayer
  // lists them expert by expert), are one product over their token rows (ggml_matmul decodes a
  // weight block once for up to four inputs and equals quant_matvec input by input), so an expert
  // that several tokens chose streams its matrices once per row slice, not once per token.
  void run_by_expert(ThreadPool& pool, const ExpertLayout& lay, const ExpertPairs& pairs, const float* x,
                     float* y);
  // Pair p's gate and up rows [r0, r1) -> its activation in act_: the biases (gpt-oss), then
  // SwiGLU (clamped for gpt-oss).
  void activate(const ExpertMatrices& e, size_t p, size_t r0, size_t r1);

  int D_, F_, max_pairs_;
  float swiglu_limit_, swiglu_alpha_;  // limit 0: plain SwiGLU
  RowMatrix act_;  // [max_pairs, F]: silu(gate) * up per pair
  RowMatrix up_;   // [max_pairs, F]
  MatvecInput token_in_;
  bool up_rounded_ = false;          // token_in_ serves the up products too
  std::vector<MatvecInput> act_in_;  // [max_pairs]: each pair's act_ row rounded for its down
  std::vector<size_t> group_start_;   // run_by_expert: the first pair of each expert, then n_pairs
};

}  // namespace moestream
