// Converts a Hugging Face MoE checkpoint directory, or a GGUF file (or split set), into a packed
// moestream model directory (docs/format.md): model.json, dense.safetensors or dense.gguf,
// experts/layer_NNN.bin, tokenizer files.
#pragma once

#include <filesystem>
#include <string>

#include "loader/format/model_config.h"

namespace moestream {

struct ConvertOptions {
  QuantType quant = QuantType::kQ4;  // expert encoding
  // Dense weights of a Hugging Face import: "bf16" (the default, also for ""), "f32" (both in
  // dense.safetensors) or "q8" (ggml Q8_0 matrices in dense.gguf, dense_gguf.h). Must be empty for
  // a GGUF source, whose tensors keep their stored types.
  std::string dense_dtype;
  bool progress = true;              // progress bar on stderr
  bool overwrite = false;            // replace an existing out_dir
  int threads = 0;                   // experts quantised in parallel (0: all cores); each holds one
};

// Reads `hf_dir` (config.json, model.safetensors or sharded with model.safetensors.index.json,
// tokenizer.json), writes into `out_dir.tmp.<pid>` one expert at a time and renames it to
// `out_dir` at the end. Throws ConfigError (unsupported architecture or setting, out_dir exists),
// FormatError (missing tensor, shape mismatch, bad file) naming what is wrong; the temp dir is
// removed on failure.
// When `hf_dir` is a GGUF file (is_gguf_file; any shard of a split set), convert_gguf_model.
ModelConfig convert_model(const std::filesystem::path& hf_dir, const std::filesystem::path& out_dir,
                          const ConvertOptions& opts = {});

// A GGUF (single file or any shard of a split set) to a pack that keeps every tensor's ggml type:
// experts in version-2 expert files (a type per matrix and layer, slots as wide as the largest
// expert so that the engine's one read size fits every layer), dense tensors and the tokenizer
// metadata in dense.gguf, model.json version 2. opts.quant is not used; opts.dense_dtype must be
// empty (ConfigError). Same crash safety and errors as convert_model.
ModelConfig convert_gguf_model(const std::filesystem::path& gguf, const std::filesystem::path& out_dir,
                               const ConvertOptions& opts = {});

}  // namespace moestream
