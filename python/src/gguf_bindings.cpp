// The GGUF reader (loader/format/gguf_file.h) for tests that check it against the `gguf` package:
// a private `_gguf_info(path)` returning everything the reader saw as plain Python values.
#include <string>

#include "loader/format/gguf_file.h"
#include "python/src/bindings.h"

namespace moestream::py_bindings {
namespace {

// GGUF strings are bytes; invalid UTF-8 survives as surrogate escapes instead of failing.
py::object to_str(std::string_view s) {
  PyObject* o = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "surrogateescape");
  if (!o) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(o);
}

// "u32", "string", "array<f32>", "array<array>" (nested arrays may differ element by element).
std::string type_str(const GgufValue& v) {
  if (const GgufArray* a = v.to_array()) return "array<" + gguf_value_type_name(a->elem_type()) + ">";
  return gguf_value_type_name(v.type());
}

py::object to_python(const GgufValue& v) {
  if (const auto* s = v.to_string()) return to_str(*s);
  if (const auto b = v.to_bool()) return py::bool_(*b);
  if (const auto f = v.to_float()) return py::float_(*f);
  if (const GgufArray* a = v.to_array()) {
    py::list out(a->size());
    for (uint64_t i = 0; i < a->size(); ++i) {
      if (a->elem_type() == GgufValueType::kString) {
        out[i] = to_str(a->string_at(i));
      } else {
        out[i] = to_python(a->element(i));
      }
    }
    return out;
  }
  if (const auto i = v.to_signed()) return py::int_(*i);
  return py::int_(*v.to_unsigned());  // u64 above INT64_MAX
}

}  // namespace

void bind_gguf(py::module_& m) {
  m.def("_gguf_info", [](const std::string& path) {
    const GgufModelFiles files(path);
    py::dict out, metadata, types, tensors;
    for (const GgufKv& kv : files.metadata().entries()) {
      metadata[to_str(kv.key)] = to_python(kv.value);
      types[to_str(kv.key)] = type_str(kv.value);
    }
    for (const GgufTensor& t : files.tensors()) {
      py::dict d;
      d["type"] = std::string(ggml_type_name(t.type));
      py::list dims;
      for (uint64_t ne : t.dims) dims.append(ne);
      d["dims"] = dims;
      d["n_elements"] = t.n_elements;
      d["bytes"] = t.bytes;
      d["offset"] = t.offset;
      d["shard"] = t.shard;
      tensors[to_str(t.name)] = d;
    }
    py::list shards;
    for (size_t i = 0; i < files.shard_count(); ++i) {
      const GgufFile& f = files.shard(i);
      py::dict s;
      s["path"] = f.path().string();
      s["version"] = f.version();
      s["alignment"] = f.alignment();
      s["data_offset"] = f.data_offset();
      s["n_tensors"] = f.tensors().size();
      s["n_kv"] = f.metadata().size();
      shards.append(s);
    }
    out["metadata"] = metadata;
    out["types"] = types;
    out["tensors"] = tensors;
    out["shards"] = shards;
    return out;
  }, py::arg("path"));
}

}  // namespace moestream::py_bindings
