// Implementation of runtime/model/routing_step.h.
#include "runtime/model/routing_step.h"

#include <string>

#include "common/error.h"

namespace moestream {

RoutingStep::RoutingStep(const ModelConfig& cfg)
    : E_(cfg.n_experts), K_(cfg.n_experts_per_tok), D_(cfg.hidden_size), first_dense_(cfg.first_k_dense_replace),
      softmax_topk_router_(cfg.router_softmax_topk),
      cache_aware_(cfg.n_experts, cfg.n_experts_per_tok, cfg.norm_topk_prob), resident_(size_t(cfg.n_experts)) {
  const RouterParams p = RouterParams::of(cfg);
  if (grouped_cache_aware(p)) cache_aware_.set_grouped(p);  // DeepSeek-V2's softmax groups too
}

void RoutingStep::begin_chunk(const RoutingControl& control, std::span<const RoutingSequence> sequences,
                              CacheAwareStats& stats) {
  MOE_ASSERT(!sequences.empty(), "a chunk of no sequence");
  control_ = &control;
  stats_ = &stats;
  sequences_ = sequences;
  splits_.assign(1, 0);
  any_override_ = false;
  for (const RoutingSequence& s : sequences) {
    MOE_ASSERT(s.row0 == splits_.back() && s.n_rows > 0, "sequences must cover the chunk's rows in order");
    splits_.push_back(s.row0 + s.n_rows);
    any_override_ |= s.override != nullptr && bool(*s.override);
  }
  // The model's override has one clock: it serves forward_chunk's one sequence, as its override.
  MOE_ASSERT(!control.override || (sequences.size() == 1 && sequences.front().override == &control.override),
             "the model's routing override takes one sequence");
  MOE_ASSERT(!(any_override_ && sequences.size() > 1 && control.cache_aware.enabled),
             "per-sequence overrides exclude cache-aware routing");
  substitute_ = control.cache_aware.enabled && !any_override_;
  if (substitute_ && softmax_topk_router_)
    throw ConfigError("cache-aware routing is not implemented for a router that takes the softmax over the "
                      "selected top-k (gpt-oss)");
}

void RoutingStep::begin_chunk(const RoutingControl& control, const ForwardChunk& chunk, CacheAwareStats& stats) {
  one_ = RoutingSequence{0, chunk.n_tokens, chunk.n_past, chunk.prefill, -1,
                         control.override ? &control.override : nullptr, chunk.ordinal};
  begin_chunk(control, std::span<const RoutingSequence>(&one_, 1), stats);
}

const RoutingOverrideFn* RoutingStep::chunk_override() const {
  if (sequences_.size() != 1) return nullptr;
  const RoutingOverrideFn* o = sequences_.front().override;
  return o != nullptr && *o ? o : nullptr;
}

bool RoutingStep::decide(int layer, int* ids, float* weights, const float* logits, const float* selection_bias,
                         const ResidencyFn& residency) {
  MOE_ASSERT(control_ != nullptr, "decide() before begin_chunk()");
  const int T = splits_.back();
  bool changed = false;
  for (const RoutingSequence& s : sequences_) {
    if (s.override == nullptr || !*s.override) continue;
    const size_t r0 = size_t(s.row0) * size_t(K_);
    (*s.override)(layer, s.ordinal, s.n_rows, ids + r0, weights + r0);
    changed = true;
  }
  for (const RoutingSequence& s : sequences_)
    for (int i = s.row0 * K_; i < (s.row0 + s.n_rows) * K_; ++i)
      if (ids[i] < 0 || ids[i] >= E_)
        throw FormatError("MoE layer " + std::to_string(layer) + " (decoder layer " +
                          std::to_string(layer + first_dense_) + "): expert id " + std::to_string(ids[i]) +
                          " outside [0, " + std::to_string(E_) + ") from the " +
                          (s.override != nullptr && *s.override ? "routing override" : "router"));
  if (!substitute_) return changed;
  MOE_ASSERT(logits != nullptr, "cache-aware routing needs the router's logits");
  residency(layer, std::span<uint8_t>(resident_));
  // The union rule (CacheAwareOptions::batch_union): a batch's sequences, in the step's order.
  const bool use_union = control_->cache_aware.batch_union && sequences_.size() > 1;
  return cache_aware_.apply(resident_, logits, T, control_->cache_aware.tolerance, ids, weights, *stats_,
                            selection_bias, use_union ? std::span<const int>(splits_) : std::span<const int>{}) > 0;
}

void RoutingStep::publish(int layer, const int* ids, const float* weights, const float* router_inputs) const {
  if (!observed()) return;
  for (const RoutingSequence& s : sequences_) {
    const size_t r0 = size_t(s.row0);
    RoutingEvent ev{layer, s.position, s.n_rows, K_, D_, s.prefill, ids + r0 * size_t(K_),
                    weights + r0 * size_t(K_), router_inputs + r0 * size_t(D_)};
    ev.sequence = s.slot;
    control_->on_routing(ev);
  }
}

}  // namespace moestream
