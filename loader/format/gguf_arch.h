// The GGUF architectures this build reads, one table (kGgufArchs in gguf_arch.cpp) by
// general.architecture. Two kinds of entry:
//   - the llama-like layout GgufModel reads itself (gguf_model.cpp): "qwen3moe", "olmoe", "llama"
//     with experts (Mixtral), and "qwen2moe" / "glm4moe", whose extra metadata and tensors
//     gguf_arch_qwen2_glm4.cpp adds (the entry's `extend`);
//   - architectures whose tensors and metadata differ from it, with a reader of their own (`read`):
//     "gpt-oss" (gguf_arch_gpt_oss.cpp) and "deepseek2" (gguf_arch_deepseek2.cpp). Such a reader
//     turns the metadata into a validated ModelConfig, names the GGUF tensor of every dense tensor
//     the engine reads, places the experts, and lists the dense tensors that must be computed from
//     the stored ones (GgufDerivedSpec).
// Every architecture's dense tensor names are gguf_dense_name's. Facts about what llama.cpp's
// converter writes are in docs/format.md (GGUF input).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

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

struct GgufArch {
  std::string_view gguf_name;  // general.architecture
  // A reader of its own (the whole config, names and experts), or nullptr: GgufModel's llama-like
  // reader with the fields below.
  void (*read)(const GgufModelFiles& files, const std::string& where, GgufArchModel& out);
  Arch arch;
  bool norm_topk_prob;                // what the architecture's reference implementation does
  bool qk_interleaved;                // llama.cpp's converter permuted Q/K rows for interleaved RoPE
  std::string_view expert_width_key;  // the metadata key that states F, after "{arch}."
  // {arch}.rope.dimension_count may rotate part of each head (glm4moe: GLM-4.5 rotates 64 of
  // 128); otherwise it must be the whole head (gguf_arch_rope_dims).
  bool partial_rotary;
  // Adds to `j` (model.json fields, before validation) what the architecture states beyond the
  // llama-like reader's fields (`a` is "<architecture>."); FormatError naming the key for a value
  // this build does not compute. nullptr: nothing.
  void (*extend)(const GgufModelFiles& files, const std::string& where, const std::string& a, nlohmann::json& j);
};

// The entry for general.architecture `name`; FormatError naming `where` and the supported ones.
const GgufArch& find_gguf_arch(const std::string& where, const std::string& name);

// The GGUF name of a dense tensor named as in dense.safetensors, for a model of `arch`: the names
// llama.cpp gives every architecture that has the tensor, except where `arch` differs (glm4moe's
// and gpt-oss's post-attention norm, the router bias: exp_probs_b for glm4moe and deepseek2,
// ffn_gate_inp.bias for gpt-oss; deepseek2's MLA projections). ConfigError for a name with none.
std::string gguf_dense_name(Arch arch, const std::string& our_name);

void read_gguf_gpt_oss(const GgufModelFiles& files, const std::string& where, GgufArchModel& out);
void read_gguf_deepseek2(const GgufModelFiles& files, const std::string& where, GgufArchModel& out);
void extend_gguf_qwen2moe(const GgufModelFiles& files, const std::string& where, const std::string& a,
                          nlohmann::json& j);
void extend_gguf_glm4moe(const GgufModelFiles& files, const std::string& where, const std::string& a,
                         nlohmann::json& j);
void extend_gguf_minimax_m2(const GgufModelFiles& files, const std::string& where, const std::string& a,
                            nlohmann::json& j);
// For the llama-like reader: every dense tensor cfg's extra fields call for (attention biases,
// shared experts and their gate, the correction bias, the dense MLP of the leading layers) exists
// with its shape; FormatError naming the file and tensor otherwise.
void gguf_arch_check_extra_tensors(const GgufModelFiles& files, const std::string& where, const ModelConfig& cfg);

