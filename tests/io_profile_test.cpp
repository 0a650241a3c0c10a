// Tests of loader/io/io_profile.h (the device profile file: written atomically, validated on load)
// and of the merge rule it drives in io_plan.h (io::MergeRule): which reads the planner issues
// under a latency-heavy, a bandwidth-heavy and an IOPS-limited profile, and that the engine reads
// the right bytes when the rule merges across gaps.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/file_util.h"
#include "loader/io/io_engine.h"
#include "loader/io/io_plan.h"
#include "loader/io/io_profile.h"

namespace fs = std::filesystem;
using namespace moestream;

namespace {

// Throws FormatError whose message contains `needle`.
void expect_refused(const std::string& text, const std::string& needle) {
  try {
    parse_io_profile(text, "p.json");
    ADD_FAILURE() << "accepted: " << text;
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("p.json"), std::string::npos) << e.what();
  }
}

const std::string kGood =
    R"({"format": "moestream-io-profile", "version": 1, "op_latency_us": 85.5, "iops_limit": 30000,)"
    R"( "queue_depth": 64, "bandwidth_gbps": 1.5, "single_read_gbps": 0.5})";

// The reads plan_file_reads issues for `ranges` (one file) under `opts`.
std::vector<io::PlannedRead> plan(const std::vector<io::ByteRange>& ranges, bool direct, const io::PlanOptions& opts) {
  std::vector<io::PlannedRead> out;
  io::plan_file_reads(std::span<const io::ByteRange>(ranges), direct, opts,
                      [&](const io::PlannedRead& r) { out.push_back(r); });
  return out;
}

io::PlanOptions with_profile(const IoProfile& p, uint32_t queue_depth = 32, bool direct = false) {
  IoEngineOptions o;
  o.profile = p;
  o.queue_depth = queue_depth;
  o.direct = direct;
  return io::plan_options(o);
}

// Four 64 KiB experts with a 64 KiB unselected expert between each pair.
std::vector<io::ByteRange> spaced_experts() {
  std::vector<io::ByteRange> r;
  for (uint64_t i = 0; i < 4; ++i) r.push_back({4096 + i * (128 << 10), 64 << 10});
  return r;
}

// Four 64 KiB experts with gaps of 32, 64 and 96 KiB (the rule takes gaps smallest first; equal
// gaps can only go together).
std::vector<io::ByteRange> graded_gaps() {
  std::vector<io::ByteRange> r;
  uint64_t off = 4096;
  for (uint64_t gap : {32u << 10, 64u << 10, 96u << 10, 0u}) {
    r.push_back({off, 64 << 10});
    off += (64 << 10) + gap;
  }
  return r;
}

const IoProfile kLatencyHeavy{1000.0, 1000.0, 32, 3.0, 3.0};      // 1 ms per op, 3 GB/s
const IoProfile kBandwidthHeavy{10.0, 1000000.0, 32, 0.05, 0.05};  // 10 us per op, 50 MB/s
// A volume throttled to 3000 reads/s and 250 MB/s, and an NVMe-like disk whose single read
// moves 0.5 GB/s of its 3 GB/s.
const IoProfile kThrottled{75.0, 3000.0, 64, 0.25, 0.25};
const IoProfile kNvme{80.0, 500000.0, 64, 3.0, 0.5};

}  // namespace

TEST(IoProfile, SavedProfileLoadsBackAndLeavesNoTempFile) {
  TempDir d;
  const fs::path p = d.path() / "profile.json";
  save_io_profile(p, IoProfile{85.5, 30000, 64, 1.5, 0.5}, R"({"file": "/x"})");
  const IoProfile got = load_io_profile(p);
  EXPECT_DOUBLE_EQ(got.op_latency_us, 85.5);
  EXPECT_DOUBLE_EQ(got.iops_limit, 30000);
  EXPECT_DOUBLE_EQ(got.queue_depth, 64);
  EXPECT_DOUBLE_EQ(got.bandwidth_gbps, 1.5);
  EXPECT_DOUBLE_EQ(got.single_read_gbps, 0.5);
  EXPECT_NE(read_file(p).find("\"format\": \"moestream-io-profile\""), std::string::npos);
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(d.path())) n += e.path().filename() != "profile.json";
  EXPECT_EQ(n, 0u) << "a temp file was left behind";
}

TEST(IoProfile, BenchIoResultsHoldingAProfileLoad) {
  const IoProfile p = parse_io_profile(R"({"sweep": [], "profile": )" + kGood + "}", "bench_io.json");
  EXPECT_DOUBLE_EQ(p.op_latency_us, 85.5);
  EXPECT_DOUBLE_EQ(p.bandwidth_gbps, 1.5);
}

