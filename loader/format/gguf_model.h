// A GGUF model (loader/format/gguf_file.h) as the engine runs it in place: the ModelConfig its
// metadata and tensor shapes describe, the GGUF name of each dense tensor, and where every
// layer's experts lie inside the three stacked expert tensors.
//
// Architectures (general.architecture): "qwen3moe" (Qwen3-MoE), "olmoe" (OLMoE), "llama" with
// experts (Mixtral), "qwen2moe" and "glm4moe" (what those two add: gguf_arch_qwen2_glm4.h). Sizes come from the tensors (ffn_gate_exps is [D, F, E] with ne0 first) and
// must agree with the metadata that states them. An expert e of a layer is three slices:
// rows [e*F, (e+1)*F) of ffn_gate_exps and ffn_up_exps and rows [e*D, (e+1)*D) of ffn_down_exps,
// each contiguous in its tensor; their types may differ (mixed quantisations).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "loader/format/gguf_file.h"
#include "loader/format/model_config.h"

namespace moestream {

// One expert matrix of one layer inside a stacked expert tensor.
struct GgufExpertMatrix {
  uint32_t shard = 0;         // file index in GgufModelFiles::paths()
  uint64_t offset = 0;        // absolute file offset of expert 0's slice
  uint64_t expert_bytes = 0;  // bytes of one expert's slice; expert e starts at offset + e*expert_bytes
};

struct GgufLayerExperts {
  GgufExpertMatrix gate, up, down;
};

class GgufModel {
 public:
  // Opens and validates `path` (a .gguf, or any shard of a split set). FormatError naming the
  // file and the key or tensor for an unsupported architecture, a missing or misshapen tensor, a
  // type this build cannot compute, or metadata that contradicts the tensors.
  explicit GgufModel(const std::filesystem::path& path);

  const GgufModelFiles& files() const { return files_; }
  const ModelConfig& config() const { return cfg_; }
  // One per MoE layer (decoder layers first_k_dense_replace.. n_layers-1).
  const std::vector<GgufLayerExperts>& experts() const { return experts_; }
  // Q and K rows are stored in the interleaved-RoPE order llama.cpp's converter writes for
  // "llama"; the loader puts them back in the rotate-half order the engine computes.
  bool qk_rows_interleaved() const { return qk_interleaved_; }

  // The GGUF tensor of a dense tensor named as in dense.safetensors (model_config.h: "embed",
  // "layers.3.wq", ...); FormatError naming both names when the model has no such tensor.
  const GgufTensor& dense_tensor(const std::string& our_name) const;

  // Reads a tensor's bytes whole (dense tensors; IoError naming the file on a short read).
  std::vector<uint8_t> read_tensor(const GgufTensor& t) const;

 private:
  GgufModelFiles files_;
  ModelConfig cfg_;
  std::vector<GgufLayerExperts> experts_;
  bool qk_interleaved_ = false;
};

// True when `path` is a regular file that starts with the GGUF magic (what `infer -m` checks to
// tell a GGUF from a packed model directory).
bool is_gguf_file(const std::filesystem::path& path);

// The GGUF name of a dense tensor named as in dense.safetensors ("layers.3.wq" -> "blk.3.attn_q.weight").
std::string gguf_dense_name(const std::string& our_name);

}  // namespace moestream
