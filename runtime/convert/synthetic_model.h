// Writes a complete packed model (model.json, dense.safetensors, experts/layer_NNN.bin) with
// seeded random weights for any ModelConfig: the subject of forward tests and cpu_decode.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>

#include "loader/format/model_config.h"

namespace moestream {

// Projection weights are uniform with standard deviation 1/sqrt(fan_in) (activations keep their
// scale through the layers), norm weights 1 +- 0.1, router logits O(1). Experts use
// cfg.expert_quant, dense tensors cfg.dense_dtype. `dir` is created; existing files are replaced.
// Experts are generated and encoded on `n_threads` threads (0 = all cores), streamed to disk a
// batch at a time: memory stays at the largest dense tensor plus a few experts.
// `progress` (optional) is called with (bytes written, synthetic_model_bytes(cfg)) after the dense
// file and after every batch of experts. `hash`: the expert files' slot checksums (XXH64: the
// files earlier builds wrote, for an A/B of the two hashes).
using SyntheticProgressFn = std::function<void(uint64_t done_bytes, uint64_t total_bytes)>;
void write_synthetic_model(const std::filesystem::path& dir, const ModelConfig& cfg, uint64_t seed,
                           int n_threads = 0, const SyntheticProgressFn& progress = {},
                           PayloadHash hash = PayloadHash::kXxh3);

// Bytes write_synthetic_model puts on disk for cfg (dense file, expert files; model.json aside):
// exact for the expert files, the dense file within its JSON header's few KiB.
uint64_t synthetic_model_bytes(const ModelConfig& cfg, PayloadHash hash = PayloadHash::kXxh3);
// The dense file's share of synthetic_model_bytes().
uint64_t synthetic_dense_bytes(const ModelConfig& cfg);

}  // namespace moestream
