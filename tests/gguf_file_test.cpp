// Tests of the GGUF reader (loader/format/gguf_file.h): a valid file read field by field, every
// metadata type and getter, each class of corruption refused with a FormatError naming the file
// and the key or tensor, and split sets.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <cmath>
#include <cstring>

#include "common/error.h"
#include "common/file_util.h"
#include "loader/format/gguf_file.h"
#include "tests/support/gguf_builder.h"
#include "tests/support/test_model.h"

namespace fs = std::filesystem;
using namespace moestream;
using test::GgufBuilder;
using test::gguf_str;
using test::gguf_u32;
using test::gguf_u64;

namespace {

constexpr uint32_t kTypeF32 = 0, kTypeQ8_0 = 8, kTypeQ4_K = 12;
// GGUF value type ids.
constexpr uint32_t kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
                   kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12;

template <typename T>
std::string le(T v) {
  return std::string(reinterpret_cast<const char*>(&v), sizeof v);
}

std::string array_of(uint32_t elem, const std::vector<std::string>& encoded) {
  std::string s = gguf_u32(elem) + gguf_u64(encoded.size());
  for (const auto& e : encoded) s += e;
  return s;
}

GgufBuilder valid_builder() {
  GgufBuilder b;
  b.kv_string("general.architecture", "qwen3moe")
      .kv_u32("qwen3moe.block_count", 2)
      .kv("tokenizer.ggml.tokens", kArray, array_of(kString, {gguf_str("a"), gguf_str(""), gguf_str("<s>")}))
      .tensor("token_embd.weight", {64, 3}, kTypeF32)
      .tensor("blk.0.ffn_up_exps.weight", {256, 2, 4}, kTypeQ4_K)
      .tensor("output_norm.weight", {32}, kTypeQ8_0);
  return b;
}

class GgufFileTest : public ::testing::Test {
 protected:
  fs::path write(const std::string& bytes, const std::string& name = "model.gguf") {
    const fs::path p = dir_.path() / name;
    test::write_bytes(p, bytes);
    return p;
  }
  // The FormatError message of opening `bytes`; fails the test on any other outcome.
  std::string open_error(const std::string& bytes) {
    const fs::path p = write(bytes);
    return test::error_message<FormatError>([&] { GgufFile f(p); });
  }
  TempDir dir_{"gguf_test"};
};

TEST_F(GgufFileTest, ReadsHeaderMetadataAndTensors) {
  const GgufBuilder b = valid_builder();
  const std::string bytes = b.build();
  const fs::path p = write(bytes);
  GgufFile f(p);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.data_offset() % 32, 0u);
  EXPECT_EQ(f.file_bytes(), bytes.size());
  ASSERT_EQ(f.metadata().size(), 3u);
  EXPECT_EQ(f.metadata().entries()[0].key, "general.architecture");
  EXPECT_EQ(f.metadata().entries()[2].key, "tokenizer.ggml.tokens");
  EXPECT_EQ(f.metadata().get_string("general.architecture"), "qwen3moe");
  EXPECT_EQ(f.metadata().get_u32("qwen3moe.block_count"), 2u);
  EXPECT_EQ(f.metadata().get_string_array("tokenizer.ggml.tokens"), (std::vector<std::string>{"a", "", "<s>"}));

  ASSERT_EQ(f.tensors().size(), 3u);
  const GgufTensor& q = f.tensor("blk.0.ffn_up_exps.weight");
  EXPECT_EQ(q.type, GgmlType::kQ4_K);
  EXPECT_EQ(q.dims, (std::vector<uint64_t>{256, 2, 4}));
  EXPECT_EQ(q.n_elements, 2048u);
  EXPECT_EQ(q.rows(), 8u);
  EXPECT_EQ(q.bytes, 8u * 144);  // one 256-element Q4_K block per row
  // The builder fills tensor i's bytes with i + 1: offsets are absolute and sizes exact.
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const GgufTensor& t = f.tensors()[i];
    EXPECT_EQ(t.bytes, b.data_bytes(i));
    EXPECT_EQ(t.offset % 32, 0u);
    EXPECT_EQ(bytes[t.offset], char(i + 1)) << t.name;
    EXPECT_EQ(bytes[t.offset + t.bytes - 1], char(i + 1)) << t.name;
    EXPECT_EQ(t.shard, 0u);
  }
  EXPECT_EQ(f.tensor("token_embd.weight").offset, f.data_offset());
  EXPECT_EQ(f.find_tensor("missing"), nullptr);
  const std::string msg = test::error_message<FormatError>([&] { f.tensor("missing"); });
  EXPECT_NE(msg.find(p.string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("'missing'"), std::string::npos) << msg;
}

