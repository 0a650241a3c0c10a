// Implementation of tests/support/gguf_builder.h.
#include "tests/support/gguf_builder.h"

#include <cstring>
#include <fstream>
#include <stdexcept>

#include "loader/format/ggml_types.h"

namespace moestream::test {

std::string gguf_u32(uint32_t v) { return std::string(reinterpret_cast<const char*>(&v), 4); }
std::string gguf_u64(uint64_t v) { return std::string(reinterpret_cast<const char*>(&v), 8); }
std::string gguf_str(std::string_view s) { return gguf_u64(s.size()) + std::string(s); }

GgufBuilder& GgufBuilder::kv(std::string key, uint32_t type, std::string value) {
  kvs_.push_back({std::move(key), type, std::move(value)});
  return *this;
}

GgufBuilder& GgufBuilder::tensor(std::string name, std::vector<uint64_t> dims, uint32_t type,
                                 std::optional<uint64_t> offset) {
  // Hostile shapes may overflow: such a tensor gets no data (bytes 0) and the file stays small.
  uint64_t bytes = 32;
  if (const auto info = ggml_type_info(type); info && !dims.empty()) {
    const auto row = ggml_row_bytes(info->type, dims[0]);
    bytes = row ? *row : 32;
    for (size_t i = 1; i < dims.size(); ++i)
      if (__builtin_mul_overflow(bytes, dims[i], &bytes)) bytes = 0;
  }
  const uint64_t off = offset ? *offset : next_offset_;
  uint64_t end;
  if (__builtin_add_overflow(off, bytes, &end) || end > kMaxDataBytes) bytes = 0;
  if (!offset) next_offset_ = (off + bytes + alignment - 1) / alignment * alignment;
  tensors_.push_back({std::move(name), std::move(dims), type, off, bytes});
  return *this;
}

std::string GgufBuilder::build() const {
  std::string out = magic + gguf_u32(version) + gguf_u64(tensor_count.value_or(tensors_.size())) +
                    gguf_u64(kv_count.value_or(kvs_.size()));
  for (const Kv& k : kvs_) out += gguf_str(k.key) + gguf_u32(k.type) + k.value;
  for (const Tensor& t : tensors_) {
    out += gguf_str(t.name) + gguf_u32(static_cast<uint32_t>(t.dims.size()));
    for (uint64_t d : t.dims) out += gguf_u64(d);
    out += gguf_u32(t.type) + gguf_u64(t.offset);
  }
  out.resize((out.size() + alignment - 1) / alignment * alignment, '\0');
  // The data: each tensor's bytes at its offset (a distinct byte value per tensor), the file
  // ending where the furthest tensor ends.
  const uint64_t data = out.size();
  uint64_t end = 0;
  for (const Tensor& t : tensors_)
    if (t.bytes) end = std::max(end, t.offset + t.bytes);
  out.resize(data + end, '\0');
  for (size_t i = 0; i < tensors_.size(); ++i)
    if (tensors_[i].bytes) std::memset(out.data() + data + tensors_[i].offset, int(i + 1), tensors_[i].bytes);
  return out;
}

void GgufBuilder::write(const std::filesystem::path& p) const { write_bytes(p, build()); }

void write_bytes(const std::filesystem::path& p, std::string_view bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw std::runtime_error("cannot write " + p.string());
}

}  // namespace moestream::test
