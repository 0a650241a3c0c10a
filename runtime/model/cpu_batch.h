// The CPU pass over a batch of sequences (continuous batching): one step carries the tokens of
// several sequences at their own positions, each with its own KV cache (a slot). Per layer: the
// dense products once over all of the step's rows (attention projections, router, shared
// expert, dense MLP; lm_head over the rows that want logits), attention per sequence against its
// slot, then every token routed and the union of the selected experts fetched once (MoeLayer over
// all rows) and run over all of their tokens.
// Each sequence's numbers equal, bitwise, those of its run alone through CpuForward::forward_chunk
// with the same chunks, by construction: linear_ranges gives each sequence's rows the product its
// run alone computes (dense_ops.h), a sequence's attention runs on its own rows at the start of
// its slot's scratch, and the MoE layer computes each (expert, token) pair and each token's
// weighted sum on its own. MLA (DeepSeek-V2/V3) keeps its products per sequence.
#pragma once

#include <memory>
#include <vector>

#include "common/thread_pool.h"
#include "loader/format/model_config.h"
#include "runtime/model/attention.h"
#include "runtime/model/dense_weights.h"
#include "runtime/model/forward_pass.h"
#include "runtime/model/mla_attention.h"
#include "runtime/model/moe_layer.h"
#include "runtime/model/rope.h"

namespace moestream {

// Slots a batch pass accepts; Model bounds them lower (ModelOptions::max_sequences).
inline constexpr int kMaxBatchSlots = 1024;

class CpuBatchPass {
 public:
  // Borrows CpuForward's weights, RoPE tables, MoE layer and routing step (the batch and the
  // single sequence never run at once); sizes its own scratch for max_batch tokens.
  CpuBatchPass(const ModelConfig& cfg, const DenseWeights& w, const Rope& rope, MoeLayer& moe,
               RoutingStep& routing_step, ThreadPool& pool, int max_context, int max_batch);
  ~CpuBatchPass();

  // ForwardPass::forward_batch of the CPU pass. A slot's KV cache is allocated on its first use
  // (address space; pages as positions are written) and kept for the slot's next sequence.
  void forward(const ForwardBatch& batch, const RoutingControl& routing, ForwardTimes& times,
               CacheAwareStats& cache_aware);

  int slots_allocated() const { return int(slots_.size()); }

 private:
  // A sequence's KV cache: standard attention's, or MLA's latent one (DeepSeek-V2/V3).
  struct Slot {
    std::unique_ptr<Attention> attention;
    std::unique_ptr<MlaAttention> mla;
  };
  Slot& slot(int s);
  void dense_mlp(const LayerWeights& lw, int T);  // h_ -> tmp_
  void attention(const ForwardBatch& b, const LayerWeights& lw, int l, int T);  // h_ -> tmp_
  void mla_attention(const ForwardBatch& b, const LayerWeights& lw, int l);     // h_ -> tmp_

  const ModelConfig& cfg_;
  const DenseWeights& w_;
  const Rope& rope_;
  MoeLayer& moe_;
  RoutingStep& routing_step_;
  ThreadPool& pool_;
  int max_context_, max_batch_;
  std::vector<Slot> slots_;  // by slot id; empty until first used
  PhaseTimes moe_times_;
  RowMatrix x_, h_, tmp_;          // [max_batch, D]
  // MLA: [max_batch, D]: one sequence's rows at an aligned start, in and out of its products,
  // where its run alone has them.
  RowMatrix in_, out_;
  RowMatrix q_, k_, v_, attn_;     // [max_batch, H*hd] / [max_batch, KV*hd]: the step's projections
  RowMatrix logits_;               // [rows, vocab]: lm_head of a step, grown to the most rows asked
  std::vector<int> logit_splits_;  // its row boundaries per sequence that wants logits
  RowMatrix mlp_act_, mlp_up_, mlp_scratch_;  // [max_batch, intermediate_size]: dense-MLP layers
  std::vector<float> cos_, sin_;   // [max_batch, half_dim]
  std::vector<int> splits_;        // row boundaries of the entries (MoeRouting::row_splits)
  std::vector<RoutingSequence> sequences_;  // the entries as the routing step sees them
};

}  // namespace moestream
