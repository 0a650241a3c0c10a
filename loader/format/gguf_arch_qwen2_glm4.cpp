// Implementation of loader/format/gguf_arch_qwen2_glm4.h: qwen2moe and glm4moe metadata -> model.json
// fields, their tensor names, and the shapes of the tensors those fields call for.
#include "loader/format/gguf_arch_qwen2_glm4.h"

#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "loader/format/gguf_model.h"

namespace moestream {
namespace {

using json = nlohmann::json;

[[noreturn]] void bad(const std::string& where, const std::string& what) { throw FormatError(where + ": " + what); }

std::string dims_str(const std::vector<uint64_t>& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

// The tensor `name` with one of the shapes `allowed` (ne0 first).
void require(const GgufModelFiles& f, const std::string& where, const std::string& name,
             const std::vector<std::vector<uint64_t>>& allowed) {
  const GgufTensor* t = f.find_tensor(name);
  if (t == nullptr) bad(where, "tensor '" + name + "' is missing");
  for (const auto& dims : allowed)
    if (t->dims == dims) return;
  bad(where, "tensor '" + name + "' has shape " + dims_str(t->dims) + ", expected " + dims_str(allowed.front()) +
                 " (ne0 first)");
}

// A metadata count that must fit model.json's int fields.
int count_of(const std::string& where, const std::string& key, uint64_t v) {
  if (v > (uint64_t(1) << 30)) bad(where, "metadata " + key + " = " + std::to_string(v) + " is out of range");
  return int(v);
}

// llama.cpp's expert_gating_func values (llama-hparams.h): 1 softmax, 2 sigmoid; 0 or absent: the
// architecture's own.
constexpr uint64_t kGatingSoftmax = 1, kGatingSigmoid = 2;

void qwen2moe_config(const GgufModelFiles& f, const std::string& where, const std::string& a, json& j) {
  const GgufMetadata& m = f.metadata();
  const uint64_t D = j["hidden_size"].get<uint64_t>(), head_dim = j["head_dim"].get<uint64_t>();
  if (const auto g = m.find_u64(a + "expert_gating_func"); g && *g != 0 && *g != kGatingSoftmax)
    bad(where, a + "expert_gating_func = " + std::to_string(*g) + ": qwen2moe routes by softmax (1)");
  if (const auto r = m.find_u64(a + "rope.dimension_count"); r && *r != head_dim)
    bad(where, a + "rope.dimension_count = " + std::to_string(*r) + ": partial rotary (head_dim " +
                   std::to_string(head_dim) + ") is not qwen2moe's");
  // The shared expert every Qwen2-MoE has (llama.cpp requires it): its width from the tensor, which
  // the metadata, when it states one, must agree with.
  const GgufTensor* sg = f.find_tensor("blk.0.ffn_gate_shexp.weight");
  if (sg == nullptr) bad(where, "tensor 'blk.0.ffn_gate_shexp.weight' is missing: qwen2moe has a shared expert");
  if (sg->dims.size() != 2 || sg->dims[0] != D)
    bad(where, "tensor 'blk.0.ffn_gate_shexp.weight' has shape " + dims_str(sg->dims) + ", expected [" +
                   std::to_string(D) + ", width]");
  const uint64_t width = sg->dims[1];
  if (const auto w = m.find_u64(a + "expert_shared_feed_forward_length"); w && *w != width)
    bad(where, "metadata " + a + "expert_shared_feed_forward_length = " + std::to_string(*w) +
                   " contradicts the tensors (" + std::to_string(width) + ")");
  j["shared_expert_intermediate_size"] = count_of(where, "shared expert width", width);
  j["shared_expert_gated"] = true;
}

void glm4moe_config(const GgufModelFiles& f, const std::string& where, const std::string& a, json& j) {
  const GgufMetadata& m = f.metadata();
  const uint64_t F = j["moe_intermediate_size"].get<uint64_t>(), head_dim = j["head_dim"].get<uint64_t>();
  if (const auto g = m.find_u64(a + "expert_gating_func"); g && *g != 0 && *g != kGatingSigmoid)
    bad(where, a + "expert_gating_func = " + std::to_string(*g) +
                   ": glm4moe is computed with sigmoid routing (2) only");
  j["router_scoring"] = "sigmoid";
  j["n_group"] = count_of(where, a + "expert_group_count", m.find_u64(a + "expert_group_count").value_or(1));
  j["topk_group"] =
      count_of(where, a + "expert_group_used_count", m.find_u64(a + "expert_group_used_count").value_or(1));
  // Absent: llama.cpp's default, no renormalisation (its converter always writes the key).
  j["norm_topk_prob"] = m.find_bool(a + "expert_weights_norm").value_or(false);
  const uint64_t n_shared = m.find_u64(a + "expert_shared_count").value_or(0);
  if (n_shared > 0) {
    if (n_shared > (uint64_t(1) << 20) || n_shared * F > (uint64_t(1) << 30))
      bad(where, "metadata " + a + "expert_shared_count = " + std::to_string(n_shared) + " is out of range");
    j["shared_expert_intermediate_size"] = n_shared * F;
    j["shared_expert_gated"] = false;
  }
  const uint64_t rot = m.find_u64(a + "rope.dimension_count").value_or(head_dim);
  if (rot == 0 || rot > head_dim || rot % 2 != 0)
    bad(where, a + "rope.dimension_count = " + std::to_string(rot) + " is not an even width in [2, head_dim " +
                   std::to_string(head_dim) + "]");
  if (rot != head_dim) j["rotary_dim"] = rot;
  if (m.find(a + "rope.dimension_sections") != nullptr)
    bad(where, a + "rope.dimension_sections: multimodal RoPE sections (GLM-4.5V) are not supported");
}

}  // namespace

std::string gguf_dense_name(Arch arch, const std::string& n) {
  if (n.rfind("layers.", 0) == 0) {
    const size_t dot = n.find('.', 7);
    if (dot != std::string::npos) {
      const std::string blk = "blk." + n.substr(7, dot - 7) + ".";
      const std::string_view field = std::string_view(n).substr(dot + 1);
      if (arch == Arch::kGlm4Moe && field == "ffn_norm") return blk + "post_attention_norm.weight";
      if (arch == Arch::kGlm4Moe && field == "router_bias") return blk + "exp_probs_b.bias";
      // Names llama.cpp gives these tensors in every architecture that has them.
      static constexpr std::pair<std::string_view, std::string_view> kShared[] = {
          {"bq", "attn_q.bias"},
          {"bk", "attn_k.bias"},
          {"bv", "attn_v.bias"},
          {"shared_gate", "ffn_gate_shexp.weight"},
          {"shared_up", "ffn_up_shexp.weight"},
          {"shared_down", "ffn_down_shexp.weight"},
          {"shared_expert_gate", "ffn_gate_inp_shexp.weight"},
          {"mlp_gate", "ffn_gate.weight"},
          {"mlp_up", "ffn_up.weight"},
          {"mlp_down", "ffn_down.weight"}};
      for (const auto& [ours, theirs] : kShared)
        if (field == ours) return blk + std::string(theirs);
    }
  }
  return gguf_dense_name(n);
}

void gguf_arch_config(Arch arch, const GgufModelFiles& files, const std::string& where, const std::string& a,
                      json& j) {
  if (arch != Arch::kQwen2Moe && arch != Arch::kGlm4Moe) return;
  // Attention biases: present on every layer or on none (checked per layer afterwards).
  if (files.find_tensor("blk.0.attn_q.bias") != nullptr) j["qkv_bias"] = true;
  // The routed experts' weight scale; llama.cpp reads 0 (or no key) as "no scaling".
  if (const auto s = files.metadata().find_f64(a + "expert_weights_scale"); s && *s != 0)
    j["routed_scaling_factor"] = *s;
  if (arch == Arch::kQwen2Moe) qwen2moe_config(files, where, a, j);
  else glm4moe_config(files, where, a, j);
}

void gguf_check_extra_tensors(const GgufModelFiles& files, const std::string& where, const ModelConfig& c) {
  const uint64_t D = uint64_t(c.hidden_size), E = uint64_t(c.n_experts);
  const uint64_t qd = uint64_t(c.n_heads) * uint64_t(c.head_dim), kvd = uint64_t(c.n_kv_heads) * uint64_t(c.head_dim);
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    auto name = [&](const char* field) { return gguf_dense_name(c.arch, p + field); };
    if (c.qkv_bias) {
      require(files, where, name("bq"), {{qd}});
      require(files, where, name("bk"), {{kvd}});
      require(files, where, name("bv"), {{kvd}});
    }
    if (!c.is_moe_layer(l)) {
      const uint64_t I = uint64_t(c.intermediate_size);
      require(files, where, name("mlp_gate"), {{D, I}});
      require(files, where, name("mlp_up"), {{D, I}});
      require(files, where, name("mlp_down"), {{I, D}});
      continue;
    }
    if (c.router_scoring == RouterScoring::kSigmoid) require(files, where, name("router_bias"), {{E}});
    if (c.has_shared_expert()) {
      const uint64_t S = uint64_t(c.shared_expert_intermediate_size);
      require(files, where, name("shared_gate"), {{D, S}});
      require(files, where, name("shared_up"), {{D, S}});
      require(files, where, name("shared_down"), {{S, D}});
      // llama.cpp's converter keeps transformers' [1, D] (ne [D, 1]); llama.cpp itself asks for [D].
      if (c.shared_expert_gated) require(files, where, name("shared_expert_gate"), {{D, 1}, {D}});
    }
  }
}

}  // namespace moestream
