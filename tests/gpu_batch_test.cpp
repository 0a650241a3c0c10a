// Batches of sequences on the GPU (Model::forward_batch with --gpu, runtime/gpu/gpu_forward_batch.cpp)
// and the GPU prefill's expert reads: each sequence's logits in a batch equal those of the same
// chunks run alone on the GPU within a stated tolerance, with joins, leaves and slot reuse; a
// step acquires the union of its sequences' experts once; a prefill chunk reads each of its
// experts once; cache-aware routing's union rule routes a batch as the CPU pass does. Skip without
// a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/file_util.h"
#include "kernels/cuda/gpu_ops.h"
#include "loader/store/store_options.h"
#include "runtime/convert/synthetic_model.h"
#include "runtime/engine/model.h"
#include "runtime/engine/routing_replay.h"
#include "tests/support/batch_harness.h"
#include "tests/support/require_gpu.h"
#include "tests/support/test_model.h"

namespace fs = std::filesystem;
using namespace moestream;

namespace {

const fs::path kDemo = fs::path(MOESTREAM_SOURCE_DIR) / "models" / "demo";
constexpr int kChunk = 8;  // prefill chunk: the solo model's max_batch, the batch driver's chunk

// The batch is built to give each sequence its bits alone: cuBLAS's f32 products run per sequence
// (cuBLAS picks its algorithm by row count), our kernels compute each row alone, attention runs
// per sequence. The tests still assert a tolerance, not bits, and print the bitwise share: the
// expert GEMM's token tile follows the largest group of the step's union (not the sequence's), and
// cuBLAS may pick another kernel for a sequence's rows at an offset; any such ~1e-6 difference is
// turned by q8 experts' int8 input rounding into a few flipped quant steps (as
// GpuForward.ChunkedPrefillMatchesOneChunk measures for chunk lengths: 0.0068).
double tolerance(QuantType experts) { return experts == QuantType::kBF16 ? 1e-3 : 0.02; }

// max over rows of max |a - b| / max |a| (the row's logit scale).
double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double scale = 0, err = 0;
  for (size_t v = 0; v < a.size(); ++v) {
    scale = std::max(scale, double(std::fabs(a[v])));
    err = std::max(err, double(std::fabs(a[v] - b[v])));
  }
  return scale > 0 ? err / scale : err;
}

ModelConfig shape(const std::string& kind) {
  ModelConfig c = test::tiny_moe_config({.vocab = 97, .hidden = 64, .layers = 3, .head_dim = 16,
                                         .intermediate = 64, .experts = 8, .top_k = 3,
                                         .max_positions = 256, .quant = QuantType::kQ8});
  if (kind == "bf16+shared") {  // Qwen2-MoE: gated shared expert, QKV bias, bf16 experts
    c.dense_dtype = "bf16";
    c.expert_quant = QuantType::kBF16;
    test::as_qwen2_moe(c, 96);
  }
  if (kind == "glm") test::as_glm4_moe(c, {.shared = 64, .dense_intermediate = 96, .rotary_dim = 8});
  if (kind == "minimax") test::as_minimax_m2(c, 8);  // full-width QK-norm, partial rotary, one-group sigmoid
  if (kind == "odd-head") c.head_dim = 14;  // zero-padded heads on the device
  return c;
}

// io_direct: no page-cache tier, so cache-aware routing sees the GPU cache alone (a buffered
// store counts experts in the page cache as resident, and the files there are).
std::unique_ptr<Model> load(const fs::path& dir, int max_batch, size_t cache_mb = 0, int max_context = 256,
                            bool io_direct = false) {
  ModelOptions o;
  o.n_threads = 2;
  o.max_batch = max_batch;
  o.max_context = max_context;
  o.max_sequences = 4;
  o.gpu = true;
  o.gpu_cache_mb = cache_mb;
  StoreConfig sc;
  sc.io = "pread";  // every miss is a counted fetch (no host cache)
  sc.io_direct = io_direct;
  return Model::load(dir, o, open_store_for(dir, ModelConfig::load(dir), sc));
}

using test::BatchRequest;
using test::prefill_each;
using test::random_tokens;
using test::run_alone;
using test::StepUnion;

