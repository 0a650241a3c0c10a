// Tests of the converter and what it reads: safetensors reader/writer, HF config mapping, and
// convert_model on tiny HF checkpoints written here in every layout (per-expert and fused 3-D;
// bf16 and f32; single file and sharded with index.json) for every architecture.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/file_util.h"
#include "loader/format/expert_file.h"
#include "loader/format/gguf_file.h"
#include "runtime/convert/convert.h"
#include "runtime/engine/model.h"
#include "loader/store/expert_store.h"
#include "common/half.h"
#include "runtime/convert/hf_config.h"
#include "runtime/model/dense_weights.h"
#include "kernels/cpu/quant.h"
#include "loader/format/safetensors.h"
#include "tests/support/strict_skip.h"

namespace fs = std::filesystem;
using namespace moestream;
using nlohmann::json;

namespace {

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "<no exception>";
}

struct Tensor {
  std::vector<int64_t> shape;
  std::vector<float> data;
};

// A tiny random HF model in the per-expert layout of published checkpoints. Values are rounded
// to bf16 so that saving in bf16, f16 or f32 stores the same numbers.
struct TinyHf {
  Arch arch;
  json config;
  std::map<std::string, Tensor> tensors;
  int64_t D, F, E, L, V, H, KV, hd;
};

TinyHf make_tiny(Arch arch, uint32_t seed = 1) {
  TinyHf m;
  m.arch = arch;
  m.L = 3, m.E = 8, m.V = 53, m.H = 4, m.KV = 2, m.F = 21;
  const bool given_hd = arch == Arch::kQwen3Moe || arch == Arch::kQwen2Moe;
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
    } else if (arch == Arch::kOlmoe) {
      add(p + "self_attn.q_norm.weight", {m.H * m.hd});
      add(p + "self_attn.k_norm.weight", {m.KV * m.hd});
    }
    add(p + moe + "gate.weight", {m.E, m.D});
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
      if (arch == Arch::kMixtral) {
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
  if (m.arch == Arch::kMixtral) {
    std::string x = p + "block_sparse_moe.experts." + std::to_string(e) + ".";
    return {&m.tensors.at(x + "w1.weight"), &m.tensors.at(x + "w3.weight"), &m.tensors.at(x + "w2.weight")};
  }
  std::string x = p + "mlp.experts." + std::to_string(e) + ".";
  return {&m.tensors.at(x + "gate_proj.weight"), &m.tensors.at(x + "up_proj.weight"),
          &m.tensors.at(x + "down_proj.weight")};
}

// The tensors as transformers v5 saves them: experts fused into [E, 2F, D] and [E, D, F], and
// Mixtral's block_sparse_moe renamed to mlp.
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

ConvertOptions quiet(QuantType q, std::string dense = "") {
  ConvertOptions o;
  o.quant = q;
  o.dense_dtype = dense;
  o.progress = false;
  return o;
}

std::vector<uint64_t> slot_checksums(const fs::path& model, int layer) {
  return read_expert_header(expert_file_path(model, layer)).slot_checksums;
}

bool no_temp_left(const fs::path& dir) {
  for (auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find(".tmp.") != std::string::npos) return false;
  return true;
}

}  // namespace

// ---- safetensors ----

TEST(Safetensors, WriterAndReaderRoundTripEveryFloatDtype) {
  TempDir d;
  std::vector<float> a = {1.5f, -2.25f, 3.0f, 0.0f, 65504.0f, -1e-3f};
  {
    SafetensorsWriter w(d.path() / "t.safetensors");
    w.declare("f32", DType::kF32, {2, 3});
    w.declare("bf16", DType::kBF16, {6});
    w.declare("f16", DType::kF16, {3, 2});
    w.set_metadata("format", "pt");
    w.write("f16", a.data(), a.size());  // any order
    w.write("f32", a.data(), a.size());
    w.write("bf16", a.data(), a.size());
    w.finish();
  }
  SafetensorsFile f(d.path() / "t.safetensors");
  EXPECT_EQ(f.names().size(), 3u);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.info("f32").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(f.to_float("f32"), a);
  std::vector<float> b = f.to_float("bf16"), h = f.to_float("f16");
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(b[i], bf16_to_f32(f32_to_bf16(a[i])));
    EXPECT_EQ(h[i], f16_to_f32(f32_to_f16(a[i])));
  }
  std::vector<float> part(2);
  f.read_float("f32", 3, 2, part.data());
  EXPECT_EQ(part, (std::vector<float>{0.0f, 65504.0f}));
  f.release("f32", 0, 6);  // drops our mapping only: the data reads back the same
  EXPECT_EQ(f.to_float("f32"), a);
  EXPECT_THROW(f.to_float_checked("f32", {3, 2}), FormatError);
  std::string msg = message_of([&] { f.info("nope"); });
  EXPECT_NE(msg.find("missing tensor 'nope'"), std::string::npos) << msg;
}

TEST(Safetensors, CorruptHeadersAreRejectedNamingFileAndTensor) {
  TempDir d;
  auto write_raw = [&](const std::string& header, size_t data_bytes) {
    std::string s(8, '\0');
    uint64_t n = header.size();
    std::memcpy(s.data(), &n, 8);
    s += header + std::string(data_bytes, '\x01');
    write_file_atomic(d.path() / "x.safetensors", s);
    return d.path() / "x.safetensors";
  };
  struct Case {
    std::string header;
    size_t data;
    std::string expect;
  };
  const Case cases[] = {
      {R"({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}})", 8, "'w'"},     // truncated data
      {R"({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 16]}})", 16, "needs 24"}, // shape vs span
      {R"({"w": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 2]}})", 2, "unknown dtype"},
      {R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296, 16], "data_offsets": [0, 16]}})", 16, "overflows"},
      {R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}})", 8, "'w'"},
      {R"({"w": {"dtype": "F32", "shape": [1]}})", 4, "data_offsets"},
      {R"({"w": )", 4, "not valid JSON"},
  };
  for (const Case& c : cases) {
    fs::path p = write_raw(c.header, c.data);
    std::string msg = message_of([&] { SafetensorsFile f(p); });
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.header << " -> " << msg;
    EXPECT_NE(msg.find("x.safetensors"), std::string::npos) << msg;
  }
  // Header length beyond the file.
  std::string s(8, '\0');
  uint64_t n = 1000;
  std::memcpy(s.data(), &n, 8);
  write_file_atomic(d.path() / "y.safetensors", s + "{}");
  EXPECT_THROW(SafetensorsFile(d.path() / "y.safetensors"), FormatError);
}

