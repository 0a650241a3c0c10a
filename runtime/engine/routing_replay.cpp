// Implementation of runtime/engine/routing_replay.h: steps are gathered once at load and mapped onto the
// model's counts up front, so route() is a copy.
#include "runtime/engine/routing_replay.h"

#include <algorithm>
#include <map>
#include <utility>

#include "common/error.h"

namespace moestream {

RoutingReplay::RoutingReplay(const RoutingLog& log, const ModelConfig& cfg, std::string source)
    : RoutingReplay(cfg) {
  add(log, cfg.n_experts, source);
  set_describe(log.header, cfg.n_experts, source, 1);
}

void RoutingReplay::add(const RoutingLog& log, int E, const std::string& source) {
  const RoutingLogHeader& h = log.header;
  const int L_log = int(h.n_layers), k_log = int(h.top_k);
  if (L_log <= 0 || k_log <= 0) throw ConfigError(source + ": routing log has no layers or top_k 0");
  // Group the records into steps by (request, position), in order of first appearance.
  std::map<std::pair<uint64_t, uint32_t>, size_t> step_of;
  std::vector<std::vector<const RoutingRecord*>> steps;  // [step][log layer]
  for (const RoutingRecord& r : log.records) {
    auto [it, added] = step_of.try_emplace({r.request_id, r.position}, steps.size());
    if (added) steps.emplace_back(size_t(L_log), nullptr);
    if (r.layer < L_log) steps[it->second][r.layer] = &r;
  }
  std::map<uint64_t, size_t> request_of;  // log request id -> index into `requests`
  std::vector<std::vector<std::pair<uint32_t, uint32_t>>> requests;  // [request]: (position, step)
  const size_t n_steps_before = n_steps_;
  std::vector<uint8_t> taken(static_cast<size_t>(E), 0);
  for (const auto& step : steps) {
    if (std::find(step.begin(), step.end(), nullptr) != step.end()) {
      ++dropped_steps_;
      continue;
    }
    auto [req, added] = request_of.try_emplace(step[0]->request_id, requests.size());
    if (added) requests.emplace_back();
    requests[req->second].emplace_back(step[0]->position, uint32_t(n_steps_));
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
  // Each request's steps by position (infer writes them in order; a server log of concurrent
  // requests interleaves requests, and sorting costs little).
  for (auto& q : requests) {
    std::sort(q.begin(), q.end());
    request_steps_.emplace_back();
    for (const auto& ps : q) request_steps_.back().push_back(ps.second);
  }
  if (n_steps_ == n_steps_before)
    throw ConfigError(source + ": routing log holds no complete token (" +
                      std::to_string(log.records.size()) + " records, " + std::to_string(L_log) +
                      " layers each)");
}

void RoutingReplay::set_describe(const RoutingLogHeader& h, int E, const std::string& source, size_t n_logs) {
  describe_ = "replay of " + source + (n_logs > 1 ? " (" + std::to_string(n_logs) + " logs)" : "") + ": " +
              std::to_string(n_steps_) + " tokens in " + std::to_string(request_steps_.size()) +
              " requests, log " + std::to_string(h.n_layers) + " layers x " + std::to_string(h.n_experts) +
              " experts top-" + std::to_string(h.top_k) + " -> model " + std::to_string(L_) + " x " +
              std::to_string(E) + " top-" + std::to_string(K_) + " (layer l <- l mod " +
              std::to_string(h.n_layers) + ", expert e -> e mod " + std::to_string(E) +
              ", collisions to the next free id)";
}

RoutingReplay RoutingReplay::load(const std::filesystem::path& path, const ModelConfig& cfg) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    const RoutingLog log = read_routing_log(path);
    return RoutingReplay(log, cfg, path.string());
  }
  std::vector<fs::path> files;
  for (const fs::directory_entry& e : fs::directory_iterator(path))
    if (e.is_regular_file()) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  if (files.empty()) throw ConfigError(path.string() + ": no routing logs in the directory");
  RoutingReplay r(cfg);
  RoutingLogHeader first;
  for (size_t i = 0; i < files.size(); ++i) {
    const RoutingLog log = read_routing_log(files[i]);
    const RoutingLogHeader& h = log.header;
    if (i == 0) first = h;
    if (h.n_layers != first.n_layers || h.n_experts != first.n_experts || h.top_k != first.top_k)
      throw ConfigError(files[i].string() + ": routing log of " + std::to_string(h.n_layers) + " layers x " +
                        std::to_string(h.n_experts) + " experts top-" + std::to_string(h.top_k) + ", but " +
                        files[0].string() + " has " + std::to_string(first.n_layers) + " x " +
                        std::to_string(first.n_experts) + " top-" + std::to_string(first.top_k) +
                        ": a directory's logs must share their counts");
    r.add(log, cfg.n_experts, files[i].string());
  }
  r.set_describe(first, cfg.n_experts, path.string(), files.size());
  return r;
}

void RoutingReplay::copy_step(size_t step, int layer, int* ids, float* weights) const {
  const size_t src = (step * size_t(L_) + size_t(layer)) * size_t(K_);
  std::copy_n(ids_.begin() + ptrdiff_t(src), K_, ids);
  std::copy_n(weights_.begin() + ptrdiff_t(src), K_, weights);
}

void RoutingReplay::route(int layer, uint64_t ordinal, int n_tokens, int* ids, float* weights) const {
  MOE_ASSERT(layer >= 0 && layer < L_);
  for (int t = 0; t < n_tokens; ++t)
    copy_step(size_t((ordinal + uint64_t(t)) % n_steps_), layer, ids + size_t(t) * size_t(K_),
              weights + size_t(t) * size_t(K_));
}

void RoutingReplay::route_request(size_t request, int layer, uint64_t position, int n_tokens, int* ids,
                                  float* weights) const {
  MOE_ASSERT(layer >= 0 && layer < L_ && request < request_steps_.size());
  const std::vector<uint32_t>& steps = request_steps_[request];
  for (int t = 0; t < n_tokens; ++t)
    copy_step(steps[size_t((position + uint64_t(t)) % steps.size())], layer, ids + size_t(t) * size_t(K_),
              weights + size_t(t) * size_t(K_));
}

}  // namespace moestream
