// Tests of cluster/: co-activation counts, the cost model against io_plan's grouping, orderings
// on synthetic routing with a known best order, and repack (same tokens, failure injection).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <random>
#include <thread>

#include "cluster/cluster_inputs.h"
#include "cluster/coactivation.h"
#include "cluster/io_cost_model.h"
#include "cluster/ordering.h"
#include "cluster/repack.h"
#include "common/error.h"
#include "common/file_util.h"
#include "loader/format/expert_file.h"
#include "loader/format/expert_map.h"
#include "loader/io/io_plan.h"
#include "loader/store/engine_expert_store.h"
#include "runtime/engine/generate.h"
#include "runtime/engine/model.h"
#include "runtime/convert/synthetic_model.h"
#include "tests/support/test_model.h"

namespace moestream::cluster {
namespace {
namespace fs = std::filesystem;

SlotGeometry geometry(uint64_t bytes = 69000, uint64_t stride = 69632) {
  SlotGeometry g;
  g.data_offset = 4096;
  g.expert_bytes = bytes;
  g.expert_stride = stride;
  return g;
}

RoutingLog log_of(uint32_t n_experts, uint32_t k, const std::vector<std::vector<uint16_t>>& tokens) {
  RoutingLog log;
  log.header = RoutingLogHeader{1, 1, n_experts, k, 4};
  uint32_t pos = 0;
  for (const auto& t : tokens) {
    RoutingRecord r;
    r.position = pos++;
    r.ids = t;
    r.weights.assign(k, 1.0f / float(k));
    log.records.push_back(r);
  }
  return log;
}

// `n_tokens` tokens, each routed to k distinct experts of n_experts drawn from rng (the first k of
// a shuffle).
std::vector<std::vector<uint16_t>> random_routes(std::mt19937& rng, int n_tokens, uint16_t n_experts, size_t k) {
  std::vector<std::vector<uint16_t>> ts;
  for (int t = 0; t < n_tokens; ++t) {
    std::vector<uint16_t> all(n_experts);
    std::iota(all.begin(), all.end(), uint16_t(0));
    std::shuffle(all.begin(), all.end(), rng);
    ts.emplace_back(all.begin(), all.begin() + long(k));
  }
  return ts;
}

TEST(Coactivation, CountsSameTokenPairsAndWeightedNeighbourPairs) {
  std::vector<RoutingLog> logs{log_of(4, 2, {{0, 1}, {2, 3}, {0, 1}})};
  auto s = coactivation(logs);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].uses, (std::vector<uint64_t>{2, 2, 1, 1}));
  EXPECT_EQ(s[0].at(0, 1), 2.0);
  EXPECT_EQ(s[0].at(1, 0), 2.0);
  EXPECT_EQ(s[0].at(0, 2), 0.0);
  auto n = coactivation(logs, CoactivationOptions{0.5});
  EXPECT_EQ(n[0].at(0, 2), 1.0);  // (0,1)->(2,3) and (2,3)->(0,1): 0.5 each
  EXPECT_EQ(n[0].at(1, 3), 1.0);
  EXPECT_EQ(n[0].at(0, 1), 2.0);
}

TEST(Coactivation, LogsOfDifferentModelsAreRefused) {
  auto a = log_of(4, 2, {{0, 1}});
  auto b = log_of(4, 2, {{0, 1}});
  b.header.model_hash = 99;
  EXPECT_THROW(coactivation({a, b}), ConfigError);
}

TEST(IoCostModel, AdjacentSlotsAreOneReadAndAGapSplitsThem) {
  const SlotGeometry g = geometry();
  std::vector<uint32_t> adj{5, 3, 4};
  EXPECT_EQ(token_read_cost(adj, g).ops, 1u);
  EXPECT_EQ(token_read_cost(adj, g).bytes, 2 * 69632u + 69000u);
  std::vector<uint32_t> apart{1, 3, 9, 10};
  EXPECT_EQ(token_read_cost(apart, g).ops, 3u);
  SlotGeometry small = g;
  small.reads.max_read_bytes = 2 * 69632;  // two experts fit, three do not
  EXPECT_EQ(token_read_cost(adj, small).ops, 2u);
}

