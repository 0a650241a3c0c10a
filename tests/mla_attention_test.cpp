// MLA attention (runtime/model/mla_attention.h): the absorbed computation over the latent cache
// against the naive one that expands every position's per-head keys and values, on random weights.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/thread_pool.h"
#include "loader/format/model_config.h"
#include "runtime/model/mla_attention.h"
#include "runtime/model/rope.h"

namespace moestream {
namespace {

struct Param {
  int q_lora_rank;
  bool bf16_wkv_b;  // wkv_b stored as bf16: the absorbed path decodes its rows
};

ModelConfig mla_config(int q_lora_rank) {
  ModelConfig c;
  c.arch = Arch::kDeepseekV3;
  c.hidden_size = 40;
  c.n_heads = 3;
  c.n_kv_heads = 3;
  c.n_layers = 2;
  c.q_lora_rank = q_lora_rank;
  c.kv_lora_rank = 12;
  c.qk_nope_head_dim = 6;
  c.qk_rope_head_dim = 4;
  c.v_head_dim = 5;  // odd and unlike the key width, so a mixed-up split shows
  c.head_dim = c.qk_nope_head_dim + c.qk_rope_head_dim;
  c.max_position_embeddings = 64;
  c.rms_norm_eps = 1e-6;
  RopeScaling s;
  s.type = "yarn";
  s.factor = 4;
  s.original_max_position_embeddings = 16;
  s.mscale = 0.7;
  s.mscale_all_dim = 1.3;  // both differ from 1: the cos/sin factor and the softmax scale move
  c.rope_scaling = s;
  return c;
}

uint16_t to_bf16(float f) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}
float from_bf16(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct Weights {
  std::vector<std::vector<float>> mats;  // f32 storage
  std::vector<uint16_t> wkv_b_bf16;
  RowMatrix wq_a, wq_b, wq, wkv_a, wkv_b, wo;  // float values the naive pass uses
  LayerWeights lw;
};

RowMatrix random_matrix(std::mt19937& rng, int rows, int cols, float scale) {
  std::normal_distribution<float> n(0.f, scale);
  RowMatrix m(rows, cols);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = n(rng);
  return m;
}

DenseMatrix f32_view(const RowMatrix& m) {
  return DenseMatrix{QuantType::kF32, size_t(m.rows()), size_t(m.cols()), reinterpret_cast<const uint8_t*>(m.data())};
}

void make_weights(const ModelConfig& c, bool bf16, std::mt19937& rng, Weights& w) {
  const int D = c.hidden_size, H = c.n_heads, n = c.qk_nope_head_dim, r = c.qk_rope_head_dim;
  const int v = c.v_head_dim, C = c.kv_lora_rank, Q = c.q_lora_rank;
  if (Q > 0) {
    w.wq_a = random_matrix(rng, Q, D, 0.3f);
    w.wq_b = random_matrix(rng, H * (n + r), Q, 0.3f);
    w.lw.wq_a = f32_view(w.wq_a);
    w.lw.wq_b = f32_view(w.wq_b);
    w.lw.q_a_norm = Eigen::VectorXf::Random(Q).array() + 1.2f;
  } else {
    w.wq = random_matrix(rng, H * (n + r), D, 0.3f);
    w.lw.wq = f32_view(w.wq);
  }
  w.wkv_a = random_matrix(rng, C + r, D, 0.3f);
  w.wkv_b = random_matrix(rng, H * (n + v), C, 0.3f);
  w.wo = random_matrix(rng, D, H * v, 0.3f);
  w.lw.wkv_a = f32_view(w.wkv_a);
  w.lw.wo = f32_view(w.wo);
  w.lw.kv_a_norm = Eigen::VectorXf::Random(C).array() + 1.2f;
  if (bf16) {
    w.wkv_b_bf16.resize(size_t(w.wkv_b.size()));
    for (Eigen::Index i = 0; i < w.wkv_b.size(); ++i) {
      w.wkv_b_bf16[size_t(i)] = to_bf16(w.wkv_b.data()[i]);
      w.wkv_b.data()[i] = from_bf16(w.wkv_b_bf16[size_t(i)]);  // the naive pass sees the stored values
    }
    w.lw.wkv_b = DenseMatrix{ggml_quant(GgmlType::kBF16), size_t(w.wkv_b.rows()), size_t(w.wkv_b.cols()),
                             reinterpret_cast<const uint8_t*>(w.wkv_b_bf16.data())};
  } else {
    w.lw.wkv_b = f32_view(w.wkv_b);
  }
}

Eigen::VectorXf rms(const Eigen::VectorXf& x, const Eigen::VectorXf& g, float eps) {
  return (x / std::sqrt(x.squaredNorm() / float(x.size()) + eps)).cwiseProduct(g);
}

// Rotate-half RoPE of one vector at position pos, from the same tables the pass uses.
void rope(Eigen::Ref<Eigen::VectorXf> x, const Rope& ro, int pos) {
  const int half = ro.half_dim();
  std::vector<float> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
  ro.fill(pos, 1, cs.data(), sn.data());
  Rope::apply(x.data(), cs.data(), sn.data(), half);
}

// The textbook MLA of transformers' DeepseekV3Attention: every position's keys and values
// expanded per head from its latent, standard softmax attention, output projection.
RowMatrix naive_mla(const ModelConfig& c, const Weights& w, const RowMatrix& x) {
  const int T = int(x.rows()), H = c.n_heads, n = c.qk_nope_head_dim, r = c.qk_rope_head_dim;
  const int v = c.v_head_dim, C = c.kv_lora_rank;
  const float eps = float(c.rms_norm_eps), scale = mla_softmax_scale(c);
  const Rope ro(c);
  std::vector<Eigen::VectorXf> q(static_cast<size_t>(T)), k(static_cast<size_t>(T)), val(static_cast<size_t>(T));
  for (int t = 0; t < T; ++t) {
    Eigen::VectorXf xt = x.row(t).transpose();
    Eigen::VectorXf qt = c.q_lora_rank > 0 ? Eigen::VectorXf(w.wq_b * rms(w.wq_a * xt, w.lw.q_a_norm, eps))
                                           : Eigen::VectorXf(w.wq * xt);
    Eigen::VectorXf kv = w.wkv_a * xt;
    Eigen::VectorXf latent = rms(kv.head(C), w.lw.kv_a_norm, eps);
    Eigen::VectorXf k_rope = kv.tail(r);
    rope(k_rope, ro, t);
    Eigen::VectorXf up = w.wkv_b * latent;  // [H*(n+v)]
    k[size_t(t)].resize(H * (n + r));
    val[size_t(t)].resize(H * v);
    for (int h = 0; h < H; ++h) {
      rope(qt.segment(h * (n + r) + n, r), ro, t);
      k[size_t(t)].segment(h * (n + r), n) = up.segment(h * (n + v), n);
      k[size_t(t)].segment(h * (n + r) + n, r) = k_rope;
      val[size_t(t)].segment(h * v, v) = up.segment(h * (n + v) + n, v);
    }
    q[size_t(t)] = qt;
  }
  RowMatrix out(T, c.hidden_size);
  for (int t = 0; t < T; ++t) {
    Eigen::VectorXf o(H * v);
    for (int h = 0; h < H; ++h) {
      Eigen::VectorXf s(t + 1);
      for (int j = 0; j <= t; ++j)
        s[j] = q[size_t(t)].segment(h * (n + r), n + r).dot(k[size_t(j)].segment(h * (n + r), n + r)) * scale;
      s = (s.array() - s.maxCoeff()).exp();
      s /= s.sum();
      o.segment(h * v, v).setZero();
      for (int j = 0; j <= t; ++j) o.segment(h * v, v) += s[j] * val[size_t(j)].segment(h * v, v);
    }
    out.row(t) = (w.wo * o).transpose();
  }
  return out;
}

class MlaAttentionTest : public ::testing::TestWithParam<Param> {};

TEST_P(MlaAttentionTest, AbsorbedEqualsNaiveOverPrefillAndDecode) {
  const Param p = GetParam();
  const ModelConfig c = mla_config(p.q_lora_rank);
  std::mt19937 rng(17 + p.q_lora_rank);
  Weights w;
  make_weights(c, p.bf16_wkv_b, rng, w);
  const int T = 7, prefill = 4;
  const RowMatrix x = random_matrix(rng, T, c.hidden_size, 1.0f);
  const RowMatrix want = naive_mla(c, w, x);

  ThreadPool pool(3);
  MlaScratch scratch(c, /*max_context=*/16, /*max_batch=*/prefill);
  scratch.allocate();
  MlaAttention attn(c, scratch, /*max_context=*/16, /*max_batch=*/prefill);
  const Rope ro(c);
  RowMatrix got(T, c.hidden_size);
  std::vector<float> cs(size_t(prefill * ro.half_dim())), sn(cs.size());
  // The state of batch slot 0 (the pass's own sequence's stays unused: states must not mix); a
  // 4-token prefill, then one token at a time as decode runs.
  attn.prepare(kOwnSequence);
  attn.prepare(batch_state(0));
  int pos = 0;
  for (int chunk : {prefill, 1, 1, 1}) {
    ro.fill(pos, chunk, cs.data(), sn.data());
    const int splits[2] = {0, chunk};
    const StepSequence seq{batch_state(0), 0, chunk, pos};
    const LayerStep step{pool, chunk, splits, std::span<const StepSequence>(&seq, 1), cs.data(), sn.data()};
    attn.forward(step, w.lw, x.row(pos).data(), got.row(pos).data());
    pos += chunk;
  }
  ASSERT_EQ(pos, T);
  const float tol = 1e-5f * want.cwiseAbs().maxCoeff();
  for (int t = 0; t < T; ++t)
    for (int d = 0; d < c.hidden_size; ++d) EXPECT_NEAR(got(t, d), want(t, d), tol) << "token " << t << " dim " << d;
  EXPECT_GT(want.cwiseAbs().maxCoeff(), 0.1f);  // a non-trivial output
  EXPECT_EQ(attn.state_bytes(), size_t(2) * 16 * (12 + 4) * sizeof(float));  // two states
}

INSTANTIATE_TEST_SUITE_P(QLoraAndStoredTypes, MlaAttentionTest,
                         ::testing::Values(Param{8, false}, Param{0, true}),
                         [](const auto& info) {
                           return std::string(info.param.q_lora_rank > 0 ? "QLora" : "PlainQ") +
                                  (info.param.bf16_wkv_b ? "Bf16WkvB" : "F32");
                         });

TEST(MlaSoftmaxScale, FollowsYarnMscaleAllDim) {
  ModelConfig c = mla_config(8);
  const double m = 0.1 * 1.3 * std::log(4.0) + 1.0;
  EXPECT_NEAR(mla_softmax_scale(c), m * m / std::sqrt(10.0), 1e-6);
  c.rope_scaling.reset();
  EXPECT_NEAR(mla_softmax_scale(c), 1.0 / std::sqrt(10.0), 1e-7);
}

TEST(MlaRope, AttentionFactorIsTheMscaleRatio) {
  // transformers' yarn: cos/sin times mscale(f, mscale) / mscale(f, mscale_all_dim); position 0
  // has cos = 1, so the table's first entry is the factor itself.
  const ModelConfig c = mla_config(8);
  const Rope ro(c);
  ASSERT_EQ(ro.half_dim(), 2);  // over qk_rope_head_dim, not head_dim
  float cs[2], sn[2];
  ro.fill(0, 1, cs, sn);
  const double want = (0.1 * 0.7 * std::log(4.0) + 1.0) / (0.1 * 1.3 * std::log(4.0) + 1.0);
  EXPECT_NEAR(cs[0], want, 1e-6);
  EXPECT_NEAR(cs[1], want, 1e-6);
}

}  // namespace
}  // namespace moestream
