// A tiny random Hugging Face MoE checkpoint (every architecture the converter takes) written as
// published checkpoints lay it out, for the converter's tests (convert_test, hf_config_test).
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loader/format/model_config.h"
#include "loader/format/safetensors.h"

namespace moestream::test {

// The message of the exception f throws ("<no exception>" when it throws none).
std::string message_of(const std::function<void()>& f);

struct Tensor {
  std::vector<int64_t> shape;
  std::vector<float> data;
};

// A tiny random HF model in the per-expert layout of published checkpoints. Values are rounded
// to bf16 so that saving in bf16, f16 or f32 stores the same numbers.
struct TinyHf {
  Arch arch;
  nlohmann::json config;
  std::map<std::string, Tensor> tensors;
  int64_t D, F, E, L, V, H, KV, hd;
};

TinyHf make_tiny(Arch arch, uint32_t seed = 1);

// gate, up, down of expert e in layer l, from the per-expert tensors.
std::array<const Tensor*, 3> expert_tensors(const TinyHf& m, int l, int e);

// The tensors as transformers v5 saves them: experts fused into [E, 2F, D] and [E, D, F], and
// Mixtral's block_sparse_moe renamed to mlp.
std::map<std::string, Tensor> fused_layout(const TinyHf& m);

// config.json, a stub tokenizer.json and the tensors in dtype over n_shards safetensors files
// (an index.json when there are several).
void save_hf(const std::filesystem::path& dir, const nlohmann::json& config,
             const std::map<std::string, Tensor>& tensors, DType dtype, int n_shards);
void save_tiny(const std::filesystem::path& dir, const TinyHf& m, DType dtype, bool fused, int n_shards);

// A make_tiny(Arch::kMinimaxM2) checkpoint as llama.cpp's converter writes a minimax-m2 GGUF (F32).
void write_minimax_m2_gguf(const TinyHf& m, const std::filesystem::path& path);

}  // namespace moestream::test