TEST(IoProfile, BadProfilesAreRefusedNamingTheField) {
  expect_refused("{", "not JSON");
  expect_refused("[1]", "not a JSON object");
  expect_refused(R"({"sweep": []})", "rerun bench_io");
  expect_refused(R"({"op_latency_us": 1})", "no \"format\"");
  std::string s = kGood;
  expect_refused(std::string(s).replace(s.find("moestream-io-profile"), 20, "other-format"), "format is");
  expect_refused(std::string(s).replace(s.find("\"version\": 1"), 12, "\"version\": 2"), "version is 2");
  for (const char* field : {"op_latency_us", "iops_limit", "queue_depth", "bandwidth_gbps", "single_read_gbps"}) {
    const size_t at = s.find(std::string("\"") + field + "\"");
    const size_t end = s.find_first_of(",}", at);
    const std::string head = s.substr(0, at), tail = s.substr(end);
    const std::string key = std::string("\"") + field + "\": ";
    // Missing: drop "key": value and its comma.
    std::string missing = head + tail.substr(tail[0] == ',' ? 2 : 0);
    if (missing.find(", }") != std::string::npos) missing.replace(missing.find(", }"), 3, "}");
    expect_refused(missing, std::string(field) + " is missing");
    expect_refused(head + key + "-3" + tail, std::string(field) + " is -3");
    expect_refused(head + key + "0" + tail, std::string(field) + " is 0");
    expect_refused(head + key + "null" + tail, std::string(field) + " is not a finite number");
    expect_refused(head + key + "\"fast\"" + tail, std::string(field) + " is \"fast\", not a number");
    expect_refused(head + key + "1e999" + tail, "not JSON");  // out of double range: the parser refuses
  }
}

TEST(IoProfile, SavingAnInvalidProfileWritesNothing) {
  TempDir d;
  const fs::path p = d.path() / "profile.json";
  EXPECT_THROW(save_io_profile(p, IoProfile{std::nan(""), 1000, 1, 1.0, 1.0}), FormatError);
  EXPECT_THROW(save_io_profile(p, IoProfile{80, 1000, 1, std::numeric_limits<double>::infinity(), 1.0}), FormatError);
  EXPECT_THROW(save_io_profile(p, IoProfile{80, 0, 1, 1.0, 1.0}), FormatError);  // the flag defaults: no IOPS
  EXPECT_FALSE(fs::exists(p));
}

TEST(IoProfile, TheEngineRefusesAnInvalidProfile) {
  IoEngineOptions o;
  o.profile = IoProfile{80, -5, 32, 1.0, 1.0};
  try {
    IoEngine e(o);
    FAIL() << "accepted a negative IOPS limit";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("iops_limit"), std::string::npos) << e.what();
  }
}

// The same batch: a latency-heavy device reads through the gaps (one read), a bandwidth-heavy one
// reads only the experts (four reads); no profile keeps today's fixed 64 KiB gap (one read).
TEST(MergeRule, LatencyHeavyReadsThroughGapsBandwidthHeavyDoesNot) {
  const auto r = spaced_experts();
  EXPECT_EQ(plan(r, false, with_profile(kLatencyHeavy)).size(), 1u);
  EXPECT_EQ(plan(r, false, with_profile(kBandwidthHeavy)).size(), 4u);
  EXPECT_EQ(plan(r, false, io::plan_options(IoEngineOptions{})).size(), 1u);
  IoEngineOptions narrow;
  narrow.coalesce_gap_bytes = 32 << 10;
  EXPECT_EQ(plan(r, false, io::plan_options(narrow)).size(), 4u);
}

// Four adjacent 68 KiB experts: on the throttled volume ops are the cost (4 x 333 us against
// 1114 us of bytes) and one read is cheaper; on the NVMe-like disk four reads in flight end
// after about one 68 KiB read (219 us) while one 272 KiB read alone takes 637 us: four reads.
// The fixed rule merges them whatever the device.
TEST(MergeRule, AdjacentExpertsMergeWhereOpsCostAndStayApartWhereOneReadIsSlow) {
  std::vector<io::ByteRange> adjacent;
  for (uint64_t i = 0; i < 4; ++i) adjacent.push_back({4096 + i * 69632, 69632});
  EXPECT_EQ(plan(adjacent, true, with_profile(kThrottled, 32, true)).size(), 1u);
  EXPECT_EQ(plan(adjacent, true, with_profile(kNvme, 32, true)).size(), 4u);
  EXPECT_EQ(io::merge_gap_bytes(adjacent, with_profile(kNvme, 32, true).merge), -1);
  EXPECT_EQ(plan(adjacent, true, io::plan_options(IoEngineOptions{})).size(), 1u);
  // Overlapping ranges always share a read.
  std::vector<io::ByteRange> overlap{{4096, 8192}, {8192, 8192}};
  EXPECT_EQ(plan(overlap, false, with_profile(kNvme)).size(), 1u);
}

