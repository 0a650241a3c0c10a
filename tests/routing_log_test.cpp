// Tests of the routing log (loader/format/routing_log.h): round trip, appends, torn tails skipped and
// never misread, corruption and another model's log rejected.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <tuple>

#include "common/error.h"
#include "common/file_util.h"
#include "loader/format/routing_log.h"
#include "tests/support/test_model.h"

namespace moestream {
namespace {

namespace fs = std::filesystem;

RoutingLogHeader header() { return RoutingLogHeader{0x1234abcdULL, 3, 16, 4, 8}; }

RoutingRecord record(uint64_t req, uint32_t pos, uint16_t layer, bool input, std::mt19937& rng) {
  RoutingRecord r;
  r.request_id = req;
  r.position = pos;
  r.layer = layer;
  r.phase = pos < 5 ? RoutingPhase::kPrefill : RoutingPhase::kDecode;
  std::vector<uint16_t> all(16);
  for (uint16_t i = 0; i < 16; ++i) all[i] = i;
  std::shuffle(all.begin(), all.end(), rng);
  r.ids.assign(all.begin(), all.begin() + 4);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  for (int j = 0; j < 4; ++j) r.weights.push_back(u(rng));
  if (input)
    for (int j = 0; j < 8; ++j) r.router_input.push_back(u(rng) - 0.5f);
  return r;
}

// A plain overwrite: the truncation sweep writes hundreds of files and needs no fsync.
void put_file(const std::filesystem::path& p, std::string_view b) {
  std::ofstream(p, std::ios::binary | std::ios::trunc).write(b.data(), std::streamsize(b.size()));
}

// Every field of a record, compared (and printed on failure) at once.
auto fields(const RoutingRecord& r) {
  return std::tie(r.request_id, r.position, r.layer, r.phase, r.ids, r.weights, r.router_input);
}

void expect_same(const RoutingRecord& a, const RoutingRecord& b) { EXPECT_EQ(fields(a), fields(b)); }

// Writes n records (every third with a router input) and returns them.
std::vector<RoutingRecord> write_log(const std::filesystem::path& p, int n, uint64_t req = 0) {
  std::mt19937 rng(7 + n);
  std::vector<RoutingRecord> rs;
  RoutingLogWriter w(p, header());
  for (int i = 0; i < n; ++i) {
    rs.push_back(record(req, uint32_t(i / 3), uint16_t(i % 3), i % 3 == 0, rng));
    w.append(rs.back());
  }
  w.close();
  return rs;
}

// Each test's log file p, in a fresh directory.
class RoutingLog : public ::testing::Test {
 protected:
  TempDir d;
  const fs::path p = d.path() / "r.bin";
};

// XORs the byte at `offset` of `file` with `mask`.
void flip_bits(const fs::path& file, uint64_t offset, uint8_t mask) {
  std::string b = read_file(file);
  b.at(offset) = char(uint8_t(b.at(offset)) ^ mask);
  write_file_atomic(file, b);
}

TEST_F(RoutingLog, RoundTripKeepsEveryFieldWithAndWithoutRouterInputs) {
  auto rs = write_log(p, 30);
  const auto log = read_routing_log(p);
  EXPECT_EQ(log.header, header());
  ASSERT_EQ(log.records.size(), rs.size());
  for (size_t i = 0; i < rs.size(); ++i) expect_same(log.records[i], rs[i]);
  EXPECT_EQ(log.truncated_bytes, 0u);
  EXPECT_TRUE(log.warning.empty());
  EXPECT_EQ(log.header.model_hash, 0x1234abcdULL);
}

TEST_F(RoutingLog, AppendAcrossWritersKeepsOldRecordsAndContinuesRequestIds) {
  auto first = write_log(p, 9, 0);
  std::mt19937 rng(1);
  RoutingRecord extra;
  {
    RoutingLogWriter w(p, header());
    EXPECT_EQ(w.next_request_id(), 1u);
    extra = record(w.take_request_id(), 0, 2, false, rng);
    w.append(extra);
    w.close();
  }
  const auto log = read_routing_log(p);
  ASSERT_EQ(log.records.size(), 10u);
  for (size_t i = 0; i < 9; ++i) expect_same(log.records[i], first[i]);
  expect_same(log.records[9], extra);
  EXPECT_EQ(log.records[9].request_id, 1u);
}

TEST_F(RoutingLog, EveryTruncationPointYieldsOnlyWholeRecordsAndAWarning) {
  auto rs = write_log(p, 6);
  const std::string full = read_file(p);
  // Record boundaries from the format: 24 + 6k (+4*hidden) + 8 bytes each.
  std::vector<size_t> ends;
  size_t off = kRoutingLogHeaderBytes;
  for (const auto& r : rs) ends.push_back(off += 24 + 24 + (r.router_input.empty() ? 0 : 32) + 8);
  ASSERT_EQ(ends.back(), full.size());
  for (size_t cut = kRoutingLogHeaderBytes; cut < full.size(); ++cut) {
    put_file(p, std::string_view(full).substr(0, cut));
    const auto log = read_routing_log(p);
    size_t whole = 0;
    while (whole < ends.size() && ends[whole] <= cut) ++whole;
    ASSERT_EQ(log.records.size(), whole) << "cut at " << cut;
    for (size_t i = 0; i < whole; ++i) expect_same(log.records[i], rs[i]);
    const bool on_boundary = cut == kRoutingLogHeaderBytes || (whole && ends[whole - 1] == cut);
    EXPECT_EQ(log.warning.empty(), on_boundary) << "cut at " << cut;
    if (!on_boundary) EXPECT_NE(log.warning.find("truncated tail"), std::string::npos);
  }
}

TEST_F(RoutingLog, TornLastRecordFailsItsChecksumAndIsSkipped) {
  auto rs = write_log(p, 4);
  flip_bits(p, fs::file_size(p) - 12, 0x40);  // inside the last record's weights
  const auto log = read_routing_log(p);
  EXPECT_EQ(log.records.size(), 3u);
  EXPECT_NE(log.warning.find("checksum"), std::string::npos);
}

TEST_F(RoutingLog, CorruptRecordBeforeTheTailIsAnErrorNamingTheOffset) {
  write_log(p, 6);
  flip_bits(p, kRoutingLogHeaderBytes + 30, 0x01);  // first record's ids
  const std::string msg = test::error_message<FormatError>([&] { read_routing_log(p); });
  EXPECT_NE(msg.find("offset 64"), std::string::npos) << msg;
}

TEST_F(RoutingLog, AFlippedTagOrLengthInTheLastRecordIsCorruptionButZerosAreATornTail) {
  // An interrupted append leaves a prefix of a record, or zeros: never a wrong tag or length.
  auto rs = write_log(p, 4);
  const std::string full = read_file(p);
  const size_t last = full.size() - (24 + 24 + (rs.back().router_input.empty() ? 0 : 32) + 8);
  for (size_t at : {last, last + 4}) {
    put_file(p, full);
    flip_bits(p, at, 0x01);
    const std::string msg = test::error_message<FormatError>([&] { read_routing_log(p); });
    EXPECT_NE(msg.find("offset " + std::to_string(last)), std::string::npos) << msg;
  }
  std::string zeroed = full;
  std::fill(zeroed.begin() + long(last), zeroed.end(), '\0');
  put_file(p, zeroed);
  const auto log = read_routing_log(p);
  EXPECT_EQ(log.records.size(), 3u);
  EXPECT_NE(log.warning.find("truncated tail"), std::string::npos);
}

TEST_F(RoutingLog, AppendingToALogOfAnotherModelIsRefused) {
  write_log(p, 3);
  RoutingLogHeader other = header();
  other.model_hash ^= 1;
  EXPECT_THROW(RoutingLogWriter(p, other), ConfigError);
  RoutingLogHeader wider = header();
  wider.top_k = 2;
  EXPECT_THROW(RoutingLogWriter(p, wider), ConfigError);
  EXPECT_EQ(read_routing_log(p).records.size(), 3u);  // untouched
}

TEST_F(RoutingLog, AppendAfterACrashCutsTheTornTailFirst) {
  auto rs = write_log(p, 5);
  std::string b = read_file(p);
  write_file_atomic(p, std::string_view(b).substr(0, b.size() - 10));
  std::mt19937 rng(3);
  RoutingRecord extra = record(9, 0, 1, false, rng);
  {
    RoutingLogWriter w(p, header());
    EXPECT_NE(w.warning().find("truncated tail"), std::string::npos);
    w.append(extra);
    w.close();
  }
  const auto log = read_routing_log(p);
  EXPECT_TRUE(log.warning.empty());
  ASSERT_EQ(log.records.size(), 5u);
  expect_same(log.records[4], extra);
}

TEST_F(RoutingLog, BadHeaderIsAFormatError) {
  write_file_atomic(p, "not a routing log at all, but long enough to hold a header..........");
  EXPECT_THROW(read_routing_log(p), FormatError);
  fs::remove(p);
  write_log(p, 1);
  std::string b = read_file(p);
  b[28] = 5;  // n_experts: the header checksum must catch it
  write_file_atomic(p, b);
  EXPECT_THROW(read_routing_log(p), FormatError);
  write_file_atomic(p, b.substr(0, 20));
  EXPECT_THROW(read_routing_log(p), FormatError);
}

}  // namespace
}  // namespace moestream
