// Implementation of GgufWriter (loader/format/gguf_writer.h).
#include "loader/format/gguf_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <unordered_set>

#include "common/error.h"
#include "common/file_util.h"
#include "loader/format/gguf_file.h"

namespace fs = std::filesystem;

namespace moestream {

namespace {

constexpr uint64_t kFlushBytes = 8ull << 20;  // buffered writes: large sequential pwrites

template <typename T>
void put_le(std::string& s, T v) {
  char b[sizeof v];
  std::memcpy(b, &v, sizeof v);  // little-endian host (the reader accepts only little-endian)
  s.append(b, sizeof v);
}

void put_string(std::string& s, std::string_view v, uint64_t max, const std::string& what) {
  if (v.size() > max)
    throw ConfigError("GGUF writer: " + what + " is " + std::to_string(v.size()) + " bytes, over the limit of " +
                      std::to_string(max));
  put_le<uint64_t>(s, v.size());
  s.append(v);
}

// `nested` counts the arrays inside arrays written so far (the reader's kGgufMaxNestedArrays).
void put_array(std::string& s, const GgufArray& a, const std::string& key, uint32_t depth, uint64_t& nested) {
  if (depth > kGgufMaxNesting) throw ConfigError("GGUF writer: key '" + key + "': arrays nested too deeply");
  if (a.size() > kGgufMaxArrayElems)
    throw ConfigError("GGUF writer: key '" + key + "': an array of " + std::to_string(a.size()) +
                      " elements, over the limit of " + std::to_string(kGgufMaxArrayElems));
  put_le<uint32_t>(s, static_cast<uint32_t>(a.elem_type()));
  put_le<uint64_t>(s, a.size());
  const GgufValueType t = a.elem_type();
  if (t == GgufValueType::kString) {
    for (uint64_t i = 0; i < a.size(); ++i) put_string(s, a.string_at(i), kGgufMaxStringBytes, "a string of key '" + key + "'");
  } else if (t == GgufValueType::kArray) {
    for (uint64_t i = 0; i < a.size(); ++i) {
      if (++nested > kGgufMaxNestedArrays)
        throw ConfigError("GGUF writer: key '" + key + "': more than " + std::to_string(kGgufMaxNestedArrays) +
                          " arrays inside arrays");
      put_array(s, *a.element(i).to_array(), key, depth + 1, nested);
    }
  } else {
    // Fixed-size elements are kept as the packed little-endian bytes GGUF stores.
    if (a.raw().size() != a.size() * gguf_value_type_bytes(t))
      throw ConfigError("GGUF writer: key '" + key + "': array bytes do not match its element count");
    s.append(a.raw());
  }
}

void put_value(std::string& s, const GgufValue& v, const std::string& key, uint64_t& nested) {
  auto bad = [&]() -> ConfigError { return ConfigError("GGUF writer: key '" + key + "': value " + v.describe() + " cannot be encoded"); };
  switch (v.type()) {
    case GgufValueType::kU8: put_le<uint8_t>(s, uint8_t(v.to_unsigned().value())); break;
    case GgufValueType::kU16: put_le<uint16_t>(s, uint16_t(v.to_unsigned().value())); break;
    case GgufValueType::kU32: put_le<uint32_t>(s, uint32_t(v.to_unsigned().value())); break;
    case GgufValueType::kU64: put_le<uint64_t>(s, v.to_unsigned().value()); break;
    case GgufValueType::kI8: put_le<int8_t>(s, int8_t(v.to_signed().value())); break;
    case GgufValueType::kI16: put_le<int16_t>(s, int16_t(v.to_signed().value())); break;
    case GgufValueType::kI32: put_le<int32_t>(s, int32_t(v.to_signed().value())); break;
    case GgufValueType::kI64: put_le<int64_t>(s, v.to_signed().value()); break;
    case GgufValueType::kF32: put_le<float>(s, float(v.to_float().value())); break;  // held exactly
    case GgufValueType::kF64: put_le<double>(s, v.to_float().value()); break;
    case GgufValueType::kBool: put_le<uint8_t>(s, v.to_bool().value() ? 1 : 0); break;
    case GgufValueType::kString: put_string(s, *v.to_string(), kGgufMaxStringBytes, "the string of key '" + key + "'"); break;
    case GgufValueType::kArray: put_array(s, *v.to_array(), key, 1, nested); break;
    default: throw bad();
  }
}

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

}  // namespace

std::string encode_gguf_metadata(const GgufMetadata& md) {
  // The reader's limits (gguf_file.h), so that no file written here is one it refuses.
  if (md.size() > kGgufMaxKeys)
    throw ConfigError("GGUF writer: " + std::to_string(md.size()) + " metadata keys, over the limit of " +
                      std::to_string(kGgufMaxKeys) + " a GGUF may hold here");
  std::string s;
  uint64_t nested = 0;
  for (const GgufKv& kv : md.entries()) {
    if (kv.key.empty()) throw ConfigError("GGUF writer: an empty metadata key");
    put_string(s, kv.key, kGgufMaxKeyBytes, "key '" + kv.key.substr(0, 64) + "'");
    put_le<uint32_t>(s, static_cast<uint32_t>(kv.value.type()));
    put_value(s, kv.value, kv.key, nested);
    if (s.size() > kGgufMaxMetadataBytes)
      throw ConfigError("GGUF writer: the metadata exceed the limit of " + std::to_string(kGgufMaxMetadataBytes) +
                        " bytes at key '" + kv.key.substr(0, 64) + "'");
  }
  return s;
}

GgufWriter::GgufWriter(fs::path path, const GgufMetadata& md, std::vector<GgufTensorSpec> tensors,
                       GgufWriterOptions opts)
    : path_(std::move(path)), opts_(std::move(opts)), tensors_(std::move(tensors)) {
  if (opts_.version != 2 && opts_.version != 3)
    throw ConfigError("GGUF writer: version " + std::to_string(opts_.version) + " (2 and 3 are written)");
  if (const GgufValue* a = md.find("general.alignment")) {
    const auto v = a->to_unsigned();
    if (a->type() != GgufValueType::kU32 || !v || *v == 0 || *v > kGgufMaxAlignment || (*v & (*v - 1)) != 0)
      throw ConfigError("GGUF writer: general.alignment " + a->describe() + " is not a u32 power of two in [1, " +
                        std::to_string(kGgufMaxAlignment) + "]");
    alignment_ = uint32_t(*v);
  }
  if (tensors_.size() > kGgufMaxTensors) throw ConfigError("GGUF writer: too many tensors");
  // Tensor table: sizes and offsets in the given order.
  std::unordered_set<std::string> names;
  uint64_t off = 0;
  for (const GgufTensorSpec& t : tensors_) {
    const std::string what = "GGUF writer: tensor '" + t.name + "'";
    if (t.name.empty() || t.name.size() > kGgufMaxKeyBytes) throw ConfigError(what + ": name empty or too long");
    if (!names.insert(t.name).second) throw ConfigError(what + ": name given twice");
    if (t.dims.empty() || t.dims.size() > kGgufMaxDims) throw ConfigError(what + ": needs 1 to 4 dims");
    uint64_t rows = 1;
    for (size_t d = 0; d < t.dims.size(); ++d) {
      if (t.dims[d] == 0) throw ConfigError(what + ": a dim is 0");
      if (d > 0 && __builtin_mul_overflow(rows, t.dims[d], &rows)) throw ConfigError(what + ": size overflows");
    }
    const auto row = ggml_row_bytes(t.type, t.dims[0]);
    uint64_t bytes = 0;
    if (!row) throw ConfigError(what + ": row of " + std::to_string(t.dims[0]) + " is not whole blocks of " +
                                std::string(ggml_type_name(t.type)));
    if (__builtin_mul_overflow(*row, rows, &bytes) || bytes > (uint64_t(1) << 62)) throw ConfigError(what + ": size overflows");
    off = align_up(off, alignment_);
    offsets_.push_back(off);
    bytes_.push_back(bytes);
    off += bytes;
  }
  check_not_protected();
  // Everything the reader could refuse is refused before the temp file exists (a constructor that
  // throws runs no destructor to remove it).
  std::string head("GGUF", 4);
  put_le<uint32_t>(head, opts_.version);
  put_le<uint64_t>(head, tensors_.size());
  put_le<uint64_t>(head, md.size());
  head += encode_gguf_metadata(md);
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const GgufTensorSpec& t = tensors_[i];
    put_string(head, t.name, kGgufMaxKeyBytes, "tensor name");
    put_le<uint32_t>(head, uint32_t(t.dims.size()));
    for (uint64_t d : t.dims) put_le<uint64_t>(head, d);
    put_le<uint32_t>(head, static_cast<uint32_t>(t.type));
    put_le<uint64_t>(head, offsets_[i]);
  }
  tmp_ = path_;
  tmp_ += ".tmp." + std::to_string(::getpid());
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_ < 0) throw_errno("cannot create GGUF temp file", tmp_);
  put(head.data(), head.size());
  pad_to_alignment();
  data_offset_ = end_;
}

