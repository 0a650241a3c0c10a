// Implementation of runtime/convert/synthetic_model.h. A counter-based generator (splitmix64 of seed,
// tensor and index) makes every weight independent of the thread that draws it.
#include "runtime/convert/synthetic_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "loader/format/dense_checksum.h"
#include "loader/format/expert_file_writer.h"
#include "runtime/convert/convert_gpt_oss.h"
#include "kernels/cpu/quant.h"
#include "loader/format/safetensors.h"
#include "common/thread_pool.h"

namespace moestream {

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Fills n floats uniform in [center - half_width, center + half_width), stream `stream`.
void fill_uniform(float* dst, size_t n, uint64_t seed, uint64_t stream, float center, float half_width) {
  uint64_t s = splitmix64(seed ^ splitmix64(stream));
  for (size_t i = 0; i < n; ++i) {
    s = splitmix64(s);
    const float u = float(s >> 40) * 0x1.0p-24f;  // [0, 1)
    dst[i] = center + half_width * (2 * u - 1);
  }
}

// Half width of a uniform distribution with standard deviation 1/sqrt(fan_in).
float half_width_for(size_t fan_in) { return std::sqrt(3.0f / float(fan_in)); }

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  float center, half_width;
  size_t numel() const {
    size_t n = 1;
    for (int64_t d : shape) n *= size_t(d);
    return n;
  }
};

// Every dense tensor of cfg with its init distribution, in file order.
std::vector<TensorSpec> dense_tensors(const ModelConfig& cfg) {
  const size_t V = size_t(cfg.vocab_size), D = size_t(cfg.hidden_size), hd = size_t(cfg.head_dim);
  const size_t qd = size_t(cfg.n_heads) * hd, kvd = size_t(cfg.n_kv_heads) * hd;
  const size_t E = size_t(cfg.n_experts);
  std::vector<TensorSpec> tensors;
  auto mat = [&](std::string name, size_t rows, size_t cols, float scale = 1.0f) {
    tensors.push_back({std::move(name), {int64_t(rows), int64_t(cols)}, 0.0f, scale * half_width_for(cols)});
  };
  auto norm = [&](std::string name, size_t n) {
    tensors.push_back({std::move(name), {int64_t(n)}, 1.0f, 0.1f});
  };
  tensors.push_back({"embed", {int64_t(V), int64_t(D)}, 0.0f, 1.7f});  // unit-variance rows
  norm("final_norm", D);
  if (!cfg.tie_word_embeddings) mat("lm_head", V, D);
  for (int l = 0; l < cfg.n_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    norm(p + "attn_norm", D);
    if (cfg.has_mla()) {  // DeepSeek-V3's MLA projections (model_config.h)
      const size_t H = size_t(cfg.n_heads), C = size_t(cfg.kv_lora_rank), r = size_t(cfg.qk_rope_head_dim);
      const size_t Q = size_t(cfg.q_lora_rank), qk = size_t(cfg.qk_nope_head_dim) + r;
      if (Q > 0) {
        mat(p + "wq_a", Q, D);
        norm(p + "q_a_norm", Q);
        mat(p + "wq_b", H * qk, Q);
      } else {
        mat(p + "wq", H * qk, D);
      }
      mat(p + "wkv_a", C + r, D);
      norm(p + "kv_a_norm", C);
      mat(p + "wkv_b", H * (size_t(cfg.qk_nope_head_dim) + size_t(cfg.v_head_dim)), C);
      mat(p + "wo", D, H * size_t(cfg.v_head_dim));
    } else {
      mat(p + "wq", qd, D);
      mat(p + "wk", kvd, D);
      mat(p + "wv", kvd, D);
      mat(p + "wo", D, qd);
    }
    if (cfg.qkv_bias)  // small, centred at 0: a bias shifts, it does not scale
      for (auto [b, n] : {std::pair{"bq", qd}, std::pair{"bk", kvd}, std::pair{"bv", kvd}})
        tensors.push_back({p + b, {int64_t(n)}, 0.0f, 0.5f});
    if (cfg.qk_norm == QkNorm::kPerHead) {
      norm(p + "q_norm", hd);
      norm(p + "k_norm", hd);
    } else if (cfg.qk_norm == QkNorm::kFull) {
      norm(p + "q_norm", qd);
      norm(p + "k_norm", kvd);
    }
    // gpt-oss: biases small and centred at 0; sinks of the scores' size
    if (cfg.o_bias) tensors.push_back({p + "bo", {int64_t(D)}, 0.0f, 0.5f});
    if (cfg.attention_sinks) tensors.push_back({p + "sinks", {int64_t(cfg.n_heads)}, 0.0f, 1.0f});
    norm(p + "ffn_norm", D);
    if (l < cfg.first_k_dense_replace) {  // GLM-4.5 / DeepSeek-V3: a dense MLP, no experts
      const size_t I = size_t(cfg.intermediate_size);
      mat(p + "mlp_gate", I, D);
      mat(p + "mlp_up", I, D);
      mat(p + "mlp_down", D, I);
      continue;
    }
    mat(p + "router", E, D, 2.0f);  // spread router logits so top-k choices are not near ties
    if (cfg.router_scoring == RouterScoring::kSigmoid)  // correction bias: small, centred at 0
      tensors.push_back({p + "router_bias", {int64_t(E)}, 0.0f, 0.05f});
    if (cfg.has_shared_expert()) {
      const size_t fs = size_t(cfg.shared_expert_intermediate_size);
      mat(p + "shared_gate", fs, D);
      mat(p + "shared_up", fs, D);
      mat(p + "shared_down", D, fs);
      if (cfg.shared_expert_gated) mat(p + "shared_expert_gate", 1, D);
    }
    if (cfg.router_bias) tensors.push_back({p + "router_bias", {int64_t(E)}, 0.0f, 0.5f});  // gpt-oss
  }
  return tensors;
}

