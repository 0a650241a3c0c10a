// Tests of loader/store/engine_expert_store.h: the engine-backed ExpertStore returns the written bytes
// on every backend, honours layer maps (a physically permuted file reads the same), verifies
// checksums, rejects bad maps, and the --io factory picks stores by name.
#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/file_util.h"
#include "loader/format/expert_file.h"
#include "loader/format/expert_file_writer.h"
#include "loader/format/expert_map.h"
#include "loader/store/engine_expert_store.h"
#include "tests/support/store_payloads.h"
#include "runtime/engine/generate.h"
#include "runtime/engine/model.h"
#include "loader/format/model_config.h"
#include "runtime/model/sampler.h"
#include "runtime/convert/synthetic_model.h"
#include "tests/support/test_model.h"

#include <nlohmann/json.hpp>
#include "tests/support/strict_skip.h"

namespace fs = std::filesystem;
using namespace moestream;

namespace {

using test::Payloads;

// The loops below cover the io_uring store where the kernel allows it; in strict mode (CI) a
// kernel without io_uring is a failure rather than a silently shorter loop.
bool uring_or_strict_failure() {
  if (io_uring_available()) return true;
  if (test::strict_mode()) ADD_FAILURE() << "strict mode: io_uring_queue_init fails here";
  return false;
}

ModelConfig tiny_config(QuantType q) {
  return test::tiny_moe_config({.vocab = 50, .hidden = 96, .head_dim = 8, .quant = q});
}

// Each test's model directory d; write_layers() puts the layer files of tiny_config(q) there, with
// `permute` logical expert e in a shuffled physical slot and a layer_NNN.map recording it.
class EngineExpertStore : public ::testing::Test {
 protected:
  void write_layers(QuantType q, bool permute) {
    c = tiny_config(q);
    want = test::write_layer_files(d.path(), c, 11, permute);
  }

  TempDir d{"expert_store_uring_test"};
  ModelConfig c;
  Payloads want;
};

void expect_payloads(ExpertStore& store, const Payloads& want, int layer, std::vector<int> ids) {
  std::vector<const uint8_t*> out;
  store.fetch(layer, ids, out);
  ASSERT_EQ(out.size(), ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(out[i]) % kMatrixAlign, 0u);
    EXPECT_EQ(std::memcmp(out[i], want[layer][ids[i]].data(), want[layer][ids[i]].size()), 0)
        << "layer " << layer << " expert " << ids[i];
  }
}

TEST_F(EngineExpertStore, EveryBackendReturnsTheWrittenBytes) {
  write_layers(QuantType::kQ8, false);
  for (const char* io : {"uring", "pread", "mmap", "auto", "simple"}) {
    for (bool direct : {false, true}) {
      if (std::string(io) == "uring" && !uring_or_strict_failure()) continue;
      EngineExpertStoreOptions o;
      o.io.direct = direct;
      o.io.notice = [](const std::string&) {};
      auto store = open_expert_store(io, d.path(), ModelConfig::load(d.path()), o);
      SCOPED_TRACE(std::string(io) + (direct ? " O_DIRECT" : ""));
      expect_payloads(*store, want, 1, {5, 0, 3, 4});   // 3,4 and 4,5 are neighbours
      expect_payloads(*store, want, 0, {7, 7, 1});      // duplicates share one read
      expect_payloads(*store, want, 1, {0, 1, 2, 3, 4, 5, 6, 7});
      ExpertStoreStats s = store->stats();
      EXPECT_EQ(s.fetch_calls, 3u);
      EXPECT_EQ(s.experts_requested, 15u);
      if (std::string(io) != "simple") {
        EXPECT_EQ(s.experts_read, 14u);
      }
    }
  }
}

