// gpt-oss's pieces one by one (the fixtures check them together against transformers in
// reference_test): config.json mapping, model.json keys and their validation, the expert files'
// bias section, the router and activation maths, the MXFP4 block reordering, and the converter's
// chat_template.jinja merge.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <span>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/file_util.h"
#include "loader/format/expert_file.h"
#include "loader/format/model_config.h"
#include "runtime/convert/convert.h"
#include "runtime/convert/convert_gpt_oss.h"
#include "runtime/convert/hf_config.h"
#include "runtime/convert/model_shapes.h"
#include "runtime/engine/model.h"
#include "runtime/model/expert_compute.h"  // clamped_swiglu
#include "runtime/model/routing.h"
#include "tests/support/greedy_compare.h"
#include "tests/support/logit_compare.h"
#include "tests/support/strict_skip.h"
#include "tests/support/test_model.h"

namespace fs = std::filesystem;
using namespace moestream;
using nlohmann::json;

namespace {

const fs::path kFixture = fs::path(MOESTREAM_SOURCE_DIR) / "tests" / "fixtures" / "gpt_oss";

json fixture_config() {
  if (!fs::exists(kFixture / "config.json")) return json();
  return json::parse(read_file(kFixture / "config.json"));
}

// The fixture converted to an f32 pack at `out` (nothing rounded: transformers' numbers).
void convert_fixture_f32(const fs::path& out) {
  ConvertOptions co;
  co.progress = false;
  co.quant = QuantType::kF32;
  co.dense_dtype = "f32";
  convert_model(kFixture, out, co);
}

// Options whose sliding layers' KV rings hold window + 1 positions (max_batch 2; the fixture's
// window is 6): a prompt of more than 7 tokens wraps them.
ModelOptions two_token_batch_options(int max_context) {
  ModelOptions mo;
  mo.n_threads = 2;
  mo.max_batch = 2;
  mo.max_context = max_context;
  return mo;
}

}  // namespace

TEST(GptOssConfig, MapsEveryPieceOfTheMaths) {
  const json hf = fixture_config();
  if (hf.is_null()) MOESTREAM_SKIP_OR_FAIL() << "fixture " << kFixture << " absent";
  const ModelConfig c = model_config_from_hf(hf, "c");
  EXPECT_EQ(c.arch, Arch::kGptOss);
  EXPECT_TRUE(c.attention_sinks && c.o_bias && c.qkv_bias && c.router_bias && c.router_softmax_topk && c.expert_bias);
  EXPECT_FALSE(c.norm_topk_prob);
  EXPECT_EQ(c.qk_norm, QkNorm::kNone);
  EXPECT_EQ(c.sliding_window, 6);
  EXPECT_EQ(c.window_of(0), 6);
  EXPECT_EQ(c.window_of(1), 0);
  EXPECT_EQ(c.window_of(2), 6);
  EXPECT_DOUBLE_EQ(c.swiglu_limit, 1.25);
  EXPECT_DOUBLE_EQ(c.swiglu_alpha, 1.702);
  ASSERT_TRUE(c.rope_scaling.has_value());
  EXPECT_EQ(c.rope_scaling->type, "yarn");
  EXPECT_FALSE(c.rope_scaling->truncate);
  EXPECT_EQ(c.moe_intermediate_size, 32);

  // Without layer_types, transformers' default: even layers slide.
  json no_types = hf;
  no_types.erase("layer_types");
  const ModelConfig d = model_config_from_hf(no_types, "c");
  EXPECT_EQ(d.sliding_layers, (std::vector<bool>{true, false, true}));

  json bad = hf;
  bad["layer_types"][1] = "chunked_attention";
  EXPECT_NE(test::error_message([&] { model_config_from_hf(bad, "hf/config.json"); }).find("layer_types"),
            std::string::npos);
  bad = hf;
  bad["attention_bias"] = false;  // no q/k/v/o biases (arch_sweep_b checks it against transformers)
  const ModelConfig nb = model_config_from_hf(bad, "c");
  EXPECT_FALSE(nb.qkv_bias);
  EXPECT_FALSE(nb.o_bias);
  EXPECT_TRUE(nb.router_bias && nb.expert_bias);
  bad = hf;
  bad["layer_types"] = json::array({"full_attention"});
  EXPECT_THROW(model_config_from_hf(bad, "c"), FormatError);
}