DType dense_dtype_of(const ModelConfig& cfg) { return cfg.dense_dtype == "bf16" ? DType::kBF16 : DType::kF32; }

uint64_t expert_file_bytes(const ModelConfig& cfg, PayloadHash hash) {
  const ExpertLayout layout = cfg.expert_layout(0);
  auto align = [](uint64_t v) { return (v + kExpertAlign - 1) / kExpertAlign * kExpertAlign; };
  const uint64_t E = uint64_t(cfg.n_experts);
  ExpertFileHeader h;
  h.payload_hash = hash;
  h.set_types(layout.types);
  return expert_data_offset(h.version, uint32_t(E)) + E * align(layout.bytes);
}

// An expert matrix in the pack's type: MXFP4 (gpt-oss) by our encoder, the pack types by quant.h.
void encode_matrix(QuantType q, const float* m, size_t rows, size_t cols, uint8_t* out) {
  if (q == ggml_quant(GgmlType::kMXFP4)) encode_mxfp4_matrix(m, rows, cols, out);
  else quantize_matrix(q, m, rows, cols, out);
}

}  // namespace

uint64_t synthetic_dense_bytes(const ModelConfig& cfg) {
  uint64_t n = 0;
  for (const TensorSpec& t : dense_tensors(cfg)) n += uint64_t(t.numel()) * dtype_bytes(dense_dtype_of(cfg));
  return n;
}

uint64_t synthetic_model_bytes(const ModelConfig& cfg, PayloadHash hash) {
  return synthetic_dense_bytes(cfg) + uint64_t(cfg.n_moe_layers()) * expert_file_bytes(cfg, hash);
}