// ---- HF config mapping ----

TEST(HfConfig, MapsEachArchitecture) {
  ModelConfig q = model_config_from_hf(make_tiny(Arch::kQwen3Moe).config, "c");
  EXPECT_EQ(q.arch, Arch::kQwen3Moe);
  EXPECT_EQ(q.head_dim, 8);
  EXPECT_EQ(q.qk_norm, QkNorm::kPerHead);
  EXPECT_EQ(q.moe_intermediate_size, 21);
  EXPECT_TRUE(q.norm_topk_prob);
  EXPECT_EQ(q.rope_theta, 1e6);
  ModelConfig o = model_config_from_hf(make_tiny(Arch::kOlmoe).config, "c");
  EXPECT_EQ(o.qk_norm, QkNorm::kFull);
  EXPECT_EQ(o.head_dim, 9);
  EXPECT_FALSE(o.norm_topk_prob);
  ModelConfig x = model_config_from_hf(make_tiny(Arch::kMixtral).config, "c");
  EXPECT_EQ(x.n_experts, 8);
  EXPECT_TRUE(x.norm_topk_prob);
  EXPECT_EQ(x.qk_norm, QkNorm::kNone);
}

TEST(HfConfig, MapsQwen2MoeBiasesAndSharedExpert) {
  json hf = make_tiny(Arch::kQwen2Moe).config;
  ModelConfig c = model_config_from_hf(hf, "c");
  EXPECT_EQ(c.arch, Arch::kQwen2Moe);
  EXPECT_TRUE(c.qkv_bias);  // transformers' default: released configs do not name it
  EXPECT_EQ(c.shared_expert_intermediate_size, 26);
  EXPECT_EQ(c.qk_norm, QkNorm::kNone);
  EXPECT_FALSE(c.norm_topk_prob);
  EXPECT_EQ(c.head_dim, 8);
  hf["qkv_bias"] = false;
  hf["layer_types"] = json::array({"full_attention", "full_attention", "full_attention"});
  EXPECT_FALSE(model_config_from_hf(hf, "c").qkv_bias);
  // model.json keeps both; other architectures' model.json gains neither key.
  EXPECT_EQ(ModelConfig::from_json(c.to_json(), "m").shared_expert_intermediate_size, 26);
  EXPECT_TRUE(ModelConfig::from_json(c.to_json(), "m").qkv_bias);
  const json q3 = model_config_from_hf(make_tiny(Arch::kQwen3Moe).config, "c").to_json();
  EXPECT_FALSE(q3.contains("qkv_bias"));
  EXPECT_FALSE(q3.contains("shared_expert_intermediate_size"));
  // Dense MLP layers after an MoE layer (step 2 of 3 layers: 0 and 2 dense), sliding layer_types
  // without use_sliding_window and a missing shared-expert width are refused by name.
  const std::pair<const char*, json> refused[] = {
      {"mlp_only_layers", json::array({1})},
      {"mlp_only_layers", json::array({0, 1, 2})},
      {"decoder_sparse_step", 2},
      {"layer_types", json::array({"sliding_attention", "full_attention", "full_attention"})},
      {"n_shared_experts", 2}};
  for (const auto& [key, value] : refused) {
    json bad = make_tiny(Arch::kQwen2Moe).config;
    bad[key] = value;
    std::string msg = message_of([&] { model_config_from_hf(bad, "hf/config.json"); });
    EXPECT_NE(msg.find(key), std::string::npos) << key << ": " << msg;
    EXPECT_NE(msg.find("hf/config.json"), std::string::npos) << msg;
  }
  json missing = make_tiny(Arch::kQwen2Moe).config;
  missing.erase("shared_expert_intermediate_size");
  std::string msg = message_of([&] { model_config_from_hf(missing, "c"); });
  EXPECT_NE(msg.find("shared_expert_intermediate_size"), std::string::npos) << msg;
}

// Qwen2-MoE's leading dense layers (mlp_only_layers, decoder_sparse_step) become
// first_k_dense_replace; use_sliding_window its sliding layers (sweep-b).
TEST(HfConfig, MapsQwen2MoeLeadingDenseLayersAndSlidingWindows) {
  json hf = make_tiny(Arch::kQwen2Moe).config;
  hf["mlp_only_layers"] = json::array({0});
  ModelConfig c = model_config_from_hf(hf, "c");
  EXPECT_EQ(c.first_k_dense_replace, 1);
  EXPECT_EQ(c.intermediate_size, 64);
  EXPECT_EQ(ModelConfig::from_json(c.to_json(), "m").first_k_dense_replace, 1);
  hf["mlp_only_layers"] = json::array();
  hf["decoder_sparse_step"] = 3;  // (l + 1) % 3: layers 0 and 1 dense, 2 MoE
  EXPECT_EQ(model_config_from_hf(hf, "c").first_k_dense_replace, 2);
  hf["decoder_sparse_step"] = 1;
  EXPECT_EQ(model_config_from_hf(hf, "c").sliding_window, 0);  // use_sliding_window false
  hf["use_sliding_window"] = true;
  hf["sliding_window"] = 5;
  hf["max_window_layers"] = 2;  // transformers 5's default layer_types: even layers below it
  c = model_config_from_hf(hf, "c");
  EXPECT_EQ(c.sliding_window, 5);
  EXPECT_EQ(c.sliding_layers, (std::vector<bool>{true, false, false}));
  hf["layer_types"] = json::array({"full_attention", "sliding_attention", "sliding_attention"});
  c = ModelConfig::from_json(model_config_from_hf(hf, "c").to_json(), "m");
  EXPECT_EQ(c.sliding_layers, (std::vector<bool>{false, true, true}));
  EXPECT_EQ(c.window_of(1), 5);
  EXPECT_EQ(c.window_of(0), 0);
}