TEST_F(GgufFileTest, VersionTwoAndEmptyFileAreRead) {
  GgufBuilder b = valid_builder();
  b.version = 2;
  EXPECT_EQ(GgufFile(write(b.build())).version(), 2u);
  GgufBuilder empty;
  GgufFile e(write(empty.build()));
  EXPECT_EQ(e.tensors().size(), 0u);
  EXPECT_EQ(e.metadata().size(), 0u);
}

TEST_F(GgufFileTest, EveryValueTypeAndGetter) {
  GgufBuilder b;
  b.kv("u8", kU8, le<uint8_t>(200))
      .kv("i8", kI8, le<int8_t>(-100))
      .kv("u16", kU16, le<uint16_t>(60000))
      .kv("i16", kI16, le<int16_t>(-30000))
      .kv("u32", kU32, le<uint32_t>(4000000000u))
      .kv("i32", kI32, le<int32_t>(-5))
      .kv("i32pos", kI32, le<int32_t>(7))
      .kv("f32", kF32, le<float>(0.25f))
      .kv("bool", kBool, le<uint8_t>(1))
      .kv("string", kString, gguf_str("héllo"))
      .kv("u64", kU64, le<uint64_t>(~0ull))
      .kv("i64", kI64, le<int64_t>(-(1ll << 40)))
      .kv("f64", kF64, le<double>(1e300))
      .kv("f32s", kArray, array_of(kF32, {le<float>(1.5f), le<float>(-2)}))
      .kv("i32s", kArray, array_of(kI32, {le<int32_t>(-1), le<int32_t>(3)}))
      .kv("u64s", kArray, array_of(kU64, {le<uint64_t>(~0ull)}))
      .kv("bools", kArray, array_of(kBool, {le<uint8_t>(0), le<uint8_t>(1)}))
      .kv("empty", kArray, array_of(kU8, {}))
      .kv("nested", kArray, array_of(kArray, {array_of(kI16, {le<int16_t>(4)}), array_of(kString, {gguf_str("x")})}));
  GgufFile f(write(b.build()));
  const GgufMetadata& m = f.metadata();
  EXPECT_EQ(m.get_u32("u8"), 200u);
  EXPECT_EQ(m.get_i32("i8"), -100);
  EXPECT_EQ(m.get_u32("u16"), 60000u);
  EXPECT_EQ(m.get_i64("i16"), -30000);
  EXPECT_EQ(m.get_u32("u32"), 4000000000u);
  EXPECT_EQ(m.get_u64("u32"), 4000000000u);
  EXPECT_EQ(m.get_i32("i32"), -5);
  EXPECT_EQ(m.get_u32("i32pos"), 7u);  // any integer type whose value fits
  EXPECT_EQ(m.get_f32("f32"), 0.25f);
  EXPECT_EQ(m.get_f64("f32"), 0.25);
  EXPECT_TRUE(m.get_bool("bool"));
  EXPECT_EQ(m.get_string("string"), "héllo");
  EXPECT_EQ(m.get_u64("u64"), ~0ull);
  EXPECT_EQ(m.get_i64("i64"), -(1ll << 40));
  EXPECT_EQ(m.get_f64("f64"), 1e300);
  EXPECT_TRUE(std::isinf(m.get_f32("f64")));
  EXPECT_EQ(m.get_f32_array("f32s"), (std::vector<float>{1.5f, -2}));
  EXPECT_EQ(m.get_i64_array("i32s"), (std::vector<int64_t>{-1, 3}));
  EXPECT_EQ(m.get_array("bools").element(1).to_bool(), true);
  EXPECT_EQ(m.get_array("empty").size(), 0u);
  const GgufArray& nested = m.get_array("nested");
  ASSERT_EQ(nested.elem_type(), GgufValueType::kArray);
  ASSERT_EQ(nested.size(), 2u);
  EXPECT_EQ(nested.element(0).to_array()->element(0).to_signed(), 4);
  EXPECT_EQ(nested.element(1).to_array()->string_at(0), "x");

  EXPECT_EQ(m.find_u32("absent"), std::nullopt);
  EXPECT_EQ(m.find_string("absent"), nullptr);
  EXPECT_EQ(*m.find_u32("u8"), 200u);
  auto err = [&](auto f) { return test::error_message<FormatError>(f); };
  const std::string name = f.path().string();
  for (const auto& [msg, want] : std::vector<std::pair<std::string, std::string>>{
           {err([&] { m.get_u32("i32"); }), "metadata key 'i32': expected u32, found i32 -5 (out of range)"},
           {err([&] { m.get_i32("u32"); }), "metadata key 'u32': expected i32, found u32 4000000000 (out of range)"},
           {err([&] { m.get_i64("u64"); }), "expected i64, found u64 18446744073709551615 (out of range)"},
           {err([&] { m.get_u32("string"); }), "metadata key 'string': expected u32, found string (6 bytes)"},
           {err([&] { m.get_u32("bool"); }), "expected u32, found bool true"},
           {err([&] { m.get_bool("u8"); }), "expected bool, found u8 200"},
           {err([&] { m.get_f32("u8"); }), "expected f32, found u8 200"},
           {err([&] { m.get_string("f32s"); }), "expected string, found array of 2 f32"},
           {err([&] { m.get_array("u8"); }), "expected array, found u8 200"},
           {err([&] { m.get_u32("absent"); }), "metadata key 'absent': missing"},
           {err([&] { m.find_u32("string"); }), "expected u32, found string"},
           {err([&] { m.get_string_array("f32s"); }), "expected array of string, found array of f32"},
           {err([&] { m.get_i64_array("u64s"); }), "element 0 (u64 18446744073709551615) does not fit i64"},
           {err([&] { m.get_f32_array("i32s"); }), "expected array of f32, found array of i32"},
       }) {
    EXPECT_NE(msg.find(want), std::string::npos) << msg;
    EXPECT_EQ(msg.rfind(name, 0), 0u) << msg;  // every message starts with the file
  }
}