// What the engine's planner issues for one token: io::plan_reads on the experts' requests in a
// file opened as the engine would (O_DIRECT or not), with the engine's own plan options.
ReadCost engine_plan(std::span<const uint32_t> slots, const SlotGeometry& g, const IoEngineOptions& eo,
                     uint32_t n_slots = 64) {
  io::FileEntry f;
  f.path = "layer";
  f.direct = eo.direct;
  f.size = g.data_offset + n_slots * g.expert_stride;
  std::vector<io::FileEntry> files{f};
  alignas(4096) static uint8_t dest[4096];  // never written: planning only places reads
  std::vector<ReadRequest> reqs;
  for (uint32_t s : slots) reqs.push_back({0, g.data_offset + uint64_t(s) * g.expert_stride, g.expert_bytes, dest});
  const io::IoPlan plan = io::plan_reads(reqs, files, io::plan_options(eo, io::sink_bytes_for(eo.coalesce_gap_bytes)));
  ReadCost c;
  c.ops = plan.extents.size();
  for (const io::Extent& x : plan.extents) c.bytes += x.length;
  return c;
}

IoEngineOptions engine_options(uint64_t gap, uint64_t max_read, uint64_t direct_max_read, bool direct) {
  IoEngineOptions eo;
  eo.coalesce = gap > 0;
  eo.coalesce_gap_bytes = gap;
  eo.max_read_bytes = max_read;
  eo.direct_max_read_bytes = direct_max_read;
  eo.direct = direct;
  return eo;
}

// The model must count what the engine would issue: compare with io::plan_reads itself, buffered
// and O_DIRECT (alignment padding, the direct read cap), coalescing on and off.
TEST(IoCostModel, MatchesTheEnginePlannerOnRandomSets) {
  std::mt19937 rng(5);
  struct Case {
    uint64_t bytes, stride, gap, max_read, direct_max_read;
  };
  for (const Case& k : {Case{69000, 69632, 64 << 10, 1 << 20, 4 << 20}, Case{3000, 4096, 8192, 16384, 8192},
                        Case{3000, 5000, 6000, 16384, 12288}, Case{1500000, 1503232, 64 << 10, 1 << 20, 4 << 20},
                        Case{1500000, 1503232, 64 << 10, 4 << 20, 1 << 20}, Case{9000, 12288, 0, 1 << 20, 1 << 20}}) {
    for (int run = 0; run < 6; ++run) {
      const bool direct = run % 2;
      IoEngineOptions eo = engine_options(k.gap, k.max_read, k.direct_max_read, direct);
      // No profile (the fixed gap), a latency-heavy and a bandwidth-heavy device's merge rule.
      if (run >= 2) eo.profile = run < 4 ? IoProfile{500, 2000, 32, 2.0, 2.0} : IoProfile{20, 200000, 32, 0.05, 0.02};
      const SlotGeometry g = read_by(geometry(k.bytes, k.stride), eo);
      for (int trial = 0; trial < 300; ++trial) {
        std::vector<uint32_t> all(64);
        std::iota(all.begin(), all.end(), 0u);
        std::shuffle(all.begin(), all.end(), rng);
        const size_t n = 1 + rng() % 8;
        std::vector<uint32_t> slots(all.begin(), all.begin() + long(n));
        const ReadCost want = engine_plan(slots, g, eo), got = token_read_cost(slots, g);
        ASSERT_EQ(got.ops, want.ops) << "stride " << k.stride << " direct " << direct << " trial " << trial;
        ASSERT_EQ(got.bytes, want.bytes) << "stride " << k.stride << " direct " << direct << " trial " << trial;
      }
    }
  }
}

