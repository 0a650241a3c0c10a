// Implementation of loader/format/gguf_metadata.h: GGUF values, compact arrays, typed getters.
#include "loader/format/gguf_metadata.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "common/error.h"

namespace moestream {

std::string gguf_value_type_name(GgufValueType t) {
  switch (t) {
    case GgufValueType::kU8: return "u8";
    case GgufValueType::kI8: return "i8";
    case GgufValueType::kU16: return "u16";
    case GgufValueType::kI16: return "i16";
    case GgufValueType::kU32: return "u32";
    case GgufValueType::kI32: return "i32";
    case GgufValueType::kF32: return "f32";
    case GgufValueType::kBool: return "bool";
    case GgufValueType::kString: return "string";
    case GgufValueType::kArray: return "array";
    case GgufValueType::kU64: return "u64";
    case GgufValueType::kI64: return "i64";
    case GgufValueType::kF64: return "f64";
  }
  return "type " + std::to_string(static_cast<uint32_t>(t));
}

uint32_t gguf_value_type_bytes(GgufValueType t) {
  switch (t) {
    case GgufValueType::kU8: case GgufValueType::kI8: case GgufValueType::kBool: return 1;
    case GgufValueType::kU16: case GgufValueType::kI16: return 2;
    case GgufValueType::kU32: case GgufValueType::kI32: case GgufValueType::kF32: return 4;
    case GgufValueType::kU64: case GgufValueType::kI64: case GgufValueType::kF64: return 8;
    case GgufValueType::kString: case GgufValueType::kArray: return 0;
  }
  return 0;
}

bool gguf_value_type_is_integer(GgufValueType t) {
  switch (t) {
    case GgufValueType::kU8: case GgufValueType::kI8: case GgufValueType::kU16:
    case GgufValueType::kI16: case GgufValueType::kU32: case GgufValueType::kI32:
    case GgufValueType::kU64: case GgufValueType::kI64:
      return true;
    default:
      return false;
  }
}

namespace {

bool is_signed_type(GgufValueType t) {
  return t == GgufValueType::kI8 || t == GgufValueType::kI16 || t == GgufValueType::kI32 ||
         t == GgufValueType::kI64;
}

}  // namespace

GgufValue GgufValue::from_unsigned(GgufValueType t, uint64_t v) {
  MOE_ASSERT((gguf_value_type_is_integer(t) && !is_signed_type(t)) || t == GgufValueType::kBool);
  GgufValue r;
  r.type_ = t;
  r.u_ = v;
  return r;
}

GgufValue GgufValue::from_signed(GgufValueType t, int64_t v) {
  MOE_ASSERT(is_signed_type(t));
  GgufValue r;
  r.type_ = t;
  r.i_ = v;
  return r;
}

GgufValue GgufValue::from_float(GgufValueType t, double v) {
  MOE_ASSERT(t == GgufValueType::kF32 || t == GgufValueType::kF64);
  GgufValue r;
  r.type_ = t;
  r.f_ = v;
  return r;
}

GgufValue GgufValue::from_string(std::string s) {
  GgufValue r;
  r.type_ = GgufValueType::kString;
  r.s_ = std::move(s);
  return r;
}

GgufValue GgufValue::from_array(std::shared_ptr<const GgufArray> a) {
  MOE_ASSERT(a != nullptr);
  GgufValue r;
  r.type_ = GgufValueType::kArray;
  r.a_ = std::move(a);
  return r;
}

std::optional<uint64_t> GgufValue::to_unsigned() const {
  if (!gguf_value_type_is_integer(type_)) return std::nullopt;
  if (is_signed_type(type_)) return i_ < 0 ? std::nullopt : std::optional<uint64_t>(uint64_t(i_));
  return u_;
}

std::optional<int64_t> GgufValue::to_signed() const {
  if (!gguf_value_type_is_integer(type_)) return std::nullopt;
  if (is_signed_type(type_)) return i_;
  if (u_ > uint64_t(std::numeric_limits<int64_t>::max())) return std::nullopt;
  return int64_t(u_);
}

std::optional<double> GgufValue::to_float() const {
  if (type_ != GgufValueType::kF32 && type_ != GgufValueType::kF64) return std::nullopt;
  return f_;
}

std::optional<bool> GgufValue::to_bool() const {
  if (type_ != GgufValueType::kBool) return std::nullopt;
  return u_ != 0;
}

const std::string* GgufValue::to_string() const {
  return type_ == GgufValueType::kString ? &s_ : nullptr;
}

const GgufArray* GgufValue::to_array() const {
  return type_ == GgufValueType::kArray ? a_.get() : nullptr;
}

std::string GgufValue::describe() const {
  const std::string name = gguf_value_type_name(type_);
  if (type_ == GgufValueType::kString) return name + " (" + std::to_string(s_.size()) + " bytes)";
  if (type_ == GgufValueType::kArray)
    return "array of " + std::to_string(a_->size()) + " " + gguf_value_type_name(a_->elem_type());
  if (type_ == GgufValueType::kBool) return u_ ? "bool true" : "bool false";
  if (is_signed_type(type_)) return name + " " + std::to_string(i_);
  if (gguf_value_type_is_integer(type_)) return name + " " + std::to_string(u_);
  return name + " " + std::to_string(f_);
}

void GgufArray::reserve(uint64_t n, uint64_t blob_bytes) {
  const uint32_t elem = gguf_value_type_bytes(elem_type_);
  if (elem != 0) {
    raw_.reserve(n * elem);
  } else if (elem_type_ == GgufValueType::kString) {
    ends_.reserve(n);
    raw_.reserve(blob_bytes);
  } else {
    arrays_.reserve(n);
  }
}

void GgufArray::append_raw(const void* bytes, uint64_t n_elems) {
  const uint32_t elem = gguf_value_type_bytes(elem_type_);
  MOE_ASSERT(elem != 0);
  raw_.append(static_cast<const char*>(bytes), n_elems * elem);
  size_ += n_elems;
}

void GgufArray::append_string(std::string_view s) {
  MOE_ASSERT(elem_type_ == GgufValueType::kString);
  raw_.append(s);
  ends_.push_back(raw_.size());
  ++size_;
}

void GgufArray::append_array(std::shared_ptr<const GgufArray> a) {
  MOE_ASSERT(elem_type_ == GgufValueType::kArray && a != nullptr);
  arrays_.push_back(std::move(a));
  ++size_;
}

std::string_view GgufArray::string_at(uint64_t i) const {
  MOE_ASSERT(elem_type_ == GgufValueType::kString && i < size_);
  const uint64_t begin = i == 0 ? 0 : ends_[i - 1];
  return std::string_view(raw_).substr(begin, ends_[i] - begin);
}

GgufValue GgufArray::element(uint64_t i) const {
  MOE_ASSERT(i < size_);
  if (elem_type_ == GgufValueType::kString) return GgufValue::from_string(std::string(string_at(i)));
  if (elem_type_ == GgufValueType::kArray) return GgufValue::from_array(arrays_[i]);
  const uint32_t n = gguf_value_type_bytes(elem_type_);
  const char* p = raw_.data() + i * n;
  // Little-endian bytes into the low bytes of a u64 (the only byte order this reader accepts).
  uint64_t bits = 0;
  std::memcpy(&bits, p, n);
  switch (elem_type_) {
    case GgufValueType::kI8: return GgufValue::from_signed(elem_type_, int8_t(bits));
    case GgufValueType::kI16: return GgufValue::from_signed(elem_type_, int16_t(bits));
    case GgufValueType::kI32: return GgufValue::from_signed(elem_type_, int32_t(bits));
    case GgufValueType::kI64: return GgufValue::from_signed(elem_type_, int64_t(bits));
    case GgufValueType::kF32: {
      float f;
      std::memcpy(&f, p, 4);
      return GgufValue::from_float(elem_type_, f);
    }
    case GgufValueType::kF64: {
      double d;
      std::memcpy(&d, p, 8);
      return GgufValue::from_float(elem_type_, d);
    }
    case GgufValueType::kBool: return GgufValue::from_unsigned(elem_type_, bits != 0);
    default: return GgufValue::from_unsigned(elem_type_, bits);
  }
}

bool GgufMetadata::add(std::string key, GgufValue value) {
  if (index_.count(key) != 0) return false;
  index_.emplace(key, entries_.size());
  entries_.push_back({std::move(key), std::move(value)});
  return true;
}

const GgufValue* GgufMetadata::find(std::string_view key) const {
  auto it = index_.find(std::string(key));
  return it == index_.end() ? nullptr : &entries_[it->second].value;
}

void GgufMetadata::fail(std::string_view key, const std::string& msg) const {
  throw FormatError(source_ + ": metadata key '" + std::string(key) + "': " + msg);
}

const GgufValue& GgufMetadata::at(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) fail(key, "missing");
  return *v;
}