TEST_F(GgufFileTest, LargeStringArrayLoads) {
  std::vector<std::string> enc;
  enc.reserve(150000);
  for (int i = 0; i < 150000; ++i) enc.push_back(gguf_str("tok" + std::to_string(i)));
  GgufBuilder b;
  b.kv("tokenizer.ggml.tokens", kArray, array_of(kString, enc));
  GgufFile f(write(b.build()));
  const GgufArray& a = f.metadata().get_array("tokenizer.ggml.tokens");
  ASSERT_EQ(a.size(), 150000u);
  EXPECT_EQ(a.string_at(0), "tok0");
  EXPECT_EQ(a.string_at(149999), "tok149999");
  EXPECT_EQ(f.metadata().get_string_array("tokenizer.ggml.tokens")[76543], "tok76543");
}

TEST_F(GgufFileTest, TruncationAnywhereIsFormatError) {
  const std::string bytes = valid_builder().build();
  const size_t data = GgufFile(write(bytes)).data_offset();
  // Every byte of the header, metadata and tensor infos; in the data, every 61st.
  for (size_t n = 0; n < bytes.size(); n += n <= data ? 1 : 61) {
    const std::string msg = open_error(bytes.substr(0, n));
    EXPECT_TRUE(msg.find("truncated") != std::string::npos || msg.find("past the end") != std::string::npos ||
                msg.find("need more bytes") != std::string::npos)
        << "prefix of " << n << " bytes: " << msg;
  }
  // The header fields by name.
  EXPECT_NE(open_error(bytes.substr(0, 2)).find("header: truncated: magic at offset 0"), std::string::npos);
  EXPECT_NE(open_error(bytes.substr(0, 6)).find("header: truncated: version at offset 4"), std::string::npos);
  EXPECT_NE(open_error(bytes.substr(0, 12)).find("header: truncated: tensor_count at offset 8"), std::string::npos);
  EXPECT_NE(open_error(bytes.substr(0, 20)).find("header: truncated: kv_count at offset 16"), std::string::npos);
}