TEST(HfConfig, MapsGlm4MoeRoutingSharedExpertDenseLayersAndPartialRotary) {
  const fs::path fixture = fs::path(MOESTREAM_SOURCE_DIR) / "tests/fixtures/glm4_moe/config.json";
  if (!fs::exists(fixture)) MOESTREAM_SKIP_OR_FAIL() << fixture << " absent (python/training/make_fixtures.py)";
  const json hf = json::parse(read_file(fixture));
  const ModelConfig c = model_config_from_hf(hf, "c");
  EXPECT_EQ(c.arch, Arch::kGlm4Moe);
  EXPECT_EQ(c.router_scoring, RouterScoring::kSigmoid);
  EXPECT_EQ(c.n_group, 4);
  EXPECT_EQ(c.topk_group, 2);
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 2.5);
  EXPECT_EQ(c.n_experts, 16);
  EXPECT_EQ(c.shared_expert_intermediate_size, 23);  // n_shared_experts x moe_intermediate_size
  EXPECT_FALSE(c.shared_expert_gated);
  EXPECT_EQ(c.first_k_dense_replace, 1);
  EXPECT_EQ(c.intermediate_size, 61);
  EXPECT_EQ(c.rope_dim(), 8);  // partial_rotary_factor 0.5 of head_dim 16
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_EQ(c.qk_norm, QkNorm::kPerHead);
  // transformers 5 keeps partial_rotary_factor in rope_parameters; 0 shared experts is none.
  json v5 = hf;
  v5.erase("partial_rotary_factor");
  v5["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 10000.0}, {"partial_rotary_factor", 0.25}};
  v5["n_shared_experts"] = 0;
  v5["use_qk_norm"] = false;
  const ModelConfig c5 = model_config_from_hf(v5, "c");
  EXPECT_EQ(c5.rope_dim(), 4);
  EXPECT_FALSE(c5.has_shared_expert());
  EXPECT_EQ(c5.qk_norm, QkNorm::kNone);
  const std::pair<const char*, json> refused[] = {
      {"n_group", 3}, {"topk_group", 5}, {"first_k_dense_replace", 3}, {"partial_rotary_factor", 0.1}};
  for (const auto& [key, value] : refused) {
    json bad = hf;
    bad[key] = value;
    std::string msg = message_of([&] { model_config_from_hf(bad, "hf/config.json"); });
    EXPECT_NE(msg.find("hf/config.json"), std::string::npos) << key << ": " << msg;
  }
}

TEST(Convert, Glm4MoeSkipsTheMtpLayerAndKeepsTheRouterBiasFloat) {
  const fs::path fixture = fs::path(MOESTREAM_SOURCE_DIR) / "tests/fixtures/glm4_moe";
  if (!fs::exists(fixture)) MOESTREAM_SKIP_OR_FAIL() << fixture << " absent (python/training/make_fixtures.py)";
  TempDir d;
  ConvertOptions opts;
  opts.quant = QuantType::kBF16;
  opts.dense_dtype = "bf16";
  const ModelConfig c = convert_model(fixture, d.path() / "out", opts);
  EXPECT_EQ(c.n_moe_layers(), 2);
  EXPECT_TRUE(fs::exists(expert_file_path(d.path() / "out", 1)));
  EXPECT_FALSE(fs::exists(expert_file_path(d.path() / "out", 2)));
  const SafetensorsFile dense(d.path() / "out" / "dense.safetensors");
  EXPECT_EQ(dense.info("layers.1.router_bias").dtype, DType::kF32);
  EXPECT_EQ(dense.info("layers.1.wq").dtype, DType::kBF16);
  EXPECT_TRUE(dense.contains("layers.0.mlp_gate"));
  EXPECT_FALSE(dense.contains("layers.0.router"));
  EXPECT_FALSE(dense.contains("layers.3.wq"));  // the MTP layer is not converted
  // An MoE layer's bias the model does not read is refused, naming the tensor.
  TempDir bad;
  for (const char* f : {"config.json"}) fs::copy_file(fixture / f, bad.path() / f);
  {
    const SafetensorsFile src(fixture / "model.safetensors");
    SafetensorsWriter w(bad.path() / "model.safetensors");
    for (const std::string& n : src.names()) w.declare(n, DType::kF32, src.info(n).shape);
    w.declare("model.layers.1.self_attn.o_proj.bias", DType::kF32, {53});
    for (const std::string& n : src.names()) {
      std::vector<float> v(src.info(n).numel());
      src.read_float(n, 0, v.size(), v.data());
      w.write(n, v.data(), v.size());
    }
    std::vector<float> z(53, 0.0f);
    w.write("model.layers.1.self_attn.o_proj.bias", z.data(), z.size());
    w.finish();
  }
  std::string msg = message_of([&] { convert_model(bad.path(), d.path() / "out2", opts); });
  EXPECT_NE(msg.find("o_proj.bias"), std::string::npos) << msg;
}

