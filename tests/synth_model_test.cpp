// Tests of runtime/convert/model_shapes.h, the synthetic writer's byte estimate and the synth_model CLI:
// a real shape's structure (counts) written at reduced width, loaded and run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/file_util.h"
#include "loader/format/expert_file.h"
#include "runtime/engine/model.h"
#include "runtime/convert/model_shapes.h"
#include "runtime/convert/synthetic_model.h"
#include "tests/support/test_model.h"
#include "tests/support/strict_skip.h"

namespace fs = std::filesystem;
using namespace moestream;

namespace {

test::CliResult run_synth(const std::string& args) {
  return test::run_tool("synth_model", args, /*with_stderr=*/true);
}

bool have_cli() { return test::have_tool("synth_model"); }

uint64_t dir_bytes(const fs::path& d) {
  uint64_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(d))
    if (e.is_regular_file()) n += e.file_size();
  return n;
}

// The written model loads (every tensor present with its shape) and runs `prompt` on 2 threads:
// its logits are finite and vary.
void expect_loads_and_runs(const fs::path& out, const std::vector<int>& prompt, int max_context) {
  ModelOptions mo;
  mo.n_threads = 2;
  mo.max_context = max_context;
  auto model = Model::load(out, mo);
  std::vector<float> logits(size_t(model->config().vocab_size));
  model->forward(prompt, logits);
  float lo = logits[0], hi = logits[0];
  for (float v : logits) {
    ASSERT_TRUE(std::isfinite(v));
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  EXPECT_GT(hi - lo, 1e-3f);
}

// The synth_model CLI's tests: skipped (failed in strict mode) where the CLI is not built; each
// writes into its own temp dir d_.
class SynthModelCli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_cli()) MOESTREAM_SKIP_OR_FAIL() << "synth_model not built in " << MOESTREAM_BIN_DIR;
  }
  TempDir d_;
};

}  // namespace

TEST(ModelShapes, ExpertBytesMatchTheReleasedModelsSizes) {
  // Issue 11: a q4 Qwen3-30B-A3B is ~16 GB of experts; 48 layers x 128 experts x 3 matrices of
  // 768 x 2048 at 4.5 bits per weight, each slot rounded up to 4 KiB.
  const ModelConfig q = known_shape("qwen3-30b-a3b");
  EXPECT_EQ(q.n_layers, 48);
  EXPECT_EQ(q.n_experts, 128);
  EXPECT_EQ(q.n_experts_per_tok, 8);
  const uint64_t q_experts = synthetic_model_bytes(q) - synthetic_dense_bytes(q);
  EXPECT_GT(q_experts, 16.0e9);
  EXPECT_LT(q_experts, 16.5e9);
  const ModelConfig m = known_shape("mixtral-8x7b");
  // Mixtral: 32 x 8 experts of 3 x 14336 x 4096 weights.
  const double m_weights = 32.0 * 8 * 3 * 14336 * 4096;
  const uint64_t m_experts = synthetic_model_bytes(m) - synthetic_dense_bytes(m);
  EXPECT_NEAR(double(m_experts), m_weights * 4.5 / 8, m_weights * 0.01);
  // Dense: embeddings + lm_head dominate; bf16.
  const ModelConfig o = known_shape("olmoe-1b-7b");
  EXPECT_GT(synthetic_dense_bytes(o), uint64_t(2) * 50304 * 2048 * 2);
}

