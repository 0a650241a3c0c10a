// Implementation of runtime/convert/convert.h: HF tensor names per architecture and expert layout
// (per-expert tensors of published checkpoints, or the fused 3-D tensors of transformers v5),
// dense tensors renamed to model_config.h's canonical names, experts quantised one at a time.
#include "runtime/convert/convert.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/option_ref.h"
#include "common/thread_pool.h"
#include "common/file_util.h"
#include "common/mapping_guard.h"
#include "loader/format/dense_checksum.h"
#include "loader/format/expert_file_writer.h"
#include "loader/format/gguf_model.h"
#include "loader/format/gguf_writer.h"
#include "runtime/convert/convert_gpt_oss.h"
#include "runtime/convert/convert_output.h"
#include "runtime/convert/dense_gguf.h"
#include "runtime/convert/hf_checkpoint.h"
#include "runtime/convert/hf_config.h"
#include "kernels/cpu/quant.h"
#include "loader/format/safetensors.h"

namespace moestream {
namespace {

namespace fs = std::filesystem;

std::string layer_prefix(int l) { return "model.layers." + std::to_string(l) + "."; }

// Where one layer's experts come from.
struct ExpertSource {
  bool fused = false;
  std::string gate, up, down;  // per-expert: name patterns with "{e}"; fused: gate_up and down
};

std::string expand(const std::string& pattern, int e) {
  std::string s = pattern;
  size_t p = s.find("{e}");
  return s.replace(p, 3, std::to_string(e));
}

ExpertSource find_experts(const HfCheckpoint& ck, const ModelConfig& c, int l) {
  const std::string p = layer_prefix(l);
  std::vector<ExpertSource> candidates;
  if (c.arch == Arch::kMixtral || c.arch == Arch::kMinimaxM2) {  // released: w1 gate, w3 up, w2 down
    candidates.push_back({false, p + "block_sparse_moe.experts.{e}.w1.weight",
                          p + "block_sparse_moe.experts.{e}.w3.weight",
                          p + "block_sparse_moe.experts.{e}.w2.weight"});
    candidates.push_back({true, p + "block_sparse_moe.experts.gate_up_proj", "",
                          p + "block_sparse_moe.experts.down_proj"});
  } else {
    candidates.push_back({false, p + "mlp.experts.{e}.gate_proj.weight", p + "mlp.experts.{e}.up_proj.weight",
                          p + "mlp.experts.{e}.down_proj.weight"});
  }
  candidates.push_back({true, p + "mlp.experts.gate_up_proj", "", p + "mlp.experts.down_proj"});
  for (const ExpertSource& s : candidates)
    if (ck.contains(s.fused ? s.gate : expand(s.gate, 0))) return s;
  const ExpertSource& first = candidates.front();
  throw FormatError("missing tensor '" + expand(first.gate, 0) + "' (nor the fused '" +
                    candidates.back().gate + "'): no experts found for layer " + std::to_string(l));
}

// The sigmoid router's correction bias: MiniMax-M2's releases keep it beside the gate, in
// block_sparse_moe (transformers' fused layout: mlp.e_score_correction_bias); GLM-4.5 and
// DeepSeek-V3 inside it.
std::string router_bias_name(const HfCheckpoint& ck, const ModelConfig& c, int l) {
  const std::string p = layer_prefix(l);
  if (c.arch != Arch::kMinimaxM2) return p + "mlp.gate.e_score_correction_bias";
  return ck.contains(p + "mlp.e_score_correction_bias") ? p + "mlp.e_score_correction_bias"
                                                         : p + "block_sparse_moe.e_score_correction_bias";
}

std::string router_name(const HfCheckpoint& ck, const ModelConfig& c, int l) {
  const std::string p = layer_prefix(l);
  if ((c.arch == Arch::kMixtral || c.arch == Arch::kMinimaxM2) && ck.contains(p + "block_sparse_moe.gate.weight"))
    return p + "block_sparse_moe.gate.weight";
  if (c.arch == Arch::kGptOss) return p + "mlp.router.weight";
  return p + "mlp.gate.weight";
}

// GLM-4.5's multi-token-prediction layers (num_nextn_predict_layers) follow the last decoder
// layer, model.layers.{n_layers}...: only speculative decoding uses them, so they are not converted.
bool is_mtp_layer_tensor(const std::string& name, int n_layers) {
  const size_t start = std::string("model.layers.").size(), dot = name.find('.', start);
  if (dot == std::string::npos || dot == start || dot - start > 6) return false;
  int layer = 0;
  for (size_t i = start; i < dot; ++i) {
    if (name[i] < '0' || name[i] > '9') return false;
    layer = layer * 10 + (name[i] - '0');
  }
  return layer >= n_layers;
}

struct DenseTensor {
  std::string out, in;
  std::vector<int64_t> shape;
  bool router = false;  // a matrix kept in float (routing decisions on exact logits)
  bool f32 = false;     // stored float32 whatever the dense dtype (the sigmoid router's bias:
                        // bf16 would move its selections)
  // DeepSeek-V3: rows in groups of rope_group whose last rope_rows rows (the RoPE part) are
  // de-interleaved (read_dense); 0 = as stored.
  int64_t rope_group = 0, rope_rows = 0;
};

// Biases and shared experts change the maths: the config check catches most, this catches
// checkpoints whose config does not say so. Those the model reads (`dense`) are expected.
void reject_unsupported_tensors(const HfCheckpoint& ck, const ModelConfig& c, const std::vector<DenseTensor>& dense) {
  std::set<std::string> read;
  for (const DenseTensor& t : dense) read.insert(t.in);
  for (const std::string& n : ck.names()) {
    if (n.rfind("model.layers.", 0) != 0 || read.count(n)) continue;
    if (HfCheckpoint::is_fp8_scale(n)) continue;  // read with its FP8 weight (DeepSeek-V3)
    if ((c.arch == Arch::kGlm4Moe || c.arch == Arch::kDeepseekV3) && is_mtp_layer_tensor(n, c.n_layers)) continue;
    if (n.find("shared_expert") != std::string::npos)
      throw ConfigError("tensor '" + n + "': shared experts are not supported by moestream for this architecture");
    if (n.size() > 5 && n.compare(n.size() - 5, 5, ".bias") == 0)
      throw ConfigError("tensor '" + n + "': biases are not supported by moestream (but Qwen2-MoE's Q/K/V ones)");
  }
}

// DeepSeek-V3's MLA projections (names in loader/format/model_config.h). With rope_interleave
// (transformers' default for DeepSeek-V3) the RoPE rows pair (2i, 2i+1); they are stored
// de-interleaved so the engine's rotate-half RoPE applies.
void append_mla_tensors(const ModelConfig& c, const std::string& p, const std::string& o, bool rope_interleave,
                        std::vector<DenseTensor>& t) {
  const int64_t D = c.hidden_size, H = c.n_heads, C = c.kv_lora_rank, r = c.qk_rope_head_dim;
  const int64_t qk = c.qk_nope_head_dim + r, rr = rope_interleave ? r : 0;
  if (c.q_lora_rank > 0) {
    t.push_back({o + "wq_a", p + "self_attn.q_a_proj.weight", {c.q_lora_rank, D}});
    t.push_back({o + "q_a_norm", p + "self_attn.q_a_layernorm.weight", {c.q_lora_rank}});
    t.push_back({o + "wq_b", p + "self_attn.q_b_proj.weight", {H * qk, c.q_lora_rank}, false, false, qk, rr});
  } else {
    t.push_back({o + "wq", p + "self_attn.q_proj.weight", {H * qk, D}, false, false, qk, rr});
  }
  t.push_back({o + "wkv_a", p + "self_attn.kv_a_proj_with_mqa.weight", {C + r, D}, false, false, C + r, rr});
  t.push_back({o + "kv_a_norm", p + "self_attn.kv_a_layernorm.weight", {C}});
  t.push_back({o + "wkv_b", p + "self_attn.kv_b_proj.weight", {H * (c.qk_nope_head_dim + c.v_head_dim), C}});
  t.push_back({o + "wo", p + "self_attn.o_proj.weight", {D, H * c.v_head_dim}});
}

// Reads a dense tensor as float32 (FP8 dequantised) with its RoPE rows de-interleaved when asked.
std::vector<float> read_dense(const HfCheckpoint& ck, const DenseTensor& t) {
  std::vector<float> v = ck.read(t.in, t.shape);
  ck.release(t.in, 0, v.size());
  if (t.rope_rows > 0) {
    const size_t cols = size_t(t.shape.back()), g = size_t(t.rope_group), r = size_t(t.rope_rows);
    std::vector<float> tmp(r * cols);
    for (size_t base = g - r; base + r <= size_t(t.shape[0]); base += g) {
      float* rows = v.data() + base * cols;
      for (size_t i = 0; i < r / 2; ++i) {
        std::copy_n(rows + (2 * i) * cols, cols, tmp.data() + i * cols);
        std::copy_n(rows + (2 * i + 1) * cols, cols, tmp.data() + (r / 2 + i) * cols);
      }
      std::copy(tmp.begin(), tmp.end(), rows);
    }
  }
  return v;
}

std::vector<DenseTensor> dense_tensors(const HfCheckpoint& ck, const ModelConfig& c, bool rope_interleave) {
  const int64_t V = c.vocab_size, D = c.hidden_size, H = c.n_heads, KV = c.n_kv_heads, hd = c.head_dim;
  std::vector<DenseTensor> t;
  t.push_back({"embed", "model.embed_tokens.weight", {V, D}});
  t.push_back({"final_norm", "model.norm.weight", {D}});
  if (!c.tie_word_embeddings) t.push_back({"lm_head", "lm_head.weight", {V, D}});
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = layer_prefix(l), o = "layers." + std::to_string(l) + ".";
    t.push_back({o + "attn_norm", p + "input_layernorm.weight", {D}});
    if (c.has_mla()) {
      append_mla_tensors(c, p, o, rope_interleave, t);
    } else {
      t.push_back({o + "wq", p + "self_attn.q_proj.weight", {H * hd, D}});
      t.push_back({o + "wk", p + "self_attn.k_proj.weight", {KV * hd, D}});
      t.push_back({o + "wv", p + "self_attn.v_proj.weight", {KV * hd, D}});
      t.push_back({o + "wo", p + "self_attn.o_proj.weight", {D, H * hd}});
    }
    if (c.qkv_bias) {
      t.push_back({o + "bq", p + "self_attn.q_proj.bias", {H * hd}});
      t.push_back({o + "bk", p + "self_attn.k_proj.bias", {KV * hd}});
      t.push_back({o + "bv", p + "self_attn.v_proj.bias", {KV * hd}});
    }
    if (c.qk_norm == QkNorm::kPerHead) {
      t.push_back({o + "q_norm", p + "self_attn.q_norm.weight", {hd}});
      t.push_back({o + "k_norm", p + "self_attn.k_norm.weight", {hd}});
    } else if (c.qk_norm == QkNorm::kFull) {
      t.push_back({o + "q_norm", p + "self_attn.q_norm.weight", {H * hd}});
      t.push_back({o + "k_norm", p + "self_attn.k_norm.weight", {KV * hd}});
    }
    if (c.o_bias) t.push_back({o + "bo", p + "self_attn.o_proj.bias", {D}});  // gpt-oss
    if (c.attention_sinks) t.push_back({o + "sinks", p + "self_attn.sinks", {H}});
    t.push_back({o + "ffn_norm", p + "post_attention_layernorm.weight", {D}});
    if (!c.is_moe_layer(l)) {  // GLM-4.5 / DeepSeek-V3's first layers: a dense MLP
      const int64_t I = c.intermediate_size;
      t.push_back({o + "mlp_gate", p + "mlp.gate_proj.weight", {I, D}});
      t.push_back({o + "mlp_up", p + "mlp.up_proj.weight", {I, D}});
      t.push_back({o + "mlp_down", p + "mlp.down_proj.weight", {D, I}});
      continue;
    }
    t.push_back({o + "router", router_name(ck, c, l), {c.n_experts, D}, true});
    if (c.router_scoring == RouterScoring::kSigmoid)  // float, as the router
      t.push_back({o + "router_bias", router_bias_name(ck, c, l), {c.n_experts}, true, true});
    if (c.has_shared_expert() && !c.shared_expert_gated) {  // GLM-4.5: n_shared_experts, no gate
      const int64_t fs = c.shared_expert_intermediate_size;
      t.push_back({o + "shared_gate", p + "mlp.shared_experts.gate_proj.weight", {fs, D}});
      t.push_back({o + "shared_up", p + "mlp.shared_experts.up_proj.weight", {fs, D}});
      t.push_back({o + "shared_down", p + "mlp.shared_experts.down_proj.weight", {D, fs}});
    } else if (c.has_shared_expert()) {
      const int64_t fs = c.shared_expert_intermediate_size;
      t.push_back({o + "shared_gate", p + "mlp.shared_expert.gate_proj.weight", {fs, D}});
      t.push_back({o + "shared_up", p + "mlp.shared_expert.up_proj.weight", {fs, D}});
      t.push_back({o + "shared_down", p + "mlp.shared_expert.down_proj.weight", {D, fs}});
      // One row: kept in float as the router (a gate from exact logits).
      t.push_back({o + "shared_expert_gate", p + "mlp.shared_expert_gate.weight", {1, D}, true});
    }
    if (c.router_bias) t.push_back({o + "router_bias", p + "mlp.router.bias", {c.n_experts}});
  }
  return t;
}

// quantization_config of an FP8 checkpoint: {quant_method: "fp8", fmt: "e4m3", weight_block_size:
// [rows, cols]}; other methods are not read.
Fp8BlockSize fp8_block_size(const nlohmann::json& q, const std::string& where) {
  const std::string method = q.value("quant_method", std::string());
  if (method != "fp8")
    throw ConfigError(where + ": quantization_config.quant_method '" + method + "' is not supported (only fp8)");
  // MiniMax-M2's releases spell the format by its torch dtype.
  if (const std::string fmt = q.value("fmt", std::string("e4m3")); fmt != "e4m3" && fmt != "float8_e4m3fn")
    throw ConfigError(where + ": quantization_config.fmt '" + fmt + "' is not supported (only e4m3, float8_e4m3fn)");
  Fp8BlockSize b;
  if (const auto bs = q.find("weight_block_size"); bs != q.end() && !bs->is_null()) {
    if (!bs->is_array() || bs->size() != 2 || !(*bs)[0].is_number_integer() || !(*bs)[1].is_number_integer() ||
        (*bs)[0].get<long long>() <= 0 || (*bs)[1].get<long long>() <= 0 || (*bs)[0].get<long long>() > (1 << 20) ||
        (*bs)[1].get<long long>() > (1 << 20))
      throw FormatError(where + ": quantization_config.weight_block_size must be two positive integers, got " + bs->dump());
    b.rows = (*bs)[0].get<int>();
    b.cols = (*bs)[1].get<int>();
  }
  return b;
}

void copy_if_present(const fs::path& from, const fs::path& to, std::string& field) {
  if (!fs::exists(from)) return;
  write_file_atomic(to, read_file(from));
  field = to.filename().string();
}

// Newer checkpoints (gpt-oss) ship their chat template as chat_template.jinja beside a
// tokenizer_config.json without one: it joins the copied config, where the tokenizer loader reads it.
void merge_chat_template_file(const fs::path& hf_dir, const fs::path& out, std::string& config_field) {
  const fs::path jinja = hf_dir / "chat_template.jinja";
  if (!fs::is_regular_file(jinja)) return;
  nlohmann::json cfg = nlohmann::json::object();
  if (!config_field.empty()) {
    try {
      cfg = nlohmann::json::parse(read_file(out / config_field));
    } catch (const nlohmann::json::exception& e) {
      throw FormatError((hf_dir / config_field).string() + ": invalid JSON: " + e.what());
    }
    if (!cfg.is_object()) throw FormatError((hf_dir / config_field).string() + ": expected a JSON object");
    if (cfg.contains("chat_template")) return;  // the config's own template wins, as in transformers
  }
  cfg["chat_template"] = read_file(jinja);
  write_file_atomic(out / "tokenizer_config.json", cfg.dump(2) + "\n");
  config_field = "tokenizer_config.json";
}

// DeepSeek-V2/V3's moe_layer_freq (sweep-a): transformers ignores it (every layer from
// first_k_dense_replace is a MoE layer), and so does moestream when the checkpoint agrees; one laid
// out by the original remote code (dense MLPs between the MoE layers) is refused naming the field.
void check_moe_layer_freq(const nlohmann::json& hf, const HfCheckpoint& ck, const ModelConfig& c,
                          const std::string& where) {
  const auto f = hf.find("moe_layer_freq");
  if (!c.has_mla() || f == hf.end() || f->is_null() || (f->is_number_integer() && *f == 1)) return;
  for (int l = c.first_k_dense_replace; l < c.n_layers; ++l)
    if (!ck.contains(layer_prefix(l) + "mlp.gate.weight"))
      throw ConfigError(where + ": 'moe_layer_freq' " + f->dump() + " with a dense layer " + std::to_string(l) +
                        " (no mlp.gate.weight) is not supported by moestream: as transformers, it makes every "
                        "layer from first_k_dense_replace a MoE layer");
}

// DeepSeek-V3's rope_interleave: absent means true (DeepseekV3Config's default), null false (transformers
// tests it for truth) (sweep-a).
bool rope_interleave_of(const nlohmann::json& hf, const std::string& where) {
  const auto r = hf.find("rope_interleave");
  if (r == hf.end()) return true;
  if (r->is_null()) return false;
  if (!r->is_boolean()) throw FormatError(where + ": 'rope_interleave' must be true, false or null, got " + r->dump());
  return r->get<bool>();
}

}  // namespace

