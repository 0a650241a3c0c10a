// Implementation of loader/format/model_config.h: model.json <-> ModelConfig, validating every field
// and naming the file and the key in each error.
#include "loader/format/model_config.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <system_error>

#include <nlohmann/json.hpp>

#include "common/enum_names.h"
#include "common/error.h"
#include "common/file_util.h"
#include "loader/format/gguf_model.h"

namespace moestream {
namespace {

using nlohmann::json;

constexpr int kFormatVersion = 1;       // pack types only: what builds before ggml types read
constexpr int kFormatVersionTyped = 2;  // adds experts.layer_types, ggml types, dense.dtype "gguf"

[[noreturn]] void bad(const std::string& where, const std::string& key, const std::string& what) {
  throw FormatError(where + ": field '" + key + "' " + what);
}

const json& need(const json& j, const std::string& key, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end()) bad(where, key, "is missing");
  return *it;
}

int get_int(const json& j, const std::string& key, const std::string& where, int min_value) {
  const json& v = need(j, key, where);
  if (!v.is_number_integer()) bad(where, key, "must be an integer, got " + v.dump());
  long long x = v.get<long long>();
  if (x < min_value || x > (1LL << 30))
    bad(where, key, "must be in [" + std::to_string(min_value) + ", 2^30], got " + std::to_string(x));
  return static_cast<int>(x);
}

double get_num(const json& j, const std::string& key, const std::string& where) {
  const json& v = need(j, key, where);
  if (!v.is_number()) bad(where, key, "must be a number, got " + v.dump());
  return v.get<double>();
}

bool get_bool(const json& j, const std::string& key, const std::string& where) {
  const json& v = need(j, key, where);
  if (!v.is_boolean()) bad(where, key, "must be true or false, got " + v.dump());
  return v.get<bool>();
}

std::string get_str(const json& j, const std::string& key, const std::string& where) {
  const json& v = need(j, key, where);
  if (!v.is_string()) bad(where, key, "must be a string, got " + v.dump());
  return v.get<std::string>();
}

const json& get_obj(const json& j, const std::string& key, const std::string& where) {
  const json& v = need(j, key, where);
  if (!v.is_object()) bad(where, key, "must be an object, got " + v.dump());
  return v;
}

// Optional string-or-null: empty string when absent or null.
std::string get_opt_str(const json& j, const std::string& key, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return "";
  if (!it->is_string()) bad(where, key, "must be a string or null, got " + it->dump());
  return it->get<std::string>();
}

// Optional token id: absent or null, else an integer in [0, vocab_size).
std::optional<int> get_opt_token_id(const json& j, const std::string& key, const std::string& where, int vocab_size) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_number_integer()) bad(where, key, "must be an integer or null, got " + it->dump());
  const long long id = it->get<long long>();
  if (id < 0 || id >= vocab_size)
    bad(where, key, "is " + std::to_string(id) + ", outside the vocabulary [0, vocab_size=" +
                        std::to_string(vocab_size) + ")");
  return static_cast<int>(id);
}

// A file or directory named by model.json: relative to the model directory and inside it, so a
// model cannot point its readers at /etc/passwd or ../elsewhere.
std::string check_model_path(const std::string& value, const std::string& where, const std::string& key) {
  if (value.empty()) bad(where, key, "is empty");
  const std::filesystem::path p(value);
  if (p.is_absolute()) bad(where, key, "is the absolute path '" + value + "': it must be relative to the model directory");
  for (const std::filesystem::path& part : p)
    if (part == "..") bad(where, key, "is '" + value + "': '..' would leave the model directory");
  return value;
}

// Every buffer a model needs is a product of these fields; bounding the products (in elements)
// keeps each byte size, times sizeof(float) and a context of up to 2^24 positions, far from
// overflowing 64 bits, and refuses shapes no machine could hold.
struct Factor {
  const char* name;
  int value;
};
void check_elements(const std::string& where, std::initializer_list<Factor> factors, int log2_limit,
                    const char* what) {
  uint64_t p = 1;
  bool over = false;
  std::string names, values;
  for (const Factor& f : factors) {
    names += (names.empty() ? "" : " x ") + std::string(f.name);
    values += (values.empty() ? "" : " x ") + std::to_string(f.value);
    over = over || __builtin_mul_overflow(p, uint64_t(f.value), &p) || p > (uint64_t(1) << log2_limit);
  }
  if (over)
    throw FormatError(where + ": " + names + " = " + values + " exceeds 2^" + std::to_string(log2_limit) +
                      " elements (" + what + ")");
}