TEST(ModelShapes, Qwen2_57bHasItsSharedExpertAndBiases) {
  // Qwen2-57B-A14B: 28 layers x 64 experts of 3 x 2560 x 3584, plus a 20480-wide shared expert
  // per layer held with the dense weights (bf16).
  const ModelConfig q = known_shape("qwen2-57b-a14b");
  EXPECT_EQ(q.arch, Arch::kQwen2Moe);
  EXPECT_EQ(q.n_experts, 64);
  EXPECT_EQ(q.n_experts_per_tok, 8);
  EXPECT_EQ(q.shared_expert_intermediate_size, 20480);
  EXPECT_TRUE(q.qkv_bias);
  EXPECT_FALSE(q.norm_topk_prob);
  EXPECT_EQ(q.qk_norm, QkNorm::kNone);
  const double shared_bytes = 28.0 * 3 * 20480 * 3584 * 2;
  EXPECT_GT(double(synthetic_dense_bytes(q)), shared_bytes + 2.0 * 151936 * 3584 * 2);
  const double expert_weights = 28.0 * 64 * 3 * 2560 * 3584;
  EXPECT_NEAR(double(synthetic_model_bytes(q) - synthetic_dense_bytes(q)), expert_weights * 4.5 / 8,
              expert_weights * 0.01);
  const ModelConfig s = scaled_down(q, 32);
  EXPECT_EQ(s.shared_expert_intermediate_size, 640);
  EXPECT_EQ(s.moe_intermediate_size, 80);
}

TEST(ModelShapes, GptOssShapesAreMxfp4WithItsWholeMaths) {
  // gpt-oss-120b: 36 layers x 128 experts of 3 x 2880 x 2880 MXFP4 weights (17 bytes per 32) plus
  // each expert's f32 biases (2 x 2880 + 2880): ~61 GB, the released checkpoint's size.
  const ModelConfig b = known_shape("gpt-oss-120b");
  EXPECT_EQ(b.arch, Arch::kGptOss);
  EXPECT_EQ(b.n_layers, 36);
  EXPECT_EQ(b.n_experts, 128);
  EXPECT_EQ(b.n_experts_per_tok, 4);
  EXPECT_EQ(b.n_heads, 64);
  EXPECT_EQ(b.n_kv_heads, 8);
  EXPECT_EQ(b.head_dim, 64);
  EXPECT_EQ(b.vocab_size, 201088);
  EXPECT_EQ(b.expert_quant, ggml_quant(GgmlType::kMXFP4));
  EXPECT_TRUE(b.expert_bias && b.router_bias && b.router_softmax_topk && b.attention_sinks && b.o_bias && b.qkv_bias);
  EXPECT_EQ(b.sliding_window, 128);
  ASSERT_EQ(b.sliding_layers.size(), 36u);
  EXPECT_EQ(b.window_of(0), 128);
  EXPECT_EQ(b.window_of(1), 0);
  ASSERT_TRUE(b.rope_scaling.has_value());
  EXPECT_FALSE(b.rope_scaling->truncate);
  EXPECT_EQ(b.swiglu_limit, 7.0);
  const double weights = 36.0 * 128 * 3 * 2880 * 2880;
  EXPECT_NEAR(double(synthetic_model_bytes(b) - synthetic_dense_bytes(b)), weights * 17 / 32, weights * 0.01);
  const ModelConfig s = known_shape("gpt-oss-20b");
  EXPECT_EQ(s.n_layers, 24);
  EXPECT_EQ(s.n_experts, 32);
  EXPECT_EQ(s.sliding_layers.size(), 24u);
  const ModelConfig small = scaled_down(s, 16);  // 2880 / 16 = 180: whole MXFP4 blocks
  EXPECT_EQ(small.hidden_size, 160);
  EXPECT_EQ(small.moe_intermediate_size, 160);
}

TEST_F(SynthModelCli, GptOssShapeLoadsAndRuns) {
  const fs::path out = d_.path() / "g";
  const test::CliResult r = run_synth("--shape gpt-oss-20b --layers 3 --scale-down 32 -q --seed 9 " + out.string());
  ASSERT_EQ(r.status, 0) << r.output;
  const ModelConfig cfg = ModelConfig::load(out);
  EXPECT_EQ(cfg.arch, Arch::kGptOss);
  EXPECT_EQ(cfg.expert_quant, ggml_quant(GgmlType::kMXFP4));
  ASSERT_EQ(cfg.sliding_layers.size(), 3u);  // one layer type per written layer
  EXPECT_TRUE(read_expert_header(expert_file_path(out, 0)).bias);
  expect_loads_and_runs(out, {3, 99, 5}, 8);  // sinks, biases, router bias present with their shapes
}

