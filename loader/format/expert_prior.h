// The expert prior file (`.prior`): each expert's share of its layer's demand in routing logs of
// other text, learned offline (cluster_experts --prior-out) and loaded by the foresight cache
// policy (loader/store/foresight_policy.h) to seed its reuse estimates.
//
// File layout (little-endian; floats IEEE-754 binary32):
//   offset  size  field
//   0       8     magic "MOEPRIOR"
//   8       4     version (kExpertPriorVersion = 1)
//   12      4     n_layers (1..65535)
//   16      4     n_experts (1..65535)
//   20      4     reserved, 0
//   24      8     model_hash: the routing logs' model identity (routing_log.h), 0 = not bound
//   32      8     tokens: routing records counted (informative)
//   40      4*n_layers*n_experts  share[layer][expert]: in [0, 1]; each layer's shares sum to 1
//                 (within 1e-3), or are all 0 (a layer the logs never routed)
//   end-8   8     XXH64 (seed 0) of every byte before it
// The file's size must be exactly 48 + 4 * n_layers * n_experts. Any other size, magic, version,
// reserved field, checksum or share is a FormatError naming the file and the field.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "loader/format/routing_log.h"

namespace moestream {

inline constexpr char kExpertPriorMagic[8] = {'M', 'O', 'E', 'P', 'R', 'I', 'O', 'R'};
inline constexpr uint32_t kExpertPriorVersion = 1;

struct ExpertPrior {
  uint32_t n_layers = 0, n_experts = 0;
  uint64_t model_hash = 0, tokens = 0;
  std::vector<float> share;  // by layer * n_experts + expert
};

// Counts every record's experts (all phases) over the logs, which must share one shape
// (ConfigError naming the log otherwise, or when there are none).
ExpertPrior expert_prior_from_logs(std::span<const RoutingLog> logs);

std::string encode_expert_prior(const ExpertPrior& p);
// `path` names the source in errors.
ExpertPrior decode_expert_prior(std::string_view bytes, const std::filesystem::path& path);
void write_expert_prior(const std::filesystem::path& path, const ExpertPrior& p);  // atomic
ExpertPrior read_expert_prior(const std::filesystem::path& path);  // IoError, FormatError

}  // namespace moestream
