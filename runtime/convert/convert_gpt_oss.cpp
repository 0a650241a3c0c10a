// Implementation of runtime/convert/convert_gpt_oss.h.
#include "runtime/convert/convert_gpt_oss.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/quant.h"

namespace moestream {
namespace {

std::string experts_prefix(int l) { return "model.layers." + std::to_string(l) + ".mlp.experts."; }

void check_u8(const HfCheckpoint& ck, const std::string& name, const std::vector<int64_t>& shape) {
  const TensorInfo& info = ck.info(name);
  if (info.dtype != DType::kU8)
    throw FormatError(ck.file(name).path().string() + ": tensor '" + name + "' has dtype " +
                      std::string(dtype_name(info.dtype)) + ", MXFP4 blocks and scales must be U8");
  ck.file(name).check_shape(name, shape);
}

// `rows` rows of `cols` MXFP4 elements from the checkpoint's blocks/scales, starting at row `row0`
// of expert `e` (of `total_rows` rows), as ggml rows (every `step`-th row: 2 picks gate or up out
// of the interleaved gate_up rows).
void mxfp4_rows(std::span<const uint8_t> blocks, std::span<const uint8_t> scales, int64_t e, int64_t total_rows,
                int64_t row0, int64_t step, int64_t rows, int64_t cols, uint8_t* out) {
  const int64_t G = cols / 32;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t src = e * total_rows + row0 + r * step;  // shapes were checked: in bounds
    const uint8_t* b = blocks.data() + size_t(src * G * 16);
    const uint8_t* s = scales.data() + size_t(src * G);
    uint8_t* dst = out + size_t(r * G * 17);
    for (int64_t g = 0; g < G; ++g) mxfp4_block_to_ggml(s[g], b + g * 16, dst + g * 17);
  }
}

}  // namespace

void mxfp4_block_to_ggml(uint8_t scale, const uint8_t* hf_block, uint8_t* ggml_block) {
  const auto nib = [&](int k) { return (hf_block[k >> 1] >> (4 * (k & 1))) & 0xF; };
  ggml_block[0] = scale;
  for (int j = 0; j < 16; ++j) ggml_block[1 + j] = uint8_t(nib(j) | (nib(j + 16) << 4));
}

void encode_mxfp4_matrix(const float* src, size_t rows, size_t cols, uint8_t* dst) {
  static constexpr float kLevels[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  MOE_ASSERT(cols % 32 == 0, "MXFP4 rows are whole 32-element blocks");
  for (size_t b = 0; b < rows * cols / 32; ++b, src += 32, dst += 17) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(src[j]));
    const int e = amax > 0 ? std::clamp(int(std::ceil(std::log2(amax / 6.0f))), -127, 127) : -127;
    const float inv = std::ldexp(1.0f, -e);
    uint8_t code[32];
    for (int j = 0; j < 32; ++j) {
      const float y = std::fabs(src[j]) * inv;
      int best = 0;
      for (int k = 1; k < 8; ++k)
        if (std::fabs(y - kLevels[k]) < std::fabs(y - kLevels[best])) best = k;
      code[j] = uint8_t(best | (src[j] < 0 && best > 0 ? 8 : 0));
    }
    dst[0] = uint8_t(e + 127);
    for (int j = 0; j < 16; ++j) dst[1 + j] = uint8_t(code[j] | (code[j + 16] << 4));
  }
}

bool check_gpt_oss_experts(const HfCheckpoint& ck, const ModelConfig& c) {
  const int64_t D = c.hidden_size, F = c.moe_intermediate_size, E = c.n_experts;
  const bool mxfp4 = ck.contains(experts_prefix(0) + "gate_up_proj_blocks");
  if (mxfp4 && (D % 32 != 0 || F % 32 != 0))
    throw FormatError("gpt-oss MXFP4 experts need hidden_size (" + std::to_string(D) + ") and intermediate_size (" +
                      std::to_string(F) + ") to be multiples of 32");
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = experts_prefix(l);
    if (mxfp4) {
      check_u8(ck, p + "gate_up_proj_blocks", {E, 2 * F, D / 32, 16});
      check_u8(ck, p + "gate_up_proj_scales", {E, 2 * F, D / 32});
      check_u8(ck, p + "down_proj_blocks", {E, D, F / 32, 16});
      check_u8(ck, p + "down_proj_scales", {E, D, F / 32});
    } else {
      ck.file(p + "gate_up_proj").check_shape(p + "gate_up_proj", {E, D, 2 * F});
      ck.file(p + "down_proj").check_shape(p + "down_proj", {E, F, D});
    }
    ck.file(p + "gate_up_proj_bias").check_shape(p + "gate_up_proj_bias", {E, 2 * F});
    ck.file(p + "down_proj_bias").check_shape(p + "down_proj_bias", {E, D});
  }
  return mxfp4;
}