TEST(ModelShapes, UnknownNameListsTheKnownOnes) {
  try {
    known_shape("llama-moe");
    FAIL() << "no exception";
  } catch (const ConfigError& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("llama-moe"), std::string::npos) << w;
    for (const std::string& n : known_shape_names()) EXPECT_NE(w.find(n), std::string::npos) << w;
  }
}

TEST(ModelShapes, ScaleDownKeepsEveryCount) {
  const ModelConfig full = known_shape("qwen3-235b-a22b");
  const ModelConfig s = scaled_down(full, 32);
  EXPECT_EQ(s.hidden_size, 128);
  EXPECT_EQ(s.moe_intermediate_size, 48);
  EXPECT_EQ(s.vocab_size, 151936 / 32);
  EXPECT_EQ(s.n_layers, full.n_layers);
  EXPECT_EQ(s.n_experts, full.n_experts);
  EXPECT_EQ(s.n_heads, full.n_heads);
  EXPECT_EQ(s.n_kv_heads, full.n_kv_heads);
  EXPECT_THROW(scaled_down(full, 0), ConfigError);
}

TEST_F(SynthModelCli, WritesTheShapesStructureWithExactFileSizes) {
  const fs::path out = d_.path() / "q";
  const test::CliResult r = run_synth("--shape qwen3-30b-a3b --layers 2 --scale-down 16 -q --seed 5 " +
                                out.string());
  ASSERT_EQ(r.status, 0) << r.output;
  const ModelConfig cfg = ModelConfig::load(out);
  EXPECT_EQ(cfg.arch, Arch::kQwen3Moe);
  EXPECT_EQ(cfg.n_layers, 2);
  EXPECT_EQ(cfg.n_experts, 128);
  EXPECT_EQ(cfg.n_experts_per_tok, 8);
  EXPECT_EQ(cfg.hidden_size, 128);
  EXPECT_EQ(cfg.moe_intermediate_size, 48);
  EXPECT_EQ(cfg.expert_quant, QuantType::kQ4);
  EXPECT_TRUE(cfg.tokenizer_file.empty());  // no released vocabulary matches the demo's tokenizer
  for (int l = 0; l < 2; ++l) {
    const fs::path f = expert_file_path(out, l);
    const ExpertFileHeader h = read_expert_header(f);
    EXPECT_EQ(h.layer, uint32_t(l));
    EXPECT_EQ(h.n_experts, 128u);
    EXPECT_EQ(h.quant, QuantType::kQ4);
    EXPECT_EQ(fs::file_size(f), h.file_bytes());
  }
  EXPECT_FALSE(fs::exists(expert_file_path(out, 2)));
  // The printed total is what landed on disk, within the JSON headers' slack.
  const size_t at = r.output.find("total_bytes ");
  ASSERT_NE(at, std::string::npos) << r.output;
  const uint64_t printed = std::stoull(r.output.substr(at + 12));
  const uint64_t on_disk = dir_bytes(out);
  EXPECT_LE(printed, on_disk);
  EXPECT_LT(on_disk - printed, uint64_t(64) << 10);
  // Nothing left beside it.
  for (const auto& e : fs::directory_iterator(d_.path())) EXPECT_EQ(e.path(), out);

  // It runs: the forward pass accepts the structure, and the logits are finite and vary.
  expect_loads_and_runs(out, {1, 17, 300}, 16);
}