ModelConfig convert_model(const fs::path& hf_dir, const fs::path& out_dir, const ConvertOptions& opts) {
  if (is_gguf_file(hf_dir)) return convert_gguf_model(hf_dir, out_dir, opts);
  const fs::path config_path = hf_dir / "config.json";
  nlohmann::json hf;
  try {
    hf = nlohmann::json::parse(read_file(config_path));
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(config_path.string() + ": invalid JSON: " + e.what());
  }
  ModelConfig c = model_config_from_hf(hf, config_path.string());
  if (fs::exists(out_dir) && !opts.overwrite)
    throw ConfigError("output directory " + out_dir.string() + " already exists (pass " + option_ref("force") + " to replace it)");

  const MappingOwnerScope owner(new_mapping_owner());  // publish_output checks the sources' mappings
  HfCheckpoint ck(hf_dir);
  const DType src_dtype = ck.main_dtype();
  const std::string dense_quant = opts.dense_dtype.empty() ? "bf16" : opts.dense_dtype;
  if (dense_quant != "f32" && dense_quant != "bf16" && dense_quant != "q8")
    throw ConfigError("dense quant '" + dense_quant + "' (expected bf16, q8 or f32)");
  // q8 needs ggml's block type: the dense file becomes a dense.gguf (model.json version 2).
  c.dense_dtype = dense_quant == "q8" ? "gguf" : dense_quant;
  if (dense_quant == "q8") c.dense_file = kDenseGgufFile;
  c.expert_quant = opts.quant;

  // Resolve every name and shape before writing anything, so a bad checkpoint fails fast.
  // DeepSeek-V3: RoPE pairs interleaved (transformers' default true) and FP8 block sizes.
  // DeepSeek-V2 always rotates interleaved pairs (complex RoPE); V3 as rope_interleave says.
  const bool rope_interleave =
      c.has_mla() && (c.arch == Arch::kDeepseekV2 || rope_interleave_of(hf, config_path.string()));
  // gpt-oss's released MXFP4 experts (quant_method "mxfp4") are read from their *_blocks tensors
  // (convert_gpt_oss.h); any other method is FP8's or refused there.
  if (const auto q = hf.find("quantization_config"); q != hf.end() && q->is_object() &&
      !(c.arch == Arch::kGptOss && q->value("quant_method", std::string()) == "mxfp4"))
    ck.set_fp8_block(fp8_block_size(*q, config_path.string()));
  check_moe_layer_freq(hf, ck, c, config_path.string());
  std::vector<DenseTensor> dense = dense_tensors(ck, c, rope_interleave);
  reject_unsupported_tensors(ck, c, dense);
  for (const DenseTensor& t : dense) ck.file(t.in).check_shape(t.in, t.shape);
  std::vector<ExpertSource> sources;
  const int64_t D = c.hidden_size, F = c.moe_intermediate_size, E = c.n_experts;
  const bool gpt_oss = c.arch == Arch::kGptOss;
  const bool mxfp4 = gpt_oss && check_gpt_oss_experts(ck, c);
  if (mxfp4) c.expert_quant = ggml_quant(GgmlType::kMXFP4);  // kept as stored, never requantised
  // Expert files number the MoE layers (model_config.h): file m holds decoder layer first_k + m.
  for (int l = 0; l < c.n_moe_layers() && !gpt_oss; ++l) {
    ExpertSource s = find_experts(ck, c, l + c.first_k_dense_replace);
    if (s.fused) {
      ck.file(s.gate).check_shape(s.gate, {E, 2 * F, D});
      ck.file(s.down).check_shape(s.down, {E, D, F});
    } else {
      for (int e = 0; e < E; ++e) {
        ck.file(expand(s.gate, e)).check_shape(expand(s.gate, e), {F, D});
        ck.file(expand(s.up, e)).check_shape(expand(s.up, e), {F, D});
        ck.file(expand(s.down, e)).check_shape(expand(s.down, e), {D, F});
      }
    }
    sources.push_back(s);
  }

  TempOutput tmp(make_temp_output(out_dir, c.experts_dir));
  ProgressBar bar(opts.progress, dense.size() + uint64_t(c.n_moe_layers()) * c.n_experts);
  uint64_t done = 0;

  if (dense_quant == "q8") {
    std::vector<GgufTensorSpec> specs;
    for (const DenseTensor& t : dense) {
      const uint64_t cols = uint64_t(t.shape.back()), rows = t.shape.size() == 2 ? uint64_t(t.shape[0]) : 1;
      specs.push_back({t.out, dense_q8_type(t.shape.size() == 2 && !t.router, cols),
                       t.shape.size() == 2 ? std::vector<uint64_t>{cols, rows} : std::vector<uint64_t>{cols}});
    }
    GgufWriter w(tmp.path / c.dense_file, dense_gguf_metadata(nullptr), specs);
    for (size_t i = 0; i < dense.size(); ++i) {
      const DenseTensor& t = dense[i];
      std::vector<float> v = read_dense(ck, t);
      const size_t rows = t.shape.size() == 2 ? size_t(t.shape[0]) : 1;
      const std::vector<uint8_t> bytes = encode_dense_matrix(specs[i].type, v.data(), rows, size_t(t.shape.back()));
      w.write(bytes.data(), bytes.size());
      bar.update(++done, "dense " + t.out);
    }
    w.commit();
  } else {
    SafetensorsWriter w(tmp.path / c.dense_file);
    const DType dt = c.dense_dtype == "f32" ? DType::kF32 : DType::kBF16;
    for (const DenseTensor& t : dense) w.declare(t.out, t.f32 ? DType::kF32 : dt, t.shape);
    w.set_metadata("format", "moestream-dense");
    for (const DenseTensor& t : dense) {
      std::vector<float> v = read_dense(ck, t);
      w.write(t.out, v.data(), v.size());
      bar.update(++done, "dense " + t.out);
    }
    w.finish();
  }

  const ExpertLayout layout = ExpertLayout::make(c.expert_quant, D, F);
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  const int n_workers = static_cast<int>(std::min<int64_t>(opts.threads > 0 ? opts.threads : hw, E));
  ThreadPool pool(n_workers);  // the project's compute pool, shared by every layer
  for (int m = 0; m < c.n_moe_layers() && gpt_oss; ++m) {
    const int l = m + c.first_k_dense_replace;  // the checkpoint's decoder layer
    ExpertFileWriter w(expert_file_path(tmp.path, m), c.expert_layout(m).types, m, E, D, F);
    write_gpt_oss_layer(ck, c, mxfp4, l, w, pool, [&](int64_t e) {
      bar.update(++done, "layer " + std::to_string(m + 1) + "/" + std::to_string(c.n_moe_layers()) + " expert " +
                             std::to_string(e + 1) + "/" + std::to_string(E));
    });
    w.finish();
  }
  for (int l = 0; l < c.n_moe_layers() && !gpt_oss; ++l) {
    const ExpertSource& s = sources[size_t(l)];
    ExpertFileWriter w(expert_file_path(tmp.path, l), c.expert_quant, l, E, D, F);
    // One task per pool thread; each takes experts in turn and holds one expert's floats and
    // payload, never a layer. The writer is not thread-safe: writes and progress go under the
    // mutex. After a failure the others stop taking experts; the pool rethrows the first error.
    std::atomic<int64_t> next{0};
    std::atomic<bool> failed{false};
    std::mutex mu;
    pool.parallel_for(size_t(n_workers), [&](size_t) {
      std::vector<float> gate(F * D), up(F * D), down(D * F);
      std::vector<uint8_t> payload(layout.bytes);
      for (int64_t e; !failed && (e = next++) < E;) {
        try {
          // Each source range is released from our mapping once read (see SafetensorsFile::release).
          auto take = [&](const std::string& name, uint64_t first, uint64_t n, float* dst) {
            ck.read_float(name, first, n, dst);  // FP8 experts dequantised here, one at a time
            ck.release(name, first, n);
          };
          if (s.fused) {
            // gate_up_proj[e] is [2F, D]: rows [0, F) gate, [F, 2F) up (transformers' Concatenate(dim=1)).
            take(s.gate, uint64_t(e) * 2 * F * D, F * D, gate.data());
            take(s.gate, uint64_t(e) * 2 * F * D + F * D, F * D, up.data());
            take(s.down, uint64_t(e) * D * F, D * F, down.data());
          } else {
            take(expand(s.gate, e), 0, F * D, gate.data());
            take(expand(s.up, e), 0, F * D, up.data());
            take(expand(s.down, e), 0, D * F, down.data());
          }
          std::fill(payload.begin(), payload.end(), 0);  // alignment gaps stay zero: stable checksums
          quantize_matrix(c.expert_quant, gate.data(), F, D, payload.data() + layout.gate_offset);
          quantize_matrix(c.expert_quant, up.data(), F, D, payload.data() + layout.up_offset);
          quantize_matrix(c.expert_quant, down.data(), D, F, payload.data() + layout.down_offset);
          std::lock_guard<std::mutex> lock(mu);
          if (failed) return;
          w.write_expert(static_cast<uint32_t>(e), payload.data());
          bar.update(++done, "layer " + std::to_string(l + 1) + "/" + std::to_string(c.n_moe_layers()) + " expert " +
                                 std::to_string(e + 1) + "/" + std::to_string(E));
        } catch (...) {
          failed = true;
          throw;
        }
      }
    });
    w.finish();
  }

  copy_if_present(hf_dir / "tokenizer.json", tmp.path / "tokenizer.json", c.tokenizer_file);
  copy_if_present(hf_dir / "tokenizer_config.json", tmp.path / "tokenizer_config.json", c.tokenizer_config_file);
  merge_chat_template_file(hf_dir, tmp.path, c.tokenizer_config_file);
  publish_model(tmp, out_dir, c,
                {{"hf_dir", fs::absolute(hf_dir).lexically_normal().string()},
                 {"architecture", hf.contains("architectures") ? hf["architectures"] : nlohmann::json(nullptr)},
                 {"dtype", std::string(dtype_name(src_dtype))},
                 {"expert_layout", mxfp4 ? "mxfp4" : gpt_oss || (!sources.empty() && sources[0].fused) ? "fused"
                                                                                                   : "per_expert"},
                 {"shards", ck.n_shards()}});
  bar.finish();
  return c;
}

}  // namespace moestream