TEST_F(EngineExpertStore, PhysicallyPermutedLayerReadsTheSameThroughItsMap) {
  write_layers(QuantType::kQ4, true);
  ASSERT_FALSE(read_expert_map(expert_map_path(d.path(), 0)).is_identity());
  auto store = open_engine_expert_store(d.path(), c);
  expect_payloads(*store, want, 0, {0, 1, 2, 3, 4, 5, 6, 7});
  expect_payloads(*store, want, 1, {6, 2});
  // Without the map, the same ids read other experts' bytes: the map is really used.
  EngineExpertStoreOptions no_maps;
  no_maps.use_maps = false;
  auto raw = open_engine_expert_store(d.path(), c, no_maps);
  std::vector<const uint8_t*> out;
  std::vector<int> all{0, 1, 2, 3, 4, 5, 6, 7};
  raw->fetch(0, all, out);
  int same = 0;
  for (int e = 0; e < 8; ++e) same += std::memcmp(out[e], want[0][e].data(), want[0][e].size()) == 0;
  EXPECT_LT(same, 8);
}

TEST_F(EngineExpertStore, MapThatIsNotAPermutationIsRejectedAtOpen) {
  write_layers(QuantType::kF32, true);
  // Corrupt layer 1's map: the checksum catches it before the permutation check.
  fs::path p = expert_map_path(d.path(), 1);
  std::string bytes = read_file(p);
  bytes[16] = bytes[20];
  write_file_atomic(p, bytes);
  std::string msg = test::error_message([&] { open_engine_expert_store(d.path(), c); });
  EXPECT_NE(msg.find("layer_001.map"), std::string::npos) << msg;
}

TEST_F(EngineExpertStore, ChecksumMismatchNamesLogicalExpertAndSlot) {
  write_layers(QuantType::kQ8, true);
  ExpertMap m = read_expert_map(expert_map_path(d.path(), 0));
  fs::path f = expert_file_path(d.path(), 0);
  ExpertFileHeader h = read_expert_header(f);
  uint32_t slot = m.physical(3);
  test::overwrite_bytes(f, h.slot_offset(slot) + 5, "\x5a");
  for (const char* io : {"pread", "uring"}) {
    if (std::string(io) == "uring" && !uring_or_strict_failure()) continue;
    auto store = open_expert_store(io, d.path(), c);
    std::vector<const uint8_t*> out;
    std::vector<int> ok{0, 1};
    EXPECT_NO_THROW(store->fetch(0, ok, out));
    std::vector<int> ids{2, 3};
    std::string msg = test::error_message([&] { store->fetch(0, ids, out); });
    EXPECT_NE(msg.find("checksum mismatch for expert 3"), std::string::npos) << msg;
    EXPECT_NE(msg.find("physical slot " + std::to_string(slot)), std::string::npos) << msg;
    EXPECT_NE(msg.find("layer_000.bin"), std::string::npos) << msg;
  }
}

// A fetch whose read failed is over: asked again, next_ready hands out nothing (not the expert
// whose bytes failed, nor one of the fetch's that landed later) and does not wait for a read
// that will never land (it blocked for good); the next fetch reads as usual.
TEST_F(EngineExpertStore, AFetchThatFailedHandsOutNothingMore) {
  write_layers(QuantType::kQ8, true);
  ExpertMap m = read_expert_map(expert_map_path(d.path(), 0));
  fs::path f = expert_file_path(d.path(), 0);
  ExpertFileHeader h = read_expert_header(f);
  test::overwrite_bytes(f, h.slot_offset(m.physical(3)) + 5, "\x5a");
  auto store = open_expert_store("pread", d.path(), c);
  store->begin_fetch(0, std::vector<int>{3});
  size_t i = 0;
  const uint8_t* p = nullptr;
  const std::string msg = test::error_message([&] { test::next_payload(*store, &i, &p, true); });
  EXPECT_NE(msg.find("checksum mismatch for expert 3"), std::string::npos) << msg;
  EXPECT_FALSE(test::next_payload(*store, &i, &p, true));
  std::vector<const uint8_t*> out;
  EXPECT_NO_THROW(store->fetch(0, std::vector<int>{0, 1}, out));
}

