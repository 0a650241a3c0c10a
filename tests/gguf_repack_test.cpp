// Tests of the GGUF repack (cluster/gguf_repack.h) on a fixture GGUF made by llama.cpp
// (tests/fixtures/gguf/): a failure at every point leaves no output, no temp file and the source
// and any earlier output untouched; a source that shrinks during the copy is refused; bad orders
// are refused; two repacks compose their permutations relative to the original; every expert
// slice lands where the order says.
#include <gtest/gtest.h>

#include <unistd.h>

#include "cluster/gguf_repack.h"
#include "common/error.h"
#include "common/file_util.h"
#include "loader/format/gguf_file.h"
#include "tests/support/gguf_rewrite.h"
#include "tests/support/strict_skip.h"
#include "tests/support/test_model.h"

namespace fs = std::filesystem;
using namespace moestream;
using namespace moestream::cluster;

namespace {

const fs::path kFixture = fs::path(MOESTREAM_SOURCE_DIR) / "tests/fixtures/gguf/qwen3moe-tiny-Q8_0.gguf";

std::vector<uint32_t> recorded(const GgufFile& f, int layer) {
  std::vector<uint32_t> p;
  for (int64_t v : f.metadata().get_i64_array(kGgufPermutationKey + std::to_string(layer))) p.push_back(uint32_t(v));
  return p;
}

std::string tensor_bytes(const GgufFile& f, const std::string& name) {
  const GgufTensor& t = f.tensor(name);
  return read_file(f.path()).substr(t.offset, t.bytes);
}

class GgufRepackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kFixture)) MOESTREAM_SKIP_OR_FAIL() << kFixture << " absent";
    src_ = dir_.path() / "src.gguf";
    fs::copy_file(kFixture, src_);
    const GgufFile f(src_);
    n_layers_ = uint32_t(f.metadata().get_u32("qwen3moe.block_count"));
    n_experts_ = uint32_t(f.metadata().get_u32("qwen3moe.expert_count"));
  }
  std::vector<std::vector<uint32_t>> rotation(uint32_t by) const {
    std::vector<std::vector<uint32_t>> o(n_layers_, std::vector<uint32_t>(n_experts_));
    for (uint32_t l = 0; l < n_layers_; ++l)
      for (uint32_t i = 0; i < n_experts_; ++i) o[l][i] = (i + by + l) % n_experts_;
    return o;
  }
  void expect_only(const std::vector<std::string>& names) const {
    std::vector<std::string> have;
    for (const auto& e : fs::directory_iterator(dir_.path())) have.push_back(e.path().filename().string());
    std::sort(have.begin(), have.end());
    EXPECT_EQ(have, names);
  }
  TempDir dir_{"gguf_repack_test"};
  fs::path src_;
  uint32_t n_layers_ = 0, n_experts_ = 0;
};

TEST_F(GgufRepackTest, EverySliceLandsWhereTheOrderSays) {
  const fs::path out = dir_.path() / "out.gguf";
  const GgufRepackResult r = repack_gguf_experts(src_, out, rotation(1));
  EXPECT_EQ(r.bytes_written, fs::file_size(out));
  EXPECT_EQ(r.tensors_permuted, 4 * n_layers_);
  const GgufFile a(src_), b(out);
  for (uint32_t l = 0; l < n_layers_; ++l) {
    EXPECT_EQ(recorded(b, int(l)), rotation(1)[l]);
    for (const char* m : {"ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"}) {
      const std::string name = "blk." + std::to_string(l) + "." + m + ".weight";
      const std::string x = tensor_bytes(a, name), y = tensor_bytes(b, name);
      ASSERT_EQ(x.size(), y.size());
      const size_t s = x.size() / n_experts_;
      for (uint32_t i = 0; i < n_experts_; ++i)
        EXPECT_EQ(y.substr(i * s, s), x.substr(rotation(1)[l][i] * s, s)) << name << " position " << i;
    }
  }
  EXPECT_EQ(tensor_bytes(a, "token_embd.weight"), tensor_bytes(b, "token_embd.weight"));
  EXPECT_EQ(b.metadata().get_u64(kGgufPermutationSourceKey), model_identity_hash(src_));
}

