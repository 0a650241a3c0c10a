// Tests of the packed model format: expert file header encode/decode and validation, the expert
// file writer, the pread expert store (reads, checksums, truncation) and model.json.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <fstream>
#include <tuple>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/file_util.h"
#include "loader/format/expert_file.h"
#include "loader/format/expert_file_writer.h"
#include "loader/format/expert_map.h"
#include "loader/store/expert_store.h"
#include "loader/format/model_config.h"
#include "tests/support/test_model.h"

namespace fs = std::filesystem;
using namespace moestream;

namespace {

ExpertFileHeader sample_header() {
  ExpertFileHeader h{.quant = QuantType::kQ8, .layer = 3, .n_experts = 5, .hidden = 67, .intermediate = 45,
                     .slot_checksums = {}};
  h.payload_hash = PayloadHash::kXxh64;  // version 1: what earlier builds wrote
  h.expert_bytes = ExpertLayout::make(h.quant, h.hidden, h.intermediate).bytes;
  h.expert_stride = (h.expert_bytes + 4095) / 4096 * 4096;
  h.data_offset = 4096;
  for (uint32_t i = 0; i < h.n_experts; ++i) h.slot_checksums.push_back(0x1234567890abcdefULL * (i + 1));
  return h;
}

// A header field overwritten in its encoding: `width` bytes of `value` at `offset`.
struct FieldPatch {
  const char* field;
  size_t offset;
  uint64_t value;
  size_t width;
};

// Each patch of h's encoding alone is refused with an error naming its field and `file`.
void expect_each_patch_rejected_by_name(const ExpertFileHeader& h, std::initializer_list<FieldPatch> patches,
                                        const std::string& file) {
  const std::string good = encode_expert_header(h);
  for (const FieldPatch& c : patches) {
    std::string bad = good;
    std::memcpy(bad.data() + c.offset, &c.value, c.width);
    const std::string msg = test::error_message([&] { decode_expert_header(bad, h.file_bytes(), file); });
    EXPECT_NE(msg.find(std::string("'") + c.field + "'"), std::string::npos) << c.field << ": " << msg;
    EXPECT_NE(msg.find(file), std::string::npos) << msg;
  }
}

// Odd widths: no dimension is a multiple of a quant block.
ModelConfig tiny_config(QuantType q) {
  return test::tiny_moe_config(
      {.vocab = 50, .hidden = 37, .head_dim = 8, .intermediate = 19, .experts = 6, .quant = q});
}

// Writes experts/layer_NNN.bin for cfg with random payloads; returns payloads[layer][expert].
test::Payloads write_experts(const fs::path& dir, const ModelConfig& c) {
  return test::write_layer_files(dir, c, 42);
}

}  // namespace

TEST(ExpertFile, LayoutAlignsMatricesAndCountsQ4At4Point5Bits) {
  ExpertLayout l = ExpertLayout::make(QuantType::kQ4, 64, 96);
  EXPECT_EQ(l.gate_offset, 0u);
  EXPECT_EQ(l.up_offset % kMatrixAlign, 0u);
  EXPECT_EQ(l.down_offset % kMatrixAlign, 0u);
  EXPECT_EQ(quant_matrix_bytes(QuantType::kQ4, 96, 64) * 8, 96u * 64u * 9u / 2u);
  EXPECT_EQ(quant_matrix_bytes(QuantType::kQ8, 3, 33), 3u * 2u * 34u);  // 33 cols -> 2 blocks
  EXPECT_EQ(quant_matrix_bytes(QuantType::kBF16, 3, 33), 3u * 33u * 2u);
}

TEST(ExpertFile, HeaderRoundTrips) {
  ExpertFileHeader h = sample_header();
  std::string bytes = encode_expert_header(h);
  ASSERT_EQ(bytes.size(), h.data_offset);
  ExpertFileHeader d = decode_expert_header(bytes, h.file_bytes(), "x.bin");
  // Every field, compared (and printed on failure) at once.
  auto fields = [](const ExpertFileHeader& x) {
    return std::tie(x.quant, x.layer, x.n_experts, x.hidden, x.intermediate, x.expert_bytes, x.expert_stride,
                    x.data_offset, x.slot_checksums);
  };
  EXPECT_EQ(fields(d), fields(h));
}