// config.json in the style of the released openai/gpt-oss-20b (transformers 4.55: rope_scaling and
// rope_theta, quantization_config, training-only keys) maps to what synth_model's shape says.
TEST(GptOssConfig, ReleasedConfigMapsToTheKnownShape) {
  json lt = json::array();
  for (int l = 0; l < 24; ++l) lt.push_back(l % 2 == 0 ? "sliding_attention" : "full_attention");
  const json hf = {
      {"architectures", {"GptOssForCausalLM"}}, {"attention_bias", true}, {"attention_dropout", 0.0},
      {"eos_token_id", 200002}, {"experts_per_token", 4}, {"head_dim", 64}, {"hidden_act", "silu"},
      {"hidden_size", 2880}, {"initial_context_length", 4096}, {"initializer_range", 0.02},
      {"intermediate_size", 2880}, {"layer_types", lt}, {"max_position_embeddings", 131072},
      {"model_type", "gpt_oss"}, {"num_attention_heads", 64}, {"num_experts_per_tok", 4},
      {"num_hidden_layers", 24}, {"num_key_value_heads", 8}, {"num_local_experts", 32},
      {"output_router_logits", false}, {"pad_token_id", 199999},
      {"quantization_config", {{"modules_to_not_convert", {"model.layers.*.self_attn"}}, {"quant_method", "mxfp4"}}},
      {"rms_norm_eps", 1e-05},
      {"rope_scaling", {{"beta_fast", 32.0}, {"beta_slow", 1.0}, {"factor", 32.0},
                        {"original_max_position_embeddings", 4096}, {"rope_type", "yarn"}, {"truncate", false}}},
      {"rope_theta", 150000}, {"router_aux_loss_coef", 0.9}, {"sliding_window", 128}, {"swiglu_limit", 7.0},
      {"tie_word_embeddings", false}, {"use_cache", true}, {"vocab_size", 201088}};
  const ModelConfig c = model_config_from_hf(hf, "config.json");
  const ModelConfig k = known_shape("gpt-oss-20b");
  EXPECT_EQ(c.arch, k.arch);
  EXPECT_EQ(c.vocab_size, k.vocab_size);
  EXPECT_EQ(c.hidden_size, k.hidden_size);
  EXPECT_EQ(c.n_layers, k.n_layers);
  EXPECT_EQ(c.n_heads, k.n_heads);
  EXPECT_EQ(c.n_kv_heads, k.n_kv_heads);
  EXPECT_EQ(c.head_dim, k.head_dim);
  EXPECT_EQ(c.moe_intermediate_size, k.moe_intermediate_size);
  EXPECT_EQ(c.n_experts, k.n_experts);
  EXPECT_EQ(c.n_experts_per_tok, k.n_experts_per_tok);
  EXPECT_EQ(c.max_position_embeddings, k.max_position_embeddings);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, k.rms_norm_eps);
  EXPECT_DOUBLE_EQ(c.rope_theta, k.rope_theta);
  EXPECT_EQ(c.sliding_window, k.sliding_window);
  EXPECT_EQ(c.sliding_layers, k.sliding_layers);
  EXPECT_DOUBLE_EQ(c.swiglu_limit, k.swiglu_limit);
  EXPECT_DOUBLE_EQ(c.swiglu_alpha, k.swiglu_alpha);
  ASSERT_TRUE(c.rope_scaling && k.rope_scaling);
  EXPECT_DOUBLE_EQ(c.rope_scaling->factor, k.rope_scaling->factor);
  EXPECT_DOUBLE_EQ(c.rope_scaling->original_max_position_embeddings, k.rope_scaling->original_max_position_embeddings);
  EXPECT_EQ(c.rope_scaling->truncate, k.rope_scaling->truncate);
  EXPECT_EQ(c.eos_token_id, 200002);
  EXPECT_TRUE(c.attention_sinks == k.attention_sinks && c.o_bias == k.o_bias && c.qkv_bias == k.qkv_bias &&
              c.router_bias == k.router_bias && c.router_softmax_topk == k.router_softmax_topk &&
              c.expert_bias == k.expert_bias && c.norm_topk_prob == k.norm_topk_prob);
}