TEST_F(GgufRepackTest, SecondRepackComposesRelativeToTheOriginal) {
  const fs::path once = dir_.path() / "once.gguf", twice = dir_.path() / "twice.gguf";
  repack_gguf_experts(src_, once, rotation(1));
  repack_gguf_experts(once, twice, rotation(2));
  const GgufFile t(twice);
  for (uint32_t l = 0; l < n_layers_; ++l) {
    std::vector<uint32_t> want(n_experts_);
    for (uint32_t i = 0; i < n_experts_; ++i) want[i] = rotation(1)[l][rotation(2)[l][i]];
    EXPECT_EQ(recorded(t, int(l)), want);
  }
  EXPECT_EQ(t.metadata().get_u64(kGgufPermutationSourceKey), model_identity_hash(src_));
  const GgufLayout g = read_gguf_layout(twice, IoEngineOptions{});
  EXPECT_EQ(g.source_hash, model_identity_hash(src_));
  EXPECT_EQ(g.permutation[0], recorded(t, 0));
}

TEST_F(GgufRepackTest, AFailureAtAnyPointLeavesNoOutputAndTheSourceUntouched) {
  const fs::path out = dir_.path() / "out.gguf";
  write_file_atomic(out, "earlier output");
  const std::string before = read_file(src_);
  std::vector<std::string> points;
  for (uint32_t l = 0; l < n_layers_; ++l) points.push_back("layer " + std::to_string(l) + " written");
  points.push_back("before commit");
  for (const std::string& p : points) {
    GgufRepackOptions o;
    o.fault = [&](const std::string& at) {
      if (at == p) throw IoError("injected at " + at);
    };
    EXPECT_THROW(repack_gguf_experts(src_, out, rotation(1), o), IoError) << p;
    EXPECT_EQ(read_file(src_), before);
    EXPECT_EQ(read_file(out), "earlier output");
    expect_only({"out.gguf", "src.gguf"});
  }
  repack_gguf_experts(src_, out, rotation(1));
  EXPECT_NO_THROW(GgufFile{out});
}

TEST_F(GgufRepackTest, ASourceThatShrinksDuringTheCopyIsRefused) {
  GgufRepackOptions o;
  o.fault = [&](const std::string& at) {
    if (at == "layer 0 written") fs::resize_file(src_, fs::file_size(src_) / 2);
  };
  const fs::path out = dir_.path() / "out.gguf";
  try {
    repack_gguf_experts(src_, out, rotation(1), o);
    ADD_FAILURE() << "a shrunk source was copied";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("shrank"), std::string::npos) << e.what();
  }
  expect_only({"src.gguf"});
}

TEST_F(GgufRepackTest, BadOrdersAndTheSourceAsOutputAreRefused) {
  const fs::path out = dir_.path() / "out.gguf";
  auto bad = rotation(0);
  bad[0][0] = bad[0][1];
  EXPECT_THROW(repack_gguf_experts(src_, out, bad), ConfigError);
  bad = rotation(0);
  bad.pop_back();
  EXPECT_THROW(repack_gguf_experts(src_, out, bad), ConfigError);
  bad = rotation(0);
  bad[0].push_back(n_experts_);
  EXPECT_THROW(repack_gguf_experts(src_, out, bad), ConfigError);
  const std::string before = read_file(src_);
  EXPECT_THROW(repack_gguf_experts(src_, src_, rotation(1)), ConfigError);
  EXPECT_EQ(read_file(src_), before);
  expect_only({"src.gguf"});
  EXPECT_EQ(order_of_slots({2, 0, 1}), (std::vector<uint32_t>{1, 2, 0}));
  EXPECT_THROW(order_of_slots({0, 0}), ConfigError);
}

// The reader takes at most kGgufMaxKeys metadata keys; the repack adds its permutation keys to the
// source's, so a source at the limit has no output this build could read: refused before any
// output or temp file exists (it was written, then refused by the check after the rename, and left).
TEST_F(GgufRepackTest, ASourceAtTheKeyLimitGetsNoOutputTheReaderWouldRefuse) {
  const fs::path wide = dir_.path() / "wide.gguf";
  test::GgufRewrite r;
  for (uint64_t n = GgufFile(src_).metadata().size(); n < kGgufMaxKeys; ++n)
    r.meta["pad." + std::to_string(n)] = GgufValue::from_unsigned(GgufValueType::kU8, 1);
  test::rewrite_gguf(src_, wide, r);
  ASSERT_EQ(GgufFile(wide).metadata().size(), kGgufMaxKeys);
  const std::string msg = test::error_message<ConfigError>([&] { repack_gguf_experts(wide, dir_.path() / "out.gguf", rotation(1)); });
  EXPECT_NE(msg.find(std::to_string(kGgufMaxKeys + 1 + n_layers_) + " metadata keys, over the limit of " +
                     std::to_string(kGgufMaxKeys)),
            std::string::npos)
      << msg;
  expect_only({"src.gguf", "wide.gguf"});
}

}  // namespace
