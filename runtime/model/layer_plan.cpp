// Implementation of runtime/model/layer_plan.h: the block builders and the family registry.
#include "runtime/model/layer_plan.h"

#include <string>

#include "common/error.h"
#include "runtime/model/families/families.h"

namespace moestream {

AttentionSpec gqa_block(const ModelConfig& cfg, int layer) {
  AttentionSpec a;
  a.kind = AttentionKind::kGqa;
  a.qk_norm = cfg.qk_norm;
  a.window = cfg.window_of(layer);
  a.sinks = cfg.attention_sinks;
  a.qkv_bias = cfg.qkv_bias;
  a.o_bias = cfg.o_bias;
  return a;
}

AttentionSpec mla_block(const ModelConfig&) {
  AttentionSpec a;
  a.kind = AttentionKind::kMla;
  return a;
}

FfnSpec dense_mlp_block() {
  FfnSpec f;
  f.kind = FfnKind::kDense;
  return f;
}

FfnSpec routed_experts_block(const ModelConfig& cfg, int layer) {
  FfnSpec f;
  f.kind = FfnKind::kRouted;
  f.moe_layer = cfg.moe_layer_index(layer);
  f.router.params = RouterParams::of(cfg);
  f.router.logit_bias = cfg.router_bias;
  f.router.softmax_of_top_k = cfg.router_softmax_topk;
  if (cfg.has_shared_expert())
    f.shared = cfg.shared_expert_gated ? SharedExpertKind::kGated : SharedExpertKind::kUngated;
  return f;
}

namespace {

const FamilyDescription& family_of(Arch arch) {
  for (const FamilyDescription* f : families::all())
    if (f->arch == arch) return *f;
  throw ConfigError("architecture '" + std::string(arch_name(arch)) + "' has no family description");
}

// The description must account for what the config holds: an expert layer where the config has
// experts, MLA exactly where the config has its fields.
void check_layer(const ModelConfig& cfg, const FamilyDescription& f, int l, const LayerSpec& s) {
  const std::string where = "model.json: architecture " + std::string(f.name) + ", layer " + std::to_string(l);
  if ((s.ffn.kind == FfnKind::kRouted) != cfg.is_moe_layer(l))
    throw ConfigError(where + (cfg.is_moe_layer(l) ? ": the family's layer has no experts"
                                                  : ": first_k_dense_replace " +
                                                        std::to_string(cfg.first_k_dense_replace) +
                                                        " makes it dense, which this family's layers never are"));
  if ((s.attention.kind == AttentionKind::kMla) != cfg.has_mla())
    throw ConfigError(where + (cfg.has_mla() ? ": mla fields given to a family without latent attention"
                                             : ": latent attention needs the mla fields"));
}

}  // namespace

std::vector<LayerSpec> plan_layers(const ModelConfig& cfg) {
  const FamilyDescription& f = family_of(cfg.arch);
  std::vector<LayerSpec> layers;
  layers.reserve(size_t(cfg.n_layers));
  for (int l = 0; l < cfg.n_layers; ++l) {
    layers.push_back(f.layer(cfg, l));
    check_layer(cfg, f, l, layers.back());
  }
  return layers;
}

bool any_attention(const std::vector<LayerSpec>& layers, AttentionKind kind) {
  for (const LayerSpec& s : layers)
    if (s.attention.kind == kind) return true;
  return false;
}

bool any_ffn(const std::vector<LayerSpec>& layers, FfnKind kind) {
  for (const LayerSpec& s : layers)
    if (s.ffn.kind == kind) return true;
  return false;
}

}  // namespace moestream
