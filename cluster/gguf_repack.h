// Clustering a GGUF model: its layout as cluster_experts prices it, routing logs checked against
// it, and the repack that writes a new GGUF with each layer's experts permuted. A GGUF is never
// rewritten in place; the new file is an equivalent model (llama.cpp loads it too).
//
// Expert-indexed tensors of layer N (all permuted together, along their last dim, which must be
// n_experts): blk.N.ffn_gate_inp.weight (the router, one row per expert), every blk.N.*_exps.*
// (stacked expert weights and biases: expert e is the e-th contiguous slice) and
// blk.N.exp_probs_b.bias. Every other tensor and all metadata are copied unchanged, except the
// moestream keys below, which record the permutation (docs/format.md#gguf):
//   moestream.expert_permutation.source_hash  u64: model_identity_hash of the original model
//   moestream.expert_permutation.N            array of u32 [n_experts], one per MoE layer N
//                                             position i of this file holds original expert perm[i]
// A second repack composes them (perm stays relative to the original), and a routing log recorded
// on the original maps onto this file (an original id o is position i where perm[i] == o).
// Split sets are refused (one file per model: a crash between shard renames would pair shards
// permuted differently).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cluster/cluster_inputs.h"

namespace moestream::cluster {

inline constexpr char kGgufPermutationKey[] = "moestream.expert_permutation.";  // + MoE layer number
inline constexpr char kGgufPermutationSourceKey[] = "moestream.expert_permutation.source_hash";

struct GgufLayout {
  PackedLayout packed;  // want (this file's identity, layers, experts), identity maps, geometry
  // [layer][position] = original expert id there (identity when the file was never repacked).
  std::vector<std::vector<uint32_t>> permutation;
  std::optional<uint64_t> source_hash;  // the original's identity, when this file is a repack
  // n_group of grouped routing (DeepSeek-V3): groups are runs of consecutive ids, which in a GGUF
  // are positions, so an order may only move experts inside their group.
  uint32_t routing_groups = 1;
};

// Reads the GGUF at `path` (GgufModel: a supported architecture, else FormatError) and its
// recorded permutation (FormatError when a key is malformed or not a permutation). The geometry
// prices an expert as one slot of its three slices' bytes (layer 0's): the engine reads the three
// slices as three ranges, so modelled ops are per matrix.
GgufLayout read_gguf_layout(const std::filesystem::path& path, const IoEngineOptions& reads);

// Routing logs for `layout`: a log recorded on this file is used as is; one recorded on the
// original model (source_hash) has its ids mapped to this file's positions; with `shape_only`
// any log of the same layers and experts is accepted as is. Else ConfigError naming both sides.
std::vector<RoutingLog> load_gguf_routing_logs(const std::vector<std::string>& paths, const GgufLayout& layout,
                                               const std::filesystem::path& model, bool shape_only,
                                               const std::function<void(const std::string&)>& notice = {});

struct GgufRepackOptions {
  std::function<void(int layer, int n_layers)> progress;  // after each layer's expert tensors
  // Test hook: called at "layer N written" and "before commit"; throwing from it simulates a crash.
  std::function<void(const std::string& point)> fault;
};

struct GgufRepackResult {
  uint64_t bytes_written = 0;
  uint32_t tensors_permuted = 0;
  uint32_t tensors_copied = 0;
};

// Writes `out` from `src` with position i of layer l holding the source's expert order[l][i]
// (order[l] a permutation of 0..n_experts-1, else ConfigError), and the composed permutation in
// the metadata. The source is validated again before copying (its size, every tensor inside it)
// and never written; `out` appears whole or not at all (gguf_writer.h). ConfigError for split
// input or out == src; FormatError naming the tensor for an expert tensor that cannot be permuted.
GgufRepackResult repack_gguf_experts(const std::filesystem::path& src, const std::filesystem::path& out,
                                     const std::vector<std::vector<uint32_t>>& order,
                                     const GgufRepackOptions& opts = {});

// The output positions of `slots` (logical -> physical, as slots_of gives): order[p] = e where
// slots[e] == p.
std::vector<uint32_t> order_of_slots(const std::vector<uint32_t>& slots);

// `slots` (slot of each expert) made group-preserving for `groups` equal runs of consecutive ids:
// each group's experts take its own slots, in the order `slots` gives them.
std::vector<uint32_t> slots_within_groups(const std::vector<uint32_t>& slots, uint32_t groups);

}  // namespace moestream::cluster
