// A model as a list of layers, each a composition of block kinds: an attention kind (GQA with its
// options, or MLA), an FFN kind (a dense SwiGLU MLP, or routed experts with a router kind and an
// optional shared expert). Both passes build their layers from this list, never from flags
// tested inside a fixed sequence: a new family is a description file in runtime/model/families/
// (which block kinds each layer takes, from its config) plus any new block kinds.
//
// Norms are RMSNorm before each block with the residual added after it, for every family here.
#pragma once

#include <string_view>
#include <vector>

#include "loader/format/model_config.h"
#include "runtime/model/routing.h"

namespace moestream {

enum class AttentionKind {
  kGqa,  // grouped-query attention: the KV cache holds every head group's keys and values
  kMla,  // multi-head latent attention (DeepSeek-V2/V3): the cache holds one latent per position
};

struct AttentionSpec {
  AttentionKind kind = AttentionKind::kGqa;
  QkNorm qk_norm = QkNorm::kNone;  // GQA: RMSNorm of q and k per head or over all heads
  int window = 0;                  // GQA: keys a query sees, itself included (0: every earlier one)
  bool sinks = false;              // GQA: a learned logit per head joins each softmax (gpt-oss)
  bool qkv_bias = false;           // GQA: q, k and v projections add a bias
  bool o_bias = false;             // GQA: the output projection adds a bias
};

enum class FfnKind {
  kDense,   // a SwiGLU MLP every token runs (intermediate_size wide)
  kRouted,  // experts from the ExpertStore, chosen per token by the router
};

enum class SharedExpertKind {
  kNone,
  kGated,    // added times sigmoid(shared_expert_gate . x) (Qwen2-MoE)
  kUngated,  // added as is (GLM-4.5, DeepSeek)
};

struct RouterSpec {
  RouterParams params;            // scoring (softmax / grouped sigmoid), groups, k, scaling
  bool logit_bias = false;        // a bias joins the logits before selection (gpt-oss)
  bool softmax_of_top_k = false;  // weights: softmax over the k selected logits (gpt-oss)
};

struct FfnSpec {
  FfnKind kind = FfnKind::kRouted;
  int moe_layer = -1;  // kRouted: the MoE layer index experts, maps, caches and logs use
  RouterSpec router;   // kRouted only
  SharedExpertKind shared = SharedExpertKind::kNone;
};

struct LayerSpec {
  AttentionSpec attention;
  FfnSpec ffn;
};

// What a family's description file provides (runtime/model/families/).
struct FamilyDescription {
  Arch arch;
  std::string_view name;  // model.json's architecture
  // Layer `layer` of a model of this family, from its config (loaded and checked by ModelConfig).
  LayerSpec (*layer)(const ModelConfig& cfg, int layer);
};

// The layers of cfg's model, as its family's description builds them. Throws ConfigError for an
// architecture without one, or a config the family's layers do not account for (dense layers
// in a family that has none, MLA fields outside DeepSeek's).
std::vector<LayerSpec> plan_layers(const ModelConfig& cfg);

// The pieces description files compose (layer_plan.cpp): each honours every config field of its
// block, so a family chooses kinds and never drops a field the converter wrote.
AttentionSpec gqa_block(const ModelConfig& cfg, int layer);  // window, sinks, biases, QK-norm
AttentionSpec mla_block(const ModelConfig& cfg);
FfnSpec dense_mlp_block();
FfnSpec routed_experts_block(const ModelConfig& cfg, int layer);  // router and shared expert

// Whether any layer takes the block kind (passes size scratch for the kinds they run).
bool any_attention(const std::vector<LayerSpec>& layers, AttentionKind kind);
bool any_ffn(const std::vector<LayerSpec>& layers, FfnKind kind);

}  // namespace moestream