TEST(HfConfig, ReadsRopeParametersOfTransformersV5) {
  json c = make_tiny(Arch::kQwen3Moe).config;
  c.erase("rope_theta");
  c["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 5e5}, {"factor", 4.0},
                          {"original_max_position_embeddings", 32768}};
  ModelConfig m = model_config_from_hf(c, "c");
  EXPECT_EQ(m.rope_theta, 5e5);
  ASSERT_TRUE(m.rope_scaling.has_value());
  EXPECT_EQ(m.rope_scaling->type, "yarn");
  EXPECT_EQ(m.rope_scaling->factor, 4.0);
  c["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 5e5}};
  EXPECT_FALSE(model_config_from_hf(c, "c").rope_scaling.has_value());
}

TEST(HfConfig, SettingsThatChangeTheMathsAreRejected) {
  struct Case {
    Arch arch;
    const char* key;
    json value;
  };
  const Case cases[] = {
      {Arch::kQwen3Moe, "mlp_only_layers", json::array({1})},
      {Arch::kQwen3Moe, "decoder_sparse_step", 2},
      {Arch::kQwen3Moe, "use_sliding_window", true},
      {Arch::kQwen3Moe, "attention_bias", true},
      {Arch::kQwen3Moe, "shared_expert_intermediate_size", 64},
      {Arch::kOlmoe, "clip_qkv", 8.0},
      {Arch::kMixtral, "sliding_window", 128},
      {Arch::kMixtral, "hidden_act", "gelu"},
      {Arch::kQwen3Moe, "rope_scaling", json{{"type", "longrope"}, {"factor", 2.0}}},
      {Arch::kQwen3Moe, "rope_scaling", json{{"type", "yarn"}, {"factor", 2.0}, {"mscale", 0.7}}},
  };
  for (const Case& c : cases) {
    json cfg = make_tiny(c.arch).config;
    cfg[c.key] = c.value;
    std::string msg;
    try {
      model_config_from_hf(cfg, "hf/config.json");
      msg = "<accepted>";
    } catch (const ConfigError& e) {
      msg = e.what();
    }
    EXPECT_NE(msg.find(c.key), std::string::npos) << c.key << ": " << msg;
    EXPECT_NE(msg.find("hf/config.json"), std::string::npos) << msg;
  }
  // A sliding window as long as the context never masks: accepted.
  json cfg = make_tiny(Arch::kMixtral).config;
  cfg["sliding_window"] = 256;
  EXPECT_NO_THROW(model_config_from_hf(cfg, "c"));
}

TEST(HfConfig, AcceptsTheV5NameOfTheExpertCount) {
  for (Arch arch : {Arch::kQwen3Moe, Arch::kOlmoe}) {
    json c = make_tiny(arch).config;
    c.erase("num_experts");
    c["num_local_experts"] = 12;  // transformers 5.x saves Qwen3MoeConfig this way
    EXPECT_EQ(model_config_from_hf(c, "c").n_experts, 12);
    c.erase("num_local_experts");
    std::string msg = message_of([&] { model_config_from_hf(c, "c"); });
    EXPECT_NE(msg.find("'num_experts'"), std::string::npos) << msg;
  }
}

TEST(HfConfig, UnsupportedArchitectureIsNamed) {
  json cfg = make_tiny(Arch::kQwen3Moe).config;
  cfg["architectures"] = {"LlamaForCausalLM"};
  std::string msg = message_of([&] { model_config_from_hf(cfg, "c"); });
  EXPECT_NE(msg.find("LlamaForCausalLM"), std::string::npos) << msg;
}

// ---- convert_model ----

TEST(Convert, PacksEveryArchitectureWithExactF32Experts) {
  for (Arch arch : {Arch::kQwen3Moe, Arch::kOlmoe, Arch::kMixtral, Arch::kQwen2Moe}) {
    TempDir d;
    TinyHf m = make_tiny(arch);
    save_tiny(d.path() / "hf", m, DType::kF32, false, 1);
    ModelConfig c = convert_model(d.path() / "hf", d.path() / "out", quiet(QuantType::kF32));
    ModelConfig r = ModelConfig::load(d.path() / "out");
    EXPECT_EQ(r.to_json(), c.to_json());
    EXPECT_EQ(r.arch, arch);
    EXPECT_EQ(r.dense_dtype, "bf16");  // bf16 by default, an f32 checkpoint too (issue 18)
    EXPECT_EQ(r.tokenizer_file, "tokenizer.json");
    EXPECT_TRUE(fs::exists(d.path() / "out" / "tokenizer.json"));
    EXPECT_TRUE(no_temp_left(d.path()));

    // Experts: byte-exact f32 copies of the source matrices, in gate|up|down order.
    auto store = open_pread_expert_store(d.path() / "out", r);
    ExpertLayout lay = ExpertLayout::make(QuantType::kF32, m.D, m.F);
    for (int l = 0; l < m.L; ++l) {
      std::vector<int> ids = {0, 5, 7};
      std::vector<const uint8_t*> out;
      store->fetch(l, ids, out);
      for (size_t i = 0; i < ids.size(); ++i) {
        auto [g, u, dn] = expert_tensors(m, l, ids[i]);
        EXPECT_EQ(std::memcmp(out[i] + lay.gate_offset, g->data.data(), g->data.size() * 4), 0);
        EXPECT_EQ(std::memcmp(out[i] + lay.up_offset, u->data.data(), u->data.size() * 4), 0);
        EXPECT_EQ(std::memcmp(out[i] + lay.down_offset, dn->data.data(), dn->data.size() * 4), 0);
      }
    }
    // Dense: canonical names, same values.
    SafetensorsFile dense(d.path() / "out" / "dense.safetensors");
    EXPECT_EQ(dense.to_float("embed"), m.tensors.at("model.embed_tokens.weight").data);
    EXPECT_EQ(dense.to_float("layers.2.wk"), m.tensors.at("model.layers.2.self_attn.k_proj.weight").data);
    std::string router = arch == Arch::kMixtral ? "model.layers.1.block_sparse_moe.gate.weight"
                                                : "model.layers.1.mlp.gate.weight";
    EXPECT_EQ(dense.to_float("layers.1.router"), m.tensors.at(router).data);
    EXPECT_EQ(dense.contains("layers.0.q_norm"), arch == Arch::kQwen3Moe || arch == Arch::kOlmoe);
    if (arch == Arch::kOlmoe) {
      EXPECT_EQ(dense.info("layers.0.k_norm").shape, (std::vector<int64_t>{18}));
    }
  }
}

TEST(Convert, Qwen2MoeBiasesAndSharedExpertGoToTheDenseFile) {
  for (const char* dense_dtype : {"f32", "q8"}) {
    TempDir d;
    TinyHf m = make_tiny(Arch::kQwen2Moe);
    save_tiny(d.path() / "hf", m, DType::kF32, false, 1);
    convert_model(d.path() / "hf", d.path() / "out", quiet(QuantType::kQ8, dense_dtype));
    const ModelConfig r = ModelConfig::load(d.path() / "out");
    EXPECT_EQ(r.arch, Arch::kQwen2Moe);
    EXPECT_TRUE(r.qkv_bias);
    EXPECT_EQ(r.shared_expert_intermediate_size, 26);
    // The CPU pass loads every tensor (shapes checked) and holds the gate and biases in float.
    const DenseWeights w = DenseWeights::load(d.path() / "out" / r.dense_file, r);
    const LayerWeights& l1 = w.layers[1];
    const auto& bq = m.tensors.at("model.layers.1.self_attn.q_proj.bias").data;
    ASSERT_EQ(size_t(l1.bq.size()), bq.size());
    for (size_t i = 0; i < bq.size(); ++i) EXPECT_EQ(l1.bq[Eigen::Index(i)], bq[i]) << i;
    const auto& sg = m.tensors.at("model.layers.1.mlp.shared_expert_gate.weight").data;
    ASSERT_EQ(l1.shared_expert_gate.rows(), 1);
    for (size_t i = 0; i < sg.size(); ++i) EXPECT_EQ(l1.shared_expert_gate(0, Eigen::Index(i)), sg[i]) << i;
    EXPECT_EQ(l1.shared_gate.rows, 26u);
    EXPECT_EQ(l1.shared_down.cols, 26u);
    EXPECT_EQ(l1.bk.size(), 16);
    if (std::string(dense_dtype) == "f32") {
      SafetensorsFile dense(d.path() / "out" / "dense.safetensors");
      EXPECT_EQ(dense.to_float("layers.2.shared_down"),
                m.tensors.at("model.layers.2.mlp.shared_expert.down_proj.weight").data);
      EXPECT_EQ(dense.to_float("layers.0.bv"), m.tensors.at("model.layers.0.self_attn.v_proj.bias").data);
    }
  }
  // A shared expert in an architecture without one is refused, naming the tensor.
  TempDir d;
  TinyHf m = make_tiny(Arch::kQwen3Moe);
  m.tensors["model.layers.0.mlp.shared_expert_gate.weight"] = Tensor{{1, m.D}, std::vector<float>(size_t(m.D), 1.0f)};
  save_tiny(d.path() / "hf", m, DType::kF32, false, 1);
  std::string msg = message_of([&] { convert_model(d.path() / "hf", d.path() / "out", quiet(QuantType::kQ4)); });
  EXPECT_NE(msg.find("shared_expert_gate"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(d.path() / "out"));
}

TEST(Convert, EveryLayoutDtypeAndShardingGivesIdenticalExperts) {
  for (Arch arch : {Arch::kQwen3Moe, Arch::kOlmoe, Arch::kMixtral}) {
    TempDir d;
    TinyHf m = make_tiny(arch, 7);
    struct Variant {
      const char* name;
      DType dtype;
      bool fused;
      int shards;
    };
    const Variant variants[] = {{"pe_f32_1", DType::kF32, false, 1},
                                {"pe_bf16_3", DType::kBF16, false, 3},
                                {"fu_bf16_1", DType::kBF16, true, 1},
                                {"fu_f32_2", DType::kF32, true, 2},
                                {"pe_f16_2", DType::kF16, false, 2}};
    std::vector<std::vector<uint64_t>> ref;
    std::vector<float> ref_router;
    for (const Variant& v : variants) {
      save_tiny(d.path() / v.name, m, v.dtype, v.fused, v.shards);
      fs::path out = d.path() / (std::string(v.name) + ".out");
      convert_model(d.path() / v.name, out, quiet(QuantType::kQ4, "f32"));
      std::vector<std::vector<uint64_t>> sums;
      for (int l = 0; l < m.L; ++l) sums.push_back(slot_checksums(out, l));
      SafetensorsFile dense(out / "dense.safetensors");
      if (ref.empty()) {
        ref = sums;
        ref_router = dense.to_float("layers.2.router");
      } else {
        EXPECT_EQ(sums, ref) << arch_name(arch) << " " << v.name;
        EXPECT_EQ(dense.to_float("layers.2.router"), ref_router) << arch_name(arch) << " " << v.name;
      }
      if (v.shards == 3) {  // one worker or five: the same file
        ConvertOptions one = quiet(QuantType::kQ4, "f32"), five = one;
        one.threads = 1;
        five.threads = 5;
        convert_model(d.path() / v.name, out.string() + ".t1", one);
        convert_model(d.path() / v.name, out.string() + ".t5", five);
        EXPECT_EQ(read_file(expert_file_path(out.string() + ".t1", 1)), read_file(expert_file_path(out, 1)));
        EXPECT_EQ(read_file(expert_file_path(out.string() + ".t5", 1)), read_file(expert_file_path(out, 1)));
      }
      json src = json::parse(read_file(out / "model.json"))["source"];
      EXPECT_EQ(src["expert_layout"], v.fused ? "fused" : "per_expert");
      EXPECT_EQ(src["shards"], v.shards);
    }
  }
}

TEST(Convert, QuantisedExpertsDecodeCloseToTheSource) {
  TempDir d;
  TinyHf m = make_tiny(Arch::kQwen3Moe, 3);
  save_tiny(d.path() / "hf", m, DType::kBF16, false, 1);
  for (QuantType q : {QuantType::kBF16, QuantType::kQ8, QuantType::kQ4}) {
    fs::path out = d.path() / std::string(quant_name(q));
    ModelConfig c = convert_model(d.path() / "hf", out, quiet(q));
    EXPECT_EQ(c.dense_dtype, "bf16");
    auto store = open_pread_expert_store(out, c);
    std::vector<int> ids = {6};
    std::vector<const uint8_t*> p;
    store->fetch(2, ids, p);
    ExpertLayout lay = ExpertLayout::make(q, m.D, m.F);
    auto [g, u, dn] = expert_tensors(m, 2, 6);
    std::vector<float> back(m.D * m.F);
    dequantize_matrix(q, p[0] + lay.down_offset, m.D, m.F, back.data());
    double tol = q == QuantType::kBF16 ? 0.0 : q == QuantType::kQ8 ? 0.02 : 0.5;  // vs weights ~N(0, 0.5)
    for (size_t i = 0; i < back.size(); ++i) ASSERT_NEAR(back[i], dn->data[i], tol) << quant_name(q);
  }
}

TEST(Convert, MissingTensorIsNamedAndNothingIsLeftBehind) {
  TempDir d;
  TinyHf m = make_tiny(Arch::kOlmoe);
  m.tensors.erase("model.layers.1.mlp.experts.3.up_proj.weight");
  save_tiny(d.path() / "hf", m, DType::kBF16, false, 2);
  std::string msg = message_of([&] { convert_model(d.path() / "hf", d.path() / "out", quiet(QuantType::kQ8)); });
  EXPECT_NE(msg.find("missing tensor 'model.layers.1.mlp.experts.3.up_proj.weight'"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(d.path() / "out"));
  EXPECT_TRUE(no_temp_left(d.path()));

  TinyHf m2 = make_tiny(Arch::kMixtral);
  m2.tensors.erase("model.layers.0.self_attn.o_proj.weight");
  save_tiny(d.path() / "hf2", m2, DType::kF32, false, 1);
  msg = message_of([&] { convert_model(d.path() / "hf2", d.path() / "out2", quiet(QuantType::kQ8)); });
  EXPECT_NE(msg.find("model.layers.0.self_attn.o_proj.weight"), std::string::npos) << msg;
}

TEST(Convert, ShapeMismatchNamesTensorAndBothShapes) {
  TempDir d;
  TinyHf m = make_tiny(Arch::kQwen3Moe);
  m.tensors["model.layers.2.mlp.experts.0.down_proj.weight"].shape = {m.F, m.D};  // transposed
  save_tiny(d.path() / "hf", m, DType::kF32, false, 1);
  std::string msg = message_of([&] { convert_model(d.path() / "hf", d.path() / "out", quiet(QuantType::kQ4)); });
  EXPECT_NE(msg.find("model.layers.2.mlp.experts.0.down_proj.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[21, 37]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[37, 21]"), std::string::npos) << msg;
}

TEST(Convert, UnsupportedArchitectureAndBiasesAreRejected) {
  TempDir d;
  TinyHf m = make_tiny(Arch::kQwen3Moe);
  json cfg = m.config;
  cfg["architectures"] = {"ArcticForCausalLM"};
  save_hf(d.path() / "hf", cfg, m.tensors, DType::kF32, 1);
  EXPECT_THROW(convert_model(d.path() / "hf", d.path() / "out", quiet(QuantType::kQ4)), ConfigError);
  m.tensors["model.layers.0.self_attn.q_proj.bias"] = Tensor{{32}, std::vector<float>(32, 1.0f)};
  save_hf(d.path() / "hf2", m.config, m.tensors, DType::kF32, 1);
  std::string msg = message_of([&] { convert_model(d.path() / "hf2", d.path() / "out", quiet(QuantType::kQ4)); });
  EXPECT_NE(msg.find("q_proj.bias"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(d.path() / "out"));
}

TEST(Convert, ExistingOutputIsKeptUnlessForced) {
  TempDir d;
  TinyHf m = make_tiny(Arch::kMixtral);
  save_tiny(d.path() / "hf", m, DType::kBF16, true, 1);
  fs::create_directories(d.path() / "out");
  write_file_atomic(d.path() / "out" / "keep.txt", "x");
  EXPECT_THROW(convert_model(d.path() / "hf", d.path() / "out", quiet(QuantType::kQ4)), ConfigError);
  EXPECT_TRUE(fs::exists(d.path() / "out" / "keep.txt"));
  ConvertOptions o = quiet(QuantType::kQ4);
  o.overwrite = true;
  convert_model(d.path() / "hf", d.path() / "out", o);
  EXPECT_FALSE(fs::exists(d.path() / "out" / "keep.txt"));
  EXPECT_TRUE(fs::exists(d.path() / "out" / "model.json"));
  EXPECT_TRUE(no_temp_left(d.path()));
}

// ---- the CLI ----

namespace {
struct CliResult {
  int status;
  std::string output;
};
CliResult run_cli(const std::string& args) {
  std::string cmd = std::string(MOESTREAM_BIN_DIR) + "/convert_model " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  CliResult r{-1, ""};
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}
}  // namespace

TEST(ConvertCli, BadInputExitsNonZeroWithTheMessage) {
  if (!fs::exists(fs::path(MOESTREAM_BIN_DIR) / "convert_model"))
    MOESTREAM_SKIP_OR_FAIL() << "convert_model not built in " << MOESTREAM_BIN_DIR;
  TempDir d;
  TinyHf m = make_tiny(Arch::kQwen3Moe);
  m.tensors.erase("model.layers.0.mlp.gate.weight");
  save_tiny(d.path() / "hf", m, DType::kBF16, false, 1);
  CliResult r = run_cli(d.path().string() + "/hf " + d.path().string() + "/out -q");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("missing tensor 'model.layers.0.mlp.gate.weight'"), std::string::npos) << r.output;
  r = run_cli(d.path().string() + "/nonexistent " + d.path().string() + "/out");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("config.json"), std::string::npos) << r.output;
  r = run_cli(d.path().string() + "/hf " + d.path().string() + "/out --quant q3");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("q3"), std::string::npos) << r.output;
}

TEST(ConvertCli, ConvertsAndReportsWithProgress) {
  if (!fs::exists(fs::path(MOESTREAM_BIN_DIR) / "convert_model"))
    MOESTREAM_SKIP_OR_FAIL() << "convert_model not built in " << MOESTREAM_BIN_DIR;
  TempDir d;
  save_tiny(d.path() / "hf", make_tiny(Arch::kOlmoe), DType::kBF16, true, 2);
  CliResult r = run_cli(d.path().string() + "/hf " + d.path().string() + "/out --quant q8");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("100%"), std::string::npos) << r.output;
  EXPECT_EQ(ModelConfig::load(d.path() / "out").expert_quant, QuantType::kQ8);
}