TEST(GptOssConfig, ModelJsonKeysRoundTripAndAreValidated) {
  const json hf = fixture_config();
  if (hf.is_null()) MOESTREAM_SKIP_OR_FAIL() << "fixture " << kFixture << " absent";
  ModelConfig c = model_config_from_hf(hf, "c");
  c.expert_quant = QuantType::kBF16;
  const json j = c.to_json();
  EXPECT_EQ(j["format_version"], 2);  // experts.bias needs a reader that knows the bias section
  EXPECT_EQ(j["experts"]["bias"], true);
  EXPECT_EQ(j["rope"]["scaling"]["truncate"], false);
  const ModelConfig r = ModelConfig::from_json(j, "model.json");
  EXPECT_EQ(r.sliding_layers, c.sliding_layers);
  EXPECT_EQ(r.sliding_window, 6);
  EXPECT_TRUE(r.attention_sinks && r.o_bias && r.router_bias && r.router_softmax_topk && r.expert_bias);
  EXPECT_DOUBLE_EQ(r.swiglu_limit, 1.25);
  EXPECT_FALSE(r.rope_scaling->truncate);
  EXPECT_TRUE(r.expert_layout(0).types.bias);

  struct Bad {
    const char* key;
    std::function<void(json&)> edit;
  };
  const Bad cases[] = {
      {"layer_types", [](json& m) { m["layer_types"].erase(0); }},
      {"layer_types", [](json& m) { m["layer_types"][0] = "sliding"; }},
      {"layer_types", [](json& m) { m.erase("layer_types"); }},
      {"swiglu.limit", [](json& m) { m["swiglu"]["limit"] = 0; }},
      {"swiglu", [](json& m) { m["swiglu"] = 7; }},
      {"experts.bias", [](json& m) { m["format_version"] = 1; m["experts"]["quant"] = "bf16"; }},
      {"attention_sinks", [](json& m) { m["attention_sinks"] = "yes"; }},
      // layers.N.router_bias is GLM-4.5's selection-only bias under sigmoid scoring: never both.
      {"router_bias", [](json& m) { m["router_scoring"] = "sigmoid"; }},
      {"router_softmax_topk", [](json& m) { m["router_scoring"] = "sigmoid"; m.erase("router_bias"); }},
  };
  for (const Bad& b : cases) {
    json m = j;
    b.edit(m);
    const std::string msg = test::error_message([&] { ModelConfig::from_json(m, "dir/model.json"); });
    EXPECT_NE(msg.find(b.key), std::string::npos) << b.key << ": " << msg;
    EXPECT_NE(msg.find("dir/model.json"), std::string::npos) << msg;
  }
  // Every other architecture's model.json is as before: none of the new keys.
  ModelConfig q = make_model_config(Arch::kQwen3Moe, {100, 64, 2, 4, 2, 16, 32, 8, 2, 64}, QkNorm::kPerHead,
                                    QuantType::kQ4);
  const json qj = q.to_json();
  for (const char* k : {"attention_sinks", "o_bias", "sliding_window", "layer_types", "router_bias",
                        "router_softmax_topk", "swiglu"})
    EXPECT_FALSE(qj.contains(k)) << k;
  EXPECT_FALSE(qj["experts"].contains("bias"));
  EXPECT_EQ(qj["format_version"], 1);
}

