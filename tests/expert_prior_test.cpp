// Tests of loader/format/expert_prior.h: counting routing logs, the round trip, and a parser that
// refuses every hostile field (sizes, magic, version, reserved, checksum, shares).
#include <gtest/gtest.h>

#include <xxhash.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include <unistd.h>

#include "common/error.h"
#include "loader/format/expert_prior.h"

namespace moestream {
namespace {

RoutingLog log_of(uint32_t n_layers, uint32_t n_experts, std::vector<std::vector<uint16_t>> per_record) {
  RoutingLog log;
  log.header.n_layers = n_layers;
  log.header.n_experts = n_experts;
  log.header.top_k = uint32_t(per_record.at(0).size());
  log.header.model_hash = 42;
  for (size_t i = 0; i < per_record.size(); ++i) {
    RoutingRecord r;
    r.layer = uint16_t(i % n_layers);
    r.ids = per_record[i];
    log.records.push_back(r);
  }
  return log;
}

ExpertPrior sample() {
  const std::vector<RoutingLog> logs{log_of(2, 4, {{0, 1}, {2, 3}, {0, 2}, {2, 3}})};
  return expert_prior_from_logs(logs);
}

// Replaces the checksum after an edit, so the parser's other checks are what refuses.
std::string resealed(std::string b) {
  const uint64_t h = XXH64(b.data(), b.size() - 8, 0);
  std::memcpy(b.data() + b.size() - 8, &h, 8);
  return b;
}

template <class T>
std::string with(std::string b, size_t at, T v) {
  std::memcpy(b.data() + at, &v, sizeof(T));
  return resealed(b);
}

TEST(ExpertPrior, CountsEachLayersShare) {
  const ExpertPrior p = sample();
  EXPECT_EQ(p.n_layers, 2u);
  EXPECT_EQ(p.n_experts, 4u);
  EXPECT_EQ(p.tokens, 4u);
  EXPECT_EQ(p.model_hash, 42u);
  // Layer 0 saw {0,1} and {0,2}: 0 half, 1 and 2 a quarter each; layer 1 saw {2,3} twice.
  EXPECT_EQ(p.share, (std::vector<float>{0.5f, 0.25f, 0.25f, 0, 0, 0, 0.5f, 0.5f}));
  const std::vector<RoutingLog> mixed{log_of(2, 4, {{0}}), log_of(2, 8, {{0}})};
  EXPECT_THROW(expert_prior_from_logs(mixed), ConfigError);
  EXPECT_THROW(expert_prior_from_logs(std::span<const RoutingLog>{}), ConfigError);
}

TEST(ExpertPrior, RoundTripsThroughAFile) {
  const ExpertPrior p = sample();
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("expert_prior_test_" + std::to_string(::getpid()) + ".prior");
  write_expert_prior(path, p);
  const ExpertPrior q = read_expert_prior(path);
  std::filesystem::remove(path);
  EXPECT_EQ(q.share, p.share);
  EXPECT_EQ(q.n_layers, 2u);
  EXPECT_EQ(q.tokens, 4u);
  EXPECT_EQ(q.model_hash, 42u);
  EXPECT_THROW(read_expert_prior(path), IoError);
}

TEST(ExpertPrior, RefusesEveryHostileField) {
  const std::string good = encode_expert_prior(sample());
  ASSERT_EQ(good.size(), 48u + 4 * 8);
  EXPECT_NO_THROW(decode_expert_prior(good, "p"));
  auto refused = [](const std::string& b) {
    EXPECT_THROW(decode_expert_prior(b, "p"), FormatError);
  };
  refused("");
  refused(good.substr(0, 47));
  refused(good.substr(0, good.size() - 1));                       // truncated
  refused(good + std::string(4, '\0'));                           // trailing bytes
  std::string flipped = good;
  flipped[45] ^= 1;                                               // a share bit: checksum
  refused(flipped);
  refused(resealed("XOEPRIOR" + good.substr(8)));                 // magic
  refused(with(good, 8, uint32_t{2}));                            // version
  refused(with(good, 12, uint32_t{0}));                           // no layers
  refused(with(good, 16, uint32_t{70000}));                       // too many experts
  refused(with(good, 12, uint32_t{65535}));                       // claims more than the file has
  refused(with(good, 20, uint32_t{1}));                           // reserved
  refused(with(good, 40, std::numeric_limits<float>::quiet_NaN()));
  refused(with(good, 40, std::numeric_limits<float>::infinity()));
  refused(with(good, 40, -0.25f));
  refused(with(good, 40, 1.5f));
  refused(with(good, 40, 0.75f));                                 // layer 0 sums to 1.25
  // A layer never routed (all zero) is valid.
  std::string zero = good;
  std::memset(zero.data() + 40, 0, 16);
  EXPECT_NO_THROW(decode_expert_prior(resealed(zero), "p"));
}

}  // namespace
}  // namespace moestream
