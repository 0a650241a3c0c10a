// Implementation of loader/format/safetensors.h: mmap reader with overflow-safe header validation and
// a streaming writer (declare, write each tensor with pwrite, fsync, rename).
#include "loader/format/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/file_util.h"
#include "common/half.h"

namespace moestream {
namespace {

using nlohmann::json;

// Headers of real checkpoints are well under 1 MiB; 100 MB matches the reference implementation.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

bool parse_dtype(const std::string& s, DType& d) {
  static const std::pair<const char*, DType> kTable[] = {
      {"F32", DType::kF32}, {"F16", DType::kF16}, {"BF16", DType::kBF16}, {"F64", DType::kF64},
      {"I64", DType::kI64}, {"I32", DType::kI32}, {"I16", DType::kI16},   {"I8", DType::kI8},
      {"U8", DType::kU8},   {"BOOL", DType::kBool}, {"F8_E4M3", DType::kF8E4M3}};
  for (auto& [name, v] : kTable)
    if (s == name) {
      d = v;
      return true;
    }
  return false;
}

// n 16-bit floats at src (any alignment) to float through ToF32.
template <float (*ToF32)(uint16_t)>
void widen_16bit(const uint8_t* src, uint64_t n, float* dst) {
  for (uint64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, 2);
    dst[i] = ToF32(h);
  }
}

void convert_to_float(DType d, const uint8_t* src, uint64_t n, float* dst) {
  switch (d) {
    case DType::kF32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::kBF16:
      widen_16bit<bf16_to_f32>(src, n, dst);
      return;
    case DType::kF16:
      widen_16bit<f16_to_f32>(src, n, dst);
      return;
    default:
      MOE_ASSERT(false, "convert_to_float on a non-float dtype");
  }
}

}  // namespace

std::string_view dtype_name(DType d) {
  switch (d) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kF64: return "F64";
    case DType::kI64: return "I64";
    case DType::kI32: return "I32";
    case DType::kI16: return "I16";
    case DType::kI8: return "I8";
    case DType::kU8: return "U8";
    case DType::kBool: return "BOOL";
    case DType::kF8E4M3: return "F8_E4M3";
  }
  return "?";
}

size_t dtype_bytes(DType d) {
  switch (d) {
    case DType::kF64: case DType::kI64: return 8;
    case DType::kF32: case DType::kI32: return 4;
    case DType::kF16: case DType::kBF16: case DType::kI16: return 2;
    case DType::kI8: case DType::kU8: case DType::kBool: case DType::kF8E4M3: return 1;
  }
  return 0;
}

