// MiniMax-M2 (issue 43) without its transformers fixture: a tiny random checkpoint in the released
// layout (tests/support/tiny_hf) is converted and run, and its logits are compared with a plain
// double-precision forward pass written here from transformers' modeling_minimax_m2.py (QK-norm
// over all heads before the head split, rotate-half RoPE on the first rotary_dim dims, sigmoid
// router whose correction bias only selects, renormalised top-k, SwiGLU experts); the same
// weights as a GGUF written in llama.cpp's minimax-m2 layout run in place to the same logits.
// tests/fixtures/minimax_m2 (make_fixtures.py, on the device) adds transformers itself
// (reference_test).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/file_util.h"
#include "runtime/convert/convert.h"
#include "runtime/engine/model.h"
#include "tests/support/logit_compare.h"
#include "tests/support/tiny_hf.h"

namespace fs = std::filesystem;
using namespace moestream;
using namespace moestream::test;

namespace {

// The maths of transformers' MiniMaxM2ForCausalLM, in double, on the checkpoint's own tensors.
// `rotary_dim` and `use_bias` let a test show that the comparison sees both.
struct Reference {
  const TinyHf& m;
  int rotary_dim;
  bool use_bias = true;
  double eps = 1e-6, theta = 5e6;

  const std::vector<float>& w(const std::string& n) const { return m.tensors.at(n).data; }
  static std::vector<double> matvec(const std::vector<float>& W, const std::vector<double>& x, size_t rows) {
    std::vector<double> y(rows, 0.0);
    for (size_t r = 0; r < rows; ++r)
      for (size_t c = 0; c < x.size(); ++c) y[r] += double(W[r * x.size() + c]) * x[c];
    return y;
  }
  std::vector<double> rmsnorm(const std::vector<double>& x, const std::vector<float>& g) const {
    double ss = 0;
    for (double v : x) ss += v * v;
    const double inv = 1.0 / std::sqrt(ss / double(x.size()) + eps);
    std::vector<double> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * double(g[i]);
    return y;
  }
  // Rotate-half RoPE on the first rotary_dim dims of each head of v (n_heads x hd).
  void rope(std::vector<double>& v, int n_heads, int pos) const {
    const int hd = int(m.hd), half = rotary_dim / 2;
    for (int h = 0; h < n_heads; ++h) {
      double* x = v.data() + size_t(h * hd);
      for (int i = 0; i < half; ++i) {
        const double a = pos * std::pow(theta, -2.0 * i / rotary_dim);
        const double x0 = x[i], x1 = x[i + half];
        x[i] = x0 * std::cos(a) - x1 * std::sin(a);
        x[i + half] = x1 * std::cos(a) + x0 * std::sin(a);
      }
    }
  }

