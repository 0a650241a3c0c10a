// Implementation of tests/support/gguf_rewrite.h.
#include "tests/support/gguf_rewrite.h"

#include <cstring>

#include "common/error.h"
#include "common/file_util.h"
#include "loader/format/gguf_file.h"
#include "loader/format/gguf_model.h"
#include "tests/support/test_model.h"

namespace moestream::test {

namespace fs = std::filesystem;

void rewrite_gguf(const fs::path& src, const fs::path& dst, const GgufRewrite& r) {
  const GgufModelFiles files(src);
  GgufMetadata md;
  std::map<std::string, std::optional<GgufValue>> pending = r.meta;
  for (const GgufKv& kv : files.metadata().entries()) {
    if (kv.key.rfind("GGUF.", 0) == 0) continue;
    const auto it = pending.find(kv.key);
    if (it == pending.end()) {
      md.add(kv.key, kv.value);
      continue;
    }
    if (it->second) md.add(kv.key, *it->second);
    pending.erase(it);
  }
  for (const auto& [k, v] : pending)
    if (v) md.add(k, *v);
  std::vector<GgufTensorSpec> specs;
  std::vector<const GgufTensor*> from;
  for (const GgufTensor& t : files.tensors()) {
    GgufTensorSpec s{t.name, t.type, t.dims};
    if (!r.tensor(s)) continue;
    specs.push_back(s);
    from.push_back(&t);
  }
  for (const GgufTensorSpec& s : r.extra) {
    specs.push_back(s);
    from.push_back(nullptr);
  }
  GgufWriter w(dst, md, specs);
  const std::string data = read_file(src);
  for (size_t i = 0; i < specs.size(); ++i) {
    std::vector<uint8_t> b;
    if (const auto it = r.bytes.find(specs[i].name); it != r.bytes.end()) {
      b = it->second;
    } else if (from[i] != nullptr && from[i]->bytes == w.tensor_bytes(i)) {
      b.resize(from[i]->bytes);
      std::memcpy(b.data(), data.data() + from[i]->offset, b.size());
    }
    b.resize(w.tensor_bytes(i), 0);
    w.write(b.data(), b.size());
  }
  w.commit();
}

GgufRewrite dropping(const std::string& tensor) {
  GgufRewrite r;
  r.tensor = [tensor](GgufTensorSpec& s) { return s.name != tensor; };
  return r;
}

GgufRewrite reshaping(const std::string& tensor, const std::vector<uint64_t>& dims) {
  GgufRewrite r;
  r.tensor = [tensor, dims](GgufTensorSpec& s) {
    if (s.name == tensor) s.dims = dims;
    return true;
  };
  return r;
}

GgufRewrite retyping(const std::string& tensor, GgmlType type) {
  GgufRewrite r;
  r.tensor = [tensor, type](GgufTensorSpec& s) {
    if (s.name == tensor) s.type = type;
    return true;
  };
  return r;
}

GgufRewrite setting(const std::string& key, const std::optional<GgufValue>& v) {
  GgufRewrite r;
  r.meta[key] = v;
  return r;
}

std::string gguf_load_error(const fs::path& path) {
  return error_message<FormatError>([&] { GgufModel g(path); });
}

}  // namespace moestream::test
