// Tests of loader/store/store_options.h: every user option reaches the engine store's options
// (the O_DIRECT read cap included), bad values are refused naming the option in the front end's
// spelling, warnings and the engine's notices take the one notice path, and the named store opens.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/file_util.h"
#include "loader/format/expert_file.h"
#include "loader/format/model_config.h"
#include "loader/store/store_options.h"
#include "runtime/convert/synthetic_model.h"
#include "tests/support/test_model.h"

namespace fs = std::filesystem;
using namespace moestream;

namespace {

ModelConfig tiny_config() { return test::tiny_moe_config({.vocab = 50, .hidden = 96, .head_dim = 8}); }

// Collects notices (the engine may call from its threads).
struct Notices {
  std::mutex mu;
  std::vector<std::string> lines;
  StoreNoticeFn fn() {
    return [this](const std::string& line) {
      std::lock_guard lock(mu);
      lines.push_back(line);
    };
  }
};

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// The ConfigError message of build_store_options(c); fails the test when none is thrown.
std::string config_error(const StoreConfig& c) {
  try {
    build_store_options(c, [](const std::string&) {});
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no ConfigError";
  return {};
}

}  // namespace

TEST(StoreOptions, DefaultsAreTheEngineDefaults) {
  const EngineExpertStoreOptions so = build_store_options(StoreConfig{});
  const IoEngineOptions io;
  EXPECT_EQ(so.io.direct, io.direct);
  EXPECT_EQ(so.io.queue_depth, io.queue_depth);
  EXPECT_EQ(so.io.n_rings, io.n_rings);
  EXPECT_EQ(so.io.n_threads, io.n_threads);
  EXPECT_EQ(so.io.coalesce, io.coalesce);
  EXPECT_EQ(so.io.coalesce_gap_bytes, io.coalesce_gap_bytes);
  EXPECT_EQ(so.io.max_read_bytes, io.max_read_bytes);
  EXPECT_EQ(so.io.direct_max_read_bytes, io.direct_max_read_bytes);
  EXPECT_EQ(so.host_cache_bytes, 0u);
  EXPECT_TRUE(so.store.verify_checksums);
  EXPECT_FALSE(so.io.notice);  // no sink given: the engine's own stderr line
}

TEST(StoreOptions, MapsEveryOption) {
  StoreConfig c;
  c.io = "pread";
  c.io_direct = true;
  c.host_cache_mb = 3;
  c.io_qd = 7;
  c.io_rings = 2;
  c.io_threads = 5;
  c.coalesce_gap_kb = 16;
  c.max_read_kb = 256;
  c.direct_max_read_kb = 512;
  c.verify_checksums = false;
  Notices n;
  const EngineExpertStoreOptions so = build_store_options(c, n.fn());
  EXPECT_TRUE(so.io.direct);
  EXPECT_EQ(so.host_cache_bytes, 3u << 20);
  EXPECT_EQ(so.io.queue_depth, 7u);
  EXPECT_EQ(so.io.n_rings, 2u);
  EXPECT_EQ(so.io.n_threads, 5u);
  EXPECT_TRUE(so.io.coalesce);
  EXPECT_EQ(so.io.coalesce_gap_bytes, 16u << 10);
  EXPECT_EQ(so.io.max_read_bytes, 256u << 10);
  EXPECT_EQ(so.io.direct_max_read_bytes, 512u << 10);
  EXPECT_FALSE(so.store.verify_checksums);
  ASSERT_TRUE(so.io.notice);  // the engine's notices go to the same sink
  so.io.notice("probe");
  ASSERT_EQ(n.lines.size(), 1u);
  EXPECT_EQ(n.lines[0], "probe");

  c.coalesce_gap_kb = 0;
  EXPECT_FALSE(build_store_options(c).io.coalesce);
}

// Messages name options with marks (common/option_ref.h); each front end spells them
// (options_test.cpp: flags, keywords, JSON fields).
TEST(StoreOptions, BadValuesNameTheOption) {
  struct Case {
    std::function<void(StoreConfig&)> set;
    std::string field, value;
  };
  const std::vector<Case> cases = {
      {[](StoreConfig& c) { c.io = "bogus"; }, "io", "bogus"},
      {[](StoreConfig& c) { c.io_qd = 0; }, "io_qd", "0"},
      {[](StoreConfig& c) { c.io_qd = kMaxIoQueueDepth + 1; }, "io_qd", "4097"},
      {[](StoreConfig& c) { c.io_rings = kMaxIoWorkers + 1; }, "io_rings", "1025"},
      {[](StoreConfig& c) { c.io_threads = 100000; }, "io_threads", "100000"},
      {[](StoreConfig& c) { c.max_read_kb = 2; }, "max_read_kb", "2"},
      {[](StoreConfig& c) { c.direct_max_read_kb = 0; }, "direct_max_read_kb", "0"},
      {[](StoreConfig& c) { c.direct_max_read_kb = kMaxReadKb + 1; }, "direct_max_read_kb", "1073741825"},
      {[](StoreConfig& c) { c.coalesce_gap_kb = kMaxCoalesceGapKb + 1; }, "coalesce_gap_kb", "1073741825"},
      {[](StoreConfig& c) { c.host_cache_mb = uint64_t(1) << 60; }, "host_cache_mb", "1152921504606846976"},
  };
  for (const Case& k : cases) {
    StoreConfig c;
    k.set(c);
    const std::string msg = config_error(c);
    EXPECT_TRUE(contains(msg, "`" + k.field + "`")) << msg;
    EXPECT_TRUE(contains(msg, k.value)) << msg;
  }
  // The edges of each range are accepted.
  StoreConfig edge;
  edge.io_qd = kMaxIoQueueDepth;
  edge.max_read_kb = kMinReadKb;
  edge.direct_max_read_kb = kMaxReadKb;
  edge.coalesce_gap_kb = kMaxCoalesceGapKb;
  EXPECT_NO_THROW(build_store_options(edge));
}

TEST(StoreOptions, LargestSizesConvertToBytesExactly) {
  // The shared conversions (common/checked.h): the top of each range in bytes, never wrapped.
  StoreConfig c;
  c.host_cache_mb = kMaxHostCacheMb;
  c.max_read_kb = kMaxReadKb;
  c.coalesce_gap_kb = kMaxCoalesceGapKb;
  const EngineExpertStoreOptions so = build_store_options(c, [](const std::string&) {});
  EXPECT_EQ(so.host_cache_bytes, kMaxHostCacheMb << 20);
  EXPECT_EQ(so.io.max_read_bytes, kMaxReadKb << 10);
  EXPECT_EQ(so.io.coalesce_gap_bytes, kMaxCoalesceGapKb << 10);
  // 2^64 - 1 MiB would wrap to a tiny cache if shifted: refused with the option's name.
  c.host_cache_mb = ~uint64_t(0);
  const std::string msg = config_error(c);
  EXPECT_TRUE(contains(msg, "host_cache_mb") && contains(msg, "18446744073709551615")) << msg;
}

TEST(StoreOptions, HostCacheWithBufferedReadsWarnsOfDoubleCaching) {
  StoreConfig c;
  c.host_cache_mb = 4;
  Notices n;
  build_store_options(c, n.fn());
  ASSERT_EQ(n.lines.size(), 1u);
  EXPECT_TRUE(contains(n.lines[0], "`host_cache_mb` without `io_direct`")) << n.lines[0];
  EXPECT_TRUE(contains(n.lines[0], "cached twice")) << n.lines[0];

  n.lines.clear();
  c.io_direct = true;  // the intended use: no page cache below the host cache
  build_store_options(c, n.fn());
  EXPECT_TRUE(n.lines.empty());

  c.io = "simple";  // the simple store has neither O_DIRECT nor a host cache
  build_store_options(c, n.fn());
  ASSERT_EQ(n.lines.size(), 1u);
  EXPECT_TRUE(contains(n.lines[0], "do not apply")) << n.lines[0];
}

// A small packed model on disk, and stores opened over it with their notices collected.
class StoreOptionsOnModel : public ::testing::Test {
 protected:
  void SetUp() override { write_synthetic_model(dir_.path(), cfg_, 5); }
  std::unique_ptr<ExpertStore> open(const StoreConfig& c) {
    return open_store_for(dir_.path(), cfg_, c, notices_.fn());
  }
  std::vector<std::string> notice_lines() {  // so far (the engine may add from its threads)
    std::lock_guard lock(notices_.mu);
    return notices_.lines;
  }