// --payload-hash xxh64 writes the version-1 files earlier builds read; the default, XXH3, version
// 2; the same weights either way, so the same logits.
TEST_F(SynthModelCli, PayloadHashPicksTheChecksumsAndChangesNoWeight) {
  std::vector<std::vector<float>> logits;
  for (const char* hash : {"xxh3", "xxh64"}) {
    const fs::path out = d_.path() / hash;
    const test::CliResult r = run_synth(std::string("--shape olmoe-1b-7b --layers 1 --scale-down 16 -q -t 1 ") +
                                        "--payload-hash " + hash + " " + out.string());
    ASSERT_EQ(r.status, 0) << r.output;
    const ExpertFileHeader h = read_expert_header(expert_file_path(out, 0));
    const bool x3 = std::string(hash) == "xxh3";
    EXPECT_EQ(h.payload_hash, x3 ? PayloadHash::kXxh3 : PayloadHash::kXxh64) << hash;
    EXPECT_EQ(h.version, x3 ? kExpertFileVersionTyped : kExpertFileVersion) << hash;
    ModelOptions mo;
    mo.n_threads = 1;
    mo.max_context = 16;
    auto model = Model::load(out, mo);  // verifies every expert it uses against its checksum
    logits.emplace_back(size_t(model->config().vocab_size));
    model->forward(std::vector<int>{1, 17, 300}, logits.back());
  }
  EXPECT_EQ(logits[0], logits[1]);
  const test::CliResult bad = run_synth("--shape olmoe-1b-7b --payload-hash md5 " + (d_.path() / "x").string());
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.output.find("--payload-hash"), std::string::npos) << bad.output;
}

TEST(ModelShapes, Glm45AirHasItsDenseFirstLayerSharedExpertAndGroupedRouter) {
  // GLM-4.5-Air: 46 layers, layer 0 a dense MLP of 10944; 45 MoE layers x 128 experts of
  // 3 x 1408 x 4096 (q4), one ungated 1408-wide shared expert per MoE layer in the dense file.
  const ModelConfig g = known_shape("glm-4.5-air");
  EXPECT_EQ(g.arch, Arch::kGlm4Moe);
  EXPECT_EQ(g.n_layers, 46);
  EXPECT_EQ(g.n_moe_layers(), 45);
  EXPECT_EQ(g.n_heads, 96);
  EXPECT_EQ(g.n_kv_heads, 8);
  EXPECT_EQ(g.head_dim, 128);
  EXPECT_EQ(g.rope_dim(), 64);
  EXPECT_EQ(g.router_scoring, RouterScoring::kSigmoid);
  EXPECT_FALSE(g.shared_expert_gated);
  EXPECT_EQ(g.shared_expert_intermediate_size, 1408);
  EXPECT_EQ(g.intermediate_size, 10944);
  EXPECT_TRUE(g.qkv_bias);
  const double expert_weights = 45.0 * 128 * 3 * 1408 * 4096;
  EXPECT_NEAR(double(synthetic_model_bytes(g) - synthetic_dense_bytes(g)), expert_weights * 4.5 / 8,
              expert_weights * 0.01);
  const double dense_mlp = 3.0 * 10944 * 4096 * 2, shared = 45.0 * 3 * 1408 * 4096 * 2;
  EXPECT_GT(double(synthetic_dense_bytes(g)), dense_mlp + shared + 2.0 * 151552 * 4096 * 2);
}

TEST_F(SynthModelCli, Glm45AirShapeLoadsAndRunsAndNeedsAnMoeLayer) {
  const fs::path out = d_.path() / "glm";
  const test::CliResult one = run_synth("--shape glm-4.5-air --layers 1 --scale-down 32 -q " + out.string());
  EXPECT_NE(one.status, 0);
  EXPECT_NE(one.output.find("--layers 1"), std::string::npos) << one.output;
  const test::CliResult r = run_synth("--shape glm-4.5-air --layers 3 --scale-down 32 -q --seed 7 " + out.string());
  ASSERT_EQ(r.status, 0) << r.output;
  const ModelConfig cfg = ModelConfig::load(out);
  EXPECT_EQ(cfg.n_moe_layers(), 2);
  EXPECT_TRUE(fs::exists(expert_file_path(out, 1)));
  EXPECT_FALSE(fs::exists(expert_file_path(out, 2)));  // expert files number MoE layers only
  expect_loads_and_runs(out, {3, 99}, 8);  // dense MLP, router bias and shared expert present, shapes checked
}