// Greedy tokens of the packed model in `dir` with its experts read through `store`; `stats`
// (optional) receives the store's counters after the run.
std::vector<int> greedy_tokens(const fs::path& dir, std::unique_ptr<ExpertStore> store, int n_threads,
                               const std::vector<int>& prompt, int n_new, ExpertStoreStats* stats = nullptr) {
  ModelOptions mo;
  mo.n_threads = n_threads;
  ExpertStore* sp = store.get();
  auto m = Model::load(dir, mo, std::move(store));
  Sampler greedy(SamplerParams{0.0f, 0, 1.0f, 0});
  GenerateOptions go;
  go.n_new = n_new;
  std::vector<int> got;
  generate(*m, prompt, go, greedy, nullptr, &got);
  if (stats) *stats = sp->stats();
  return got;
}

// Copies a packed model with every layer file physically permuted and a .map per layer.
void permuted_copy(const fs::path& from, const fs::path& to, const ModelConfig& c) {
  fs::copy(from, to, fs::copy_options::recursive);
  std::mt19937 rng(5);
  for (int l = 0; l < c.n_layers; ++l) {
    fs::path src = expert_file_path(from, l);
    ExpertFileHeader h = read_expert_header(src);
    std::string bytes = read_file(src);
    std::vector<uint32_t> perm(c.n_experts);
    for (int e = 0; e < c.n_experts; ++e) perm[e] = e;
    std::shuffle(perm.begin(), perm.end(), rng);
    ExpertFileWriter w(expert_file_path(to, l), c.expert_quant, l, c.n_experts, c.hidden_size,
                       c.moe_intermediate_size);
    for (int e = 0; e < c.n_experts; ++e)
      w.write_expert(perm[e], reinterpret_cast<const uint8_t*>(bytes.data() + h.slot_offset(e)));
    w.finish();
    test::write_bound_map(to, l, ExpertMap::from_slots(perm));
  }
}

TEST_F(EngineExpertStore, SameTokensAsThePreadStoreWithAndWithoutARepack) {
  c = test::tiny_moe_config({.vocab = 97, .hidden = 96, .layers = 3, .head_dim = 8, .top_k = 3});
  write_synthetic_model(d.path() / "plain", c, 17, 1);
  permuted_copy(d.path() / "plain", d.path() / "repacked", c);
  const std::vector<int> prompt{3, 14, 15, 92, 65, 35};
  auto run = [&](const fs::path& dir, const char* io) {
    EngineExpertStoreOptions o;
    o.io.notice = [](const std::string&) {};
    return greedy_tokens(dir, open_expert_store(io, dir, ModelConfig::load(dir), o), 1, prompt, 8);
  };
  std::vector<int> want = run(d.path() / "plain", "simple");
  ASSERT_EQ(want.size(), 8u);
  for (const char* io : {"auto", "pread", "mmap"}) {
    EXPECT_EQ(run(d.path() / "plain", io), want) << io;
    EXPECT_EQ(run(d.path() / "repacked", io), want) << io << " on the repacked copy";
  }
}

// O_DIRECT store options with a host cache of `slots` experts of config c.
EngineExpertStoreOptions cached(const ModelConfig& c, uint64_t slots) {
  EngineExpertStoreOptions o;
  o.io.direct = true;
  o.io.notice = [](const std::string&) {};
  o.host_cache_bytes = slots * test::expert_slot_bytes(c);
  return o;
}

// As cached(), one read per expert (no coalescing), and every read at file offset `bad` fails
// with -EIO while *fail is true (always when `fail` is null).
EngineExpertStoreOptions cached_failing_at(const ModelConfig& c, uint64_t slots, uint64_t bad,
                                           std::shared_ptr<std::atomic<bool>> fail = nullptr) {
  EngineExpertStoreOptions o = cached(c, slots);
  o.io.coalesce = false;
  o.io.completion_hook = [fail, bad](const CompletionInfo& ci) -> int64_t {
    return (!fail || fail->load()) && ci.offset == bad ? -EIO : ci.result;
  };
  return o;
}

