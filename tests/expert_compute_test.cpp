// runtime/model/expert_compute.h: the routed experts' products of a prefill chunk. Experts in
// ggml types compute all of an expert's tokens as one product (ggml_matmul); every (expert,
// token) pair must still get the bits it gets alone (gate and up by quant_matvec, SwiGLU, down),
// whatever the tokens (one, consecutive, scattered, more than a matmul tile), the thread count,
// the matrix types, gpt-oss's biases and clamped SwiGLU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "common/half.h"
#include "common/thread_pool.h"
#include "kernels/cpu/quant.h"
#include "loader/format/ggml_types.h"
#include "runtime/model/expert_compute.h"
#include "tests/support/random_blocks.h"

namespace moestream {
namespace {

constexpr int kD = 512, kF = 768, kTokens = 20, kExperts = 5;

// A matrix of type q with random level bytes and finite float16 scales (ggml block types), or
// N(0, 1) weights scaled down (bf16; the pack's q8 through its quantiser).
void fill_matrix(QuantType q, uint8_t* dst, size_t rows, size_t cols, std::mt19937& rng) {
  std::normal_distribution<float> g(0.0f, 1.0f);
  const auto ggml = quant_ggml_type(q);
  if (!ggml) {
    std::vector<float> w(rows * cols);
    for (float& v : w) v = 0.05f * g(rng);
    quantize_matrix(q, w.data(), rows, cols, dst);
    return;
  }
  if (*ggml == GgmlType::kBF16) {
    for (size_t i = 0; i < rows * cols; ++i) {
      const uint16_t h = f32_to_bf16(0.05f * g(rng));
      std::memcpy(dst + 2 * i, &h, 2);
    }
    return;
  }
  test::fill_random_blocks(*ggml, dst, quant_matrix_bytes(q, rows, cols), 0.002f, rng);
}

struct Case {
  std::string name;
  ExpertTypes types;
  double swiglu_limit = 0;  // gpt-oss's clamp when > 0 (with biases)
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class ExpertComputePrefill : public testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    cfg_.hidden_size = kD;
    cfg_.moe_intermediate_size = kF;
    cfg_.n_experts = kExperts;
    cfg_.n_experts_per_tok = 4;
    cfg_.swiglu_limit = GetParam().swiglu_limit;
    ExpertTypes t = GetParam().types;
    t.bias = GetParam().swiglu_limit > 0;
    lay_ = ExpertLayout::make(t, kD, kF);
    std::mt19937 rng(11);
    std::normal_distribution<float> g(0.0f, 1.0f);
    payload_.resize(kExperts * lay_.bytes);
    for (int e = 0; e < kExperts; ++e) {
      uint8_t* p = payload_.data() + size_t(e) * lay_.bytes;
      fill_matrix(t.gate, p + lay_.gate_offset, kF, kD, rng);
      fill_matrix(t.up, p + lay_.up_offset, kF, kD, rng);
      fill_matrix(t.down, p + lay_.down_offset, kD, kF, rng);
      if (t.bias)
        for (size_t i = 0; i < 2 * kF + kD; ++i) {
          const float b = 0.1f * g(rng);
          std::memcpy(p + lay_.bias_offset + 4 * i, &b, 4);
        }
      matrices_.push_back(ExpertMatrices::of_payload(p, lay_));
    }
    x_.resize(size_t(kTokens) * kD);
    for (float& v : x_) v = g(rng);
  }

  // Pair p alone, as the per-pair path computes it: y = down(swiglu(gate x_t, up x_t)).
  std::vector<float> alone(int expert, int token) const {
    const ExpertMatrices& e = matrices_[size_t(expert)];
    const float* xt = x_.data() + size_t(token) * kD;
    std::vector<float> gate(kF), up(kF), y(kD);
    quant_matvec(lay_.types.gate, e.gate, kD, xt, gate.data(), 0, kF);
    quant_matvec(lay_.types.up, e.up, kD, xt, up.data(), 0, kF);
    if (e.bias != nullptr)
      for (int r = 0; r < kF; ++r) {
        gate[size_t(r)] += e.bias[r];
        up[size_t(r)] += e.bias[kF + r];
      }
    if (cfg_.swiglu_limit > 0)
      clamped_swiglu(gate.data(), up.data(), kF, float(cfg_.swiglu_limit), float(cfg_.swiglu_alpha));
    else
      for (int r = 0; r < kF; ++r) gate[size_t(r)] = gate[size_t(r)] / (1.0f + std::exp(-gate[size_t(r)])) * up[size_t(r)];
    quant_matvec(lay_.types.down, e.down, kF, gate.data(), y.data(), 0, kD);
    if (e.bias != nullptr)
      for (int r = 0; r < kD; ++r) y[size_t(r)] += e.bias[2 * kF + r];
    return y;
  }