TEST(ExpertFile, EveryCorruptedFieldIsRejectedByName) {
  expect_each_patch_rejected_by_name(
      sample_header(),
      {
          {"magic", 0, 0x58, 1},          {"version", 8, 3, 4},
          {"quant", 12, 9, 4},            {"n_experts", 20, 0, 4},
          {"hidden", 24, 0, 4},           {"intermediate", 28, 1u << 30, 4},
          {"expert_bytes", 32, 12345, 8}, {"expert_stride", 40, 4095, 8},
          {"data_offset", 48, 8192, 8},   {"header_checksum", 56, 7, 8},
          {"header_checksum", 64, 1, 8},  // a slot checksum: covered by the header checksum
          {"header_checksum", 16, 4, 4},  // the layer index has no own check beyond the checksum
      },
      "dir/layer_003.bin");
}

// Version 2 (a pack converted from a GGUF): a ggml type per matrix.
ExpertFileHeader typed_header() {
  ExpertFileHeader h;
  const ExpertTypes t{ggml_quant(GgmlType::kQ8_0), ggml_quant(GgmlType::kQ4_0), ggml_quant(GgmlType::kF16)};
  h.set_types(t);
  h.layer = 1;
  h.n_experts = 3;
  h.hidden = 64;
  h.intermediate = 96;
  h.expert_bytes = ExpertLayout::make(t, h.hidden, h.intermediate).bytes;
  h.expert_stride = 8 * 4096;  // wider than the expert (22272 bytes): another layer's are larger
  h.data_offset = expert_data_offset(h.version, h.n_experts);
  for (uint32_t i = 0; i < h.n_experts; ++i) h.slot_checksums.push_back(0xfeedface12345678ULL * (i + 3));
  return h;
}

TEST(ExpertFile, OnlyXxh64UniformPackFilesAreVersion1) {
  ExpertFileHeader h;
  h.set_types(ExpertTypes::uniform(QuantType::kQ4));  // XXH3 checksums: a version-2 flag
  EXPECT_EQ(h.version, kExpertFileVersionTyped);
  h.payload_hash = PayloadHash::kXxh64;
  h.set_types(ExpertTypes::uniform(QuantType::kQ4));
  EXPECT_EQ(h.version, kExpertFileVersion);
  EXPECT_EQ(h.table_offset(), 64u);
  h.set_types(ExpertTypes{QuantType::kQ8, QuantType::kQ4, QuantType::kQ8});
  EXPECT_EQ(h.version, kExpertFileVersionTyped);
  h.set_types(ExpertTypes::uniform(ggml_quant(GgmlType::kQ8_0)));
  EXPECT_EQ(h.version, kExpertFileVersionTyped);
  EXPECT_EQ(h.table_offset(), 80u);
}

TEST(ExpertFile, TypedHeaderRoundTrips) {
  const ExpertFileHeader h = typed_header();
  const std::string bytes = encode_expert_header(h);
  ASSERT_EQ(bytes.size(), h.data_offset);
  const ExpertFileHeader d = decode_expert_header(bytes, h.file_bytes(), "x.bin");
  EXPECT_EQ(d.version, kExpertFileVersionTyped);
  EXPECT_TRUE(d.types() == h.types());
  EXPECT_EQ(d.expert_bytes, h.expert_bytes);
  EXPECT_EQ(d.expert_stride, h.expert_stride);
  EXPECT_EQ(d.slot_checksums, h.slot_checksums);
}

TEST(ExpertFile, EveryCorruptedTypedFieldIsRejectedByName) {
  const ExpertFileHeader h = typed_header();
  const std::string good = encode_expert_header(h);
  expect_each_patch_rejected_by_name(
      h,
      {
          {"version", 8, 7, 4},
          {"quant", 12, 0x100 + 4, 4},            // a retired ggml id
          {"up_quant", 64, 0x100 + 99, 4},        // an unknown ggml id
          {"down_quant", 68, 17, 4},              // neither a pack type nor a ggml one
          {"flags", 72, 4 | 2, 4},                // an undefined flag bit
          {"expert_bytes", 72, 1, 4},             // the bias flag: the payload would be longer
          {"reserved", 76, 1, 4},
          {"expert_bytes", 68, 0x100 + 8, 4},     // down Q8_0 instead of F16: another size
          {"quant", 64, 0x100 + 12, 4},           // up Q4_K: 64 columns are not whole 256-blocks
          {"header_checksum", 80, 1, 8},          // a slot checksum, now at 80
          {"data_offset", 48, 4096 * 2, 8},
      },
      "dir/layer_001.bin");
  // A version-1 header may not name a ggml type.
  std::string v1 = encode_expert_header(sample_header());
  const uint32_t q = 0x100 + 8;
  std::memcpy(v1.data() + 12, &q, 4);
  const std::string msg = test::error_message([&] { decode_expert_header(v1, sample_header().file_bytes(), "f"); });
  EXPECT_NE(msg.find("'quant'"), std::string::npos) << msg;
  // Too short for version 2's 80 bytes.
  EXPECT_THROW(decode_expert_header(good.substr(0, 70), h.file_bytes(), "f"), FormatError);
}