constexpr uint64_t kModelJsonLimit = uint64_t(16) << 20;  // model.json is a few KiB

double get_opt_num(const json& j, const std::string& key, const std::string& where, double dflt) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  if (!it->is_number()) bad(where, key, "must be a number, got " + it->dump());
  return it->get<double>();
}

constexpr EnumName<Arch> kArchNames[] = {
    {Arch::kQwen3Moe, "qwen3_moe"}, {Arch::kOlmoe, "olmoe"}, {Arch::kMixtral, "mixtral"},
    {Arch::kQwen2Moe, "qwen2_moe"}, {Arch::kGlm4Moe, "glm4_moe"}, {Arch::kDeepseekV3, "deepseek_v3"},
    {Arch::kDeepseekV2, "deepseek_v2"}, {Arch::kGptOss, "gpt_oss"}, {Arch::kMinimaxM2, "minimax_m2"}};
constexpr EnumName<QkNorm> kQkNormNames[] = {
    {QkNorm::kNone, "none"}, {QkNorm::kPerHead, "per_head"}, {QkNorm::kFull, "full"}};
constexpr EnumName<RouterScoring> kScoringNames[] = {
    {RouterScoring::kSoftmax, "softmax"}, {RouterScoring::kSigmoid, "sigmoid"}};

// GLM-4.5 / DeepSeek-V3 keys (model_config.h), each optional with the default of other models.
void read_glm_fields(const json& j, const std::string& where, ModelConfig& c) {
  if (j.contains("router_scoring")) {
    const std::string s = get_str(j, "router_scoring", where);
    const std::optional<RouterScoring> r = enum_from_name(kScoringNames, s);
    if (!r) bad(where, "router_scoring", "is '" + s + "', expected " + enum_name_list(kScoringNames));
    c.router_scoring = *r;
  }
  if (j.contains("n_group")) c.n_group = get_int(j, "n_group", where, 1);
  if (j.contains("topk_group")) c.topk_group = get_int(j, "topk_group", where, 1);
  if (c.n_experts % c.n_group != 0)
    bad(where, "n_group", "(" + std::to_string(c.n_group) + ") must divide n_experts (" + std::to_string(c.n_experts) + ")");
  if (c.topk_group > c.n_group)
    bad(where, "topk_group", "(" + std::to_string(c.topk_group) + ") exceeds n_group (" + std::to_string(c.n_group) + ")");
  if (c.n_group > 1 && c.router_scoring == RouterScoring::kSigmoid && c.n_experts / c.n_group < 2)
    bad(where, "n_group", "leaves fewer than 2 experts per group (a group scores its two best)");
  // Softmax scoring with groups is DeepSeek-V2's group_limited_greedy (a group scores its best
  // probability); gpt-oss's router has none (gpt_oss_from_json).
  if (int64_t(c.topk_group) * (c.n_experts / c.n_group) < c.n_experts_per_tok)
    bad(where, "topk_group", "x experts per group is fewer than n_experts_per_tok");
  c.routed_scaling_factor = get_opt_num(j, "routed_scaling_factor", where, 1.0);
  if (!(c.routed_scaling_factor > 0 && std::isfinite(c.routed_scaling_factor)))
    bad(where, "routed_scaling_factor", "must be positive and finite");
  if (j.contains("shared_expert_gated")) c.shared_expert_gated = get_bool(j, "shared_expert_gated", where);
  if (j.contains("first_k_dense_replace")) {
    c.first_k_dense_replace = get_int(j, "first_k_dense_replace", where, 0);
    if (c.first_k_dense_replace >= c.n_layers)
      bad(where, "first_k_dense_replace", "(" + std::to_string(c.first_k_dense_replace) +
                                              ") must leave at least one MoE layer of n_layers (" +
                                              std::to_string(c.n_layers) + ")");
  }
  if (c.first_k_dense_replace > 0) {
    c.intermediate_size = get_int(j, "intermediate_size", where, 1);
    check_elements(where, {{"intermediate_size", c.intermediate_size}, {"hidden_size", c.hidden_size},
                           {"first_k_dense_replace", c.first_k_dense_replace}},
                   44, "the dense MLPs' matrices");
  }
  if (j.contains("rotary_dim")) {
    c.rotary_dim = get_int(j, "rotary_dim", where, 2);
    if (c.rotary_dim > c.head_dim || c.rotary_dim % 2 != 0)
      bad(where, "rotary_dim", "(" + std::to_string(c.rotary_dim) + ") must be even and at most head_dim (" +
                                   std::to_string(c.head_dim) + ")");
  }
}