  // Logits [tokens x V] of a prompt.
  std::vector<double> run(const std::vector<int>& toks) const {
    const size_t D = size_t(m.D), V = size_t(m.V), H = size_t(m.H), KV = size_t(m.KV), hd = size_t(m.hd);
    const size_t E = size_t(m.E), F = size_t(m.F), T = toks.size(), k = 2;
    std::vector<std::vector<double>> x(T, std::vector<double>(D));
    for (size_t t = 0; t < T; ++t)
      for (size_t i = 0; i < D; ++i) x[t][i] = w("model.embed_tokens.weight")[size_t(toks[t]) * D + i];
    for (int l = 0; l < int(m.L); ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      std::vector<std::vector<double>> q(T), kk(T), v(T);
      for (size_t t = 0; t < T; ++t) {
        const std::vector<double> h = rmsnorm(x[t], w(p + "input_layernorm.weight"));
        q[t] = rmsnorm(matvec(w(p + "self_attn.q_proj.weight"), h, H * hd), w(p + "self_attn.q_norm.weight"));
        kk[t] = rmsnorm(matvec(w(p + "self_attn.k_proj.weight"), h, KV * hd), w(p + "self_attn.k_norm.weight"));
        v[t] = matvec(w(p + "self_attn.v_proj.weight"), h, KV * hd);
        rope(q[t], int(H), int(t));
        rope(kk[t], int(KV), int(t));
      }
      for (size_t t = 0; t < T; ++t) {
        std::vector<double> att(H * hd, 0.0);
        for (size_t h = 0; h < H; ++h) {
          const size_t g = h / (H / KV);
          std::vector<double> s(t + 1);
          double mx = -1e300;
          for (size_t u = 0; u <= t; ++u) {
            double d = 0;
            for (size_t i = 0; i < hd; ++i) d += q[t][h * hd + i] * kk[u][g * hd + i];
            s[u] = d / std::sqrt(double(hd));
            mx = std::max(mx, s[u]);
          }
          double z = 0;
          for (double& e : s) z += (e = std::exp(e - mx));
          for (size_t u = 0; u <= t; ++u)
            for (size_t i = 0; i < hd; ++i) att[h * hd + i] += s[u] / z * v[u][g * hd + i];
        }
        const std::vector<double> o = matvec(w(p + "self_attn.o_proj.weight"), att, D);
        for (size_t i = 0; i < D; ++i) x[t][i] += o[i];

        const std::vector<double> h2 = rmsnorm(x[t], w(p + "post_attention_layernorm.weight"));
        const std::vector<double> logits = matvec(w(p + "block_sparse_moe.gate.weight"), h2, E);
        std::vector<double> score(E), choice(E);
        for (size_t e = 0; e < E; ++e) {
          score[e] = 1.0 / (1.0 + std::exp(-logits[e]));
          choice[e] = score[e] + (use_bias ? double(w(p + "block_sparse_moe.e_score_correction_bias")[e]) : 0.0);
        }
        std::vector<size_t> ids(E);
        std::iota(ids.begin(), ids.end(), 0);
        std::partial_sort(ids.begin(), ids.begin() + long(k), ids.end(),
                          [&](size_t a, size_t b) { return choice[a] > choice[b]; });
        const double sum = score[ids[0]] + score[ids[1]];
        for (size_t j = 0; j < k; ++j) {
          const std::string xp = p + "block_sparse_moe.experts." + std::to_string(ids[j]) + ".";
          const std::vector<double> g = matvec(w(xp + "w1.weight"), h2, F), u = matvec(w(xp + "w3.weight"), h2, F);
          std::vector<double> act(F);
          for (size_t i = 0; i < F; ++i) act[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
          const std::vector<double> d = matvec(w(xp + "w2.weight"), act, D);
          for (size_t i = 0; i < D; ++i) x[t][i] += score[ids[j]] / sum * d[i];
        }
      }
    }
    std::vector<double> out(T * V);
    for (size_t t = 0; t < T; ++t) {
      const std::vector<double> y = matvec(w("lm_head.weight"), rmsnorm(x[t], w("model.norm.weight")), V);
      std::copy(y.begin(), y.end(), out.begin() + long(t * V));
    }
    return out;
  }
};

const std::vector<int> kPrompt = {3, 17, 41, 8, 29, 52, 11, 36, 5};

ConvertOptions f32_options() {
  ConvertOptions o;
  o.progress = false;
  o.quant = QuantType::kF32;
  o.dense_dtype = "f32";
  return o;
}

std::vector<float> engine_logits(const fs::path& model) {
  ModelOptions mo;
  mo.n_threads = 2;
  mo.max_context = 64;
  auto m = Model::load(model, mo);
  std::vector<float> got(kPrompt.size() * size_t(m->config().vocab_size));
  m->forward(kPrompt, got, true);
  return got;
}

// Worst |engine - reference| / max |reference| over the prompt's positions.
double worst_error(const std::vector<float>& got, const std::vector<double>& want, size_t V) {
  double worst = 0;
  for (size_t t = 0; t * V < want.size(); ++t) {
    double err = 0, scale = 0;
    for (size_t i = 0; i < V; ++i) {
      scale = std::max(scale, std::fabs(want[t * V + i]));
      err = std::max(err, std::fabs(want[t * V + i] - double(got[t * V + i])));
    }
    worst = std::max(worst, err / scale);
  }
  return worst;
}

// The converted tiny checkpoint computes transformers' maths; the reference would tell a pass that
// ignored the correction bias or rotated whole heads (both move the logits far beyond the bound).
TEST(MinimaxM2Forward, ConvertedCheckpointMatchesAPlainReference) {
  const TinyHf m = make_tiny(Arch::kMinimaxM2, 5);
  TempDir d("minimax_m2_fwd");
  save_tiny(d.path() / "hf", m, DType::kF32, false, 1);
  const ModelConfig c = convert_model(d.path() / "hf", d.path() / "pack", f32_options());
  ASSERT_EQ(c.arch, Arch::kMinimaxM2);
  const std::vector<float> got = engine_logits(d.path() / "pack");
  const size_t V = size_t(m.V);
  const Reference ref{m, int(m.hd) / 2};
  const double err = worst_error(got, ref.run(kPrompt), V);
  EXPECT_LE(err, 1e-5);

  Reference no_bias = ref;
  no_bias.use_bias = false;
  const double err_no_bias = worst_error(got, no_bias.run(kPrompt), V);
  EXPECT_GT(err_no_bias, 1e-3) << "the correction bias moves no selection here";
  Reference whole_heads = ref;
  whole_heads.rotary_dim = int(m.hd);
  const double err_whole = worst_error(got, whole_heads.run(kPrompt), V);
  EXPECT_GT(err_whole, 1e-3);
  std::printf("[ measured ] minimax_m2 f32 pack: rel err %.3g against the reference; %.3g without the "
              "correction bias, %.3g rotating whole heads\n",
              err, err_no_bias, err_whole);
}

// transformers 5's fused layout (mlp.experts.gate_up_proj, mlp.gate, mlp.e_score_correction_bias)
// packs to the same model.
TEST(MinimaxM2Forward, FusedLayoutGivesTheSameLogits) {
  const TinyHf m = make_tiny(Arch::kMinimaxM2, 6);
  TempDir d("minimax_m2_fused");
  save_tiny(d.path() / "pe", m, DType::kF32, false, 1);
  save_tiny(d.path() / "fu", m, DType::kF32, true, 2);
  convert_model(d.path() / "pe", d.path() / "pe.out", f32_options());
  convert_model(d.path() / "fu", d.path() / "fu.out", f32_options());
  EXPECT_EQ(engine_logits(d.path() / "pe.out"), engine_logits(d.path() / "fu.out"));
}

// The same weights as a minimax-m2 GGUF run in place: the config read from its metadata is the one
// read from config.json, and the logits are the reference's.
TEST(MinimaxM2Gguf, RunsInPlaceToTheReferenceLogits) {
  const TinyHf m = make_tiny(Arch::kMinimaxM2, 7);
  TempDir d("minimax_m2_gguf");
  save_tiny(d.path() / "hf", m, DType::kF32, false, 1);
  const ModelConfig pack = convert_model(d.path() / "hf", d.path() / "pack", f32_options());
  write_minimax_m2_gguf(m, d.path() / "m.gguf");
  const ModelConfig g = ModelConfig::load(d.path() / "m.gguf");
  EXPECT_EQ(g.arch, Arch::kMinimaxM2);
  EXPECT_EQ(g.qk_norm, QkNorm::kFull);
  EXPECT_EQ(g.rotary_dim, pack.rotary_dim);
  EXPECT_EQ(g.router_scoring, RouterScoring::kSigmoid);
  EXPECT_EQ(g.n_group, 1);
  EXPECT_TRUE(g.norm_topk_prob);
  EXPECT_EQ(g.routed_scaling_factor, 1.0);
  EXPECT_EQ(g.moe_intermediate_size, pack.moe_intermediate_size);
  const std::vector<float> got = engine_logits(d.path() / "m.gguf");
  const double err = worst_error(got, Reference{m, int(m.hd) / 2}.run(kPrompt), size_t(m.V));
  EXPECT_LE(err, 1e-5);
  std::printf("[ measured ] minimax_m2 F32 GGUF in place: rel err %.3g against the reference\n", err);
}

// What the converter must find: the correction bias beside the gate, named when missing.
TEST(MinimaxM2Convert, AMissingCorrectionBiasIsNamed) {
  TinyHf m = make_tiny(Arch::kMinimaxM2);
  m.tensors.erase("model.layers.1.block_sparse_moe.e_score_correction_bias");
  TempDir d("minimax_m2_nobias");
  save_tiny(d.path() / "hf", m, DType::kF32, false, 1);
  const std::string msg = message_of([&] { convert_model(d.path() / "hf", d.path() / "out", f32_options()); });
  EXPECT_NE(msg.find("model.layers.1.block_sparse_moe.e_score_correction_bias"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(d.path() / "out"));
}

}  // namespace
