// The tensors of a Hugging Face checkpoint directory: one `model.safetensors`, or shards listed
// by `model.safetensors.index.json` (weight_map: tensor name -> shard file), each mmapped.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "loader/format/safetensors.h"
#include "runtime/convert/fp8_weights.h"

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
  // An FP8 (F8_E4M3) matrix comes dequantised with its block scales (read_float).
  std::vector<float> read(const std::string& name, const std::vector<int64_t>& shape) const;
  // Elements [first, first + count) of the flattened tensor as float32. F32/BF16/F16 as stored;
  // an F8_E4M3 matrix [rows, cols] (DeepSeek-V3's FP8 releases) times its `<name>_scale_inv`
  // block scales, the range then whole rows. FormatError names a missing or misshapen scale.
  void read_float(const std::string& name, uint64_t first, uint64_t count, float* dst) const;
  // Drops the mapping of what read_float read (SafetensorsFile::release), scales included.
  void release(const std::string& name, uint64_t first, uint64_t count) const;
  // The FP8 block shape (config.json's quantization_config.weight_block_size); 128 x 128 unless set.
  void set_fp8_block(Fp8BlockSize b) { fp8_block_ = b; }
  // The scale tensor's name of an FP8 weight, and whether a name is one (the converter skips them).
  static std::string fp8_scale_name(const std::string& name) { return name + "_scale_inv"; }
  static bool is_fp8_scale(const std::string& name);
  std::vector<std::string> names() const;
  // Most common dtype among the tensors (F32, BF16 or F16): picks the default dense dtype.
  DType main_dtype() const;
  size_t n_shards() const { return shards_.size(); }

 private:
  std::filesystem::path dir_;
  Fp8BlockSize fp8_block_;
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::map<std::string, const SafetensorsFile*> where_;
};

}  // namespace moestream
