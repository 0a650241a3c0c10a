// The dense SwiGLU MLP of a layer (FfnKind::kDense: GLM-4.5's and DeepSeek's first layers):
// down(silu(gate x) * up x), intermediate_size wide, on the CPU.
#pragma once

#include "loader/format/model_config.h"
#include "runtime/model/blocks.h"
#include "runtime/model/dense_ops.h"

namespace moestream {

// Scratch every dense-MLP layer of a pass shares: [max_batch, intermediate_size] each.
struct DenseMlpScratch {
  DenseMlpScratch(const ModelConfig& cfg, int max_batch);
  RowMatrix act, up, swiglu;
};

class DenseMlp final : public FfnBlock {
 public:
  DenseMlp(const ModelConfig& cfg, DenseMlpScratch& scratch) : I_(cfg.intermediate_size), D_(cfg.hidden_size), s_(scratch) {}
  void forward(const LayerStep& step, const LayerWeights& w, const float* h, float* out) override;

 private:
  int I_, D_;
  DenseMlpScratch& s_;
};

}  // namespace moestream