TEST(GptOssExperts, BiasSectionFollowsDownAndTheHeaderCarriesIt) {
  const ExpertTypes t{ggml_quant(GgmlType::kMXFP4), ggml_quant(GgmlType::kMXFP4), ggml_quant(GgmlType::kMXFP4), true};
  const ExpertLayout lay = ExpertLayout::make(t, 64, 32);
  const size_t gate = 32 * (64 / 32 * 17), down = 64 * (32 / 32 * 17);
  EXPECT_EQ(lay.up_offset, (gate + 63) / 64 * 64);
  EXPECT_EQ(lay.bias_offset, (lay.down_offset + down + 63) / 64 * 64);
  EXPECT_EQ(lay.bytes, lay.bias_offset + (2 * 32 + 64) * 4);
  ExpertTypes plain = t;
  plain.bias = false;
  EXPECT_EQ(ExpertLayout::make(plain, 64, 32).bytes, lay.down_offset + down);
  EXPECT_FALSE(t == plain);  // a pack with biases never passes for one without

  ExpertFileHeader h;
  h.set_types(t);
  h.n_experts = 3;
  h.hidden = 64;
  h.intermediate = 32;
  h.expert_bytes = lay.bytes;
  h.expert_stride = 4096;
  h.data_offset = expert_data_offset(h.version, 3);
  h.slot_checksums = {1, 2, 3};
  EXPECT_EQ(h.version, kExpertFileVersionTyped);
  const std::string bytes = encode_expert_header(h);
  const ExpertFileHeader back = decode_expert_header(bytes, h.file_bytes(), "l.bin");
  EXPECT_TRUE(back.bias);
  EXPECT_TRUE(back.types() == t);
  // Even with pack types, biases need the version-2 header (version 1 has no flags).
  ExpertFileHeader p;
  p.set_types({QuantType::kBF16, QuantType::kBF16, QuantType::kBF16, true});
  EXPECT_EQ(p.version, kExpertFileVersionTyped);
}

TEST(GptOssMaths, TopKSoftmaxRouterAndClampedSwiglu) {
  const float logits[5] = {0.5f, 2.0f, -1.0f, 1.0f, 2.0f};
  int ids[3];
  float w[3];
  route_token_topk_softmax(logits, 5, 3, ids, w);
  EXPECT_EQ(ids[0], 1);  // tie with 4: the lower id first
  EXPECT_EQ(ids[1], 4);
  EXPECT_EQ(ids[2], 3);
  const float z = 2 * std::exp(0.0f) + std::exp(-1.0f);
  EXPECT_FLOAT_EQ(w[0], 1 / z);
  EXPECT_FLOAT_EQ(w[2], std::exp(-1.0f) / z);

  // transformers: gate = clamp(max=L), up = clamp(-L, L), (up + 1) * gate * sigmoid(alpha * gate)
  float gate[4] = {10.0f, -3.0f, 0.5f, 2.0f};
  const float up[4] = {0.25f, 9.0f, -9.0f, 1.0f};
  clamped_swiglu(gate, up, 4, 1.5f, 1.702f);
  const auto ref = [](float g, float u) {
    g = std::min(g, 1.5f);
    u = std::clamp(u, -1.5f, 1.5f);
    return (u + 1) * g / (1 + std::exp(-1.702f * g));
  };
  EXPECT_FLOAT_EQ(gate[0], ref(10.0f, 0.25f));
  EXPECT_FLOAT_EQ(gate[1], ref(-3.0f, 9.0f));
  EXPECT_FLOAT_EQ(gate[2], ref(0.5f, -9.0f));
  EXPECT_FLOAT_EQ(gate[3], ref(2.0f, 1.0f));
}

