// Implementation of loader/format/gguf_arch.h: the table of architectures, every architecture's
// dense tensor names, the readers' shared checks, and GgufModel's derived dense tensors (built
// from the stored ones on demand).
#include "loader/format/gguf_arch.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

#include "common/error.h"

namespace moestream {

namespace {

// The architectures this build runs from GGUF (general.architecture), one entry each.
constexpr GgufArch kGgufArchs[] = {
    {"qwen3moe", nullptr, Arch::kQwen3Moe, true, false, "expert_feed_forward_length", false, nullptr},
    {"olmoe", nullptr, Arch::kOlmoe, false, false, "feed_forward_length", false, nullptr},
    {"llama", nullptr, Arch::kMixtral, true, true, "feed_forward_length", false, nullptr},  // Mixtral: with expert tensors
    {"qwen2moe", nullptr, Arch::kQwen2Moe, false, false, "expert_feed_forward_length", false, extend_gguf_qwen2moe},
    {"glm4moe", nullptr, Arch::kGlm4Moe, false, false, "expert_feed_forward_length", true, extend_gguf_glm4moe},
    {"minimax-m2", nullptr, Arch::kMinimaxM2, true, false, "expert_feed_forward_length", true,
     extend_gguf_minimax_m2},
    // Readers of their own: these fields are theirs to set (gpt-oss rotates whole heads; deepseek2's
    // rope dimension is MLA's qk_rope_head_dim, checked by its reader).
    {"gpt-oss", read_gguf_gpt_oss, Arch::kGptOss, false, false, "", false, nullptr},
    {"deepseek2", read_gguf_deepseek2, Arch::kDeepseekV3, false, false, "", false, nullptr},
};

}  // namespace

const GgufArch& find_gguf_arch(const std::string& where, const std::string& name) {
  std::string known;
  for (const GgufArch& a : kGgufArchs) {
    if (a.gguf_name == name) return a;
    known += (known.empty() ? "" : ", ") + std::string(a.gguf_name);
  }
  gguf_arch_error(where, "general.architecture '" + name + "' is not supported (this build runs " + known +
                             "; llama means Mixtral, with experts)");
}

std::string gguf_dense_name(Arch arch, const std::string& n) {
  if (n == "embed") return "token_embd.weight";
  if (n == "final_norm") return "output_norm.weight";
  if (n == "lm_head") return "output.weight";
  if (n.rfind("layers.", 0) == 0) {
    const size_t dot = n.find('.', 7);
    if (dot != std::string::npos) {
      const std::string blk = "blk." + n.substr(7, dot - 7) + ".";
      const std::string_view field = std::string_view(n).substr(dot + 1);
      const bool post_norm = arch == Arch::kGlm4Moe || arch == Arch::kGptOss;
      const bool deepseek = arch == Arch::kDeepseekV2 || arch == Arch::kDeepseekV3;
      if (post_norm && field == "ffn_norm") return blk + "post_attention_norm.weight";
      if (field == "router_bias") {
        if (arch == Arch::kGptOss) return blk + "ffn_gate_inp.bias";  // added to the logits
        if (arch == Arch::kGlm4Moe || arch == Arch::kMinimaxM2 || deepseek)
          return blk + "exp_probs_b.bias";  // selection only
      }
      // DeepSeek's MLA projections.
      static constexpr std::pair<std::string_view, std::string_view> kMla[] = {
          {"wq_a", "attn_q_a.weight"},          {"q_a_norm", "attn_q_a_norm.weight"},
          {"wq_b", "attn_q_b.weight"},          {"wkv_a", "attn_kv_a_mqa.weight"},
          {"kv_a_norm", "attn_kv_a_norm.weight"}, {"wkv_b", "attn_kv_b.weight"}};
      if (deepseek)
        for (const auto& [ours, theirs] : kMla)
          if (field == ours) return blk + std::string(theirs);
      if (arch == Arch::kGptOss && field == "bo") return blk + "attn_output.bias";
      if (arch == Arch::kGptOss && field == "sinks") return blk + "attn_sinks.weight";
      // Names llama.cpp gives these tensors in every architecture that has them.
      static constexpr std::pair<std::string_view, std::string_view> kLayer[] = {
          {"attn_norm", "attn_norm.weight"},
          {"wq", "attn_q.weight"},
          {"wk", "attn_k.weight"},
          {"wv", "attn_v.weight"},
          {"wo", "attn_output.weight"},
          {"q_norm", "attn_q_norm.weight"},
          {"k_norm", "attn_k_norm.weight"},
          {"ffn_norm", "ffn_norm.weight"},
          {"router", "ffn_gate_inp.weight"},
          {"bq", "attn_q.bias"},
          {"bk", "attn_k.bias"},
          {"bv", "attn_v.bias"},
          {"shared_gate", "ffn_gate_shexp.weight"},
          {"shared_up", "ffn_up_shexp.weight"},
          {"shared_down", "ffn_down_shexp.weight"},
          {"shared_expert_gate", "ffn_gate_inp_shexp.weight"},
          {"mlp_gate", "ffn_gate.weight"},
          {"mlp_up", "ffn_up.weight"},
          {"mlp_down", "ffn_down.weight"}};
      for (const auto& [ours, theirs] : kLayer)
        if (field == ours) return blk + std::string(theirs);
    }
  }
  throw ConfigError("no GGUF name for dense tensor '" + n + "'");
}

void gguf_arch_error(const std::string& where, const std::string& what) { throw FormatError(where + ": " + what); }

const GgufTensor& gguf_arch_shaped(const GgufModelFiles& f, const std::string& where, const std::string& name,
                                   const std::vector<uint64_t>& dims) {
  const GgufTensor* t = f.find_tensor(name);
  if (t == nullptr) gguf_arch_error(where, "tensor '" + name + "' is missing");
  if (t->dims != dims) {
    auto str = [](const std::vector<uint64_t>& d) {
      std::string s = "[";
      for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
      return s + "]";
    };
    gguf_arch_error(where, "tensor '" + name + "' has shape " + str(t->dims) + ", expected " + str(dims) +
                               " (ne0 first)");
  }
  return *t;
}

const GgufTensor& gguf_arch_shaped_any(const GgufModelFiles& f, const std::string& where, const std::string& name,
                                       const std::vector<std::vector<uint64_t>>& allowed) {
  const GgufTensor* t = f.find_tensor(name);
  if (t != nullptr)
    for (const auto& dims : allowed)
      if (t->dims == dims) return *t;
  return gguf_arch_shaped(f, where, name, allowed.front());  // names what is missing or wrong
}

void gguf_arch_missing_experts(const GgufModelFiles& f, const std::string& where, int layer) {
  const std::string p = "blk." + std::to_string(layer) + ".";
  if (f.find_tensor(p + "ffn_gate_up_exps.weight") != nullptr)
    gguf_arch_error(where, "tensor '" + p + "ffn_gate_up_exps.weight' holds gate and up fused, which this build does "
                           "not read (it needs ffn_gate_exps and ffn_up_exps, as llama.cpp's converter writes them)");
  gguf_arch_error(where, "tensor '" + p + "ffn_gate_exps.weight' is missing");
}

GgufArchSizes gguf_arch_sizes(const GgufModelFiles& f, const std::string& where, const std::string& a, int first_moe,
                              const std::string& width_key) {
  const std::string gate_name = "blk." + std::to_string(first_moe) + ".ffn_gate_exps.weight";
  const GgufTensor* gate = f.find_tensor(gate_name);
  if (gate == nullptr) gguf_arch_missing_experts(f, where, first_moe);
  if (gate->dims.size() != 3) gguf_arch_error(where, "tensor '" + gate_name + "' is not 3-dimensional");
  GgufArchSizes z{gate->dims[0], gate->dims[1], gate->dims[2], 0};
  const GgufTensor& embd = f.tensor("token_embd.weight");
  if (embd.dims.size() != 2 || embd.dims[0] != z.hidden)
    gguf_arch_error(where, "tensor 'token_embd.weight' is not [" + std::to_string(z.hidden) + ", vocab]");
  z.vocab = embd.dims[1];
  const GgufMetadata& m = f.metadata();
  gguf_arch_agree(m, where, a + "embedding_length", z.hidden);
  gguf_arch_agree(m, where, a + "expert_count", z.experts);
  gguf_arch_agree(m, where, a + width_key, z.expert_width);
  gguf_arch_agree(m, where, a + "vocab_size", z.vocab);
  return z;
}

void gguf_arch_agree(const GgufMetadata& m, const std::string& where, const std::string& key, uint64_t want) {
  if (const auto v = m.find_u64(key); v && *v != want)
    gguf_arch_error(where, "metadata " + key + " = " + std::to_string(*v) + " contradicts the tensors (" +
                               std::to_string(want) + ")");
}

void gguf_arch_refuse(const GgufMetadata& m, const std::string& where, const std::string& key, const std::string& why) {
  if (m.contains(key)) gguf_arch_error(where, "metadata " + key + " is not supported: " + why);
}

GgufExpertMatrix gguf_arch_experts(const std::string& where, const GgufTensor& t, uint64_t n_experts) {
  if (n_experts == 0 || t.bytes % n_experts != 0)
    gguf_arch_error(where, "tensor '" + t.name + "' does not split into " + std::to_string(n_experts) + " experts");
  return GgufExpertMatrix{t.shard, t.offset, t.bytes / n_experts};
}

uint64_t gguf_arch_rope_dims(const GgufMetadata& m, const std::string& where, const std::string& a, uint64_t head_dim,
                             bool partial) {
  const std::string key = a + "rope.dimension_count";
  const uint64_t rot = m.find_u64(key).value_or(head_dim);
  const std::string head = "the head width " + std::to_string(head_dim) + " (" + a + "attention.key_length, or " + a +
                           "embedding_length / " + a + "attention.head_count, as the attention tensors hold it)";
  if (head_dim % 2 != 0)
    gguf_arch_error(where, head + " is odd: RoPE turns pairs of a head's elements (" + key + " = " +
                               std::to_string(rot) + ")");
  if (partial && (rot < 2 || rot > head_dim || rot % 2 != 0))
    gguf_arch_error(where, key + " = " + std::to_string(rot) + " is not an even width in [2, " +
                               std::to_string(head_dim) + "], " + head);
  if (!partial && rot != head_dim)
    gguf_arch_error(where, key + " = " + std::to_string(rot) + " differs from " + head + ": this architecture " +
                               "rotates whole heads (partial rotary is glm4moe's and minimax-m2's)");
  return rot;
}

namespace {

// The block of a per-block tensor (blk.N. with N decimal digits, as llama.cpp names them).
std::optional<uint64_t> block_of(const std::string& name) {
  if (!name.starts_with("blk.")) return std::nullopt;
  const size_t dot = name.find('.', 4);
  if (dot == std::string::npos || dot == 4 || dot > 4 + 9) return std::nullopt;
  uint64_t n = 0;
  for (size_t i = 4; i < dot; ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    n = n * 10 + uint64_t(name[i] - '0');
  }
  return n;
}

}  // namespace

void gguf_arch_check_block_count(const GgufModelFiles& f, const std::string& where, const std::string& key,
                                 uint64_t block_count) {
  const GgufTensor* past = nullptr;
  uint64_t past_block = 0, n_blocks = 0;
  for (const GgufTensor& t : f.tensors()) {
    const std::optional<uint64_t> b = block_of(t.name);
    if (!b) continue;
    const uint64_t n = *b;
    n_blocks = std::max(n_blocks, n + 1);
    if (n >= block_count && past == nullptr) {
      past = &t;
      past_block = n;
    }
  }
  if (past != nullptr)
    gguf_arch_error(where, "metadata " + key + " = " + std::to_string(block_count) + " contradicts the tensors, which " +
                               "hold " + std::to_string(n_blocks) + " blocks (tensor '" + past->name + "' is in block " +
                               std::to_string(past_block) + ")");
}

void gguf_arch_check_mtp_blocks(const GgufModelFiles& f, const std::string& where, const std::string& key,
                                uint64_t n_layers, uint64_t block_count) {
  // Per block that holds tensors (the count comes from the metadata: never sized by it).
  std::map<uint64_t, std::pair<bool, const GgufTensor*>> blocks;  // has a nextn tensor, a decoder tensor
  for (const GgufTensor& t : f.tensors()) {
    const std::optional<uint64_t> b = block_of(t.name);
    if (!b || *b < n_layers || *b >= block_count) continue;
    auto& [mtp, decoder] = blocks[*b];
    if (t.name.compare(t.name.find('.', 4) + 1, 6, "nextn.") == 0) mtp = true;
    else if (decoder == nullptr) decoder = &t;
  }
  for (const auto& [b, kinds] : blocks)
    if (!kinds.first)
      gguf_arch_error(where, "metadata " + key + " = " + std::to_string(block_count - n_layers) + " makes block " +
                                 std::to_string(b) + " an MTP block, but the tensors hold a decoder layer there " +
                                 "(tensor '" + kinds.second->name + "', no blk." + std::to_string(b) +
                                 ".nextn.* tensor)");
}

std::vector<double> gguf_arch_floats(const GgufMetadata& m, const std::string& key) {
  const GgufValue* v = m.find(key);
  if (v == nullptr) return {};
  if (v->to_array() == nullptr) return {m.get_f64(key)};
  std::vector<double> out;
  for (float f : m.get_f32_array(key)) out.push_back(double(f));
  return out;
}

std::optional<RopeScaling> gguf_arch_rope_scaling(const GgufMetadata& m, const std::string& where, const std::string& a) {
  const std::string* type = m.find_string(a + "rope.scaling.type");
  if (type == nullptr || *type == "none") return std::nullopt;
  if (*type != "linear" && *type != "yarn")
    gguf_arch_error(where, a + "rope.scaling.type '" + *type + "' is not supported (none, linear, yarn)");
  // llama.cpp's own YaRN knobs beyond the published configs' (defaults: computed, 1).
  gguf_arch_refuse(m, where, a + "rope.scaling.yarn_ext_factor", "YaRN's extrapolation mix is computed from the factor");
  if (const auto f = m.find_f64(a + "rope.scaling.yarn_attn_factor"); f && *f != 1.0)
    gguf_arch_error(where, a + "rope.scaling.yarn_attn_factor " + std::to_string(*f) + " is not supported (1 only)");
  RopeScaling s;
  s.type = *type;
  s.factor = m.get_f64(a + "rope.scaling.factor");
  if (!(s.factor >= 1.0)) gguf_arch_error(where, a + "rope.scaling.factor must be >= 1");
  if (*type == "yarn") {
    s.original_max_position_embeddings = double(m.get_u64(a + "rope.scaling.original_context_length"));
    s.beta_fast = m.find_f64(a + "rope.scaling.yarn_beta_fast").value_or(32.0);
    s.beta_slow = m.find_f64(a + "rope.scaling.yarn_beta_slow").value_or(1.0);
  }
  return s;
}

void gguf_arch_validate(ModelConfig& c, const std::string& where) {
  // Placeholders model.json requires; GgufModel sets the GGUF-specific fields after validation.
  c.dense_file = "dense.safetensors";
  c.dense_dtype = "f32";
  c.experts_dir = "experts";
  try {
    c = ModelConfig::from_json(c.to_json(), where);
  } catch (const Error& e) {
    throw FormatError(std::string(e.what()) + " (values read from the GGUF metadata and tensors)");
  }
}

namespace {

// Element i of a 1- to 3-dimensional F32/F16/BF16/... tensor dequantised whole.
std::vector<float> dequantised(const GgufModel& g, const GgufTensor& t, const GgufDequantizer& deq) {
  const std::vector<uint8_t> bytes = g.read_tensor(t);
  const uint64_t cols = t.dims.at(0), rows = t.rows();
  std::vector<float> out(size_t(rows * cols));
  deq(t.type, bytes.data(), size_t(rows), size_t(cols), out.data());
  return out;
}

}  // namespace

std::optional<GgufDerivedTensor> GgufModel::derived_tensor(const std::string& our_name, const GgufDequantizer& deq) const {
  const auto it = derived_.find(our_name);
  if (it == derived_.end()) return std::nullopt;
  const GgufDerivedSpec& d = it->second;
  GgufDerivedTensor out;
  out.dims = d.dims;
  switch (d.kind) {
    case GgufDerivedSpec::Kind::kZeros: {
      uint64_t n = 1;
      for (uint64_t x : d.dims) n *= x;
      out.type = GgmlType::kF32;
      out.bytes.assign(size_t(n) * sizeof(float), 0);
      return out;
    }
    case GgufDerivedSpec::Kind::kRopeRows: {
      // Whole rows move (a quantised row is self-contained): in each group of `group` rows, the
      // last `rope` rows pair (2i, 2i + 1) and become (i, rope/2 + i), rotate-half's order.
      const GgufTensor& t = files_.tensor(d.src);
      out.type = t.type;
      const std::vector<uint8_t> in = read_tensor(t);
      out.bytes = in;
      const uint64_t rows = t.rows(), rb = rows == 0 ? 0 : in.size() / rows, half = d.rope / 2;
      for (uint64_t base = d.group - d.rope; base + d.rope <= rows; base += d.group)
        for (uint64_t i = 0; i < half; ++i) {
          std::memcpy(out.bytes.data() + (base + i) * rb, in.data() + (base + 2 * i) * rb, rb);
          std::memcpy(out.bytes.data() + (base + half + i) * rb, in.data() + (base + 2 * i + 1) * rb, rb);
        }
      return out;
    }
    case GgufDerivedSpec::Kind::kKvB: {
      // wkv_b [H*(n+v), C]: per head n key rows then v value rows. attn_k_b is ne [n, C, H] (each
      // head's key block transposed), attn_v_b ne [C, v, H] (as wkv_b's value rows).
      const std::vector<float> kb = dequantised(*this, files_.tensor(d.src), deq);
      const std::vector<float> vb = dequantised(*this, files_.tensor(d.src2), deq);
      const uint64_t H = d.heads, n = d.nope, v = d.v, C = d.rank;
      out.type = GgmlType::kF32;
      out.bytes.resize(size_t(H * (n + v) * C) * sizeof(float));
      float* w = reinterpret_cast<float*>(out.bytes.data());
      for (uint64_t h = 0; h < H; ++h) {
        for (uint64_t i = 0; i < n; ++i)
          for (uint64_t c = 0; c < C; ++c) w[(h * (n + v) + i) * C + c] = kb[(h * C + c) * n + i];
        for (uint64_t j = 0; j < v; ++j)
          std::memcpy(w + (h * (n + v) + n + j) * C, vb.data() + (h * v + j) * C, C * sizeof(float));
      }
      return out;
    }
  }
  return std::nullopt;
}

GgmlType GgufModel::dense_type(const std::string& our_name) const {
  if (const auto it = derived_.find(our_name); it != derived_.end())
    return it->second.kind == GgufDerivedSpec::Kind::kRopeRows ? files_.tensor(it->second.src).type : GgmlType::kF32;
  return dense_tensor(our_name).type;
}

std::vector<uint64_t> GgufModel::dense_dims(const std::string& our_name) const {
  if (const auto it = derived_.find(our_name); it != derived_.end()) return it->second.dims;
  return dense_tensor(our_name).dims;
}

std::vector<std::string> GgufModel::arch_dense_names() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : names_) out.push_back(k);
  for (const auto& [k, v] : derived_) out.push_back(k);
  return out;
}

}  // namespace moestream
