// GGUF input for qwen2moe and glm4moe (issues 20, 21; loader/format/gguf_arch_qwen2_glm4.h).
// The files of tests/fixtures/gguf_hf are the transformers fixtures tests/fixtures/{qwen2_moe,
// glm4_moe} converted by llama.cpp's converter (scripts/make_gguf_fixtures.py --hf-reference), so
// transformers' logits and greedy tokens in each reference.json are the oracle: each GGUF run in
// place and converted to a pack must match them. Then: the config read from the metadata equals
// the one read from config.json, and missing, misshapen or unsupported tensors and keys are refused
// naming what is wrong.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/file_util.h"
#include "loader/format/gguf_model.h"
#include "loader/format/gguf_writer.h"
#include "runtime/convert/convert.h"
#include "runtime/convert/hf_config.h"
#include "runtime/engine/model.h"
#include "runtime/model/sampler.h"
#include "tests/support/strict_skip.h"

namespace fs = std::filesystem;
using namespace moestream;

namespace {

const fs::path kFixtures = fs::path(MOESTREAM_SOURCE_DIR) / "tests" / "fixtures";

struct Case {
  std::string gguf;    // tests/fixtures/gguf_hf/<gguf>.gguf
  std::string source;  // tests/fixtures/<source>: config.json and reference.json
  bool converted;      // run the pack convert_model makes of it, else the GGUF in place
};

// Readable names in gtest output instead of the struct's bytes.
void PrintTo(const Case& c, std::ostream* os) { *os << c.gguf << (c.converted ? " (pack)" : " (in place)"); }

std::string case_name(const ::testing::TestParamInfo<Case>& i) {
  std::string n = i.param.gguf + (i.param.converted ? "_pack" : "_in_place");
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
}

// The worst position's max |dlogit| / max |logit|, for F32 and BF16 alike: make_fixtures.py draws
// weights that bf16 holds exactly, and the BF16 kernels multiply float activations (measured
// below 1e-6 for all eight cases).
constexpr double kRelTol = 1e-3;
// A greedy step where our chosen token and transformers' are this close (relative to the largest
// |logit|) in our logits is a near-tie: either may win, and the sequences part there.
constexpr double kNearTie = 0.02;

class GgufReferenceTest : public ::testing::TestWithParam<Case> {};

}  // namespace

TEST_P(GgufReferenceTest, LogitsAndGreedyTokensMatchTransformers) {
  const Case& c = GetParam();
  const fs::path gguf = kFixtures / "gguf_hf" / (c.gguf + ".gguf");
  const fs::path src = kFixtures / c.source;
  if (!fs::exists(gguf) || !fs::exists(src / "reference.json"))
    MOESTREAM_SKIP_OR_FAIL() << gguf << " or " << src / "reference.json"
                             << " absent (scripts/make_gguf_fixtures.py --hf-reference makes it)";
  const nlohmann::json ref = nlohmann::json::parse(read_file(src / "reference.json"));
  TempDir tmp("gguf_qwen2_glm4");
  fs::path model_path = gguf;
  if (c.converted) {
    ConvertOptions co;
    co.progress = false;
    convert_model(gguf, tmp.path() / "pack", co);
    model_path = tmp.path() / "pack";
  }
  ModelOptions mo;
  mo.n_threads = 2;
  auto model = Model::load(model_path, mo);
  ASSERT_EQ(model->config().format, c.converted ? ModelFormat::kPack : ModelFormat::kGguf);
  const size_t V = size_t(model->config().vocab_size);
  const double tol = kRelTol;

  double worst = 0;
  for (size_t p = 0; p < ref["prompts"].size(); ++p) {
    const std::vector<int> prompt = ref["prompts"][p].get<std::vector<int>>();
    std::vector<float> got(prompt.size() * V);
    model->reset();
    model->forward(prompt, got, true);
    for (size_t t = 0; t < prompt.size(); ++t) {
      const std::vector<float> w = ref["logits"][p][t].get<std::vector<float>>();
      ASSERT_EQ(w.size(), V);
      double scale = 0, err = 0;
      for (size_t v = 0; v < V; ++v) {
        scale = std::max(scale, double(std::fabs(w[v])));
        err = std::max(err, double(std::fabs(w[v] - got[t * V + v])));
      }
      worst = std::max(worst, err / scale);
      EXPECT_LE(err, tol * scale) << "prompt " << p << " position " << t << ": max |dlogit| " << err
                                  << ", max |logit| " << scale;
    }

    // Greedy decoding through the KV cache, token by token as transformers generated them.
    const std::vector<int> want = ref["greedy"][p].get<std::vector<int>>();
    std::vector<float> last(V);
    model->reset();
    model->forward(prompt, last);
    for (size_t i = 0; i < want.size(); ++i) {
      const int next = Sampler::argmax(last);
      if (next != want[i]) {
        const double scale = std::fabs(*std::max_element(last.begin(), last.end(), [](float a, float b) {
          return std::fabs(a) < std::fabs(b);
        }));
        const double gap = double(last[size_t(next)]) - double(last[size_t(want[i])]);
        EXPECT_LE(gap, kNearTie * scale) << "prompt " << p << " greedy token " << i << ": ours " << next
                                         << ", transformers' " << want[i] << " (not a near-tie: gap " << gap << ")";
        break;  // the sequences part at a near-tie
      }
      if (i + 1 < want.size()) model->forward(std::span<const int>(&next, 1), last);
    }
  }
  std::printf("[ measured ] %s %s: worst rel logit err %.3g\n", c.gguf.c_str(), c.converted ? "pack" : "in place", worst);
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, GgufReferenceTest,
    ::testing::Values(Case{"qwen2moe-F32", "qwen2_moe", false}, Case{"qwen2moe-F32", "qwen2_moe", true},
                      Case{"qwen2moe-BF16", "qwen2_moe", false}, Case{"qwen2moe-BF16", "qwen2_moe", true},
                      Case{"glm4moe-F32", "glm4_moe", false}, Case{"glm4moe-F32", "glm4_moe", true},
                      Case{"glm4moe-BF16", "glm4_moe", false}, Case{"glm4moe-BF16", "glm4_moe", true}),
    case_name);