// --dense-quant q8 where some rows are whole Q8_0 blocks and some are not: Qwen3's tiny model has
// D = 37 (embed, lm_head, wq, wk, wv fall back to BF16, the encoding of bf16's dense.safetensors)
// and H*hd = 32 (wo in Q8_0). Logits against the bf16 pack: only wo differs, by Q8_0's rounding
// (relative error <= 1/254 of a block's largest weight), so within 2% of the largest logit.
TEST(Convert, DenseQ8UsesQ8_0WhereRowsAreWholeBlocksAndBf16Elsewhere) {
  TempDir d;
  TinyHf m = make_tiny(Arch::kQwen3Moe, 3);
  save_tiny(d.path() / "hf", m, DType::kF32, false, 1);
  const ModelConfig q8 = convert_model(d.path() / "hf", d.path() / "q8", quiet(QuantType::kQ8, "q8"));
  const ModelConfig bf = convert_model(d.path() / "hf", d.path() / "bf", quiet(QuantType::kQ8, "bf16"));
  EXPECT_EQ(q8.dense_dtype, "gguf");
  EXPECT_EQ(q8.dense_file, "dense.gguf");
  EXPECT_EQ(q8.to_json()["format_version"], 2);
  EXPECT_EQ(bf.to_json()["format_version"], 1);
  EXPECT_FALSE(fs::exists(d.path() / "q8" / "dense.safetensors"));
  const GgufFile g(d.path() / "q8" / "dense.gguf");
  EXPECT_EQ(g.tensor("embed").type, GgmlType::kBF16);
  EXPECT_EQ(g.tensor("layers.2.wq").type, GgmlType::kBF16);
  EXPECT_EQ(g.tensor("layers.1.wo").type, GgmlType::kQ8_0);
  EXPECT_EQ(g.tensor("layers.1.router").type, GgmlType::kF32);
  EXPECT_EQ(g.tensor("layers.0.q_norm").type, GgmlType::kF32);
  EXPECT_EQ(g.tensor("embed").dims, (std::vector<uint64_t>{uint64_t(m.D), uint64_t(m.V)}));

  ModelOptions mo;
  mo.n_threads = 2;
  const std::vector<int> prompt = {3, 17, 40, 5, 22};
  std::vector<float> a(prompt.size() * size_t(m.V)), b(a.size());
  Model::load(d.path() / "q8", mo)->forward(prompt, a, true);
  Model::load(d.path() / "bf", mo)->forward(prompt, b, true);
  float diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(a[i] - b[i]));
    scale = std::max(scale, std::fabs(b[i]));
  }
  EXPECT_GT(diff, 0.0f);  // wo really is Q8_0
  EXPECT_LE(diff, 0.02f * scale);
}