TEST_F(GgufFileTest, BadMagicAndVersions) {
  GgufBuilder b = valid_builder();
  b.magic = "GGML";
  EXPECT_NE(open_error(b.build()).find("bad magic 0x47474d4c"), std::string::npos);
  b.magic = "GGUF";
  b.version = 1;
  EXPECT_NE(open_error(b.build()).find("GGUF version 1 is not supported"), std::string::npos);
  b.version = 0x03000000;  // a big-endian v3 file read little-endian
  EXPECT_NE(open_error(b.build()).find("big-endian GGUF"), std::string::npos);
  b.version = 4;
  EXPECT_NE(open_error(b.build()).find("unsupported GGUF version 4"), std::string::npos);
}

TEST_F(GgufFileTest, HugeCountsAreRefusedBeforeAllocating) {
  GgufBuilder b = valid_builder();
  b.kv_count = 1ull << 62;
  EXPECT_NE(open_error(b.build()).find("kv_count 4611686018427387904 exceeds the limit"), std::string::npos);
  b.kv_count.reset();
  b.tensor_count = ~0ull;
  EXPECT_NE(open_error(b.build()).find("tensor_count 18446744073709551615 exceeds the limit"), std::string::npos);
  b.tensor_count = 100000;  // under the limit, more than the file holds
  EXPECT_NE(open_error(b.build()).find("need more bytes than the file"), std::string::npos);
}

TEST_F(GgufFileTest, GiantLengthsAreRefused) {
  GgufBuilder b;
  b.kv(std::string(2000, 'k'), kU8, le<uint8_t>(1));
  EXPECT_NE(open_error(b.build()).find("key length 2000 exceeds the limit of 1024"), std::string::npos);

  GgufBuilder s;
  s.kv("chat", kString, gguf_u64(1ull << 60) + "abc");
  std::string msg = open_error(s.build());
  EXPECT_NE(msg.find("metadata key 'chat': string value length 1152921504606846976 exceeds the limit"),
            std::string::npos) << msg;
  GgufBuilder t;  // within the limit but past the end of the file
  t.kv("chat", kString, gguf_u64(1 << 20) + "abc");
  msg = open_error(t.build());
  EXPECT_NE(msg.find("metadata key 'chat': truncated: string value"), std::string::npos) << msg;

  GgufBuilder a;
  a.kv("arr", kArray, gguf_u32(kU8) + gguf_u64(1ull << 40));
  EXPECT_NE(open_error(a.build()).find("metadata key 'arr': array length 1099511627776 exceeds the limit"),
            std::string::npos);
  GgufBuilder a2;
  a2.kv("arr", kArray, gguf_u32(kString) + gguf_u64(1 << 20) + gguf_str("x"));
  EXPECT_NE(open_error(a2.build()).find("metadata key 'arr': truncated: array elements"), std::string::npos);
  GgufBuilder a3;
  a3.kv("arr", kArray, array_of(kString, {gguf_str("x"), gguf_u64(1ull << 50)}) + std::string(16, 'y'));
  msg = open_error(a3.build());
  EXPECT_NE(msg.find("metadata key 'arr': string element 1 length 1125899906842624 exceeds the limit"), std::string::npos)
      << msg;

  GgufBuilder e;
  e.kv("", kU8, le<uint8_t>(1));
  EXPECT_NE(open_error(e.build()).find("metadata entry 0: empty key"), std::string::npos);
}