TEST_F(EngineExpertStore, HostCacheServesRepeatFetchesWithoutReads) {
  write_layers(QuantType::kQ8, true);
  for (const char* io : {"auto", "pread"}) {
    SCOPED_TRACE(io);
    auto store = open_expert_store(io, d.path(), c, cached(c, 16));
    expect_payloads(*store, want, 1, {5, 0, 3});
    expect_payloads(*store, want, 1, {3, 5, 0});
    expect_payloads(*store, want, 0, {3});
    ExpertStoreStats s = store->stats();
    EXPECT_EQ(s.experts_read, 4u);
    EXPECT_EQ(s.host_cache_hits, 3u);
    EXPECT_EQ(s.read_ops_requested, 4u);
    EXPECT_EQ(s.bytes_read, 4 * want[0][0].size());
  }
}

TEST_F(EngineExpertStore, ReopenedStoreReadsTheSameBytesOnAnotherThreadWithoutAHostCache) {
  write_layers(QuantType::kQ8, true);
  for (const char* io : {"auto", "simple"}) {
    SCOPED_TRACE(io);
    auto store = open_expert_store(io, d.path(), c, cached(c, 16));
    std::unique_ptr<ExpertStore> second = store->reopen();
    ASSERT_NE(second, nullptr);
    std::thread other([&] {  // a store is not thread-safe: each thread reads through its own
      for (int round = 0; round < 2; ++round) expect_payloads(*second, want, 1, {2, 6, 1});
    });
    for (int round = 0; round < 20; ++round) expect_payloads(*store, want, 1, {6, 3, 0});
    other.join();
    EXPECT_EQ(store->stats().experts_requested, 60u);  // the second store's reads are its own
    const ExpertStoreStats s = second->stats();
    EXPECT_EQ(s.experts_requested, 6u);
    EXPECT_EQ(s.host_cache_hits, 0u);  // no host cache of its own: the repeat was read again
    EXPECT_EQ(s.experts_read, 6u);
  }
}

TEST_F(EngineExpertStore, SmallHostCacheStillReturnsTheRightBytes) {
  // Two slots for fetches of up to eight experts: misses that find no slot go to scratch
  // buffers, cached experts are evicted and re-read, and every payload stays correct.
  write_layers(QuantType::kQ4, false);
  auto store = open_engine_expert_store(d.path(), c, cached(c, 2));
  std::mt19937 rng(3);
  for (int round = 0; round < 40; ++round) {
    std::vector<int> ids;
    for (int k = 1 + int(rng() % 6); k > 0; --k) ids.push_back(int(rng() % 3 ? rng() % 3 : rng() % 8));
    expect_payloads(*store, want, int(rng() % 2), ids);
  }
  ExpertStoreStats s = store->stats();
  EXPECT_GT(s.host_cache_hits, 0u);
  EXPECT_GT(s.experts_read, 0u);
}

TEST_F(EngineExpertStore, NextReadyHandsOutHitsAtOnceAndEveryExpertOnce) {
  write_layers(QuantType::kQ8, false);
  for (const char* io : {"auto", "pread", "mmap"}) {
    SCOPED_TRACE(io);
    EngineExpertStoreOptions o = cached(c, 8);
    auto store = open_expert_store(io, d.path(), c, o);
    expect_payloads(*store, want, 0, {2, 6});  // now in the host cache
    std::vector<int> ids{7, 2, 4, 6, 1};
    store->begin_fetch(0, ids);
    // The two cached experts are ready without waiting for the three reads.
    std::vector<int> count(ids.size(), 0);
    size_t i = 0;
    const uint8_t* p = nullptr;
    for (int hit = 0; hit < 2; ++hit) {
      ASSERT_TRUE(test::next_payload(*store, &i, &p, false));
      EXPECT_TRUE(ids[i] == 2 || ids[i] == 6) << ids[i];
      EXPECT_EQ(std::memcmp(p, want[0][ids[i]].data(), want[0][ids[i]].size()), 0);
      ++count[i];
    }
    while (test::next_payload(*store, &i, &p, true)) {
      EXPECT_EQ(std::memcmp(p, want[0][ids[i]].data(), want[0][ids[i]].size()), 0) << ids[i];
      ++count[i];
    }
    for (size_t k = 0; k < ids.size(); ++k) EXPECT_EQ(count[k], 1) << ids[k];
    EXPECT_FALSE(test::next_payload(*store, &i, &p, false));
    EXPECT_EQ(store->stats().host_cache_hits, 2u);
  }
}