// Four requests of different prompt lengths (two longer than a chunk) join at different steps;
// the fourth joins after the first left, in its freed slot. Every logit of every step matches
// the request run alone on the GPU. Prints the worst relative difference and the share of logit
// rows that are bitwise those alone.
void batch_against_alone(const fs::path& dir, size_t cache_mb, uint32_t seed, const std::string& name) {
  auto solo = load(dir, kChunk, cache_mb);
  auto batched = load(dir, 4 * kChunk, cache_mb);
  const ModelConfig& c = solo->config();
  std::vector<BatchRequest> rs = test::four_requests(seed, c.vocab_size, /*fixed_decode=*/true);
  std::vector<BatchRequest> alone = rs;
  for (BatchRequest& r : alone) run_alone(*solo, r);
  test::run_batched(*batched, rs, kChunk);
  double worst = 0;
  size_t rows = 0, bitwise = 0;
  for (size_t i = 0; i < rs.size(); ++i) {
    EXPECT_EQ(rs[i].logits.size(), alone[i].logits.size()) << "request " << i;
    for (size_t s = 0; s < std::min(rs[i].logits.size(), alone[i].logits.size()); ++s) {
      const double d = rel_diff(alone[i].logits[s], rs[i].logits[s]);
      worst = std::max(worst, d);
      ++rows;
      bitwise += alone[i].logits[s] == rs[i].logits[s];
      EXPECT_LE(d, tolerance(c.expert_layout(0).types.gate)) << "request " << i << " step " << s;
    }
  }
  EXPECT_EQ(batched->n_past(), 0);  // forward()'s own sequence is untouched by batches
  std::printf("[ gpu batch %s ] rel max |dlogit| batch vs alone = %.3g; %zu of %zu logit rows bitwise\n",
              name.c_str(), worst, bitwise, rows);
}