// The O_DIRECT read cap (infer --direct-max-read-kb) is the engine's, not max_read_bytes: with
// the defaults (1 MiB buffered, 4 MiB direct) three adjacent 512 KiB experts are two buffered
// reads but one direct read; with a 1 MiB direct cap under a 4 MiB buffered one the direct cap
// splits the read (and a lone 1.5 MB expert) where buffered reads stay whole.
TEST(IoCostModel, TheDirectReadCapSplitsReadsAsTheEngineDoes) {
  const std::vector<uint32_t> three{4, 5, 6}, one{9};
  struct Case {
    uint64_t bytes, max_read, direct_max_read;
    bool direct;
    const std::vector<uint32_t>* slots;
    uint64_t ops;
  };
  for (const Case& k : {Case{512 << 10, 1 << 20, 4 << 20, false, &three, 2},
                        Case{512 << 10, 1 << 20, 4 << 20, true, &three, 1},
                        Case{512 << 10, 4 << 20, 1 << 20, false, &three, 1},
                        Case{512 << 10, 4 << 20, 1 << 20, true, &three, 2},
                        Case{1500000, 4 << 20, 1 << 20, false, &one, 1},
                        Case{1500000, 4 << 20, 1 << 20, true, &one, 2}}) {
    const IoEngineOptions eo = engine_options(64 << 10, k.max_read, k.direct_max_read, k.direct);
    const SlotGeometry g = read_by(geometry(k.bytes, (k.bytes + 4095) / 4096 * 4096), eo);
    const ReadCost got = token_read_cost(*k.slots, g), want = engine_plan(*k.slots, g, eo);
    EXPECT_EQ(got.ops, k.ops) << k.bytes << " direct " << k.direct << " cap " << k.direct_max_read;
    EXPECT_EQ(got.ops, want.ops);
    EXPECT_EQ(got.bytes, want.bytes);
    // Every byte of the experts is read once, plus a lone expert's O_DIRECT tail padding.
    EXPECT_EQ(got.bytes, k.slots->size() * k.bytes + (k.direct && k.bytes % 4096 ? 4096 - k.bytes % 4096 : 0));
  }
}

// A routing log's top-k is bounded only by n_experts: 100 of 256 (legal for a 256-expert model)
// used to overrun 64-entry stack buffers before the assertion meant to stop it. Every cost path
// (one token, a layer, the local search) must handle it and agree with the engine's planner.
TEST(IoCostModel, TopKAbove64IsPricedLikeAnyOther) {
  std::mt19937 rng(17);
  const std::vector<std::vector<uint16_t>> ts = random_routes(rng, 40, 256, 100);
  const RoutingLog log = log_of(256, 100, ts);
  const LayerStats s = coactivation({log})[0];
  ASSERT_EQ(s.token_sets.size(), 40u);
  ASSERT_EQ(s.token_sets[0].size(), 100u);
  const IoEngineOptions eo = engine_options(16 << 10, 1 << 20, 1 << 20, false);
  SlotGeometry g = geometry();
  g = read_by(g, eo);
  const IoProfile p;
  std::vector<uint32_t> identity(256);
  std::iota(identity.begin(), identity.end(), 0u);
  uint64_t ops = 0;
  for (const auto& t : s.token_sets) {
    const std::vector<uint32_t> slots(t.begin(), t.end());
    const ReadCost c = token_read_cost(slots, g);
    EXPECT_EQ(c.ops, engine_plan(slots, g, eo, 256).ops);
    EXPECT_EQ(c.bytes, engine_plan(slots, g, eo, 256).bytes);
    ops += c.ops;
  }
  EXPECT_DOUBLE_EQ(layer_cost(s.token_sets, identity, g, p).ops_per_token, double(ops) / 40);
  SearchStats st;
  LocalSearchOptions budget;
  budget.max_moves = 3000;
  const Order o = order_layer(OrderMethod::kSeriation, s, g, p, budget, &st);
  EXPECT_GT(st.moves, 0u);
  std::vector<uint32_t> sorted = o;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, identity);  // still a permutation
  EXPECT_LE(layer_cost(s.token_sets, slots_of(o), g, p).modelled_us_per_token,
            layer_cost(s.token_sets, identity, g, p).modelled_us_per_token);
}

TEST(IoCostModel, TakesTheProfileFileAndItsOverrides) {
  TempDir d;
  const auto p = d.path() / "profile.json";
  save_io_profile(p, IoProfile{70.0, 30000, 64, 2.5, 1.0});
  IoProfile prof = io_profile_of(p, 0, 0);
  EXPECT_DOUBLE_EQ(prof.op_latency_us, 70.0);
  EXPECT_DOUBLE_EQ(prof.iops_limit, 30000);
  EXPECT_DOUBLE_EQ(prof.bandwidth_gbps, 2.5);
  prof = io_profile_of(p, 90, 0);
  EXPECT_DOUBLE_EQ(prof.op_latency_us, 90.0);
  EXPECT_DOUBLE_EQ(prof.bandwidth_gbps, 2.5);
  write_file_atomic(p, R"({"sweep": []})");  // a bench_io results file without a profile
  EXPECT_THROW(io_profile_of(p, 0, 0), FormatError);
  write_file_atomic(p, "{");
  EXPECT_THROW(io_profile_of(p, 0, 0), FormatError);
}

