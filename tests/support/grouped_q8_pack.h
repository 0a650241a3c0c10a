// Test support: the fixture of the GPU suites that decode resident (gpu_forward_test's
// GpuResident, gpu_graphs_test, gpu_preload_test, gpu_cpu_misses_test): a q8 pack whose expert
// matrices all take the grouped GEMM (grouped_q8_config: 3 layers, 16 experts, top-4) written into
// a temp dir for each test, and the options of a --gpu model on it. Skips without a CUDA device.
// Header-only.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>

#include "common/file_util.h"
#include "runtime/convert/synthetic_model.h"
#include "runtime/engine/model.h"
#include "tests/support/require_gpu.h"
#include "tests/support/test_model.h"

namespace moestream::test {

class GroupedQ8Pack : public ::testing::Test {
 protected:
  // `seed` draws the pack's weights.
  explicit GroupedQ8Pack(const char* dir_prefix, uint32_t seed = 7) : dir_(dir_prefix), seed_(seed) {}
  void SetUp() override {
    REQUIRE_GPU();
    write_synthetic_model(dir_.path(), grouped_q8_config(), seed_, 2);
  }
  // --gpu on 2 CPU threads with a VRAM cache of cache_mb MiB (0: the automatic budget).
  static ModelOptions gpu_options(size_t cache_mb, int max_context) {
    ModelOptions mo;
    mo.n_threads = 2;
    mo.max_context = max_context;
    mo.gpu = true;
    mo.gpu_cache_mb = cache_mb;
    return mo;
  }
  TempDir dir_;
  uint32_t seed_;
};

}  // namespace moestream::test