TEST(Convert, DenseQuantOtherThanBf16Q8F32IsRefused) {
  TempDir d;
  save_tiny(d.path() / "hf", make_tiny(Arch::kOlmoe), DType::kF32, false, 1);
  EXPECT_THROW(convert_model(d.path() / "hf", d.path() / "out", quiet(QuantType::kQ8, "q4")), ConfigError);
  const std::string msg = message_of([&] { convert_model(d.path() / "hf", d.path() / "out", quiet(QuantType::kQ8, "q4")); });
  EXPECT_NE(msg.find("'q4'"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(d.path() / "out"));
}

// DeepSeek-V2/V3 configs (the fixtures' own config.json): MLA sizes, head_dim as q/k head width
// (transformers saves the RoPE part there), routing per version; what the runtime does not
// implement is refused naming the key.
TEST(HfConfig, DeepseekMlaConfigsAndTheirRefusals) {
  const fs::path fx = fs::path(MOESTREAM_SOURCE_DIR) / "tests" / "fixtures";
  const json v3 = json::parse(read_file(fx / "deepseek_v3" / "config.json"));
  const json v2 = json::parse(read_file(fx / "deepseek_v2" / "config.json"));
  const ModelConfig c3 = model_config_from_hf(v3, "v3");
  EXPECT_EQ(c3.arch, Arch::kDeepseekV3);
  EXPECT_EQ(c3.head_dim, v3["qk_nope_head_dim"].get<int>() + v3["qk_rope_head_dim"].get<int>());
  EXPECT_EQ(c3.kv_lora_rank, v3["kv_lora_rank"].get<int>());
  EXPECT_EQ(c3.q_lora_rank, v3["q_lora_rank"].get<int>());
  EXPECT_EQ(c3.n_kv_heads, c3.n_heads);
  EXPECT_EQ(c3.router_scoring, RouterScoring::kSigmoid);
  ASSERT_TRUE(c3.rope_scaling.has_value());
  EXPECT_EQ(c3.rope_scaling->mscale, 0.9);
  EXPECT_EQ(c3.rope_scaling->mscale_all_dim, 0.7);
  const ModelConfig c2 = model_config_from_hf(v2, "v2");
  EXPECT_EQ(c2.arch, Arch::kDeepseekV2);
  EXPECT_EQ(c2.q_lora_rank, 0);  // null: a plain q_proj
  EXPECT_EQ(c2.router_scoring, RouterScoring::kSoftmax);
  EXPECT_EQ(c2.shared_expert_intermediate_size, 2 * c2.moe_intermediate_size);
  EXPECT_FALSE(c2.shared_expert_gated);
  // model.json round trip keeps the MLA block.
  const ModelConfig back = ModelConfig::from_json(c3.to_json(), "model.json");
  EXPECT_EQ(back.kv_lora_rank, c3.kv_lora_rank);
  EXPECT_EQ(back.rope_scaling->mscale_all_dim, 0.7);

  struct Case {
    const json* base;
    const char* key;
    json value;
  };
  const Case cases[] = {
      {&v3, "scoring_func", "softmax"},
      {&v3, "topk_method", "greedy"},
      {&v2, "topk_method", "noaux_tc"},
      {&v2, "scoring_func", "sigmoid"},
  };
  for (const Case& c : cases) {
    json cfg = *c.base;
    cfg[c.key] = c.value;
    std::string msg = "<accepted>";
    try {
      model_config_from_hf(cfg, "hf/config.json");
    } catch (const ConfigError& e) {
      msg = e.what();
    }
    EXPECT_NE(msg.find(c.key), std::string::npos) << c.key << ": " << msg;
  }
  // DeepSeek-V2's group_limited_greedy (issue 20): groups, kept groups and the scaling are read
  // and survive model.json; groups that do not split the experts or hold k are refused.
  json g2 = v2;
  g2["topk_method"] = "group_limited_greedy";
  g2["n_group"] = 4;
  g2["topk_group"] = 2;
  g2["routed_scaling_factor"] = 16.0;
  const ModelConfig cg = model_config_from_hf(g2, "v2");
  EXPECT_EQ(cg.router_scoring, RouterScoring::kSoftmax);
  EXPECT_EQ(cg.n_group, 4);
  EXPECT_EQ(cg.topk_group, 2);
  EXPECT_EQ(cg.routed_scaling_factor, 16.0);
  EXPECT_FALSE(cg.norm_topk_prob);
  const ModelConfig cg_back = ModelConfig::from_json(cg.to_json(), "model.json");
  EXPECT_EQ(cg_back.n_group, 4);
  EXPECT_EQ(cg_back.topk_group, 2);
  EXPECT_EQ(cg_back.routed_scaling_factor, 16.0);
  // "greedy" ignores the groups (transformers does), but not the scaling.
  json greedy = g2;
  greedy["topk_method"] = "greedy";
  EXPECT_EQ(model_config_from_hf(greedy, "v2").n_group, 1);
  EXPECT_EQ(model_config_from_hf(greedy, "v2").routed_scaling_factor, 16.0);
  for (const auto& [ng, tg] : {std::pair{5, 2}, std::pair{4, 5}, std::pair{12, 1}}) {
    json bad = g2;
    bad["n_group"] = ng;
    bad["topk_group"] = tg;
    const std::string msg = message_of([&] { model_config_from_hf(bad, "hf/config.json"); });
    EXPECT_NE(msg.find("group_limited_greedy"), std::string::npos) << ng << "/" << tg << ": " << msg;
  }
  // A model.json asking groups of gpt-oss's top-k softmax router was not written by us.
  json gj = cg.to_json();
  gj["router_softmax_topk"] = true;
  EXPECT_THROW(ModelConfig::from_json(gj, "model.json"), FormatError);

  // A model.json naming MLA sizes for another architecture was not written by us.
  json j = c3.to_json();
  j["architecture"] = "qwen3_moe";
  EXPECT_THROW(ModelConfig::from_json(j, "model.json"), FormatError);
  // Nor one asking MLA for gpt-oss's attention pieces, which MlaAttention does not have.
  for (const auto& [key, value] : {std::pair<const char*, json>{"attention_sinks", true}, {"o_bias", true}}) {
    json g = c3.to_json();
    g[key] = value;
    std::string msg = "<accepted>";
    try {
      ModelConfig::from_json(g, "model.json");
    } catch (const FormatError& e) {
      msg = e.what();
    }
    EXPECT_NE(msg.find("mla"), std::string::npos) << key << ": " << msg;
  }
}

// Configs python/training/arch_sweep.py (sweep-a) found read otherwise than transformers reads them.
TEST(HfConfig, SweepAGlm4MoeScaledRopeParametersAndDefaultHeadDim) {
  const fs::path fixture = fs::path(MOESTREAM_SOURCE_DIR) / "tests/fixtures/glm4_moe/config.json";
  if (!fs::exists(fixture)) MOESTREAM_SKIP_OR_FAIL() << fixture << " absent (python/training/make_fixtures.py)";
  const json hf = json::parse(read_file(fixture));
  // transformers 5 saves a scaled GLM's partial_rotary_factor inside rope_parameters, with the yarn keys.
  json v5 = hf;
  v5.erase("partial_rotary_factor");
  v5.erase("rope_scaling");
  v5["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 10000.0}, {"factor", 4.0},
                           {"original_max_position_embeddings", 64}, {"partial_rotary_factor", 0.25}};
  const ModelConfig c = model_config_from_hf(v5, "c");
  ASSERT_TRUE(c.rope_scaling.has_value());
  EXPECT_EQ(c.rope_scaling->type, "yarn");
  EXPECT_EQ(c.rope_dim(), 4);
  // Elsewhere the key is not read, so it is still refused.
  json q = make_tiny(Arch::kQwen3Moe).config;
  q["rope_scaling"] = v5["rope_parameters"];
  const std::string msg = message_of([&] { model_config_from_hf(q, "hf/config.json"); });
  EXPECT_NE(msg.find("partial_rotary_factor"), std::string::npos) << msg;
  // Glm4MoeConfig's head_dim defaults to 128, not hidden_size / num_attention_heads.
  json no_hd = hf;
  no_hd.erase("head_dim");
  EXPECT_EQ(model_config_from_hf(no_hd, "c").head_dim, 128);
  // Token ids outside a shrunk vocabulary (a release's ids kept) are dropped, in-range ones kept.
  json ids = hf;
  ids["bos_token_id"] = 100000;
  ids["eos_token_id"] = json::array({7, 8});
  const ModelConfig ct = model_config_from_hf(ids, "c");
  EXPECT_FALSE(ct.bos_token_id.has_value());
  EXPECT_EQ(ct.eos_token_id, 7);
  EXPECT_NO_THROW(ModelConfig::from_json(ct.to_json(), "model.json"));
}

TEST(Convert, SweepADeepseekV3RopeInterleaveNullAndMoeLayerFreq) {
  const fs::path fixture = fs::path(MOESTREAM_SOURCE_DIR) / "tests/fixtures/deepseek_v3";
  if (!fs::exists(fixture)) MOESTREAM_SKIP_OR_FAIL() << fixture << " absent (python/training/make_fixtures.py)";
  const json hf = json::parse(read_file(fixture / "config.json"));
  TempDir d;
  ConvertOptions opts;
  opts.quant = QuantType::kF32;
  opts.dense_dtype = "f32";
  opts.progress = false;
  // A checkpoint dir with this config and the fixture's tensors but `drop`.
  auto variant = [&](const std::string& name, const json& cfg, const std::string& drop) {
    const fs::path dir = d.path() / name;
    fs::create_directories(dir);
    write_file_atomic(dir / "config.json", cfg.dump(2));
    const SafetensorsFile src(fixture / "model.safetensors");
    SafetensorsWriter w(dir / "model.safetensors");
    for (const std::string& n : src.names())
      if (n != drop) w.declare(n, DType::kF32, src.info(n).shape);
    for (const std::string& n : src.names()) {
      if (n == drop) continue;
      std::vector<float> v(src.info(n).numel());
      src.read_float(n, 0, v.size(), v.data());
      w.write(n, v.data(), v.size());
    }
    w.finish();
    return dir;
  };
  // rope_interleave null: transformers tests it for truth, so the pairs are rotate-half's (false).
  auto dense_of = [&](const json& interleave) {
    json cfg = hf;
    cfg["rope_interleave"] = interleave;
    const std::string tag = interleave.dump();
    convert_model(variant("in_" + tag, cfg, ""), d.path() / ("out_" + tag), opts);
    return read_file(d.path() / ("out_" + tag) / "dense.safetensors");
  };
  const std::string as_null = dense_of(nullptr);
  EXPECT_EQ(as_null, dense_of(false));
  EXPECT_NE(as_null, dense_of(true));
  // moe_layer_freq: transformers ignores it (every layer from first_k_dense_replace is MoE) ...
  json freq = hf;
  freq["moe_layer_freq"] = 2;
  EXPECT_EQ(convert_model(variant("freq", freq, ""), d.path() / "out_freq", opts).n_moe_layers(), 2);
  // ... and a checkpoint with a dense layer among them (the original remote code's layout) is refused.
  const std::string msg = message_of(
      [&] { convert_model(variant("freq_dense", freq, "model.layers.2.mlp.gate.weight"), d.path() / "o", opts); });
  EXPECT_NE(msg.find("moe_layer_freq"), std::string::npos) << msg;
}
