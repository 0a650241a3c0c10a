// Implementation of runtime/model/expert_compute.h.
#include "runtime/model/expert_compute.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "kernels/cpu/quant.h"

namespace moestream {

namespace {

// Rows of one expert matrix per task. A prefill's quant_matvec re-rounds its input vector on every
// call, so a slice must be long enough to amortise that: 128 gate/up rows (x of width D) and 256
// down rows (input of width F) keep it under ~5%. Decode rounds each input once (token_in_,
// act_in_) and halves a slice (down to kMinSlice rows) until every thread has kTasksPerThread
// tasks: with 16 threads, 48 gate/up tasks of 0.5 MiB left threads idle for a whole task
// whenever one lagged. Shorter tasks each start their stream cold (2 threads, quarter slices:
// expert compute 7% slower), so 2 threads keep the long ones. A row's result does not depend
// on its slice.
constexpr size_t kGateUpSlice = 128;
constexpr size_t kDownSlice = 256;
constexpr size_t kMinSlice = 32;
constexpr size_t kTasksPerThread = 6;

// The rows per task of one product over `rows` rows for n_pairs pairs (see above).
size_t decode_slice(size_t slice, size_t rows, size_t n_pairs, size_t threads) {
  while (slice > kMinSlice && n_pairs * ((rows + slice - 1) / slice) < kTasksPerThread * threads) slice /= 2;
  return slice;
}

}  // namespace

void clamped_swiglu(float* gate, const float* up, size_t n, float limit, float alpha) {
  for (size_t i = 0; i < n; ++i) {
    const float g = std::min(gate[i], limit), u = std::clamp(up[i], -limit, limit);
    gate[i] = (u + 1.0f) * (g / (1.0f + std::exp(-alpha * g)));
  }
}

ExpertCompute::ExpertCompute(const ModelConfig& cfg, int max_pairs)
    : D_(cfg.hidden_size), F_(cfg.moe_intermediate_size), max_pairs_(max_pairs),
      swiglu_limit_(static_cast<float>(cfg.swiglu_limit)), swiglu_alpha_(static_cast<float>(cfg.swiglu_alpha)) {
  MOE_ASSERT(max_pairs > 0, "ExpertCompute needs room for a pair");
  act_.resize(Eigen::Index(max_pairs), F_);
  up_.resize(Eigen::Index(max_pairs), F_);
  token_in_.reserve(size_t(std::max(D_, F_)));
  act_in_.resize(size_t(cfg.n_experts_per_tok));
  for (auto& in : act_in_) in.reserve(size_t(std::max(D_, F_)));
}

void ExpertCompute::set_token(const ExpertLayout& lay, const float* x) {
  token_in_.round(lay.types.gate, x, size_t(D_));
  up_rounded_ = token_in_.serves(lay.types.up, size_t(D_));  // every pack and GGUF seen so far
}

void ExpertCompute::run(ThreadPool& pool, const ExpertLayout& lay, const ExpertPairs& pairs, const float* x,
                        bool decode, float* y) {
  const size_t n_pairs = pairs.expert_of_pair.size();
  MOE_ASSERT(pairs.token_of_pair.size() == n_pairs && pairs.y_row_of_pair.size() == n_pairs &&
                 n_pairs <= size_t(max_pairs_),
             "ExpertCompute::run: pair lists of different lengths, or more than its scratch holds");
  MOE_ASSERT(!decode || n_pairs <= act_in_.size(), "a decode step with more pairs than top-k");
  if (n_pairs == 0) return;
  const size_t threads = size_t(pool.size());
  const size_t gate_slice = decode ? decode_slice(kGateUpSlice, size_t(F_), n_pairs, threads) : kGateUpSlice;
  const size_t down_slice = decode ? decode_slice(kDownSlice, size_t(D_), n_pairs, threads) : kDownSlice;
  const size_t gate_tasks = (size_t(F_) + gate_slice - 1) / gate_slice;
  const size_t down_tasks = (size_t(D_) + down_slice - 1) / down_slice;
  // gate and up rows, then silu(gate) * up, for one row slice of one (expert, token) pair.
  pool.parallel_for(n_pairs * gate_tasks, [&](size_t task) {
    const size_t p = task / gate_tasks, r0 = (task % gate_tasks) * gate_slice;
    const size_t r1 = std::min(size_t(F_), r0 + gate_slice);
    const ExpertMatrices& e = pairs.payloads[size_t(pairs.expert_of_pair[p])];
    const float* xt = x + size_t(pairs.token_of_pair[p]) * D_;
    float* g = act_.row(Eigen::Index(p)).data();
    float* u = up_.row(Eigen::Index(p)).data();
    if (decode) quant_matvec(lay.types.gate, e.gate, size_t(D_), token_in_, g, r0, r1);
    else quant_matvec(lay.types.gate, e.gate, size_t(D_), xt, g, r0, r1);
    if (decode && up_rounded_) quant_matvec(lay.types.up, e.up, size_t(D_), token_in_, u, r0, r1);
    else quant_matvec(lay.types.up, e.up, size_t(D_), xt, u, r0, r1);
    if (e.bias != nullptr)  // gpt-oss: gate_bias [F] then up_bias [F]
      for (size_t r = r0; r < r1; ++r) {
        g[r] += e.bias[r];
        u[r] += e.bias[size_t(F_) + r];
      }
    if (swiglu_limit_ > 0)
      clamped_swiglu(g + r0, u + r0, r1 - r0, swiglu_limit_, swiglu_alpha_);
    else
      for (size_t r = r0; r < r1; ++r) g[r] = g[r] / (1.0f + std::exp(-g[r])) * u[r];
  });
  if (decode)  // each pair's activation rounded once for its down product
    for (size_t p = 0; p < n_pairs; ++p) act_in_[p].round(lay.types.down, act_.row(Eigen::Index(p)).data(), size_t(F_));
  pool.parallel_for(n_pairs * down_tasks, [&](size_t task) {
    const size_t p = task / down_tasks, r0 = (task % down_tasks) * down_slice;
    const size_t r1 = std::min(size_t(D_), r0 + down_slice);
    const ExpertMatrices& e = pairs.payloads[size_t(pairs.expert_of_pair[p])];
    float* yr = y + size_t(pairs.y_row_of_pair[p]) * D_;
    if (decode) quant_matvec(lay.types.down, e.down, size_t(F_), act_in_[p], yr, r0, r1);
    else quant_matvec(lay.types.down, e.down, size_t(F_), act_.row(Eigen::Index(p)).data(), yr, r0, r1);
    if (e.bias != nullptr)  // down_bias [D] after the two F-long ones
      for (size_t r = r0; r < r1; ++r) yr[r] += e.bias[2 * size_t(F_) + r];
  });
}

}  // namespace moestream
