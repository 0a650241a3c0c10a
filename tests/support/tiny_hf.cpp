// tests/support/tiny_hf.h: a tiny random Hugging Face MoE checkpoint for the converter's tests.
#include "tests/support/tiny_hf.h"

#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <stdexcept>

#include "common/file_util.h"
#include "common/half.h"
#include "loader/format/gguf_metadata.h"
#include "loader/format/gguf_writer.h"

namespace moestream::test {

namespace fs = std::filesystem;
using nlohmann::json;

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "<no exception>";
}

TinyHf make_tiny(Arch arch, uint32_t seed) {
  TinyHf m;
  m.arch = arch;
  m.L = 3, m.E = 8, m.V = 53, m.H = 4, m.KV = 2, m.F = 21;
  const bool given_hd = arch == Arch::kQwen3Moe || arch == Arch::kQwen2Moe || arch == Arch::kMinimaxM2;
  m.D = given_hd ? 37 : 36;  // OLMoE/Mixtral derive head_dim = D / H
  m.hd = given_hd ? 8 : m.D / m.H;
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 0.5f);
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    Tensor t;
    t.shape = shape;
    size_t n = 1;
    for (auto s : shape) n *= size_t(s);
    t.data.resize(n);
    for (auto& x : t.data) {
      x = bf16_to_f32(f32_to_bf16(g(rng)));
      if (std::fabs(x) < 1e-3f) x = 0;  // keeps every value exact in f16 too (no subnormals)
    }
    m.tensors[name] = std::move(t);
  };
  // config.json as each architecture's Hugging Face config writes it.
  m.config = {{"vocab_size", m.V}, {"hidden_size", m.D}, {"num_hidden_layers", m.L},
              {"num_attention_heads", m.H}, {"num_key_value_heads", m.KV}, {"max_position_embeddings", 256},
              {"rms_norm_eps", 1e-6}, {"hidden_act", "silu"}, {"num_experts_per_tok", 2},
              {"tie_word_embeddings", false}, {"bos_token_id", 1}, {"eos_token_id", 2}};
  std::string moe = "mlp.";
  switch (arch) {
    case Arch::kQwen3Moe:
      m.config.update(json{{"architectures", json::array({"Qwen3MoeForCausalLM"})}, {"model_type", "qwen3_moe"},
                           {"head_dim", m.hd}, {"moe_intermediate_size", m.F}, {"intermediate_size", 64},
                           {"num_experts", m.E}, {"norm_topk_prob", true}, {"rope_theta", 1000000.0},
                           {"decoder_sparse_step", 1}, {"mlp_only_layers", json::array()},
                           {"use_sliding_window", false}, {"sliding_window", 4096}, {"attention_bias", false}});
      break;
    case Arch::kOlmoe:
      m.config.update(json{{"architectures", json::array({"OlmoeForCausalLM"})}, {"model_type", "olmoe"},
                           {"intermediate_size", m.F}, {"num_experts", m.E}, {"norm_topk_prob", false},
                           {"rope_theta", 10000.0}, {"clip_qkv", nullptr}, {"attention_bias", false}});
      break;
    case Arch::kMixtral:
      m.config.update(json{{"architectures", json::array({"MixtralForCausalLM"})}, {"model_type", "mixtral"},
                           {"intermediate_size", m.F}, {"num_local_experts", m.E}, {"rope_theta", 1000000.0},
                           {"sliding_window", nullptr}});
      moe = "block_sparse_moe.";
      break;
    case Arch::kQwen2Moe:  // as released Qwen1.5-MoE configs: no qkv_bias key (true by default)
      m.config.update(json{{"architectures", json::array({"Qwen2MoeForCausalLM"})}, {"model_type", "qwen2_moe"},
                           {"head_dim", m.hd}, {"moe_intermediate_size", m.F}, {"intermediate_size", 64},
                           {"shared_expert_intermediate_size", 26}, {"num_experts", m.E},
                           {"norm_topk_prob", false}, {"rope_theta", 1000000.0}, {"decoder_sparse_step", 1},
                           {"mlp_only_layers", json::array()}, {"use_sliding_window", false},
                           {"sliding_window", 32768}, {"max_window_layers", 21}});
      break;
    case Arch::kMinimaxM2:  // as MiniMax-M2's release: the remote code's keys, partial rotary as rotary_dim
      m.config.update(json{{"architectures", json::array({"MiniMaxM2ForCausalLM"})}, {"model_type", "minimax_m2"},
                           {"head_dim", m.hd}, {"rotary_dim", m.hd / 2}, {"intermediate_size", m.F},
                           {"num_local_experts", m.E}, {"rope_theta", 5000000.0}, {"use_qk_norm", true},
                           {"qk_norm_type", "per_layer"}, {"scoring_func", "sigmoid"}, {"use_routing_bias", true},
                           {"shared_intermediate_size", 0}, {"attn_type_list", json::array({1, 1, 1})},
                           {"sliding_window", nullptr}});
      moe = "block_sparse_moe.";
      break;
    default:  // the other architectures have checkpoints of their own (their fixtures and tests)
      throw std::invalid_argument("hf_model: no synthetic checkpoint for " + std::string(arch_name(arch)));
  }
  add("model.embed_tokens.weight", {m.V, m.D});
  add("model.norm.weight", {m.D});
  add("lm_head.weight", {m.V, m.D});
  for (int l = 0; l < m.L; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {m.D});
    add(p + "post_attention_layernorm.weight", {m.D});
    add(p + "self_attn.q_proj.weight", {m.H * m.hd, m.D});
    add(p + "self_attn.k_proj.weight", {m.KV * m.hd, m.D});
    add(p + "self_attn.v_proj.weight", {m.KV * m.hd, m.D});
    add(p + "self_attn.o_proj.weight", {m.D, m.H * m.hd});
    if (arch == Arch::kQwen3Moe) {
      add(p + "self_attn.q_norm.weight", {m.hd});
      add(p + "self_attn.k_norm.weight", {m.hd});
    } else if (arch == Arch::kOlmoe || arch == Arch::kMinimaxM2) {
      add(p + "self_attn.q_norm.weight", {m.H * m.hd});
      add(p + "self_attn.k_norm.weight", {m.KV * m.hd});
    }
    add(p + moe + "gate.weight", {m.E, m.D});
    if (arch == Arch::kMinimaxM2) add(p + moe + "e_score_correction_bias", {m.E});  // beside the gate
    if (arch == Arch::kQwen2Moe) {
      add(p + "self_attn.q_proj.bias", {m.H * m.hd});
      add(p + "self_attn.k_proj.bias", {m.KV * m.hd});
      add(p + "self_attn.v_proj.bias", {m.KV * m.hd});
      add(p + "mlp.shared_expert.gate_proj.weight", {26, m.D});
      add(p + "mlp.shared_expert.up_proj.weight", {26, m.D});
      add(p + "mlp.shared_expert.down_proj.weight", {m.D, 26});
      add(p + "mlp.shared_expert_gate.weight", {1, m.D});
    }
    for (int e = 0; e < m.E; ++e) {
      std::string x = p + moe + "experts." + std::to_string(e) + ".";
      if (arch == Arch::kMixtral || arch == Arch::kMinimaxM2) {
        add(x + "w1.weight", {m.F, m.D});
        add(x + "w3.weight", {m.F, m.D});
        add(x + "w2.weight", {m.D, m.F});
      } else {
        add(x + "gate_proj.weight", {m.F, m.D});
        add(x + "up_proj.weight", {m.F, m.D});
        add(x + "down_proj.weight", {m.D, m.F});
      }
    }
  }
  return m;
}

