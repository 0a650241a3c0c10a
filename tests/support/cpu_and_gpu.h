// Test support: one model file loaded twice, on the CPU pass and with --gpu, the options
// otherwise the same, for the GPU suites that compare the two. Header-only; needs runtime/engine.
#pragma once

#include <filesystem>
#include <memory>

#include "runtime/engine/model.h"

namespace moestream::test {

struct CpuAndGpu {
  std::unique_ptr<Model> cpu, gpu;
};

// `file` on 2 CPU threads and a context of max_context positions, without and with --gpu.
inline CpuAndGpu load_cpu_and_gpu(const std::filesystem::path& file, int max_context) {
  ModelOptions mo;
  mo.n_threads = 2;
  mo.max_context = max_context;
  CpuAndGpu m;
  m.cpu = Model::load(file, mo);
  mo.gpu = true;
  m.gpu = Model::load(file, mo);
  return m;
}

}  // namespace moestream::test
