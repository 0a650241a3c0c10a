// The tensors of a Hugging Face checkpoint directory: one `model.safetensors`, or shards listed
// by `model.safetensors.index.json` (weight_map: tensor name -> shard file), each mmapped.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "loader/format/safetensors.h"

namespace moestream {

class HfCheckpoint {
 public:
  // Throws IoError/FormatError naming the directory, the index or the shard.
  explicit HfCheckpoint(const std::filesystem::path& dir);

  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  // The shard holding `name`; FormatError "missing tensor 'name'" naming the directory.
  const SafetensorsFile& file(const std::string& name) const;
  const TensorInfo& info(const std::string& name) const { return file(name).info(name); }
  // Widened to float32 after checking the shape: FormatError names tensor, shard, both shapes.
  std::vector<float> read(const std::string& name, const std::vector<int64_t>& shape) const;
  std::vector<std::string> names() const;
  // Most common dtype among the tensors (F32, BF16 or F16): picks the default dense dtype.
  DType main_dtype() const;
  size_t n_shards() const { return shards_.size(); }

 private:
  std::filesystem::path dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::map<std::string, const SafetensorsFile*> where_;
};

}  // namespace moestream
