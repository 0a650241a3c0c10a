// --gpu-cpu-misses (runtime/gpu/gpu_cpu_misses.cpp): decode experts the VRAM cache lacks are
// computed on the CPU beside the GPU's hits. On a q8 pack whose cache holds a few experts: the
// logits stay within the GPU-vs-CPU tolerance of the CPU pass at every decode step (the missed
// experts' products are the CPU kernels', the hits the GPU's), misses were computed on the CPU and
// nothing was copied into VRAM for them during decode; with every expert cached nothing goes to
// the CPU and the logits are the plain GPU pass's bits. The option without --gpu is an error
// before a load. Skips without a CUDA device (the option check runs anywhere).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <span>
#include <vector>

#include "common/error.h"
#include "common/file_util.h"
#include "runtime/convert/synthetic_model.h"
#include "runtime/engine/model.h"
#include "runtime/engine/options.h"
#include "runtime/model/sampler.h"
#include "tests/support/greedy_compare.h"
#include "tests/support/grouped_q8_pack.h"
#include "tests/support/logit_compare.h"
#include "tests/support/require_gpu.h"
#include "tests/support/test_model.h"

using namespace moestream;

namespace {

class GpuCpuMisses : public test::GroupedQ8Pack {
 protected:
  GpuCpuMisses() : GroupedQ8Pack("gpu_cpu_misses", 11) {}
  std::unique_ptr<Model> load(bool gpu, size_t cache_mb, bool cpu_misses) {
    ModelOptions mo = gpu_options(cache_mb, 256);
    mo.gpu = gpu;
    mo.gpu_cpu_misses = cpu_misses;
    return Model::load(dir_.path(), mo);
  }
};

}  // namespace

TEST_F(GpuCpuMisses, MissesComputedOnTheCpuStayWithinTheGpuTolerance) {
  auto cpu = load(false, 0, false);
  auto hybrid = load(true, 1, true);  // 1 MiB: a few of the 48 experts
  const size_t V = size_t(cpu->config().vocab_size);
  std::vector<int> prompt(9);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int((5 * i + 1) % V);
  std::vector<float> lc(V), lh(V);
  cpu->forward(prompt, lc);
  hybrid->forward(prompt, lh);
  const GpuForwardStats before = hybrid->gpu_stats();
  double worst = test::rel_max_diff(lc, lh, lc.size());
  for (int i = 0; i < 24; ++i) {  // both fed the CPU's greedy token
    const int tok = Sampler::argmax(lc);
    cpu->forward(std::span<const int>(&tok, 1), lc);
    hybrid->forward(std::span<const int>(&tok, 1), lh);
    worst = std::max(worst, test::rel_max_diff(lc, lh, lc.size()));
  }
  const GpuForwardStats d = hybrid->gpu_stats() - before;
  std::printf("cpu misses: %llu experts in %llu layer steps; worst relative logit difference %.2e\n",
              (unsigned long long)d.cpu_misses.experts, (unsigned long long)d.cpu_misses.layers, worst);
  EXPECT_LE(worst, 0.01);  // the q8 fixtures' GPU-vs-CPU tolerance (tests/gpu_fixtures_test.cpp)
  EXPECT_GT(d.cpu_misses.experts, 24u * 2u) << "a cache of a few experts misses most of each step's";
  EXPECT_EQ(d.cache.h2d_bytes, 0u) << "nothing is copied into VRAM for a miss";
}

TEST_F(GpuCpuMisses, WithEveryExpertCachedNothingGoesToTheCpuAndTheBitsArePlainGpus) {
  auto plain = load(true, 0, false);  // automatic budget: every expert fits
  auto hybrid = load(true, 0, true);
  std::vector<int> prompt(64);  // its prefill places every expert of the tiny model
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int((7 * i + 3) % size_t(plain->config().vocab_size));
  test::greedy_both_bitwise(*hybrid, *plain, prompt, 16);
  EXPECT_EQ(hybrid->gpu_stats().cpu_misses.experts, plain->gpu_stats().cpu_misses.experts);
  EXPECT_EQ(plain->gpu_stats().cpu_misses.experts, 0u);
}

TEST(GpuCpuMissesOptions, WithoutGpuItIsAConfigErrorNamingBoth) {
  ModelOptions mo;
  mo.gpu_cpu_misses = true;
  try {
    check_model_options(mo);
    ADD_FAILURE() << "--gpu-cpu-misses without --gpu accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("`gpu_cpu_misses=true` needs `gpu=true`"), std::string::npos) << e.what();
  }
}
