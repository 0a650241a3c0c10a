// Implementation of GgufFile (loader/format/gguf_file.h): a bounded, buffered pread parser of the
// header, metadata and tensor table, then the checks that tie tensors to the file's bytes.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <numeric>

#include "common/error.h"
#include "common/file_util.h"
#include "loader/format/gguf_file.h"

namespace moestream {

// Parses one file into a GgufFile. Every count and length is checked against the bytes left in
// the file (and the limits of gguf_file.h) before anything is allocated for it.
class GgufParser {
 public:
  GgufParser(GgufFile& f, int fd) : f_(f), fd_(fd), size_(f.file_bytes_) {}

  void run() {
    ctx_ = "header";
    char magic[4];
    read(magic, 4, "magic");
    if (std::memcmp(magic, "GGUF", 4) != 0) {
      fail("bad magic " + hex(magic, 4) + " at offset 0 (expected \"GGUF\"): not a GGUF file");
    }
    version();
    const uint64_t n_tensors = u64("tensor_count");
    const uint64_t n_kv = u64("kv_count");
    if (n_kv > kGgufMaxKeys) fail("kv_count " + std::to_string(n_kv) + " exceeds the limit of " + std::to_string(kGgufMaxKeys));
    if (n_tensors > kGgufMaxTensors)
      fail("tensor_count " + std::to_string(n_tensors) + " exceeds the limit of " + std::to_string(kGgufMaxTensors));
    // Each key/value takes at least 14 bytes, each tensor info 28: counts the file cannot hold
    // are refused before the loops.
    if (n_kv * 14 > size_ - pos_ || n_tensors * 28 > size_ - pos_)
      fail("kv_count " + std::to_string(n_kv) + " and tensor_count " + std::to_string(n_tensors) +
           " need more bytes than the file's " + std::to_string(size_) + " (truncated or corrupt)");
    metadata(n_kv);
    alignment();
    tensor_infos(n_tensors);
    check_tensor_placement();
  }

 private:
  [[noreturn]] void fail(const std::string& msg) const {
    throw FormatError(f_.path_.string() + ": " + ctx_ + ": " + msg);
  }

  static std::string hex(const void* p, size_t n) {
    static const char* kDigits = "0123456789abcdef";
    std::string s = "0x";
    for (size_t i = 0; i < n; ++i) {
      const auto b = static_cast<const uint8_t*>(p)[i];
      s += kDigits[b >> 4];
      s += kDigits[b & 15];
    }
    return s;
  }

  // Fails unless n more bytes exist (and, inside the metadata, fit its size limit).
  void need(uint64_t n, const char* what) const {
    if (n > size_ - pos_)
      fail(std::string("truncated: ") + what + " at offset " + std::to_string(pos_) + " needs " +
           std::to_string(n) + " bytes, the file has " + std::to_string(size_));
    if (in_metadata_ && pos_ + n - kv_start_ > kGgufMaxMetadataBytes)
      fail("metadata exceed the limit of " + std::to_string(kGgufMaxMetadataBytes) + " bytes");
  }

  void read(void* dst, uint64_t n, const char* what) {
    need(n, what);
    auto* out = static_cast<char*>(dst);
    while (n > 0) {
      if (pos_ < buf_off_ || pos_ >= buf_off_ + buf_.size()) refill();
      const uint64_t at = pos_ - buf_off_;
      const uint64_t k = std::min<uint64_t>(n, buf_.size() - at);
      std::memcpy(out, buf_.data() + at, k);
      out += k;
      pos_ += k;
      n -= k;
    }
  }