TEST(ModelShapes, DeepseekV3AndKimiK2AreTheirReleasedSizes) {
  // DeepSeek-V3: 671B parameters without its MTP module (DeepSeek's figure); Kimi K2: "1T" (Moonshot's
  // round figure; 1.026T counted from its config). MoE layers x experts x 3 x 2048 x 7168
  // routed, the rest (MLA, dense first layers, shared experts, embeddings) in the bf16 dense file.
  struct Want {
    const char* name;
    int heads, experts, dense_layers, vocab;
    double total_params, rel_tol;
  };
  for (const Want& w : {Want{"deepseek-v3", 128, 256, 3, 129280, 671.0e9, 0.005},
                      Want{"kimi-k2", 64, 384, 1, 163840, 1.0e12, 0.03}}) {
    const ModelConfig c = known_shape(w.name);
    EXPECT_EQ(c.arch, Arch::kDeepseekV3) << w.name;
    EXPECT_TRUE(c.has_mla());
    EXPECT_EQ(c.n_layers, 61);
    EXPECT_EQ(c.n_heads, w.heads);
    EXPECT_EQ(c.n_experts, w.experts);
    EXPECT_EQ(c.n_moe_layers(), 61 - w.dense_layers);
    EXPECT_EQ(c.vocab_size, w.vocab);
    EXPECT_EQ(c.head_dim, c.qk_nope_head_dim + c.qk_rope_head_dim);
    EXPECT_EQ(c.kv_lora_rank + c.qk_rope_head_dim, 576);  // the latent cache row
    const double expert_weights = double(c.n_moe_layers()) * c.n_experts * 3 * 2048 * 7168;
    EXPECT_NEAR(double(synthetic_model_bytes(c) - synthetic_dense_bytes(c)), expert_weights * 4.5 / 8,
                expert_weights * 0.01);
    const double params = double(synthetic_dense_bytes(c)) / 2 + expert_weights;  // bf16 dense
    EXPECT_NEAR(params, w.total_params, w.total_params * w.rel_tol) << w.name;
  }
}

TEST(ModelShapes, MinimaxM2IsItsReleasedSize) {
  // MiniMax-M2: "230B total parameters" (MiniMax's figure; 228.6B counted from its config): 62 x
  // 256 experts of 3 x 1536 x 3072 routed, attention and embeddings in the bf16 dense file.
  const ModelConfig c = known_shape("minimax-m2");
  EXPECT_EQ(c.arch, Arch::kMinimaxM2);
  EXPECT_EQ(c.n_moe_layers(), 62);
  EXPECT_EQ(c.qk_norm, QkNorm::kFull);
  EXPECT_EQ(c.rope_dim(), 64);
  EXPECT_EQ(c.router_scoring, RouterScoring::kSigmoid);
  EXPECT_EQ(c.n_group, 1);
  EXPECT_FALSE(c.has_shared_expert());
  const double expert_weights = 62.0 * 256 * 3 * 1536 * 3072;
  EXPECT_NEAR(double(synthetic_model_bytes(c) - synthetic_dense_bytes(c)), expert_weights * 4.5 / 8,
              expert_weights * 0.01);
  const double params = double(synthetic_dense_bytes(c)) / 2 + expert_weights;  // bf16 dense
  EXPECT_NEAR(params, 230.0e9, 230.0e9 * 0.01);
}

