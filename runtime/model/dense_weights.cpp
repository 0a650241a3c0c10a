// Implementation of runtime/model/dense_weights.h: the tensor list of an architecture, and the CPU
// load that maps dense.safetensors or the GGUF and points each matrix at its stored bytes (norms
// and routers widened to float32).
#include "runtime/model/dense_weights.h"

#include <cstring>
#include <optional>
#include <string>

#include "common/checked.h"
#include "common/error.h"
#include "kernels/cpu/ggml_quant.h"
#include "kernels/cpu/quant.h"
#include "loader/format/gguf_model.h"
#include "loader/format/safetensors.h"

namespace moestream {

void DenseMatrix::decode_row(size_t r, float* dst) const {
  MOE_ASSERT(r < rows);
  dequantize_matrix(type, data + r * row_bytes(), 1, cols, dst);
}
size_t DenseTensorSpec::elements() const {
  size_t n = 1;
  for (int64_t d : shape) n *= size_t(d);
  return n;
}

namespace {
// DeepSeek-V3's MLA projections of layer i (names and shapes in loader/format/model_config.h).
void append_mla_specs(const ModelConfig& cfg, const std::string& p, int i, std::vector<DenseTensorSpec>& s) {
  using K = DenseTensor;
  const int64_t D = cfg.hidden_size, H = cfg.n_heads, C = cfg.kv_lora_rank, r = cfg.qk_rope_head_dim;
  const int64_t qd = H * (cfg.qk_nope_head_dim + r);
  if (cfg.q_lora_rank > 0) {
    s.push_back({p + "wq_a", {cfg.q_lora_rank, D}, K::kWqA, i});
    s.push_back({p + "q_a_norm", {cfg.q_lora_rank}, K::kQANorm, i});
    s.push_back({p + "wq_b", {qd, cfg.q_lora_rank}, K::kWqB, i});
  } else {
    s.push_back({p + "wq", {qd, D}, K::kWq, i});
  }
  s.push_back({p + "wkv_a", {C + r, D}, K::kWkvA, i});
  s.push_back({p + "kv_a_norm", {C}, K::kKvANorm, i});
  s.push_back({p + "wkv_b", {H * (cfg.qk_nope_head_dim + cfg.v_head_dim), C}, K::kWkvB, i});
  s.push_back({p + "wo", {D, H * cfg.v_head_dim}, K::kWo, i});
}
}  // namespace

std::vector<DenseTensorSpec> dense_tensor_specs(const ModelConfig& cfg) {
  const int64_t V = cfg.vocab_size, D = cfg.hidden_size, hd = cfg.head_dim;
  const int64_t qd = int64_t{cfg.n_heads} * hd, kvd = int64_t{cfg.n_kv_heads} * hd;
  using K = DenseTensor;
  std::vector<DenseTensorSpec> s{{"embed", {V, D}, K::kEmbed}, {"final_norm", {D}, K::kFinalNorm}};
  if (!cfg.tie_word_embeddings) s.push_back({"lm_head", {V, D}, K::kLmHead});
  for (int i = 0; i < cfg.n_layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    s.push_back({p + "attn_norm", {D}, K::kAttnNorm, i});
    if (cfg.has_mla()) {
      append_mla_specs(cfg, p, i, s);
    } else {
      s.push_back({p + "wq", {qd, D}, K::kWq, i});
      s.push_back({p + "wk", {kvd, D}, K::kWk, i});
      s.push_back({p + "wv", {kvd, D}, K::kWv, i});
      s.push_back({p + "wo", {D, qd}, K::kWo, i});
    }
    if (cfg.qkv_bias) {
      s.push_back({p + "bq", {qd}, K::kBq, i});
      s.push_back({p + "bk", {kvd}, K::kBk, i});
      s.push_back({p + "bv", {kvd}, K::kBv, i});
    }
    if (cfg.qk_norm == QkNorm::kPerHead) {
      s.push_back({p + "q_norm", {hd}, K::kQNorm, i});
      s.push_back({p + "k_norm", {hd}, K::kKNorm, i});
    } else if (cfg.qk_norm == QkNorm::kFull) {
      s.push_back({p + "q_norm", {qd}, K::kQNorm, i});
      s.push_back({p + "k_norm", {kvd}, K::kKNorm, i});
    }
    if (cfg.o_bias) s.push_back({p + "bo", {D}, K::kBo, i});  // gpt-oss
    if (cfg.attention_sinks) s.push_back({p + "sinks", {cfg.n_heads}, K::kSinks, i});
    s.push_back({p + "ffn_norm", {D}, K::kFfnNorm, i});
    if (!cfg.is_moe_layer(i)) {  // a dense MLP instead of router and experts
      const int64_t I = cfg.intermediate_size;
      s.push_back({p + "mlp_gate", {I, D}, K::kMlpGate, i});
      s.push_back({p + "mlp_up", {I, D}, K::kMlpUp, i});
      s.push_back({p + "mlp_down", {D, I}, K::kMlpDown, i});
      continue;
    }
    s.push_back({p + "router", {cfg.n_experts, D}, K::kRouter, i});
    // One tensor, two meanings: the sigmoid router's correction bias, or gpt-oss's logit bias
    // (model.json refuses both at once).
    if (cfg.router_scoring == RouterScoring::kSigmoid || cfg.router_bias)
      s.push_back({p + "router_bias", {cfg.n_experts}, K::kRouterBias, i});
    if (cfg.has_shared_expert()) {
      const int64_t fs = cfg.shared_expert_intermediate_size;
      s.push_back({p + "shared_gate", {fs, D}, K::kSharedGate, i});
      s.push_back({p + "shared_up", {fs, D}, K::kSharedUp, i});
      s.push_back({p + "shared_down", {D, fs}, K::kSharedDown, i});
      if (cfg.shared_expert_gated) s.push_back({p + "shared_expert_gate", {1, D}, K::kSharedExpertGate, i});
    }
  }
  return s;
}

namespace {

bool is_matrix(DenseTensor k) {
  return k == DenseTensor::kEmbed || k == DenseTensor::kLmHead || k == DenseTensor::kWq || k == DenseTensor::kWk ||
         k == DenseTensor::kWv || k == DenseTensor::kWo || k == DenseTensor::kSharedGate ||
         k == DenseTensor::kSharedUp || k == DenseTensor::kSharedDown || k == DenseTensor::kMlpGate ||
         k == DenseTensor::kMlpUp || k == DenseTensor::kMlpDown || k == DenseTensor::kWqA ||
         k == DenseTensor::kWqB || k == DenseTensor::kWkvA || k == DenseTensor::kWkvB;
}

// The type a pack's dense.safetensors tensor is computed in; nullopt for a dtype the CPU pass
// does not compute in place (the caller names the tensor).
std::optional<QuantType> pack_type(DType d) {
  switch (d) {
    case DType::kF32: return QuantType::kF32;
    case DType::kBF16: return ggml_quant(GgmlType::kBF16);
    case DType::kF16: return ggml_quant(GgmlType::kF16);
    default: return std::nullopt;
  }
}

// f32 is computed by Eigen; every other type through the ggml kernels.
QuantType compute_type(GgmlType g) { return g == GgmlType::kF32 ? QuantType::kF32 : ggml_quant(g); }

}  // namespace

size_t active_dense_bytes(const ModelConfig& cfg, const std::filesystem::path& dense_path) {
  std::optional<GgufModelFiles> gguf;
  std::optional<SafetensorsFile> pack;
  std::optional<GgufModel> model;  // a GGUF run in place: its own names and derived tensors
  const bool pack_gguf = cfg.format == ModelFormat::kPack && cfg.dense_dtype == "gguf";
  if (cfg.format == ModelFormat::kGguf) model.emplace(dense_path);
  else if (pack_gguf) gguf.emplace(dense_path);
  else pack.emplace(dense_path);
  size_t n = 0;
  for (const DenseTensorSpec& t : dense_tensor_specs(cfg)) {
    const size_t rows = t.shape.size() == 2 ? size_t(t.shape[0]) : 1, cols = size_t(t.shape.back());
    QuantType q = QuantType::kF32;
    if (is_matrix(t.kind) && model) {
      q = compute_type(model->dense_type(t.name));
    } else if (is_matrix(t.kind) && gguf) {
      q = compute_type(gguf->tensor(t.name).type);
    } else if (is_matrix(t.kind) && pack) {
      q = pack_type(pack->info(t.name).dtype).value_or(QuantType::kF32);
    }
    if (t.kind == DenseTensor::kEmbed) n += quant_matrix_bytes(q, 1, cols);  // the token's row
    if (t.kind != DenseTensor::kEmbed || cfg.tie_word_embeddings) n += quant_matrix_bytes(q, rows, cols);
  }
  return n;
}

namespace {

// Llama's Q and K rows as llama.cpp's converter stores them: within each head, the two halves
// that rotate-half RoPE pairs (i, i + hd/2) are interleaved as (2i, 2i + 1). Undone so the engine's
// one RoPE applies: our row h*hd + half*hd/2 + i is the file's row h*hd + 2i + half. Whole rows
// move (a block row is self-contained), into an owned copy in the stored type.
DenseMatrix deinterleave_qk_rows(const DenseMatrix& m, int head_dim, DenseWeights& w, const std::string& what) {
  const size_t hd = size_t(head_dim), half = hd / 2, rb = m.row_bytes();
  uint8_t* dst = nullptr;
  allocating(what + " (Q/K rows de-interleaved)", m.bytes(), "the GGUF", [&] {
    w.owned.emplace_back(new uint8_t[m.bytes()]);
    dst = w.owned.back().get();
  });
  std::memcpy(dst, m.data, m.bytes());  // rows past the last whole head (none in a valid model)
  for (size_t h0 = 0; h0 + hd <= m.rows; h0 += hd)
    for (size_t i = 0; i < half; ++i) {
      std::memcpy(dst + (h0 + i) * rb, m.data + (h0 + 2 * i) * rb, rb);
      std::memcpy(dst + (h0 + half + i) * rb, m.data + (h0 + 2 * i + 1) * rb, rb);
    }
  DenseMatrix out = m;
  out.data = dst;
  return out;
}

// Where each spec's value goes: a matrix, or a float32 vector/router to fill.
struct Slot {
  DenseMatrix* matrix = nullptr;
  Eigen::VectorXf* vector = nullptr;
  RowMatrix* router = nullptr;
};

Slot slot_of(DenseWeights& w, const DenseTensorSpec& t) {
  LayerWeights* l = t.layer >= 0 ? &w.layers[size_t(t.layer)] : nullptr;
  switch (t.kind) {
    case DenseTensor::kEmbed: return {&w.embed};
    case DenseTensor::kLmHead: return {&w.lm_head};
    case DenseTensor::kFinalNorm: return {nullptr, &w.final_norm};
    case DenseTensor::kAttnNorm: return {nullptr, &l->attn_norm};
    case DenseTensor::kWq: return {&l->wq};
    case DenseTensor::kWk: return {&l->wk};
    case DenseTensor::kWv: return {&l->wv};
    case DenseTensor::kWo: return {&l->wo};
    case DenseTensor::kQNorm: return {nullptr, &l->q_norm};
    case DenseTensor::kKNorm: return {nullptr, &l->k_norm};
    case DenseTensor::kFfnNorm: return {nullptr, &l->ffn_norm};
    case DenseTensor::kRouter: return {nullptr, nullptr, &l->router};
    case DenseTensor::kBq: return {nullptr, &l->bq};
    case DenseTensor::kBk: return {nullptr, &l->bk};
    case DenseTensor::kBv: return {nullptr, &l->bv};
    case DenseTensor::kSharedGate: return {&l->shared_gate};
    case DenseTensor::kSharedUp: return {&l->shared_up};
    case DenseTensor::kSharedDown: return {&l->shared_down};
    case DenseTensor::kSharedExpertGate: return {nullptr, nullptr, &l->shared_expert_gate};
    case DenseTensor::kBo: return {nullptr, &l->bo};
    case DenseTensor::kSinks: return {nullptr, &l->sinks};
    case DenseTensor::kRouterBias: return {nullptr, &l->router_bias};
    case DenseTensor::kMlpGate: return {&l->mlp_gate};
    case DenseTensor::kMlpUp: return {&l->mlp_up};
    case DenseTensor::kMlpDown: return {&l->mlp_down};
    case DenseTensor::kWqA: return {&l->wq_a};
    case DenseTensor::kWqB: return {&l->wq_b};
    case DenseTensor::kWkvA: return {&l->wkv_a};
    case DenseTensor::kWkvB: return {&l->wkv_b};
    case DenseTensor::kQANorm: return {nullptr, &l->q_a_norm};
    case DenseTensor::kKvANorm: return {nullptr, &l->kv_a_norm};
  }
  MOE_ASSERT(false, "unknown dense tensor kind");
  return {};
}

// Sizes a float32 vector or router for t (allocation failures name the tensor and the file).
float* float_dst(const Slot& s, const DenseTensorSpec& t, const std::string& name, const std::filesystem::path& path) {
  float* dst = nullptr;
  allocating("dense tensor '" + name + "'", uint64_t(t.elements()) * sizeof(float), path.string(), [&] {
    if (s.vector != nullptr) {
      s.vector->resize(Eigen::Index(t.shape.back()));
      dst = s.vector->data();
    } else {
      s.router->resize(Eigen::Index(t.shape[0]), Eigen::Index(t.shape[1]));
      dst = s.router->data();
    }
  });
  return dst;
}

// A dense tensor a GGUF architecture stores in another form (gguf_model.h: DeepSeek's RoPE rows,
// its split kv_b, an absent correction bias), built into an owned copy; false for a stored one.
bool load_derived(const GgufModel& g, const DenseTensorSpec& t, DenseWeights& w, const std::filesystem::path& file) {
  std::optional<GgufDerivedTensor> d =
      g.derived_tensor(t.name, [](GgmlType ty, const uint8_t* src, size_t rows, size_t cols, float* dst) {
        if (!ggml_type_computable(ty))
          throw ConfigError("a tensor of type " + std::string(ggml_type_name(ty)) + " cannot be dequantised by this build");
        dequantize_matrix(compute_type(ty), src, rows, cols, dst);
      });
  if (!d) return false;
  const size_t rows = t.shape.size() == 2 ? size_t(t.shape[0]) : 1, cols = size_t(t.shape.back());
  const std::vector<uint64_t> want = t.shape.size() == 2 ? std::vector<uint64_t>{cols, rows} : std::vector<uint64_t>{cols};
  if (d->dims != want)
    throw FormatError(file.string() + ": the tensor built for '" + t.name + "' does not have the engine's shape");
  require_ggml_computable(d->type, file.string(), t.name);
  const QuantType q = compute_type(d->type);
  if (d->bytes.size() != quant_matrix_bytes(q, rows, cols))
    throw FormatError(file.string() + ": the tensor built for '" + t.name + "' has the wrong size");
  const Slot s = slot_of(w, t);
  if (s.matrix == nullptr) {
    dequantize_matrix(q, d->bytes.data(), rows, cols, float_dst(s, t, t.name, file));
    return true;
  }
  uint8_t* dst = nullptr;
  allocating("tensor '" + t.name + "'", d->bytes.size(), file.string(), [&] {
    w.owned.emplace_back(new uint8_t[d->bytes.size()]);
    dst = w.owned.back().get();
  });
  std::memcpy(dst, d->bytes.data(), d->bytes.size());
  *s.matrix = DenseMatrix{q, rows, cols, dst};
  return true;
}

// The dense weights of a GGUF model (tensors by GGUF names, `model` set) or of a pack's dense.gguf
// (by our names, rows in our order): each shard holding one mapped once, matrices pointing into it.
DenseWeights load_gguf(const GgufModelFiles& files, const GgufModel* model, const ModelConfig& cfg) {
  DenseWeights w;
  w.layers.resize(static_cast<size_t>(cfg.n_layers));
  std::vector<MappedFile*> shard_maps(files.shard_count(), nullptr);
  for (const DenseTensorSpec& t : dense_tensor_specs(cfg)) {
    if (model != nullptr && load_derived(*model, t, w, files.paths().front())) continue;
    const GgufTensor& gt = model != nullptr ? model->dense_tensor(t.name) : files.tensor(t.name);
    const std::filesystem::path& file = files.path_of(gt);
    const size_t rows = t.shape.size() == 2 ? size_t(t.shape[0]) : 1;
    const size_t cols = size_t(t.shape.back());
    // A one-row matrix may be stored 1-D (Qwen2-MoE's shared-expert gate: llama.cpp asks for [D]).
    const bool shape_ok = t.shape.size() == 2 ? (gt.dims.size() == 2 && gt.dims[0] == cols && gt.dims[1] == rows) ||
                                                    (rows == 1 && gt.dims.size() == 1 && gt.dims[0] == cols)
                                              : gt.dims.size() == 1 && gt.dims[0] == cols;
    if (!shape_ok)
      throw FormatError(file.string() + ": tensor '" + gt.name + "' (" + t.name + ") has " +
                        std::to_string(gt.dims.size()) + " dims " + std::to_string(gt.dims.empty() ? 0 : gt.dims[0]) +
                        " x " + std::to_string(gt.rows()) + ", expected " + std::to_string(cols) + " x " +
                        std::to_string(rows));
    require_ggml_computable(gt.type, file.string(), gt.name);
    const QuantType q = compute_type(gt.type);
    const size_t bytes = quant_matrix_bytes(q, rows, cols);
    if (gt.bytes != bytes)
      throw FormatError(file.string() + ": tensor '" + gt.name + "' holds " + std::to_string(gt.bytes) +
                        " bytes, its " + std::string(ggml_type_name(gt.type)) + " shape needs " + std::to_string(bytes));
    MappedFile*& map = shard_maps.at(gt.shard);
    if (map == nullptr) {
      w.maps.push_back(std::make_unique<MappedFile>(file));
      map = w.maps.back().get();
    }
    const uint8_t* data = map->range(gt.offset, gt.bytes, "tensor '" + gt.name + "'");
    const Slot s = slot_of(w, t);
    if (s.matrix != nullptr) {
      *s.matrix = DenseMatrix{q, rows, cols, data};
      if (model != nullptr && model->qk_rows_interleaved() && (t.kind == DenseTensor::kWq || t.kind == DenseTensor::kWk))
        *s.matrix = deinterleave_qk_rows(*s.matrix, cfg.head_dim, w, "tensor '" + gt.name + "'");
    } else {
      dequantize_matrix(q, data, rows, cols, float_dst(s, t, gt.name, file));
    }
  }
  return w;
}

}  // namespace

DenseWeights DenseWeights::load(const std::filesystem::path& path, const ModelConfig& cfg) {
  if (cfg.format == ModelFormat::kGguf) {
    const GgufModel g(path);
    // The expert tensors too: the expert store only reads their bytes, and a type the kernels
    // cannot compute must be refused at load by name, not at the first token.
    for (int l = 0; l < cfg.n_moe_layers(); ++l)
      for (const char* p : {"gate", "up", "down"}) {
        const GgufTensor& t = g.files().tensor("blk." + std::to_string(cfg.first_k_dense_replace + l) + ".ffn_" + p +
                                               "_exps.weight");
        require_ggml_computable(t.type, g.files().path_of(t).string(), t.name);
      }
    return load_gguf(g.files(), &g, cfg);
  }
  if (cfg.dense_dtype == "gguf") return load_gguf(GgufModelFiles(path), nullptr, cfg);
  SafetensorsFile f(path);
  DenseWeights w;
  w.layers.resize(static_cast<size_t>(cfg.n_layers));
  const MappedFile* map = nullptr;
  for (const DenseTensorSpec& t : dense_tensor_specs(cfg)) {
    f.check_shape(t.name, t.shape);
    const Slot s = slot_of(w, t);
    if (s.matrix == nullptr) {
      f.read_float(t.name, 0, t.elements(), float_dst(s, t, t.name, path));
      continue;
    }
    const TensorInfo& info = f.info(t.name);
    const std::optional<QuantType> q = pack_type(info.dtype);
    if (!q)
      throw FormatError(path.string() + ": tensor '" + t.name + "' has dtype " + std::string(dtype_name(info.dtype)) +
                        "; dense matrices must be F32, BF16 or F16");
    if (map == nullptr) {
      w.maps.push_back(std::make_unique<MappedFile>(path));
      map = w.maps.back().get();
    }
    // SafetensorsFile checked bytes against the shape; the range check covers the file changing since.
    *s.matrix = DenseMatrix{*q, size_t(t.shape[0]), size_t(t.shape[1]),
                            map->range(info.offset, info.bytes, "tensor '" + t.name + "'")};
    MOE_ASSERT(s.matrix->bytes() == info.bytes);
  }
  return w;
}

}  // namespace moestream