GgufWriter::~GgufWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !tmp_.empty()) ::unlink(tmp_.c_str());
}

void GgufWriter::check_not_protected() const {
  std::error_code ec;
  for (const fs::path& p : opts_.protect) {
    const bool same_name = fs::weakly_canonical(p, ec) == fs::weakly_canonical(path_, ec);
    const bool same_file = fs::exists(path_, ec) && fs::exists(p, ec) && fs::equivalent(p, path_, ec);
    if (same_name || same_file)
      throw ConfigError("GGUF writer: refusing to overwrite the source " + p.string() + " (output " + path_.string() + ")");
  }
}

void GgufWriter::verify_temp() const {
  const GgufFile check(tmp_);  // FormatError naming the temp file and what the reader refuses
  bool same = check.tensors().size() == tensors_.size() && check.data_offset() == data_offset_ &&
              check.file_bytes() == end_;
  for (size_t i = 0; same && i < tensors_.size(); ++i) {
    const GgufTensor& t = check.tensors()[i];
    same = t.name == tensors_[i].name && t.offset == data_offset_ + offsets_[i] && t.bytes == bytes_[i];
  }
  if (!same)
    throw FormatError("GGUF writer: " + tmp_.string() + " reads back with " + std::to_string(check.tensors().size()) +
                      " tensors, data at " + std::to_string(check.data_offset()) + ", " +
                      std::to_string(check.file_bytes()) + " bytes; written: " + std::to_string(tensors_.size()) +
                      " tensors, data at " + std::to_string(data_offset_) + ", " + std::to_string(end_) + " bytes");
}

