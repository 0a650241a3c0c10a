// Tests of the GGUF writer (loader/format/gguf_writer.h): round trips through the reader
// (GgufFile) of every metadata value type, alignment and tensor bytes; the temp-file protocol
// (nothing at the path before commit, an existing file untouched, no temp left behind); refusal
// to overwrite a source; and the tensor checks.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <memory>

#include "common/error.h"
#include "common/file_util.h"
#include "loader/format/gguf_file.h"
#include "loader/format/gguf_writer.h"
#include "tests/support/test_model.h"

namespace fs = std::filesystem;
using namespace moestream;
using VT = GgufValueType;

namespace {

std::shared_ptr<GgufArray> packed(VT t, const void* data, uint64_t n) {
  auto a = std::make_shared<GgufArray>(t);
  a->append_raw(data, n);
  return a;
}

// Metadata holding every value type, as scalars and as arrays, nested arrays and empty ones.
GgufMetadata all_types(std::optional<uint32_t> alignment) {
  GgufMetadata md("built");
  md.add("general.architecture", GgufValue::from_string("qwen3moe"));
  if (alignment) md.add("general.alignment", GgufValue::from_unsigned(VT::kU32, *alignment));
  md.add("t.u8", GgufValue::from_unsigned(VT::kU8, 250));
  md.add("t.i8", GgufValue::from_signed(VT::kI8, -100));
  md.add("t.u16", GgufValue::from_unsigned(VT::kU16, 65000));
  md.add("t.i16", GgufValue::from_signed(VT::kI16, -32000));
  md.add("t.u32", GgufValue::from_unsigned(VT::kU32, 4000000000u));
  md.add("t.i32", GgufValue::from_signed(VT::kI32, -2000000000));
  md.add("t.f32", GgufValue::from_float(VT::kF32, 0.15625));
  md.add("t.bool", GgufValue::from_unsigned(VT::kBool, 1));
  md.add("t.string", GgufValue::from_string(std::string("a\0b", 3)));
  md.add("t.u64", GgufValue::from_unsigned(VT::kU64, 0xfedcba9876543210ull));
  md.add("t.i64", GgufValue::from_signed(VT::kI64, -(int64_t(1) << 60)));
  md.add("t.f64", GgufValue::from_float(VT::kF64, -1.0 / 3.0));
  const float fs[3] = {1.5f, -2.0f, 1e-30f};
  md.add("a.f32", GgufValue::from_array(packed(VT::kF32, fs, 3)));
  const int16_t is[2] = {-7, 300};
  md.add("a.i16", GgufValue::from_array(packed(VT::kI16, is, 2)));
  const uint8_t bs[3] = {1, 0, 1};
  md.add("a.bool", GgufValue::from_array(packed(VT::kBool, bs, 3)));
  const uint64_t us[2] = {1, ~0ull};
  md.add("a.u64", GgufValue::from_array(packed(VT::kU64, us, 2)));
  md.add("a.empty", GgufValue::from_array(std::make_shared<GgufArray>(VT::kI32)));
  auto strs = std::make_shared<GgufArray>(VT::kString);
  strs->append_string("tok");
  strs->append_string("");
  strs->append_string("\xe2\x96\x81x");
  md.add("a.string", GgufValue::from_array(strs));
  auto nested = std::make_shared<GgufArray>(VT::kArray);
  const int32_t n0[2] = {3, -4};
  nested->append_array(packed(VT::kI32, n0, 2));
  nested->append_array(strs);
  md.add("a.nested", GgufValue::from_array(nested));
  return md;
}

std::vector<GgufTensorSpec> specs() {
  return {{"token_embd.weight", GgmlType::kF32, {5, 3}},      // 60 bytes: padding follows
          {"blk.0.ffn_up_exps.weight", GgmlType::kQ8_0, {64, 2, 3}},  // 6 rows of 68 bytes
          {"output_norm.weight", GgmlType::kF16, {7}}};
}

std::string pattern(uint64_t n, uint8_t seed) {
  std::string s(n, '\0');
  for (uint64_t i = 0; i < n; ++i) s[i] = char(uint8_t(seed + i * 31));
  return s;
}

std::string read_at(const fs::path& p, uint64_t off, uint64_t n) {
  const std::string all = read_file(p);
  EXPECT_LE(off + n, all.size());
  return all.substr(off, n);
}

class GgufWriterTest : public ::testing::Test {
 protected:
  // Writes specs() with pattern data in chunks of `chunk` bytes; returns the tensors' bytes.
  std::vector<std::string> write_model(const fs::path& p, const GgufMetadata& md, uint64_t chunk, uint32_t version = 3) {
    GgufWriterOptions o;
    o.version = version;
    GgufWriter w(p, md, specs(), o);
    std::vector<std::string> data;
    for (size_t i = 0; i < specs().size(); ++i) {
      data.push_back(pattern(w.tensor_bytes(i), uint8_t(i * 50 + 1)));
      for (uint64_t off = 0; off < data.back().size(); off += chunk)
        w.write(data.back().data() + off, std::min<uint64_t>(chunk, data.back().size() - off));
    }
    w.commit();
    return data;
  }
  TempDir dir_{"gguf_writer_test"};
};

TEST_F(GgufWriterTest, EveryValueTypeRoundTripsThroughTheReader) {
  const fs::path p = dir_.path() / "m.gguf";
  const GgufMetadata md = all_types(std::nullopt);
  write_model(p, md, 1000);
  const GgufFile f(p);
  EXPECT_EQ(f.version(), 3u);
  const GgufMetadata& r = f.metadata();
  ASSERT_EQ(r.size(), md.size());
  for (size_t i = 0; i < md.size(); ++i) {
    EXPECT_EQ(r.entries()[i].key, md.entries()[i].key);  // order kept
    EXPECT_EQ(r.entries()[i].value.type(), md.entries()[i].value.type()) << md.entries()[i].key;
    EXPECT_EQ(r.entries()[i].value.describe(), md.entries()[i].value.describe()) << md.entries()[i].key;
  }
  EXPECT_EQ(r.get_u32("t.u32"), 4000000000u);
  EXPECT_EQ(r.get_i64("t.i8"), -100);
  EXPECT_EQ(r.get_i64("t.i16"), -32000);
  EXPECT_EQ(r.get_u64("t.u16"), 65000u);
  EXPECT_EQ(r.get_u64("t.u8"), 250u);
  EXPECT_EQ(r.get_i32("t.i32"), -2000000000);
  EXPECT_EQ(r.get_f32("t.f32"), 0.15625f);
  EXPECT_TRUE(r.get_bool("t.bool"));
  EXPECT_EQ(r.get_string("t.string"), std::string("a\0b", 3));
  EXPECT_EQ(r.get_u64("t.u64"), 0xfedcba9876543210ull);
  EXPECT_EQ(r.get_i64("t.i64"), -(int64_t(1) << 60));
  EXPECT_EQ(r.get_f64("t.f64"), -1.0 / 3.0);
  EXPECT_EQ(r.get_f32_array("a.f32"), (std::vector<float>{1.5f, -2.0f, 1e-30f}));
  EXPECT_EQ(r.get_i64_array("a.i16"), (std::vector<int64_t>{-7, 300}));
  EXPECT_EQ(r.get_array("a.bool").elem_type(), VT::kBool);
  EXPECT_EQ(r.get_array("a.bool").raw(), std::string("\1\0\1", 3));
  EXPECT_EQ(r.get_array("a.u64").raw().size(), 16u);
  EXPECT_EQ(r.get_array("a.empty").size(), 0u);
  EXPECT_EQ(r.get_string_array("a.string"), (std::vector<std::string>{"tok", "", "\xe2\x96\x81x"}));
  const GgufArray& nested = r.get_array("a.nested");
  ASSERT_EQ(nested.size(), 2u);
  EXPECT_EQ(nested.element(0).to_array()->raw(), md.get_array("a.nested").element(0).to_array()->raw());
  EXPECT_EQ(nested.element(1).to_array()->string_at(2), "\xe2\x96\x81x");
  // The encoding is a fixed point: what was read encodes to the same bytes.
  EXPECT_EQ(encode_gguf_metadata(r), encode_gguf_metadata(md));
}

TEST_F(GgufWriterTest, TensorsKeepNamesShapesTypesAndBytesAtAlignedOffsets) {
  for (const std::optional<uint32_t> align : {std::optional<uint32_t>(), std::optional<uint32_t>(64), std::optional<uint32_t>(1)}) {
    const fs::path p = dir_.path() / ("a" + std::to_string(align.value_or(0)) + ".gguf");
    const std::vector<std::string> data = write_model(p, all_types(align), 7, 2);
    const GgufFile f(p);
    const uint32_t a = align.value_or(32);
    EXPECT_EQ(f.version(), 2u);
    EXPECT_EQ(f.alignment(), a);
    EXPECT_EQ(f.data_offset() % a, 0u);
    ASSERT_EQ(f.tensors().size(), specs().size());
    for (size_t i = 0; i < specs().size(); ++i) {
      const GgufTensor& t = f.tensors()[i];
      EXPECT_EQ(t.name, specs()[i].name);
      EXPECT_EQ(t.type, specs()[i].type);
      EXPECT_EQ(t.dims, specs()[i].dims);
      EXPECT_EQ((t.offset - f.data_offset()) % a, 0u) << t.name;
      EXPECT_EQ(read_at(p, t.offset, t.bytes), data[i]) << t.name;
    }
    EXPECT_EQ(f.tensors()[1].bytes, 6u * 68u);
  }
}

TEST_F(GgufWriterTest, NothingAppearsBeforeCommitAndAnAbandonedWriteLeavesNoTrace) {
  const fs::path p = dir_.path() / "m.gguf";
  write_file_atomic(p, "old contents");
  {
    GgufWriter w(p, all_types(std::nullopt), specs());
    const std::string d = pattern(w.tensor_bytes(0), 3);
    w.write(d.data(), d.size());
    EXPECT_TRUE(fs::exists(w.temp_path()));
    EXPECT_EQ(read_file(p), "old contents");
    EXPECT_THROW(w.commit(), ConfigError);  // tensor 1 has none of its bytes
  }
  EXPECT_EQ(read_file(p), "old contents");
  for (const auto& e : fs::directory_iterator(dir_.path())) EXPECT_EQ(e.path().filename(), "m.gguf");
  write_model(p, all_types(std::nullopt), 4096);
  EXPECT_NO_THROW(GgufFile{p});
}

TEST_F(GgufWriterTest, WritingPastTheLastTensorIsRefused) {
  GgufWriter w(dir_.path() / "m.gguf", all_types(std::nullopt), specs());
  uint64_t total = 0;
  for (size_t i = 0; i < specs().size(); ++i) total += w.tensor_bytes(i);
  const std::string d(total + 1, 'x');
  EXPECT_THROW(w.write(d.data(), d.size()), ConfigError);
}

TEST_F(GgufWriterTest, RefusesToOverwriteASourceByNameOrByLink) {
  const fs::path src = dir_.path() / "src.gguf";
  write_model(src, all_types(std::nullopt), 512);
  const std::string before = read_file(src);
  GgufWriterOptions o;
  o.protect = {src};
  EXPECT_THROW(GgufWriter(src, all_types(std::nullopt), specs(), o), ConfigError);
  EXPECT_THROW(GgufWriter(dir_.path() / "." / "src.gguf", all_types(std::nullopt), specs(), o), ConfigError);
  const fs::path link = dir_.path() / "link.gguf";
  fs::create_hard_link(src, link);
  EXPECT_THROW(GgufWriter(link, all_types(std::nullopt), specs(), o), ConfigError);
  EXPECT_EQ(read_file(src), before);
}

TEST_F(GgufWriterTest, BadTensorsAndAlignmentAreRefusedNamingThem) {
  const fs::path p = dir_.path() / "m.gguf";
  auto refused = [&](std::vector<GgufTensorSpec> t, const GgufMetadata& md, const std::string& needle) {
    try {
      GgufWriter w(p, md, std::move(t));
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(p));
  };
  const GgufMetadata md = all_types(std::nullopt);
  refused({{"x", GgmlType::kF32, {4}}, {"x", GgmlType::kF32, {4}}}, md, "'x': name given twice");
  refused({{"zero", GgmlType::kF32, {4, 0}}}, md, "'zero': a dim is 0");
  refused({{"", GgmlType::kF32, {4}}}, md, "'': name empty or too long");  // the reader refuses it
  refused({{"five", GgmlType::kF32, {1, 1, 1, 1, 1}}}, md, "'five'");
  refused({{"q", GgmlType::kQ8_0, {33}}}, md, "'q': row of 33");
  refused({{"big", GgmlType::kF32, {1ull << 32, 1ull << 32, 1ull << 32}}}, md, "'big': size overflows");
  refused({{"x", GgmlType::kF32, {4}}}, all_types(48), "general.alignment");
  GgufMetadata wrong_type("m");
  wrong_type.add("general.alignment", GgufValue::from_unsigned(VT::kU64, 32));
  refused({{"x", GgmlType::kF32, {4}}}, wrong_type, "general.alignment");
}

// What the reader would refuse is refused before any file exists: a key count over its limit, a
// key longer than its limit (which used to be found after the temp file was created, leaving it).
TEST_F(GgufWriterTest, MetadataOverTheReadersLimitsIsRefusedBeforeAnyFileExists) {
  const fs::path p = dir_.path() / "m.gguf";
  auto refused = [&](const GgufMetadata& md, const std::string& needle) {
    try {
      GgufWriter w(p, md, specs());
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_TRUE(fs::is_empty(dir_.path())) << needle;
  };
  GgufMetadata wide = all_types(std::nullopt);
  while (wide.size() <= kGgufMaxKeys) wide.add("pad." + std::to_string(wide.size()), GgufValue::from_unsigned(VT::kU8, 1));
  refused(wide, std::to_string(kGgufMaxKeys + 1) + " metadata keys, over the limit of " + std::to_string(kGgufMaxKeys));
  GgufMetadata long_key = all_types(std::nullopt);
  long_key.add(std::string(kGgufMaxKeyBytes + 1, 'k'), GgufValue::from_unsigned(VT::kU8, 1));
  refused(long_key, "over the limit of " + std::to_string(kGgufMaxKeyBytes));
  // At the limit: written and read back.
  GgufMetadata full = all_types(std::nullopt);
  while (full.size() < kGgufMaxKeys) full.add("pad." + std::to_string(full.size()), GgufValue::from_unsigned(VT::kU8, 1));
  write_model(p, full, 4096);
  EXPECT_EQ(GgufFile(p).metadata().size(), kGgufMaxKeys);
}

// commit() reads the temp file back before it appears at the path: bytes changed under the writer
// (the temp file's magic, overwritten once the writer flushed its first 8 MiB) fail the commit with
// the reader's error, and neither the path nor the temp file is left.
TEST_F(GgufWriterTest, ACommitThatDoesNotReadBackLeavesNothing) {
  const fs::path p = dir_.path() / "m.gguf";
  const std::vector<GgufTensorSpec> big = {{"big.weight", GgmlType::kF32, {1024, 2100}},  // 8.2 MiB: flushed
                                           {"small.weight", GgmlType::kF32, {4}}};
  {
    GgufWriter w(p, all_types(std::nullopt), big);
    const std::string d = pattern(w.tensor_bytes(0), 1);
    w.write(d.data(), d.size());
    ASSERT_GE(fs::file_size(w.temp_path()), 4u) << "the writer flushed nothing yet";
    test::overwrite_bytes(w.temp_path(), 0, "GGUX");
    const std::string s = pattern(w.tensor_bytes(1), 2);
    w.write(s.data(), s.size());
    const std::string msg = test::error_message<FormatError>([&] { w.commit(); });
    EXPECT_NE(msg.find(w.temp_path().string()), std::string::npos) << msg;
    EXPECT_NE(msg.find("bad magic"), std::string::npos) << msg;
    EXPECT_FALSE(fs::exists(p));
  }
  EXPECT_TRUE(fs::is_empty(dir_.path()));
}

}  // namespace