TEST(GptOssMxfp4, BlocksAreReorderedNotRequantised) {
  // The checkpoint's byte j: element 2j low, 2j+1 high. ggml's byte j: element j low, j+16 high.
  uint8_t hf[16];
  for (int j = 0; j < 16; ++j) hf[j] = uint8_t(((2 * j) & 0xF) | (((2 * j + 1) & 0xF) << 4));  // element k = k mod 16
  uint8_t g[17];
  mxfp4_block_to_ggml(131, hf, g);
  EXPECT_EQ(g[0], 131);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(g[1 + j] & 0xF, j & 0xF) << j;          // element j
    EXPECT_EQ(g[1 + j] >> 4, (j + 16) & 0xF) << j;    // element j + 16
  }
  // The synthetic encoder: the smallest power-of-two scale that brings the amax within 6.
  std::vector<float> v(32);
  for (int j = 0; j < 32; ++j) v[size_t(j)] = (j % 2 ? -1.0f : 1.0f) * 0.25f * float(j % 8 == 7 ? 12 : j % 7);
  std::vector<uint8_t> enc(17);
  encode_mxfp4_matrix(v.data(), 1, 32, enc.data());
  EXPECT_EQ(enc[0], 127 - 1);  // amax 3 = 6 * 2^-1
}

