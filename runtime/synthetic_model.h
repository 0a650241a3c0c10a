// Writes a complete packed model (model.json, dense.safetensors, experts/layer_NNN.bin) with
// seeded random weights for any ModelConfig: the subject of forward tests and cpu_decode.
#pragma once

#include <cstdint>
#include <filesystem>

#include "runtime/model_config.h"

namespace moestream {

// Projection weights are uniform with standard deviation 1/sqrt(fan_in) (activations keep their
// scale through the layers), norm weights 1 +- 0.1, router logits O(1). Experts use
// cfg.expert_quant, dense tensors cfg.dense_dtype. `dir` is created; existing files are replaced.
// Experts are generated and encoded on `n_threads` threads (0 = all cores).
void write_synthetic_model(const std::filesystem::path& dir, const ModelConfig& cfg, uint64_t seed,
                           int n_threads = 0);

}  // namespace moestream