namespace {

class GgufQwen2Glm4 : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* f : {"qwen2moe-F32.gguf", "glm4moe-F32.gguf"})
      if (!fs::exists(kFixtures / "gguf_hf" / f))
        MOESTREAM_SKIP_OR_FAIL() << "fixture " << f << " absent (scripts/make_gguf_fixtures.py --hf-reference)";
  }

  // A copy of fixture `name` written by our GgufWriter, with `edit` applied to its metadata and
  // tensor list first; a tensor an edit gave another element count gets zero bytes of its size.
  struct Tensor {
    GgufTensorSpec spec;
    const GgufTensor* source;
  };
  fs::path rewrite(const std::string& name, const std::function<void(GgufMetadata&, std::vector<Tensor>&)>& edit) {
    const GgufModelFiles src(kFixtures / "gguf_hf" / (name + ".gguf"));
    GgufMetadata md("rewritten");
    for (const GgufKv& kv : src.metadata().entries()) md.add(kv.key, kv.value);
    std::vector<Tensor> ts;
    for (const GgufTensor& t : src.tensors()) ts.push_back({{t.name, t.type, t.dims}, &t});
    edit(md, ts);
    std::vector<GgufTensorSpec> specs;
    for (const Tensor& t : ts) specs.push_back(t.spec);
    const fs::path out = dir_.path() / (name + "-edited.gguf");
    GgufWriter w(out, md, specs);
    const std::string all = read_file(src.paths().front());  // one file: the fixtures are not split
    for (const Tensor& t : ts) {
      uint64_t n = 1;
      for (uint64_t d : t.spec.dims) n *= d;
      const uint64_t bytes = t.source->type == GgmlType::kF32 ? n * 4 : t.source->bytes;
      if (bytes == t.source->bytes) {  // same elements, maybe another shape: the source's bytes
        w.write(all.data() + t.source->offset, bytes);
      } else {
        const std::vector<uint8_t> zeros(bytes, 0);  // F32 (the edits reshape F32 tensors only)
        w.write(zeros.data(), zeros.size());
      }
    }
    w.commit();
    return out;
  }
  static void drop(std::vector<Tensor>& ts, const std::string& name) {
    const auto it = std::find_if(ts.begin(), ts.end(), [&](const Tensor& t) { return t.spec.name == name; });
    ASSERT_NE(it, ts.end()) << name;
    ts.erase(it);
  }
  static void reshape(std::vector<Tensor>& ts, const std::string& name, std::vector<uint64_t> dims) {
    const auto it = std::find_if(ts.begin(), ts.end(), [&](const Tensor& t) { return t.spec.name == name; });
    ASSERT_NE(it, ts.end()) << name;
    ASSERT_EQ(it->spec.type, GgmlType::kF32) << name;
    it->spec.dims = std::move(dims);
  }
  // Metadata with `key` replaced by (or, with no value, without) it.
  static GgufMetadata with(const GgufMetadata& md, const std::string& key, std::optional<GgufValue> v) {
    GgufMetadata out("rewritten");
    for (const GgufKv& kv : md.entries())
      if (kv.key != key) out.add(kv.key, kv.value);
    if (v) out.add(key, *v);
    return out;
  }
  // The FormatError message opening `path` gives (the test fails when it opens).
  static std::string error_of(const fs::path& path) {
    try {
      GgufModel g(path);
    } catch (const FormatError& e) {
      return e.what();
    }
    ADD_FAILURE() << path << " opened without an error";
    return "";
  }

  TempDir dir_{"gguf_qwen2_glm4_err"};
};