// With spare queue depth a few reads overlap and cost about one op: the batch is bound by bytes,
// and reading a gap only adds to them. One read in flight makes ops the cost: then gaps are read
// through while an op costs more than the gap's transfer.
TEST(MergeRule, QueueDepthAndTheIopsLimitBoundTheOpCost) {
  const auto r = graded_gaps();                     // 256 KiB of experts
  const IoProfile nvme{100.0, 1000000.0, 32, 1.0, 1.0};  // 100 us, 1M IOPS, 1 GB/s
  EXPECT_EQ(plan(r, false, with_profile(nvme, 32)).size(), 4u);  // max(4 x 100/4, 100 + 262 us): bytes
  // QD 1: 4 x 100 = 400 us > 362; the 32 KiB gap: 300 vs 395; the 64 KiB one too: 200 vs 460,
  // worse. Three reads, the 32 KiB gap read through.
  const auto qd1 = plan(r, false, with_profile(nvme, 1));
  ASSERT_EQ(qd1.size(), 3u);
  EXPECT_EQ(qd1[0].count, 2u);
  // An IOPS limit of 2000/s (500 us an op) at QD 32: every gap is worth reading through.
  IoProfile limited = nvme;
  limited.iops_limit = 2000;
  EXPECT_EQ(plan(r, false, with_profile(limited, 32)).size(), 1u);
  EXPECT_DOUBLE_EQ(io::batch_read_us(4, 262144, 65536, with_profile(limited).merge), 2000.0);
  EXPECT_DOUBLE_EQ(io::batch_read_us(4, 262144, 65536, with_profile(nvme, 32).merge), 362.144);
  EXPECT_DOUBLE_EQ(io::batch_read_us(1, 262144, 262144, with_profile(nvme, 32).merge), 362.144);
}

// Experts over half the read cap were never merged; under a profile whose ops cost more than
// their transfer (100 reads/s at 3 GB/s) O_DIRECT reads of adjacent large experts merge into one
// (the block layer splits it over the device queue itself).
TEST(MergeRule, LargeAdjacentExpertsMergeUnderAProfile) {
  const uint64_t expert = 2654208;  // a q4 Qwen3-30B-A3B expert
  std::vector<io::ByteRange> r;
  for (uint64_t i = 0; i < 3; ++i) r.push_back({4096 + i * expert, expert});
  IoEngineOptions base;
  base.direct = true;
  EXPECT_EQ(plan(r, true, io::plan_options(base)).size(), 3u);  // 4 MiB cap: one expert per read
  const IoProfile few_iops{500.0, 100.0, 32, 3.0, 3.0};
  const auto merged = plan(r, true, with_profile(few_iops, 32, true));
  ASSERT_EQ(merged.size(), 1u);
  EXPECT_EQ(merged[0].count, 3u);
  EXPECT_EQ(merged[0].needed, 3 * expert);
  // Buffered reads keep max_read_bytes (page-cache copies need pieces for parallel threads).
  EXPECT_EQ(plan(r, false, with_profile(few_iops)).size(), 9u);
  // Where bytes are the cost and one read moves them as fast as three, the time is the same and
  // the fewer reads win; where one read alone is slower (the NVMe-like disk), three reads.
  EXPECT_EQ(plan(r, true, with_profile(kThrottled, 32, true)).size(), 1u);
  EXPECT_EQ(plan(r, true, with_profile(kNvme, 32, true)).size(), 3u);
  // --coalesce-gap-kb 0 turns merging off, profile or not.
  IoEngineOptions off = base;
  off.coalesce = false;
  off.profile = few_iops;
  EXPECT_EQ(plan(r, true, io::plan_options(off)).size(), 3u);
}

// The engine reads what the rule plans: gaps read into the sink, every expert's bytes right.
TEST(MergeRule, TheEngineReadsMergedGapsCorrectly) {
  TempDir d;
  const fs::path path = d.path() / "layer.bin";
  std::string content(4 << 20, '\0');
  std::mt19937_64 rng(3);
  for (char& c : content) c = char(rng());
  write_file_atomic(path, content);
  for (bool latency_heavy : {true, false}) {
    IoEngineOptions o;
    o.backend = IoBackend::kPread;
    o.profile = latency_heavy ? kLatencyHeavy : kBandwidthHeavy;
    IoEngine e(o);
    e.add_file(path);
    const auto r = spaced_experts();
    std::vector<std::string> bufs(r.size(), std::string(r[0].length, '\0'));
    std::vector<ReadRequest> reqs;
    for (size_t i = 0; i < r.size(); ++i) reqs.push_back({0, r[i].offset, r[i].length, bufs[i].data()});
    e.read(reqs);
    for (size_t i = 0; i < r.size(); ++i) EXPECT_EQ(bufs[i], content.substr(r[i].offset, r[i].length));
    EXPECT_EQ(e.stats().reads_issued, latency_heavy ? 1u : 4u);
  }
}