class GpuBatch : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuBatch, EachSequenceMatchesItsRunAloneOnTheGpu) {
  REQUIRE_GPU();
  TempDir d("gpu_batch");
  const ModelConfig c = shape(GetParam());
  write_synthetic_model(d.path(), c, 51, 2);
  batch_against_alone(d.path(), 0, 7, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuBatch, ::testing::Values("q8", "bf16+shared", "glm", "odd-head", "minimax"),
                         [](const auto& info) {
                           std::string s = info.param;
                           std::replace(s.begin(), s.end(), '+', '_');
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

// The demo model (q8 experts, 32 experts top-4) with the whole model in the GPU cache and with a
// 1 MiB cache (evictions, scratch, more than 16 experts per layer in a step: the resident ones
// are acquired first): the same logits as alone, within the tolerance.
TEST(GpuBatchDemo, RequestsMatchTheirRunsAloneWhateverTheCacheHolds) {
  REQUIRE_GPU();
  for (size_t mb : {size_t(0), size_t(1)})
    batch_against_alone(kDemo, mb, 13, mb ? "demo, 1 MiB cache" : "demo, whole-model cache");
}

// A decode step of three sequences acquires the union of their experts once per layer: the GPU
// cache's demand lookups (hits + misses) are the union's size (seen through the routing callback,
// one event per sequence tagged with its slot), and each miss is fetched once from the store.
TEST(GpuBatchCache, AStepAcquiresTheUnionOfItsSequencesExpertsOnce) {
  REQUIRE_GPU();
  TempDir d("gpu_batch_union");
  ModelConfig c = shape("q8");
  c.n_experts = 6;  // three sequences x top-3 of 6 experts: overlaps are certain
  write_synthetic_model(d.path(), c, 53, 2);
  auto m = load(d.path(), 4 * kChunk);
  std::mt19937 rng(11);
  const size_t V = size_t(c.vocab_size);
  std::vector<std::vector<int>> prompts;
  for (int i = 0; i < 3; ++i) prompts.push_back(random_tokens(rng, 4 + i, c.vocab_size));
  const std::vector<int> seqs = prefill_each(*m, prompts);
  StepUnion routed;
  routed.record(*m);
  const int next[3] = {5, 17, 60};
  std::vector<std::vector<float>> out(3, std::vector<float>(V));
  std::vector<SequenceInput> step;
  for (int i = 0; i < 3; ++i) step.push_back({seqs[size_t(i)], std::span<const int>(&next[i], 1), out[size_t(i)], false});
  m->reset_gpu_stats();
  const ExpertStoreStats before = m->expert_stats();
  m->forward_batch(step);
  const uint64_t fetched = m->expert_stats().experts_fetched() - before.experts_fetched();
  const CacheStats p = m->gpu_stats().cache.policy;
  const size_t union_experts = routed.experts();
  EXPECT_EQ(routed.sequences, std::set<int>(seqs.begin(), seqs.end()));
  EXPECT_EQ(p.demand_hits + p.demand_misses, union_experts);
  EXPECT_EQ(fetched, p.demand_misses);
  EXPECT_EQ(p.prefill_hits + p.prefill_fills + p.prefill_no_room, 0u);  // a decode step is a demand
  EXPECT_LT(union_experts, size_t(3 * c.n_experts_per_tok * c.n_moe_layers()));  // overlaps happened
  std::printf("[ gpu batch union ] %zu experts acquired for 3 x %d x %d choices: %llu hits, %llu misses\n",
              union_experts, c.n_experts_per_tok, c.n_moe_layers(),
              static_cast<unsigned long long>(p.demand_hits), static_cast<unsigned long long>(p.demand_misses));
}

// Each sequence of a GPU batch replays its own request of a routing log (Model::set_sequence_routing,
// through the routing step the CPU pass runs too): the batch's routing events carry the replayed
// experts at each sequence's positions, every logit matches the request run alone on the GPU with
// the same replay, and the replay changes the output (the router would choose otherwise).
TEST(GpuBatchReplay, ReplayedSequencesMatchTheirRunsAlone) {
  REQUIRE_GPU();
  TempDir d("gpu_batch_replay");
  const ModelConfig c = shape("q8");
  write_synthetic_model(d.path(), c, 51, 2);
  const RoutingReplay replay(test::random_log(c, 5, 40, 3), c, "random.log");
  auto solo = load(d.path(), kChunk);
  auto batched = load(d.path(), 4 * kChunk);
  std::vector<BatchRequest> rs = test::four_requests(17, c.vocab_size, /*fixed_decode=*/true);
  const test::ReplayedRuns runs = test::run_replayed(*solo, *batched, rs, replay, {4, 0, 2, 1}, kChunk);
  const std::vector<BatchRequest>& alone = runs.alone;
  EXPECT_NE(alone[0].logits, runs.first_on_router.logits) << "the replay changed nothing: the test could not fail";
  EXPECT_GT(runs.events, 0);
  EXPECT_EQ(runs.mismatched, 0);
  double worst = 0;
  for (size_t i = 0; i < rs.size(); ++i) {
    ASSERT_EQ(rs[i].logits.size(), alone[i].logits.size()) << "request " << i;
    for (size_t s = 0; s < rs[i].logits.size(); ++s) {
      const double diff = rel_diff(alone[i].logits[s], rs[i].logits[s]);
      worst = std::max(worst, diff);
      EXPECT_LE(diff, tolerance(c.expert_layout(0).types.gate)) << "request " << i << " step " << s;
    }
  }
  std::printf("[ gpu batch replay ] rel max |dlogit| batch vs alone = %.3g\n", worst);
}

// Issue 22 item 3 on the GPU: cache-aware routing in a batch step runs the CPU pass's
// CacheAwareRouter with forward_batch's rows as the sequences, so the union rule holds there too.
// The demo on the pread store (no host tier) with a 4 MiB GPU cache (of its 17.9 MB of experts):
// only the GPU cache makes an expert resident. Final ids per (slot, layer), in step order.
using BatchIds = std::map<std::pair<int, int>, std::vector<int>>;

BatchIds batch_routing(Model& m, std::vector<BatchRequest> rs, const CacheAwareOptions& ca) {
  m.set_cache_aware(ca);
  m.reset_cache_aware_stats();
  BatchIds ids;
  m.set_routing_callback([&](const RoutingEvent& e) {
    auto& v = ids[{e.sequence, e.layer}];
    v.insert(v.end(), e.ids, e.ids + size_t(e.n_tokens) * size_t(e.top_k));
  });
  test::run_batched(m, rs, kChunk);
  m.set_routing_callback({});
  return ids;
}

std::vector<BatchRequest> three_requests(const ModelConfig& c) {
  std::mt19937 rng(29);
  std::vector<BatchRequest> rs;
  for (int n : {5, 7, 3}) rs.push_back({random_tokens(rng, n, c.vocab_size), 0, 0, random_tokens(rng, 12, c.vocab_size), {}});
  return rs;
}

TEST(GpuBatchCacheAware, UnionAtToleranceZeroRoutesAsThePlainBatchAndWideSubstitutesMore) {
  REQUIRE_GPU();
  auto plain = load(kDemo, 4 * kChunk, 4, 256, true);
  auto uni = load(kDemo, 4 * kChunk, 4, 256, true);
  const std::vector<BatchRequest> rs = three_requests(plain->config());
  CacheAwareOptions zero{true, 0.0f};
  const BatchIds a = batch_routing(*plain, rs, zero);
  zero.batch_union = true;
  EXPECT_EQ(batch_routing(*uni, rs, zero), a);
  EXPECT_EQ(uni->cache_aware_stats().substitutions, 0u);
  EXPECT_GT(uni->cache_aware_stats().routings, 0u);
  // A wide tolerance on fresh models: the union's candidates include every plain one (and the
  // earlier sequences' choices), so it substitutes more and reads less.
  auto plain_w = load(kDemo, 4 * kChunk, 4, 256, true);
  auto uni_w = load(kDemo, 4 * kChunk, 4, 256, true);
  CacheAwareOptions wide{true, 0.5f};
  batch_routing(*plain_w, rs, wide);
  wide.batch_union = true;
  batch_routing(*uni_w, rs, wide);
  const CacheAwareStats &p = plain_w->cache_aware_stats(), &u = uni_w->cache_aware_stats();
  std::printf("[ gpu batch cache-aware 0.5 ] substitutions plain %llu, union %llu; misses after plain %llu, union %llu\n",
              (unsigned long long)p.substitutions, (unsigned long long)u.substitutions,
              (unsigned long long)p.misses_after, (unsigned long long)u.misses_after);
  EXPECT_GT(u.substitutions, p.substitutions);
  EXPECT_LT(u.misses_after, p.misses_after);
}

TEST(GpuBatchCacheAware, ASequenceAloneInABatchRoutesAsOneSequence) {
  REQUIRE_GPU();
  // The same request through forward() and alone in forward_batch with the union rule, each on a
  // fresh model and cache: the same substitutions up to the batch's float noise (the expert GEMM
  // tile; see tolerance() above), so near agreement of the final ids, not bits.
  auto solo = load(kDemo, kChunk, 4, 256, true);
  auto batched = load(kDemo, 4 * kChunk, 4, 256, true);
  BatchRequest r = three_requests(solo->config())[1];
  solo->set_cache_aware({true, 0.5f});
  std::map<int, std::vector<int>> want;
  solo->set_routing_callback([&](const RoutingEvent& e) {
    want[e.layer].insert(want[e.layer].end(), e.ids, e.ids + size_t(e.n_tokens) * size_t(e.top_k));
  });
  run_alone(*solo, r);
  CacheAwareOptions uni{true, 0.5f};
  uni.batch_union = true;
  const BatchIds got = batch_routing(*batched, {r}, uni);
  size_t same = 0, total = 0;
  for (const auto& [key, ids] : got) {
    const std::vector<int>& w = want[key.second];
    ASSERT_EQ(ids.size(), w.size()) << "layer " << key.second;
    for (size_t i = 0; i < ids.size(); ++i) same += ids[i] == w[i];
    total += ids.size();
  }
  std::printf("[ gpu batch alone, cache-aware 0.5 union ] %zu of %zu final choices as forward()'s\n", same, total);
  EXPECT_GT(solo->cache_aware_stats().substitutions, 0u);
  EXPECT_GE(double(same), 0.95 * double(total));
}

// Issue 19 item 3: a prefill chunk reads each expert it routes to once and runs it over all of
// its tokens. A cold cache that holds the whole model: one 40-token chunk's prefill lookups are
// the distinct experts per layer, every one fetched (read, or copied from its resident pages),
// none twice.
TEST(GpuPrefill, AChunkReadsEachOfItsExpertsOnce) {
  REQUIRE_GPU();
  auto m = load(kDemo, 64);
  const ModelConfig& c = m->config();
  std::vector<std::set<int>> distinct(size_t(c.n_moe_layers()));
  size_t choices = 0;
  m->set_routing_callback([&](const RoutingEvent& ev) {
    EXPECT_TRUE(ev.prefill);
    for (int i = 0; i < ev.n_tokens * ev.top_k; ++i) distinct[size_t(ev.layer)].insert(ev.ids[i]);
    choices += size_t(ev.n_tokens * ev.top_k);
  });
  std::mt19937 rng(17);
  const std::vector<int> prompt = random_tokens(rng, 40, c.vocab_size);
  std::vector<float> l(size_t(c.vocab_size));
  m->reset_gpu_stats();
  const ExpertStoreStats before = m->expert_stats();
  m->forward(prompt, l);
  const uint64_t fetched = m->expert_stats().experts_fetched() - before.experts_fetched();
  const CacheStats p = m->gpu_stats().cache.policy;
  size_t n_distinct = 0;
  for (const auto& s : distinct) n_distinct += s.size();
  EXPECT_EQ(p.prefill_hits + p.prefill_fills + p.prefill_no_room, n_distinct);
  EXPECT_EQ(p.prefill_hits, 0u);  // cold
  EXPECT_EQ(fetched, n_distinct);
  EXPECT_LT(n_distinct, choices);  // 40 tokens x top-4 share experts: fewer reads than choices
  std::printf("[ gpu prefill ] 40 tokens: %zu expert choices, %zu distinct experts fetched once each\n",
              choices, n_distinct);
}

}  // namespace