// gate, up, down of expert e in layer l, from the per-expert tensors.
std::array<const Tensor*, 3> expert_tensors(const TinyHf& m, int l, int e) {
  std::string p = "model.layers." + std::to_string(l) + ".";
  if (m.arch == Arch::kMixtral || m.arch == Arch::kMinimaxM2) {
    std::string x = p + "block_sparse_moe.experts." + std::to_string(e) + ".";
    return {&m.tensors.at(x + "w1.weight"), &m.tensors.at(x + "w3.weight"), &m.tensors.at(x + "w2.weight")};
  }
  std::string x = p + "mlp.experts." + std::to_string(e) + ".";
  return {&m.tensors.at(x + "gate_proj.weight"), &m.tensors.at(x + "up_proj.weight"),
          &m.tensors.at(x + "down_proj.weight")};
}

// The tensors as transformers v5 saves them: experts fused into [E, 2F, D] and [E, D, F], and
// Mixtral's and MiniMax-M2's block_sparse_moe renamed to mlp.
std::map<std::string, Tensor> fused_layout(const TinyHf& m) {
  std::map<std::string, Tensor> out;
  for (auto& [name, t] : m.tensors)
    if (name.find(".experts.") == std::string::npos) {
      std::string n = name;
      if (auto p = n.find("block_sparse_moe."); p != std::string::npos) n.replace(p, 17, "mlp.");
      out[n] = t;
    }
  for (int l = 0; l < m.L; ++l) {
    Tensor gu{{m.E, 2 * m.F, m.D}, {}}, dn{{m.E, m.D, m.F}, {}};
    for (int e = 0; e < m.E; ++e) {
      auto [g, u, d] = expert_tensors(m, l, e);
      gu.data.insert(gu.data.end(), g->data.begin(), g->data.end());
      gu.data.insert(gu.data.end(), u->data.begin(), u->data.end());
      dn.data.insert(dn.data.end(), d->data.begin(), d->data.end());
    }
    std::string p = "model.layers." + std::to_string(l) + ".mlp.experts.";
    out[p + "gate_up_proj"] = std::move(gu);
    out[p + "down_proj"] = std::move(dn);
  }
  return out;
}