TEST_F(SynthModelCli, MinimaxM2ShapeLoadsAndRuns) {
  const fs::path out = d_.path() / "mm";
  const test::CliResult r = run_synth("--shape minimax-m2 --layers 2 --scale-down 32 -q --seed 7 " + out.string());
  ASSERT_EQ(r.status, 0) << r.output;
  const ModelConfig cfg = ModelConfig::load(out);
  EXPECT_EQ(cfg.arch, Arch::kMinimaxM2);
  EXPECT_EQ(cfg.rope_dim(), 64);
  expect_loads_and_runs(out, {3, 99, 7}, 8);  // full-width q/k norms and the router bias present, shapes checked
}

TEST_F(SynthModelCli, DeepseekV3ShapeLoadsAndRuns) {
  const fs::path out = d_.path() / "ds";
  const test::CliResult r = run_synth("--shape deepseek-v3 --layers 4 --scale-down 32 -q --seed 7 " + out.string());
  ASSERT_EQ(r.status, 0) << r.output;
  const ModelConfig cfg = ModelConfig::load(out);
  EXPECT_TRUE(cfg.has_mla());
  EXPECT_EQ(cfg.n_moe_layers(), 1);  // layers 0-2 dense
  expect_loads_and_runs(out, {3, 99, 7}, 8);  // every MLA tensor present with its shape
}

TEST_F(SynthModelCli, Qwen2MoeShapeLoadsAndRuns) {
  const fs::path out = d_.path() / "q2";
  const test::CliResult r = run_synth("--shape qwen2-57b-a14b --layers 2 --scale-down 32 -q --seed 7 " +
                                      out.string());
  ASSERT_EQ(r.status, 0) << r.output;
  const ModelConfig cfg = ModelConfig::load(out);
  EXPECT_EQ(cfg.arch, Arch::kQwen2Moe);
  EXPECT_EQ(cfg.shared_expert_intermediate_size, 640);
  expect_loads_and_runs(out, {3, 99}, 8);  // every bias and shared-expert tensor present, shapes checked
}

TEST_F(SynthModelCli, SameSeedSameBytesOtherSeedOtherBytes) {
  const std::string common = "--shape olmoe-1b-7b --layers 1 --scale-down 32 -q ";
  ASSERT_EQ(run_synth(common + "--seed 3 " + (d_.path() / "a").string()).status, 0);
  ASSERT_EQ(run_synth(common + "--seed 3 -t 1 " + (d_.path() / "b").string()).status, 0);
  ASSERT_EQ(run_synth(common + "--seed 4 " + (d_.path() / "c").string()).status, 0);
  const std::string a = read_file(expert_file_path(d_.path() / "a", 0));
  EXPECT_EQ(a, read_file(expert_file_path(d_.path() / "b", 0)));  // thread count does not matter
  EXPECT_NE(a, read_file(expert_file_path(d_.path() / "c", 0)));
  EXPECT_EQ(ModelConfig::load(d_.path() / "a").qk_norm, QkNorm::kFull);
}

TEST_F(SynthModelCli, RefusesToOverwriteWithoutForceAndReplacesWithIt) {
  const fs::path out = d_.path() / "m";
  fs::create_directories(out);
  write_file_atomic(out / "keep.txt", "mine");
  const std::string args = "--shape mixtral-8x7b --layers 1 --scale-down 64 -q ";
  test::CliResult r = run_synth(args + out.string());
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("--force"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(out / "keep.txt"));
  r = run_synth(args + "--force " + out.string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_FALSE(fs::exists(out / "keep.txt"));
  EXPECT_EQ(ModelConfig::load(out).n_experts, 8);
  for (const auto& e : fs::directory_iterator(d_.path())) EXPECT_EQ(e.path(), out);
}

TEST_F(SynthModelCli, BadArgumentsExitNonZeroWithTheReason) {
  test::CliResult r = run_synth("--shape gpt-moe " + (d_.path() / "x").string());
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("qwen3-30b-a3b"), std::string::npos) << r.output;
  r = run_synth("--shape olmoe-1b-7b --quant bf16 " + (d_.path() / "x").string());
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("q4 or q8"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(d_.path() / "x"));
}
