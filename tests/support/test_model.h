// Setup shared by the C++ tests: tiny model configs, packed layer files with known payloads,
// in-place corruption of a file, typed error messages and the CLIs of the build tree.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "loader/format/expert_map.h"
#include "loader/format/model_config.h"

namespace moestream::test {

// The dimensions a test picks for a small Qwen3-MoE model (per-head q/k norm). Fields in
// ModelConfig's order, so a test names only what it changes: tiny_moe_config({.hidden = 37}).
struct TinyShape {
  int vocab = 61, hidden = 48, layers = 2, heads = 4, kv_heads = 2, head_dim = 12;
  int intermediate = 40, experts = 8, top_k = 2, max_positions = 128;
  QuantType quant = QuantType::kQ8;
};
ModelConfig tiny_moe_config(const TinyShape& s);
// The families' quirks on a tiny config (the sizes each test picks for its own widths):
// Qwen2-MoE: a gated shared expert of `shared` rows, QKV bias, no q/k norm.
void as_qwen2_moe(ModelConfig& c, int shared);
// The routing, shared expert and dense first layer GLM-4.5 and DeepSeek-V3 share: grouped sigmoid
// routing (4 groups, 2 kept, scaling 2.5), an ungated shared expert of `shared` rows, one dense
// first layer of `dense_intermediate`.
void grouped_sigmoid_with_dense_first_layer(ModelConfig& c, int shared, int dense_intermediate);
// GLM-4.5: grouped sigmoid routing (4 groups, 2 kept, scaling 2.5), QKV bias, an ungated shared
// expert, one dense first layer of `dense_intermediate`, partial rotary of `rotary_dim`.
struct GlmShape {
  int shared = 0, dense_intermediate = 0, rotary_dim = 0;
};
void as_glm4_moe(ModelConfig& c, const GlmShape& s);
// MiniMax-M2: QK-norm over all heads, partial rotary of `rotary_dim`, the sigmoid router with its
// correction bias in one group (renormalised, unscaled), no shared expert, no dense layer.
void as_minimax_m2(ModelConfig& c, int rotary_dim);
// DeepSeek-V3: MLA (q LoRA, YaRN mscale 1 of factor 4 over 32 positions; n_kv_heads = n_heads)
// over GLM-4.5's routing, shared expert and dense first layer. head_dim must be nope + rope.
struct MlaShape {
  int q_lora = 0, kv_lora = 0, nope = 0, rope = 0, v = 0, shared = 0, dense_intermediate = 0;
};
void as_deepseek_v3(ModelConfig& c, const MlaShape& s);

// A q8 shape whose expert matrices all take the GPU's grouped GEMM (widths multiples of 32; the
// demo's expert width of 80 takes the per-row matvec): 3 layers, 16 experts of about 105 KiB,
// top-4. The GPU resident-decode and preload tests.
ModelConfig grouped_q8_config();

// Bytes of one expert slot of cfg's layer files: the expert rounded up to 4 KiB.
uint64_t expert_slot_bytes(const ModelConfig& cfg);

using Payloads = std::vector<std::vector<std::vector<uint8_t>>>;  // [layer][logical expert]

// Writes dir/model.json and experts/layer_NNN.bin with random payloads drawn from `seed`; with
// `permute`, logical expert e goes to a shuffled physical slot and a layer_NNN.map records it.
Payloads write_layer_files(const std::filesystem::path& dir, const ModelConfig& cfg, uint32_t seed,
                           bool permute = false);

// Overwrites bytes in place at `offset` (the file keeps its size): corruption for load tests.
// Writes `map` as layer `layer`'s map of `dir`, bound to the layer file already there (what a
// repack installs); the caller vouches that the file is laid out in the map's order.
void write_bound_map(const std::filesystem::path& dir, int layer, const ExpertMap& map);

void overwrite_bytes(const std::filesystem::path& file, uint64_t offset, std::string_view bytes);

// The message of the E that f() throws; "<no exception>" when it returns (another exception
// type propagates and fails the test).
template <class E = Error>
std::string error_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "<no exception>";
}

// A CLI of the build tree: `tool` in MOESTREAM_BIN_DIR.
struct CliResult {
  int status = -1;  // exit status; -1 when it did not run or was killed
  std::string output;
};
bool have_tool(const std::string& tool);
// Runs `tool args`, capturing stdout, and stderr too with `with_stderr` (else discarded).
CliResult run_tool(const std::string& tool, const std::string& args, bool with_stderr = false);

}  // namespace moestream::test