void save_hf(const fs::path& dir, const json& config, const std::map<std::string, Tensor>& tensors,
             DType dtype, int n_shards) {
  fs::create_directories(dir);
  write_file_atomic(dir / "config.json", config.dump(2));
  write_file_atomic(dir / "tokenizer.json", R"({"model": {"type": "BPE"}})");
  std::vector<std::unique_ptr<SafetensorsWriter>> shards;
  std::vector<std::string> files;
  for (int s = 0; s < n_shards; ++s) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, n_shards);
    files.push_back(n_shards == 1 ? "model.safetensors" : name);
    shards.push_back(std::make_unique<SafetensorsWriter>(dir / files.back()));
  }
  json wm;
  int i = 0;
  std::map<std::string, int> shard_of;
  for (auto& [name, t] : tensors) {
    int s = (i++) % n_shards;
    shard_of[name] = s;
    shards[s]->declare(name, dtype, t.shape);
    wm[name] = files[s];
  }
  for (auto& [name, t] : tensors) shards[shard_of[name]]->write(name, t.data.data(), t.data.size());
  for (auto& w : shards) w->finish();
  if (n_shards > 1) write_file_atomic(dir / "model.safetensors.index.json", json{{"weight_map", wm}}.dump());
}

void save_tiny(const fs::path& dir, const TinyHf& m, DType dtype, bool fused, int n_shards) {
  save_hf(dir, m.config, fused ? fused_layout(m) : m.tensors, dtype, n_shards);
}