// Synthetic routing with a hidden best order: tokens pick k consecutive experts of a secret
// permutation, so the secret order (or its reverse) reads each token in one op.
LayerStats hidden_order_stats(uint32_t n, uint32_t k, int tokens, std::vector<uint32_t>* secret) {
  std::mt19937 rng(42);
  secret->resize(n);
  std::iota(secret->begin(), secret->end(), 0u);
  std::shuffle(secret->begin(), secret->end(), rng);
  std::vector<std::vector<uint16_t>> ts;
  for (int t = 0; t < tokens; ++t) {
    uint32_t start = rng() % (n - k + 1);
    std::vector<uint16_t> set;
    for (uint32_t j = 0; j < k; ++j) set.push_back(uint16_t((*secret)[start + j]));
    std::shuffle(set.begin(), set.end(), rng);
    ts.push_back(set);
  }
  return coactivation({log_of(n, k, ts)})[0];
}

LocalSearchOptions moves(uint64_t n) {
  LocalSearchOptions o;
  o.max_moves = n;
  return o;
}

TEST(Ordering, SeriationFindsTheHiddenBestOrder) {
  std::vector<uint32_t> secret;
  LayerStats s = hidden_order_stats(24, 4, 3000, &secret);
  const SlotGeometry g = geometry();
  const IoProfile p;
  auto ops = [&](OrderMethod m) {
    return layer_cost(s.token_sets, slots_of(order_layer(m, s, g, p)), g, p).ops_per_token;
  };
  const double identity = ops(OrderMethod::kIdentity), greedy = ops(OrderMethod::kGreedy),
               seriation = ops(OrderMethod::kSeriation);
  EXPECT_GT(identity, 2.5);  // a random order scatters the sets
  EXPECT_DOUBLE_EQ(seriation, 1.0);
  EXPECT_LE(seriation, greedy);
  EXPECT_LT(greedy, identity);
  Order spectral = spectral_order(s);  // already right (up to direction) on this clean signal
  EXPECT_DOUBLE_EQ(layer_cost(s.token_sets, slots_of(spectral), g, p).ops_per_token, 1.0);
}

TEST(Ordering, GreedyChainStartsAtTheMostUsedAndFollowsTheStrongestPair) {
  // uses: 0 five times (most); 0's strongest partner is 2 (3x, over 3 at 2x); then 2's only
  // unvisited partner is 1 (1x); 3 last.
  auto s = coactivation({log_of(4, 2, {{2, 0}, {2, 0}, {0, 2}, {0, 3}, {3, 0}, {3, 1}, {2, 1}})})[0];
  EXPECT_EQ(greedy_chain(s), (Order{0, 2, 1, 3}));
}

TEST(Ordering, LocalSearchNeverWorsensTheModelledCost) {
  std::mt19937 rng(9);
  const std::vector<std::vector<uint16_t>> ts = random_routes(rng, 500, 16, 3);
  LayerStats s = coactivation({log_of(16, 3, ts)})[0];
  const SlotGeometry g = geometry();
  const IoProfile p;
  Order start(16);
  std::iota(start.begin(), start.end(), 0u);
  Order better = local_search(s, start, g, p, moves(2000));
  EXPECT_LE(layer_cost(ts, slots_of(better), g, p).modelled_us_per_token,
            layer_cost(ts, slots_of(start), g, p).modelled_us_per_token);
  std::vector<uint32_t> sorted = better;
  std::sort(sorted.begin(), sorted.end());
  for (uint32_t i = 0; i < 16; ++i) ASSERT_EQ(sorted[i], i);  // still a permutation
}

// Routing with some structure but no perfect order, so the search keeps finding moves.
LayerStats noisy_stats(uint32_t n, uint32_t k, int tokens, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<uint16_t>> ts;
  for (int t = 0; t < tokens; ++t) {
    std::vector<uint16_t> set;
    const uint32_t base = rng() % n;
    while (set.size() < k) {
      const uint16_t e = uint16_t(rng() % 3 == 0 ? rng() % n : (base + rng() % 6) % n);
      if (std::find(set.begin(), set.end(), e) == set.end()) set.push_back(e);
    }
    ts.push_back(set);
  }
  return coactivation({log_of(n, k, ts)})[0];
}

