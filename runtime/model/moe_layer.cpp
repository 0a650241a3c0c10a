// Implementation of runtime/model/moe_layer.h. Experts are fetched a bounded number at a time, so a
// long prefill never holds all of a layer's experts; work is split into fixed row slices so the
// result does not depend on the thread count.
#include "runtime/model/moe_layer.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "common/error.h"
#include "common/timing.h"
#include "kernels/cpu/quant.h"

namespace moestream {

namespace {

// At most this many experts are held by the store at once (one fetch); decode needs top-k <= 8.
constexpr size_t kMaxExpertsPerFetch = 16;

// Checked where the first member sized by top-k is built, before anything is allocated.
int check_top_k(const ModelConfig& cfg) {
  if (cfg.n_experts_per_tok <= 0 || cfg.n_experts_per_tok > cfg.n_experts)
    throw ConfigError("model.json: n_experts_per_tok (" + std::to_string(cfg.n_experts_per_tok) +
                      ") must be in [1, n_experts=" + std::to_string(cfg.n_experts) + "]");
  return cfg.n_experts_per_tok;
}

}  // namespace

MoeLayer::MoeLayer(const ModelConfig& cfg, ExpertStore& store, int max_batch)
    : cfg_(cfg), store_(store), D_(cfg.hidden_size), F_(cfg.moe_intermediate_size),
      E_(cfg.n_experts), K_(check_top_k(cfg)), max_batch_(max_batch),
      compute_(cfg, max_batch * cfg.n_experts_per_tok) {
  // Residency is sampled once per layer per forward chunk, before any fetch: the tiers cannot
  // change until this chunk's fetch starts, so every token of a prefill chunk sees one snapshot.
  residency_ = [this](int layer, std::span<uint8_t> resident) {
    store_.residency(layer, std::span<ExpertTier>(tiers_));
    for (int e = 0; e < E_; ++e) resident[size_t(e)] = tiers_[size_t(e)] != ExpertTier::kStorage;
  };
  for (int l = 0; l < cfg.n_moe_layers(); ++l) layouts_.push_back(cfg.expert_layout(l));
  logits_.resize(max_batch_, E_);
  probs_.resize(RouterParams::of(cfg).scratch_floats());
  ids_.resize(size_t(max_batch_) * K_);
  weights_.resize(size_t(max_batch_) * K_);
  const size_t max_pairs = size_t(max_batch_) * K_;
  unique_ids_.reserve(size_t(E_));
  expert_of_pair_.reserve(max_pairs);
  slot_of_pair_.reserve(max_pairs);
  payloads_.reserve(kMaxExpertsPerFetch);
  slots_of_expert_.resize(size_t(E_));
  for (auto& s : slots_of_expert_) s.reserve(size_t(max_batch_));
  token_of_pair_.reserve(max_pairs);
  y_.resize(Eigen::Index(max_pairs), D_);
  tiers_.resize(size_t(E_));
  if (cfg.has_shared_expert()) {
    shared_act_.resize(max_batch_, cfg.shared_expert_intermediate_size);
    shared_up_.resize(max_batch_, cfg.shared_expert_intermediate_size);
    shared_scratch_.resize(max_batch_, cfg.shared_expert_intermediate_size);
    shared_y_.resize(max_batch_, D_);
    shared_logit_.resize(max_batch_, 1);
  }
}

// Every layer's weights were checked against the config at load; this catches a caller mixing
// models or a dense-MLP layer reaching the MoE.
static void check_moe_weights(const FfnSpec& spec, const LayerWeights& w) {
  const int E = spec.router.params.n_experts;
  MOE_ASSERT(spec.kind == FfnKind::kRouted && w.router.rows() == E, "MoE layer without its router");
  MOE_ASSERT(spec.router.params.scoring != RouterScoring::kSigmoid || w.router_bias.size() == E,
             "sigmoid router without its correction bias");
  MOE_ASSERT(!spec.router.logit_bias || w.router_bias.size() == E, "router without its bias (gpt-oss)");
  MOE_ASSERT(spec.shared == SharedExpertKind::kNone || !w.shared_gate.empty(), "shared expert weights missing");
}

void MoeLayer::shared_expert(const LayerStep& step, SharedExpertKind kind, const LayerWeights& w, const float* x) {
  const int Fs = cfg_.shared_expert_intermediate_size, T = step.T;
  ThreadPool& pool = step.pool;
  const std::span<const int> splits = step.splits;
  MOE_ASSERT(kind != SharedExpertKind::kGated || w.shared_expert_gate.rows() == 1, "shared expert gate missing");
  const ConstRowMap xm(x, T, D_);
  RowMap act(shared_act_.data(), T, Fs), up(shared_up_.data(), T, Fs), y(shared_y_.data(), T, D_);
  RowMap logit(shared_logit_.data(), T, 1);
  linear_ranges(pool, xm, w.shared_gate, act, splits);
  linear_ranges(pool, xm, w.shared_up, up, splits);
  swiglu_ranges(act, up.data(), splits, shared_scratch_);
  linear_ranges(pool, ConstRowMap(act.data(), T, Fs), w.shared_down, y, splits);
  if (kind == SharedExpertKind::kUngated) return;  // GLM-4.5 / DeepSeek: added as is
  linear_ranges(pool, xm, w.shared_expert_gate, logit, splits);
  for (int t = 0; t < T; ++t) y.row(t) *= 1.0f / (1.0f + std::exp(-logit(t, 0)));
}

// The look-ahead's rule, as the GPU's (gpu_forward.cpp): layer L+1's router on layer L's normalised
// input, ranked by logit (gpt-oss's logit bias added) for every router kind, the N best (ties: the
// lower id), whatever the routing of layer L+1 then does. Only reads are affected, never a value.
void MoeLayer::predict_next(const LayerStep& ls, const float* x) {
  const Lookahead& r = ls.lookahead;
  const RoutingStep& step = *ls.routing;
  const LayerWeights& next = *r.next;
  MOE_ASSERT(next.router.rows() == cfg_.n_experts && r.width <= E_, "look-ahead without the next router");
  if (la_ids_.empty()) {
    la_logits_.resize(1, E_);
    la_ids_.resize(size_t(E_));
    la_weights_.resize(size_t(E_));
  }
  RowMap logits(la_logits_.data(), 1, E_);
  linear(ls.pool, ConstRowMap(x, 1, D_), next.router, logits);
  if (r.logit_bias) logits.row(0) += next.router_bias.transpose();
  route_token_topk_softmax(la_logits_.data(), E_, r.width, la_ids_.data(), la_weights_.data());
  if (const RoutingOverrideFn* o = step.chunk_override(); r.from_override && o != nullptr) {
    la_exact_.assign(size_t(K_), 0);
    (*o)(r.layer, step.chunk_ordinal(), 1, la_exact_.data(), la_weights_.data());
    for (int j = 0; j < r.width; ++j) la_exact_.push_back(la_ids_[size_t(j)]);
    size_t n = 0;  // distinct ids, the override's first, up to the width
    for (size_t i = 0; i < la_exact_.size() && n < size_t(r.width); ++i)
      if (std::find(la_ids_.begin(), la_ids_.begin() + ptrdiff_t(n), la_exact_[i]) == la_ids_.begin() + ptrdiff_t(n))
        la_ids_[n++] = la_exact_[i];
  }
  store_.prefetch_predicted(r.layer, std::span<const int>(la_ids_.data(), size_t(r.width)));
}

void MoeLayer::verify_pending(ThreadPool& pool, double& wait_s) {
  const auto t0 = std::chrono::steady_clock::now();
  pool.run_posted();
  store_.verify_pending();
  wait_s += seconds_since(t0);
}

void MoeLayer::forward(const LayerStep& ls, const FfnSpec& spec, const LayerWeights& w, const float* x, float* out) {
  const int T = ls.T, layer = spec.moe_layer;
  MOE_ASSERT(T > 0 && T <= max_batch_ && layer >= 0 && layer < int(layouts_.size()));
  check_moe_weights(spec, w);
  ThreadPool& pool = ls.pool;
  RoutingStep& step = *ls.routing;
  PhaseTimes& times = *ls.expert_times;
  const RouterParams& router = spec.router.params;
  const bool shared = spec.shared != SharedExpertKind::kNone;
  auto t0 = std::chrono::steady_clock::now();
  RowMap logits(logits_.data(), T, E_);
  linear_ranges(pool, ConstRowMap(x, T, D_), w.router, logits, ls.splits);
  if (spec.router.logit_bias) logits.rowwise() += w.router_bias.transpose();  // gpt-oss: a logit bias
  // The sigmoid router's correction bias: selection only (routing.h).
  const float* selection_bias = router.scoring == RouterScoring::kSigmoid ? w.router_bias.data() : nullptr;
  for (auto& s : slots_of_expert_) s.clear();
  unique_ids_.clear();
  for (int t = 0; t < T; ++t) {
    int* ids = ids_.data() + size_t(t) * K_;
    if (spec.router.softmax_of_top_k)
      route_token_topk_softmax(logits.row(t).data(), E_, K_, ids, weights_.data() + size_t(t) * K_);
    else
      route(router, logits.row(t).data(), selection_bias, ids, weights_.data() + size_t(t) * K_, probs_);
  }
  step.decide(layer, ids_.data(), weights_.data(), logits.data(), selection_bias, residency_);
  for (int t = 0; t < T; ++t) {
    const int* ids = ids_.data() + size_t(t) * K_;
    for (int j = 0; j < K_; ++j) {
      auto& slots = slots_of_expert_[size_t(ids[j])];
      if (slots.empty()) unique_ids_.push_back(ids[j]);
      slots.push_back(t * K_ + j);
    }
  }
  // Ascending ids: neighbouring experts are neighbours in the layer file.
  std::sort(unique_ids_.begin(), unique_ids_.end());
  times.router_s += seconds_since(t0);

  const ExpertLayout& lay = layouts_[size_t(layer)];

  // Decode: the token rounded once for every gate and up product of the layer.
  const bool decode = T == 1;
  if (decode) compute_.set_token(lay, x);
  for (size_t c0 = 0; c0 < unique_ids_.size(); c0 += kMaxExpertsPerFetch) {
    const size_t n = std::min(kMaxExpertsPerFetch, unique_ids_.size() - c0);
    auto t1 = std::chrono::steady_clock::now();
    // As matrices: experts already in host memory are computed where they are, not copied.
    store_.begin_fetch(layer, std::span<const int>(unique_ids_.data() + c0, n), FetchForm::kMatrices);
    // Decode: the next layer's likely experts start loading while this layer's load and compute.
    if (c0 == 0 && T == 1 && ls.lookahead.width > 0 && ls.lookahead.next != nullptr) {
      const auto tp = std::chrono::steady_clock::now();
      predict_next(ls, x);
      const double dt = seconds_since(tp);
      times.router_s += dt;  // the next router's product: router time, not I/O wait
      times.expert_io_s -= dt;
    }
    // A long prefill needs more than one group: the next group's reads start now (read-ahead)
    // and land while this one computes (the store keeps this group's payloads valid meanwhile).
    if (c0 + n < unique_ids_.size())
      store_.read_ahead(layer, std::span<const int>(unique_ids_.data() + c0 + n,
                                                    std::min(kMaxExpertsPerFetch,
                                                             unique_ids_.size() - c0 - n)));
    times.expert_io_s += seconds_since(t1);
    // The shared expert's weights are dense (in RAM): computed while the first group's reads
    // are in flight.
    if (c0 == 0 && shared) {
      const auto ts = std::chrono::steady_clock::now();
      shared_expert(ls, spec.shared, w, x);
      times.expert_compute_s += seconds_since(ts);
    }
    payloads_.assign(n, ExpertMatrices{});
    // Hit/miss overlap: compute every expert that is ready (resident ones at once) while the
    // rest are still loading, then the next group as it lands. Each (expert, token) pair writes
    // its own row of y_, so the grouping never changes the result.
    for (size_t got = 0; got < n;) {
      t1 = std::chrono::steady_clock::now();
      store_.take_ready(payloads_, ready_);
      got += ready_.size();
      times.expert_io_s += seconds_since(t1);  // only the wait that compute did not hide

      auto t2 = std::chrono::steady_clock::now();
      expert_of_pair_.clear();
      slot_of_pair_.clear();
      token_of_pair_.clear();
      for (int r : ready_)
        for (int slot : slots_of_expert_[size_t(unique_ids_[c0 + size_t(r)])]) {
          expert_of_pair_.push_back(r);
          slot_of_pair_.push_back(slot);
          token_of_pair_.push_back(slot / K_);
        }
      const ExpertPairs pairs{payloads_, expert_of_pair_, token_of_pair_, slot_of_pair_};
      compute_.run(pool, lay, pairs, x, decode, y_.data());
      times.expert_compute_s += seconds_since(t2);
    }
  }

  // Weighted sum in top-k order per token: the same order whatever the fetch chunking.
  auto t3 = std::chrono::steady_clock::now();
  RowMap om(out, T, D_);
  for (int t = 0; t < T; ++t) {
    om.row(t).setZero();
    for (int j = 0; j < K_; ++j)
      om.row(t) += weights_[size_t(t) * K_ + j] * y_.row(t * K_ + j);
    if (shared) om.row(t) += shared_y_.row(t);  // after the routed sum, as transformers
  }
  times.expert_compute_s += seconds_since(t3);
  if (step.observed()) {
    verify_pending(pool, times.expert_io_s);  // the events hand out this layer's input
    step.publish(layer, ids_.data(), weights_.data(), x);
  }
}

}  // namespace moestream
