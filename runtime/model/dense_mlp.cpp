// Implementation of runtime/model/dense_mlp.h.
#include "runtime/model/dense_mlp.h"

namespace moestream {

DenseMlpScratch::DenseMlpScratch(const ModelConfig& cfg, int max_batch) {
  for (RowMatrix* m : {&act, &up, &swiglu}) m->resize(max_batch, cfg.intermediate_size);
}

void DenseMlp::forward(const LayerStep& step, const LayerWeights& w, const float* h, float* out) {
  const int T = step.T;
  const ConstRowMap hm(h, T, D_);
  RowMap act(s_.act.data(), T, I_), up(s_.up.data(), T, I_);
  const DenseMatrix* ws[2] = {&w.mlp_gate, &w.mlp_up};
  RowMap* ys[2] = {&act, &up};
  linear_group_ranges(step.pool, hm, ws, ys, step.splits);
  swiglu_ranges(act, up.data(), step.splits, s_.swiglu);
  linear_ranges(step.pool, ConstRowMap(act.data(), T, I_), w.mlp_down, RowMap(out, T, D_), step.splits);
}

}  // namespace moestream