// Same inputs, same order: the search stops on a move count, so neither a slow machine (a
// progress callback that sleeps) nor another thread changes the result; the budget bounds the
// moves priced exactly.
TEST(Ordering, SameInputsGiveTheSameOrderAndTheMoveBudgetBoundsTheWork) {
  const LayerStats s = noisy_stats(32, 4, 600, 11);
  const SlotGeometry g = geometry();
  const IoProfile p;
  LocalSearchOptions o;
  o.max_moves = 4000;  // a pass over 32 experts is 992 insertions + 496 reversals
  SearchStats a_st, b_st, c_st;
  const Order a = order_layer(OrderMethod::kSeriation, s, g, p, o, &a_st);
  LocalSearchOptions slow = o;
  std::vector<SearchProgress> seen;
  slow.progress = [&](const SearchProgress& q) {
    seen.push_back(q);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  };
  const Order b = order_layer(OrderMethod::kSeriation, s, g, p, slow, &b_st);
  Order c;
  std::thread([&] { c = order_layer(OrderMethod::kSeriation, s, g, p, o, &c_st); }).join();
  EXPECT_EQ(a, b);
  EXPECT_EQ(a, c);
  EXPECT_EQ(a_st.moves, b_st.moves);
  EXPECT_EQ(a_st.moves, c_st.moves);
  EXPECT_FALSE(a_st.converged);  // the budget, not convergence, stopped it
  EXPECT_EQ(a_st.moves, o.max_moves);
  ASSERT_FALSE(seen.empty());
  for (size_t i = 0; i < seen.size(); ++i) {
    EXPECT_LE(seen[i].moves, o.max_moves);
    EXPECT_EQ(seen[i].max_moves, o.max_moves);
    if (i > 0) {
      EXPECT_GT(seen[i].moves, seen[i - 1].moves);
    }
  }

  // local_search alone: no budget, no move; a budget is spent exactly, and more of it never
  // ends worse (a longer run continues the same path).
  Order start(32);
  std::iota(start.begin(), start.end(), 0u);
  SearchStats st;
  EXPECT_EQ(local_search(s, start, g, p, moves(0), &st), start);
  EXPECT_EQ(st.moves, 0u);
  EXPECT_EQ(st.passes, 0);
  double prev = layer_cost(s.token_sets, slots_of(start), g, p).modelled_us_per_token;
  for (uint64_t budget : {1u, 100u, 1488u, 1489u, 2500u}) {  // this layer converges at 2 passes
    const Order o1 = local_search(s, start, g, p, moves(budget), &st);
    EXPECT_EQ(st.moves, budget);
    EXPECT_EQ(st.passes, budget >= 1488 ? int(budget / 1488) : 0) << budget;
    EXPECT_EQ(local_search(s, start, g, p, moves(budget)), o1) << budget;
    const double now = layer_cost(s.token_sets, slots_of(o1), g, p).modelled_us_per_token;
    EXPECT_LE(now, prev) << budget;
    prev = now;
  }
  // Given enough moves the search stops by itself when a pass improves nothing.
  local_search(s, start, g, p, moves(10'000'000), &st);
  EXPECT_TRUE(st.converged);
  EXPECT_EQ(st.moves, uint64_t(st.passes) * 1488);
}

ModelConfig tiny_config() {
  return test::tiny_moe_config({.hidden = 64, .layers = 3, .head_dim = 16, .top_k = 3, .max_positions = 64});
}

std::vector<ExpertMap> random_maps(int n_layers, uint32_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<ExpertMap> maps;
  for (int l = 0; l < n_layers; ++l) {
    std::vector<uint32_t> p(n);
    std::iota(p.begin(), p.end(), 0u);
    std::shuffle(p.begin(), p.end(), rng);
    maps.push_back(ExpertMap::from_slots(p));
  }
  return maps;
}

// Payload bytes of logical expert e of layer l, through the header and the map.
std::string logical_payload(const fs::path& dir, int l, uint32_t e) {
  const ExpertFileHeader h = read_expert_header(expert_file_path(dir, l));
  const ExpertMap m = load_expert_map(dir, l, h.n_experts);
  const std::string all = read_file(expert_file_path(dir, l));
  return all.substr(h.slot_offset(m.physical(e)), h.expert_bytes);
}

std::map<fs::path, std::string> snapshot(const fs::path& dir) {
  std::map<fs::path, std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) files[fs::relative(e.path(), dir)] = read_file(e.path());
  return files;
}

