// Test-side writer of GGUF bytes (the layout of loader/format/gguf_file.h), field by field, so a
// test can build a valid file and then break exactly one thing: a count, a length, an offset.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace moestream::test {

// Little-endian encodings of GGUF fields.
std::string gguf_u32(uint32_t v);
std::string gguf_u64(uint64_t v);
std::string gguf_str(std::string_view s);  // u64 length + bytes

class GgufBuilder {
 public:
  std::string magic = "GGUF";
  uint32_t version = 3;
  uint32_t alignment = 32;                 // for automatic offsets and the padding before data
  std::optional<uint64_t> tensor_count;    // override of the header fields (hostile counts)
  std::optional<uint64_t> kv_count;

  // A key with its type id and the encoded value (without the type tag).
  GgufBuilder& kv(std::string key, uint32_t type, std::string value);
  GgufBuilder& kv_u32(std::string key, uint32_t v) { return kv(std::move(key), 4, gguf_u32(v)); }
  GgufBuilder& kv_u64(std::string key, uint64_t v) { return kv(std::move(key), 10, gguf_u64(v)); }
  GgufBuilder& kv_string(std::string key, std::string_view v) { return kv(std::move(key), 8, gguf_str(v)); }
  // A tensor; its data size comes from ggml_row_bytes (32 bytes for an unknown type id) and its
  // offset, unless given, follows the previous tensor's data aligned to `alignment`. A tensor
  // whose size overflows or whose data would end past 64 MiB gets no data in the file.
  GgufBuilder& tensor(std::string name, std::vector<uint64_t> dims, uint32_t type,
                      std::optional<uint64_t> offset = std::nullopt);

  std::string build() const;  // header, metadata, tensor infos, padding, then every tensor's data
  void write(const std::filesystem::path& p) const;
  uint64_t data_bytes(size_t tensor) const { return tensors_.at(tensor).bytes; }

 private:
  struct Kv { std::string key; uint32_t type; std::string value; };
  struct Tensor { std::string name; std::vector<uint64_t> dims; uint32_t type; uint64_t offset, bytes; };
  std::vector<Kv> kvs_;
  std::vector<Tensor> tensors_;
  uint64_t next_offset_ = 0;
  static constexpr uint64_t kMaxDataBytes = uint64_t(1) << 26;
};

void write_bytes(const std::filesystem::path& p, std::string_view bytes);

}  // namespace moestream::test
