// GGUF "gpt-oss" (GptOssForCausalLM as llama.cpp's converter writes it): attention sinks, Q/K/V/O
// biases, sliding-window layers, YaRN, a biased router with softmax over the selected logits,
// experts with biases, gate and up as separate stacked tensors (the checkpoint's interleaved
// gate_up columns split by the converter), MXFP4 experts kept as ggml MXFP4.
#include <cmath>

#include "common/error.h"
#include "loader/format/gguf_arch.h"

namespace moestream {
namespace {

// The SwiGLU clamp llama.cpp applies to every gpt-oss GGUF (its graph's constants, gpt-oss's own).
constexpr double kSwigluLimit = 7.0;
constexpr double kSwigluAlpha = 1.702;
// llama.cpp's default when the metadata name no pattern: every 2nd layer full attention, starting
// with a sliding layer (layer il slides when il % 2 < 1), as gpt-oss's layer_types alternate.
constexpr uint64_t kSlidingPattern = 2;

std::vector<bool> sliding_layers(const GgufMetadata& m, const std::string& where, const std::string& key, int n_layers) {
  std::vector<bool> out;
  if (const GgufArray* arr = m.find_array(key)) {
    if (arr->size() < uint64_t(n_layers))
      gguf_arch_error(where, "metadata " + key + " has " + std::to_string(arr->size()) + " entries for " +
                                 std::to_string(n_layers) + " layers");
    for (int l = 0; l < n_layers; ++l) {
      const std::optional<bool> b = arr->element(uint64_t(l)).to_bool();
      if (!b) gguf_arch_error(where, "metadata " + key + " must be an array of bools");
      out.push_back(*b);
    }
    return out;
  }
  const uint64_t n = m.find_u64(key).value_or(kSlidingPattern);
  for (int l = 0; l < n_layers; ++l) out.push_back(n == 0 || uint64_t(l) % n < n - 1);
  return out;
}

}  // namespace

void read_gguf_gpt_oss(const GgufModelFiles& f, const std::string& where, GgufArchModel& out) {
  const GgufMetadata& m = f.metadata();
  const std::string a = "gpt-oss.";
  const GgufArchSizes z = gguf_arch_sizes(f, where, a, 0);
  const uint64_t D = z.hidden, F = z.expert_width, E = z.experts, V = z.vocab;

  ModelConfig& c = out.cfg;
  c.arch = Arch::kGptOss;
  c.vocab_size = int(V);
  c.hidden_size = int(D);
  c.moe_intermediate_size = int(F);
  c.n_experts = int(E);
  c.n_layers = int(m.get_u32(a + "block_count"));
  c.n_heads = int(m.get_u32(a + "attention.head_count"));
  c.n_kv_heads = int(m.find_u32(a + "attention.head_count_kv").value_or(uint32_t(c.n_heads)));
  if (c.n_heads <= 0 || c.n_layers <= 0) gguf_arch_error(where, a + "block_count and attention.head_count must be positive");
  c.head_dim = int(m.find_u32(a + "attention.key_length").value_or(uint32_t(D / uint64_t(c.n_heads))));
  if (const auto v = m.find_u32(a + "attention.value_length"); v && int(*v) != c.head_dim)
    gguf_arch_error(where, a + "attention.value_length differs from key_length: not supported");
  if (c.head_dim <= 0) gguf_arch_error(where, a + "attention.key_length must be positive");
  gguf_arch_rope_dims(m, where, a, uint64_t(c.head_dim), false);  // gpt-oss rotates whole heads
  c.n_experts_per_tok = int(m.get_u32(a + "expert_used_count"));
  c.rms_norm_eps = m.get_f64(a + "attention.layer_norm_rms_epsilon");
  c.max_position_embeddings = int(m.get_u32(a + "context_length"));
  c.qk_norm = QkNorm::kNone;
  // transformers' GptOss: top-k softmax (already normalised), biases everywhere, sinks.
  c.norm_topk_prob = false;
  c.router_softmax_topk = c.router_bias = c.expert_bias = c.attention_sinks = true;
  c.qkv_bias = c.o_bias = true;
  if (m.find_bool(a + "expert_weights_norm").value_or(false))
    gguf_arch_error(where, a + "expert_weights_norm true is not gpt-oss's routing (softmax over the top-k)");
  if (const auto s = m.find_f64(a + "expert_weights_scale"); s && *s != 1.0)
    gguf_arch_error(where, a + "expert_weights_scale " + std::to_string(*s) + " is not supported for gpt-oss");

  c.rope_theta = m.find_f64(a + "rope.freq_base").value_or(150000.0);
  if (const auto swa = m.find_f64(a + "rope.freq_base_swa"); swa && *swa != c.rope_theta)
    gguf_arch_error(where, a + "rope.freq_base_swa differs from rope.freq_base: one RoPE base is supported");
  c.rope_scaling = gguf_arch_rope_scaling(m, where, a);
  gguf_arch_refuse(m, where, a + "rope.scaling.yarn_log_multiplier", "gpt-oss's YaRN has no attention mscale");
  if (c.rope_scaling && c.rope_scaling->type == "yarn") c.rope_scaling->truncate = false;  // gpt-oss's config

  c.sliding_window = int(m.get_u32(a + "attention.sliding_window"));
  c.sliding_layers = sliding_layers(m, where, a + "attention.sliding_window_pattern", c.n_layers);

  // The clamp: llama.cpp's constant unless {arch}.swiglu_clamp_exp states it (one value, or one
  // per layer, all equal: the engine has one limit).
  c.swiglu_alpha = kSwigluAlpha;
  c.swiglu_limit = kSwigluLimit;
  if (const std::vector<double> lim = gguf_arch_floats(m, a + "swiglu_clamp_exp"); !lim.empty()) {
    for (double x : lim)
      if (x != lim.front() || !(x > 0))
        gguf_arch_error(where, a + "swiglu_clamp_exp must be one positive limit for every layer");
    c.swiglu_limit = lim.front();
  }

  const bool tied = f.find_tensor("output.weight") == nullptr;
  c.tie_word_embeddings = tied;
  if (const auto b = m.find_u32("tokenizer.ggml.bos_token_id")) c.bos_token_id = int(*b);
  if (const auto e = m.find_u32("tokenizer.ggml.eos_token_id")) c.eos_token_id = int(*e);

  // Tensors: shapes checked now, names for the dense loader.
  const uint64_t H = uint64_t(c.n_heads), hd = uint64_t(c.head_dim), qd = H * hd, kvd = uint64_t(c.n_kv_heads) * hd;
  auto name = [&](const std::string& ours, const std::vector<uint64_t>& dims) {
    const std::string theirs = gguf_dense_name(c.arch, ours);
    gguf_arch_shaped(f, where, theirs, dims);
    out.names[ours] = theirs;
  };
  name("embed", {D, V});
  name("final_norm", {D});
  if (!tied) name("lm_head", {D, V});
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".", o = "layers." + std::to_string(l) + ".";
    name(o + "attn_norm", {D});
    name(o + "wq", {D, qd});
    name(o + "wk", {D, kvd});
    name(o + "wv", {D, kvd});
    name(o + "bq", {qd});
    name(o + "bk", {kvd});
    name(o + "bv", {kvd});
    name(o + "wo", {qd, D});
    name(o + "bo", {D});
    name(o + "sinks", {H});
    name(o + "ffn_norm", {D});
    name(o + "router", {D, E});
    name(o + "router_bias", {E});
    GgufLayerExperts x;
    const GgufTensor& g = gguf_arch_shaped(f, where, p + "ffn_gate_exps.weight", {D, F, E});
    const GgufTensor& u = gguf_arch_shaped(f, where, p + "ffn_up_exps.weight", {D, F, E});
    const GgufTensor& d = gguf_arch_shaped(f, where, p + "ffn_down_exps.weight", {F, D, E});
    x.gate = gguf_arch_experts(where, g, E);
    x.up = gguf_arch_experts(where, u, E);
    x.down = gguf_arch_experts(where, d, E);
    // The biases are read into the expert payload as float32 (expert_file.h's bias section).
    x.bias = true;
    const std::pair<GgufExpertMatrix*, std::pair<const char*, uint64_t>> biases[] = {
        {&x.gate_bias, {"ffn_gate_exps.bias", F}}, {&x.up_bias, {"ffn_up_exps.bias", F}},
        {&x.down_bias, {"ffn_down_exps.bias", D}}};
    for (const auto& [dst, spec] : biases) {
      const GgufTensor& b = gguf_arch_shaped(f, where, p + spec.first, {spec.second, E});
      if (b.type != GgmlType::kF32)
        gguf_arch_error(where, "tensor '" + b.name + "' has type " + std::string(ggml_type_name(b.type)) +
                                   "; expert biases must be F32");
      *dst = gguf_arch_experts(where, b, E);
    }
    out.experts.push_back(x);
    c.layer_expert_types.push_back(ExpertTypes{ggml_quant(g.type), ggml_quant(u.type), ggml_quant(d.type)});
  }
  c.expert_quant = c.layer_expert_types.front().gate;
  gguf_arch_validate(c, where);
}

}  // namespace moestream
