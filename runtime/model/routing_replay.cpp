// Implementation of runtime/model/routing_replay.h: steps are gathered once at load and mapped onto the
// model's counts up front, so route() is a copy.
#include "runtime/model/routing_replay.h"

#include <algorithm>
#include <map>
#include <utility>

#include "common/error.h"

namespace moestream {

RoutingReplay::RoutingReplay(const RoutingLog& log, const ModelConfig& cfg, std::string source)
    : L_(cfg.n_moe_layers()), K_(cfg.n_experts_per_tok) {
  const RoutingLogHeader& h = log.header;
  const int L_log = int(h.n_layers), k_log = int(h.top_k), E = cfg.n_experts;
  if (L_log <= 0 || k_log <= 0) throw ConfigError(source + ": routing log has no layers or top_k 0");
  // Group the records into steps by (request, position), in order of first appearance.
  std::map<std::pair<uint64_t, uint32_t>, size_t> step_of;
  std::vector<std::vector<const RoutingRecord*>> steps;  // [step][log layer]
  for (const RoutingRecord& r : log.records) {
    auto [it, added] = step_of.try_emplace({r.request_id, r.position}, steps.size());
    if (added) steps.emplace_back(size_t(L_log), nullptr);
    if (r.layer < L_log) steps[it->second][r.layer] = &r;
  }
  std::vector<uint8_t> taken(static_cast<size_t>(E), 0);
  for (const auto& step : steps) {
    if (std::find(step.begin(), step.end(), nullptr) != step.end()) {
      ++dropped_steps_;
      continue;
    }
    for (int l = 0; l < L_; ++l) {
      const RoutingRecord& r = *step[size_t(l % L_log)];
      std::fill(taken.begin(), taken.end(), 0);
      int last = 0;
      float weakest = 0, sum = 0;
      const size_t base = ids_.size();
      for (int j = 0; j < K_; ++j) {
        int id;
        float w;
        if (j < k_log) {
          id = int(r.ids[size_t(j)]) % E;
          w = r.weights[size_t(j)];
        } else {
          id = (last + 1) % E;
          w = weakest;
        }
        while (taken[size_t(id)]) id = (id + 1) % E;  // K <= E, so a free id exists
        taken[size_t(id)] = 1;
        last = id;
        weakest = j < k_log ? w : weakest;
        ids_.push_back(id);
        weights_.push_back(w);
        sum += w;
      }
      if (K_ != k_log) {  // rescale to the log token's top-k mass (1 when the model normalises)
        float target = 0;
        for (float w : r.weights) target += w;
        for (size_t j = base; j < weights_.size(); ++j)
          weights_[j] = sum > 0 ? weights_[j] * target / sum : target / float(K_);
      }
    }
    ++n_steps_;
  }
  if (n_steps_ == 0)
    throw ConfigError(source + ": routing log holds no complete token (" +
                      std::to_string(log.records.size()) + " records, " + std::to_string(L_log) +
                      " layers each)");
  describe_ = "replay of " + source + ": " + std::to_string(n_steps_) + " tokens, log " +
              std::to_string(L_log) + " layers x " + std::to_string(h.n_experts) + " experts top-" +
              std::to_string(k_log) + " -> model " + std::to_string(L_) + " x " +
              std::to_string(E) + " top-" + std::to_string(K_) +
              " (layer l <- l mod " + std::to_string(L_log) + ", expert e -> e mod " +
              std::to_string(E) + ", collisions to the next free id)";
}

RoutingReplay RoutingReplay::load(const std::filesystem::path& path, const ModelConfig& cfg) {
  const RoutingLog log = read_routing_log(path);
  return RoutingReplay(log, cfg, path.string());
}

void RoutingReplay::route(int layer, uint64_t ordinal, int n_tokens, int* ids, float* weights) const {
  MOE_ASSERT(layer >= 0 && layer < L_);
  for (int t = 0; t < n_tokens; ++t) {
    const size_t step = size_t((ordinal + uint64_t(t)) % n_steps_);
    const size_t src = (step * size_t(L_) + size_t(layer)) * size_t(K_);
    std::copy_n(ids_.begin() + ptrdiff_t(src), K_, ids + size_t(t) * size_t(K_));
    std::copy_n(weights_.begin() + ptrdiff_t(src), K_, weights + size_t(t) * size_t(K_));
  }
}

}  // namespace moestream