Arch parse_arch(const std::string& s, const std::string& where) {
  if (auto a = enum_from_name(kArchNames, s)) return *a;
  throw ConfigError(where + ": field 'architecture' is '" + s + "', expected " + enum_name_list(kArchNames));
}

// DeepSeek-V2/V3's MLA sizes: required for deepseek_v3/_v2, refused elsewhere (a pack that names
// them for another architecture was not written by us).
void read_mla(const json& j, const std::string& where, ModelConfig& c) {
  const bool mla = c.arch == Arch::kDeepseekV3 || c.arch == Arch::kDeepseekV2;
  auto it = j.find("mla");
  if (!mla) {
    if (it != j.end()) bad(where, "mla", "is only valid for architectures deepseek_v3 and deepseek_v2");
    return;
  }
  const json& m = get_obj(j, "mla", where);
  const std::string w = where + " mla";
  c.q_lora_rank = get_int(m, "q_lora_rank", w, 0);
  c.kv_lora_rank = get_int(m, "kv_lora_rank", w, 1);
  c.qk_nope_head_dim = get_int(m, "qk_nope_head_dim", w, 1);
  c.qk_rope_head_dim = get_int(m, "qk_rope_head_dim", w, 2);
  c.v_head_dim = get_int(m, "v_head_dim", w, 1);
  // Bounded so their sums (below and in every buffer size) stay far from int's range.
  for (const auto& [key, v] : {std::pair{"mla.q_lora_rank", c.q_lora_rank}, {"mla.kv_lora_rank", c.kv_lora_rank},
                               {"mla.qk_nope_head_dim", c.qk_nope_head_dim}, {"mla.qk_rope_head_dim", c.qk_rope_head_dim},
                               {"mla.v_head_dim", c.v_head_dim}})
    if (v > (1 << 20)) bad(where, key, "is " + std::to_string(v) + ", over 2^20");
  if (c.qk_rope_head_dim % 2 != 0) bad(where, "mla.qk_rope_head_dim", "must be even (RoPE rotates pairs)");
  if (c.head_dim != c.qk_nope_head_dim + c.qk_rope_head_dim)
    bad(where, "head_dim", "(" + std::to_string(c.head_dim) + ") must be mla.qk_nope_head_dim + mla.qk_rope_head_dim (" +
                               std::to_string(c.qk_nope_head_dim + c.qk_rope_head_dim) + ")");
  if (c.n_kv_heads != c.n_heads) bad(where, "n_kv_heads", "must equal n_heads for MLA");
  check_elements(where, {{"n_heads", c.n_heads}, {"qk_nope_head_dim + v_head_dim", c.qk_nope_head_dim + c.v_head_dim},
                         {"kv_lora_rank", c.kv_lora_rank}}, 40, "wkv_b");
  check_elements(where, {{"kv_lora_rank + qk_rope_head_dim", c.kv_lora_rank + c.qk_rope_head_dim},
                         {"hidden_size", c.hidden_size}}, 40, "wkv_a");
  check_elements(where, {{"n_layers", c.n_layers}, {"kv_lora_rank + qk_rope_head_dim", c.kv_lora_rank + c.qk_rope_head_dim}},
                 34, "the latent KV cache of one position");
  check_elements(where, {{"n_heads", c.n_heads}, {"head_dim", c.head_dim},
                         {"q_lora_rank", std::max(c.q_lora_rank, 1)}}, 40, "wq_b");
  check_elements(where, {{"q_lora_rank", std::max(c.q_lora_rank, 1)}, {"hidden_size", c.hidden_size}}, 40, "wq_a");
  check_elements(where, {{"n_heads", c.n_heads}, {"v_head_dim", c.v_head_dim}, {"hidden_size", c.hidden_size}}, 40,
                 "wo");
}

// gpt-oss's keys (model_config.h), written only when set so other models' model.json stay as they were.
void gpt_oss_to_json(const ModelConfig& c, json& j) {
  if (c.attention_sinks) j["attention_sinks"] = true;
  if (c.o_bias) j["o_bias"] = true;
  if (c.sliding_window > 0) {
    j["sliding_window"] = c.sliding_window;
    json lt = json::array();
    for (bool s : c.sliding_layers) lt.push_back(s ? "sliding_attention" : "full_attention");
    j["layer_types"] = lt;
  }
  if (c.router_bias) j["router_bias"] = true;
  if (c.router_softmax_topk) j["router_softmax_topk"] = true;
  if (c.swiglu_limit > 0) j["swiglu"] = {{"limit", c.swiglu_limit}, {"alpha", c.swiglu_alpha}};
}

