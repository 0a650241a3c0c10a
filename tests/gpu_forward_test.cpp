// The GPU forward pass (runtime/gpu/gpu_forward.h, `infer --gpu`) against the CPU path and
// Hugging Face transformers: logits, greedy tokens, look-ahead, chunking, telemetry, errors,
// cache-aware routing.
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

#include "common/error.h"
#include "common/file_util.h"
#include "kernels/cuda/gpu_ops.h"
#include "kernels/cuda/round_activations.h"
#include "runtime/convert/convert.h"
#include "runtime/convert/synthetic_model.h"
#include "runtime/engine/generate.h"
#include "runtime/engine/model.h"
#include "runtime/gpu/gpu_expert_cache.h"
#include "runtime/model/dense_weights.h"
#include "loader/store/engine_expert_store.h"
#include "kernels/cpu/quant_kernels.h"
#include "runtime/model/sampler.h"
#include "runtime/tokenizer/tokenizer.h"

#include <cuda_runtime.h>
#include <random>
#include "tests/support/greedy_compare.h"
#include "tests/support/strict_skip.h"
#include "tests/support/test_model.h"

namespace fs = std::filesystem;
using namespace moestream;

namespace {

const fs::path kSource = MOESTREAM_SOURCE_DIR;
const fs::path kDemo = kSource / "models" / "demo";

bool have_gpu(std::string* why) {
  const char* w = "";
  if (gpu::device_count(&w) > 0) return true;
  *why = w;
  return false;
}

#define REQUIRE_GPU()                                                       \
  do {                                                                      \
    std::string why_;                                                       \
    if (!have_gpu(&why_)) GTEST_SKIP() << "no usable CUDA device: " << why_; \
  } while (0)

// A prompt of n ids spread over the vocabulary (deterministic, not all in one region).
std::vector<int> prompt_ids(int n, int vocab) {
  std::vector<int> p;
  for (int i = 0; i < n; ++i) p.push_back(int((1009LL * i + 17) % vocab));
  return p;
}

// max over rows of max |a - b| / max |a| (the row's logit scale), rows of V logits.
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

std::vector<int> greedy(Model& m, const std::vector<int>& prompt, int n) {
  std::vector<int> out;
  std::vector<float> logits(size_t(m.config().vocab_size));
  m.reset();
  m.forward(prompt, logits);
  for (int i = 0; i < n; ++i) {
    const int next = Sampler::argmax(logits);
    out.push_back(next);
    if (i + 1 < n) m.forward(std::span<const int>(&next, 1), logits);
  }
  return out;
}

size_t demo_expert_bytes() {
  const ModelConfig c = ModelConfig::load(kDemo);
  return size_t(c.n_layers) * size_t(c.n_experts) *
         ExpertLayout::make(c.expert_quant, size_t(c.hidden_size), size_t(c.moe_intermediate_size)).bytes;
}

ModelOptions demo_options(bool gpu, size_t cache_mb = 0, int lookahead = 0, int batch = 64) {
  ModelOptions mo;
  mo.n_threads = 2;
  mo.max_context = 512;
  mo.max_batch = batch;
  mo.gpu = gpu;
  mo.gpu_cache_mb = cache_mb;
  mo.moe_lookahead = lookahead;
  return mo;
}

std::unique_ptr<Model> load_demo(bool gpu, size_t cache_mb = 0, int lookahead = 0, int batch = 64) {
  return Model::load(kDemo, demo_options(gpu, cache_mb, lookahead, batch));
}

// Reads through the plain pread store but reports a fixed host tier, whatever was read: expert e
// of layer l is in the host cache when (e + l) % 3 == 0. The CPU and the GPU pass then see the
// same host residency.
class FixedResidencyStore final : public ExpertStore {
 public:
  explicit FixedResidencyStore(std::unique_ptr<ExpertStore> inner) : inner_(std::move(inner)) {}
  void fetch(int layer, std::span<const int> ids, std::vector<const uint8_t*>& out) override {
    inner_->fetch(layer, ids, out);
  }
  void begin_fetch(int layer, std::span<const int> ids) override { inner_->begin_fetch(layer, ids); }
  bool next_ready(size_t* index, const uint8_t** payload, bool wait = true) override {
    return inner_->next_ready(index, payload, wait);
  }
  void read_ahead(int layer, std::span<const int> ids) override { inner_->read_ahead(layer, ids); }
  void residency(int layer, std::span<ExpertTier> out) const override {
    for (size_t e = 0; e < out.size(); ++e)
      out[e] = (int(e) + layer) % 3 == 0 ? ExpertTier::kHostCache : ExpertTier::kStorage;
  }
  ExpertStoreStats stats() const override { return inner_->stats(); }
  std::string describe() const override { return "fixed residency over " + inner_->describe(); }

 private:
  std::unique_ptr<ExpertStore> inner_;
};

std::unique_ptr<Model> load_demo_fixed_residency(bool gpu, const CacheAwareOptions& ca) {
  ModelOptions mo = demo_options(gpu);
  mo.cache_aware = ca;
  return Model::load(kDemo, mo,
                     std::make_unique<FixedResidencyStore>(
                         open_pread_expert_store(kDemo, ModelConfig::load(kDemo))));
}

// The demo on the pread store, which has no host tier: every expert says kStorage, whatever the
// page cache holds (Model::load's default store would report the page cache).
std::unique_ptr<Model> load_demo_on_pread_store(const ModelOptions& mo) {
  return Model::load(kDemo, mo, open_pread_expert_store(kDemo, ModelConfig::load(kDemo)));
}

// Final expert ids of every layer of one forward call, [layer][token * top_k + slot].
std::vector<std::vector<int>> routed_ids(Model& m, const std::vector<int>& prompt) {
  std::vector<std::vector<int>> ids(size_t(m.config().n_layers));
  m.set_routing_callback([&](const RoutingEvent& e) {
    ids[size_t(e.layer)].insert(ids[size_t(e.layer)].end(), e.ids,
                                e.ids + size_t(e.n_tokens) * size_t(e.top_k));
  });
  std::vector<float> logits(size_t(m.config().vocab_size));
  m.reset();
  m.forward(prompt, logits);
  m.set_routing_callback({});
  return ids;
}

// Both backends round q8/q4 expert inputs to int8 per 32-block (as the CPU's quant_matvec
// does), so they differ by summation order (cuBLAS vs Eigen) and by the int8 roundings that this
// noise flips across a .5 boundary: one flip moves an input by a full quant step. Measured on the
// H200 (docs/results.md "GPU forward (issue 8)"): demo prefill 0.034, decode 0.0072; both
// backends are deterministic, so these runs reproduce exactly.
constexpr double kDemoTolerance = 0.05;
double fixture_tolerance(QuantType q) { return q == QuantType::kBF16 ? 1e-3 : 0.01; }

}  // namespace