std::vector<int> greedy_tokens(const fs::path& dir, const char* io, std::vector<int>* routing) {
  ModelConfig cfg = ModelConfig::load(dir);
  EngineExpertStoreOptions o;
  o.io.notice = [](const std::string&) {};
  ModelOptions mo;
  mo.n_threads = 1;
  auto m = Model::load(dir, mo, open_expert_store(io, dir, cfg, o));
  if (routing)
    m->set_routing_callback([routing](const RoutingEvent& ev) {
      routing->insert(routing->end(), ev.ids, ev.ids + ev.n_tokens * ev.top_k);
    });
  Sampler greedy(SamplerParams{0.0f, 0, 1.0f, 0});
  GenerateOptions go;
  go.n_new = 10;
  std::vector<int> got;
  const std::vector<int> prompt{3, 14, 15, 9, 26, 5, 35};
  generate(*m, prompt, go, greedy, nullptr, &got);
  return got;
}

TEST(Repack, SameTokensAndRoutingBeforeAndAfterRepeatedRepacks) {
  TempDir d("cluster_test");
  const ModelConfig c = tiny_config();
  write_synthetic_model(d.path(), c, 23, 1);
  std::vector<int> want_routing;
  const std::vector<int> want = greedy_tokens(d.path(), "simple", &want_routing);
  ASSERT_EQ(want.size(), 10u);
  std::vector<std::string> payloads;
  for (int l = 0; l < c.n_layers; ++l)
    for (uint32_t e = 0; e < 8; ++e) payloads.push_back(logical_payload(d.path(), l, e));
  // Twice: the second repack starts from a file that already has a non-identity map.
  for (uint32_t seed : {1u, 2u}) {
    const auto maps = random_maps(c.n_layers, 8, seed);
    repack_experts(d.path(), c.n_layers, maps);
    EXPECT_FALSE(fs::exists(repack_staging_dir(d.path())));
    for (int l = 0; l < c.n_layers; ++l) {
      EXPECT_EQ(load_expert_map(d.path(), l, 8).slots(), maps[size_t(l)].slots());
      for (uint32_t e = 0; e < 8; ++e)
        ASSERT_EQ(logical_payload(d.path(), l, e), payloads[size_t(l) * 8 + e]) << l << " " << e;
    }
    for (const char* io : {"simple", "auto"}) {
      std::vector<int> routing;
      EXPECT_EQ(greedy_tokens(d.path(), io, &routing), want) << io << " seed " << seed;
      EXPECT_EQ(routing, want_routing) << io;
    }
  }
}

// The FormatError's message of loading `dir` for generation; "" when it loads.
std::string load_error(const fs::path& dir) {
  try {
    greedy_tokens(dir, "simple", nullptr);
  } catch (const FormatError& e) {
    return e.what();
  }
  return "";
}

// Issue 17: a --maps-out map copied next to the un-repacked layer files read other experts with
// every checksum passing. Now it is refused naming both files, and so is a repack from it; the
// maps --maps-out writes are byte for byte what a repack in that order installs.
TEST(Repack, MapsOutMapNextToTheUnrepackedFilesIsRefused) {
  TempDir d("cluster_test");
  const ModelConfig c = tiny_config();
  const fs::path dir = d.path() / "model", copy = d.path() / "copy";
  write_synthetic_model(dir, c, 37, 1);
  const std::vector<int> want = greedy_tokens(dir, "simple", nullptr);
  const auto maps = random_maps(c.n_layers, 8, 5);
  const std::vector<ExpertMap> maps_out = bind_for_repack(dir, maps);  // as --maps-out writes them
  fs::copy(dir, copy, fs::copy_options::recursive);
  for (int l = 0; l < c.n_layers; ++l) write_expert_map(expert_map_path(copy, l), maps_out[size_t(l)]);
  const std::string msg = load_error(copy);
  EXPECT_NE(msg.find(expert_map_path(copy, 0).string() + " does not describe " +
                     expert_file_path(copy, 0).string()), std::string::npos) << msg;
  const auto before = snapshot(copy);
  EXPECT_THROW(repack_experts(copy, c.n_layers, random_maps(c.n_layers, 8, 6)), FormatError);
  EXPECT_EQ(snapshot(copy), before);
  // The real repack installs exactly those maps, and the model reads as before.
  repack_experts(dir, c.n_layers, maps);
  for (int l = 0; l < c.n_layers; ++l)
    EXPECT_EQ(read_file(expert_map_path(dir, l)), encode_expert_map(maps_out[size_t(l)])) << l;
  EXPECT_EQ(greedy_tokens(dir, "simple", nullptr), want);
  EXPECT_EQ(greedy_tokens(dir, "auto", nullptr), want);
  // A map of another layer of the repacked model is refused too.
  fs::copy_file(expert_map_path(dir, 1), expert_map_path(dir, 0), fs::copy_options::overwrite_existing);
  EXPECT_NE(load_error(dir).find("layer_000.map does not describe"), std::string::npos);
}