TEST_F(GgufFileTest, DeepNestingAndUnknownValueTypes) {
  std::string v = array_of(kU8, {le<uint8_t>(1)});
  for (int i = 0; i < 20; ++i) v = array_of(kArray, {v});
  GgufBuilder b;
  b.kv("deep", kArray, v);
  EXPECT_NE(open_error(b.build()).find("metadata key 'deep': arrays nested deeper than 8"), std::string::npos);
  std::string ok = array_of(kU8, {le<uint8_t>(1)});
  for (int i = 0; i < 6; ++i) ok = array_of(kArray, {ok});
  GgufBuilder fine;
  fine.kv("deep", kArray, ok);
  EXPECT_NO_THROW(GgufFile(write(fine.build())));

  GgufBuilder u;
  u.kv("k", 13, le<uint8_t>(1));
  EXPECT_NE(open_error(u.build()).find("metadata key 'k': unknown value type 13"), std::string::npos);
  GgufBuilder ua;
  ua.kv("k", kArray, gguf_u32(99) + gguf_u64(1));
  EXPECT_NE(open_error(ua.build()).find("metadata key 'k': unknown array element type 99"), std::string::npos);
}

TEST_F(GgufFileTest, DuplicateKeysAndTensors) {
  GgufBuilder b = valid_builder();
  b.kv_u32("qwen3moe.block_count", 3);
  EXPECT_NE(open_error(b.build()).find("metadata key 'qwen3moe.block_count': duplicate key"), std::string::npos);
  GgufBuilder t = valid_builder();
  t.tensor("token_embd.weight", {32}, kTypeF32);
  EXPECT_NE(open_error(t.build()).find("tensor 'token_embd.weight': duplicate tensor name"), std::string::npos);
}

TEST_F(GgufFileTest, BadTensorInfos) {
  auto with = [&](std::vector<uint64_t> dims, uint32_t type, std::optional<uint64_t> offset = std::nullopt) {
    GgufBuilder b = valid_builder();
    b.tensor("bad", std::move(dims), type, offset);
    return open_error(b.build());
  };
  EXPECT_NE(with({2, 2, 2, 2, 2}, kTypeF32).find("tensor 'bad': n_dims 5 is not in [1, 4]"), std::string::npos);
  EXPECT_NE(with({}, kTypeF32).find("tensor 'bad': n_dims 0"), std::string::npos);
  EXPECT_NE(with({4, 0}, kTypeF32).find("tensor 'bad': dimension 1 is 0"), std::string::npos);
  EXPECT_NE(with({1ull << 32, 1ull << 32}, kTypeF32).find("tensor 'bad': element count overflows"), std::string::npos);
  EXPECT_NE(with({1ull << 62}, kTypeF32).find("tensor 'bad': row byte size overflows"), std::string::npos);
  EXPECT_NE(with({100}, kTypeQ4_K).find("tensor 'bad': row length 100 is not a multiple of the Q4_K block of 256"),
            std::string::npos);
  EXPECT_NE(with({32}, 99).find("tensor 'bad': unknown ggml type id 99"), std::string::npos);
  EXPECT_NE(with({32}, 4).find("tensor 'bad': unknown ggml type id 4"), std::string::npos);  // retired Q4_2
  EXPECT_NE(with({32}, kTypeF32, 8).find("tensor 'bad': data offset 8 is not a multiple of the alignment 32"),
            std::string::npos);
  EXPECT_NE(with({32}, kTypeF32, 1ull << 40).find("tensor 'bad': data [1099511627776, +128)"), std::string::npos);
  EXPECT_NE(with({32}, kTypeF32, ~0ull - 31).find("ends past the end of the file"), std::string::npos);
  // Overlaps the Q4_K tensor that starts at 768 (the F32 tensor before it is 64*3*4 bytes).
  const std::string msg = with({32}, kTypeF32, 800);
  EXPECT_NE(msg.find("overlaps tensor 'blk.0.ffn_up_exps.weight'"), std::string::npos) << msg;
}