TEST_F(EngineExpertStore, ResidencyReportsHostCacheAndPageCacheTiers) {
  write_layers(QuantType::kQ8, true);
  std::vector<ExpertTier> tiers(c.n_experts);
  {
    auto store = open_engine_expert_store(d.path(), c, cached(c, 8));
    expect_payloads(*store, want, 1, {4, 1});
    store->residency(1, tiers);
    for (int e = 0; e < c.n_experts; ++e) {
      bool fetched = e == 4 || e == 1;
      if (fetched) EXPECT_EQ(tiers[e], ExpertTier::kHostCache) << e;
      else EXPECT_NE(tiers[e], ExpertTier::kHostCache) << e;
    }
  }
  // Buffered: an expert just read through the page cache is resident there.
  EngineExpertStoreOptions o;
  auto store = open_engine_expert_store(d.path(), c, o);
  expect_payloads(*store, want, 0, {6});
  store->residency(0, tiers);
  EXPECT_EQ(tiers[6], ExpertTier::kPageCache);
  EXPECT_EQ(store->stats().host_cache_hits, 0u);
}

TEST_F(EngineExpertStore, FailedReadIsNotCachedAndTheNextFetchReadsAgain) {
  write_layers(QuantType::kQ8, false);
  const uint64_t bad = read_expert_header(expert_file_path(d.path(), 0)).slot_offset(3);
  auto fail = std::make_shared<std::atomic<bool>>(true);
  auto store = open_engine_expert_store(d.path(), c, cached_failing_at(c, 8, bad, fail));
  std::vector<const uint8_t*> out;
  std::vector<int> ids{2, 3, 5};
  std::string msg = test::error_message([&] { store->fetch(0, ids, out); });
  EXPECT_NE(msg.find("layer_000.bin"), std::string::npos) << msg;
  EXPECT_NE(msg.find("offset " + std::to_string(bad)), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::strerror(EIO)), std::string::npos) << msg;
  fail->store(false);
  expect_payloads(*store, want, 0, {3});
  EXPECT_EQ(store->stats().experts_read, 4u) << "expert 3 was read again, not served from the cache";
}

TEST_F(EngineExpertStore, CorruptExpertIsNeverServedFromTheHostCache) {
  write_layers(QuantType::kQ8, false);
  fs::path f = expert_file_path(d.path(), 1);
  test::overwrite_bytes(f, read_expert_header(f).slot_offset(5) + 9, "\x33");
  auto store = open_engine_expert_store(d.path(), c, cached(c, 8));
  std::vector<const uint8_t*> out;
  std::vector<int> ids{5};
  for (int attempt = 0; attempt < 2; ++attempt) {
    std::string msg = test::error_message([&] { store->fetch(1, ids, out); });
    EXPECT_NE(msg.find("checksum mismatch for expert 5"), std::string::npos) << attempt << ": " << msg;
  }
  EXPECT_EQ(store->stats().host_cache_hits, 0u);
}

