// Implementation of cluster/coactivation.h: one pass over the records, pairs counted per layer.
#include "cluster/coactivation.h"

#include <map>
#include <tuple>

#include "common/error.h"

namespace moestream::cluster {

std::vector<LayerStats> coactivation(const std::vector<RoutingLog>& logs,
                                     const CoactivationOptions& opts) {
  if (logs.empty()) throw ConfigError("coactivation: no routing logs given");
  const RoutingLogHeader& h = logs.front().header;
  for (const RoutingLog& log : logs)
    if (!(log.header == h))
      throw ConfigError("routing logs disagree: they come from different models or shapes");
  std::vector<LayerStats> out(h.n_layers);
  for (LayerStats& s : out) {
    s.n_experts = h.n_experts;
    s.uses.assign(h.n_experts, 0);
    s.coact.assign(size_t(h.n_experts) * h.n_experts, 0.0);
  }
  const uint32_t n = h.n_experts;
  for (size_t li = 0; li < logs.size(); ++li) {
    // Previous token's selection per (request, layer), for neighbour pairs.
    std::map<std::pair<uint64_t, uint16_t>, std::pair<uint32_t, const RoutingRecord*>> prev;
    for (const RoutingRecord& r : logs[li].records) {
      LayerStats& s = out[r.layer];
      for (size_t a = 0; a < r.ids.size(); ++a) {
        ++s.uses[r.ids[a]];
        for (size_t b = a + 1; b < r.ids.size(); ++b) {
          s.coact[size_t(r.ids[a]) * n + r.ids[b]] += 1.0;
          s.coact[size_t(r.ids[b]) * n + r.ids[a]] += 1.0;
        }
      }
      s.token_sets.push_back(r.ids);
      if (opts.neighbour_weight > 0) {
        auto key = std::make_pair(r.request_id, r.layer);
        auto it = prev.find(key);
        if (it != prev.end() && it->second.first + 1 == r.position)
          for (uint16_t a : it->second.second->ids)
            for (uint16_t b : r.ids)
              if (a != b) {
                s.coact[size_t(a) * n + b] += opts.neighbour_weight;
                s.coact[size_t(b) * n + a] += opts.neighbour_weight;
              }
        prev[key] = {r.position, &r};
      }
    }
  }
  return out;
}

}  // namespace moestream::cluster