void write_gpt_oss_layer(const HfCheckpoint& ck, const ModelConfig& c, bool mxfp4, int layer, ExpertFileWriter& w,
                         ThreadPool& pool, const std::function<void(int64_t)>& on_expert) {
  const int64_t D = c.hidden_size, F = c.moe_intermediate_size, E = c.n_experts;
  const ExpertLayout& lay = w.layout();
  MOE_ASSERT(lay.types.bias, "gpt-oss experts carry biases");
  const std::string p = experts_prefix(layer);
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  pool.parallel_for(size_t(pool.size()), [&](size_t) {
    std::vector<float> gate_up, down, gate(size_t(F * D)), up(size_t(F * D)), down_t(size_t(D * F));
    std::vector<float> bias_gu(static_cast<size_t>(2 * F)), bias_d(static_cast<size_t>(D));
    std::vector<float> bias(static_cast<size_t>(2 * F + D));  // gate [F], up [F], down [D]
    std::vector<uint8_t> payload(lay.bytes);
    if (!mxfp4) {
      gate_up.resize(size_t(D * 2 * F));
      down.resize(size_t(F * D));
    }
    for (int64_t e; !failed && (e = next++) < E;) {
      try {
        std::fill(payload.begin(), payload.end(), 0);  // alignment gaps stay zero: stable checksums
        if (mxfp4) {
          const auto gu_b = ck.file(p + "gate_up_proj_blocks").raw(p + "gate_up_proj_blocks");
          const auto gu_s = ck.file(p + "gate_up_proj_scales").raw(p + "gate_up_proj_scales");
          const auto d_b = ck.file(p + "down_proj_blocks").raw(p + "down_proj_blocks");
          const auto d_s = ck.file(p + "down_proj_scales").raw(p + "down_proj_scales");
          mxfp4_rows(gu_b, gu_s, e, 2 * F, 0, 2, F, D, payload.data() + lay.gate_offset);
          mxfp4_rows(gu_b, gu_s, e, 2 * F, 1, 2, F, D, payload.data() + lay.up_offset);
          mxfp4_rows(d_b, d_s, e, D, 0, 1, D, F, payload.data() + lay.down_offset);
        } else {
          ck.file(p + "gate_up_proj").read_float(p + "gate_up_proj", uint64_t(e * D * 2 * F), uint64_t(D * 2 * F),
                                                 gate_up.data());
          ck.file(p + "down_proj").read_float(p + "down_proj", uint64_t(e * F * D), uint64_t(F * D), down.data());
          // transformers computes x @ W: our matrices are W transposed, rows as outputs.
          for (int64_t d = 0; d < D; ++d)
            for (int64_t f = 0; f < F; ++f) {
              gate[size_t(f * D + d)] = gate_up[size_t(d * 2 * F + 2 * f)];
              up[size_t(f * D + d)] = gate_up[size_t(d * 2 * F + 2 * f + 1)];
            }
          for (int64_t f = 0; f < F; ++f)
            for (int64_t d = 0; d < D; ++d) down_t[size_t(d * F + f)] = down[size_t(f * D + d)];
          quantize_matrix(lay.types.gate, gate.data(), size_t(F), size_t(D), payload.data() + lay.gate_offset);
          quantize_matrix(lay.types.up, up.data(), size_t(F), size_t(D), payload.data() + lay.up_offset);
          quantize_matrix(lay.types.down, down_t.data(), size_t(D), size_t(F), payload.data() + lay.down_offset);
        }
        ck.file(p + "gate_up_proj_bias").read_float(p + "gate_up_proj_bias", uint64_t(e * 2 * F), uint64_t(2 * F),
                                                    bias_gu.data());
        ck.file(p + "down_proj_bias").read_float(p + "down_proj_bias", uint64_t(e * D), uint64_t(D), bias_d.data());
        for (int64_t f = 0; f < F; ++f) {
          bias[size_t(f)] = bias_gu[size_t(2 * f)];
          bias[size_t(F + f)] = bias_gu[size_t(2 * f + 1)];
        }
        std::copy(bias_d.begin(), bias_d.end(), bias.begin() + 2 * F);
        std::memcpy(payload.data() + lay.bias_offset, bias.data(), bias.size() * sizeof(float));
        std::lock_guard<std::mutex> lock(mu);
        if (failed) return;
        w.write_expert(static_cast<uint32_t>(e), payload.data());
        on_expert(e);
      } catch (...) {
        failed = true;
        throw;
      }
    }
  });
}

}  // namespace moestream