TEST_F(EngineExpertStore, SameTokensWithOverlapAndASmallHostCacheOnEveryBackend) {
  c = test::tiny_moe_config(
      {.vocab = 97, .hidden = 96, .layers = 3, .head_dim = 8, .top_k = 3, .quant = QuantType::kQ4});
  write_synthetic_model(d.path(), c, 23, 1);
  const std::vector<int> prompt{5, 9, 26, 53, 58, 97 - 1};
  auto run = [&](const char* io, uint64_t cache_slots, bool direct) {
    ModelConfig cfg = ModelConfig::load(d.path());
    EngineExpertStoreOptions o = cached(cfg, cache_slots);
    o.io.direct = direct;
    return greedy_tokens(d.path(), open_expert_store(io, d.path(), cfg, o), 2, prompt, 8);
  };
  std::vector<int> want = run("simple", 0, false);
  ASSERT_EQ(want.size(), 8u);
  for (const char* io : {"auto", "pread", "mmap"})
    for (uint64_t slots : {0, 4})
      EXPECT_EQ(run(io, slots, std::string(io) != "mmap"), want) << io << " cache slots " << slots;
}

// Hands out every expert of the current fetch and checks its bytes.
void expect_handed_out(ExpertStore& store, const Payloads& want, int layer, const std::vector<int>& ids) {
  std::vector<int> count(ids.size(), 0);
  size_t i = 0;
  const uint8_t* p = nullptr;
  while (test::next_payload(store, &i, &p, true)) {
    ASSERT_LT(i, ids.size());
    EXPECT_EQ(std::memcmp(p, want[layer][ids[i]].data(), want[layer][ids[i]].size()), 0)
        << "layer " << layer << " expert " << ids[i];
    ++count[i];
  }
  for (size_t k = 0; k < ids.size(); ++k) EXPECT_EQ(count[k], 1) << ids[k];
}

TEST_F(EngineExpertStore, ReadAheadGroupIsAdoptedByTheNextFetch) {
  write_layers(QuantType::kQ8, true);
  for (const char* io : {"uring", "pread", "mmap"}) {
    if (std::string(io) == "uring" && !uring_or_strict_failure()) continue;
    for (uint64_t slots : {0, 2, 16}) {
      SCOPED_TRACE(std::string(io) + " cache slots " + std::to_string(slots));
      EngineExpertStoreOptions o = cached(c, slots);
      o.io.direct = std::string(io) != "mmap";
      auto store = open_expert_store(io, d.path(), c, o);
      const std::vector<int> a{1, 6, 3}, b{7, 0, 2, 0};
      store->begin_fetch(1, a);
      store->read_ahead(1, b);
      // The current group is still handed out whole and intact while the next one reads.
      expect_handed_out(*store, want, 1, a);
      store->begin_fetch(1, b);
      expect_handed_out(*store, want, 1, b);
      ExpertStoreStats s = store->stats();
      EXPECT_EQ(s.fetches_read_ahead, 1u);
      EXPECT_EQ(s.fetch_calls, 2u);
      EXPECT_EQ(s.experts_requested, 7u);
      EXPECT_EQ(s.experts_read, 6u) << "the duplicate 0 shares one read";
    }
  }
}

TEST_F(EngineExpertStore, ReadAheadNobodyAsksForIsDiscardedAndNeverCached) {
  write_layers(QuantType::kQ8, false);
  // The read-ahead of expert 4 fails; its data must never be served later from the host cache.
  const uint64_t bad = read_expert_header(expert_file_path(d.path(), 0)).slot_offset(4);
  auto fail = std::make_shared<std::atomic<bool>>(true);
  auto store = open_engine_expert_store(d.path(), c, cached_failing_at(c, 8, bad, fail));
  expect_payloads(*store, want, 0, {1});
  store->read_ahead(0, std::vector<int>{4, 5});
  // Other ids (or another layer) than the read-ahead: it is dropped, this fetch reads normally.
  expect_payloads(*store, want, 0, {5, 2});
  fail->store(false);
  expect_payloads(*store, want, 0, {4});
  ExpertStoreStats s = store->stats();
  EXPECT_EQ(s.fetches_read_ahead, 0u);
  // 1; read-ahead 4 (failed), 5; then 5 was a host-cache hit only if the read-ahead's read of it
  // was checked, which a discarded read-ahead never is: 5 and 2 read again; 4 read again.
  EXPECT_EQ(s.experts_read, 6u);
  EXPECT_EQ(s.host_cache_hits, 0u);
}

