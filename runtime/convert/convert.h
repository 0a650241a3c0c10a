// Converts a Hugging Face MoE checkpoint directory into a packed moestream model directory
// (docs/format.md): model.json, dense.safetensors, experts/layer_NNN.bin, tokenizer files.
#pragma once

#include <filesystem>
#include <string>

#include "loader/format/model_config.h"

namespace moestream {

struct ConvertOptions {
  QuantType quant = QuantType::kQ4;  // expert encoding
  std::string dense_dtype;           // "f32" | "bf16" | "" (f32 for an f32 checkpoint, else bf16)
  bool progress = true;              // progress bar on stderr
  bool overwrite = false;            // replace an existing out_dir
  int threads = 0;                   // experts quantised in parallel (0: all cores); each holds one
};

// Reads `hf_dir` (config.json, model.safetensors or sharded with model.safetensors.index.json,
// tokenizer.json), writes into `out_dir.tmp.<pid>` one expert at a time and renames it to
// `out_dir` at the end. Throws ConfigError (unsupported architecture or setting, out_dir exists),
// FormatError (missing tensor, shape mismatch, bad file) naming what is wrong; the temp dir is
// removed on failure.
ModelConfig convert_model(const std::filesystem::path& hf_dir, const std::filesystem::path& out_dir,
                          const ConvertOptions& opts = {});

}  // namespace moestream