ModelConfig hf_config(const std::string& source) {
  const fs::path p = kFixtures / source / "config.json";
  return model_config_from_hf(nlohmann::json::parse(read_file(p)), p.string());
}

}  // namespace

// Every hyper-parameter the metadata states is what config.json says: shared experts and their
// gate, biases, leading dense layers, grouped sigmoid routing, routed scaling, partial rotary,
// QK-norm (the MTP block glm4moe's block_count counts is not a decoder layer).
TEST_F(GgufQwen2Glm4, ConfigFromMetadataEqualsTheTransformersConfig) {
  for (const auto& [gguf, source] : {std::pair{"qwen2moe-F32", "qwen2_moe"}, std::pair{"glm4moe-BF16", "glm4_moe"}}) {
    SCOPED_TRACE(gguf);
    const ModelConfig g = GgufModel(kFixtures / "gguf_hf" / (std::string(gguf) + ".gguf")).config();
    const ModelConfig h = hf_config(source);
    EXPECT_EQ(g.arch, h.arch);
    EXPECT_EQ(g.n_layers, h.n_layers);
    EXPECT_EQ(g.hidden_size, h.hidden_size);
    EXPECT_EQ(g.head_dim, h.head_dim);
    EXPECT_EQ(g.n_heads, h.n_heads);
    EXPECT_EQ(g.n_kv_heads, h.n_kv_heads);
    EXPECT_EQ(g.n_experts, h.n_experts);
    EXPECT_EQ(g.n_experts_per_tok, h.n_experts_per_tok);
    EXPECT_EQ(g.moe_intermediate_size, h.moe_intermediate_size);
    EXPECT_EQ(g.norm_topk_prob, h.norm_topk_prob);
    EXPECT_EQ(g.qk_norm, h.qk_norm);
    EXPECT_EQ(g.qkv_bias, h.qkv_bias);
    EXPECT_EQ(g.shared_expert_intermediate_size, h.shared_expert_intermediate_size);
    EXPECT_EQ(g.shared_expert_gated, h.shared_expert_gated);
    EXPECT_EQ(g.router_scoring, h.router_scoring);
    EXPECT_EQ(g.n_group, h.n_group);
    EXPECT_EQ(g.topk_group, h.topk_group);
    EXPECT_FLOAT_EQ(float(g.routed_scaling_factor), float(h.routed_scaling_factor));
    EXPECT_EQ(g.first_k_dense_replace, h.first_k_dense_replace);
    EXPECT_EQ(g.intermediate_size, h.intermediate_size);
    EXPECT_EQ(g.rope_dim(), h.rope_dim());
    EXPECT_DOUBLE_EQ(g.rope_theta, h.rope_theta);
    EXPECT_EQ(g.tie_word_embeddings, h.tie_word_embeddings);
  }
  // The fixtures exercise what they are meant to: a gated shared expert; the grouped router, a
  // dense first layer, an ungated shared expert and partial rotary.
  const ModelConfig q = GgufModel(kFixtures / "gguf_hf" / "qwen2moe-F32.gguf").config();
  EXPECT_TRUE(q.qkv_bias && q.has_shared_expert() && q.shared_expert_gated && !q.norm_topk_prob);
  const ModelConfig g = GgufModel(kFixtures / "gguf_hf" / "glm4moe-F32.gguf").config();
  EXPECT_EQ(g.n_moe_layers(), 2);
  EXPECT_GT(g.n_group, 1);
  EXPECT_LT(g.rope_dim(), g.head_dim);
}

TEST_F(GgufQwen2Glm4, MissingTensorsAreNamed) {
  const struct {
    const char* fixture;
    const char* tensor;
  } cases[] = {
      {"qwen2moe-F32", "blk.2.ffn_gate_inp_shexp.weight"}, {"qwen2moe-F32", "blk.1.attn_v.bias"},
      {"qwen2moe-F32", "blk.0.ffn_gate_shexp.weight"},     {"glm4moe-F32", "blk.2.exp_probs_b.bias"},
      {"glm4moe-F32", "blk.0.ffn_down.weight"},            {"glm4moe-F32", "blk.1.ffn_up_shexp.weight"},
      {"glm4moe-F32", "blk.2.post_attention_norm.weight"}, {"glm4moe-F32", "blk.1.ffn_gate_exps.weight"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.tensor);
    const fs::path p = rewrite(c.fixture, [&](GgufMetadata&, std::vector<Tensor>& ts) { drop(ts, c.tensor); });
    EXPECT_NE(error_of(p).find("'" + std::string(c.tensor) + "'"), std::string::npos) << error_of(p);
  }
}

