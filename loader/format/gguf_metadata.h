// The metadata of a GGUF file (loader/format/gguf_file.h reads it): typed key/value pairs in file
// order, with getters that name the key, the expected and the actual type when they disagree.
//
// Value types are GGUF's (ids as stored): u8 i8 u16 i16 u32 i32 f32 bool string array u64 i64
// f64. An array holds elements of one type, nested arrays included. Arrays keep their elements
// compactly (numbers as packed little-endian bytes, strings as one blob plus end offsets), so a
// 150k-entry tokenizer vocabulary is three allocations, not 150k.
//
// Integer getters (get_u32, get_i64, ...) accept a value of any integer type whose value fits the
// requested type (a u32 key written as i32 by one converter and u32 by another both read); bool
// and floats are never integers. get_f32/get_f64 accept f32 or f64 (f64 rounds to nearest for
// get_f32). get_bool accepts only bool, get_string only string.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace moestream {

enum class GgufValueType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
  kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};

// "u8", "i32", "f32", "bool", "string", "array", ...; "type <id>" for an id that is not a type.
std::string gguf_value_type_name(GgufValueType t);
// Bytes of one value of a fixed-size type (1, 2, 4 or 8); 0 for string and array.
uint32_t gguf_value_type_bytes(GgufValueType t);
bool gguf_value_type_is_integer(GgufValueType t);

class GgufArray;

// One metadata value: a scalar, a string or an array.
class GgufValue {
 public:
  GgufValue() = default;
  static GgufValue from_unsigned(GgufValueType t, uint64_t v);  // u8/u16/u32/u64/bool
  static GgufValue from_signed(GgufValueType t, int64_t v);     // i8/i16/i32/i64
  static GgufValue from_float(GgufValueType t, double v);       // f32/f64
  static GgufValue from_string(std::string s);
  static GgufValue from_array(std::shared_ptr<const GgufArray> a);

  GgufValueType type() const { return type_; }
  // The value as the requested kind, or nullopt/nullptr when its type or range does not allow it
  // (the rules in the file comment).
  std::optional<uint64_t> to_unsigned() const;  // any integer type, value >= 0
  std::optional<int64_t> to_signed() const;     // any integer type, value <= INT64_MAX
  std::optional<double> to_float() const;       // f32 or f64
  std::optional<bool> to_bool() const;          // bool
  const std::string* to_string() const;         // string
  const GgufArray* to_array() const;            // array
  // For messages: "u32 7", "string (12 bytes)", "array of 3 f32".
  std::string describe() const;

 private:
  GgufValueType type_ = GgufValueType::kU8;
  uint64_t u_ = 0;  // unsigned integers and bool
  int64_t i_ = 0;   // signed integers
  double f_ = 0;    // f32 (exactly) and f64
  std::string s_;
  std::shared_ptr<const GgufArray> a_;
};

// An array of one element type. Elements of fixed-size types are stored as the file's packed
// little-endian bytes; strings as one blob; nested arrays as values.
class GgufArray {
 public:
  GgufValueType elem_type() const { return elem_type_; }
  uint64_t size() const { return size_; }
  GgufValue element(uint64_t i) const;     // any element type (a string element is copied)
  std::string_view string_at(uint64_t i) const;  // MOE_ASSERT: string array, i < size()
  const std::string& raw() const { return raw_; }  // packed fixed-size elements (else empty)

  // Building, for the parser: one append per element, of elem_type's kind.
  explicit GgufArray(GgufValueType elem_type) : elem_type_(elem_type) {}
  void reserve(uint64_t n, uint64_t blob_bytes);
  void append_raw(const void* bytes, uint64_t n_elems);  // packed fixed-size elements
  void append_string(std::string_view s);
  void append_array(std::shared_ptr<const GgufArray> a);

 private:
  GgufValueType elem_type_;
  uint64_t size_ = 0;
  std::string raw_;               // fixed-size elements, or the string blob
  std::vector<uint64_t> ends_;    // string i is raw_[ends_[i-1], ends_[i])
  std::vector<std::shared_ptr<const GgufArray>> arrays_;
};

struct GgufKv {
  std::string key;
  GgufValue value;
};

// The key/value pairs of one GGUF file, in file order, keys unique.
class GgufMetadata {
 public:
  GgufMetadata() = default;
  explicit GgufMetadata(std::string source) : source_(std::move(source)) {}
  // Appends; false (nothing added) when the key is already present.
  bool add(std::string key, GgufValue value);

  const std::string& source() const { return source_; }  // the file named in errors
  size_t size() const { return entries_.size(); }
  const std::vector<GgufKv>& entries() const { return entries_; }  // file order
  bool contains(std::string_view key) const { return find(key) != nullptr; }
  const GgufValue* find(std::string_view key) const;
  const GgufValue& at(std::string_view key) const;  // FormatError naming file and key when absent

  // get_*: FormatError when absent or of another type (message: file, key, expected, actual).
  // find_*: nullopt/nullptr when absent, the same error when present with another type.
  uint32_t get_u32(std::string_view key) const;
  uint64_t get_u64(std::string_view key) const;
  int32_t get_i32(std::string_view key) const;
  int64_t get_i64(std::string_view key) const;
  float get_f32(std::string_view key) const;
  double get_f64(std::string_view key) const;
  bool get_bool(std::string_view key) const;
  const std::string& get_string(std::string_view key) const;
  const GgufArray& get_array(std::string_view key) const;
  std::optional<uint32_t> find_u32(std::string_view key) const;
  std::optional<uint64_t> find_u64(std::string_view key) const;
  std::optional<int32_t> find_i32(std::string_view key) const;
  std::optional<int64_t> find_i64(std::string_view key) const;
  std::optional<float> find_f32(std::string_view key) const;
  std::optional<double> find_f64(std::string_view key) const;
  std::optional<bool> find_bool(std::string_view key) const;
  const std::string* find_string(std::string_view key) const;
  const GgufArray* find_array(std::string_view key) const;

  // Whole arrays converted, with the element rules of the scalar getters: FormatError naming
  // the key and the first element that does not convert.
  std::vector<std::string> get_string_array(std::string_view key) const;
  std::vector<int64_t> get_i64_array(std::string_view key) const;
  std::vector<float> get_f32_array(std::string_view key) const;

 private:
  [[noreturn]] void fail(std::string_view key, const std::string& msg) const;
  template <typename T>
  std::optional<T> integer(std::string_view key, const char* want) const;
  std::optional<double> floating(std::string_view key, const char* want) const;
  const GgufArray* array_of(std::string_view key, GgufValueType elem) const;

  std::string source_;
  std::vector<GgufKv> entries_;
  std::unordered_map<std::string, size_t> index_;
};

}  // namespace moestream