  TempDir dir_{"store_options"};
  const ModelConfig cfg_ = tiny_config();
  Notices notices_;
};

TEST_F(StoreOptionsOnModel, OpensTheNamedStoreWithTheEngineNoticesOnTheSamePath) {
  StoreConfig c;
  c.io = "simple";
  EXPECT_EQ(open_store_for(dir_.path(), cfg_, c)->describe(), "one pread per expert");

  // mmap cannot read O_DIRECT: the engine says so, through the builder's sink.
  c.io = "mmap";
  c.io_direct = true;
  c.max_read_kb = 128;
  auto store = open(c);
  const std::string desc = store->describe();
  EXPECT_TRUE(contains(desc, "engine mmap")) << desc;
  EXPECT_TRUE(contains(desc, "max read 128 KiB")) << desc;
  const std::vector<std::string> lines = notice_lines();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_TRUE(contains(lines[0], "O_DIRECT does not apply to the mmap backend")) << lines[0];
}

TEST_F(StoreOptionsOnModel, DirectReadCapReachesTheStore) {
  StoreConfig c;
  c.io = "pread";
  c.io_direct = true;
  c.direct_max_read_kb = 8;
  auto store = open(c);
  if (const auto lines = notice_lines(); !lines.empty())
    GTEST_SKIP() << "O_DIRECT refused on this filesystem: " << lines[0];
  const std::string desc = store->describe();
  EXPECT_TRUE(contains(desc, "O_DIRECT 8 KiB")) << desc;
  // An expert longer than the cap is read in several pieces.
  const uint64_t expert_bytes = ExpertLayout::make(cfg_.expert_quant, size_t(cfg_.hidden_size),
                                                   size_t(cfg_.moe_intermediate_size)).bytes;
  ASSERT_GT(expert_bytes, 8u << 10);
  const std::vector<int> ids{0};
  std::vector<const uint8_t*> out;
  store->fetch(0, ids, out);
  const ExpertStoreStats s = store->stats();
  EXPECT_EQ(s.read_ops_requested, 1u);
  EXPECT_GE(s.read_ops_issued, (expert_bytes + (8u << 10) - 1) / (8u << 10));
}

// StoreConfig::auto_direct: a model larger than the memory room is read with O_DIRECT into a host
// cache of what the dense weights and the reserve leave (at most half the room), with one notice;
// one that fits, an explicit choice, io mmap/simple, or an unknown room change nothing.
TEST_F(StoreOptionsOnModel, AModelLargerThanTheRoomIsReadDirectIntoAHostCacheOfWhatIsLeft) {
  uint64_t experts = 0;
  for (int l = 0; l < cfg_.n_moe_layers(); ++l) experts += uint64_t(cfg_.expert_layout(l).bytes) * uint64_t(cfg_.n_experts);
  const uint64_t dense = fs::file_size(dir_.path() / cfg_.dense_file), model = experts + dense;
  ASSERT_GT(experts, 0u);
  const StoreConfig defaults;
  EXPECT_TRUE(defaults.auto_direct);

  // Fits: nothing changes, nothing said.
  StoreConfig c = fit_to_memory(dir_.path(), cfg_, defaults, MemoryRoom{model, "MemAvailable"}, notices_.fn());
  EXPECT_FALSE(c.io_direct);
  EXPECT_EQ(c.host_cache_mb, 0u);
  EXPECT_TRUE(notice_lines().empty());

  // One byte short: direct, and the host cache is min(room - dense - reserve, room / 2), in MiB.
  const MemoryRoom room{model - 1, "cgroup v1 /x (memory.limit_in_bytes 1 MiB)"};
  c = fit_to_memory(dir_.path(), cfg_, defaults, room, notices_.fn());
  EXPECT_TRUE(c.io_direct);
  const uint64_t held = dense + fit_reserve_bytes(room.bytes);
  const uint64_t want = std::min(room.bytes > held ? room.bytes - held : 0, room.bytes / 2) >> 20;
  EXPECT_EQ(c.host_cache_mb, want);
  std::vector<std::string> lines = notice_lines();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_TRUE(contains(lines[0], "exceed the memory this process may fill")) << lines[0];
  EXPECT_TRUE(contains(lines[0], "cgroup v1 /x")) << lines[0];
  EXPECT_TRUE(contains(lines[0], "`io_direct=true` `host_cache_mb=" + std::to_string(want) + "`")) << lines[0];
  EXPECT_TRUE(contains(lines[0], "`auto_direct=false` keeps the page cache")) << lines[0];

  // Nothing changes where the user chose, the backend cannot, or the room is unknown.
  StoreConfig chose = defaults;
  chose.host_cache_mb = 3;
  EXPECT_EQ(fit_to_memory(dir_.path(), cfg_, chose, room, {}).io_direct, false);
  chose = defaults;
  chose.auto_direct = false;
  EXPECT_FALSE(fit_to_memory(dir_.path(), cfg_, chose, room, {}).io_direct);
  for (const char* io : {"mmap", "simple"}) {
    chose = defaults;
    chose.io = io;
    EXPECT_FALSE(fit_to_memory(dir_.path(), cfg_, chose, room, {}).io_direct) << io;
  }
  EXPECT_FALSE(fit_to_memory(dir_.path(), cfg_, defaults, std::nullopt, {}).io_direct);
  EXPECT_EQ(notice_lines().size(), 1u) << "only the first call changed anything";

  // The cache's size on a model of many GiB (the sizes come from the config and the dense file).
  ModelConfig huge = cfg_;
  huge.n_experts = 1 << 20;
  const uint64_t gib = uint64_t(1) << 30;
  // 8 GiB: the reserve is 1 GiB, so half the room (4 GiB) is the smaller bound.
  EXPECT_EQ(fit_to_memory(dir_.path(), huge, defaults, MemoryRoom{8 * gib, "m"}, {}).host_cache_mb,
            4096u);
  // 700 MiB: the reserve is 384 MiB, so the room less the dense file and the reserve is smaller.
  const uint64_t small = uint64_t(700) << 20;
  EXPECT_EQ(fit_to_memory(dir_.path(), huge, defaults, MemoryRoom{small, "m"}, {}).host_cache_mb,
            (small - dense - (uint64_t(384) << 20)) >> 20);
}

// Experts on tmpfs are memory already and outside MemAvailable: however small the room, they are
// computed where they lie, never copied into a host cache; the same model on disk is streamed.
TEST(StoreOptions, AModelOnAMemoryFilesystemIsNeverStreamed) {
  EXPECT_FALSE(on_memory_filesystem("/proc"));
  EXPECT_FALSE(on_memory_filesystem("/no/such/path"));
  if (!fs::is_directory("/dev/shm") || !on_memory_filesystem("/dev/shm")) GTEST_SKIP() << "no tmpfs at /dev/shm";
  const fs::path shm = "/dev/shm/moestream_store_options_" + std::to_string(::getpid());
  struct Remove {
    fs::path p;
    ~Remove() {
      std::error_code ec;
      fs::remove_all(p, ec);
    }
  } remove{shm};
  fs::create_directories(shm);
  const ModelConfig cfg = tiny_config();
  write_synthetic_model(shm, cfg, 5);
  TempDir disk("store_options");
  write_synthetic_model(disk.path(), cfg, 5);
  const MemoryRoom room{1, "MemAvailable"};  // smaller than any model
  const StoreConfig on_shm = fit_to_memory(shm, cfg, StoreConfig{}, room, {});
  EXPECT_FALSE(on_shm.io_direct);
  EXPECT_EQ(on_shm.host_cache_mb, 0u);
  if (on_memory_filesystem(disk.path())) GTEST_SKIP() << "the temporary directory is on tmpfs too";
  EXPECT_TRUE(fit_to_memory(disk.path(), cfg, StoreConfig{}, room, {}).io_direct);
}

TEST(StoreOptions, TheFitReserveIs384MiBOrAnEighthOfTheRoom) {
  EXPECT_EQ(fit_reserve_bytes(uint64_t(1) << 30), uint64_t(384) << 20);
  EXPECT_EQ(fit_reserve_bytes(uint64_t(64) << 30), uint64_t(8) << 30);
}
