// Implementation of runtime/convert/hf_checkpoint.h: resolves the shard list (index.json, a single
// model.safetensors, or every *.safetensors) and checks that index and shards agree.
#include "runtime/convert/hf_checkpoint.h"

#include <algorithm>
#include <cmath>

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
  const SafetensorsFile& f = file(name);
  f.check_shape(name, shape);
  std::vector<float> out(f.info(name).numel());
  read_float(name, 0, out.size(), out.data());
  return out;
}

bool HfCheckpoint::is_fp8_scale(const std::string& name) {
  static const std::string kSuffix = "_scale_inv";
  return name.size() > kSuffix.size() && name.compare(name.size() - kSuffix.size(), kSuffix.size(), kSuffix) == 0;
}

void HfCheckpoint::read_float(const std::string& name, uint64_t first, uint64_t count, float* dst) const {
  const SafetensorsFile& f = file(name);
  const TensorInfo& t = f.info(name);
  if (t.dtype != DType::kF8E4M3) {
    f.read_float(name, first, count, dst);
    return;
  }
  const std::string where = f.path().string() + ": FP8 tensor '" + name + "'";
  if (t.shape.size() != 2) throw FormatError(where + " has " + std::to_string(t.shape.size()) + " dims, expected a matrix");
  const uint64_t rows = uint64_t(t.shape[0]), cols = uint64_t(t.shape[1]);
  MOE_ASSERT(cols > 0 && first % cols == 0 && count % cols == 0 && first + count <= rows * cols,
             "FP8 reads are whole rows of " + name);
  const std::string sname = fp8_scale_name(name);
  if (!contains(sname)) throw FormatError(where + " has no block scales '" + sname + "'");
  const uint64_t br = uint64_t(fp8_block_.rows), bc = uint64_t(fp8_block_.cols);
  const std::vector<int64_t> sshape{int64_t((rows + br - 1) / br), int64_t((cols + bc - 1) / bc)};
  if (file(sname).info(sname).shape != sshape)
    throw FormatError(where + ": its scales '" + sname + "' are not [" + std::to_string(sshape[0]) + ", " +
                      std::to_string(sshape[1]) + "] (" + std::to_string(rows) + " x " + std::to_string(cols) +
                      " in blocks of " + std::to_string(br) + " x " + std::to_string(bc) + ")");
  // The scales are tiny (one float per 16384 weights): read whole each time.
  std::vector<float> scale(size_t(sshape[0] * sshape[1]));
  file(sname).read_float(sname, 0, scale.size(), scale.data());
  for (size_t i = 0; i < scale.size(); ++i)
    if (!std::isfinite(scale[i]))  // a corrupt scale would spread NaN through every later layer
      throw FormatError(where + ": its scale " + std::to_string(i) + " in '" + sname + "' is not finite");
  dequantize_fp8_rows(f.raw(name).data(), size_t(cols), scale.data(), size_t(sshape[1]), fp8_block_,
                      size_t(first / cols), size_t(count / cols), dst);
}

void HfCheckpoint::release(const std::string& name, uint64_t first, uint64_t count) const {
  file(name).release(name, first, count);  // element size from the tensor's dtype: 1 byte for FP8
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
