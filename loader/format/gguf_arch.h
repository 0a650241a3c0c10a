// The GGUF architectures whose tensors and metadata differ from the llama-like layout GgufModel
// reads itself (gguf_model.cpp): "gpt-oss" (gguf_arch_gpt_oss.cpp) and "deepseek2"
// (gguf_arch_deepseek2.cpp). Each reader turns the metadata into a validated ModelConfig, names
// the GGUF tensor of every dense tensor the engine reads, places the experts, and lists the dense
// tensors that must be computed from the stored ones (GgufDerivedSpec). Facts about what
// llama.cpp's converter writes are in docs/format.md (GGUF input).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "loader/format/gguf_file.h"
#include "loader/format/gguf_model.h"
#include "loader/format/model_config.h"

namespace moestream {

struct GgufArchModel {
  ModelConfig cfg;                            // validated; GgufModel sets the GGUF-specific fields
  std::vector<GgufLayerExperts> experts;      // per MoE layer
  std::map<std::string, std::string> names;   // our dense name -> GGUF tensor name
  std::map<std::string, GgufDerivedSpec> derived;
};

// Reads `files` when general.architecture is one of these readers' (true), else false.
bool read_gguf_arch(const GgufModelFiles& files, const std::string& where, const std::string& arch, GgufArchModel& out);

void read_gguf_gpt_oss(const GgufModelFiles& files, const std::string& where, GgufArchModel& out);
void read_gguf_deepseek2(const GgufModelFiles& files, const std::string& where, GgufArchModel& out);

// Shared by the readers.
[[noreturn]] void gguf_arch_error(const std::string& where, const std::string& what);
// The tensor `name`, which must have exactly `dims` (ne0 first); FormatError naming it otherwise.
const GgufTensor& gguf_arch_shaped(const GgufModelFiles& f, const std::string& where, const std::string& name,
                                   const std::vector<uint64_t>& dims);
// FormatError for a layer without blk.N.ffn_gate_exps.weight, naming the fused gate_up form
// (ffn_gate_up_exps, which this build does not read) when that is what the file holds.
[[noreturn]] void gguf_arch_missing_experts(const GgufModelFiles& f, const std::string& where, int layer);
// FormatError when metadata `key` is present and differs from `want` (what the tensors say).
void gguf_arch_agree(const GgufMetadata& m, const std::string& where, const std::string& key, uint64_t want);
// FormatError naming `key` when present: a setting this build does not compute.
void gguf_arch_refuse(const GgufMetadata& m, const std::string& where, const std::string& key, const std::string& why);
// Expert e's slice of a stacked tensor of n_experts (its bytes must divide evenly).
GgufExpertMatrix gguf_arch_experts(const std::string& where, const GgufTensor& t, uint64_t n_experts);
// A float value or array of float values (one per layer); empty when absent.
std::vector<double> gguf_arch_floats(const GgufMetadata& m, const std::string& key);
// YaRN / linear RoPE scaling from {arch}.rope.scaling.*; nullopt for none.
std::optional<RopeScaling> gguf_arch_rope_scaling(const GgufMetadata& m, const std::string& where, const std::string& a);
// The config through model.json's validation (FormatError saying the values came from the GGUF).
void gguf_arch_validate(ModelConfig& c, const std::string& where);

}  // namespace moestream
