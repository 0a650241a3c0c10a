// A pack's dense.gguf (loader/format/model_config.h): the dense tensors by the pack's names, each in
// a ggml type. Written by convert_model for `--dense-quant q8` (matrices Q8_0) and for a GGUF
// source (every tensor in its stored type), read by DenseWeights::load.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "loader/format/ggml_types.h"
#include "loader/format/gguf_metadata.h"

namespace moestream {

inline constexpr const char* kDenseGgufFile = "dense.gguf";
inline constexpr const char* kDenseGgufFormatKey = "moestream.format";  // value "moestream-dense"

// Encodes a row-major rows x cols float matrix as ggml type t: F32, BF16 (round to nearest even,
// as dense.safetensors' bf16) or Q8_0 (per block of 32: d = amax/127 stored as float16,
// q = round(x/d) in [-127, 127]; cols a multiple of 32). Other types: MOE_ASSERT.
std::vector<uint8_t> encode_dense_matrix(GgmlType t, const float* src, size_t rows, size_t cols);

// The type `--dense-quant q8` gives a dense tensor: Q8_0 for the attention, embedding and output
// matrices whose rows are whole blocks, BF16 for the others among them; norms and routers stay F32
// (small, and routing decisions are taken on exact logits).
GgmlType dense_q8_type(bool is_matrix, size_t cols);

// dense.gguf's metadata: the format key, then every tokenizer.* key of `tokenizer_source` (a
// converted GGUF's tokenizer and chat template), in its order.
GgufMetadata dense_gguf_metadata(const GgufMetadata* tokenizer_source);

}  // namespace moestream