  ModelConfig cfg_;
  ExpertLayout lay_;
  std::vector<uint8_t> payload_;
  std::vector<ExpertMatrices> matrices_;
  std::vector<float> x_;
};

TEST_P(ExpertComputePrefill, EveryPairGetsTheBitsItGetsAlone) {
  // Expert by expert, as MoeLayer lists them: scattered tokens, one token, nineteen (more than a
  // matmul tile of four and than the 16 tokens of one product), two consecutive ones, the last
  // token alone. Output rows in another order.
  std::vector<int> many;
  for (int t = 0; t < 19; ++t) many.push_back(t);
  const std::vector<std::pair<int, std::vector<int>>> chosen = {
      {0, {0, 2, 19}}, {1, {1}}, {2, many}, {3, {3, 4}}, {4, {19}}};
  std::vector<int> expert_of_pair, token_of_pair, y_row_of_pair;
  for (const auto& [e, tokens] : chosen)
    for (int t : tokens) {
      expert_of_pair.push_back(e);
      token_of_pair.push_back(t);
    }
  const int n_pairs = int(expert_of_pair.size());
  for (int p = 0; p < n_pairs; ++p) y_row_of_pair.push_back((p * 5 + 3) % n_pairs);
  const ExpertPairs pairs{matrices_, expert_of_pair, token_of_pair, y_row_of_pair};
  for (int threads : {1, 3}) {
    ThreadPool pool(threads);
    ExpertCompute compute(cfg_, n_pairs);
    std::vector<float> y(size_t(n_pairs) * kD, NAN);
    compute.run(pool, lay_, pairs, x_.data(), false, y.data());
    for (int p = 0; p < n_pairs; ++p) {
      const std::vector<float> want = alone(expert_of_pair[size_t(p)], token_of_pair[size_t(p)]);
      const float* got = y.data() + size_t(y_row_of_pair[size_t(p)]) * kD;
      ASSERT_EQ(std::memcmp(got, want.data(), kD * sizeof(float)), 0)
          << GetParam().name << ", " << threads << " threads: pair " << p << " (expert " << expert_of_pair[size_t(p)]
          << ", token " << token_of_pair[size_t(p)] << ")";
    }
  }
}

TEST_P(ExpertComputePrefill, ADecodeStepGetsTheBitsEachPairGetsAlone) {
  // One token's top-k through the decode path (its input rounded once for every product).
  const std::vector<int> experts = {1, 3, 4, 0}, tokens(4, 0), rows = {2, 0, 3, 1};
  const ExpertPairs pairs{matrices_, experts, tokens, rows};
  ThreadPool pool(2);
  ExpertCompute compute(cfg_, 4);
  std::vector<float> y(4 * kD);
  compute.set_token(lay_, x_.data());
  compute.run(pool, lay_, pairs, x_.data(), true, y.data());
  for (size_t p = 0; p < experts.size(); ++p) {
    const std::vector<float> want = alone(experts[p], 0);
    EXPECT_EQ(std::memcmp(y.data() + size_t(rows[p]) * kD, want.data(), kD * sizeof(float)), 0) << "pair " << p;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Types, ExpertComputePrefill,
    testing::Values(Case{"Q8_0", ExpertTypes::uniform(ggml_quant(GgmlType::kQ8_0))},
                    Case{"Q4_K_Q4_K_Q6_K", {ggml_quant(GgmlType::kQ4_K), ggml_quant(GgmlType::kQ4_K),
                                            ggml_quant(GgmlType::kQ6_K)}},
                    Case{"IQ2_XXS_IQ3_XXS_IQ1_M", {ggml_quant(GgmlType::kIQ2_XXS), ggml_quant(GgmlType::kIQ3_XXS),
                                                   ggml_quant(GgmlType::kIQ1_M)}},
                    Case{"BF16", ExpertTypes::uniform(ggml_quant(GgmlType::kBF16))},
                    Case{"Q8_0_biases_clamped", ExpertTypes::uniform(ggml_quant(GgmlType::kQ8_0)), 7.0},
                    Case{"pack_q8", ExpertTypes::uniform(QuantType::kQ8)}),
    [](const testing::TestParamInfo<Case>& i) { return i.param.name; });

}  // namespace
}  // namespace moestream