// A model repacked by the previous version has version-1 maps: refused (with the way out) until
// cluster_experts --bind-legacy-maps binds them, after which it reads as before.
TEST(Repack, LegacyRepackedModelIsRefusedUntilItsMapsAreBound) {
  TempDir d("cluster_test");
  const ModelConfig c = tiny_config();
  write_synthetic_model(d.path(), c, 41, 1);
  const std::vector<int> want = greedy_tokens(d.path(), "simple", nullptr);
  repack_experts(d.path(), c.n_layers, random_maps(c.n_layers, 8, 7));
  for (int l = 0; l < c.n_layers; ++l)  // what the previous version left: the same order, unbound
    write_expert_map(expert_map_path(d.path(), l), ExpertMap::from_slots(load_expert_map(d.path(), l, 8).slots()));
  const std::string msg = load_error(d.path());
  EXPECT_NE(msg.find("version-1 map"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--bind-legacy-maps"), std::string::npos) << msg;
  EXPECT_THROW(repack_experts(d.path(), c.n_layers, random_maps(c.n_layers, 8, 8)), FormatError);
  EXPECT_EQ(bind_legacy_maps(d.path()), c.n_layers);
  EXPECT_EQ(greedy_tokens(d.path(), "simple", nullptr), want);
  EXPECT_EQ(bind_legacy_maps(d.path()), 0);  // already bound: checked, not rewritten
  repack_experts(d.path(), c.n_layers, random_maps(c.n_layers, 8, 8));  // and repackable again
  EXPECT_EQ(greedy_tokens(d.path(), "simple", nullptr), want);
}

TEST(Repack, InjectedFailureAtEveryPointLeavesTheOriginalUntouched) {
  TempDir d("cluster_test");
  const ModelConfig c = tiny_config();
  write_synthetic_model(d.path(), c, 29, 1);
  const auto before = snapshot(d.path());
  const auto maps = random_maps(c.n_layers, 8, 3);
  std::vector<std::string> points;
  for (int l = 0; l < c.n_layers; ++l) points.push_back("layer " + std::to_string(l) + " written");
  points.push_back("before exchange");
  for (const std::string& at : points) {
    for (bool crash : {false, true}) {  // crash: the staging directory is left behind
      RepackOptions o;
      o.keep_staging_on_failure = crash;
      o.fault = [&](const std::string& p) {
        if (p == at) throw IoError("injected failure at " + p);
      };
      EXPECT_THROW(repack_experts(d.path(), c.n_layers, maps, o), IoError) << at;
      EXPECT_EQ(fs::exists(repack_staging_dir(d.path())), crash);
      auto now = snapshot(d.path());
      for (auto it = now.begin(); it != now.end();)  // the staging dir is not the model
        it = it->first.begin()->string() == "experts.repack" ? now.erase(it) : std::next(it);
      EXPECT_EQ(now, before) << at;
    }
  }
  // A later run removes the stale staging and succeeds.
  repack_experts(d.path(), c.n_layers, maps);
  EXPECT_FALSE(fs::exists(repack_staging_dir(d.path())));
  EXPECT_EQ(load_expert_map(d.path(), 1, 8).slots(), maps[1].slots());
}

TEST(Repack, DamagedSourceSlotIsRefusedAndNothingChanges) {
  TempDir d("cluster_test");
  const ModelConfig c = tiny_config();
  write_synthetic_model(d.path(), c, 31, 1);
  const fs::path f = expert_file_path(d.path(), 2);
  std::string b = read_file(f);
  const ExpertFileHeader h = read_expert_header(f);
  b[h.slot_offset(5) + 100] ^= 0x10;
  write_file_atomic(f, b);
  const auto before = snapshot(d.path());
  try {
    repack_experts(d.path(), c.n_layers, random_maps(c.n_layers, 8, 4));
    FAIL() << "damaged slot accepted";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("slot 5"), std::string::npos) << e.what();
  }
  EXPECT_EQ(snapshot(d.path()), before);
}

}  // namespace
}  // namespace moestream::cluster