// Writers hash with XXH3-64 (flags bit 1); a version-2 header without the bit, as earlier builds
// wrote it, reads back as XXH64, and so does every version-1 header.
TEST(ExpertFile, SlotChecksumsFollowTheFilesHash) {
  TempDir d;
  const ExpertLayout lay = ExpertLayout::make(QuantType::kQ8, 64, 96);
  const fs::path p = d.path() / "layer_000.bin";
  std::vector<uint8_t> payload(lay.bytes);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = uint8_t(i * 13 + 5);
  {
    ExpertFileWriter w(p, QuantType::kQ8, 0, 1, 64, 96);
    w.write_expert(0, payload.data());
    w.finish();
  }
  const ExpertFileHeader h = read_expert_header(p);
  EXPECT_EQ(h.version, kExpertFileVersionTyped);
  EXPECT_EQ(h.payload_hash, PayloadHash::kXxh3);
  EXPECT_EQ(h.slot_checksums[0], expert_checksum(PayloadHash::kXxh3, payload.data(), payload.size()));
  EXPECT_NE(h.slot_checksums[0], expert_checksum(PayloadHash::kXxh64, payload.data(), payload.size()));
  uint32_t flags = 0;
  {
    std::ifstream in(p, std::ios::binary);
    in.seekg(72);
    in.read(reinterpret_cast<char*>(&flags), 4);
  }
  EXPECT_EQ(flags, 2u);

  ExpertFileHeader old = typed_header();
  old.payload_hash = PayloadHash::kXxh64;
  const std::string bytes = encode_expert_header(old);
  EXPECT_EQ(decode_expert_header(bytes, old.file_bytes(), "old.bin").payload_hash, PayloadHash::kXxh64);
  const ExpertFileHeader v1 = sample_header();
  EXPECT_EQ(decode_expert_header(encode_expert_header(v1), v1.file_bytes(), "v1.bin").payload_hash,
            PayloadHash::kXxh64);
}

TEST(ExpertFileWriter, TypedFileWithAWiderStrideReadsBack) {
  TempDir d;
  const ExpertTypes t{ggml_quant(GgmlType::kQ8_0), ggml_quant(GgmlType::kQ4_0), ggml_quant(GgmlType::kF16)};
  const ExpertLayout lay = ExpertLayout::make(t, 64, 96);
  const fs::path p = d.path() / "layer_000.bin";
  {
    ExpertFileWriter w(p, t, 0, 2, 64, 96, 5 * 4096 + 1);
    std::vector<uint8_t> payload(lay.bytes);
    for (uint32_t e = 0; e < 2; ++e) {
      for (size_t i = 0; i < payload.size(); ++i) payload[i] = uint8_t(i * 7 + e);
      w.write_expert(e, payload.data());
    }
    w.finish();
  }
  const ExpertFileHeader h = read_expert_header(p);
  EXPECT_EQ(h.version, kExpertFileVersionTyped);
  EXPECT_TRUE(h.types() == t);
  EXPECT_EQ(h.expert_stride, 6u * 4096u);
  EXPECT_EQ(h.data_offset, 4096u);
  EXPECT_EQ(fs::file_size(p), h.file_bytes());
}

TEST(ExpertFile, WrongFileSizeIsRejected) {
  const ExpertFileHeader h = sample_header();
  const std::string good = encode_expert_header(h);
  EXPECT_THROW(decode_expert_header(good, h.file_bytes() - 1, "f"), FormatError);
  EXPECT_THROW(decode_expert_header(good, h.file_bytes() + 4096, "f"), FormatError);
  EXPECT_THROW(decode_expert_header(good.substr(0, 40), h.file_bytes(), "f"), FormatError);
}

