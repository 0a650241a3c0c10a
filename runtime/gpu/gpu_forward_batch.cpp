// Batches of sequences on the GPU (ForwardPass::forward_batch; issue 22, docs/gpu.md "Batches of
// sequences"): one step carries the tokens of several sequences (decode tokens and prefill
// chunks), each at its own position with its own device KV cache (a slot). The dense products run
// once over all of the step's rows (cuBLAS's f32 ones per sequence, so each sequence's numbers
// stay those of its run alone); attention runs per sequence against its slot; per MoE layer
// every row is routed on the device, the union of the selected experts is acquired from the GPU
// expert cache once (hits first) and each expert runs over all of its rows as one grouped GEMM
// (moe(), the path prefill chunks take), then the weighted sums scatter back to the rows.
#include <algorithm>
#include <chrono>
#include <string>

#include "common/error.h"
#include "common/timing.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/gpu_ops.h"
#include "runtime/gpu/gpu_forward_impl.h"

namespace moestream::detail {

// linear_f32 over each sequence's rows apart (split_rows): the same cuBLAS call, row count and
// 16-byte alignment (hidden sizes are multiples of 4) as the sequence's run alone. False when one
// sequence holds every row (one call does).
bool CudaForward::linear_f32_per_sequence(const float* xin, const float* W, int T, int in, int out,
                                          float* yout, float beta) {
  const std::vector<int>& s = *split_rows;
  MOE_ASSERT(s.size() >= 2 && s.back() == T, "an f32 product of a batch step over other rows");
  if (s.size() == 2) return false;
  split_rows = nullptr;  // the calls below run as they would alone
  for (size_t i = 0; i + 1 < s.size(); ++i)
    linear_f32(xin + size_t(s[i]) * in, W, s[i + 1] - s[i], in, out, yout + size_t(s[i]) * out, beta);
  split_rows = &s;
  return true;
}

// Layer l's attention over the step's rows: the norm, then the layer's attention block, each
// sequence against its slot's state (gpu_attention.h).
void CudaForward::batch_attention_layer(const ForwardBatch& b, int l, ForwardTimes& times) {
  auto ta = std::chrono::steady_clock::now();
  gpu::rms_norm(x, w.layers[size_t(l)].attn_norm, batch_splits.back(), D, eps, h, stream);
  attention_of(l).batch_layer(*this, b, l);
  times.attention_s += seconds_since(ta);
}

void CudaForward::forward_batch(const ForwardBatch& b, const RoutingControl& routing, ForwardTimes& times,
                                CacheAwareStats& ca_stats) {
  // Unreachable while create() refuses MLA; a GPU MLA pass must give its batches a latent KV slot.
  if (any_attention(plan, AttentionKind::kMla))
    throw ConfigError("--gpu: batches of sequences (--parallel) run standard attention on the GPU; " +
                      std::string(arch_name(cfg.arch)) + "'s MLA batches run on the CPU path (drop --gpu)");
  MOE_ASSERT(b.n_entries > 0 && b.entries != nullptr, "empty batch");
  h_normed = false;
  MOE_ASSERT(!routing.override, "the model's routing override has one clock: batches take per-sequence ones");
  const int n = b.n_entries;
  batch_splits.assign(1, 0);
  batch_sequences.clear();
  bool any_decode = false;
  for (int i = 0; i < n; ++i) {
    const ForwardChunk& c = b.entries[i].chunk;
    MOE_ASSERT(c.n_tokens > 0 && c.n_past >= 0 && c.n_past + c.n_tokens <= opts.max_context);
    for (int j = 0; j < i; ++j) MOE_ASSERT(b.entries[j].slot != b.entries[i].slot, "slot twice in a batch");
    batch_sequences.push_back(RoutingSequence{batch_splits.back(), c.n_tokens, c.n_past, c.prefill,
                                              b.entries[i].slot, b.entries[i].override, c.ordinal});
    batch_splits.push_back(batch_splits.back() + c.n_tokens);
    MOE_ASSERT(batch_splits.back() <= B, "batch larger than max_batch");
    any_decode |= c.n_tokens == 1;  // as forward_chunk: one token is a demand (and ends a step)
  }
  const int T = batch_splits.back();
  auto t0 = std::chrono::steady_clock::now();
  const size_t bb = size_t(B);
  int* tok_h = in_host.as<int>();
  float* cos_h = reinterpret_cast<float*>(tok_h + bb);
  float* sin_h = cos_h + bb * size_t(half);
  for (int i = 0; i < n; ++i) {
    const ForwardChunk& c = b.entries[i].chunk;
    const size_t r0 = size_t(batch_splits[size_t(i)]);
    std::copy(c.tokens, c.tokens + c.n_tokens, tok_h + r0);
    rope.fill(c.n_past, c.n_tokens, cos_h + r0 * half, sin_h + r0 * half);
    for (int l = 0; l < cfg.n_layers; ++l)  // allocated before the timed layers
      if (l == 0 || plan[size_t(l)].attention.kind != plan[size_t(l) - 1].attention.kind)
        attention_of(l).prepare_slot(*this, b.entries[i].slot);
  }
  MOE_CUDA_CHECK(cudaMemcpyAsync(in_dev.get(), tok_h, size_t(T) * 4, cudaMemcpyHostToDevice, stream));
  MOE_CUDA_CHECK(cudaMemcpyAsync(cos_d, cos_h, size_t(T) * half * 4, cudaMemcpyHostToDevice, stream));
  MOE_CUDA_CHECK(cudaMemcpyAsync(sin_d, sin_h, size_t(T) * half * 4, cudaMemcpyHostToDevice, stream));
  embed(T);
  times.other_s += seconds_since(t0);

  // moe_layer() runs the step's rows as one chunk of T rows; the routing step replays each
  // sequence's override on its rows, takes one residency snapshot per layer for the whole step,
  // and splits the routing events into one per sequence, tagged with the slot.
  routing_step.begin_chunk(routing, batch_sequences, ca_stats);
  ForwardChunk rows;  // the whole step as moe_layer sees it
  rows.n_tokens = T;
  rows.n_past = 0;
  batch_step = true;  // no look-ahead (even for a step of one decode token), hits first
  batch_demand = any_decode;
  split_rows = &batch_splits;
  struct Restore {  // an error mid-step leaves forward_chunk's paths as they were
    CudaForward& f;
    ~Restore() {
      f.batch_step = f.batch_demand = false;
      f.split_rows = nullptr;
    }
  } restore{*this};
  for (int l = 0; l < cfg.n_layers; ++l) {
    batch_attention_layer(b, l, times);
    moe_layer(rows, l, times);
  }
  if (any_decode) cache->end_step();

  // Final norm of the rows each sequence asks logits for, gathered into h; one lm_head product;
  // each sequence's rows copied to its buffer.
  auto tl = std::chrono::steady_clock::now();
  int R = 0;
  logit_splits.assign(1, 0);
  for (int i = 0; i < n; ++i) {
    const ForwardChunk& c = b.entries[i].chunk;
    if (c.logits == nullptr) continue;
    const int first = c.all_logits ? 0 : c.n_tokens - 1, rows_i = c.n_tokens - first;
    gpu::rms_norm(x + size_t(batch_splits[size_t(i)] + first) * D, w.final_norm, rows_i, D, eps,
                  h + size_t(R) * D, stream);
    R += rows_i;
    logit_splits.push_back(R);
  }
  if (R > 0) {
    split_rows = &logit_splits;
    linear(h, w.lm_head, R, logits);
    R = 0;
    for (int i = 0; i < n; ++i) {
      const ForwardChunk& c = b.entries[i].chunk;
      if (c.logits == nullptr) continue;
      const int rows_i = c.all_logits ? c.n_tokens : 1;
      MOE_CUDA_CHECK(cudaMemcpyAsync(c.logits, logits + size_t(R) * V, size_t(rows_i) * V * 4,
                                     cudaMemcpyDeviceToHost, stream));
      R += rows_i;
    }
  }
  MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  times.other_s += seconds_since(tl);
}

}  // namespace moestream::detail
