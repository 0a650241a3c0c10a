// Implementation of runtime/convert/hf_checkpoint.h: resolves the shard list (index.json, a single
// model.safetensors, or every *.safetensors) and checks that index and shards agree.
#include "runtime/convert/hf_checkpoint.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/file_util.h"

namespace moestream {

namespace fs = std::filesystem;

HfCheckpoint::HfCheckpoint(const fs::path& dir) : dir_(dir) {
  const fs::path index = dir / "model.safetensors.index.json";
  std::vector<std::string> files;
  std::map<std::string, std::string> weight_map;
  if (fs::exists(index)) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(read_file(index));
    } catch (const nlohmann::json::exception& e) {
      throw FormatError(index.string() + ": invalid JSON: " + e.what());
    }
    auto wm = j.find("weight_map");
    if (wm == j.end() || !wm->is_object()) throw FormatError(index.string() + ": missing field 'weight_map'");
    for (auto& [name, file] : wm->items()) {
      if (!file.is_string()) throw FormatError(index.string() + ": weight_map['" + name + "'] is not a file name");
      std::string f = file.get<std::string>();
      if (f.find('/') != std::string::npos || f == ".." || f.empty())
        throw FormatError(index.string() + ": weight_map['" + name + "'] = '" + f + "' is not a file in the directory");
      weight_map[name] = f;
      if (std::find(files.begin(), files.end(), f) == files.end()) files.push_back(f);
    }
  } else if (fs::exists(dir / "model.safetensors")) {
    files.push_back("model.safetensors");
  } else {
    std::error_code ec;
    for (auto& e : fs::directory_iterator(dir, ec))
      if (e.path().extension() == ".safetensors") files.push_back(e.path().filename().string());
    if (ec) throw IoError("cannot list " + dir.string() + ": " + ec.message());
    std::sort(files.begin(), files.end());
    if (files.empty())
      throw FormatError(dir.string() + ": no model.safetensors, model.safetensors.index.json or *.safetensors");
  }
  std::map<std::string, const SafetensorsFile*> by_file;
  for (const std::string& f : files) {
    shards_.push_back(std::make_unique<SafetensorsFile>(dir / f));
    by_file[f] = shards_.back().get();
    for (const std::string& n : shards_.back()->names()) {
      auto [it, inserted] = where_.emplace(n, shards_.back().get());
      if (!inserted)
        throw FormatError(dir.string() + ": tensor '" + n + "' appears in both " +
                          it->second->path().filename().string() + " and " + f);
    }
  }
  // The index must point at the shard that really holds each tensor.
  for (auto& [name, f] : weight_map) {
    auto it = where_.find(name);
    if (it == where_.end() || it->second != by_file[f])
      throw FormatError(index.string() + ": tensor '" + name + "' is listed in " + f + " but that shard does not hold it");
  }
}

const SafetensorsFile& HfCheckpoint::file(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) throw FormatError(dir_.string() + ": missing tensor '" + name + "'");
  return *it->second;
}

std::vector<float> HfCheckpoint::read(const std::string& name, const std::vector<int64_t>& shape) const {
  return file(name).to_float_checked(name, shape);
}

std::vector<std::string> HfCheckpoint::names() const {
  std::vector<std::string> out;
  for (auto& [n, f] : where_) out.push_back(n);
  return out;
}

DType HfCheckpoint::main_dtype() const {
  std::map<DType, uint64_t> bytes;
  for (auto& [n, f] : where_) bytes[f->info(n).dtype] += f->info(n).bytes;
  DType best = DType::kF32;
  uint64_t most = 0;
  for (auto& [d, b] : bytes)
    if (b > most) {
      most = b;
      best = d;
    }
  return best;
}

}  // namespace moestream