void gpt_oss_from_json(const json& j, const std::string& where, ModelConfig& c) {
  const auto opt_bool = [&](const char* key, bool& dst) {
    if (j.contains(key)) dst = get_bool(j, key, where);
  };
  opt_bool("attention_sinks", c.attention_sinks);
  opt_bool("o_bias", c.o_bias);
  opt_bool("router_bias", c.router_bias);
  opt_bool("router_softmax_topk", c.router_softmax_topk);
  if (j.contains("sliding_window")) c.sliding_window = get_int(j, "sliding_window", where, 0);
  if (auto lt = j.find("layer_types"); lt != j.end() && !lt->is_null()) {
    if (!lt->is_array() || lt->size() != size_t(c.n_layers))
      bad(where, "layer_types", "must be an array of n_layers (" + std::to_string(c.n_layers) +
                                    ") \"sliding_attention\" / \"full_attention\" strings");
    for (const json& t : *lt) {
      if (t != "sliding_attention" && t != "full_attention")
        bad(where, "layer_types", "holds " + t.dump() + ", expected \"sliding_attention\" or \"full_attention\"");
      c.sliding_layers.push_back(t == "sliding_attention");
    }
  }
  if (c.sliding_window > 0 && c.sliding_layers.empty())
    bad(where, "layer_types", "is missing: sliding_window needs to know which layers slide");
  if (auto sw = j.find("swiglu"); sw != j.end() && !sw->is_null()) {
    if (!sw->is_object()) bad(where, "swiglu", "must be an object {limit, alpha}");
    c.swiglu_limit = get_num(*sw, "limit", where + " swiglu");
    c.swiglu_alpha = get_num(*sw, "alpha", where + " swiglu");
    if (!(c.swiglu_limit > 0 && std::isfinite(c.swiglu_limit))) bad(where, "swiglu.limit", "must be positive and finite");
    if (!std::isfinite(c.swiglu_alpha)) bad(where, "swiglu.alpha", "must be finite");
  }
  // Both read layers.N.router_bias, with different meanings (a logit bias; a selection-only bias).
  if ((c.router_bias || c.router_softmax_topk) && c.router_scoring != RouterScoring::kSoftmax)
    bad(where, c.router_bias ? "router_bias" : "router_softmax_topk", "cannot be combined with router_scoring \"sigmoid\"");
  if (c.router_softmax_topk && c.n_group > 1)
    bad(where, "n_group", "is " + std::to_string(c.n_group) + ": router_softmax_topk has no groups");
}

}  // namespace

std::string_view arch_name(Arch a) { return enum_name(kArchNames, a, "unknown"); }

void require_model_location(const std::filesystem::path& model) {
  const ModelPathProbe p = probe_model_path(model);  // IoError naming an unreadable path's errno
  if (p.kind == ModelPathKind::kMissing) throw IoError("model " + model.string() + " does not exist");
  if (p.kind == ModelPathKind::kOther)
    throw IoError("model " + model.string() + " is " + p.what + ": neither a packed model directory nor a GGUF file");
}

ExpertLayout ModelConfig::expert_layout(int layer) const {
  MOE_ASSERT(layer >= 0 && layer < n_moe_layers(), "MoE layer out of range");
  ExpertTypes t = layer_expert_types.empty() ? ExpertTypes::uniform(expert_quant)
                                             : layer_expert_types[size_t(layer)];
  t.bias = expert_bias;
  return ExpertLayout::make(t, size_t(hidden_size), size_t(moe_intermediate_size));
}

size_t ModelConfig::max_expert_bytes() const {
  size_t m = 0;
  for (int l = 0; l < n_moe_layers(); ++l) m = std::max(m, expert_layout(l).bytes);
  return m;
}

ModelConfig make_model_config(Arch arch, const ModelSizes& s, QkNorm qk_norm, QuantType expert_quant) {
  ModelConfig c;
  c.arch = arch;
  c.vocab_size = s.vocab;
  c.hidden_size = s.hidden;
  c.n_layers = s.layers;
  c.n_heads = s.heads;
  c.n_kv_heads = s.kv_heads;
  c.head_dim = s.head_dim;
  c.moe_intermediate_size = s.expert_width;
  c.n_experts = s.experts;
  c.n_experts_per_tok = s.top_k;
  c.max_position_embeddings = s.max_positions;
  c.qk_norm = qk_norm;
  c.expert_quant = expert_quant;
  return c;
}

bool ModelConfig::needs_typed_format() const {
  return dense_dtype == "gguf" || !layer_expert_types.empty() || !is_pack_quant(expert_quant) || expert_bias;
}