void write_synthetic_model(const std::filesystem::path& dir, const ModelConfig& cfg, uint64_t seed,
                           int n_threads, const SyntheticProgressFn& progress, PayloadHash hash) {
  namespace fs = std::filesystem;
  fs::create_directories(dir / cfg.experts_dir);
  const size_t D = size_t(cfg.hidden_size);
  const size_t F = size_t(cfg.moe_intermediate_size), E = size_t(cfg.n_experts);
  const DType dt = dense_dtype_of(cfg);
  const uint64_t total = synthetic_model_bytes(cfg, hash);
  uint64_t done = 0;
  const std::vector<TensorSpec> tensors = dense_tensors(cfg);
  {
    SafetensorsWriter w(dir / cfg.dense_file);
    for (const TensorSpec& t : tensors) w.declare(t.name, dt, t.shape);
    std::vector<float> buf;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const TensorSpec& t = tensors[i];
      const size_t n = t.numel();
      buf.resize(n);
      fill_uniform(buf.data(), n, seed, i, t.center, t.half_width);
      w.write(t.name, buf.data(), n);
      done += uint64_t(n) * dtype_bytes(dt);
    }
    w.finish();
  }
  if (progress) progress(done, total);

  ThreadPool pool(n_threads);
  const ExpertLayout layout = cfg.expert_layout(0);
  const uint64_t stride = (layout.bytes + kExpertAlign - 1) / kExpertAlign * kExpertAlign;
  // Experts are encoded a batch at a time so memory stays at kBatch payloads plus floats: up to
  // 16, within 1 GiB of scratch (a Mixtral expert's floats alone are 235 MB), at least one.
  const size_t per_expert_ram = F * D * sizeof(float) + layout.bytes;
  const size_t kBatch = std::clamp<size_t>((size_t(1) << 30) / per_expert_ram, 1, 16);
  std::vector<uint8_t> payloads(kBatch * layout.bytes);
  std::vector<std::vector<float>> scratch(kBatch, std::vector<float>(F * D));
  for (int l = 0; l < cfg.n_moe_layers(); ++l) {  // expert files number MoE layers (model_config.h)
    ExpertFileWriter writer(expert_file_path(dir, l), layout.types, uint32_t(l), uint32_t(E),
                            uint32_t(D), uint32_t(F), 0, hash);
    for (size_t e0 = 0; e0 < E; e0 += kBatch) {
      const size_t n = std::min(kBatch, E - e0);
      pool.parallel_for(n, [&](size_t i) {
        uint8_t* out = payloads.data() + i * layout.bytes;
        std::fill(out, out + layout.bytes, uint8_t{0});
        float* m = scratch[i].data();
        const uint64_t stream = (uint64_t(l + 1) << 40) ^ (uint64_t(e0 + i) << 8);
        fill_uniform(m, F * D, seed, stream | 1, 0.0f, half_width_for(D));
        encode_matrix(cfg.expert_quant, m, F, D, out + layout.gate_offset);
        fill_uniform(m, F * D, seed, stream | 2, 0.0f, half_width_for(D));
        encode_matrix(cfg.expert_quant, m, F, D, out + layout.up_offset);
        fill_uniform(m, D * F, seed, stream | 3, 0.0f, half_width_for(F));
        encode_matrix(cfg.expert_quant, m, D, F, out + layout.down_offset);
        if (layout.types.bias) {  // gpt-oss: f32 gate/up/down biases, small and centred at 0
          fill_uniform(m, 2 * F + D, seed, stream | 4, 0.0f, 0.5f);
          std::memcpy(out + layout.bias_offset, m, (2 * F + D) * sizeof(float));
        }
      });
      for (size_t i = 0; i < n; ++i) writer.write_expert(uint32_t(e0 + i), payloads.data() + i * layout.bytes);
      done += n * stride;
      if (progress) progress(done, total);
    }
    writer.finish();
    done = synthetic_dense_bytes(cfg) + uint64_t(l + 1) * expert_file_bytes(cfg, hash);
  }
  ModelConfig saved = cfg;  // the dense file is final here: its checksum goes into model.json
  saved.dense_xxh3 = dense_file_checksum(dir / cfg.dense_file);
  saved.save(dir);
}

}  // namespace moestream