  // Loads up to kChunk bytes at pos_ (the parser reads forward: 1 MiB amortises the syscalls
  // for a vocabulary of 150k short strings).
  void refill() {
    static constexpr uint64_t kChunk = 1 << 20;
    const uint64_t n = std::min<uint64_t>(kChunk, size_ - pos_);
    buf_.resize(n);
    uint64_t done = 0;
    while (done < n) {
      const ssize_t r = ::pread(fd_, buf_.data() + done, n - done, static_cast<off_t>(pos_ + done));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) throw_errno("cannot read at offset " + std::to_string(pos_ + done) + " of GGUF file", f_.path_);
      if (r == 0) throw IoError(f_.path_.string() + ": file shrank while being read (EOF at offset " +
                                std::to_string(pos_ + done) + ")");
      done += static_cast<uint64_t>(r);
    }
    buf_off_ = pos_;
  }

  template <typename T>
  T scalar(const char* what) {
    T v;
    read(&v, sizeof v, what);
    return v;  // little-endian host: the only byte order accepted (checked with the version)
  }
  uint32_t u32(const char* what) { return scalar<uint32_t>(what); }
  uint64_t u64(const char* what) { return scalar<uint64_t>(what); }

  void version() {
    const uint32_t v = u32("version");
    const uint32_t swapped = __builtin_bswap32(v);
    if (v == 2 || v == 3) {
      f_.version_ = v;
      return;
    }
    if (v == 1) fail("GGUF version 1 is not supported (versions 2 and 3 are); convert the file again");
    if ((v & 0xffff) == 0 && swapped >= 1 && swapped <= 0xffff)
      fail("big-endian GGUF (version field reads " + std::to_string(v) + ", version " + std::to_string(swapped) +
           " byte-swapped); only little-endian files are supported");
    fail("unsupported GGUF version " + std::to_string(v) + " (versions 2 and 3 are)");
  }

  // A string of at most `max` bytes.
  std::string string(uint64_t max, const char* what) {
    const uint64_t n = u64(what);
    if (n > max) fail(std::string(what) + " length " + std::to_string(n) + " exceeds the limit of " + std::to_string(max));
    need(n, what);
    std::string s(n, '\0');
    read(s.data(), n, what);
    return s;
  }

  GgufValueType value_type(const char* what) {
    const uint32_t t = u32(what);
    if (t > static_cast<uint32_t>(GgufValueType::kF64)) fail(std::string("unknown ") + what + " " + std::to_string(t));
    return static_cast<GgufValueType>(t);
  }

  GgufValue value(GgufValueType t, uint32_t depth) {
    switch (t) {
      case GgufValueType::kU8: return GgufValue::from_unsigned(t, scalar<uint8_t>("u8 value"));
      case GgufValueType::kI8: return GgufValue::from_signed(t, scalar<int8_t>("i8 value"));
      case GgufValueType::kU16: return GgufValue::from_unsigned(t, scalar<uint16_t>("u16 value"));
      case GgufValueType::kI16: return GgufValue::from_signed(t, scalar<int16_t>("i16 value"));
      case GgufValueType::kU32: return GgufValue::from_unsigned(t, scalar<uint32_t>("u32 value"));
      case GgufValueType::kI32: return GgufValue::from_signed(t, scalar<int32_t>("i32 value"));
      case GgufValueType::kU64: return GgufValue::from_unsigned(t, scalar<uint64_t>("u64 value"));
      case GgufValueType::kI64: return GgufValue::from_signed(t, scalar<int64_t>("i64 value"));
      case GgufValueType::kF32: return GgufValue::from_float(t, scalar<float>("f32 value"));
      case GgufValueType::kF64: return GgufValue::from_float(t, scalar<double>("f64 value"));
      case GgufValueType::kBool: return GgufValue::from_unsigned(t, scalar<uint8_t>("bool value") != 0);
      case GgufValueType::kString: return GgufValue::from_string(string(kGgufMaxStringBytes, "string value"));
      case GgufValueType::kArray: return GgufValue::from_array(array(depth + 1));
    }
    MOE_ASSERT(false, "value type checked by value_type()");
    return {};
  }

