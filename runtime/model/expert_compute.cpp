// Implementation of runtime/model/expert_compute.h.
#include "runtime/model/expert_compute.h"

#include <algorithm>
#include <cmath>
#include <span>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/ggml_quant.h"
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

// run_by_expert's products take at most this many of an expert's tokens at a time (the row slice
// stays in L2 between them), which bounds each pool thread's scratch (growing only, up to 16
// rows of the widest product): the tokens' rows gathered into one block, and the down products
// before they go to their pairs' rows.
constexpr size_t kTokensPerProduct = 16;
thread_local std::vector<float> t_rows, t_down;

// Rows `rows` of x (each w floats) as one block: x's own rows when they are consecutive (one
// token always), else copied into t_rows.
const float* token_rows(const float* x, size_t w, std::span<const int> rows) {
  bool consecutive = true;
  for (size_t i = 1; i < rows.size(); ++i) consecutive = consecutive && rows[i] == rows[i - 1] + 1;
  if (consecutive) return x + size_t(rows[0]) * w;
  if (t_rows.size() < rows.size() * w) t_rows.resize(rows.size() * w);
  for (size_t i = 0; i < rows.size(); ++i) std::copy_n(x + size_t(rows[i]) * w, w, t_rows.data() + i * w);
  return t_rows.data();
}

// Rows [r0, r1) of W x for n inputs (x's rows, y's rows y_stride apart): the matvec for one, which
// streams the weights with software prefetch, the matmul for several; the same bits either way.
void expert_product(GgmlType t, const uint8_t* w, size_t cols, const float* x, size_t n, float* y,
                    size_t y_stride, size_t r0, size_t r1) {
  if (n == 1) ggml_matvec(t, w, cols, x, y, r0, r1);
  else ggml_matmul(t, w, cols, x, n, y, y_stride, r0, r1);
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
  group_start_.reserve(size_t(max_pairs) + 1);
  for (auto& in : act_in_) in.reserve(size_t(std::max(D_, F_)));
}

void ExpertCompute::set_token(const ExpertLayout& lay, const float* x) {
  token_in_.round(lay.types.gate, x, size_t(D_));
  up_rounded_ = token_in_.serves(lay.types.up, size_t(D_));  // every pack and GGUF seen so far
}

void ExpertCompute::activate(const ExpertMatrices& e, size_t p, size_t r0, size_t r1) {
  float* g = act_.row(Eigen::Index(p)).data();
  float* u = up_.row(Eigen::Index(p)).data();
  if (e.bias != nullptr)  // gpt-oss: gate_bias [F] then up_bias [F]
    for (size_t r = r0; r < r1; ++r) {
      g[r] += e.bias[r];
      u[r] += e.bias[size_t(F_) + r];
    }
  if (swiglu_limit_ > 0)
    clamped_swiglu(g + r0, u + r0, r1 - r0, swiglu_limit_, swiglu_alpha_);
  else
    for (size_t r = r0; r < r1; ++r) g[r] = g[r] / (1.0f + std::exp(-g[r])) * u[r];
}