TEST(ExpertFile, TruncatedFileIsRejectedWithItsPath) {
  TempDir d;
  ModelConfig c = tiny_config(QuantType::kBF16);
  write_experts(d.path(), c);
  fs::path p = expert_file_path(d.path(), 1);
  fs::resize_file(p, fs::file_size(p) - 100);
  std::string msg = test::error_message([&] { read_expert_header(p); });
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
  EXPECT_NE(msg.find(p.string()), std::string::npos) << msg;
  EXPECT_THROW(open_pread_expert_store(d.path(), c), FormatError);
  fs::resize_file(p, 30);  // shorter than the fixed header
  EXPECT_THROW(read_expert_header(p), FormatError);
}

TEST(ExpertFile, WrongMagicIsRejected) {
  TempDir d;
  ModelConfig c = tiny_config(QuantType::kQ4);
  write_experts(d.path(), c);
  test::overwrite_bytes(expert_file_path(d.path(), 0), 0, "GGUF");
  std::string msg = test::error_message([&] { open_pread_expert_store(d.path(), c); });
  EXPECT_NE(msg.find("'magic'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("layer_000.bin"), std::string::npos) << msg;
}

TEST(ExpertFile, PathIsThreeDigitLayer) {
  EXPECT_EQ(expert_file_path("m", 7), fs::path("m/experts/layer_007.bin"));
}

TEST(ExpertFileWriter, AbandonedWriterLeavesNoFile) {
  TempDir d;
  {
    ExpertFileWriter w(d.path() / "layer_000.bin", QuantType::kF32, 0, 2, 8, 4);
    std::vector<uint8_t> p(w.layout().bytes, 1);
    w.write_expert(0, p.data());
  }
  EXPECT_TRUE(fs::is_empty(d.path()));
}

TEST(ExpertStore, ReturnsTheBytesWrittenForEachRequestedExpert) {
  for (QuantType q : {QuantType::kF32, QuantType::kBF16, QuantType::kQ8, QuantType::kQ4}) {
    TempDir d;
    ModelConfig c = tiny_config(q);
    auto payloads = write_experts(d.path(), c);
    auto store = open_pread_expert_store(d.path(), ModelConfig::load(d.path()));
    std::vector<int> ids = {5, 0, 3};
    std::vector<const uint8_t*> out;
    store->fetch(1, ids, out);
    ASSERT_EQ(out.size(), ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(out[i]) % kMatrixAlign, 0u);
      EXPECT_EQ(std::memcmp(out[i], payloads[1][ids[i]].data(), payloads[1][ids[i]].size()), 0)
          << quant_name(q) << " expert " << ids[i];
    }
    ExpertStoreStats s = store->stats();
    EXPECT_EQ(s.fetch_calls, 1u);
    EXPECT_EQ(s.experts_requested, 3u);
    EXPECT_EQ(s.bytes_read, 3 * payloads[1][0].size());
    EXPECT_EQ(s.read_ops_issued, 3u);
    EXPECT_GT(s.checksum_seconds, 0.0);
    EXPECT_GE(s.io_wait_seconds, s.checksum_seconds);
  }
}

TEST(ExpertStore, FollowsTheLayerMapFromLogicalIdToSlot) {
  TempDir d;
  ModelConfig c = tiny_config(QuantType::kQ8);
  auto payloads = write_experts(d.path(), c);  // slot s holds what was written as expert s
  const std::vector<uint32_t> slots = {3, 0, 5, 1, 2, 4};  // logical i lives in slot slots[i]
  test::write_bound_map(d.path(), 1, ExpertMap::from_slots(slots));
  auto store = open_pread_expert_store(d.path(), c);
  std::vector<int> ids = {0, 2, 5};
  std::vector<const uint8_t*> out;
  store->fetch(1, ids, out);
  for (size_t i = 0; i < ids.size(); ++i)
    EXPECT_EQ(std::memcmp(out[i], payloads[1][slots[ids[i]]].data(), payloads[1][0].size()), 0) << ids[i];
  store->fetch(0, ids, out);  // layer 0 has no map: identity
  for (size_t i = 0; i < ids.size(); ++i)
    EXPECT_EQ(std::memcmp(out[i], payloads[0][ids[i]].data(), payloads[0][0].size()), 0) << ids[i];
  // A map for another expert count is rejected on open.
  write_expert_map(d.path() / "experts" / "layer_000.map", ExpertMap::identity(4));
  EXPECT_THROW(open_pread_expert_store(d.path(), c), FormatError);
}

TEST(ExpertStore, ChecksumMismatchIsDetectedAndNamesTheExpert) {
  TempDir d;
  ModelConfig c = tiny_config(QuantType::kQ8);
  write_experts(d.path(), c);
  fs::path p = expert_file_path(d.path(), 0);
  ExpertFileHeader h = read_expert_header(p);
  uint8_t flip = 0;
  {
    std::ifstream f(p, std::ios::binary);
    f.seekg(static_cast<std::streamoff>(h.slot_offset(4) + 17));
    f.read(reinterpret_cast<char*>(&flip), 1);
  }
  flip ^= 0x10;
  test::overwrite_bytes(p, h.slot_offset(4) + 17, std::string(1, char(flip)));
  auto store = open_pread_expert_store(d.path(), c);  // headers are intact: opens fine
  std::vector<const uint8_t*> out;
  std::vector<int> ok = {0, 3};
  EXPECT_NO_THROW(store->fetch(0, ok, out));
  std::vector<int> ids = {1, 4};
  std::string msg = test::error_message([&] { store->fetch(0, ids, out); });
  EXPECT_NE(msg.find("checksum mismatch for expert 4"), std::string::npos) << msg;
  EXPECT_NE(msg.find("layer_000.bin"), std::string::npos) << msg;
  auto unchecked = open_pread_expert_store(d.path(), c, ExpertStoreOptions{.verify_checksums = false});
  EXPECT_NO_THROW(unchecked->fetch(0, ids, out));
}

TEST(ExpertStore, FileTruncatedAfterOpenIsAnIoErrorNamingFileAndOffset) {
  TempDir d;
  ModelConfig c = tiny_config(QuantType::kQ4);
  write_experts(d.path(), c);
  auto store = open_pread_expert_store(d.path(), c);
  fs::path p = expert_file_path(d.path(), 1);
  ExpertFileHeader h = read_expert_header(p);
  fs::resize_file(p, h.slot_offset(5) + 10);
  std::vector<int> ids = {5};
  std::vector<const uint8_t*> out;
  std::string msg = test::error_message<IoError>([&] { store->fetch(1, ids, out); });
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
  EXPECT_NE(msg.find("layer_001.bin"), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::to_string(h.slot_offset(5))), std::string::npos) << msg;
}