uint64_t TensorInfo::numel() const {
  uint64_t n = 1;
  for (int64_t s : shape) n *= static_cast<uint64_t>(s);
  return n;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

SafetensorsFile::SafetensorsFile(const std::filesystem::path& path) : path_(path) {
  uint64_t file_bytes = 0;
  fd_ = open_for_read(path, "safetensors file", &file_bytes);
  map_bytes_ = static_cast<size_t>(file_bytes);
  auto fail = [&](const std::string& msg) {
    // A header that could not be read is an I/O error, not a format one.
    const std::string io = guard_.problem();
    guard_ = MappingGuard();
    if (map_) ::munmap(const_cast<uint8_t*>(map_), map_bytes_);
    ::close(fd_);
    if (!io.empty()) throw IoError(io);
    throw FormatError(path.string() + ": " + msg);
  };
  if (map_bytes_ < 8) fail("file is " + std::to_string(map_bytes_) + " bytes, too short for a safetensors header");
  void* m = ::mmap(nullptr, map_bytes_, PROT_READ, MAP_SHARED, fd_, 0);
  if (m == MAP_FAILED) close_and_throw_errno(fd_, "cannot mmap", path);
  map_ = static_cast<const uint8_t*>(m);
  try {
    guard_ = MappingGuard(map_, map_bytes_, path, fd_);
  } catch (...) {
    ::munmap(m, map_bytes_);
    ::close(fd_);
    throw;
  }
  uint64_t n;
  std::memcpy(&n, map_, 8);
  if (n > kMaxHeaderBytes || n > map_bytes_ - 8)
    fail("header length " + std::to_string(n) + " at offset 0 exceeds the file size " +
         std::to_string(map_bytes_) + " (truncated or not safetensors)");
  const uint64_t data_start = 8 + n;
  const uint64_t data_bytes = map_bytes_ - data_start;
  json j;
  try {
    j = json::parse(reinterpret_cast<const char*>(map_) + 8, reinterpret_cast<const char*>(map_) + data_start);
  } catch (const json::exception& e) {
    fail(std::string("header is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) fail("header is not a JSON object");
  for (auto& [name, v] : j.items()) {
    if (name == "__metadata__") {
      if (!v.is_object()) fail("__metadata__ is not an object");
      for (auto& [k, mv] : v.items())
        if (mv.is_string()) metadata_[k] = mv.get<std::string>();
      continue;
    }
    std::string where = "tensor '" + name + "': ";
    if (!v.is_object()) fail(where + "entry is not an object");
    TensorInfo t;
    t.name = name;
    auto dt = v.find("dtype");
    if (dt == v.end() || !dt->is_string()) fail(where + "missing field 'dtype'");
    if (!parse_dtype(dt->get<std::string>(), t.dtype)) fail(where + "unknown dtype " + dt->dump());
    auto sh = v.find("shape");
    if (sh == v.end() || !sh->is_array()) fail(where + "missing field 'shape'");
    uint64_t numel = 1;
    for (auto& d : *sh) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) fail(where + "bad shape " + sh->dump());
      int64_t dim = d.get<int64_t>();
      t.shape.push_back(dim);
      if (__builtin_mul_overflow(numel, static_cast<uint64_t>(dim), &numel))
        fail(where + "shape " + sh->dump() + " overflows");
    }
    auto off = v.find("data_offsets");
    if (off == v.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
        !(*off)[1].is_number_unsigned())
      fail(where + "missing or bad field 'data_offsets'");
    uint64_t begin = (*off)[0].get<uint64_t>(), end = (*off)[1].get<uint64_t>();
    uint64_t want;
    if (__builtin_mul_overflow(numel, uint64_t{dtype_bytes(t.dtype)}, &want))
      fail(where + "byte size overflows");
    if (end < begin || end > data_bytes)
      fail(where + "data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
           ") outside the data section of " + std::to_string(data_bytes) + " bytes (truncated?)");
    if (end - begin != want)
      fail(where + "data_offsets span " + std::to_string(end - begin) + " bytes but " +
           std::string(dtype_name(t.dtype)) + " " + shape_str(t.shape) + " needs " + std::to_string(want));
    t.offset = data_start + begin;
    t.bytes = want;
    tensors_.emplace(name, std::move(t));
  }
  if (guard_.fault_count() > 0) fail("header unreadable");  // fail() throws the IoError
}

SafetensorsFile::~SafetensorsFile() {
  guard_ = MappingGuard();
  if (map_) ::munmap(const_cast<uint8_t*>(map_), map_bytes_);
  if (fd_ >= 0) ::close(fd_);
}

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) throw FormatError(path_.string() + ": missing tensor '" + name + "'");
  return it->second;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (auto& [k, v] : tensors_) out.push_back(k);
  return out;
}

std::span<const uint8_t> SafetensorsFile::raw(const std::string& name) const {
  const TensorInfo& t = info(name);
  return {map_ + t.offset, static_cast<size_t>(t.bytes)};
}

void SafetensorsFile::read_float(const std::string& name, uint64_t first, uint64_t count, float* dst) const {
  const TensorInfo& t = info(name);
  if (t.dtype != DType::kF32 && t.dtype != DType::kBF16 && t.dtype != DType::kF16)
    throw FormatError(path_.string() + ": tensor '" + name + "' has dtype " +
                      std::string(dtype_name(t.dtype)) + ", expected F32, BF16 or F16");
  uint64_t n = t.numel();
  MOE_ASSERT(first <= n && count <= n - first, "read_float range outside tensor " + name);
  convert_to_float(t.dtype, map_ + t.offset + first * dtype_bytes(t.dtype), count, dst);
  if (guard_.fault_count() > 0) guard_.check();
}

void SafetensorsFile::release(const std::string& name, uint64_t first, uint64_t count) const {
  const TensorInfo& t = info(name);
  const uint64_t esize = dtype_bytes(t.dtype);
  MOE_ASSERT(first <= t.numel() && count <= t.numel() - first, "release range outside tensor " + name);
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t begin = (t.offset + first * esize + page - 1) / page * page;
  const uint64_t end = (t.offset + (first + count) * esize) / page * page;
  if (end > begin)  // a hint: failure only means the pages stay mapped
    (void)::madvise(const_cast<uint8_t*>(map_) + begin, end - begin, MADV_DONTNEED);
}

std::vector<float> SafetensorsFile::to_float(const std::string& name) const {
  std::vector<float> out(info(name).numel());
  read_float(name, 0, out.size(), out.data());
  return out;
}

void SafetensorsFile::check_shape(const std::string& name, const std::vector<int64_t>& shape) const {
  const TensorInfo& t = info(name);
  if (t.shape != shape)
    throw FormatError(path_.string() + ": tensor '" + name + "' has shape " + shape_str(t.shape) +
                      ", expected " + shape_str(shape));
}

