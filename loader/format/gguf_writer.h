// Writer of GGUF files (the layout of loader/format/gguf_file.h): header, metadata of every value
// type, tensor infos and the data section, with tensor bytes streamed by the caller so that a
// multi-GB model never sits in memory.
//
// Layout written: version 2 or 3 (little-endian), the metadata in the given order, the tensor
// infos in the given order with offsets assigned in that order (each tensor starts at the next
// multiple of the alignment, counted from the data section), zero padding to the alignment after
// the tensor table and after every tensor's bytes. The alignment is `general.alignment` when the
// metadata hold it (a power of two in [1, kGgufMaxAlignment], else ConfigError), else 32.
//
// The metadata and tensors are held to the reader's limits (gguf_file.h: key count, metadata
// bytes, array lengths and nesting) before anything is created (ConfigError naming the limit),
// and commit() reads the finished temp file back with GgufFile before renaming it: a file this
// build writes is one it reads.
//
// Crash safety: everything goes to `<path>.tmp.<pid>` (created exclusively); commit() checks that
// every tensor got all its bytes, fsyncs, renames over `path` and fsyncs the directory. Until
// commit() an existing `path` is untouched; a writer destroyed without commit() removes its temp
// file. Paths given as `protect` (the sources) are never replaced: ConfigError when `path` is one
// of them (same file, by device and inode, or the same name).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "loader/format/ggml_types.h"
#include "loader/format/gguf_metadata.h"

namespace moestream {

struct GgufTensorSpec {
  std::string name;
  GgmlType type = GgmlType::kF32;
  std::vector<uint64_t> dims;  // ne0 (the row length) first, 1 to 4 dims, each >= 1
};

struct GgufWriterOptions {
  uint32_t version = 3;                          // 2 or 3
  std::vector<std::filesystem::path> protect;    // files `path` must not be
};

// The bytes of `md` as GGUF stores them after the header counts (key, type, value for each).
// ConfigError for a key or string longer than the reader's limits (gguf_file.h).
std::string encode_gguf_metadata(const GgufMetadata& md);

class GgufWriter {
 public:
  // Validates the tensors (unique names of at most kGgufMaxKeyBytes, 1..4 dims >= 1, rows that
  // are whole blocks, no size overflow: ConfigError naming the tensor), opens the temp file and
  // writes everything up to the data section. IoError naming the file when it cannot.
  GgufWriter(std::filesystem::path path, const GgufMetadata& md, std::vector<GgufTensorSpec> tensors,
             GgufWriterOptions opts = {});
  ~GgufWriter();  // removes the temp file unless committed; never throws
  GgufWriter(const GgufWriter&) = delete;
  GgufWriter& operator=(const GgufWriter&) = delete;

  // The next n bytes of tensor data, in tensor order; a tensor that is complete is padded and the
  // next one begins. ConfigError when n runs past the last tensor.
  void write(const void* data, uint64_t n);
  // ConfigError when a tensor is incomplete; FormatError when the temp file does not read back as
  // written; IoError when fsync or rename fails. The temp file is removed on any failure.
  void commit();

  uint32_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }            // absolute start of the data section
  uint64_t tensor_bytes(size_t i) const { return bytes_.at(i); }
  uint64_t tensor_offset(size_t i) const { return offsets_.at(i); }  // relative to the data section
  size_t current_tensor() const { return cur_; }                    // == tensor count when all are written
  uint64_t file_bytes() const { return end_; }                      // bytes of the finished file
  const std::filesystem::path& temp_path() const { return tmp_; }

 private:
  void put(const void* p, uint64_t n);  // buffered append at the file's end
  void pad_to_alignment();
  void flush();
  void check_not_protected() const;
  void verify_temp() const;  // the finished temp file through GgufFile: what it reads is what was written

  std::filesystem::path path_, tmp_;
  GgufWriterOptions opts_;
  uint32_t alignment_ = 32;
  int fd_ = -1;
  bool committed_ = false;
  std::vector<GgufTensorSpec> tensors_;
  std::vector<uint64_t> bytes_, offsets_;
  uint64_t data_offset_ = 0, end_ = 0, flushed_ = 0;
  size_t cur_ = 0;
  uint64_t in_cur_ = 0;  // bytes of tensor cur_ written
  std::string buf_;
};

}  // namespace moestream
