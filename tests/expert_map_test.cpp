// Tests of loader/format/expert_map.h: round trip, identity when absent, and rejection of maps that
// are truncated, corrupt, not permutations, or sized for another layer.
#include <gtest/gtest.h>

#include <xxhash.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/file_util.h"
#include "loader/format/expert_map.h"
#include "tests/support/test_model.h"

namespace fs = std::filesystem;
using namespace moestream;

namespace {

// The FormatError's message; another exception type fails the test.
std::string error_of(const std::function<void()>& f) { return test::error_message<FormatError>(f); }

TEST(ExpertMap, WriteThenLoadRoundTrips) {
  TempDir d("expert_map_test");
  fs::create_directories(d.path() / "experts");
  ExpertMap m = ExpertMap::from_slots({3, 0, 4, 1, 2});
  write_expert_map(expert_map_path(d.path(), 7), m);
  EXPECT_EQ(expert_map_path(d.path(), 7).filename(), "layer_007.map");
  ExpertMap back = load_expert_map(d.path(), 7, 5);
  EXPECT_EQ(back.slots(), m.slots());
  for (uint32_t i = 0; i < 5; ++i) EXPECT_EQ(back.logical(back.physical(i)), i);
  EXPECT_FALSE(back.is_identity());
  EXPECT_EQ(fs::file_size(expert_map_path(d.path(), 7)), 24u + 4 * 5);
}

TEST(ExpertMap, AbsentFileMeansIdentity) {
  TempDir d("expert_map_test");
  ExpertMap m = load_expert_map(d.path(), 0, 128);
  EXPECT_EQ(m.size(), 128u);
  EXPECT_TRUE(m.is_identity());
  EXPECT_EQ(m.physical(77), 77u);
}

TEST(ExpertMap, DuplicateSlotIsNotAPermutation) {
  std::string msg = error_of([] { ExpertMap::from_slots({0, 2, 2, 1}); });
  EXPECT_NE(msg.find("not a permutation"), std::string::npos) << msg;
  EXPECT_NE(msg.find("slot 2"), std::string::npos) << msg;
}

TEST(ExpertMap, OutOfRangeSlotIsRejected) {
  std::string msg = error_of([] { ExpertMap::from_slots({0, 1, 9}); });
  EXPECT_NE(msg.find("out of range"), std::string::npos) << msg;
}

TEST(ExpertMap, DecodeRejectsNonPermutationWithAValidChecksum) {
  // A well-formed file (magic, version, size, checksum all right) whose entries repeat a slot.
  std::string bytes(kExpertMapMagic, 8);
  auto put32 = [&](uint32_t v) { bytes.append(reinterpret_cast<const char*>(&v), 4); };
  put32(kExpertMapVersion);
  put32(3);
  for (uint32_t v : {1u, 1u, 2u}) put32(v);
  uint64_t sum = XXH64(bytes.data(), bytes.size(), 0);
  bytes.append(reinterpret_cast<const char*>(&sum), 8);
  std::string msg = error_of([&] { decode_expert_map(bytes, "/m/layer_003.map"); });
  EXPECT_NE(msg.find("/m/layer_003.map"), std::string::npos) << msg;
  EXPECT_NE(msg.find("not a permutation"), std::string::npos) << msg;
}

TEST(ExpertMap, TruncatedFileIsRejectedNamingTheFile) {
  std::string bytes = encode_expert_map(ExpertMap::identity(16));
  for (size_t cut : {size_t{0}, size_t{10}, size_t{20}, bytes.size() - 1}) {
    std::string msg = error_of([&] { decode_expert_map(bytes.substr(0, cut), "/x/layer_001.map"); });
    EXPECT_NE(msg.find("/x/layer_001.map"), std::string::npos) << cut << ": " << msg;
    EXPECT_NE(msg.find("truncated"), std::string::npos) << cut << ": " << msg;
  }
}

TEST(ExpertMap, BadMagicVersionAndChecksumAreRejected) {
  std::string good = encode_expert_map(ExpertMap::identity(4));
  std::string bad_magic = good;
  bad_magic[0] = 'X';
  EXPECT_NE(error_of([&] { decode_expert_map(bad_magic, "m"); }).find("magic"), std::string::npos);
  std::string bad_version = good;
  bad_version[8] = 9;
  EXPECT_NE(error_of([&] { decode_expert_map(bad_version, "m"); }).find("version"), std::string::npos);
  std::string bad_sum = good;
  bad_sum[16] ^= 1;
  EXPECT_NE(error_of([&] { decode_expert_map(bad_sum, "m"); }).find("checksum"), std::string::npos);
  std::string oversized = good + "x";
  EXPECT_NE(error_of([&] { decode_expert_map(oversized, "m"); }).find("oversized"), std::string::npos);
}

TEST(ExpertMap, MapForAnotherExpertCountIsRejected) {
  TempDir d("expert_map_test");
  fs::create_directories(d.path() / "experts");
  write_expert_map(expert_map_path(d.path(), 2), ExpertMap::identity(8));
  std::string msg = error_of([&] { load_expert_map(d.path(), 2, 16); });
  EXPECT_NE(msg.find("layer_002.map"), std::string::npos) << msg;
  EXPECT_NE(msg.find("16"), std::string::npos) << msg;
}

TEST(ExpertMap, RewriteIsAtomicAndLeavesNoTempFile) {
  TempDir d("expert_map_test");
  fs::create_directories(d.path() / "experts");
  fs::path p = expert_map_path(d.path(), 0);
  write_expert_map(p, ExpertMap::identity(4));
  write_expert_map(p, ExpertMap::from_slots({3, 2, 1, 0}));
  EXPECT_EQ(read_expert_map(p).slots(), (std::vector<uint32_t>{3, 2, 1, 0}));
  int n = 0;
  for (auto& e : fs::directory_iterator(d.path() / "experts")) { (void)e; ++n; }
  EXPECT_EQ(n, 1);
}

}  // namespace