// Shared by the readers.
[[noreturn]] void gguf_arch_error(const std::string& where, const std::string& what);
// The tensor `name`, which must have exactly `dims` (ne0 first); FormatError naming it otherwise.
const GgufTensor& gguf_arch_shaped(const GgufModelFiles& f, const std::string& where, const std::string& name,
                                   const std::vector<uint64_t>& dims);
// The same with one of the shapes `allowed` (the first is named in the error).
const GgufTensor& gguf_arch_shaped_any(const GgufModelFiles& f, const std::string& where, const std::string& name,
                                       const std::vector<std::vector<uint64_t>>& allowed);
// FormatError for a layer without blk.N.ffn_gate_exps.weight, naming the fused gate_up form
// (ffn_gate_up_exps, which this build does not read) when that is what the file holds.
[[noreturn]] void gguf_arch_missing_experts(const GgufModelFiles& f, const std::string& where, int layer);
// The sizes the tensors state: hidden, expert width and expert count from
// blk.<first_moe>.ffn_gate_exps ([D, F, E]; gguf_arch_missing_experts when absent), vocabulary
// from token_embd ([D, V]); the metadata's <a>embedding_length, expert_count, <a><width_key>
// and vocab_size must agree where present.
struct GgufArchSizes {
  uint64_t hidden = 0, expert_width = 0, experts = 0, vocab = 0;
};
GgufArchSizes gguf_arch_sizes(const GgufModelFiles& f, const std::string& where, const std::string& a, int first_moe,
                              const std::string& width_key = "expert_feed_forward_length");
// FormatError when metadata `key` is present and differs from `want` (what the tensors say).
void gguf_arch_agree(const GgufMetadata& m, const std::string& where, const std::string& key, uint64_t want);
// FormatError naming `key` when present: a setting this build does not compute.
void gguf_arch_refuse(const GgufMetadata& m, const std::string& where, const std::string& key, const std::string& why);
// Expert e's slice of a stacked tensor of n_experts (its bytes must divide evenly).
GgufExpertMatrix gguf_arch_experts(const std::string& where, const GgufTensor& t, uint64_t n_experts);
// The rotated width {a}rope.dimension_count states (absent: the whole head), checked against the
// head width `head_dim` the tensors confirm: FormatError naming the key and both values unless it
// equals head_dim or, where `partial`, is an even width in [2, head_dim]; an odd head_dim is
// refused either way (RoPE turns pairs).
uint64_t gguf_arch_rope_dims(const GgufMetadata& m, const std::string& where, const std::string& a, uint64_t head_dim,
                             bool partial);
// FormatError when a tensor of the files names a block (blk.N.) at or past `block_count`, the
// value of metadata `key`: naming the key, its value, the tensor and how many blocks the tensors
// hold. Blocks the metadata counts but the file lacks are missing tensors, named where read.
void gguf_arch_check_block_count(const GgufModelFiles& f, const std::string& where, const std::string& key,
                                 uint64_t block_count);
// The blocks [n_layers, block_count) that `key` (nextn_predict_layers) makes MTP blocks, which
// are not read: each must hold a blk.N.nextn.* tensor, or no tensor at all (stripped). FormatError
// naming the key, its value and a decoder tensor of such a block otherwise (a decoder layer would
// be left out of the model).
void gguf_arch_check_mtp_blocks(const GgufModelFiles& f, const std::string& where, const std::string& key,
                                uint64_t n_layers, uint64_t block_count);
// A float value or array of float values (one per layer); empty when absent.
std::vector<double> gguf_arch_floats(const GgufMetadata& m, const std::string& key);
// YaRN / linear RoPE scaling from {arch}.rope.scaling.*; nullopt for none.
std::optional<RopeScaling> gguf_arch_rope_scaling(const GgufMetadata& m, const std::string& where, const std::string& a);
// The config through model.json's validation (FormatError saying the values came from the GGUF).
void gguf_arch_validate(ModelConfig& c, const std::string& where);

}  // namespace moestream
