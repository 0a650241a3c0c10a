// MiniMax-M2 (issue 43) with --gpu: the tiny released-layout checkpoint of minimax_m2_test, packed
// and as a minimax-m2 GGUF run in place, gives the CPU pass's logits and greedy tokens on the GPU
// (full-width QK-norm, partial rotary and the one-group sigmoid router with its correction bias,
// all through the GPU's existing blocks). The CPU pass is checked against a plain reference in
// minimax_m2_test; the transformers fixture (tests/fixtures/minimax_m2) joins gpu_fixtures_test
// once made.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "common/file_util.h"
#include "runtime/convert/convert.h"
#include "runtime/engine/model.h"
#include "tests/support/cpu_and_gpu.h"
#include "tests/support/greedy_compare.h"
#include "tests/support/require_gpu.h"
#include "tests/support/tiny_hf.h"

namespace fs = std::filesystem;
using namespace moestream;
using namespace moestream::test;

namespace {

// Logits of every position of a prompt on both passes, within `tol`; with `greedy`, 24 greedy
// tokens of each too.
void compare_cpu_and_gpu(const fs::path& model, const char* what, double tol, bool greedy) {
  CpuAndGpu m = load_cpu_and_gpu(model, 64);
  const std::vector<int> prompt = {3, 17, 41, 8, 29, 52, 11, 36, 5, 44, 19};
  const double worst = prefill_rel_diff(*m.cpu, *m.gpu, prompt);
  std::printf("[ gpu_vs_cpu minimax_m2 %s ] rel max |dlogit| = %.3g (tolerance %.3g)\n", what, worst, tol);
  EXPECT_LE(worst, tol) << what;
  if (greedy) EXPECT_EQ(greedy_tokens(*m.gpu, prompt, 24), greedy_tokens(*m.cpu, prompt, 24)) << what;
}

TEST(GpuMinimaxM2, PackAndGgufGiveTheCpuLogitsAndTokens) {
  REQUIRE_GPU();
  const TinyHf m = make_tiny(Arch::kMinimaxM2, 5);
  TempDir d("gpu_minimax_m2");
  save_tiny(d.path() / "hf", m, DType::kF32, false, 1);
  ConvertOptions o;
  o.progress = false;
  o.quant = QuantType::kBF16;  // the GPU has no f32 expert kernel; the weights are bf16 values
  o.dense_dtype = "f32";
  convert_model(d.path() / "hf", d.path() / "pack", o);
  // Bounds of gpu_gguf_arch_test: bf16 experts (activations rounded as the kernels do) 1e-3, F32 1e-4.
  compare_cpu_and_gpu(d.path() / "pack", "bf16 pack", 1e-3, false);
  write_minimax_m2_gguf(m, d.path() / "m.gguf");
  compare_cpu_and_gpu(d.path() / "m.gguf", "F32 GGUF", 1e-4, true);
}

}  // namespace