  std::shared_ptr<const GgufArray> array(uint32_t depth) {
    if (depth > kGgufMaxNesting) fail("arrays nested deeper than " + std::to_string(kGgufMaxNesting));
    const GgufValueType elem = value_type("array element type");
    const uint64_t n = u64("array length");
    if (n > kGgufMaxArrayElems)
      fail("array length " + std::to_string(n) + " exceeds the limit of " + std::to_string(kGgufMaxArrayElems));
    auto a = std::make_shared<GgufArray>(elem);
    const uint32_t elem_bytes = gguf_value_type_bytes(elem);
    if (elem_bytes != 0) {  // fixed-size elements: one bounded read into the packed store
      need(n * elem_bytes, "array elements");
      std::string raw(n * elem_bytes, '\0');
      read(raw.data(), raw.size(), "array elements");
      a->append_raw(raw.data(), n);
      return a;
    }
    const uint64_t min_elem = elem == GgufValueType::kString ? 8 : 12;  // length, or type + count
    need(n * min_elem, "array elements");
    if (elem == GgufValueType::kString) {
      a->reserve(n, 0);
      std::string s;
      for (uint64_t i = 0; i < n; ++i) {
        const uint64_t len = u64("string element length");
        if (len > kGgufMaxStringBytes)
          fail("string element " + std::to_string(i) + " length " + std::to_string(len) + " exceeds the limit");
        need(len, "string element");
        s.resize(len);
        read(s.data(), len, "string element");
        a->append_string(s);
      }
      return a;
    }
    a->reserve(n, 0);
    for (uint64_t i = 0; i < n; ++i) {
      if (++nested_arrays_ > kGgufMaxNestedArrays)
        fail("more than " + std::to_string(kGgufMaxNestedArrays) + " nested arrays");
      a->append_array(array(depth + 1));
    }
    return a;
  }

  void metadata(uint64_t n_kv) {
    f_.metadata_ = GgufMetadata(f_.path_.string());
    in_metadata_ = true;
    kv_start_ = pos_;
    for (uint64_t i = 0; i < n_kv; ++i) {
      ctx_ = "metadata entry " + std::to_string(i);
      std::string key = string(kGgufMaxKeyBytes, "key");
      if (key.empty()) fail("empty key");
      ctx_ = "metadata key '" + key + "'";
      const GgufValueType t = value_type("value type");
      GgufValue v = value(t, 0);
      if (!f_.metadata_.add(key, std::move(v))) fail("duplicate key");
    }
    in_metadata_ = false;
  }

  void alignment() {
    ctx_ = "metadata key 'general.alignment'";
    const auto a = f_.metadata_.find_u32("general.alignment");  // type errors name file and key
    if (!a) return;
    if (*a == 0 || (*a & (*a - 1)) != 0 || *a > kGgufMaxAlignment)
      fail("alignment " + std::to_string(*a) + " is not a power of two in [1, " + std::to_string(kGgufMaxAlignment) + "]");
    f_.alignment_ = *a;
  }