void ExpertCompute::run(ThreadPool& pool, const ExpertLayout& lay, const ExpertPairs& pairs, const float* x,
                        bool decode, float* y) {
  const size_t n_pairs = pairs.expert_of_pair.size();
  MOE_ASSERT(pairs.token_of_pair.size() == n_pairs && pairs.y_row_of_pair.size() == n_pairs &&
                 n_pairs <= size_t(max_pairs_),
             "ExpertCompute::run: pair lists of different lengths, or more than its scratch holds");
  MOE_ASSERT(!decode || n_pairs <= act_in_.size(), "a decode step with more pairs than top-k");
  if (n_pairs == 0) return;
  if (!decode && quant_ggml_type(lay.types.gate) && quant_ggml_type(lay.types.up) && quant_ggml_type(lay.types.down)) {
    run_by_expert(pool, lay, pairs, x, y);
    return;
  }
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
    if (e.unverified != nullptr) PendingChecks::run_now(*e.unverified);  // see ExpertMatrices
    const float* xt = x + size_t(pairs.token_of_pair[p]) * D_;
    float* g = act_.row(Eigen::Index(p)).data();
    float* u = up_.row(Eigen::Index(p)).data();
    if (decode) quant_matvec(lay.types.gate, e.gate, size_t(D_), token_in_, g, r0, r1);
    else quant_matvec(lay.types.gate, e.gate, size_t(D_), xt, g, r0, r1);
    if (decode && up_rounded_) quant_matvec(lay.types.up, e.up, size_t(D_), token_in_, u, r0, r1);
    else quant_matvec(lay.types.up, e.up, size_t(D_), xt, u, r0, r1);
    activate(e, p, r0, r1);
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

void ExpertCompute::run_by_expert(ThreadPool& pool, const ExpertLayout& lay, const ExpertPairs& pairs,
                                  const float* x, float* y) {
  const size_t n_pairs = pairs.expert_of_pair.size();
  group_start_.clear();
  for (size_t p = 0; p < n_pairs; ++p)
    if (p == 0 || pairs.expert_of_pair[p] != pairs.expert_of_pair[p - 1]) group_start_.push_back(p);
  group_start_.push_back(n_pairs);
  const size_t n_groups = group_start_.size() - 1;
  const GgmlType gate_t = *quant_ggml_type(lay.types.gate), up_t = *quant_ggml_type(lay.types.up),
                 down_t = *quant_ggml_type(lay.types.down);
  const size_t D = size_t(D_), F = size_t(F_);
  const size_t gate_tasks = (F + kGateUpSlice - 1) / kGateUpSlice, down_tasks = (D + kDownSlice - 1) / kDownSlice;
  // An expert's gate and up rows over its tokens, kTokensPerProduct at a time, then
  // silu(gate) * up per pair: pair p's rows of act_ and up_ (an expert's pairs are consecutive).
  pool.parallel_for(n_groups * gate_tasks, [&](size_t task) {
    const size_t g = task / gate_tasks, r0 = (task % gate_tasks) * kGateUpSlice;
    const size_t r1 = std::min(F, r0 + kGateUpSlice);
    const ExpertMatrices& e = pairs.payloads[size_t(pairs.expert_of_pair[group_start_[g]])];
    if (e.unverified != nullptr) PendingChecks::run_now(*e.unverified);  // see ExpertMatrices
    for (size_t p0 = group_start_[g]; p0 < group_start_[g + 1]; p0 += kTokensPerProduct) {
      const size_t n = std::min(kTokensPerProduct, group_start_[g + 1] - p0);
      const float* xs = token_rows(x, D, pairs.token_of_pair.subspan(p0, n));
      expert_product(gate_t, e.gate, D, xs, n, act_.row(Eigen::Index(p0)).data(), F, r0, r1);
      expert_product(up_t, e.up, D, xs, n, up_.row(Eigen::Index(p0)).data(), F, r0, r1);
      for (size_t p = p0; p < p0 + n; ++p) activate(e, p, r0, r1);
    }
  });
  // The down rows of an expert's pairs, kTokensPerProduct at a time: one token's straight into its
  // row of y, several into t_down and from there into each pair's row.
  pool.parallel_for(n_groups * down_tasks, [&](size_t task) {
    const size_t g = task / down_tasks, r0 = (task % down_tasks) * kDownSlice;
    const size_t r1 = std::min(D, r0 + kDownSlice);
    const ExpertMatrices& e = pairs.payloads[size_t(pairs.expert_of_pair[group_start_[g]])];
    for (size_t p0 = group_start_[g]; p0 < group_start_[g + 1]; p0 += kTokensPerProduct) {
      const size_t n = std::min(kTokensPerProduct, group_start_[g + 1] - p0);
      float* out = y + size_t(pairs.y_row_of_pair[p0]) * D;
      if (n > 1) {
        if (t_down.size() < n * D) t_down.resize(n * D);
        out = t_down.data();
      }
      expert_product(down_t, e.down, F, act_.row(Eigen::Index(p0)).data(), n, out, D, r0, r1);
      for (size_t i = 0; i < n; ++i) {
        float* yr = y + size_t(pairs.y_row_of_pair[p0 + i]) * D;
        if (n > 1) std::copy(out + i * D + r0, out + i * D + r1, yr + r0);
        if (e.bias != nullptr)  // down_bias [D] after the two F-long ones
          for (size_t r = r0; r < r1; ++r) yr[r] += e.bias[2 * F + r];
      }
    }
  });
}

}  // namespace moestream
