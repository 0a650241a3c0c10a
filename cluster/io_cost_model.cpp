// Implementation of cluster/io_cost_model.h. Reads are planned by io::plan_file_reads, the
// function io::plan_reads builds the engine's extents from; cluster_test checks the two agree.
#include "cluster/io_cost_model.h"

#include <algorithm>

#include "common/error.h"

namespace moestream::cluster {

SlotGeometry read_by(SlotGeometry g, const IoEngineOptions& io) {
  g.reads = io::plan_options(io);
  g.direct = io.direct;
  return g;
}

ReadCost token_read_cost(std::span<const uint32_t> slots_in, const SlotGeometry& g) {
  const size_t n = slots_in.size();
  MOE_ASSERT(g.expert_bytes > 0, "slot geometry without expert bytes");
  // Sized by the token's top-k (a log may hold up to n_experts per token), reused across calls:
  // this runs once per token per priced move.
  thread_local std::vector<uint32_t> slots;
  thread_local std::vector<io::ByteRange> ranges;
  slots.assign(slots_in.begin(), slots_in.end());
  std::sort(slots.begin(), slots.end());
  ranges.resize(n);
  for (size_t i = 0; i < n; ++i) ranges[i] = {g.data_offset + uint64_t(slots[i]) * g.expert_stride, g.expert_bytes};
  ReadCost c;
  io::plan_file_reads(std::span<const io::ByteRange>(ranges.data(), n), g.direct, g.reads,
                      [&c](const io::PlannedRead& r) {
                        ++c.ops;
                        c.bytes += r.length;
                      });
  return c;
}

CostSummary layer_cost(const std::vector<ExpertSet>& tokens, std::span<const uint32_t> slot_of,
                       const SlotGeometry& g, const IoProfile& p) {
  CostSummary s;
  uint64_t ops = 0, bytes = 0;
  std::vector<uint32_t> slots;
  for (const ExpertSet& t : tokens) {
    slots.resize(t.size());
    for (size_t i = 0; i < t.size(); ++i) slots[i] = slot_of[t[i]];
    ReadCost c = token_read_cost(slots, g);
    ops += c.ops;
    bytes += c.bytes;
  }
  s.tokens = double(tokens.size());
  if (tokens.empty()) return s;
  s.ops_per_token = double(ops) / s.tokens;
  s.bytes_per_token = double(bytes) / s.tokens;
  s.modelled_us_per_token = s.ops_per_token * serial_op_us(p) + s.bytes_per_token / (p.bandwidth_gbps * 1e3);
  return s;
}

CostSummary model_cost(const std::vector<LayerStats>& layers,
                       const std::vector<std::vector<uint32_t>>& slot_of, const SlotGeometry& g,
                       const IoProfile& p) {
  CostSummary total;
  for (size_t l = 0; l < layers.size(); ++l) {
    CostSummary s = layer_cost(layers[l].token_sets, slot_of[l], g, p);
    total.tokens = std::max(total.tokens, s.tokens);
    total.ops_per_token += s.ops_per_token;
    total.bytes_per_token += s.bytes_per_token;
    total.modelled_us_per_token += s.modelled_us_per_token;
  }
  return total;
}

}  // namespace moestream::cluster