TEST(GptOssConvert, ChatTemplateJinjaJoinsTheTokenizerConfig) {
  if (!fs::exists(kFixture / "config.json")) MOESTREAM_SKIP_OR_FAIL() << "fixture " << kFixture << " absent";
  TempDir d("gpt_oss_test");
  const fs::path src = d.path() / "src";
  fs::create_directories(src);
  for (const char* f : {"config.json", "model.safetensors"}) fs::copy_file(kFixture / f, src / f);
  write_file_atomic(src / "chat_template.jinja", "{{ messages[0]['content'] }}<|end|>");
  ConvertOptions co;
  co.progress = false;
  co.quant = QuantType::kBF16;
  const ModelConfig c = convert_model(src, d.path() / "a", co);
  ASSERT_EQ(c.tokenizer_config_file, "tokenizer_config.json");
  json tc = json::parse(read_file(d.path() / "a" / "tokenizer_config.json"));
  EXPECT_EQ(tc["chat_template"], "{{ messages[0]['content'] }}<|end|>");
  // A tokenizer_config.json with its own template keeps it.
  write_file_atomic(src / "tokenizer_config.json", R"({"chat_template": "own", "model_max_length": 8})");
  convert_model(src, d.path() / "b", co);
  tc = json::parse(read_file(d.path() / "b" / "tokenizer_config.json"));
  EXPECT_EQ(tc["chat_template"], "own");
  EXPECT_EQ(tc["model_max_length"], 8);
  const ModelConfig loaded = ModelConfig::load(d.path() / "b");
  EXPECT_EQ(loaded.arch, Arch::kGptOss);
  EXPECT_EQ(loaded.expert_quant, QuantType::kBF16);
  EXPECT_TRUE(read_expert_header(expert_file_path(d.path() / "b", 0)).bias);

  // model.json that forgets the biases the layer files carry is refused at load, naming it.
  json mj = json::parse(read_file(d.path() / "b" / "model.json"));
  mj["experts"].erase("bias");
  write_file_atomic(d.path() / "b" / "model.json", mj.dump());
  ModelOptions mo;
  mo.n_threads = 1;
  const std::string msg = test::error_message([&] { Model::load(d.path() / "b", mo); });
  EXPECT_NE(msg.find("flags (expert biases)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("layer_000.bin"), std::string::npos) << msg;
}

// A sliding layer's KV cache is a ring of window + max_batch - 1 positions: with max_batch 2 the
// fixture's window of 6 wraps it many times over a prompt and 32 greedy tokens, and the logits
// (prefill in chunks of 2) and greedy tokens are still transformers'.
TEST(GptOssForward, SlidingRingCacheKeepsTheReferenceResults) {
  if (!fs::exists(kFixture / "reference.json")) MOESTREAM_SKIP_OR_FAIL() << "fixture " << kFixture << " absent";
  const json ref = json::parse(read_file(kFixture / "reference.json"));
  TempDir d("gpt_oss_ring");
  convert_fixture_f32(d.path() / "p");
  auto model = Model::load(d.path() / "p", two_token_batch_options(256));
  const size_t V = size_t(model->config().vocab_size);
  for (size_t p = 0; p < ref["prompts"].size(); ++p) {
    const std::vector<int> prompt = ref["prompts"][p].get<std::vector<int>>();
    std::vector<float> got(prompt.size() * V);
    model->reset();
    model->forward(prompt, got, true);
    for (size_t t = 0; t < prompt.size(); ++t) {
      const std::vector<float> w = ref["logits"][p][t].get<std::vector<float>>();
      ASSERT_EQ(w.size(), V);
      const test::RowError e = test::row_error(w, got.data() + t * V);
      EXPECT_LE(e.err, 1e-3 * e.scale) << "prompt " << p << " position " << t;
    }
    const std::vector<int> want = ref["greedy"][p].get<std::vector<int>>();
    EXPECT_EQ(test::greedy_tokens(*model, prompt, want.size()), want) << "prompt " << p;
  }
}

// A rewind (truncate, prefix reuse) on sliding rings of window + max_batch - 1 positions: going
// back at most max_batch tokens keeps the prefix and the logits of a fresh run; going back further
// would read positions the ring overwrote, so nothing is kept (n_past() 0) and the caller re-runs
// the prefix. The batch API's sequences follow the same rule.
TEST(GptOssForward, ARewindPastTheRingKeepsNothingAndOneWithinItKeepsTheFreshLogits) {
  if (!fs::exists(kFixture / "reference.json")) MOESTREAM_SKIP_OR_FAIL() << "fixture " << kFixture << " absent";
  TempDir d("gpt_oss_rewind");
  convert_fixture_f32(d.path() / "p");
  const ModelOptions mo = two_token_batch_options(64);  // rings of 6 + 2 - 1 = 7 positions
  auto model = Model::load(d.path() / "p", mo);
  auto fresh = Model::load(d.path() / "p", mo);
  const size_t V = size_t(model->config().vocab_size);
  std::vector<int> seq;
  for (int i = 0; i < 22; ++i) seq.push_back(int((37 * i + 11) % int(V)));
  std::vector<float> all(seq.size() * V), last(V);
  model->forward(seq, last);
  // Within the bound: back 2 tokens, the same 2 again: the fresh run's logits.
  model->truncate(20);
  EXPECT_EQ(model->n_past(), 20);
  std::vector<float> tail(2 * V);
  model->forward(std::span<const int>(seq).subspan(20), tail, true);
  fresh->forward(seq, all, true);
  double worst = 0, scale = 0;
  for (size_t i = 0; i < 2 * V; ++i) {
    worst = std::max(worst, double(std::fabs(tail[i] - all[20 * V + i])));
    scale = std::max(scale, double(std::fabs(all[20 * V + i])));
  }
  EXPECT_LE(worst, 1e-5 * scale);
  // Past it: back 10 tokens, whose window the ring overwrote: nothing kept, a re-run from 0 works.
  model->truncate(12);
  EXPECT_EQ(model->n_past(), 0);
  model->forward(std::span<const int>(seq).first(12), last);
  // Back to the start is always fine; the bound is per sequence in the batch API too.
  model->truncate(0);
  EXPECT_EQ(model->n_past(), 0);
  const int s = model->create_sequence();
  std::vector<SequenceInput> step(1);
  step[0].sequence = s;
  for (int i = 0; i < 22; i += 2) {
    step[0].tokens = std::span<const int>(seq).subspan(size_t(i), 2);
    model->forward_batch(step);
  }
  model->truncate_sequence(s, 21);
  EXPECT_EQ(model->sequence_n_past(s), 21);
  model->truncate_sequence(s, 12);
  EXPECT_EQ(model->sequence_n_past(s), 0);
}