// A fetch whose read fails hands out nothing: not the experts read before the failure, not the
// half-read one, not the last fetch's (issue 47 item 4: a failed read never leaves bytes a later
// request can reuse). The store's synchronous default used to keep the failed fetch's buffer
// list and its hand-out position, so next_ready went on handing out from it. Once the file is
// whole again the same fetch returns the right bytes.
TEST(ExpertStore, AFailedFetchHandsOutNothingAndTheRestoredFileReadsRight) {
  TempDir d;
  ModelConfig c = tiny_config(QuantType::kQ4);
  const test::Payloads want = write_experts(d.path(), c);
  auto store = open_pread_expert_store(d.path(), c);
  const fs::path p = expert_file_path(d.path(), 1);
  const std::string whole = read_file(p);
  const ExpertFileHeader h = read_expert_header(p);
  const uint64_t bytes = c.expert_layout(1).bytes;
  std::vector<const uint8_t*> out;
  store->fetch(1, std::vector<int>{0, 3}, out);
  fs::resize_file(p, h.slot_offset(h.n_experts - 1) + bytes / 2);  // the last slot's expert is cut in half
  const std::vector<int> ids = {0, 1, 2, 3, 4, 5};
  const std::string msg = test::error_message<IoError>([&] { store->begin_fetch(1, ids); });
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
  size_t i = 0;
  ExpertMatrices m;
  EXPECT_FALSE(store->next_ready(&i, &m, false)) << "handed out position " << i << " of a failed fetch";
  test::overwrite_bytes(p, 0, whole);  // back byte for byte
  store->fetch(1, ids, out);
  for (size_t k = 0; k < ids.size(); ++k)
    EXPECT_EQ(std::memcmp(out[k], want[1][size_t(ids[k])].data(), bytes), 0) << ids[k];
}