void GgufWriter::put(const void* p, uint64_t n) {
  buf_.append(static_cast<const char*>(p), n);
  end_ += n;
  if (buf_.size() >= kFlushBytes) flush();
}

void GgufWriter::flush() {
  if (buf_.empty()) return;
  pwrite_all(fd_, buf_.data(), buf_.size(), flushed_, tmp_);
  flushed_ += buf_.size();
  buf_.clear();
}

void GgufWriter::pad_to_alignment() {
  static const char kZeros[64] = {};
  uint64_t n = align_up(end_, alignment_) - end_;
  while (n > 0) {
    const uint64_t k = std::min<uint64_t>(n, sizeof kZeros);
    put(kZeros, k);
    n -= k;
  }
}

void GgufWriter::write(const void* data, uint64_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    if (cur_ >= tensors_.size())
      throw ConfigError("GGUF writer: " + path_.string() + ": " + std::to_string(n) + " bytes past the last tensor");
    const uint64_t k = std::min(n, bytes_[cur_] - in_cur_);
    put(p, k);
    p += k;
    n -= k;
    in_cur_ += k;
    if (in_cur_ == bytes_[cur_]) {
      pad_to_alignment();
      ++cur_;
      in_cur_ = 0;
    }
  }
}

void GgufWriter::commit() {
  if (committed_) return;
  if (cur_ < tensors_.size())
    throw ConfigError("GGUF writer: " + path_.string() + ": tensor '" + tensors_[cur_].name + "' has " +
                      std::to_string(in_cur_) + " of its " + std::to_string(bytes_[cur_]) + " bytes");
  flush();
  if (::fsync(fd_) != 0) throw_errno("cannot fsync", tmp_);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) throw_errno("cannot close", tmp_);
  verify_temp();
  check_not_protected();  // again: the output path may have become a source's link meanwhile
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) throw_errno("cannot rename " + tmp_.string() + " to", path_);
  committed_ = true;
  const fs::path dir = path_.parent_path().empty() ? fs::path(".") : path_.parent_path();
  fsync_path(dir);
}

}  // namespace moestream
