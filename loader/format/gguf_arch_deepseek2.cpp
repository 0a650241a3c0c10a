// GGUF "deepseek2" (DeepseekV3ForCausalLM, DeepseekV2ForCausalLM, Kimi K2 as llama.cpp's converter
// writes them): multi-head latent attention stored in its MQA form (head_count_kv 1, key_length
// kv_lora_rank + rope dims), kv_b split into attn_k_b (each head's key block transposed) and
// attn_v_b, or the unsplit attn_kv_b of older files; RoPE rows kept in DeepSeek's interleaved
// pairs (llama.cpp rotates adjacent pairs); leading dense layers; shared experts; softmax or
// sigmoid scoring with groups, the correction bias exp_probs_b and the routed scaling.
#include <cmath>

#include "common/error.h"
#include "loader/format/gguf_arch.h"

namespace moestream {
namespace {

// {arch}.expert_gating_func values (llama.cpp's enum; 0 = unset, softmax for old DeepSeek-V2 files).
constexpr uint32_t kGatingSoftmax = 1, kGatingSigmoid = 2;

}  // namespace

void read_gguf_deepseek2(const GgufModelFiles& f, const std::string& where, GgufArchModel& out) {
  const GgufMetadata& m = f.metadata();
  const std::string a = "deepseek2.";
  ModelConfig& c = out.cfg;
  const uint64_t block_count = m.get_u32(a + "block_count");
  const uint64_t nextn = m.find_u32(a + "nextn_predict_layers").value_or(0);  // MTP layers after the last
  if (nextn >= block_count) gguf_arch_error(where, a + "nextn_predict_layers leaves no decoder layer");
  c.n_layers = int(block_count - nextn);
  gguf_arch_check_mtp_blocks(f, where, a + "nextn_predict_layers", uint64_t(c.n_layers), block_count);
  c.first_k_dense_replace = int(m.find_u32(a + "leading_dense_block_count").value_or(0));
  if (c.first_k_dense_replace >= c.n_layers)
    gguf_arch_error(where, a + "leading_dense_block_count " + std::to_string(c.first_k_dense_replace) +
                               " leaves no MoE layer of " + std::to_string(c.n_layers));
  const GgufArchSizes z = gguf_arch_sizes(f, where, a, c.first_k_dense_replace);
  const uint64_t D = z.hidden, F = z.expert_width, E = z.experts, V = z.vocab;

  c.vocab_size = int(V);
  c.hidden_size = int(D);
  c.moe_intermediate_size = int(F);
  c.n_experts = int(E);
  c.n_heads = int(m.get_u32(a + "attention.head_count"));
  if (c.n_heads <= 0) gguf_arch_error(where, a + "attention.head_count must be positive");
  c.n_kv_heads = c.n_heads;  // every head reads the one latent
  // The converter's MQA view states 1; older files the head count (transformers' config).
  if (const auto kv = m.find_u32(a + "attention.head_count_kv"); kv && *kv != 1 && int(*kv) != c.n_heads)
    gguf_arch_error(where, a + "attention.head_count_kv = " + std::to_string(*kv) + " is neither 1 (the MQA view of " +
                               "the latent) nor " + a + "attention.head_count = " + std::to_string(c.n_heads));
  c.n_experts_per_tok = int(m.get_u32(a + "expert_used_count"));
  c.rms_norm_eps = m.get_f64(a + "attention.layer_norm_rms_epsilon");
  c.max_position_embeddings = int(m.get_u32(a + "context_length"));
  c.qk_norm = QkNorm::kNone;
  gguf_arch_refuse(m, where, a + "attention.temperature_scale", "attention temperature tuning (Mistral-Large)");

  // MLA sizes. The current converter writes the MQA view (key_length C + r, value_length C) and
  // the per-head sizes as key_length_mla / value_length_mla; older files state the per-head sizes
  // as key_length / value_length.
  const uint64_t C = m.get_u32(a + "attention.kv_lora_rank"), r = m.get_u32(a + "rope.dimension_count");
  const uint64_t Q = m.find_u32(a + "attention.q_lora_rank").value_or(0);
  const auto k_mla = m.find_u32(a + "attention.key_length_mla");
  const uint64_t qk = k_mla ? *k_mla : m.get_u32(a + "attention.key_length");
  const uint64_t v = m.get_u32(a + (k_mla ? "attention.value_length_mla" : "attention.value_length"));
  // The rope width's own rule first (it is qk_rope_head_dim, inside each head's key), then the
  // MQA view's sizes it enters.
  if (C == 0 || r == 0 || r % 2 != 0 || qk <= r || v == 0)
    gguf_arch_error(where, "MLA sizes kv_lora_rank " + std::to_string(C) + ", rope dims " + std::to_string(r) + " (" +
                               a + "rope.dimension_count), key length " + std::to_string(qk) + ", value length " +
                               std::to_string(v) +
                               " are not a valid latent attention (rope dims even, key length > rope dims)");
  if (k_mla) {
    gguf_arch_agree(m, where, a + "attention.key_length", C + r);
    gguf_arch_agree(m, where, a + "attention.value_length", C);
  }
  c.kv_lora_rank = int(C);
  c.q_lora_rank = int(Q);
  c.qk_rope_head_dim = int(r);
  c.qk_nope_head_dim = int(qk - r);
  c.v_head_dim = int(v);
  c.head_dim = int(qk);

  // Routing. Sigmoid scores (DeepSeek-V3, Kimi K2) with groups, correction bias and scaling;
  // softmax (DeepSeek-V2) as transformers' DeepseekV2 computes it.
  const uint32_t gating = m.find_u32(a + "expert_gating_func").value_or(0);
  if (gating != 0 && gating != kGatingSoftmax && gating != kGatingSigmoid)
    gguf_arch_error(where, a + "expert_gating_func " + std::to_string(gating) + " is not supported (1 softmax, 2 sigmoid)");
  const bool sigmoid = gating == kGatingSigmoid;
  c.arch = sigmoid ? Arch::kDeepseekV3 : Arch::kDeepseekV2;
  c.router_scoring = sigmoid ? RouterScoring::kSigmoid : RouterScoring::kSoftmax;
  c.norm_topk_prob = m.find_bool(a + "expert_weights_norm").value_or(false);
  c.routed_scaling_factor = m.find_f64(a + "expert_weights_scale").value_or(1.0);
  c.n_group = int(m.find_u32(a + "expert_group_count").value_or(1));
  c.topk_group = int(m.find_u32(a + "expert_group_used_count").value_or(uint32_t(c.n_group)));
  if (!sigmoid && (c.n_group != 1 || c.routed_scaling_factor != 1.0))
    gguf_arch_error(where, "softmax routing with expert groups (" + std::to_string(c.n_group) +
                               ") or expert_weights_scale " + std::to_string(c.routed_scaling_factor) +
                               " (DeepSeek-V2's group-limited routing) is not supported");
  if (sigmoid && c.n_group == 1) c.topk_group = 1;
  const uint64_t n_shared = m.find_u32(a + "expert_shared_count").value_or(0);
  c.shared_expert_intermediate_size = int(n_shared * F);
  c.shared_expert_gated = false;
  if (c.first_k_dense_replace > 0) c.intermediate_size = int(m.get_u32(a + "feed_forward_length"));

  // RoPE: YaRN's attention scale is stored as 0.1 * mscale_all_dim, and a GGUF means
  // mscale = mscale_all_dim (llama.cpp has no key for a different mscale; every release has them equal).
  c.rope_theta = m.find_f64(a + "rope.freq_base").value_or(10000.0);
  c.rope_scaling = gguf_arch_rope_scaling(m, where, a);
  if (const auto lm = m.find_f64(a + "rope.scaling.yarn_log_multiplier")) {
    if (!c.rope_scaling || c.rope_scaling->type != "yarn")
      gguf_arch_error(where, a + "rope.scaling.yarn_log_multiplier without YaRN scaling");
    c.rope_scaling->mscale = c.rope_scaling->mscale_all_dim = *lm / 0.1;
  }

  const bool tied = f.find_tensor("output.weight") == nullptr;
  c.tie_word_embeddings = tied;
  if (const auto b = m.find_u32("tokenizer.ggml.bos_token_id")) c.bos_token_id = int(*b);
  if (const auto e = m.find_u32("tokenizer.ggml.eos_token_id")) c.eos_token_id = int(*e);

  const uint64_t H = uint64_t(c.n_heads), n = qk - r;
  auto name = [&](const std::string& ours, const std::vector<uint64_t>& dims) {
    const std::string theirs = gguf_dense_name(c.arch, ours);
    gguf_arch_shaped(f, where, theirs, dims);
    out.names[ours] = theirs;
  };
  // DeepSeek's RoPE rows pair (2i, 2i+1); the engine rotates halves: de-interleaved at load.
  auto rope_rows = [&](const std::string& ours, const std::vector<uint64_t>& dims, uint64_t group) {
    const std::string theirs = gguf_dense_name(c.arch, ours);
    gguf_arch_shaped(f, where, theirs, dims);
    GgufDerivedSpec d;
    d.kind = GgufDerivedSpec::Kind::kRopeRows;
    d.src = theirs;
    d.group = group;
    d.rope = r;
    d.dims = dims;
    out.derived[ours] = d;
  };
  name("embed", {D, V});
  name("final_norm", {D});
  if (!tied) name("lm_head", {D, V});
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".", o = "layers." + std::to_string(l) + ".";
    name(o + "attn_norm", {D});
    if (Q > 0) {
      name(o + "wq_a", {D, Q});
      name(o + "q_a_norm", {Q});
      rope_rows(o + "wq_b", {Q, H * qk}, qk);
    } else {
      rope_rows(o + "wq", {D, H * qk}, qk);
    }
    rope_rows(o + "wkv_a", {D, C + r}, C + r);
    name(o + "kv_a_norm", {C});
    if (f.find_tensor(p + "attn_k_b.weight") != nullptr || f.find_tensor(p + "attn_kv_b.weight") == nullptr) {
      gguf_arch_shaped(f, where, p + "attn_k_b.weight", {n, C, H});
      gguf_arch_shaped(f, where, p + "attn_v_b.weight", {C, v, H});
      GgufDerivedSpec d;
      d.kind = GgufDerivedSpec::Kind::kKvB;
      d.src = p + "attn_k_b.weight";
      d.src2 = p + "attn_v_b.weight";
      d.heads = H;
      d.nope = n;
      d.v = v;
      d.rank = C;
      d.dims = {C, H * (n + v)};
      out.derived[o + "wkv_b"] = d;
    } else {
      name(o + "wkv_b", {C, H * (n + v)});  // older files: our layout as is
    }
    name(o + "wo", {H * v, D});
    name(o + "ffn_norm", {D});
    if (!c.is_moe_layer(l)) {
      const uint64_t I = uint64_t(c.intermediate_size);
      name(o + "mlp_gate", {D, I});
      name(o + "mlp_up", {D, I});
      name(o + "mlp_down", {I, D});
      continue;
    }
    name(o + "router", {D, E});
    const std::string bias = p + "exp_probs_b.bias";
    if (sigmoid && f.find_tensor(bias) != nullptr) {
      name(o + "router_bias", {E});
    } else if (sigmoid) {  // llama.cpp treats it as optional: no correction
      GgufDerivedSpec d;
      d.kind = GgufDerivedSpec::Kind::kZeros;
      d.dims = {E};
      out.derived[o + "router_bias"] = d;
    } else if (f.find_tensor(bias) != nullptr) {
      gguf_arch_error(where, "tensor '" + bias + "' (a selection bias) with softmax routing is not supported");
    }
    if (n_shared > 0) {
      const uint64_t S = n_shared * F;
      name(o + "shared_gate", {D, S});
      name(o + "shared_up", {D, S});
      name(o + "shared_down", {S, D});
    }
    GgufLayerExperts x;
    const GgufTensor& g = gguf_arch_shaped(f, where, p + "ffn_gate_exps.weight", {D, F, E});
    const GgufTensor& u = gguf_arch_shaped(f, where, p + "ffn_up_exps.weight", {D, F, E});
    const GgufTensor& d = gguf_arch_shaped(f, where, p + "ffn_down_exps.weight", {F, D, E});
    x.gate = gguf_arch_experts(where, g, E);
    x.up = gguf_arch_experts(where, u, E);
    x.down = gguf_arch_experts(where, d, E);
    out.experts.push_back(x);
    c.layer_expert_types.push_back(ExpertTypes{ggml_quant(g.type), ggml_quant(u.type), ggml_quant(d.type)});
  }
  c.expert_quant = c.layer_expert_types.front().gate;
  gguf_arch_validate(c, where);
}

}  // namespace moestream