TEST_F(EngineExpertStore, ReadAheadOfExpertsStillLoadingInTheCurrentFetchReadsThemAgain) {
  write_layers(QuantType::kQ4, false);
  auto store = open_engine_expert_store(d.path(), c, cached(c, 8));
  const std::vector<int> a{2, 3, 4}, b{3, 4, 7};
  store->begin_fetch(0, a);
  store->read_ahead(0, b);  // 3 and 4 are in the cache but may not have landed yet
  expect_handed_out(*store, want, 0, a);
  store->begin_fetch(0, b);
  expect_handed_out(*store, want, 0, b);
  expect_payloads(*store, want, 0, {2, 3, 4, 7});  // the cache holds good bytes for all four
  EXPECT_EQ(store->stats().host_cache_hits, 4u);
}

TEST_F(EngineExpertStore, FailedReadAheadThrowsWhenItsGroupIsFetched) {
  write_layers(QuantType::kQ8, false);
  const uint64_t bad = read_expert_header(expert_file_path(d.path(), 1)).slot_offset(6);
  auto store = open_engine_expert_store(d.path(), c, cached_failing_at(c, 8, bad));
  store->begin_fetch(1, std::vector<int>{0});
  store->read_ahead(1, std::vector<int>{5, 6});
  expect_handed_out(*store, want, 1, {0});
  std::vector<int> b{5, 6};
  store->begin_fetch(1, b);
  std::string msg = test::error_message([&] {
    size_t i = 0;
    const uint8_t* p = nullptr;
    while (test::next_payload(*store, &i, &p, true)) {
    }
  });
  EXPECT_NE(msg.find("layer_001.bin"), std::string::npos) << msg;
  EXPECT_NE(msg.find("offset " + std::to_string(bad)), std::string::npos) << msg;
}

TEST_F(EngineExpertStore, PrefillOfMoreThanOneExpertGroupReadsAheadAndKeepsTheTokens) {
  // 40 experts, top-4, a 12-token prompt: a layer's prefill needs more than 16 experts, so the
  // MoE layer fetches them in groups and reads each next group ahead.
  c = test::tiny_moe_config(
      {.vocab = 97, .hidden = 96, .head_dim = 8, .experts = 40, .top_k = 4, .quant = QuantType::kQ4});
  write_synthetic_model(d.path(), c, 29, 1);
  const std::vector<int> prompt{5, 9, 26, 53, 58, 96, 1, 77, 31, 40, 12, 64};
  ExpertStoreStats last;
  auto run = [&](const char* io, uint64_t cache_slots) {
    ModelConfig cfg = ModelConfig::load(d.path());
    EngineExpertStoreOptions o = cached(cfg, cache_slots);
    o.io.direct = std::string(io) != "mmap";
    return greedy_tokens(d.path(), open_expert_store(io, d.path(), cfg, o), 2, prompt, 4, &last);
  };
  std::vector<int> want = run("simple", 0);
  ASSERT_EQ(want.size(), 4u);
  for (const char* io : {"auto", "pread", "mmap"})
    for (uint64_t slots : {0, 6, 64}) {
      EXPECT_EQ(run(io, slots), want) << io << " cache slots " << slots;
      EXPECT_GT(last.fetches_read_ahead, 0u) << io;
    }
}

// Runs infer from the build tree; returns its exit status and stdout.
int run_cli(const std::string& args, std::string* out) {
  test::CliResult r = test::run_tool("infer", args);
  *out += r.output;
  return r.status;
}

