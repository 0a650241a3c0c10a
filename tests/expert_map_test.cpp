// Tests of loader/format/expert_map.h: round trip, identity when absent, rejection of maps that
// are truncated, corrupt, not permutations, or sized for another layer, and the binding of a map
// to its layer file (a map written for another slot order, layer or model is refused).
#include <gtest/gtest.h>

#include <xxhash.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/file_util.h"
#include "loader/format/expert_file.h"
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
  EXPECT_EQ(fs::file_size(expert_map_path(d.path(), 7)), 24u + 4 * 5);  // unbound: version 1
  EXPECT_FALSE(back.file_binding());
  write_expert_map(expert_map_path(d.path(), 7), m.bound_to(0x0123456789abcdefull));
  back = load_expert_map(d.path(), 7, 5);
  EXPECT_EQ(back.slots(), m.slots());
  ASSERT_TRUE(back.file_binding());
  EXPECT_EQ(*back.file_binding(), 0x0123456789abcdefull);
  const std::string bytes = read_file(expert_map_path(d.path(), 7));
  EXPECT_EQ(bytes.size(), 32u + 4 * 5);
  uint32_t version;
  std::memcpy(&version, bytes.data() + 8, 4);
  EXPECT_EQ(version, kExpertMapVersion);
}

// Two layers of one model and one layer of another, with random payloads in original order.
struct BoundFixture {
  TempDir d{"expert_map_test"};
  ModelConfig cfg = test::tiny_moe_config({});  // 2 layers of 8 experts
  fs::path model = d.path() / "a", other = d.path() / "b";
  BoundFixture() {
    test::write_layer_files(model, cfg, 1);
    test::write_layer_files(other, cfg, 2);
  }
  ExpertMap load(const fs::path& dir, int l) {
    return load_bound_expert_map(expert_map_path(dir, l), read_expert_header(expert_file_path(dir, l)),
                                 expert_file_path(dir, l));
  }
  uint64_t table(const fs::path& dir, int l) {
    return slot_table_hash(read_expert_header(expert_file_path(dir, l)).slot_checksums);
  }
};

TEST(ExpertMapBinding, BoundMapLoadsAndAbsentMapIsIdentity) {
  BoundFixture f;
  EXPECT_TRUE(f.load(f.model, 0).is_identity());
  const ExpertMap m = ExpertMap::from_slots({1, 0, 3, 2, 5, 4, 7, 6});
  write_expert_map(expert_map_path(f.model, 0), m.bound_to(f.table(f.model, 0)));
  EXPECT_EQ(f.load(f.model, 0).slots(), m.slots());
}

TEST(ExpertMapBinding, MapBoundToAnotherSlotOrderIsRefusedNamingBothFiles) {
  // What cluster_experts --maps-out writes: bound to the table the repacked file would have.
  BoundFixture f;
  const ExpertMap m = ExpertMap::from_slots({1, 0, 3, 2, 5, 4, 7, 6});
  std::vector<uint64_t> repacked(8);
  const ExpertFileHeader h = read_expert_header(expert_file_path(f.model, 0));
  for (uint32_t s = 0; s < 8; ++s) repacked[s] = h.slot_checksums[m.logical(s)];
  write_expert_map(expert_map_path(f.model, 0), m.bound_to(slot_table_hash(repacked)));
  const std::string msg = error_of([&] { f.load(f.model, 0); });
  EXPECT_NE(msg.find("layer_000.map does not describe"), std::string::npos) << msg;
  EXPECT_NE(msg.find(expert_file_path(f.model, 0).string()), std::string::npos) << msg;
}