TEST_F(GgufQwen2Glm4, MisshapenTensorsAreNamedWithBothShapes) {
  const struct {
    const char* fixture;
    const char* tensor;
    std::vector<uint64_t> dims;
    const char* expected;
  } cases[] = {
      {"qwen2moe-F32", "blk.1.ffn_up_shexp.weight", {47, 40}, "[47, 41]"},
      {"qwen2moe-F32", "blk.2.ffn_gate_inp_shexp.weight", {46, 1}, "[47, 1]"},
      {"qwen2moe-F32", "blk.0.attn_q.bias", {47}, "[48]"},
      {"glm4moe-F32", "blk.2.exp_probs_b.bias", {15}, "[16]"},
      {"glm4moe-F32", "blk.0.ffn_gate.weight", {53, 60}, "[53, 61]"},
      {"glm4moe-F32", "blk.1.ffn_down_shexp.weight", {23, 52}, "[23, 53]"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.tensor);
    const fs::path p = rewrite(c.fixture, [&](GgufMetadata&, std::vector<Tensor>& ts) { reshape(ts, c.tensor, c.dims); });
    const std::string e = error_of(p);
    EXPECT_NE(e.find("'" + std::string(c.tensor) + "'"), std::string::npos) << e;
    EXPECT_NE(e.find(c.expected), std::string::npos) << e;
  }
}

TEST_F(GgufQwen2Glm4, UnsupportedOrContradictoryMetadataIsRefusedNamingTheKey) {
  const struct {
    const char* fixture;
    const char* key;
    std::optional<GgufValue> value;
  } cases[] = {
      {"glm4moe-F32", "glm4moe.expert_gating_func", GgufValue::from_unsigned(GgufValueType::kU32, 1)},
      {"glm4moe-F32", "glm4moe.rope.dimension_count", GgufValue::from_unsigned(GgufValueType::kU32, 7)},
      {"glm4moe-F32", "glm4moe.leading_dense_block_count", GgufValue::from_unsigned(GgufValueType::kU32, 3)},
      {"glm4moe-F32", "glm4moe.nextn_predict_layers", GgufValue::from_unsigned(GgufValueType::kU32, 4)},
      {"glm4moe-F32", "glm4moe.expert_group_count", GgufValue::from_unsigned(GgufValueType::kU32, 3)},
      {"qwen2moe-F32", "qwen2moe.expert_shared_feed_forward_length", GgufValue::from_unsigned(GgufValueType::kU32, 40)},
      {"qwen2moe-F32", "qwen2moe.expert_gating_func", GgufValue::from_unsigned(GgufValueType::kU32, 2)},
      {"qwen2moe-F32", "qwen2moe.rope.dimension_count", GgufValue::from_unsigned(GgufValueType::kU32, 6)},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.key);
    const fs::path p = rewrite(c.fixture, [&](GgufMetadata& md, std::vector<Tensor>&) { md = with(md, c.key, c.value); });
    // n_group 3 does not divide 16 experts: model.json's own rule, under its field name.
    const std::string key = std::string(c.key).ends_with("expert_group_count") ? "n_group" : c.key;
    EXPECT_NE(error_of(p).find(key), std::string::npos) << error_of(p);
  }
}

// A glm4moe file whose MTP block is dropped still runs (block_count then counts only the decoder
// layers), and a GGUF whose shared-expert gate is 1-D ([D], as llama.cpp asks for it) loads.
TEST_F(GgufQwen2Glm4, OptionalLayoutsLoad) {
  const fs::path no_mtp = rewrite("glm4moe-F32", [&](GgufMetadata& md, std::vector<Tensor>& ts) {
    md = with(md, "glm4moe.nextn_predict_layers", std::nullopt);
    md = with(md, "glm4moe.block_count", GgufValue::from_unsigned(GgufValueType::kU32, 3));
    std::erase_if(ts, [](const Tensor& t) { return t.spec.name.starts_with("blk.3."); });
  });
  EXPECT_EQ(GgufModel(no_mtp).config().n_layers, 3);
  const fs::path flat = rewrite("qwen2moe-F32", [&](GgufMetadata&, std::vector<Tensor>& ts) {
    for (Tensor& t : ts)
      if (t.spec.name.ends_with("ffn_gate_inp_shexp.weight")) t.spec.dims = {47};
  });
  ModelOptions mo;
  mo.n_threads = 1;
  auto m = Model::load(flat, mo);
  auto ref = Model::load(kFixtures / "gguf_hf" / "qwen2moe-F32.gguf", mo);
  const std::vector<int> prompt{5, 17, 200};
  std::vector<float> a(size_t(m->config().vocab_size)), b(a.size());
  m->forward(prompt, a);
  ref->forward(prompt, b);
  EXPECT_EQ(a, b);  // the same gate values, read from a 1-D tensor
}