TEST_F(GgufFileTest, Alignment) {
  GgufBuilder b = valid_builder();
  b.alignment = 64;
  b.kv_u32("general.alignment", 64);
  GgufFile f(write(b.build()));
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.data_offset() % 64, 0u);
  for (const GgufTensor& t : f.tensors()) EXPECT_EQ((t.offset - f.data_offset()) % 64, 0u);

  for (uint32_t bad : {0u, 48u, 1u << 21}) {
    GgufBuilder c = valid_builder();
    c.kv_u32("general.alignment", bad);
    const std::string msg = open_error(c.build());
    EXPECT_NE(msg.find("metadata key 'general.alignment': alignment " + std::to_string(bad) + " is not a power of two"),
              std::string::npos) << msg;
  }
  GgufBuilder s = valid_builder();
  s.kv_string("general.alignment", "32");
  EXPECT_NE(open_error(s.build()).find("metadata key 'general.alignment': expected u32, found string"), std::string::npos);
  // Tensors placed for alignment 32 in a file that declares 256: misaligned.
  GgufBuilder m = valid_builder();
  m.kv_u32("general.alignment", 256);
  EXPECT_NE(open_error(m.build()).find("is not a multiple of the alignment 256"), std::string::npos);
}

// Split sets: shards written by the builder with the split.* keys of llama.cpp's gguf-split.
class GgufSplitTest : public GgufFileTest {
 protected:
  GgufBuilder shard(uint32_t no, uint32_t count, uint64_t total, const std::vector<std::string>& tensors) {
    GgufBuilder b;
    if (no == 0) b.kv_string("general.architecture", "qwen3moe");
    b.kv("split.no", kU16, le<uint16_t>(no)).kv("split.count", kU16, le<uint16_t>(count));
    b.kv("split.tensors.count", kI32, le<int32_t>(int32_t(total)));
    for (const auto& t : tensors) b.tensor(t, {32, 2}, kTypeQ8_0);
    return b;
  }
  void write_set(const std::vector<GgufBuilder>& shards, const std::string& prefix = "m") {
    for (size_t i = 0; i < shards.size(); ++i)
      write(shards[i].build(), gguf_split_path(prefix, uint32_t(i + 1), uint32_t(shards.size())).string());
  }
  fs::path shard_path(uint32_t k, uint32_t n) { return gguf_split_path(dir_.path() / "m", k, n); }
  std::string set_error(const fs::path& p) {
    return test::error_message<FormatError>([&] { GgufModelFiles f(p); });
  }
};

TEST_F(GgufSplitTest, NamesParse) {
  const auto s = parse_gguf_split_name("/x/Qwen3-30B-A3B-Q4_K_M-00002-of-00003.gguf");
  ASSERT_TRUE(s);
  EXPECT_EQ(s->prefix, fs::path("/x/Qwen3-30B-A3B-Q4_K_M"));
  EXPECT_EQ(s->index, 2u);
  EXPECT_EQ(s->count, 3u);
  EXPECT_EQ(gguf_split_path(s->prefix, 3, 3), fs::path("/x/Qwen3-30B-A3B-Q4_K_M-00003-of-00003.gguf"));
  EXPECT_FALSE(parse_gguf_split_name("m-00004-of-00003.gguf"));
  EXPECT_FALSE(parse_gguf_split_name("m-00000-of-00003.gguf"));
  EXPECT_FALSE(parse_gguf_split_name("m-0001-of-0003.gguf"));
  EXPECT_FALSE(parse_gguf_split_name("model.gguf"));
}