template <typename T>
std::optional<T> GgufMetadata::integer(std::string_view key, const char* want) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (std::is_signed_v<T>) {
    const auto s = v->to_signed();
    if (s && *s >= std::numeric_limits<T>::min() && *s <= std::numeric_limits<T>::max()) return T(*s);
  } else {
    const auto u = v->to_unsigned();
    if (u && *u <= uint64_t(std::numeric_limits<T>::max())) return T(*u);
  }
  const bool integer_type = gguf_value_type_is_integer(v->type());
  fail(key, std::string("expected ") + want + ", found " + v->describe() +
                (integer_type ? " (out of range)" : ""));
}

std::optional<double> GgufMetadata::floating(std::string_view key, const char* want) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  const auto f = v->to_float();
  if (!f) fail(key, std::string("expected ") + want + ", found " + v->describe());
  return f;
}

std::optional<uint32_t> GgufMetadata::find_u32(std::string_view key) const { return integer<uint32_t>(key, "u32"); }
std::optional<uint64_t> GgufMetadata::find_u64(std::string_view key) const { return integer<uint64_t>(key, "u64"); }
std::optional<int32_t> GgufMetadata::find_i32(std::string_view key) const { return integer<int32_t>(key, "i32"); }
std::optional<int64_t> GgufMetadata::find_i64(std::string_view key) const { return integer<int64_t>(key, "i64"); }
std::optional<double> GgufMetadata::find_f64(std::string_view key) const { return floating(key, "f64"); }