TEST(ExpertStore, HeaderThatDisagreesWithModelJsonIsRejected) {
  TempDir d;
  ModelConfig c = tiny_config(QuantType::kQ4);
  write_experts(d.path(), c);
  ModelConfig other = c;
  other.expert_quant = QuantType::kQ8;
  std::string msg = test::error_message([&] { open_pread_expert_store(d.path(), other); });
  EXPECT_NE(msg.find("'quant'"), std::string::npos) << msg;
  other = c;
  other.moe_intermediate_size = 20;
  msg = test::error_message([&] { open_pread_expert_store(d.path(), other); });
  EXPECT_NE(msg.find("'intermediate'"), std::string::npos) << msg;
  // Layer files swapped: each names the wrong layer index.
  fs::rename(expert_file_path(d.path(), 0), d.path() / "tmp.bin");
  fs::rename(expert_file_path(d.path(), 1), expert_file_path(d.path(), 0));
  fs::rename(d.path() / "tmp.bin", expert_file_path(d.path(), 1));
  msg = test::error_message([&] { open_pread_expert_store(d.path(), c); });
  EXPECT_NE(msg.find("'layer'"), std::string::npos) << msg;
}

TEST(ExpertStore, MissingLayerFileNamesThePath) {
  TempDir d;
  ModelConfig c = tiny_config(QuantType::kF32);
  write_experts(d.path(), c);
  fs::remove(expert_file_path(d.path(), 1));
  std::string msg = test::error_message([&] { open_pread_expert_store(d.path(), c); });
  EXPECT_NE(msg.find("layer_001.bin"), std::string::npos) << msg;
}

TEST(ModelConfig, RoundTripsThroughModelJson) {
  TempDir d;
  ModelConfig c = tiny_config(QuantType::kQ4);
  c.arch = Arch::kMixtral;
  c.rope_theta = 1e6;
  c.rope_scaling = RopeScaling{.type = "yarn", .factor = 4, .original_max_position_embeddings = 32768};
  c.tokenizer_file = "tokenizer.json";
  c.eos_token_id = 2;
  c.norm_topk_prob = false;
  c.dense_dtype = "bf16";
  c.save(d.path());
  ModelConfig r = ModelConfig::load(d.path());
  EXPECT_EQ(r.to_json(), c.to_json());
  EXPECT_EQ(r.arch, Arch::kMixtral);
  ASSERT_TRUE(r.rope_scaling.has_value());
  EXPECT_EQ(r.rope_scaling->type, "yarn");
  EXPECT_EQ(r.rope_scaling->original_max_position_embeddings, 32768);
  EXPECT_FALSE(r.bos_token_id.has_value());
  EXPECT_EQ(r.eos_token_id, 2);
}

TEST(ModelConfig, EveryMissingRequiredFieldIsNamed) {
  const nlohmann::json good = tiny_config(QuantType::kQ8).to_json();
  for (auto& [key, value] : good.items()) {
    if (key == "tokenizer" || key == "bos_token_id" || key == "eos_token_id") continue;  // optional
    nlohmann::json j = good;
    j.erase(key);
    std::string msg = test::error_message([&] { ModelConfig::from_json(j, "m/model.json"); });
    EXPECT_NE(msg.find("'" + key + "'"), std::string::npos) << key << ": " << msg;
    EXPECT_NE(msg.find("m/model.json"), std::string::npos) << msg;
  }
  for (const char* sub : {"theta", "scaling"}) {
    nlohmann::json j = good;
    j["rope"].erase(sub);
    std::string msg = test::error_message([&] { ModelConfig::from_json(j, "m/model.json"); });
    EXPECT_NE(msg.find(sub), std::string::npos) << msg;
  }
}

TEST(ModelConfig, BadValuesAreRejected) {
  const nlohmann::json good = tiny_config(QuantType::kQ8).to_json();
  auto expect_bad = [&](const char* key, nlohmann::json v) {
    nlohmann::json j = good;
    j[key] = v;
    std::string msg = test::error_message([&] { ModelConfig::from_json(j, "model.json"); });
    EXPECT_NE(msg.find(key), std::string::npos) << key << ": " << msg;
  };
  expect_bad("architecture", "llama");
  expect_bad("hidden_size", 0);
  expect_bad("hidden_size", "37");
  expect_bad("n_kv_heads", 3);
  expect_bad("n_experts_per_tok", 7);
  expect_bad("qk_norm", "sometimes");
  expect_bad("format_version", 3);
  nlohmann::json j = good;
  j["experts"]["quant"] = "q3";
  EXPECT_THROW(ModelConfig::from_json(j, "model.json"), FormatError);
}

