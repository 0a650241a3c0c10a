#include "tests/support/test_model.h"

#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <random>

#include "common/file_util.h"
#include "loader/format/expert_file.h"
#include "loader/format/expert_file_writer.h"
#include "loader/format/expert_map.h"

namespace fs = std::filesystem;

namespace moestream::test {

ModelConfig tiny_moe_config(const TinyShape& s) {
  // TinyShape lists ModelSizes' fields in the same order, with a tiny model's defaults.
  return make_model_config(Arch::kQwen3Moe,
                           {s.vocab, s.hidden, s.layers, s.heads, s.kv_heads, s.head_dim, s.intermediate,
                            s.experts, s.top_k, s.max_positions},
                           QkNorm::kPerHead, s.quant);
}

void as_qwen2_moe(ModelConfig& c, int shared) {
  c.arch = Arch::kQwen2Moe;
  c.qk_norm = QkNorm::kNone;
  c.qkv_bias = true;
  c.shared_expert_intermediate_size = shared;
}

void grouped_sigmoid_with_dense_first_layer(ModelConfig& c, int shared, int dense_intermediate) {
  c.router_scoring = RouterScoring::kSigmoid;
  c.n_group = 4;
  c.topk_group = 2;
  c.routed_scaling_factor = 2.5;
  c.shared_expert_intermediate_size = shared;
  c.shared_expert_gated = false;
  c.first_k_dense_replace = 1;
  c.intermediate_size = dense_intermediate;
}

void as_glm4_moe(ModelConfig& c, const GlmShape& s) {
  c.arch = Arch::kGlm4Moe;
  c.qkv_bias = true;
  grouped_sigmoid_with_dense_first_layer(c, s.shared, s.dense_intermediate);
  c.rotary_dim = s.rotary_dim;
}

void as_minimax_m2(ModelConfig& c, int rotary_dim) {
  c.arch = Arch::kMinimaxM2;
  c.qk_norm = QkNorm::kFull;
  c.rotary_dim = rotary_dim;
  c.router_scoring = RouterScoring::kSigmoid;
  c.n_group = c.topk_group = 1;
  c.routed_scaling_factor = 1.0;
  c.norm_topk_prob = true;
}

void as_deepseek_v3(ModelConfig& c, const MlaShape& s) {
  c.arch = Arch::kDeepseekV3;
  c.qk_norm = QkNorm::kNone;
  c.n_kv_heads = c.n_heads;
  c.q_lora_rank = s.q_lora;
  c.kv_lora_rank = s.kv_lora;
  c.qk_nope_head_dim = s.nope;
  c.qk_rope_head_dim = s.rope;
  c.v_head_dim = s.v;
  c.rope_scaling = RopeScaling{.type = "yarn", .factor = 4, .original_max_position_embeddings = 32,
                               .mscale = 1, .mscale_all_dim = 1};
  grouped_sigmoid_with_dense_first_layer(c, s.shared, s.dense_intermediate);
}

ModelConfig grouped_q8_config() {
  return tiny_moe_config({.hidden = 128, .layers = 3, .head_dim = 32, .intermediate = 256,
                          .experts = 16, .top_k = 4, .max_positions = 256});
}

uint64_t expert_slot_bytes(const ModelConfig& cfg) {
  const uint64_t expert = ExpertLayout::make(cfg.expert_quant, size_t(cfg.hidden_size),
                                             size_t(cfg.moe_intermediate_size)).bytes;
  return (expert + 4095) / 4096 * 4096;
}

Payloads write_layer_files(const fs::path& dir, const ModelConfig& cfg, uint32_t seed, bool permute) {
  fs::create_directories(expert_file_path(dir, 0).parent_path());
  std::mt19937 rng(seed);
  Payloads all(size_t(cfg.n_layers));
  for (int l = 0; l < cfg.n_layers; ++l) {
    std::vector<uint32_t> perm(size_t(cfg.n_experts));
    std::iota(perm.begin(), perm.end(), 0u);
    if (permute) std::shuffle(perm.begin(), perm.end(), rng);
    ExpertFileWriter w(expert_file_path(dir, l), cfg.expert_quant, l, cfg.n_experts, cfg.hidden_size,
                       cfg.moe_intermediate_size);
    for (int e = 0; e < cfg.n_experts; ++e) {
      std::vector<uint8_t> p(w.layout().bytes);
      for (auto& b : p) b = static_cast<uint8_t>(rng());
      w.write_expert(perm[size_t(e)], p.data());
      all[size_t(l)].push_back(std::move(p));
    }
    w.finish();
    if (permute) write_bound_map(dir, l, ExpertMap::from_slots(perm));
  }
  cfg.save(dir);
  return all;
}

void write_bound_map(const fs::path& dir, int layer, const ExpertMap& map) {
  const ExpertFileHeader h = read_expert_header(expert_file_path(dir, layer));
  write_expert_map(expert_map_path(dir, layer), map.bound_to(slot_table_hash(h.slot_checksums)));
}

void overwrite_bytes(const fs::path& file, uint64_t offset, std::string_view bytes) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  if (!f) throw_errno("open for patching", file);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw_errno("patch", file);
}

bool have_tool(const std::string& tool) { return fs::exists(fs::path(MOESTREAM_BIN_DIR) / tool); }

CliResult run_tool(const std::string& tool, const std::string& args, bool with_stderr) {
  const std::string cmd = (fs::path(MOESTREAM_BIN_DIR) / tool).string() + " " + args +
                          (with_stderr ? " 2>&1" : " 2>/dev/null");
  CliResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

}  // namespace moestream::test