  void tensor_infos(uint64_t n) {
    f_.tensors_.reserve(n);
    for (uint64_t i = 0; i < n; ++i) {
      ctx_ = "tensor info " + std::to_string(i);
      GgufTensor t;
      t.name = string(kGgufMaxKeyBytes, "tensor name");
      if (t.name.empty()) fail("empty tensor name");
      ctx_ = "tensor '" + t.name + "'";
      const uint32_t n_dims = u32("n_dims");
      if (n_dims == 0 || n_dims > kGgufMaxDims)
        fail("n_dims " + std::to_string(n_dims) + " is not in [1, " + std::to_string(kGgufMaxDims) + "]");
      t.n_elements = 1;
      for (uint32_t d = 0; d < n_dims; ++d) {
        const uint64_t ne = u64("dimension");
        if (ne == 0 || ne > uint64_t(INT64_MAX)) fail("dimension " + std::to_string(d) + " is " + std::to_string(ne));
        if (__builtin_mul_overflow(t.n_elements, ne, &t.n_elements) || t.n_elements > uint64_t(INT64_MAX))
          fail("element count overflows (dims " + dims_str(t.dims, ne) + ")");
        t.dims.push_back(ne);
      }
      const uint32_t type_id = u32("ggml type");
      const auto info = ggml_type_info(type_id);
      if (!info) fail("unknown ggml type id " + std::to_string(type_id));
      t.type = info->type;
      const uint64_t offset = u64("offset");
      const auto row = ggml_row_bytes(t.type, t.dims[0]);
      if (!row && t.dims[0] % info->block_elems == 0) fail("row byte size overflows");
      if (!row)
        fail("row length " + std::to_string(t.dims[0]) + " is not a multiple of the " + std::string(info->name) +
             " block of " + std::to_string(info->block_elems) + " elements");
      if (__builtin_mul_overflow(*row, t.rows(), &t.bytes)) fail("byte size overflows");
      if (offset % f_.alignment_ != 0)
        fail("data offset " + std::to_string(offset) + " is not a multiple of the alignment " + std::to_string(f_.alignment_));
      t.offset = offset;  // relative until the data section is known
      if (!f_.index_.emplace(t.name, f_.tensors_.size()).second) fail("duplicate tensor name");
      f_.tensors_.push_back(std::move(t));
    }
    ctx_ = "tensor data";
    const uint64_t a = f_.alignment_;
    f_.data_offset_ = (pos_ + a - 1) / a * a;  // pos_ <= file size < 2^63: no overflow
  }

  static std::string dims_str(const std::vector<uint64_t>& dims, uint64_t last) {
    std::string s = "[";
    for (uint64_t d : dims) s += std::to_string(d) + ", ";
    return s + std::to_string(last) + "]";
  }

  void check_tensor_placement() {
    for (GgufTensor& t : f_.tensors_) {
      ctx_ = "tensor '" + t.name + "'";
      const uint64_t rel = t.offset;
      uint64_t end;
      if (__builtin_add_overflow(f_.data_offset_, rel, &t.offset) || __builtin_add_overflow(t.offset, t.bytes, &end) ||
          end > size_)
        fail("data [" + std::to_string(rel) + ", +" + std::to_string(t.bytes) + ") of the data section at " +
             std::to_string(f_.data_offset_) + " ends past the end of the file (" + std::to_string(size_) +
             " bytes; truncated?)");
    }
    std::vector<size_t> order(f_.tensors_.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return f_.tensors_[a].offset < f_.tensors_[b].offset; });
    for (size_t i = 1; i < order.size(); ++i) {
      const GgufTensor& prev = f_.tensors_[order[i - 1]];
      const GgufTensor& cur = f_.tensors_[order[i]];
      if (prev.offset + prev.bytes > cur.offset) {
        ctx_ = "tensor '" + cur.name + "'";
        fail("data at offset " + std::to_string(cur.offset) + " overlaps tensor '" + prev.name + "' [" +
             std::to_string(prev.offset) + ", " + std::to_string(prev.offset + prev.bytes) + ")");
      }
    }
  }

  GgufFile& f_;
  int fd_;
  uint64_t size_;
  uint64_t pos_ = 0;
  std::string buf_;
  uint64_t buf_off_ = 0;
  std::string ctx_;
  bool in_metadata_ = false;
  uint64_t kv_start_ = 0;
  uint64_t nested_arrays_ = 0;
};

GgufFile::GgufFile(const std::filesystem::path& path) : path_(path) {
  const int fd = open_for_read(path, "GGUF file", &file_bytes_);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  GgufParser(*this, fd).run();
}

const GgufTensor* GgufFile::find_tensor(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const GgufTensor& GgufFile::tensor(std::string_view name) const {
  const GgufTensor* t = find_tensor(name);
  if (!t) throw FormatError(path_.string() + ": no tensor '" + std::string(name) + "'");
  return *t;
}

}  // namespace moestream