// The tiny checkpoint as llama.cpp's converter writes a minimax-m2 GGUF (docs/format.md): F32
// tensors, ne0 first, experts stacked per layer, the correction bias as exp_probs_b.bias.
void write_minimax_m2_gguf(const TinyHf& m, const fs::path& path) {
  const uint64_t D = uint64_t(m.D), V = uint64_t(m.V), H = uint64_t(m.H), KV = uint64_t(m.KV), hd = uint64_t(m.hd);
  const uint64_t E = uint64_t(m.E), F = uint64_t(m.F);
  GgufMetadata md;
  auto u32 = [&](const std::string& k, uint64_t v) { md.add(k, GgufValue::from_unsigned(GgufValueType::kU32, v)); };
  auto f32 = [&](const std::string& k, double v) { md.add(k, GgufValue::from_float(GgufValueType::kF32, v)); };
  md.add("general.architecture", GgufValue::from_string("minimax-m2"));
  const std::string a = "minimax-m2.";
  u32(a + "block_count", uint64_t(m.L));
  u32(a + "context_length", 256);
  u32(a + "embedding_length", D);
  u32(a + "feed_forward_length", F);
  u32(a + "attention.head_count", H);
  u32(a + "attention.head_count_kv", KV);
  u32(a + "attention.key_length", hd);
  u32(a + "attention.value_length", hd);
  f32(a + "rope.freq_base", 5e6);
  f32(a + "attention.layer_norm_rms_epsilon", 1e-6);
  u32(a + "expert_count", E);
  u32(a + "expert_used_count", 2);
  u32(a + "expert_feed_forward_length", F);
  u32(a + "rope.dimension_count", hd / 2);

  std::vector<GgufTensorSpec> specs;
  std::vector<std::vector<float>> data;
  auto add = [&](const std::string& name, std::vector<uint64_t> dims, std::vector<float> v) {
    specs.push_back({name, GgmlType::kF32, std::move(dims)});
    data.push_back(std::move(v));
  };
  add("token_embd.weight", {D, V}, m.tensors.at("model.embed_tokens.weight").data);
  add("output_norm.weight", {D}, m.tensors.at("model.norm.weight").data);
  add("output.weight", {D, V}, m.tensors.at("lm_head.weight").data);
  for (int l = 0; l < int(m.L); ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".", b = "blk." + std::to_string(l) + ".";
    auto t = [&](const std::string& n) { return m.tensors.at(p + n).data; };
    add(b + "attn_norm.weight", {D}, t("input_layernorm.weight"));
    add(b + "attn_q.weight", {D, H * hd}, t("self_attn.q_proj.weight"));
    add(b + "attn_k.weight", {D, KV * hd}, t("self_attn.k_proj.weight"));
    add(b + "attn_v.weight", {D, KV * hd}, t("self_attn.v_proj.weight"));
    add(b + "attn_output.weight", {H * hd, D}, t("self_attn.o_proj.weight"));
    add(b + "attn_q_norm.weight", {H * hd}, t("self_attn.q_norm.weight"));
    add(b + "attn_k_norm.weight", {KV * hd}, t("self_attn.k_norm.weight"));
    add(b + "ffn_norm.weight", {D}, t("post_attention_layernorm.weight"));
    add(b + "ffn_gate_inp.weight", {D, E}, t("block_sparse_moe.gate.weight"));
    add(b + "exp_probs_b.bias", {E}, t("block_sparse_moe.e_score_correction_bias"));
    const char* which[3][2] = {
        {"ffn_gate_exps.weight", "w1"}, {"ffn_up_exps.weight", "w3"}, {"ffn_down_exps.weight", "w2"}};
    for (auto [gguf_name, hf_name] : which) {
      std::vector<float> stacked;
      for (uint64_t e = 0; e < E; ++e) {
        const std::vector<float> x = t("block_sparse_moe.experts." + std::to_string(e) + "." + hf_name + ".weight");
        stacked.insert(stacked.end(), x.begin(), x.end());
      }
      const bool down = std::string(hf_name) == "w2";
      add(b + gguf_name, down ? std::vector<uint64_t>{F, D, E} : std::vector<uint64_t>{D, F, E}, std::move(stacked));
    }
  }
  GgufWriter w(path, md, specs);
  for (const std::vector<float>& v : data) w.write(v.data(), v.size() * sizeof(float));
  w.commit();
}

}  // namespace moestream::test
