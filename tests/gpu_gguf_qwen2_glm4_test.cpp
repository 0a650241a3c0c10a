// The GPU pass on the qwen2moe and glm4moe GGUFs (tests/fixtures/gguf_hf, issues 20, 21), run in
// place: prefill logits against the CPU pass on the same file (1e-4 relative for F32, 1e-3 for
// BF16, as gpu_forward_test's GGUF cases) and against transformers' reference.json (1e-3), and the
// greedy tokens of each reference prompt through the GPU's KV cache equal to transformers' up to
// the first near-tie. Skips without a CUDA device (the device machine runs it).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/file_util.h"
#include "kernels/cuda/gpu_ops.h"
#include "runtime/engine/model.h"
#include "runtime/model/sampler.h"
#include "tests/support/strict_skip.h"

namespace fs = std::filesystem;
using namespace moestream;

namespace {

const fs::path kFixtures = fs::path(MOESTREAM_SOURCE_DIR) / "tests" / "fixtures";
constexpr double kVsTransformers = 1e-3;
constexpr double kNearTie = 0.02;  // relative to the largest |logit|, as gguf_qwen2_glm4_test

// The worst row's max |a - b| / max |a| (a the reference), rows of V.
double rel_max_diff(const std::vector<float>& a, const std::vector<float>& b, size_t V) {
  double worst = 0;
  for (size_t r = 0; r * V < a.size(); ++r) {
    double scale = 0, err = 0;
    for (size_t v = r * V; v < (r + 1) * V; ++v) {
      scale = std::max(scale, double(std::fabs(a[v])));
      err = std::max(err, double(std::fabs(a[v] - b[v])));
    }
    worst = std::max(worst, err / scale);
  }
  return worst;
}

struct Case {
  std::string gguf, source;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.gguf; }  // not the struct's bytes

class GpuGgufQwen2Glm4 : public ::testing::TestWithParam<Case> {};

}  // namespace

TEST_P(GpuGgufQwen2Glm4, LogitsMatchCpuAndTransformersAndGreedyTokensMatchTransformers) {
  const char* why = "";
  if (gpu::device_count(&why) <= 0) GTEST_SKIP() << "no usable CUDA device: " << why;
  const Case& c = GetParam();
  const fs::path file = kFixtures / "gguf_hf" / (c.gguf + ".gguf");
  const fs::path src = kFixtures / c.source;
  if (!fs::exists(file) || !fs::exists(src / "reference.json"))
    MOESTREAM_SKIP_OR_FAIL() << file << " or its reference absent (scripts/make_gguf_fixtures.py --hf-reference)";
  const nlohmann::json ref = nlohmann::json::parse(read_file(src / "reference.json"));
  ModelOptions mo;
  mo.n_threads = 2;
  auto cpu = Model::load(file, mo);
  mo.gpu = true;
  auto gpu = Model::load(file, mo);
  ASSERT_NE(gpu->gpu_info(), nullptr);
  const size_t V = size_t(cpu->config().vocab_size);
  const double tol_cpu = c.gguf.ends_with("-F32") ? 1e-4 : 1e-3;
  double worst_cpu = 0, worst_hf = 0;
  for (size_t p = 0; p < ref["prompts"].size(); ++p) {
    const std::vector<int> prompt = ref["prompts"][p].get<std::vector<int>>();
    std::vector<float> lc(prompt.size() * V), lg(prompt.size() * V), lh;
    cpu->reset();
    gpu->reset();
    cpu->forward(prompt, lc, true);
    gpu->forward(prompt, lg, true);
    for (const auto& row : ref["logits"][p])
      for (float v : row.get<std::vector<float>>()) lh.push_back(v);
    worst_cpu = std::max(worst_cpu, rel_max_diff(lc, lg, V));
    worst_hf = std::max(worst_hf, rel_max_diff(lh, lg, V));

    const std::vector<int> want = ref["greedy"][p].get<std::vector<int>>();
    std::vector<float> last(lg.end() - std::ptrdiff_t(V), lg.end());
    for (size_t i = 0; i < want.size(); ++i) {
      const int next = Sampler::argmax(last);
      if (next != want[i]) {
        float scale = 0;
        for (float v : last) scale = std::max(scale, std::fabs(v));
        const double gap = double(last[size_t(next)]) - double(last[size_t(want[i])]);
        EXPECT_LE(gap, kNearTie * scale) << c.gguf << " prompt " << p << " greedy token " << i << ": GPU " << next
                                         << ", transformers " << want[i] << " (gap " << gap << ")";
        break;
      }
      if (i + 1 < want.size()) gpu->forward(std::span<const int>(&next, 1), last);
    }
  }
  std::printf("[ gpu gguf %s ] rel max |dlogit| vs CPU %.3g (tolerance %.3g), vs transformers %.3g (tolerance %.3g)\n",
              c.gguf.c_str(), worst_cpu, tol_cpu, worst_hf, kVsTransformers);
  EXPECT_LE(worst_cpu, tol_cpu);
  EXPECT_LE(worst_hf, kVsTransformers);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GpuGgufQwen2Glm4,
                         ::testing::Values(Case{"qwen2moe-F32", "qwen2_moe"}, Case{"qwen2moe-BF16", "qwen2_moe"},
                                           Case{"glm4moe-F32", "glm4_moe"}, Case{"glm4moe-BF16", "glm4_moe"}),
                         [](const auto& i) {
                           std::string s = i.param.gguf;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });
