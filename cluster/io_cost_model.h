// The I/O cost model the orderings are judged by: for each token, the physical slots its experts
// sit in, turned into reads by the engine's own planner (io::plan_file_reads: its coalescing and
// read caps), priced by latency and bandwidth.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <vector>

#include "cluster/coactivation.h"
#include "loader/io/io_engine.h"
#include "loader/io/io_plan.h"

namespace moestream::cluster {

// Where slots sit in a layer file, and how the engine reads them.
struct SlotGeometry {
  uint64_t data_offset = 4096;
  uint64_t expert_bytes = 0;
  uint64_t expert_stride = 0;
  // The engine's coalescing gap and read caps (io::plan_options of its options; default: the
  // engine's defaults), and whether it reads the layer files with O_DIRECT (block-aligned
  // reads, capped at reads.direct_max_read_bytes).
  io::PlanOptions reads = io::plan_options(IoEngineOptions{});
  bool direct = false;
};

// A geometry read as an engine with options `io` reads (coalesce, gap, caps, direct).
SlotGeometry read_by(SlotGeometry g, const IoEngineOptions& io);

// The device's prices are an IoProfile (loader/io/io_profile.h): the layout is priced with its
// op_latency_us and bandwidth_gbps; its merge rule comes in through SlotGeometry::reads.

struct ReadCost {
  uint64_t ops = 0;    // reads the engine's planner issues
  uint64_t bytes = 0;  // bytes those reads ask for (gaps read through and O_DIRECT padding included)
};

// Reads for one token whose experts sit in `slots` (any order, at most 64; sorted here), as
// io::plan_file_reads plans them: the same count and bytes as the engine's extents.
ReadCost token_read_cost(std::span<const uint32_t> slots, const SlotGeometry& g);

struct CostSummary {
  double tokens = 0;
  double ops_per_token = 0;
  double bytes_per_token = 0;
  double modelled_us_per_token = 0;  // ops * serial_op_us + bytes / bandwidth
};

// Cost of a layer's tokens under `slot_of` (logical -> physical).
CostSummary layer_cost(const std::vector<ExpertSet>& tokens, std::span<const uint32_t> slot_of,
                       const SlotGeometry& g, const IoProfile& p);

// Sum over layers, per token (a token's cost is the sum of its layers' costs).
CostSummary model_cost(const std::vector<LayerStats>& layers,
                       const std::vector<std::vector<uint32_t>>& slot_of, const SlotGeometry& g,
                       const IoProfile& p);

}  // namespace moestream::cluster