nlohmann::json ModelConfig::to_json() const {
  json j = {{"format", "moestream"},
            {"format_version", needs_typed_format() ? kFormatVersionTyped : kFormatVersion},
            {"architecture", std::string(arch_name(arch))},
            {"vocab_size", vocab_size},
            {"hidden_size", hidden_size},
            {"n_layers", n_layers},
            {"n_heads", n_heads},
            {"n_kv_heads", n_kv_heads},
            {"head_dim", head_dim},
            {"moe_intermediate_size", moe_intermediate_size},
            {"n_experts", n_experts},
            {"n_experts_per_tok", n_experts_per_tok},
            {"norm_topk_prob", norm_topk_prob},
            {"rms_norm_eps", rms_norm_eps},
            {"max_position_embeddings", max_position_embeddings},
            {"qk_norm", std::string(enum_name(kQkNormNames, qk_norm, "none"))}};
  json rope;
  rope["theta"] = rope_theta;
  if (rope_scaling) {
    const RopeScaling& s = *rope_scaling;
    json js{{"type", s.type}, {"factor", s.factor}};
    if (s.original_max_position_embeddings > 0)
      js["original_max_position_embeddings"] = s.original_max_position_embeddings;
    if (s.type == "yarn") {
      js["beta_fast"] = s.beta_fast;
      js["beta_slow"] = s.beta_slow;
      if (s.mscale != 0) js["mscale"] = s.mscale;  // DeepSeek's: written only when set
      if (s.mscale_all_dim != 0) js["mscale_all_dim"] = s.mscale_all_dim;
      if (!s.truncate) js["truncate"] = false;
    }
    if (s.type == "llama3") {
      js["low_freq_factor"] = s.low_freq_factor;
      js["high_freq_factor"] = s.high_freq_factor;
    }
    rope["scaling"] = js;
  } else {
    rope["scaling"] = nullptr;
  }
  j["rope"] = rope;
  j["tie_word_embeddings"] = tie_word_embeddings;
  // Written only when used: the model.json of every other model stays as it was.
  if (qkv_bias) j["qkv_bias"] = true;
  if (shared_expert_intermediate_size > 0) j["shared_expert_intermediate_size"] = shared_expert_intermediate_size;
  gpt_oss_to_json(*this, j);
  // GLM-4.5 / DeepSeek-V3: written only when they differ from the defaults.
  if (router_scoring != RouterScoring::kSoftmax) {
    j["router_scoring"] = std::string(enum_name(kScoringNames, router_scoring, "softmax"));
    j["n_group"] = n_group;
    j["topk_group"] = topk_group;
  }
  if (router_scoring == RouterScoring::kSoftmax && n_group > 1) {  // DeepSeek-V2's group_limited_greedy
    j["n_group"] = n_group;
    j["topk_group"] = topk_group;
  }
  if (routed_scaling_factor != 1.0) j["routed_scaling_factor"] = routed_scaling_factor;
  if (shared_expert_intermediate_size > 0 && !shared_expert_gated) j["shared_expert_gated"] = false;
  if (first_k_dense_replace > 0) {
    j["first_k_dense_replace"] = first_k_dense_replace;
    j["intermediate_size"] = intermediate_size;
  }
  if (rotary_dim > 0 && rotary_dim != head_dim) j["rotary_dim"] = rotary_dim;
  if (has_mla())  // DeepSeek-V3
    j["mla"] = {{"q_lora_rank", q_lora_rank}, {"kv_lora_rank", kv_lora_rank}, {"qk_nope_head_dim", qk_nope_head_dim},
                {"qk_rope_head_dim", qk_rope_head_dim}, {"v_head_dim", v_head_dim}};
  j["dense"] = {{"file", dense_file}, {"dtype", dense_dtype}};
  if (!dense_xxh3.empty()) j["dense"]["xxh3"] = dense_xxh3;
  j["experts"] = {{"dir", experts_dir}, {"quant", std::string(quant_name(expert_quant))}};
  if (expert_bias) j["experts"]["bias"] = true;
  if (!layer_expert_types.empty()) {
    json types = json::array();
    for (const ExpertTypes& t : layer_expert_types)
      types.push_back({std::string(quant_name(t.gate)), std::string(quant_name(t.up)), std::string(quant_name(t.down))});
    j["experts"]["layer_types"] = types;
  }
  j["tokenizer"] = {
      {"file", tokenizer_file.empty() ? json(nullptr) : json(tokenizer_file)},
      {"config", tokenizer_config_file.empty() ? json(nullptr) : json(tokenizer_config_file)}};
  j["bos_token_id"] = bos_token_id ? json(*bos_token_id) : json(nullptr);
  j["eos_token_id"] = eos_token_id ? json(*eos_token_id) : json(nullptr);
  return j;
}