std::vector<float> SafetensorsFile::to_float_checked(const std::string& name,
                                                     const std::vector<int64_t>& shape) const {
  check_shape(name, shape);
  return to_float(name);
}

// ---- writer ----

SafetensorsWriter::SafetensorsWriter(std::filesystem::path path) : path_(std::move(path)) {
  tmp_ = path_;
  tmp_ += ".tmp." + std::to_string(::getpid());
}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (created_ && !finished_) ::unlink(tmp_.c_str());
}

void SafetensorsWriter::declare(const std::string& name, DType dtype, std::vector<int64_t> shape) {
  MOE_ASSERT(fd_ < 0, "declare() after the first write()");
  MOE_ASSERT(index_.count(name) == 0, "tensor declared twice: " + name);
  Entry e;
  e.info.name = name;
  e.info.dtype = dtype;
  e.info.shape = std::move(shape);
  e.info.bytes = e.info.numel() * dtype_bytes(dtype);
  index_[name] = entries_.size();
  entries_.push_back(std::move(e));
}

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) {
  MOE_ASSERT(fd_ < 0, "set_metadata() after the first write()");
  metadata_[key] = value;
}

void SafetensorsWriter::open_if_needed() {
  if (fd_ >= 0) return;
  json j = json::object();
  uint64_t off = 0;
  for (Entry& e : entries_) {
    e.info.offset = off;  // relative to the data section until data_start_ is known
    j[e.info.name] = {{"dtype", std::string(dtype_name(e.info.dtype))},
                      {"shape", e.info.shape},
                      {"data_offsets", {off, off + e.info.bytes}}};
    off += e.info.bytes;
  }
  if (!metadata_.empty()) j["__metadata__"] = metadata_;
  std::string header = j.dump();
  header.resize((header.size() + 7) / 8 * 8, ' ');  // data section 8-byte aligned
  data_start_ = 8 + header.size();
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw_errno("cannot create", tmp_);
  created_ = true;
  uint64_t n = header.size();
  pwrite_all(fd_, &n, 8, 0, tmp_);
  pwrite_all(fd_, header.data(), header.size(), 8, tmp_);
  if (::ftruncate(fd_, static_cast<off_t>(data_start_ + off)) != 0) throw_errno("cannot size", tmp_);
}

void SafetensorsWriter::write_raw(const std::string& name, const void* data, size_t bytes) {
  auto it = index_.find(name);
  MOE_ASSERT(it != index_.end(), "write of undeclared tensor " + name);
  Entry& e = entries_[it->second];
  MOE_ASSERT(bytes == e.info.bytes, "wrong byte count for tensor " + name);
  open_if_needed();
  pwrite_all(fd_, data, bytes, data_start_ + e.info.offset, tmp_);
  e.written = true;
}

void SafetensorsWriter::write(const std::string& name, const float* data, size_t n) {
  auto it = index_.find(name);
  MOE_ASSERT(it != index_.end(), "write of undeclared tensor " + name);
  const TensorInfo& t = entries_[it->second].info;
  MOE_ASSERT(n == t.numel(), "wrong element count for tensor " + name);
  switch (t.dtype) {
    case DType::kF32:
      write_raw(name, data, n * 4);
      return;
    case DType::kBF16: {
      std::vector<uint16_t> buf(n);
      for (size_t i = 0; i < n; ++i) buf[i] = f32_to_bf16(data[i]);
      write_raw(name, buf.data(), n * 2);
      return;
    }
    case DType::kF16: {
      std::vector<uint16_t> buf(n);
      for (size_t i = 0; i < n; ++i) buf[i] = f32_to_f16(data[i]);
      write_raw(name, buf.data(), n * 2);
      return;
    }
    default:
      MOE_ASSERT(false, "write(float) to a non-float tensor " + name);
  }
}

void SafetensorsWriter::finish() {
  open_if_needed();
  for (const Entry& e : entries_)
    MOE_ASSERT(e.written, "tensor declared but never written: " + e.info.name);
  if (::fsync(fd_) != 0) throw_errno("cannot fsync", tmp_);
  if (::close(fd_) != 0) {
    fd_ = -1;
    throw_errno("cannot close", tmp_);
  }
  fd_ = -1;
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    int saved = errno;
    ::unlink(tmp_.c_str());
    errno = saved;
    throw_errno("cannot rename into", path_);
  }
  finished_ = true;
  std::filesystem::path dir = path_.parent_path();
  fsync_path(dir.empty() ? std::filesystem::path(".") : dir);
}

}  // namespace moestream
