// --gpu-preload (runtime/gpu/gpu_preload.cpp): every expert in the GPU cache before the first
// token, so nothing is read after load and decode runs resident from its first all-hit step; the
// same logits as the run that fills the cache on demand; refused, naming both sizes, when the
// budget cannot hold the experts. Skip without a CUDA device.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/file_util.h"
#include "runtime/convert/synthetic_model.h"
#include "runtime/engine/model.h"
#include "runtime/engine/options.h"
#include "runtime/model/sampler.h"
#include "tests/support/grouped_q8_pack.h"
#include "tests/support/require_gpu.h"
#include "tests/support/test_model.h"

using namespace moestream;

namespace {

// A q8 pack whose experts take the grouped GEMM, so decode can run resident
// (test::grouped_q8_config).
class GpuPreload : public test::GroupedQ8Pack {
 protected:
  GpuPreload() : GroupedQ8Pack("gpu_preload") {}
  std::unique_ptr<Model> load(size_t cache_mb, bool preload, std::vector<int>* progress = nullptr) {
    ModelOptions mo = gpu_options(cache_mb, 256);
    mo.gpu_preload = preload;
    if (progress) mo.on_gpu_preload = [progress](int done, int total) {
      progress->push_back(done);
      EXPECT_EQ(total, 3);
    };
    return Model::load(dir_.path(), mo);
  }
};

}  // namespace

TEST_F(GpuPreload, NothingIsReadAfterLoadAndTheLogitsAreThoseOfTheOnDemandRun) {
  std::vector<int> progress;
  auto pre = load(0, true, &progress);
  auto lazy = load(0, false);
  EXPECT_EQ(progress, (std::vector<int>{1, 2, 3}));
  // An expert whose pages are resident (the file was just written) is used in place, not read.
  const uint64_t fetched_at_load = pre->expert_stats().experts_fetched();
  EXPECT_EQ(fetched_at_load, 3u * 16u) << "the preload fetches each expert once, read or in place";
  const size_t V = size_t(pre->config().vocab_size);
  std::vector<int> prompt = {3, 17, 40, 2, 9};
  std::vector<float> a(V), b(V);
  pre->forward(prompt, a);
  lazy->forward(prompt, b);
  ASSERT_EQ(std::memcmp(a.data(), b.data(), V * 4), 0) << "prefill";
  for (int i = 0; i < 24; ++i) {
    const int tok = Sampler::argmax(a);
    pre->forward(std::span<const int>(&tok, 1), a);
    lazy->forward(std::span<const int>(&tok, 1), b);
    ASSERT_EQ(std::memcmp(a.data(), b.data(), V * 4), 0) << "decode step " << i;
  }
  EXPECT_EQ(pre->expert_stats().experts_fetched(), fetched_at_load) << "an expert was fetched after the preload";
  const GpuForwardStats s = pre->gpu_stats();
  EXPECT_EQ(s.cache.policy.demand_misses, 0u);
  EXPECT_EQ(s.cache.h2d_bytes, 0u) << "the cache's counters start after the preload";
  EXPECT_GE(s.resident.steps, 23u) << "every decode step after the first runs resident";
  EXPECT_EQ(s.resident.redone, 0u);
}

TEST_F(GpuPreload, ABudgetBelowTheExpertsIsRefusedNamingBoth) {
  // 48 experts of ~105 KiB need ~5 MiB; 2 MiB holds fewer than half.
  const std::string m = test::error_message<ConfigError>([&] { load(2, true); });
  EXPECT_NE(m.find("`gpu_preload`"), std::string::npos) << m;
  EXPECT_NE(m.find("budget is 2 MiB"), std::string::npos) << m;
  EXPECT_NE(m.find("`gpu_cache_mb`"), std::string::npos) << m;
}

TEST(GpuPreloadOptions, PreloadWithoutGpuIsRefused) {
  ModelOptions mo;
  mo.gpu_preload = true;
  EXPECT_NE(test::error_message<ConfigError>([&] { check_model_options(mo); }).find("`gpu_preload=true` needs `gpu=true`"),
            std::string::npos);
}