ModelConfig ModelConfig::from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) throw FormatError(where + ": expected a JSON object at top level");
  if (get_str(j, "format", where) != "moestream") bad(where, "format", "must be \"moestream\"");
  int version = get_int(j, "format_version", where, 0);
  if (version != kFormatVersion && version != kFormatVersionTyped)
    bad(where, "format_version", "is " + std::to_string(version) + ", this build reads " +
                                     std::to_string(kFormatVersion) + " and " + std::to_string(kFormatVersionTyped));
  const bool typed = version == kFormatVersionTyped;
  ModelConfig c;
  c.arch = parse_arch(get_str(j, "architecture", where), where);
  c.vocab_size = get_int(j, "vocab_size", where, 1);
  c.hidden_size = get_int(j, "hidden_size", where, 1);
  c.n_layers = get_int(j, "n_layers", where, 1);
  c.n_heads = get_int(j, "n_heads", where, 1);
  c.n_kv_heads = get_int(j, "n_kv_heads", where, 1);
  c.head_dim = get_int(j, "head_dim", where, 1);
  c.moe_intermediate_size = get_int(j, "moe_intermediate_size", where, 1);
  c.n_experts = get_int(j, "n_experts", where, 1);
  c.n_experts_per_tok = get_int(j, "n_experts_per_tok", where, 1);
  c.norm_topk_prob = get_bool(j, "norm_topk_prob", where);
  c.rms_norm_eps = get_num(j, "rms_norm_eps", where);
  c.max_position_embeddings = get_int(j, "max_position_embeddings", where, 1);
  if (c.n_heads % c.n_kv_heads != 0)
    bad(where, "n_kv_heads", "(" + std::to_string(c.n_kv_heads) + ") must divide n_heads (" +
                                 std::to_string(c.n_heads) + ")");
  if (c.n_experts_per_tok > c.n_experts)
    bad(where, "n_experts_per_tok", "(" + std::to_string(c.n_experts_per_tok) +
                                        ") exceeds n_experts (" + std::to_string(c.n_experts) + ")");
  if (!(c.rms_norm_eps > 0 && std::isfinite(c.rms_norm_eps))) bad(where, "rms_norm_eps", "must be positive and finite");
  check_elements(where, {{"vocab_size", c.vocab_size}, {"hidden_size", c.hidden_size}}, 40, "the embedding");
  check_elements(where, {{"n_heads", c.n_heads}, {"head_dim", c.head_dim}, {"hidden_size", c.hidden_size}}, 40,
                 "the query projection");
  check_elements(where, {{"n_experts", c.n_experts}, {"hidden_size", c.hidden_size}}, 40, "a router");
  check_elements(where, {{"moe_intermediate_size", c.moe_intermediate_size}, {"hidden_size", c.hidden_size}}, 40,
                 "one expert matrix");
  check_elements(where, {{"n_layers", c.n_layers}, {"n_experts", c.n_experts},
                         {"moe_intermediate_size", c.moe_intermediate_size}, {"hidden_size", c.hidden_size}},
                 50, "all experts' matrices");
  check_elements(where, {{"n_layers", c.n_layers}, {"n_kv_heads", c.n_kv_heads}, {"head_dim", c.head_dim}}, 34,
                 "the KV cache of one position");

  const std::string qk = get_str(j, "qk_norm", where);
  const std::optional<QkNorm> qk_norm = enum_from_name(kQkNormNames, qk);
  if (!qk_norm) bad(where, "qk_norm", "is '" + qk + "', expected " + enum_name_list(kQkNormNames));
  c.qk_norm = *qk_norm;

  const json& rope = get_obj(j, "rope", where);
  c.rope_theta = get_num(rope, "theta", where + " rope");
  if (!(c.rope_theta > 0 && std::isfinite(c.rope_theta))) bad(where, "rope.theta", "must be positive and finite");
  const json& sc = need(rope, "scaling", where + " rope");
  if (!sc.is_null()) {
    if (!sc.is_object()) bad(where, "rope.scaling", "must be an object or null");
    std::string w = where + " rope.scaling";
    RopeScaling s;
    s.type = get_str(sc, "type", w);
    if (s.type != "linear" && s.type != "dynamic" && s.type != "yarn" && s.type != "llama3")
      bad(where, "rope.scaling.type", "is '" + s.type + "', expected linear, dynamic, yarn or llama3");
    s.factor = get_num(sc, "factor", w);
    if (!(s.factor > 0 && std::isfinite(s.factor))) bad(where, "rope.scaling.factor", "must be positive and finite");
    s.original_max_position_embeddings = get_opt_num(sc, "original_max_position_embeddings", w, 0);
    s.beta_fast = get_opt_num(sc, "beta_fast", w, 32);
    s.beta_slow = get_opt_num(sc, "beta_slow", w, 1);
    s.low_freq_factor = get_opt_num(sc, "low_freq_factor", w, 1);
    s.high_freq_factor = get_opt_num(sc, "high_freq_factor", w, 4);
    s.mscale = get_opt_num(sc, "mscale", w, 0);
    s.mscale_all_dim = get_opt_num(sc, "mscale_all_dim", w, 0);
    if (!(std::isfinite(s.mscale) && std::isfinite(s.mscale_all_dim) && s.mscale >= 0 && s.mscale_all_dim >= 0))
      bad(where, "rope.scaling.mscale", "and mscale_all_dim must be finite and >= 0");
    if (sc.contains("truncate")) s.truncate = get_bool(sc, "truncate", w);
    c.rope_scaling = s;
  }
  c.tie_word_embeddings = get_bool(j, "tie_word_embeddings", where);
  if (j.contains("qkv_bias")) c.qkv_bias = get_bool(j, "qkv_bias", where);
  if (j.contains("shared_expert_intermediate_size")) {
    c.shared_expert_intermediate_size = get_int(j, "shared_expert_intermediate_size", where, 0);
    check_elements(where, {{"shared_expert_intermediate_size", c.shared_expert_intermediate_size},
                           {"hidden_size", c.hidden_size}, {"n_layers", c.n_layers}},
                   44, "the shared experts' matrices");
  }
  read_glm_fields(j, where, c);

  read_mla(j, where, c);
  gpt_oss_from_json(j, where, c);
  // MLA's attention (mla_attention.h) has no sinks, output bias or window.
  if (c.has_mla() && (c.attention_sinks || c.o_bias || c.sliding_window > 0))
    bad(where, "mla", "cannot be combined with attention_sinks, o_bias or sliding_window (gpt-oss attention)");

  const json& dense = get_obj(j, "dense", where);
  c.dense_file = check_model_path(get_str(dense, "file", where + " dense"), where, "dense.file");
  c.dense_dtype = get_str(dense, "dtype", where + " dense");
  if (c.dense_dtype != "f32" && c.dense_dtype != "bf16" && !(typed && c.dense_dtype == "gguf"))
    bad(where, "dense.dtype", "is '" + c.dense_dtype + "', expected f32 or bf16" +
                                  std::string(typed ? " or gguf" : " (gguf needs format_version 2)"));
  if (dense.contains("xxh3")) {
    c.dense_xxh3 = get_str(dense, "xxh3", where + " dense");
    if (c.dense_xxh3.size() != 16 || c.dense_xxh3.find_first_not_of("0123456789abcdef") != std::string::npos)
      bad(where, "dense.xxh3", "is '" + c.dense_xxh3 + "', expected 16 lowercase hex digits");
  }
  if (c.dense_dtype == "gguf" && parse_gguf_split_name(c.dense_file))
    bad(where, "dense.file", "is '" + c.dense_file + "': a pack's dense.gguf is one file, not a split set");
  const json& experts = get_obj(j, "experts", where);
  c.experts_dir = check_model_path(get_str(experts, "dir", where + " experts"), where, "experts.dir");
  if (experts.contains("bias")) {
    c.expert_bias = get_bool(experts, "bias", where + " experts");
    if (c.expert_bias && !typed) bad(where, "experts.bias", "needs format_version 2");
  }
  std::string q = get_str(experts, "quant", where + " experts");
  try {
    c.expert_quant = typed ? parse_stored_quant(q) : parse_quant(q);
  } catch (const ConfigError& e) {
    bad(where, "experts.quant", e.what());
  }
  if (auto lt = experts.find("layer_types"); lt != experts.end()) {
    if (!typed) bad(where, "experts.layer_types", "needs format_version 2");
    if (!lt->is_array() || lt->size() != size_t(c.n_moe_layers()))
      bad(where, "experts.layer_types", "must be an array of one [gate, up, down] type triple per MoE layer (" +
                                            std::to_string(c.n_moe_layers()) + ")");
    for (size_t l = 0; l < lt->size(); ++l) {
      const json& e = (*lt)[l];
      const std::string key = "experts.layer_types[" + std::to_string(l) + "]";
      if (!e.is_array() || e.size() != 3 || !e[0].is_string() || !e[1].is_string() || !e[2].is_string())
        bad(where, key, "must be three type names [gate, up, down], got " + e.dump());
      try {
        c.layer_expert_types.push_back({parse_stored_quant(e[0].get<std::string>()),
                                        parse_stored_quant(e[1].get<std::string>()),
                                        parse_stored_quant(e[2].get<std::string>())});
      } catch (const ConfigError& err) {
        bad(where, key, err.what());
      }
    }
    if (c.layer_expert_types.front().gate != c.expert_quant)
      bad(where, "experts.quant", "is '" + q + "' but experts.layer_types[0] starts with '" +
                                      std::string(quant_name(c.layer_expert_types.front().gate)) + "'");
  }
  // Every layer's matrices must be whole blocks of their types (ggml types have blocks of up to 256).
  for (int l = 0; l < c.n_moe_layers(); ++l) {
    try {
      (void)c.expert_layout(l);
    } catch (const ConfigError& err) {
      bad(where, c.layer_expert_types.empty() ? "experts.quant" : "experts.layer_types[" + std::to_string(l) + "]",
          std::string("does not fit hidden_size and moe_intermediate_size: ") + err.what());
    }
    if (c.layer_expert_types.empty()) break;  // one type for all layers: one check
  }
  auto tok = j.find("tokenizer");
  if (tok != j.end() && !tok->is_null()) {
    if (!tok->is_object()) bad(where, "tokenizer", "must be an object or null");
    c.tokenizer_file = get_opt_str(*tok, "file", where + " tokenizer");
    c.tokenizer_config_file = get_opt_str(*tok, "config", where + " tokenizer");
    if (!c.tokenizer_file.empty()) check_model_path(c.tokenizer_file, where, "tokenizer.file");
    if (!c.tokenizer_config_file.empty()) check_model_path(c.tokenizer_config_file, where, "tokenizer.config");
  }
  c.bos_token_id = get_opt_token_id(j, "bos_token_id", where, c.vocab_size);
  c.eos_token_id = get_opt_token_id(j, "eos_token_id", where, c.vocab_size);
  return c;
}