TEST(ModelConfig, GgmlTypesPerLayerMakeVersion2AndRoundTrip) {
  ModelConfig c = test::tiny_moe_config({.vocab = 50, .hidden = 64, .head_dim = 8, .intermediate = 96, .experts = 6});
  EXPECT_EQ(c.to_json()["format_version"], 1);  // pack types only: what older builds read
  c.layer_expert_types = {
      {ggml_quant(GgmlType::kQ8_0), ggml_quant(GgmlType::kQ4_0), ggml_quant(GgmlType::kF16)},
      {ggml_quant(GgmlType::kQ5_0), ggml_quant(GgmlType::kQ5_0), ggml_quant(GgmlType::kQ8_0)}};
  c.expert_quant = c.layer_expert_types[0].gate;
  c.dense_file = "dense.gguf";
  c.dense_dtype = "gguf";
  const nlohmann::json j = c.to_json();
  EXPECT_EQ(j["format_version"], 2);
  EXPECT_EQ(j["experts"]["quant"], "Q8_0");
  EXPECT_EQ(j["experts"]["layer_types"][1][2], "Q8_0");
  const ModelConfig r = ModelConfig::from_json(j, "model.json");
  EXPECT_EQ(r.to_json(), j);
  ASSERT_EQ(r.layer_expert_types.size(), 2u);
  EXPECT_TRUE(r.expert_layout(1).types == c.layer_expert_types[1]);
  EXPECT_EQ(r.max_expert_bytes(), c.max_expert_bytes());
}

TEST(ModelConfig, BadVersion2FieldsAreNamed) {
  ModelConfig c = test::tiny_moe_config({.vocab = 50, .hidden = 64, .head_dim = 8, .intermediate = 96, .experts = 6});
  c.layer_expert_types.assign(2, ExpertTypes::uniform(ggml_quant(GgmlType::kQ8_0)));
  c.expert_quant = ggml_quant(GgmlType::kQ8_0);
  c.dense_dtype = "gguf";
  c.dense_file = "dense.gguf";
  const nlohmann::json good = c.to_json();
  auto expect_bad = [&](const std::string& field, const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = good;
    edit(j);
    const std::string msg = test::error_message([&] { ModelConfig::from_json(j, "dir/model.json"); });
    EXPECT_NE(msg.find("'" + field), std::string::npos) << field << ": " << msg;
    EXPECT_NE(msg.find("dir/model.json"), std::string::npos) << msg;
  };
  expect_bad("experts.layer_types", [](auto& j) { j["experts"]["layer_types"].erase(1); });
  expect_bad("experts.layer_types[1]", [](auto& j) { j["experts"]["layer_types"][1][0] = "Q9_9"; });
  expect_bad("experts.layer_types[0]", [](auto& j) { j["experts"]["layer_types"][0] = {"Q8_0", "Q8_0"}; });
  expect_bad("experts.layer_types[1]", [](auto& j) { j["experts"]["layer_types"][1][2] = "Q4_K"; });  // 96 % 256
  expect_bad("experts.quant", [](auto& j) { j["experts"]["quant"] = "Q4_0"; });  // disagrees with layer 0
  expect_bad("experts.quant", [](auto& j) { j["experts"].erase("layer_types"); j["experts"]["quant"] = "IQ4_XS"; });
  expect_bad("experts.layer_types", [](auto& j) {  // version 1 knows no per-layer types
    j["format_version"] = 1;
    j["dense"] = {{"file", "dense.safetensors"}, {"dtype", "bf16"}};
    j["experts"]["quant"] = "q8";
  });
  expect_bad("dense.dtype", [](auto& j) {
    j["experts"].erase("layer_types");
    j["experts"]["quant"] = "q8";
    j["format_version"] = 1;
  });
  expect_bad("dense.dtype", [](auto& j) { j["dense"]["dtype"] = "q8"; });
  expect_bad("dense.file", [](auto& j) { j["dense"]["file"] = "dense-00001-of-00002.gguf"; });
  expect_bad("format_version", [](auto& j) { j["format_version"] = 3; });
}

