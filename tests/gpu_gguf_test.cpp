// GGUF files on the GPU (issue 18): every fixture of tests/fixtures/gguf (llama.cpp's converter
// and quantizer: architectures, ggml types, a mixed-type file, a split set) read in place with
// --gpu against the CPU path on the same file, and a mixed-type file's experts through a GPU cache
// too small for them. gpt-oss and DeepSeek GGUF files: tests/gpu_gguf_arch_test.cpp. Skips
// without a CUDA device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/file_util.h"
#include "loader/store/engine_expert_store.h"
#include "runtime/engine/model.h"
#include "runtime/gpu/gpu_expert_cache.h"

#include "tests/support/cpu_and_gpu.h"
#include "tests/support/gpu_cache_churn.h"
#include "tests/support/fixture_manifest.h"
#include "tests/support/logit_compare.h"
#include "tests/support/require_gpu.h"
#include "tests/support/strict_skip.h"

namespace fs = std::filesystem;
using namespace moestream;
using test::rel_max_diff;
using test::top2;

namespace {

// Every fixture of its manifest: architectures, ggml types, a mixed-type file, a split set.
const fs::path kGguf = fs::path(MOESTREAM_SOURCE_DIR) / "tests" / "fixtures" / "gguf";

// The suffix that names the fixture's matrix types: "Q8_0", "Q4_K", "mixed", "MXFP4_MOE", ...
std::string gguf_kind(const std::string& name) {
  std::string n = name;
  if (n.size() > 6 && n.compare(n.size() - 6, 6, "-split") == 0) n.resize(n.size() - 6);
  return n.substr(n.rfind('-') + 1);
}

// GPU vs CPU logits on the same file, relative to each position's largest |logit|. The float
// types compute the same function on both (summation order differs): F32 1e-4, F16/BF16 1e-3
// (products of float activations with the stored halves on both). The block types' CPU kernels
// round the activations to 8 bits (q8_0/q8_K blocks, as llama.cpp does) while the GPU's multiply
// float activations by the dequantised weights, so they differ by that rounding: 0.05, the
// oracle test's tolerance for the quantized types (tests/python/test_gguf_oracle.py).
double gguf_tolerance(const std::string& kind) {
  if (kind == "F32") return 1e-4;
  if (kind == "F16" || kind == "BF16") return 1e-3;
  return 0.05;
}
// A top-1/top-2 gap (in the CPU's logits) below this may flip either way (the oracle's NEAR_TIE);
// where the two backends may differ by more (the block types' tolerance), below twice that
// difference: near_tie(row) = max(kNearTie, 2 * tolerance * max |logit| of the row).
constexpr float kNearTie = 0.05f;
float near_tie(std::span<const float> row, double tol) {
  float scale = 0;
  for (float v : row) scale = std::max(scale, std::fabs(v));
  return std::max(kNearTie, float(2 * tol) * scale);
}

}  // namespace

class GpuGgufTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuGgufTest, LogitsAndGreedyTokensMatchTheCpuPath) {
  REQUIRE_GPU();
  const std::string name = GetParam();
  const nlohmann::json d = nlohmann::json::parse(read_file(kGguf / (name + ".json")));
  const fs::path file = kGguf / d["files"][0].get<std::string>();
  const std::vector<int> prompt = d["prompt_ids"].get<std::vector<int>>();
  const int n_new = int(d["generated_ids"].size());
  const auto [cpu, gpu] = test::load_cpu_and_gpu(file, 256);
  ASSERT_NE(gpu->gpu_info(), nullptr);
  const std::string kind = gguf_kind(name);
  const double tol = gguf_tolerance(kind);
  const size_t V = size_t(cpu->config().vocab_size);

  // Prefill, every position's logits.
  std::vector<float> lc(prompt.size() * V), lg(prompt.size() * V);
  cpu->forward(prompt, lc, true);
  gpu->forward(prompt, lg, true);
  const double prefill_rel = rel_max_diff(lc, lg, V);
  size_t top1_same = 0;
  for (size_t p = 0; p < prompt.size(); ++p)
    top1_same += top2({lc.data() + p * V, V}).first == top2({lg.data() + p * V, V}).first;