std::filesystem::path check_model_file(const std::filesystem::path& model_dir, const std::filesystem::path& rel,
                                       const std::string& what, bool directory) {
  namespace fs = std::filesystem;
  const fs::path path = model_dir / rel;
  std::error_code ec;
  const fs::path base = fs::weakly_canonical(model_dir, ec);
  fs::path real;
  if (!ec) real = fs::weakly_canonical(path, ec);
  if (ec) throw IoError(what + ": cannot resolve " + path.string() + ": " + ec.message());
  if (std::mismatch(base.begin(), base.end(), real.begin(), real.end()).first != base.end())
    throw FormatError(what + ": " + path.string() + " leads to " + real.string() +
                      ", outside the model directory (through a symbolic link)");
  const fs::file_status st = fs::status(path, ec);  // stat, never open: a FIFO would block
  if (ec || st.type() == fs::file_type::not_found) return path;
  if (directory ? st.type() != fs::file_type::directory : st.type() != fs::file_type::regular)
    throw FormatError(what + ": " + path.string() + " is not a " + (directory ? "directory" : "regular file") +
                      " (a FIFO, socket or device cannot be read as part of a model)");
  return path;
}

ModelConfig ModelConfig::load(const std::filesystem::path& dir) {
  if (is_gguf_file(dir)) return GgufModel(dir).config();
  std::filesystem::path p = dir / "model.json";
  check_model_file(dir, "model.json", p.string());
  std::string text = read_file(p, kModelJsonLimit);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw FormatError(p.string() + ": invalid JSON: " + e.what());
  }
  ModelConfig c = from_json(j, p.string());
  const auto field = [&](const char* key) { return p.string() + ": field '" + key + "'"; };
  check_model_file(dir, c.dense_file, field("dense.file"));
  check_model_file(dir, c.experts_dir, field("experts.dir"), /*directory=*/true);
  if (!c.tokenizer_file.empty()) check_model_file(dir, c.tokenizer_file, field("tokenizer.file"));
  if (!c.tokenizer_config_file.empty()) check_model_file(dir, c.tokenizer_config_file, field("tokenizer.config"));
  return c;
}

void ModelConfig::save(const std::filesystem::path& dir) const {
  if (format == ModelFormat::kGguf)
    throw ConfigError("a GGUF model has no model.json: convert it with convert_model to get a pack");
  write_file_atomic(dir / "model.json", to_json().dump(2) + "\n");
}

}  // namespace moestream