TEST(GpuRoundActivations, MatchesTheCpuActivationQuantisationBitForBit) {
  REQUIRE_GPU();
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (const auto& [rows, cols] : {std::pair{3, 80}, std::pair{5, 67}, std::pair{2, 256}, std::pair{1, 33}}) {
    std::vector<float> x(size_t(rows) * cols);
    for (float& v : x) v = nd(rng);
    for (int c = 0; c < std::min(cols, 32); ++c) x[size_t(c)] = 0.0f;  // an all-zero block stays zero
    std::vector<float> want(x.size());
    const size_t nb = size_t(cols + 31) / 32;
    std::vector<float> d(nb), sum8(nb);
    std::vector<int8_t> qs(nb * 32), pairs(nb * 32);
    std::vector<uint8_t> abs_qs(nb * 32);
    for (int r = 0; r < rows; ++r) {
      detail::quantize_activations(x.data() + size_t(r) * cols, size_t(cols), d.data(), qs.data(),
                                   abs_qs.data(), sum8.data(), pairs.data());
      for (int c = 0; c < cols; ++c)
        want[size_t(r) * cols + c] = float(qs[size_t(c)]) * d[size_t(c) / 32];
    }
    float* dev = nullptr;
    ASSERT_EQ(cudaMalloc(&dev, x.size() * 4), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dev, x.data(), x.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    gpu::round_activations_q8(dev, rows, cols, nullptr);
    std::vector<float> got(x.size());
    ASSERT_EQ(cudaMemcpy(got.data(), dev, x.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    cudaFree(dev);
    size_t differ = 0;
    for (size_t i = 0; i < x.size(); ++i) differ += got[i] != want[i];
    std::printf("[ round_activations_q8 ] n=%zu worst error / tolerance = %.3f\n", x.size(),
                double(differ));
    EXPECT_EQ(differ, 0u) << rows << "x" << cols;
  }
}

// Issue 19 item 5: the CPU pass has its own look-ahead (tests/expert_store_lookahead_test.cpp).
TEST(GpuForwardOptions, LookaheadWithoutGpuRunsOnTheCpu) {
  ModelOptions mo;
  mo.moe_lookahead = 4;
  EXPECT_NO_THROW(Model::load(kDemo, mo));
}

TEST(GpuForwardOptions, CacheBudgetWithoutGpuIsRefused) {
  ModelOptions mo;
  mo.gpu_cache_mb = 16;
  EXPECT_THROW(Model::load(kDemo, mo), ConfigError);
}

TEST(GpuForwardOptions, GpuWithoutDeviceIsAClearError) {
  std::string why;
  if (have_gpu(&why)) GTEST_SKIP() << "a GPU is present: the no-device error cannot happen here";
  ModelOptions mo;
  mo.gpu = true;
  try {
    Model::load(kDemo, mo);
    FAIL() << "--gpu without a device was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("CUDA"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(gpu_unavailable_reason().empty());
}

TEST(GpuForward, DemoLogitsMatchCpuAndGreedyTokensAreIdentical) {
  REQUIRE_GPU();
  auto cpu = load_demo(false);
  auto gpu = load_demo(true);
  const size_t V = size_t(cpu->config().vocab_size);
  const std::vector<int> prompt = prompt_ids(37, int(V));
  std::vector<float> lc(prompt.size() * V), lg(prompt.size() * V);
  cpu->forward(prompt, lc, true);
  gpu->forward(prompt, lg, true);
  const double prefill_rel = rel_max_diff(lc, lg, V);
  // Decode steps through the KV cache: feed the same tokens to both.
  double decode_rel = 0;
  std::vector<float> dc(V), dg(V);
  for (int i = 0; i < 16; ++i) {
    const int id = Sampler::argmax(std::span<const float>(lc.data() + (prompt.size() - 1) * V, V)) + i;
    const int tok = id % int(V);
    cpu->forward(std::span<const int>(&tok, 1), dc);
    gpu->forward(std::span<const int>(&tok, 1), dg);
    decode_rel = std::max(decode_rel, rel_max_diff(dc, dg, V));
  }
  std::printf("[ gpu_vs_cpu demo q8 ] prefill rel max |dlogit| = %.3g, decode = %.3g, tolerance %.3g\n",
              prefill_rel, decode_rel, kDemoTolerance);
  EXPECT_LE(prefill_rel, kDemoTolerance);
  EXPECT_LE(decode_rel, kDemoTolerance);

  // Greedy tokens after the held-out text that scripts/device_gpu.sh gives infer (600 bytes).
  // On an arbitrary id sequence a near-tie can flip (measured: 20 of 64 equal on prompt_ids(37)).
  const std::string text = read_file(kDemo / "heldout_head.txt").substr(0, 600);
  const Tokenizer tok = Tokenizer::load(kDemo / "tokenizer.json", kDemo / "tokenizer_config.json");
  std::vector<int> text_ids;
  for (int32_t id : tok.encode(text, true)) text_ids.push_back(id);
  const std::vector<int> gc = greedy(*cpu, text_ids, 64), gg = greedy(*gpu, text_ids, 64);
  size_t same = 0;
  while (same < gc.size() && gc[same] == gg[same]) ++same;
  std::printf("[ gpu_vs_cpu demo q8 ] greedy tokens identical after the held-out text: %zu/64\n", same);
  EXPECT_EQ(gc, gg);
}

TEST(GpuForward, ChunkedPrefillMatchesOneChunk) {
  REQUIRE_GPU();
  auto one = load_demo(true, 0, 0, 64);
  auto chunked = load_demo(true, 0, 0, 7);  // 50 tokens = 7 chunks, the last one short
  const size_t V = size_t(one->config().vocab_size);
  const std::vector<int> prompt = prompt_ids(50, int(V));
  std::vector<float> a(prompt.size() * V), b(prompt.size() * V);
  one->forward(prompt, a, true);
  chunked->forward(prompt, b, true);
  const double rel = rel_max_diff(a, b, V);
  std::printf("[ gpu chunked prefill ] rel max |dlogit| 7-token vs 64-token chunks = %.3g\n", rel);
  // cuBLAS's blocking differs with the chunk length; the int8 input rounding of q8 experts turns
  // that 1e-6 noise into a few flipped quant steps (measured 0.0068; 1.3e-6 without rounding).
  EXPECT_LE(rel, 0.02);
}

TEST(GpuForward, LookaheadNeverChangesTokensAndReportsRecall) {
  REQUIRE_GPU();
  // A quarter of the expert bytes: decode misses, evicts, and prefetches under the guard.
  const size_t cache_mb = std::max<size_t>(1, (demo_expert_bytes() / 4) >> 20);
  auto plain = load_demo(true, cache_mb, 0);
  auto ahead = load_demo(true, cache_mb, 6);
  const std::vector<int> prompt = prompt_ids(21, plain->config().vocab_size);
  EXPECT_EQ(greedy(*plain, prompt, 48), greedy(*ahead, prompt, 48));

  const GpuForwardStats p = plain->gpu_stats(), a = ahead->gpu_stats();
  EXPECT_EQ(p.cache.prefetch_issued + p.cache.prefetch_dropped, 0u);
  EXPECT_EQ(p.lookahead.layers, 0u);
  const int L = ahead->config().n_layers, K = ahead->config().n_experts_per_tok;
  EXPECT_EQ(a.lookahead.layers, uint64_t(47 * (L - 1)));  // every decode layer after the first
  EXPECT_EQ(a.lookahead.demanded, a.lookahead.layers * uint64_t(K));
  EXPECT_GT(a.cache.prefetch_issued + a.cache.prefetch_dropped, 0u);
  EXPECT_LE(a.cache.prefetch_used, a.cache.prefetch_issued);
  EXPECT_GT(p.cache.policy.evictions, 0u) << "the small cache never evicted: the test is too easy";
  std::printf("[ gpu look-ahead 6, cache %zu MiB ] recall %.4f, prefetches issued %llu used %llu "
              "dropped %llu, demand misses %llu (no look-ahead: %llu)\n",
              cache_mb, a.lookahead.recall(), (unsigned long long)a.cache.prefetch_issued,
              (unsigned long long)a.cache.prefetch_used,
              (unsigned long long)a.cache.prefetch_dropped,
              (unsigned long long)a.cache.policy.demand_misses,
              (unsigned long long)p.cache.policy.demand_misses);
}

TEST(GpuForward, LogitsAreBitIdenticalWhateverTheCacheHolds) {
  REQUIRE_GPU();
  // Decode runs the kernels of resident experts before the misses' (a split that depends on the
  // cache's contents); each expert's rows, the GEMM tile and the combine order do not, so a
  // whole-model cache, a quarter cache and a quarter cache with look-ahead agree bit for bit.
  const size_t quarter = std::max<size_t>(1, (demo_expert_bytes() / 4) >> 20);
  auto full = load_demo(true);
  auto small = load_demo(true, quarter);
  auto ahead = load_demo(true, quarter, 6);
  const size_t V = size_t(full->config().vocab_size);
  const std::vector<int> prompt = prompt_ids(21, int(V));
  std::vector<float> lf(V), ls(V), la(V);
  full->forward(prompt, lf);
  small->forward(prompt, ls);
  ahead->forward(prompt, la);
  ASSERT_EQ(std::memcmp(lf.data(), ls.data(), V * 4), 0) << "prefill";
  ASSERT_EQ(std::memcmp(lf.data(), la.data(), V * 4), 0) << "prefill, look-ahead";
  for (int i = 0; i < 32; ++i) {
    const int tok = Sampler::argmax(lf);
    full->forward(std::span<const int>(&tok, 1), lf);
    small->forward(std::span<const int>(&tok, 1), ls);
    ahead->forward(std::span<const int>(&tok, 1), la);
    ASSERT_EQ(std::memcmp(lf.data(), ls.data(), V * 4), 0) << "decode step " << i;
    ASSERT_EQ(std::memcmp(lf.data(), la.data(), V * 4), 0) << "decode step " << i << ", look-ahead";
  }
  // The quarter cache had hits and misses in the same steps' layers: both launches ran.
  const GpuForwardStats st = small->gpu_stats();
  EXPECT_GT(st.cache.policy.demand_hits, 0u);
  EXPECT_GT(st.cache.policy.demand_misses, 0u);
}

TEST(GpuForward, WarmWholeModelCacheCopiesNothing) {
  REQUIRE_GPU();
  auto m = load_demo(true);  // automatic budget: the whole demo model fits
  ASSERT_NE(m->gpu_info(), nullptr);
  EXPECT_GE(m->gpu_info()->cache_bytes, demo_expert_bytes());
  const std::vector<int> prompt = prompt_ids(40, m->config().vocab_size);
  SamplerParams sp;
  sp.temperature = 0;
  Sampler s1(sp), s2(sp);
  GenerateOptions go;
  go.n_new = 24;
  // The first run fills the cache with every expert it routes to; the second routes the same
  // way (same prompt, greedy), so it must find everything resident and copy nothing.
  generate(*m, prompt, go, s1, {});
  const GenerateStats st = generate(*m, prompt, go, s2, {});
  EXPECT_EQ(st.decode.gpu.cache.policy.demand_misses, 0u);
  EXPECT_EQ(st.prefill.gpu.cache.policy.prefill_fills + st.prefill.gpu.cache.policy.prefill_no_room, 0u);
  EXPECT_EQ(st.decode.gpu.cache.h2d_bytes + st.prefill.gpu.cache.h2d_bytes, 0u);
  EXPECT_GT(st.decode.gpu.cache.policy.demand_hits, 0u);
}

TEST(GpuForward, RoutingCallbackSeesTheCpuRouting) {
  REQUIRE_GPU();
  auto cpu = load_demo(false);
  auto gpu = load_demo(true);
  std::vector<int> ids_cpu, ids_gpu;
  cpu->set_routing_callback([&](const RoutingEvent& e) {
    ids_cpu.insert(ids_cpu.end(), e.ids, e.ids + size_t(e.n_tokens) * e.top_k);
  });
  gpu->set_routing_callback([&](const RoutingEvent& e) {
    ids_gpu.insert(ids_gpu.end(), e.ids, e.ids + size_t(e.n_tokens) * e.top_k);
  });
  greedy(*cpu, prompt_ids(12, cpu->config().vocab_size), 8);
  greedy(*gpu, prompt_ids(12, gpu->config().vocab_size), 8);
  ASSERT_EQ(ids_cpu.size(), ids_gpu.size());
  size_t same = 0;
  for (size_t i = 0; i < ids_cpu.size(); ++i) same += ids_cpu[i] == ids_gpu[i];
  std::printf("[ gpu routing ] %zu of %zu expert choices equal to the CPU's\n", same, ids_cpu.size());
  // Near-ties may flip under the activation rounding the CPU does; almost all must agree.
  EXPECT_GE(double(same), 0.98 * double(ids_cpu.size()));
}

TEST(GpuForward, RoutingOverrideIsHonouredAsOnTheCpu) {
  REQUIRE_GPU();
  auto cpu = load_demo(false);
  auto gpu = load_demo(true);
  const int E = cpu->config().n_experts, K = cpu->config().n_experts_per_tok;
  // A fixed schedule unlike the router's: token o at layer l takes experts (3l + o + 5j) mod E.
  auto fn = [E, K](int layer, uint64_t ordinal, int n, int* ids, float* w) {
    for (int t = 0; t < n; ++t)
      for (int j = 0; j < K; ++j) {
        ids[t * K + j] = int((3 * uint64_t(layer) + ordinal + uint64_t(t) + 5 * uint64_t(j)) % uint64_t(E));
        w[t * K + j] = float(K - j) / float(K * (K + 1) / 2);
      }
  };
  cpu->set_routing_override(fn);
  gpu->set_routing_override(fn);
  std::vector<int> seen;
  gpu->set_routing_callback([&](const RoutingEvent& e) {
    if (e.layer == 2) seen.insert(seen.end(), e.ids, e.ids + size_t(e.n_tokens) * e.top_k);
  });
  const size_t V = size_t(cpu->config().vocab_size);
  const std::vector<int> prompt = prompt_ids(9, int(V));
  std::vector<float> a(prompt.size() * V), b(prompt.size() * V);
  cpu->forward(prompt, a, true);
  gpu->forward(prompt, b, true);
  const double rel = rel_max_diff(a, b, V);
  std::printf("[ gpu routing override ] rel max |dlogit| vs CPU = %.3g\n", rel);
  EXPECT_LE(rel, kDemoTolerance);
  ASSERT_EQ(seen.size(), prompt.size() * size_t(K));
  EXPECT_EQ(seen[0], (3 * 2 + 0) % E);  // layer 2, first token since load, slot 0
  EXPECT_EQ(seen[size_t(K) + 1], (3 * 2 + 1 + 5) % E);
}

TEST(GpuCacheAware, ToleranceZeroGivesThePlainGpuTokensAndTheGpuCacheIsConsulted) {
  REQUIRE_GPU();
  // A quarter of the expert bytes: decode finds some experts resident in the GPU cache and not
  // others. The pread store has no host tier (every expert says kStorage), so on the GPU only
  // the GPU cache can make an expert resident, and on the CPU nothing is.
  const size_t quarter = std::max<size_t>(1, (demo_expert_bytes() / 4) >> 20);
  ModelOptions mo = demo_options(true, quarter);
  auto plain = load_demo_on_pread_store(mo);
  mo.cache_aware = {true, 0.0f};
  auto zero = load_demo_on_pread_store(mo);
  mo.cache_aware = {true, 0.5f};
  auto wide = load_demo_on_pread_store(mo);
  mo = demo_options(false);
  mo.cache_aware = {true, 0.5f};
  auto cpu_wide = load_demo_on_pread_store(mo);
  const std::vector<int> prompt = prompt_ids(21, plain->config().vocab_size);
  const int n_new = 48;
  const std::vector<int> p = greedy(*plain, prompt, n_new);
  EXPECT_EQ(greedy(*zero, prompt, n_new), p);
  const CacheAwareStats& z = zero->cache_aware_stats();
  const int L = zero->config().n_layers, K = zero->config().n_experts_per_tok;
  EXPECT_EQ(z.routings, uint64_t(21 + n_new - 1) * uint64_t(L));  // prompt + fed-back tokens
  EXPECT_EQ(z.slots, z.routings * uint64_t(K));
  EXPECT_EQ(z.substitutions, 0u);
  EXPECT_EQ(z.misses_after, z.misses_before);
  EXPECT_GT(z.misses_before, 0u) << "the quarter cache never missed: the test is too easy";

  greedy(*wide, prompt, n_new);
  greedy(*cpu_wide, prompt, n_new);
  const CacheAwareStats& w = wide->cache_aware_stats();
  std::printf("[ gpu cache-aware 0.5, cache %zu MiB ] substitutions %llu of %llu slots, misses "
              "%llu -> %llu; GPU demand misses %llu (tolerance 0: %llu)\n",
              quarter, (unsigned long long)w.substitutions, (unsigned long long)w.slots,
              (unsigned long long)w.misses_before, (unsigned long long)w.misses_after,
              (unsigned long long)wide->gpu_stats().cache.policy.demand_misses,
              (unsigned long long)zero->gpu_stats().cache.policy.demand_misses);
  EXPECT_GT(w.substitutions, 0u) << "nothing resident in the GPU cache was ever substituted";
  EXPECT_LT(w.misses_after, w.misses_before);
  EXPECT_LE(w.misses_before - w.misses_after, w.substitutions);  // a swap saves one read at most
  // The same tolerance on the CPU over the same store finds nothing resident: what the GPU
  // substituted came from its own cache.
  EXPECT_EQ(cpu_wide->cache_aware_stats().substitutions, 0u);
  EXPECT_GT(cpu_wide->cache_aware_stats().routings, 0u);
}

TEST(GpuCacheAware, SubstitutesAsTheCpuDoesForTheSameResidency) {
  REQUIRE_GPU();
  // One 40-token prefill chunk on fresh models: a layer's experts enter the GPU cache only after
  // its routing, so at every layer's snapshot the GPU cache holds none of that layer and both
  // passes see exactly the store's fixed host tier. The rule is the same code on both; what can
  // differ is the router logits (summation order, int8 input rounding), so a near-tie may flip a
  // top-k choice or a within-tolerance test: exact agreement is not required, near agreement is.
  const CacheAwareOptions ca{true, 0.5f};
  auto cpu = load_demo_fixed_residency(false, ca);
  auto gpu = load_demo_fixed_residency(true, ca);
  const std::vector<int> prompt = prompt_ids(40, cpu->config().vocab_size);
  const auto cpu_final = routed_ids(*cpu, prompt), gpu_final = routed_ids(*gpu, prompt);
  const CacheAwareStats cs = cpu->cache_aware_stats(), gs = gpu->cache_aware_stats();
  // The exact top-k for the same inputs (cache-aware off: residency no longer matters).
  cpu->set_cache_aware({false, 0.0f});
  gpu->set_cache_aware({false, 0.0f});
  const auto cpu_exact = routed_ids(*cpu, prompt), gpu_exact = routed_ids(*gpu, prompt);

  // Layer 0 sees the same input rows with and without substitution (none happened before it),
  // so its substituted slots are exactly those whose final id differs from the exact one.
  const size_t n = cpu_final[0].size();
  ASSERT_EQ(gpu_final[0].size(), n);
  size_t cpu_subs = 0, gpu_subs = 0, same_subs = 0, exact_same = 0;
  for (size_t i = 0; i < n; ++i) {
    const bool cs0 = cpu_final[0][i] != cpu_exact[0][i], gs0 = gpu_final[0][i] != gpu_exact[0][i];
    cpu_subs += cs0;
    gpu_subs += gs0;
    same_subs += cs0 && gs0 && cpu_final[0][i] == gpu_final[0][i];
    exact_same += cpu_exact[0][i] == gpu_exact[0][i];
    // Layer 0's host tier: e % 3 == 0.
    if (cs0) {
      EXPECT_EQ(cpu_final[0][i] % 3, 0) << "the CPU substituted a non-resident expert";
    }
    if (gs0) {
      EXPECT_EQ(gpu_final[0][i] % 3, 0) << "the GPU substituted a non-resident expert";
    }
  }
  size_t all = 0, all_same = 0;
  for (size_t l = 0; l < cpu_final.size(); ++l) {
    ASSERT_EQ(cpu_final[l].size(), gpu_final[l].size());
    all += cpu_final[l].size();
    for (size_t i = 0; i < cpu_final[l].size(); ++i) all_same += cpu_final[l][i] == gpu_final[l][i];
  }
  std::printf("[ gpu vs cpu cache-aware 0.5, fixed residency ] layer 0: %zu (CPU) and %zu (GPU) of "
              "%zu slots substituted, %zu alike; exact top-k alike %zu/%zu; final ids alike over "
              "all layers %zu/%zu; substitutions %llu (CPU) %llu (GPU)\n",
              cpu_subs, gpu_subs, n, same_subs, exact_same, n, all_same, all,
              (unsigned long long)cs.substitutions, (unsigned long long)gs.substitutions);
  ASSERT_GT(cpu_subs, 0u) << "no substitution at layer 0: the comparison would be empty";
  EXPECT_EQ(cs.routings, gs.routings);
  EXPECT_GE(double(same_subs), 0.9 * double(cpu_subs));
  EXPECT_GE(double(same_subs), 0.9 * double(gpu_subs));
  EXPECT_GE(double(all_same), 0.95 * double(all));
  EXPECT_NEAR(double(gs.substitutions), double(cs.substitutions), 0.1 * double(cs.substitutions) + 2);
}

// Each fixture (tests/fixtures: qwen3_moe, olmoe, mixtral, fused qwen3, qwen2_moe, glm4_moe, gpt_oss, deepseek) packed with bf16 and q8
// experts: GPU vs CPU logits, and GPU vs transformers within reference_test's tolerances.
class GpuFixtureTest : public ::testing::TestWithParam<std::pair<std::string, QuantType>> {};

TEST_P(GpuFixtureTest, LogitsMatchCpuAndTransformers) {
  REQUIRE_GPU();
  const auto& [name, quant] = GetParam();
  const fs::path src = kSource / "tests" / "fixtures" / name;
  if (!fs::exists(src / "reference.json")) MOESTREAM_SKIP_OR_FAIL() << "fixture " << src << " absent";
  const nlohmann::json ref = nlohmann::json::parse(read_file(src / "reference.json"));
  TempDir tmp("gpu_forward_test");
  ConvertOptions co;
  co.quant = quant;
  co.dense_dtype = "f32";  // as before bf16 became the default
  co.progress = false;
  convert_model(src, tmp.path() / "packed", co);
  ModelOptions mo;
  mo.n_threads = 2;
  auto cpu = Model::load(tmp.path() / "packed", mo);
  mo.gpu = true;
  auto gpu = Model::load(tmp.path() / "packed", mo);
  const size_t V = size_t(cpu->config().vocab_size);
  double worst_cpu = 0, worst_hf = 0;
  for (size_t p = 0; p < ref["prompts"].size(); ++p) {
    const std::vector<int> prompt = ref["prompts"][p].get<std::vector<int>>();
    std::vector<float> lc(prompt.size() * V), lg(prompt.size() * V), lh;
    cpu->reset();
    gpu->reset();
    cpu->forward(prompt, lc, true);
    gpu->forward(prompt, lg, true);
    worst_cpu = std::max(worst_cpu, rel_max_diff(lc, lg, V));
    for (const auto& row : ref["logits"][p])
      for (float v : row.get<std::vector<float>>()) lh.push_back(v);
    worst_hf = std::max(worst_hf, rel_max_diff(lh, lg, V));
  }
  const double tol = fixture_tolerance(quant);
  const double tol_hf = quant == QuantType::kBF16 ? 1e-3 : 0.10;  // reference_test's
  std::printf("[ gpu_vs_cpu %s %s ] rel max |dlogit| = %.3g (tolerance %.3g); vs transformers "
              "%.3g (tolerance %.3g)\n",
              name.c_str(), std::string(quant_name(quant)).c_str(), worst_cpu, tol, worst_hf, tol_hf);
  EXPECT_LE(worst_cpu, tol);
  EXPECT_LE(worst_hf, tol_hf);
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, GpuFixtureTest,
    ::testing::Values(std::pair{std::string("qwen3_moe"), QuantType::kBF16},
                      std::pair{std::string("qwen3_moe"), QuantType::kQ8},
                      std::pair{std::string("olmoe"), QuantType::kBF16},
                      std::pair{std::string("olmoe"), QuantType::kQ8},
                      std::pair{std::string("mixtral"), QuantType::kBF16},
                      std::pair{std::string("mixtral"), QuantType::kQ8},
                      std::pair{std::string("qwen3_moe_fused"), QuantType::kQ8},
                      std::pair{std::string("qwen2_moe"), QuantType::kBF16},
                      std::pair{std::string("qwen2_moe"), QuantType::kQ8},
                      // a dense first layer and sliding windows without sinks (sweep-b)
                      std::pair{std::string("qwen2_moe_dense_swa"), QuantType::kBF16},
                      std::pair{std::string("glm4_moe"), QuantType::kBF16},
                      std::pair{std::string("glm4_moe"), QuantType::kQ8},
                      // gpt-oss: sinks, sliding windows, biases, clamped SwiGLU, top-k softmax
                      // router; the MXFP4 fixture converts to MXFP4 whatever the quant.
                      std::pair{std::string("gpt_oss"), QuantType::kBF16},
                      std::pair{std::string("gpt_oss"), QuantType::kQ8},
                      std::pair{std::string("gpt_oss_mxfp4"), ggml_quant(GgmlType::kMXFP4)},
                      // DeepSeek-V2/V3: multi-head latent attention (runtime/gpu/gpu_mla.h)
                      std::pair{std::string("deepseek_v3"), QuantType::kBF16},
                      std::pair{std::string("deepseek_v3"), QuantType::kQ8},
                      std::pair{std::string("deepseek_v3_fp8"), QuantType::kBF16},
                      std::pair{std::string("deepseek_v2"), QuantType::kBF16},
                      std::pair{std::string("deepseek_v2"), QuantType::kQ8}),
    [](const auto& i) { return i.param.first + "_" + std::string(quant_name(i.param.second)); });

// gpt-oss's decode path on the GPU (one query row, the window sliding past old keys, sinks in the
// split merge): the 32 greedy tokens of each reference prompt, as transformers generated them.
TEST(GpuGptOss, GreedyTokensMatchTransformers) {
  REQUIRE_GPU();
  const fs::path src = kSource / "tests" / "fixtures" / "gpt_oss";
  if (!fs::exists(src / "reference.json")) MOESTREAM_SKIP_OR_FAIL() << "fixture " << src << " absent";
  const nlohmann::json ref = nlohmann::json::parse(read_file(src / "reference.json"));
  TempDir tmp("gpu_gpt_oss");
  ConvertOptions co;
  co.quant = QuantType::kBF16;
  co.dense_dtype = "f32";
  co.progress = false;
  convert_model(src, tmp.path() / "packed", co);
  ModelOptions mo;
  mo.n_threads = 2;
  mo.gpu = true;
  auto gpu = Model::load(tmp.path() / "packed", mo);
  const size_t V = size_t(gpu->config().vocab_size);
  for (size_t p = 0; p < ref["prompts"].size(); ++p) {
    const std::vector<int> prompt = ref["prompts"][p].get<std::vector<int>>();
    const std::vector<int> want = ref["greedy"][p].get<std::vector<int>>();
    std::vector<float> last(V);
    std::vector<int> got;
    gpu->reset();
    gpu->forward(prompt, last);
    for (size_t i = 0; i < want.size(); ++i) {
      const int next = int(std::max_element(last.begin(), last.end()) - last.begin());
      got.push_back(next);
      if (i + 1 < want.size()) gpu->forward(std::span<const int>(&next, 1), last);
    }
    EXPECT_EQ(got, want) << "prompt " << p;
  }
}

// A sliding layer keeps a ring of window + max_batch - 1 positions on the device, as on the CPU
// (issue 21): with max_batch 4 the fixture's window of 6 lives in 9 rows, which a 12-token prompt
// (chunks of 4), 40 decode steps and a rewind of 3 tokens re-prefilled as one chunk all wrap. The
// logits stay within the fixture tolerance of the CPU path's at every step.
TEST(GpuGptOss, SlidingRingKvMatchesTheCpuPastTheWindowAndAcrossARewind) {
  REQUIRE_GPU();
  const fs::path src = kSource / "tests" / "fixtures" / "gpt_oss";
  if (!fs::exists(src / "reference.json")) MOESTREAM_SKIP_OR_FAIL() << "fixture " << src << " absent";
  const nlohmann::json ref = nlohmann::json::parse(read_file(src / "reference.json"));
  TempDir tmp("gpu_gpt_oss_ring");
  ConvertOptions co;
  co.quant = QuantType::kBF16;
  co.dense_dtype = "f32";
  co.progress = false;
  convert_model(src, tmp.path() / "packed", co);
  ModelOptions mo;
  mo.n_threads = 2;
  mo.max_context = 256;
  mo.max_batch = 4;
  auto cpu = Model::load(tmp.path() / "packed", mo);
  mo.gpu = true;
  auto gpu = Model::load(tmp.path() / "packed", mo);
  const ModelConfig& c = gpu->config();
  ASSERT_EQ(c.sliding_window, 6);
  // The device holds 9 rows for each sliding layer, 256 for each full one.
  size_t rows = 0;
  for (int l = 0; l < c.n_layers; ++l) rows += c.window_of(l) > 0 ? 6 + 4 - 1 : 256;
  EXPECT_EQ(gpu->gpu_info()->kv_bytes, 2 * rows * size_t(c.n_kv_heads) * size_t((c.head_dim + 3) / 4 * 4) * 4);
  const size_t V = size_t(c.vocab_size);
  const double tol = fixture_tolerance(QuantType::kBF16);
  const std::vector<int> prompt = ref["prompts"][2].get<std::vector<int>>();
  std::vector<float> lc(prompt.size() * V), lg(prompt.size() * V);
  cpu->forward(prompt, lc, true);
  gpu->forward(prompt, lg, true);
  EXPECT_LE(rel_max_diff(lc, lg, V), tol) << "prefill";
  std::vector<float> last_c(lc.end() - ptrdiff_t(V), lc.end()), last_g(lg.end() - ptrdiff_t(V), lg.end());
  std::vector<int> generated;
  for (int i = 0; i < 40; ++i) {  // both fed the CPU's greedy token: one sequence for both
    const int tok = Sampler::argmax(last_c);
    generated.push_back(tok);
    cpu->forward(std::span<const int>(&tok, 1), last_c);
    gpu->forward(std::span<const int>(&tok, 1), last_g);
    ASSERT_LE(rel_max_diff(last_c, last_g, V), tol) << "decode step " << i << " at position " << cpu->n_past() - 1;
  }
  // Rewind 3 tokens (within max_batch: the ring still holds the window before them) and run
  // other tokens there as one chunk, then decode on.
  cpu->truncate(cpu->n_past() - 3);
  gpu->truncate(gpu->n_past() - 3);
  const std::vector<int> other = {7, 300, 42};
  std::vector<float> rc(3 * V), rg(3 * V);
  cpu->forward(other, rc, true);
  gpu->forward(other, rg, true);
  EXPECT_LE(rel_max_diff(rc, rg, V), tol) << "the chunk after the rewind";
  last_c.assign(rc.end() - ptrdiff_t(V), rc.end());
  for (int i = 0; i < 10; ++i) {
    const int tok = Sampler::argmax(last_c);
    cpu->forward(std::span<const int>(&tok, 1), last_c);
    gpu->forward(std::span<const int>(&tok, 1), last_g);
    ASSERT_LE(rel_max_diff(last_c, last_g, V), tol) << "decode step " << i << " after the rewind";
  }
}

// ---- DeepSeek-V2/V3 (MLA) on the GPU -------------------------------------------------------

// Multi-head latent attention on the GPU (runtime/gpu/gpu_mla.h) against the CPU pass on each
// DeepSeek fixture: V3 (q LoRA, YaRN with two different mscales, grouped sigmoid router), its FP8
// release layout (dequantised at conversion) and V2 (no q LoRA, softmax router, two shared
// experts); dense weights f32 (cuBLAS) and bf16 (stored type), bf16 experts. Prefill logits of
// every position in one chunk and in chunks of 4 (prefill after earlier positions), then 16
// greedy tokens, each decode step's logits (resident decode from the second step on) within
// kMlaTolerance of the logit scale and the tokens identical.
constexpr double kMlaTolerance = 1e-5;

class GpuMlaTest : public ::testing::TestWithParam<std::pair<std::string, std::string>> {};

TEST_P(GpuMlaTest, LogitsAndGreedyTokensMatchTheCpuPass) {
  REQUIRE_GPU();
  const auto& [name, dense] = GetParam();
  const fs::path src = kSource / "tests" / "fixtures" / name;
  if (!fs::exists(src / "reference.json")) MOESTREAM_SKIP_OR_FAIL() << "fixture " << src << " absent";
  const nlohmann::json ref = nlohmann::json::parse(read_file(src / "reference.json"));
  TempDir tmp("gpu_mla_test");
  ConvertOptions co;
  co.quant = QuantType::kBF16;
  co.dense_dtype = dense;
  co.progress = false;
  convert_model(src, tmp.path() / "packed", co);
  ModelOptions mo;
  mo.n_threads = 2;
  auto cpu = Model::load(tmp.path() / "packed", mo);
  mo.gpu = true;
  auto gpu = Model::load(tmp.path() / "packed", mo);
  mo.max_batch = 4;
  auto gpu4 = Model::load(tmp.path() / "packed", mo);
  ASSERT_TRUE(cpu->config().has_mla());
  const size_t V = size_t(cpu->config().vocab_size);
  double worst_prefill = 0, worst_chunked = 0, worst_decode = 0;
  for (size_t p = 0; p < ref["prompts"].size(); ++p) {
    const std::vector<int> prompt = ref["prompts"][p].get<std::vector<int>>();
    std::vector<float> lc(prompt.size() * V), lg(prompt.size() * V), l4(prompt.size() * V);
    cpu->reset();
    gpu->reset();
    gpu4->reset();
    cpu->forward(prompt, lc, true);
    gpu->forward(prompt, lg, true);
    gpu4->forward(prompt, l4, true);
    worst_prefill = std::max(worst_prefill, rel_max_diff(lc, lg, V));
    worst_chunked = std::max(worst_chunked, rel_max_diff(lc, l4, V));
    // Greedy decode, step by step on both passes from the same prompt.
    std::vector<float> last_c(lc.end() - std::ptrdiff_t(V), lc.end()), last_g(lg.end() - std::ptrdiff_t(V), lg.end());
    std::vector<int> tok_c, tok_g;
    for (int i = 0; i < 16; ++i) {
      const int nc = Sampler::argmax(last_c), ng = Sampler::argmax(last_g);
      tok_c.push_back(nc);
      tok_g.push_back(ng);
      if (nc != ng) break;
      cpu->forward(std::span<const int>(&nc, 1), last_c);
      gpu->forward(std::span<const int>(&ng, 1), last_g);
      worst_decode = std::max(worst_decode, rel_max_diff(last_c, last_g, V));
    }
    EXPECT_EQ(tok_g, tok_c) << name << " (" << dense << " dense) prompt " << p;
  }
  std::printf("[ gpu_vs_cpu MLA %s, %s dense ] rel max |dlogit|: prefill %.3g, prefill in chunks of 4 %.3g, "
              "decode %.3g (tolerance %.3g); resident decode steps %llu\n",
              name.c_str(), dense.c_str(), worst_prefill, worst_chunked, worst_decode, kMlaTolerance,
              (unsigned long long)gpu->gpu_stats().resident.steps);
  EXPECT_LE(worst_prefill, kMlaTolerance);
  EXPECT_LE(worst_chunked, kMlaTolerance);
  EXPECT_LE(worst_decode, kMlaTolerance);
  // bf16 experts take the grouped GEMM and the whole model fits: decode ran resident (MLA included).
  EXPECT_GT(gpu->gpu_stats().resident.steps, 0u);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GpuMlaTest,
                         ::testing::Values(std::pair{std::string("deepseek_v3"), std::string("f32")},
                                           std::pair{std::string("deepseek_v3"), std::string("bf16")},
                                           std::pair{std::string("deepseek_v3_fp8"), std::string("f32")},
                                           std::pair{std::string("deepseek_v3_fp8"), std::string("bf16")},
                                           std::pair{std::string("deepseek_v2"), std::string("f32")},
                                           std::pair{std::string("deepseek_v2"), std::string("bf16")}),
                         [](const auto& i) { return i.param.first + "_" + i.param.second; });

// The latent cache on the device is C + r floats per position and layer, not per-head keys and
// values: GpuForwardInfo::kv_bytes says so for the DeepSeek-V3 fixture.
TEST(GpuMla, KvCacheHoldsTheLatentAndTheRopeKeyOnly) {
  REQUIRE_GPU();
  const fs::path src = kSource / "tests" / "fixtures" / "deepseek_v3";
  if (!fs::exists(src / "config.json")) MOESTREAM_SKIP_OR_FAIL() << "fixture " << src << " absent";
  TempDir tmp("gpu_mla_test");
  ConvertOptions co;
  co.quant = QuantType::kQ8;
  co.progress = false;
  convert_model(src, tmp.path() / "packed", co);
  ModelOptions mo;
  mo.n_threads = 2;
  mo.max_context = 100;
  mo.gpu = true;
  auto gpu = Model::load(tmp.path() / "packed", mo);
  const ModelConfig& c = gpu->config();
  const size_t want = size_t(c.n_layers) * 100 * size_t(c.kv_lora_rank + c.qk_rope_head_dim) * sizeof(float);
  ASSERT_NE(gpu->gpu_info(), nullptr);
  EXPECT_EQ(gpu->gpu_info()->kv_bytes, want);
}

// ---- GGUF on the GPU (issue 18: GPU tier, dense weights in their stored types) --------------

namespace {

const fs::path kGguf = kSource / "tests" / "fixtures" / "gguf";

// Every fixture of tests/fixtures/gguf/manifest.json (architectures, ggml types, a mixed-type
// file, a split set); empty when the manifest is absent (the test then fails in strict mode).
std::vector<std::string> gguf_fixture_names() {
  std::vector<std::string> names;
  if (!fs::exists(kGguf / "manifest.json")) return names;
  const nlohmann::json m = nlohmann::json::parse(read_file(kGguf / "manifest.json"));
  for (const auto& f : m["fixtures"]) names.push_back(f["name"].get<std::string>());
  return names;
}

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

// The two largest logits of a row: (best id, gap to the second).
std::pair<int, float> top2(std::span<const float> row) {
  int best = 0;
  for (int i = 1; i < int(row.size()); ++i)
    if (row[size_t(i)] > row[size_t(best)]) best = i;
  float second = -INFINITY;
  for (int i = 0; i < int(row.size()); ++i)
    if (i != best) second = std::max(second, row[size_t(i)]);
  return {best, row[size_t(best)] - second};
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
  ModelOptions mo;
  mo.n_threads = 2;
  mo.max_context = 256;
  auto cpu = Model::load(file, mo);
  mo.gpu = true;
  auto gpu = Model::load(file, mo);
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

INSTANTIATE_TEST_SUITE_P(Fixtures, GpuGgufTest, ::testing::ValuesIn(gguf_fixture_names()),
                         [](const auto& i) {
                           std::string s = i.param;
                           for (char& ch : s)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return s;
                         });

TEST(GpuGguf, FixtureSetIsPresent) {
  const std::vector<std::string> names = gguf_fixture_names();
  if (names.empty()) MOESTREAM_SKIP_OR_FAIL() << "no manifest under " << kGguf;
  for (const char* arch : {"qwen3moe", "olmoe", "mixtral"})
    EXPECT_TRUE(std::any_of(names.begin(), names.end(), [&](const std::string& n) { return n.rfind(arch, 0) == 0; }))
        << "no " << arch << " fixture: the GPU would go untested on it";
}

TEST(GpuGguf, DenseMatricesStayInTheirStoredTypeOnTheDevice) {
  REQUIRE_GPU();
  // The demo's matrices are bf16 in dense.safetensors: on the device they take 2 bytes per
  // weight (norms and routers 4), about half the float32 copy of before.
  const ModelConfig c = ModelConfig::load(kDemo);
  auto pad = [](size_t b) { return (b + 255) / 256 * 256; };
  size_t stored = 0, as_f32 = 0;
  for (const DenseTensorSpec& t : dense_tensor_specs(c)) {
    const bool matrix = t.shape.size() == 2 && t.kind != DenseTensor::kRouter;
    stored += pad(t.elements() * (matrix ? 2 : 4));
    as_f32 += pad(t.elements() * 4);
  }
  auto gpu = load_demo(true);
  std::printf("[ gpu dense weights, demo ] %.2f MiB on the device (float32 copies: %.2f MiB)\n",
              double(gpu->gpu_info()->dense_bytes) / double(1 << 20), double(as_f32) / double(1 << 20));
  EXPECT_EQ(gpu->gpu_info()->dense_bytes, stored);
  EXPECT_LT(gpu->gpu_info()->dense_bytes, as_f32 * 6 / 10);
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
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  {
    auto store = open_engine_expert_store(file, c);
    auto reference = open_engine_expert_store(file, c);
    GpuExpertCache cache(c, *store, 3 * c.max_expert_bytes() + 64, s);
    std::vector<const uint8_t*> dev(2), host;
    for (int step = 0; step < 40; ++step) {
      const int layer = step % 2;
      const std::vector<int> ids{step % 4, (step / 2 + 1) % 4};
      cache.acquire(layer, ids, CacheFill::kDemand, dev);
      ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      for (size_t i = 0; i < ids.size(); ++i) {
        ASSERT_EQ(cache.expert_bytes(layer), c.expert_layout(layer).bytes);
        ASSERT_EQ(reinterpret_cast<uintptr_t>(dev[i]) % 16, 0u) << "expert payload not 16-byte aligned";
        reference->fetch(layer, std::span<const int>(&ids[i], 1), host);
        std::vector<uint8_t> got(cache.expert_bytes(layer));
        ASSERT_EQ(cudaMemcpy(got.data(), dev[i], got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
        ASSERT_EQ(std::memcmp(got.data(), host[0], got.size()), 0)
            << "layer " << layer << " expert " << ids[i] << " at step " << step;
      }
      cache.kernels_enqueued();
      cache.end_step();
    }
    EXPECT_GT(cache.telemetry().policy.evictions, 0u) << "the budget never filled: the test is too easy";
  }
  cudaStreamDestroy(s);
}

// Resident decode (docs/gpu.md): decode steps whose experts were all in VRAM last step run every
// layer without a host sync; a layer that then misses is finished through the synced path.
namespace {

// A q8 pack whose expert matrices all take the grouped GEMM (test::grouped_q8_config).
class GpuResident : public ::testing::Test {
 protected:
  void SetUp() override {
    REQUIRE_GPU();
    write_synthetic_model(dir_.path(), test::grouped_q8_config(), 7, 2);
  }
  std::unique_ptr<Model> load(size_t cache_mb, bool sync_layers) {
    ModelOptions mo;
    mo.n_threads = 2;
    mo.max_context = 256;
    mo.gpu = true;
    mo.gpu_cache_mb = cache_mb;
    mo.gpu_sync_layers = sync_layers;
    return Model::load(dir_.path(), mo);
  }
  // Greedy decode on both models, logits compared bit for bit at every step.
  void decode_both(Model& a, Model& b, int steps) {
    test::greedy_both_bitwise(a, b, prompt_ids(5, a.config().vocab_size), steps);
  }
  TempDir dir_{"gpu_resident"};
};

}  // namespace

TEST_F(GpuResident, WholeModelCacheDecodesWithoutPerLayerSyncAndTheSameBits) {
  auto resident = load(0, false);  // automatic budget: every expert fits
  auto synced = load(0, true);
  decode_both(*resident, *synced, 48);
  const GpuForwardStats r = resident->gpu_stats(), s = synced->gpu_stats();
  std::printf("whole-model cache: %llu resident steps, %llu redone; demand misses %llu\n",
              (unsigned long long)r.resident.steps, (unsigned long long)r.resident.redone,
              (unsigned long long)r.cache.policy.demand_misses);
  EXPECT_EQ(s.resident.steps, 0u);
  EXPECT_GT(r.resident.steps, 24u);  // every step after the first all-hit one
  // The cache saw the same accesses in the same order: the same hits and misses.
  EXPECT_EQ(r.cache.policy.demand_hits, s.cache.policy.demand_hits);
  EXPECT_EQ(r.cache.policy.demand_misses, s.cache.policy.demand_misses);
}

TEST_F(GpuResident, AMissInAResidentStepIsFinishedThroughTheSyncedPath) {
  // 3 MiB holds about 60% of the 48 experts: some steps find everything, and some of the steps
  // tried resident after them miss in a layer (redone from there).
  auto resident = load(3, false);
  auto synced = load(3, true);
  decode_both(*resident, *synced, 96);
  const GpuForwardStats r = resident->gpu_stats(), s = synced->gpu_stats();
  std::printf("60%% cache: %llu resident steps, %llu redone; demand hits %llu, misses %llu\n",
              (unsigned long long)r.resident.steps, (unsigned long long)r.resident.redone,
              (unsigned long long)r.cache.policy.demand_hits,
              (unsigned long long)r.cache.policy.demand_misses);
  EXPECT_GT(r.resident.redone, 0u);
  EXPECT_GT(r.resident.steps, r.resident.redone);
  EXPECT_EQ(r.cache.policy.demand_hits, s.cache.policy.demand_hits);
  EXPECT_EQ(r.cache.policy.demand_misses, s.cache.policy.demand_misses);
  EXPECT_EQ(r.cache.policy.evictions, s.cache.policy.evictions);
}

TEST(GpuForwardOptions, SyncLayersWithoutGpuIsRefused) {
  ModelOptions mo;
  mo.gpu_sync_layers = true;
  EXPECT_NE(test::error_message<ConfigError>([&] { check_gpu_options(mo); }).find("--gpu-sync-layers needs --gpu"),
            std::string::npos);
}
