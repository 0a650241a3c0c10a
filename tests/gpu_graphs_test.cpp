// CUDA graphs of the resident decode step (runtime/gpu/gpu_graphs.h): the same logits as the
// step launched kernel by kernel, one graph per layer and one for lm_head per resident step, graphs
// updated in place from step to step and instantiated anew when a layer changes shape
// (attention starts splitting the context), and a miss inside a graph step still finished
// through the synced path. Skip without a CUDA device.
#include <gtest/gtest.h>

#include <cstring>
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
#include "tests/support/require_gpu.h"
#include "tests/support/test_model.h"

using namespace moestream;

namespace {

// A q8 pack whose experts take the grouped GEMM, so decode can run resident
// (test::grouped_q8_config): 3 layers, so 4 graph segments per resident step.
class GpuGraphs : public test::GroupedQ8Pack {
 protected:
  GpuGraphs() : GroupedQ8Pack("gpu_graphs") {}
  std::unique_ptr<Model> load(size_t cache_mb, bool graphs) {
    ModelOptions mo = gpu_options(cache_mb, 512);
    mo.gpu_no_graphs = !graphs;
    return Model::load(dir_.path(), mo);
  }
  // Greedy decode on both models after a prompt of n_prompt ids, logits compared bit for bit.
  static void decode_both(Model& a, Model& b, int n_prompt, int steps) {
    std::vector<int> prompt(static_cast<size_t>(n_prompt));
    for (int i = 0; i < n_prompt; ++i) prompt[size_t(i)] = (7 * i + 3) % a.config().vocab_size;
    test::greedy_both_bitwise(a, b, prompt, steps);
  }
};

}  // namespace

TEST_F(GpuGraphs, TheSameBitsAsKernelByKernelWithOneGraphPerLayerAndLmHead) {
  auto graphs = load(0, true);  // automatic budget: every expert fits
  auto plain = load(0, false);
  decode_both(*graphs, *plain, 5, 40);
  const GpuForwardStats g = graphs->gpu_stats(), p = plain->gpu_stats();
  std::printf("graphs: %llu resident steps, %llu launches, %llu updates, %llu instantiations\n",
              (unsigned long long)g.resident.steps, (unsigned long long)g.resident.graphs.launches,
              (unsigned long long)g.resident.graphs.updates,
              (unsigned long long)g.resident.graphs.instantiations);
  ASSERT_GT(g.resident.steps, 20u);
  EXPECT_EQ(g.resident.steps, p.resident.steps);
  EXPECT_EQ(g.resident.redone, p.resident.redone);  // a step meeting an expert not yet loaded
  EXPECT_EQ(g.resident.graphs.launches, g.resident.steps * 4u);
  EXPECT_EQ(g.resident.graphs.updates + g.resident.graphs.instantiations, g.resident.graphs.launches);
  EXPECT_EQ(g.resident.graphs.instantiations, 4u) << "one per segment: the shapes never changed";
  EXPECT_EQ(p.resident.graphs.launches, 0u);
}

TEST_F(GpuGraphs, ALayerThatChangesShapeIsInstantiatedAnewAndStillTheSameBits) {
  // Past 128 keys a decode token's attention splits its context over two blocks (a merge kernel
  // joins the layer's graph): decoding from 120 to 150 positions crosses that.
  auto graphs = load(0, true);
  auto plain = load(0, false);
  decode_both(*graphs, *plain, 120, 30);
  const GpuForwardStats g = graphs->gpu_stats();
  std::printf("graphs across a split: %llu launches, %llu updates, %llu instantiations\n",
              (unsigned long long)g.resident.graphs.launches, (unsigned long long)g.resident.graphs.updates,
              (unsigned long long)g.resident.graphs.instantiations);
  EXPECT_GE(g.resident.graphs.instantiations, 4u + 3u) << "each layer's graph changed shape once";
  EXPECT_GT(g.resident.graphs.updates, g.resident.graphs.instantiations);
}

TEST_F(GpuGraphs, AMissInAGraphStepIsFinishedThroughTheSyncedPath) {
  // 3 MiB holds about 60% of the 48 experts: some resident steps meet a miss and are redone.
  auto graphs = load(3, true);
  auto plain = load(3, false);
  decode_both(*graphs, *plain, 5, 96);
  const GpuForwardStats g = graphs->gpu_stats(), p = plain->gpu_stats();
  EXPECT_GT(g.resident.redone, 0u);
  EXPECT_EQ(g.resident.redone, p.resident.redone);
  EXPECT_EQ(g.cache.policy.demand_misses, p.cache.policy.demand_misses);
  EXPECT_GT(g.resident.graphs.launches, 0u);
}

// Greedy decoding's pick on the device (Model::forward_argmax: gpu::argmax in lm_head's graph, or
// after the synced path's lm_head when a step missed) against Sampler::argmax of the logits.
TEST_F(GpuGraphs, TheDevicesGreedyPickIsTheArgmaxOfTheLogits) {
  for (size_t cache_mb : {size_t(0), size_t(3)}) {  // every expert resident; misses redone
    SCOPED_TRACE(cache_mb);
    auto picks = load(cache_mb, true);
    auto logits = load(cache_mb, true);
    std::vector<float> l(size_t(logits->config().vocab_size));
    std::vector<int> tok = {3, 10, 17, 24, 31};
    int a = picks->forward_argmax(tok);
    logits->forward(tok, l);
    int b = Sampler::argmax(l);
    for (int step = 0; step < 48; ++step) {
      ASSERT_EQ(a, b) << "step " << step;
      a = picks->forward_argmax(std::span<const int>(&a, 1));
      logits->forward(std::span<const int>(&b, 1), l);
      b = Sampler::argmax(l);
    }
    const GpuForwardStats g = picks->gpu_stats();
    if (cache_mb == 0) EXPECT_GT(g.resident.steps, 24u);  // once the first steps have read every expert
    // With misses a resident step is tried only after one that read nothing (5 in the first
    // device run); some of them met a miss and were finished through the synced path.
    if (cache_mb > 0) EXPECT_GT(g.resident.redone, 0u);
    // The step's span on the device lies within its host time.
    EXPECT_GT(g.resident.device_s, 0.0);
    EXPECT_GT(g.resident.wall_s, g.resident.device_s);
  }
}

TEST(GpuGraphsOptions, NoGraphsWithoutGpuIsRefused) {
  ModelOptions mo;
  mo.gpu_no_graphs = true;
  EXPECT_NE(test::error_message<ConfigError>([&] { check_model_options(mo); }).find("`gpu_no_graphs=true` needs `gpu=true`"),
            std::string::npos);
}
