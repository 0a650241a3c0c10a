// A copy of a (single-file) GGUF with edits, written by our GgufWriter: how the GGUF input tests
// (gguf_arch_test, gguf_qwen2_glm4_test) break one tensor or metadata key of a real fixture.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "loader/format/gguf_metadata.h"
#include "loader/format/gguf_writer.h"

namespace moestream::test {

// `tensor` may change a spec (type, dims) or return false to drop it; `bytes` replaces a tensor's
// data (else its own, or zeros when its size changed); `meta` replaces (or with a null value,
// drops) metadata keys, and adds those not present.
struct GgufRewrite {
  std::function<bool(GgufTensorSpec&)> tensor = [](GgufTensorSpec&) { return true; };
  std::map<std::string, std::vector<uint8_t>> bytes;
  std::vector<GgufTensorSpec> extra;  // appended, with their `bytes`
  std::map<std::string, std::optional<GgufValue>> meta;
};

void rewrite_gguf(const std::filesystem::path& src, const std::filesystem::path& dst, const GgufRewrite& r);

// The one-edit rewrites: tensor `tensor` dropped, given `dims` or given `type`; metadata `key`
// replaced by (or, with no value, dropped for) `v`.
GgufRewrite dropping(const std::string& tensor);
GgufRewrite reshaping(const std::string& tensor, const std::vector<uint64_t>& dims);
GgufRewrite retyping(const std::string& tensor, GgmlType type);
GgufRewrite setting(const std::string& key, const std::optional<GgufValue>& v);

// The FormatError message opening `path` as a GgufModel gives ("<no exception>" when it opens).
std::string gguf_load_error(const std::filesystem::path& path);

}  // namespace moestream::test