  // Greedy decode, each backend on its own tokens through its KV cache: equal up to the first
  // position where the CPU's top two are within kNearTie; logits compared while they agree.
  std::vector<float> dc(lc.end() - std::ptrdiff_t(V), lc.end()), dg(lg.end() - std::ptrdiff_t(V), lg.end());
  std::vector<int> tc, tg;
  double decode_rel = 0;
  int diverged_at = -1;
  float gap_at_divergence = 0, tie_at_divergence = 0;
  for (int i = 0; i < n_new; ++i) {
    const auto [c, gap] = top2(dc);
    const int g = top2(dg).first;
    tc.push_back(c);
    tg.push_back(g);
    if (c != g) {
      diverged_at = i;
      gap_at_divergence = gap;
      tie_at_divergence = near_tie(dc, tol);
      break;
    }
    if (i + 1 == n_new) break;
    cpu->forward(std::span<const int>(&c, 1), dc);
    gpu->forward(std::span<const int>(&c, 1), dg);
    decode_rel = std::max(decode_rel, rel_max_diff(dc, dg, V));
  }
  const GpuForwardInfo& gi = *gpu->gpu_info();
  std::printf("[ gpu_vs_cpu gguf %s ] prefill rel max |dlogit| %.3g, decode %.3g (tolerance %.3g); "
              "prefill top-1 equal %zu/%zu; greedy equal %zu/%d%s; dense on GPU %.1f KiB\n",
              name.c_str(), prefill_rel, decode_rel, tol, top1_same, prompt.size(),
              diverged_at < 0 ? tc.size() : size_t(diverged_at), n_new,
              diverged_at < 0 ? "" : (" (CPU gap " + std::to_string(gap_at_divergence) + ")").c_str(),
              double(gi.dense_bytes) / 1024.0);
  EXPECT_LE(prefill_rel, tol) << name << ": prefill logits, GPU vs CPU, type " << kind;
  EXPECT_LE(decode_rel, tol) << name << ": decode logits, GPU vs CPU, type " << kind;
  EXPECT_GE(double(top1_same), 0.9 * double(prompt.size())) << name << ": prefill top-1 agreement";
  if (diverged_at >= 0) {
    EXPECT_LT(gap_at_divergence, tie_at_divergence)
        << name << ": greedy token " << diverged_at << " differs (CPU " << tc.back() << ", GPU " << tg.back()
        << ") where the CPU's top-1 leads its top-2 by " << gap_at_divergence << " (near-tie below "
        << tie_at_divergence << ")";
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GpuGgufTest, ::testing::ValuesIn(test::fixture_names(kGguf)),
                         [](const auto& i) {
                           std::string s = i.param;
                           for (char& ch : s)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return s;
                         });

TEST(GpuGguf, FixtureSetIsPresent) {
  const std::vector<std::string> names = test::fixture_names(kGguf);
  if (names.empty()) MOESTREAM_SKIP_OR_FAIL() << "no manifest under " << kGguf;
  for (const char* arch : {"qwen3moe", "olmoe", "mixtral"})
    EXPECT_TRUE(std::any_of(names.begin(), names.end(), [&](const std::string& n) { return n.rfind(arch, 0) == 0; }))
        << "no " << arch << " fixture: the GPU would go untested on it";
}

TEST(GpuGguf, MixedTypeExpertsThroughASmallGpuCacheHoldTheGgufStoresBytes) {
  REQUIRE_GPU();
  // qwen3moe-k-mixed: layer 0's experts are Q4_K/Q5_K/Q4_K, layer 1's Q3_K/Q4_K/Q6_K (both 118,784
  // bytes: experts of several sizes under one budget are gpu_expert_cache_test's
  // GpuExpertCacheMixed). A budget of 3 experts makes the layers take each other's slots; every
  // handed-out pointer must hold its expert's three slices as the GGUF store assembles them.
  const fs::path file = kGguf / "qwen3moe-k-mixed.gguf";
  if (!fs::exists(file)) MOESTREAM_SKIP_OR_FAIL() << file << " absent";
  const ModelConfig c = ModelConfig::load(file);
  ASSERT_FALSE(c.expert_layout(0).types == c.expert_layout(1).types) << "the fixture no longer mixes types";
  test::expect_small_gpu_cache_holds_store_bytes(file, c);
}