TEST(ModelConfig, PathsMustStayInsideTheModelDirectory) {
  const nlohmann::json good = tiny_config(QuantType::kQ8).to_json();
  auto expect_bad = [&](const char* obj, const char* key, const char* value) {
    nlohmann::json j = good;
    j[obj][key] = value;
    std::string msg = test::error_message([&] { ModelConfig::from_json(j, "m/model.json"); });
    EXPECT_NE(msg.find(std::string(obj) + "." + key), std::string::npos) << msg;
    EXPECT_NE(msg.find(value), std::string::npos) << msg;
  };
  expect_bad("dense", "file", "/etc/passwd");
  expect_bad("dense", "file", "../x");
  expect_bad("dense", "file", "a/../../x");
  expect_bad("experts", "dir", "/tmp");
  expect_bad("experts", "dir", "..");
  expect_bad("tokenizer", "file", "../../tokenizer.json");
  expect_bad("tokenizer", "config", "/etc/shadow");
  nlohmann::json j = good;
  j["dense"]["file"] = "";
  EXPECT_THROW(ModelConfig::from_json(j, "model.json"), FormatError);
  j = good;
  j["dense"]["file"] = "sub/dense.safetensors";  // a subdirectory stays inside
  EXPECT_EQ(ModelConfig::from_json(j, "model.json").dense_file, "sub/dense.safetensors");
}

TEST(ModelConfig, TokenIdsMustBeInTheVocabulary) {
  nlohmann::json good = tiny_config(QuantType::kQ8).to_json();
  const int vocab = good["vocab_size"].get<int>();
  for (const char* key : {"eos_token_id", "bos_token_id"}) {
    for (long long id : {(long long)vocab, -1LL, 1LL << 40}) {
      nlohmann::json j = good;
      j[key] = id;
      std::string msg = test::error_message([&] { ModelConfig::from_json(j, "m/model.json"); });
      EXPECT_NE(msg.find(key), std::string::npos) << msg;
      EXPECT_NE(msg.find("m/model.json"), std::string::npos) << msg;
    }
    nlohmann::json j = good;
    j[key] = vocab - 1;
    EXPECT_NO_THROW(ModelConfig::from_json(j, "model.json"));
  }
}

TEST(ModelConfig, ShapesWhoseBuffersWouldOverflowAreRejected) {
  const nlohmann::json good = tiny_config(QuantType::kQ8).to_json();
  auto expect_bad = [&](std::initializer_list<std::pair<const char*, int>> fields, const char* named) {
    nlohmann::json j = good;
    for (const auto& [k, v] : fields) j[k] = v;
    std::string msg = test::error_message([&] { ModelConfig::from_json(j, "model.json"); });
    EXPECT_NE(msg.find(named), std::string::npos) << msg;
  };
  // Each field alone is within [1, 2^30]; their products are not.
  expect_bad({{"vocab_size", 1 << 30}, {"hidden_size", 1 << 30}}, "vocab_size x hidden_size");
  expect_bad({{"moe_intermediate_size", 1 << 25}, {"hidden_size", 1 << 20}}, "moe_intermediate_size x hidden_size");
  expect_bad({{"n_layers", 1 << 30}, {"n_kv_heads", 1 << 10}, {"n_heads", 1 << 10}}, "n_layers x n_kv_heads x head_dim");
  expect_bad({{"n_layers", 1 << 20}, {"n_experts", 1 << 22}, {"n_experts_per_tok", 1}}, "all experts");
  nlohmann::json j = good;
  j["rms_norm_eps"] = -1;
  EXPECT_THROW(ModelConfig::from_json(j, "model.json"), FormatError);
}

TEST(ModelConfig, ModelJsonThatIsNotARegularFileIsRefused) {
  TempDir d;
  fs::create_directory(d.path() / "model.json");
  std::string msg = test::error_message([&] { ModelConfig::load(d.path()); });
  EXPECT_NE(msg.find("not a regular file"), std::string::npos) << msg;
}

TEST(ModelConfig, MissingOrInvalidFileNamesIt) {
  TempDir d;
  EXPECT_THROW(ModelConfig::load(d.path()), IoError);
  write_file_atomic(d.path() / "model.json", "{ not json");
  std::string msg = test::error_message([&] { ModelConfig::load(d.path()); });
  EXPECT_NE(msg.find("model.json"), std::string::npos) << msg;
}
