// A GGUF model (loader/format/gguf_file.h) as the engine runs it in place: the ModelConfig its
// metadata and tensor shapes describe, the GGUF name of each dense tensor, and where every
// layer's experts lie inside the three stacked expert tensors.
//
// Architectures (general.architecture): "qwen3moe" (Qwen3-MoE), "olmoe" (OLMoE), "llama" with
// experts (Mixtral), "qwen2moe" and "glm4moe", read here with what each adds; "gpt-oss" and
// "deepseek2" (DeepSeek-V2/V3, Kimi K2) by readers of their own (gguf_arch.h, which has the table of
// architectures and gguf_dense_name). Sizes come from the tensors (ffn_gate_exps is [D, F, E]
// with ne0 first) and must agree with the metadata that states them. An expert e of a layer is three slices:
// rows [e*F, (e+1)*F) of ffn_gate_exps and ffn_up_exps and rows [e*D, (e+1)*D) of ffn_down_exps,
// each contiguous in its tensor; their types may differ (mixed quantisations).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
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
  // gpt-oss: f32 biases, one [F] / [F] / [D] slice per expert of ffn_{gate,up,down}_exps.bias.
  bool bias = false;
  GgufExpertMatrix gate_bias, up_bias, down_bias;
};

// A dense tensor the GGUF stores in another form than the engine computes (gguf_arch.h: DeepSeek's
// interleaved RoPE rows, its kv_b split into attn_k_b / attn_v_b, an absent correction bias).
struct GgufDerivedSpec {
  enum class Kind { kRopeRows, kKvB, kZeros } kind = Kind::kRopeRows;
  std::string src, src2;      // kRopeRows: src; kKvB: attn_k_b (src) and attn_v_b (src2)
  uint64_t group = 0, rope = 0;  // kRopeRows: rows in groups of `group`, whose last `rope` pair (2i, 2i+1)
  uint64_t heads = 0, nope = 0, v = 0, rank = 0;  // kKvB
  std::vector<uint64_t> dims;  // the result, ne0 first
};
struct GgufDerivedTensor {
  GgmlType type = GgmlType::kF32;
  std::vector<uint64_t> dims;  // ne0 first
  std::vector<uint8_t> bytes;
};
// Dequantises `rows` rows of `cols` values of a ggml type into float32 (the CPU kernels'; the
// format library has none).
using GgufDequantizer = std::function<void(GgmlType, const uint8_t* src, size_t rows, size_t cols, float* dst)>;

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

  // gpt-oss / deepseek2 (gguf_arch.h). A dense tensor that has no GGUF tensor of its own but is
  // computed from others, in the engine's form; nullopt for a tensor stored as it is used.
  std::optional<GgufDerivedTensor> derived_tensor(const std::string& our_name, const GgufDequantizer& deq) const;
  // The ggml type a dense tensor is computed in and its dims (ne0 first), derived or stored.
  GgmlType dense_type(const std::string& our_name) const;
  std::vector<uint64_t> dense_dims(const std::string& our_name) const;
  bool dense_is_derived(const std::string& our_name) const { return derived_.count(our_name) != 0; }
  // Every dense tensor by our names when an architecture reader named them (else empty: the
  // caller lists them from the config).
  std::vector<std::string> arch_dense_names() const;

 private:
  GgufModelFiles files_;
  ModelConfig cfg_;
  std::vector<GgufLayerExperts> experts_;
  bool qk_interleaved_ = false;
  // gpt-oss / deepseek2: our dense names -> GGUF names, and the derived tensors (gguf_arch.h).
  std::map<std::string, std::string> names_;
  std::map<std::string, GgufDerivedSpec> derived_;
};

// What a path given as a model is, from its type and first four bytes (nothing else is read, and
// a FIFO or device is never opened).
enum class ModelPathKind { kMissing, kDirectory, kGguf, kOther };
struct ModelPathProbe {
  ModelPathKind kind = ModelPathKind::kMissing;
  // For kOther, what it is instead, for messages: "a FIFO (pipe)", "a character device",
  // "an empty file", "a 3-byte file", "a file that starts 0x7f454c46 (a GGUF starts "GGUF")".
  std::string what;
};
// IoError naming the path, the offset and strerror when it exists but cannot be examined: stat
// fails other than for a missing path, or a regular file cannot be opened or its first bytes
// read (EIO, EACCES): its kind is then unknown, and saying "not a GGUF" would hide the cause.
ModelPathProbe probe_model_path(const std::filesystem::path& path);

// True when `path` is a regular file that starts with the GGUF magic (what `infer -m` checks to
// tell a GGUF from a packed model directory); probe_model_path's IoError when that cannot be read.
bool is_gguf_file(const std::filesystem::path& path);

}  // namespace moestream
