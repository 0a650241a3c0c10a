// Reader and writer of the safetensors format (Hugging Face checkpoints, our dense.safetensors).
// The reader mmaps the file and validates the header; the writer streams one tensor at a time.
//
// File layout (https://huggingface.co/docs/safetensors):
//   0   8  N: little-endian uint64, byte length of the JSON header
//   8   N  JSON: { "<name>": {"dtype": "F32"|"BF16"|"F16"|..., "shape": [..],
//                             "data_offsets": [begin, end]}, ..., "__metadata__": {str: str} }
//          (may be padded with spaces; the writer pads to a multiple of 8)
//   8+N    data; tensor bytes are [8+N+begin, 8+N+end), row-major, little-endian.
// Validation on open: N fits in the file, JSON parses, every tensor has a known dtype, a shape of
// non-negative dims whose element count times the dtype size equals end-begin (overflow-checked),
// and end <= data size. Errors name the file and the tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/mapping_guard.h"

namespace moestream {

enum class DType { kF32, kF16, kBF16, kF64, kI64, kI32, kI16, kI8, kU8, kBool,
  kF8E4M3,  // float8_e4m3fn of DeepSeek-V3's FP8 checkpoints: raw bytes only (runtime/convert/fp8_weights.h scales them)
};

std::string_view dtype_name(DType d);  // safetensors spelling: "F32", "BF16", ...
size_t dtype_bytes(DType d);

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // absolute offset in the file
  uint64_t bytes = 0;
  uint64_t numel() const;
};

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::filesystem::path& path);  // throws IoError/FormatError
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  // Throws FormatError naming the file and the tensor when absent.
  const TensorInfo& info(const std::string& name) const;
  std::vector<std::string> names() const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Raw bytes of a tensor inside the mapping.
  std::span<const uint8_t> raw(const std::string& name) const;

  // The whole tensor widened to float32 (F32, BF16, F16 only; FormatError otherwise).
  std::vector<float> to_float(const std::string& name) const;
  // Elements [first, first+count) of the flattened tensor, widened to float32 into dst.
  void read_float(const std::string& name, uint64_t first, uint64_t count, float* dst) const;
  // Drops this process's mapping of the whole pages inside elements [first, first+count) (the
  // data stays in the page cache): a converter streaming a checkpoint far larger than RAM keeps
  // its resident set to what it is working on. Reading them again later is still valid.
  void release(const std::string& name, uint64_t first, uint64_t count) const;
  // Like to_float, and checks the shape first: FormatError naming tensor, expected and actual.
  std::vector<float> to_float_checked(const std::string& name, const std::vector<int64_t>& shape) const;
  void check_shape(const std::string& name, const std::vector<int64_t>& shape) const;
  // IoError naming the file and offset when a page of the mapping could not be read (SIGBUS,
  // common/mapping_guard.h), or the file changed since it was opened. raw()'s callers call it
  // after reading; read_float and the header parse check their own reads.
  void check() const { guard_.check(); }

 private:
  std::filesystem::path path_;
  int fd_ = -1;
  const uint8_t* map_ = nullptr;
  size_t map_bytes_ = 0;
  MappingGuard guard_;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

std::string shape_str(const std::vector<int64_t>& shape);  // "[2, 3]"

// Streams a safetensors file: every tensor is declared first (so the header and offsets are
// fixed), then written once each, in any order, from float32 data converted to its dtype.
// Writes `path.tmp.<pid>`; finish() checks all tensors were written, fsyncs and renames.
class SafetensorsWriter {
 public:
  explicit SafetensorsWriter(std::filesystem::path path);
  ~SafetensorsWriter();  // removes the temp file when finish() was not reached
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  void declare(const std::string& name, DType dtype, std::vector<int64_t> shape);
  void set_metadata(const std::string& key, const std::string& value);
  // Writes the declared tensor from numel() floats (dtype F32, BF16 or F16).
  void write(const std::string& name, const float* data, size_t n);
  // Writes raw bytes already in the declared dtype (any dtype).
  void write_raw(const std::string& name, const void* data, size_t bytes);
  void finish();

 private:
  void open_if_needed();
  struct Entry {
    TensorInfo info;
    bool written = false;
  };
  std::filesystem::path path_, tmp_;
  std::vector<Entry> entries_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
  int fd_ = -1;
  uint64_t data_start_ = 0;
  bool created_ = false;
  bool finished_ = false;
};

}  // namespace moestream