TEST(ExpertMapBinding, MapOfAnotherLayerOrModelIsRefused) {
  BoundFixture f;
  const ExpertMap m = ExpertMap::from_slots({2, 3, 0, 1, 6, 7, 4, 5});
  write_expert_map(expert_map_path(f.model, 1), m.bound_to(f.table(f.model, 1)));
  EXPECT_EQ(f.load(f.model, 1).slots(), m.slots());
  fs::copy_file(expert_map_path(f.model, 1), expert_map_path(f.model, 0));  // another layer
  EXPECT_NE(error_of([&] { f.load(f.model, 0); }).find("does not describe"), std::string::npos);
  fs::copy_file(expert_map_path(f.model, 1), expert_map_path(f.other, 1));  // another model
  EXPECT_NE(error_of([&] { f.load(f.other, 1); }).find("does not describe"), std::string::npos);
  // Even the identity, once bound, belongs to one file only.
  write_expert_map(expert_map_path(f.other, 0), ExpertMap::identity(8).bound_to(f.table(f.model, 0)));
  EXPECT_NE(error_of([&] { f.load(f.other, 0); }).find("does not describe"), std::string::npos);
}

TEST(ExpertMapBinding, LegacyMapIsAcceptedOnlyAsTheIdentity) {
  BoundFixture f;
  write_expert_map(expert_map_path(f.model, 0), ExpertMap::identity(8));  // version 1
  EXPECT_TRUE(f.load(f.model, 0).is_identity());
  write_expert_map(expert_map_path(f.model, 0), ExpertMap::from_slots({1, 0, 2, 3, 4, 5, 6, 7}));
  const std::string msg = error_of([&] { f.load(f.model, 0); });
  EXPECT_NE(msg.find("version-1 map"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--bind-legacy-maps"), std::string::npos) << msg;
  EXPECT_NE(msg.find("layer_000.bin"), std::string::npos) << msg;
}

TEST(ExpertMapBinding, BindingIsCoveredByTheChecksumAndAnUnknownVersionIsRefused) {
  BoundFixture f;
  const fs::path p = expert_map_path(f.model, 0);
  write_expert_map(p, ExpertMap::identity(8).bound_to(f.table(f.model, 0)));
  std::string b = read_file(p);
  b[16 + 4 * 8] ^= 1;  // the binding
  write_file_atomic(p, b);
  EXPECT_NE(error_of([&] { f.load(f.model, 0); }).find("checksum mismatch"), std::string::npos);
  b[16 + 4 * 8] ^= 1;
  b[8] = 3;  // version 3
  write_file_atomic(p, b);
  EXPECT_NE(error_of([&] { f.load(f.model, 0); }).find("unsupported version 3"), std::string::npos);
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
  const uint64_t binding = 42;
  bytes.append(reinterpret_cast<const char*>(&binding), 8);
  uint64_t sum = XXH64(bytes.data(), bytes.size(), 0);
  bytes.append(reinterpret_cast<const char*>(&sum), 8);
  std::string msg = error_of([&] { decode_expert_map(bytes, "/m/layer_003.map"); });
  EXPECT_NE(msg.find("/m/layer_003.map"), std::string::npos) << msg;
  EXPECT_NE(msg.find("not a permutation"), std::string::npos) << msg;
}

TEST(ExpertMap, TruncatedFileIsRejectedNamingTheFile) {
  for (const std::string& bytes : {encode_expert_map(ExpertMap::identity(16)),
                                   encode_expert_map(ExpertMap::identity(16).bound_to(7))}) {
    for (size_t cut : {size_t{0}, size_t{10}, size_t{20}, bytes.size() - 1}) {
      std::string msg = error_of([&] { decode_expert_map(bytes.substr(0, cut), "/x/layer_001.map"); });
      EXPECT_NE(msg.find("/x/layer_001.map"), std::string::npos) << cut << ": " << msg;
      EXPECT_NE(msg.find("truncated"), std::string::npos) << cut << ": " << msg;
    }
  }
}

TEST(ExpertMap, BadMagicVersionAndChecksumAreRejected) {
  for (const std::string& good : {encode_expert_map(ExpertMap::identity(4)),
                                  encode_expert_map(ExpertMap::identity(4).bound_to(7))}) {
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
