// A decode step allocates no heap memory once the model is warm: malloc and friends are
// interposed in this test binary and counted while a window is open.
#include <gtest/gtest.h>

#include <malloc.h>

#include <atomic>
#include <cstdlib>
#include <vector>

#include "common/file_util.h"
#include "kernels/cpu/ggml_quant.h"
#include "loader/store/expert_store.h"
#include "runtime/engine/model.h"
#include "runtime/model/sampler.h"
#include "runtime/convert/synthetic_model.h"
#include "tests/support/test_model.h"

extern "C" {
void* __libc_malloc(size_t);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void* __libc_memalign(size_t, size_t);
}

namespace {
std::atomic<bool> g_counting{false};
std::atomic<long> g_allocs{0};
void count() {
  if (g_counting.load(std::memory_order_relaxed)) g_allocs.fetch_add(1, std::memory_order_relaxed);
}
}  // namespace

// glibc resolves these in the executable first, so every allocation of the process passes here.
extern "C" void* malloc(size_t n) {
  count();
  return __libc_malloc(n);
}
extern "C" void* calloc(size_t a, size_t b) {
  count();
  return __libc_calloc(a, b);
}
extern "C" void* realloc(void* p, size_t n) {
  count();
  return __libc_realloc(p, n);
}
extern "C" void* aligned_alloc(size_t align, size_t n) {
  count();
  return __libc_memalign(align, n);
}
extern "C" int posix_memalign(void** out, size_t align, size_t n) {
  count();
  *out = __libc_memalign(align, n);
  return *out ? 0 : 12;  // ENOMEM
}

using namespace moestream;

TEST(DecodeAllocations, WarmDecodeStepsAllocateNothing) {
  TempDir d("alloc");
  const ModelConfig c = test::tiny_moe_config({.vocab = 301, .hidden = 96, .head_dim = 24, .intermediate = 70,
                                                .experts = 16, .top_k = 4, .quant = QuantType::kQ4});
  write_synthetic_model(d.path(), c, 77);
  ModelOptions o;
  o.n_threads = 2;
  // The pread store, explicitly: Model::load's default (the read engine, as infer) still
  // allocates per batch (its read plan and requests, ~11 allocations per layer fetch), which
  // this test does not cover; it holds the forward pass and the simple store to zero.
  auto m = Model::load(d.path(), o, open_pread_expert_store(d.path(), ModelConfig::load(d.path())));
  std::vector<float> logits(size_t(c.vocab_size));
  std::vector<int> prompt{5, 6, 7, 8};
  m->forward(prompt, logits);
  int tok = Sampler::argmax(logits);
  for (int i = 0; i < 4; ++i) {  // warm-up: buffers of the store and kernels reach their size
    m->forward(std::span<const int>(&tok, 1), logits);
    tok = Sampler::argmax(logits);
  }
  g_allocs = 0;
  g_counting = true;
  for (int i = 0; i < 16; ++i) {
    m->forward(std::span<const int>(&tok, 1), logits);
    tok = Sampler::argmax(logits);
  }
  g_counting = false;
  EXPECT_EQ(g_allocs.load(), 0) << "heap allocations during 16 warm decode steps";
  // The counter works: a vector allocation inside the window is seen.
  g_counting = true;
  std::vector<int>* v = new std::vector<int>(1000);
  g_counting = false;
  delete v;
  EXPECT_GE(g_allocs.load(), 1);
}

// The ggml kernels (kernels/cpu/ggml_quant.h) round their inputs into per-thread scratch that
// ggml_reserve_scratch sizes: after it, products of that size or smaller allocate nothing.
TEST(DecodeAllocations, GgmlKernelsAllocateNothingAfterReserve) {
  const size_t rows = 8, cols = 512, n = 5;
  std::vector<float> x(n * cols, 0.5f), y(n * rows);
  std::vector<std::pair<GgmlType, std::vector<uint8_t>>> mats;
  for (GgmlType t : {GgmlType::kF32, GgmlType::kBF16, GgmlType::kQ4_0, GgmlType::kQ5_1, GgmlType::kQ8_0,
                     GgmlType::kMXFP4}) {
    if (!ggml_type_computable(t)) continue;
    mats.emplace_back(t, std::vector<uint8_t>(*ggml_row_bytes(t, cols) * rows, 0x11));
  }
  ASSERT_FALSE(mats.empty());
  ggml_reserve_scratch(cols, n);
  g_allocs = 0;
  g_counting = true;
  for (auto& [t, w] : mats) {
    ggml_matvec(t, w.data(), cols, x.data(), y.data(), 0, rows);
    ggml_matmul(t, w.data(), cols, x.data(), n, y.data(), rows, 0, rows);
    ggml_matvec(t, w.data(), cols / 2, x.data(), y.data(), 0, rows);  // narrower: the same scratch
  }
  g_counting = false;
  EXPECT_EQ(g_allocs.load(), 0) << "heap allocations in ggml products after ggml_reserve_scratch";
}