TEST(InferCli, IoFlagsGiveTheSameTokensAndStatsAccountForEveryExpert) {
  if (!test::have_tool("infer"))
    MOESTREAM_SKIP_OR_FAIL() << "infer not built in " << MOESTREAM_BIN_DIR;
  TempDir d("expert_store_uring_test");
  const ModelConfig c = test::tiny_moe_config({.vocab = 97, .hidden = 96, .head_dim = 8});
  write_synthetic_model(d.path(), c, 31, 1);
  const std::string base = "-m " + d.path().string() +
                           " --prompt-ids 4,8,15,16,23,42 -n 6 --temp 0 --print-ids --ignore-eos -t 2";
  std::string want;
  ASSERT_EQ(run_cli(base + " --io simple", &want), 0);
  ASSERT_FALSE(want.empty());
  const std::string flags[] = {
      "--io uring --io-direct --host-cache-mb 1 --io-qd 4 --io-rings 2 --coalesce-gap-kb 0",
      "--io pread --io-direct --host-cache-mb 1 --io-threads 3 --max-read-kb 16 --direct-max-read-kb 8",
      "--io mmap --no-verify-checksums",
      "--io auto --coalesce-gap-kb 128"};
  for (const std::string& f : flags) {
    SCOPED_TRACE(f);
    const fs::path json = d.path() / "stats.json";
    std::string got;
    ASSERT_EQ(run_cli(base + " " + f + " --stats-json " + json.string(), &got), 0);
    EXPECT_EQ(got, want);
    nlohmann::json j = nlohmann::json::parse(read_file(json));
    const auto& e = j.at("experts");
    // Every requested expert was a host-cache hit, read, or computed in place from the mapped
    // file (the unverified mmap run: all; a buffered checksummed run: those whose pages were
    // resident, hashed there on first use; O_DIRECT runs: none); reads were issued for the ones
    // read.
    const uint64_t read = e.at("experts_read").get<uint64_t>(), in_place = e.at("experts_in_place").get<uint64_t>();
    EXPECT_EQ(e.at("host_cache_hits").get<uint64_t>() + read + in_place, e.at("experts_requested").get<uint64_t>());
    EXPECT_EQ(e.at("read_ops_before_coalescing").get<uint64_t>(), read);
    if (f.find("--io mmap --no-verify") != std::string::npos) {
      EXPECT_EQ(in_place, e.at("experts_requested").get<uint64_t>());
    } else {
      if (f.find("--io-direct") != std::string::npos) {
        EXPECT_EQ(in_place, 0u);
        EXPECT_GT(read, 0u);
      } else {  // verified in place at first use at most once per expert
        EXPECT_LE(e.at("verified_in_place").get<uint64_t>(), in_place);
      }
      EXPECT_EQ(e.at("read_ops_after_coalescing").get<uint64_t>() > 0, read > 0);
    }
    EXPECT_GE(e.at("io_wait_not_hidden_s").get<double>(), 0.0);
    if (f.find("--host-cache-mb") != std::string::npos) {
      EXPECT_GT(e.at("host_cache_hits").get<uint64_t>(), 0u);
      EXPECT_NE(j.at("expert_io").get<std::string>().find("host cache"), std::string::npos);
    }
  }
  std::string bad;
  EXPECT_NE(run_cli(base + " --io aio", &bad), 0);
  std::string help;
  EXPECT_EQ(run_cli("--help", &help), 0);
  for (const char* flag : {"--io-direct", "--host-cache-mb", "--io-qd", "--io-rings", "--io-threads",
                           "--coalesce-gap-kb", "--max-read-kb", "--direct-max-read-kb",
                           "--no-verify-checksums"})
    EXPECT_NE(help.find(flag), std::string::npos) << flag;
}

TEST_F(EngineExpertStore, UnknownIoNameIsAConfigError) {
  write_layers(QuantType::kF32, false);
  std::string msg = test::error_message([&] { open_expert_store("aio", d.path(), c); });
  EXPECT_NE(msg.find("'aio'"), std::string::npos) << msg;
}

}  // namespace