std::optional<float> GgufMetadata::find_f32(std::string_view key) const {
  const auto d = floating(key, "f32");
  if (!d) return std::nullopt;
  return static_cast<float>(*d);
}

std::optional<bool> GgufMetadata::find_bool(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  const auto b = v->to_bool();
  if (!b) fail(key, "expected bool, found " + v->describe());
  return b;
}

const std::string* GgufMetadata::find_string(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return nullptr;
  if (!v->to_string()) fail(key, "expected string, found " + v->describe());
  return v->to_string();
}

const GgufArray* GgufMetadata::find_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return nullptr;
  if (!v->to_array()) fail(key, "expected array, found " + v->describe());
  return v->to_array();
}

uint32_t GgufMetadata::get_u32(std::string_view key) const { at(key); return *find_u32(key); }
uint64_t GgufMetadata::get_u64(std::string_view key) const { at(key); return *find_u64(key); }
int32_t GgufMetadata::get_i32(std::string_view key) const { at(key); return *find_i32(key); }
int64_t GgufMetadata::get_i64(std::string_view key) const { at(key); return *find_i64(key); }
float GgufMetadata::get_f32(std::string_view key) const { at(key); return *find_f32(key); }
double GgufMetadata::get_f64(std::string_view key) const { at(key); return *find_f64(key); }
bool GgufMetadata::get_bool(std::string_view key) const { at(key); return *find_bool(key); }
const std::string& GgufMetadata::get_string(std::string_view key) const { at(key); return *find_string(key); }
const GgufArray& GgufMetadata::get_array(std::string_view key) const { at(key); return *find_array(key); }

std::vector<std::string> GgufMetadata::get_string_array(std::string_view key) const {
  const GgufArray& a = get_array(key);
  if (a.elem_type() != GgufValueType::kString)
    fail(key, "expected array of string, found array of " + gguf_value_type_name(a.elem_type()));
  std::vector<std::string> out;
  out.reserve(a.size());
  for (uint64_t i = 0; i < a.size(); ++i) out.emplace_back(a.string_at(i));
  return out;
}

std::vector<int64_t> GgufMetadata::get_i64_array(std::string_view key) const {
  const GgufArray& a = get_array(key);
  if (!gguf_value_type_is_integer(a.elem_type()))
    fail(key, "expected array of integers, found array of " + gguf_value_type_name(a.elem_type()));
  std::vector<int64_t> out;
  out.reserve(a.size());
  for (uint64_t i = 0; i < a.size(); ++i) {
    const GgufValue e = a.element(i);
    const auto v = e.to_signed();
    if (!v) fail(key, "element " + std::to_string(i) + " (" + e.describe() + ") does not fit i64");
    out.push_back(*v);
  }
  return out;
}

std::vector<float> GgufMetadata::get_f32_array(std::string_view key) const {
  const GgufArray& a = get_array(key);
  if (a.elem_type() != GgufValueType::kF32 && a.elem_type() != GgufValueType::kF64)
    fail(key, "expected array of f32, found array of " + gguf_value_type_name(a.elem_type()));
  std::vector<float> out;
  out.reserve(a.size());
  for (uint64_t i = 0; i < a.size(); ++i) out.push_back(static_cast<float>(*a.element(i).to_float()));
  return out;
}

}  // namespace moestream