TEST_F(GgufSplitTest, OpensAllShardsFromAnyOne) {
  write_set({shard(0, 3, 3, {"a"}), shard(1, 3, 3, {"b", "c"}), shard(2, 3, 3, {})});
  for (uint32_t k = 1; k <= 3; ++k) {
    GgufModelFiles f(shard_path(k, 3));
    ASSERT_EQ(f.shard_count(), 3u);
    EXPECT_EQ(f.paths()[2], shard_path(3, 3));
    EXPECT_EQ(f.metadata().get_string("general.architecture"), "qwen3moe");
    ASSERT_EQ(f.tensors().size(), 3u);
    EXPECT_EQ(f.tensor("a").shard, 0u);
    EXPECT_EQ(f.tensor("c").shard, 1u);
    EXPECT_EQ(f.path_of(f.tensor("c")), shard_path(2, 3));
    EXPECT_EQ(f.tensor("c").offset, f.shard(1).tensor("c").offset);
  }
  const std::string msg = test::error_message<FormatError>([&] { GgufModelFiles(shard_path(1, 3)).tensor("z"); });
  EXPECT_NE(msg.find("split set " + shard_path(1, 3).string() + ": no tensor 'z'"), std::string::npos) << msg;
}

TEST_F(GgufSplitTest, SingleFile) {
  const fs::path p = write(valid_builder().build());
  GgufModelFiles f(p);
  EXPECT_EQ(f.shard_count(), 1u);
  EXPECT_EQ(f.tensors().size(), 3u);
  EXPECT_EQ(f.tensor("output_norm.weight").offset, GgufFile(p).tensor("output_norm.weight").offset);
  // A set of one named like a shard, without split keys, is a single file too.
  write(valid_builder().build(), "solo-00001-of-00001.gguf");
  EXPECT_EQ(GgufModelFiles(dir_.path() / "solo-00001-of-00001.gguf").tensors().size(), 3u);
  // A shard renamed to a plain name is refused.
  const fs::path renamed = write(shard(0, 2, 2, {"a"}).build(), "renamed.gguf");
  EXPECT_NE(set_error(renamed).find("one shard of a set of 2, but its name does not follow"), std::string::npos);
}

TEST_F(GgufSplitTest, SetErrors) {
  write_set({shard(0, 3, 3, {"a"}), shard(1, 3, 3, {"b"}), shard(2, 3, 3, {"c"})});
  fs::remove(shard_path(2, 3));
  std::string msg = set_error(shard_path(1, 3));
  EXPECT_NE(msg.find("shard 2 of 3 (" + shard_path(2, 3).string() + ") is missing"), std::string::npos) << msg;

  write_set({shard(0, 2, 2, {"a"}), shard(0, 2, 2, {"b"})});  // second shard says split.no 0
  msg = set_error(shard_path(1, 2));
  EXPECT_NE(msg.find(shard_path(2, 2).string() + ": metadata key 'split.no' is 0, expected 1"), std::string::npos) << msg;

  write_set({shard(0, 2, 2, {"a"}), shard(1, 3, 2, {"b"})});  // from a set of 3
  msg = set_error(shard_path(2, 2));
  EXPECT_NE(msg.find("'split.count' is 3 but the name says 2"), std::string::npos) << msg;

  write_set({shard(0, 2, 2, {"a"}), shard(1, 2, 5, {"b"})});
  msg = set_error(shard_path(1, 2));
  EXPECT_NE(msg.find("'split.tensors.count' is 5 but the 2 shards hold 2 tensors"), std::string::npos) << msg;

  write_set({shard(0, 2, 2, {"a"}), shard(1, 2, 2, {"a"})});
  msg = set_error(shard_path(1, 2));
  EXPECT_NE(msg.find("tensor 'a' is in shard 1 (" + shard_path(1, 2).string() + ") and in shard 2"), std::string::npos)
      << msg;

  GgufBuilder plain;
  plain.tensor("b", {32}, kTypeF32);
  write_set({shard(0, 2, 2, {"a"}), plain});
  msg = set_error(shard_path(1, 2));
  EXPECT_NE(msg.find(shard_path(2, 2).string() + ": missing split metadata"), std::string::npos) << msg;

  GgufBuilder corrupt = shard(1, 2, 2, {"b"});
  corrupt.version = 1;
  write_set({shard(0, 2, 2, {"a"}), corrupt});
  msg = set_error(shard_path(1, 2));
  EXPECT_NE(msg.find(shard_path(2, 2).string() + ": header: GGUF version 1"), std::string::npos) << msg;
}

}  // namespace