namespace moestream {

fs::path make_temp_output(const fs::path& out_dir, const std::string& experts_dir) {
  const fs::path tmp(out_dir.string() + ".tmp." + std::to_string(::getpid()));
  fs::remove_all(tmp);
  fs::create_directories(tmp / experts_dir);
  return tmp;
}

void publish_output(TempOutput& tmp, const fs::path& out_dir, const std::string& experts_dir) {
  // A source page that could not be read (SIGBUS, read as zeros) or a source changed under the
  // conversion fails it here, before the output is published (common/mapping_guard.h).
  check_mapped_files(current_mapping_owner());
  fsync_path(tmp.path / experts_dir);
  fsync_path(tmp.path);
  fs::path old;
  if (fs::exists(out_dir)) {
    old = fs::path(out_dir.string() + ".old." + std::to_string(::getpid()));
    fs::rename(out_dir, old);
  }
  fs::rename(tmp.path, out_dir);
  tmp.keep = true;
  if (!old.empty()) fs::remove_all(old);
  fsync_path(fs::absolute(out_dir).parent_path());
}

void publish_model(TempOutput& tmp, const fs::path& out_dir, ModelConfig& c, const nlohmann::json& source) {
  c.dense_xxh3 = dense_file_checksum(tmp.path / c.dense_file);  // the dense file is final here
  nlohmann::json mj = c.to_json();
  mj["source"] = source;
  mj["source"]["converter"] = "convert_model";
  write_file_atomic(tmp.path / "model.json", mj.dump(2) + "\n");
  publish_output(tmp, out_dir, c.experts_dir);
}

}  // namespace moestream
