// Tests of the CPU forward pass on small random packed models: against a naive double-precision
// reference written independently here, KV-cache and threading invariants, routing, sampling,
// RoPE scaling, perplexity, and clear errors for corrupt expert files.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <stdexcept>
#include <vector>

#include "common/error.h"
#include "common/file_util.h"
#include "runtime/engine/generate.h"
#include "runtime/engine/model.h"
#include "runtime/model/routing.h"
#include "kernels/cpu/quant.h"
#include "runtime/model/rope.h"
#include "loader/format/safetensors.h"
#include "runtime/model/sampler.h"
#include "runtime/convert/synthetic_model.h"
#include "common/thread_pool.h"
#include "common/timing.h"
#include "tests/support/test_model.h"

namespace fs = std::filesystem;
using namespace moestream;

namespace {

// One architecture per q/k norm: OLMoE (full), Qwen3 (per head), Mixtral (none, tied embeddings).
ModelConfig tiny_config(QkNorm qk, QuantType quant = QuantType::kF32) {
  // Odd hidden size: no dimension is a multiple of a SIMD width or a quant block.
  ModelConfig c = test::tiny_moe_config({.vocab = 97, .hidden = 45, .layers = 3, .head_dim = 14, .intermediate = 37,
                                         .top_k = 3, .max_positions = 256, .quant = quant});
  c.arch = qk == QkNorm::kFull ? Arch::kOlmoe : qk == QkNorm::kPerHead ? Arch::kQwen3Moe : Arch::kMixtral;
  c.qk_norm = qk;
  c.norm_topk_prob = qk != QkNorm::kFull;
  c.tie_word_embeddings = qk == QkNorm::kNone;
  return c;
}

// The model as plain vectors, read back from the packed files without the runtime's loaders.
struct RefModel {
  ModelConfig c;
  std::map<std::string, std::vector<float>> t;
  // [layer][expert] -> gate, up, down as float
  std::vector<std::vector<std::array<std::vector<float>, 3>>> experts;

  explicit RefModel(const fs::path& dir) : c(ModelConfig::load(dir)) {
    SafetensorsFile f(dir / c.dense_file);
    for (const auto& n : f.names()) t[n] = f.to_float(n);
    const size_t D = size_t(c.hidden_size), F = size_t(c.moe_intermediate_size);
    const ExpertLayout lay = ExpertLayout::make(c.expert_quant, D, F);
    for (int l = 0; l < c.n_layers; ++l) {
      const fs::path p = expert_file_path(dir, l);
      ExpertFileHeader h = read_expert_header(p);
      std::string bytes = read_file(p);
      experts.emplace_back();
      for (int e = 0; e < c.n_experts; ++e) {
        const uint8_t* pl = reinterpret_cast<const uint8_t*>(bytes.data()) + h.slot_offset(uint32_t(e));
        std::array<std::vector<float>, 3> m{std::vector<float>(F * D), std::vector<float>(F * D),
                                            std::vector<float>(D * F)};
        dequantize_matrix(c.expert_quant, pl + lay.gate_offset, F, D, m[0].data());
        dequantize_matrix(c.expert_quant, pl + lay.up_offset, F, D, m[1].data());
        dequantize_matrix(c.expert_quant, pl + lay.down_offset, D, F, m[2].data());
        experts.back().push_back(std::move(m));
      }
    }
  }

  const std::vector<float>& w(const std::string& n) const { return t.at(n); }

  static std::vector<double> matvec(const std::vector<float>& W, const std::vector<double>& x, size_t rows) {
    const size_t cols = x.size();
    std::vector<double> y(rows, 0.0);
    for (size_t r = 0; r < rows; ++r)
      for (size_t k = 0; k < cols; ++k) y[r] += double(W[r * cols + k]) * x[k];
    return y;
  }
  void rmsnorm(std::vector<double>& x, const float* w, size_t off, size_t n) const {
    double ss = 0;
    for (size_t i = 0; i < n; ++i) ss += x[off + i] * x[off + i];
    const double inv = 1.0 / std::sqrt(ss / double(n) + c.rms_norm_eps);
    for (size_t i = 0; i < n; ++i) x[off + i] = x[off + i] * inv * w[i];
  }
  void rope(std::vector<double>& x, size_t off, int pos) const {
    const int hd = c.head_dim, half = hd / 2;
    for (int i = 0; i < half; ++i) {
      const double freq = 1.0 / std::pow(c.rope_theta, 2.0 * i / hd);
      const double cs = std::cos(freq * pos), sn = std::sin(freq * pos);
      const double a = x[off + size_t(i)], b = x[off + size_t(i + half)];
      x[off + size_t(i)] = a * cs - b * sn;
      x[off + size_t(i + half)] = b * cs + a * sn;
    }
  }

  // Logits [T][V] for the whole sequence, computed position by position without a cache.
  std::vector<std::vector<double>> forward(const std::vector<int>& toks) const {
    const size_t D = size_t(c.hidden_size), H = size_t(c.n_heads), KV = size_t(c.n_kv_heads);
    const size_t hd = size_t(c.head_dim), T = toks.size(), F = size_t(c.moe_intermediate_size);
    std::vector<std::vector<double>> x(T, std::vector<double>(D));
    for (size_t t = 0; t < T; ++t)
      for (size_t i = 0; i < D; ++i) x[t][i] = w("embed")[size_t(toks[t]) * D + i];
    for (int l = 0; l < c.n_layers; ++l) {
      const std::string p = "layers." + std::to_string(l) + ".";
      std::vector<std::vector<double>> q(T), k(T), v(T);
      for (size_t t = 0; t < T; ++t) {
        std::vector<double> h = x[t];
        rmsnorm(h, w(p + "attn_norm").data(), 0, D);
        q[t] = matvec(w(p + "wq"), h, H * hd);
        k[t] = matvec(w(p + "wk"), h, KV * hd);
        v[t] = matvec(w(p + "wv"), h, KV * hd);
        if (c.qk_norm == QkNorm::kFull) {
          rmsnorm(q[t], w(p + "q_norm").data(), 0, H * hd);
          rmsnorm(k[t], w(p + "k_norm").data(), 0, KV * hd);
        }
        for (size_t hh = 0; hh < H; ++hh) {
          if (c.qk_norm == QkNorm::kPerHead) rmsnorm(q[t], w(p + "q_norm").data(), hh * hd, hd);
          rope(q[t], hh * hd, int(t));
        }
        for (size_t g = 0; g < KV; ++g) {
          if (c.qk_norm == QkNorm::kPerHead) rmsnorm(k[t], w(p + "k_norm").data(), g * hd, hd);
          rope(k[t], g * hd, int(t));
        }
      }
      for (size_t t = 0; t < T; ++t) {
        std::vector<double> att(H * hd, 0.0);
        for (size_t hh = 0; hh < H; ++hh) {
          const size_t g = hh / (H / KV);
          std::vector<double> s(t + 1);
          for (size_t j = 0; j <= t; ++j) {
            double d = 0;
            for (size_t i = 0; i < hd; ++i) d += q[t][hh * hd + i] * k[j][g * hd + i];
            s[j] = d / std::sqrt(double(hd));
          }
          const double m = *std::max_element(s.begin(), s.end());
          double sum = 0;
          for (double& e : s) sum += e = std::exp(e - m);
          for (size_t j = 0; j <= t; ++j)
            for (size_t i = 0; i < hd; ++i) att[hh * hd + i] += s[j] / sum * v[j][g * hd + i];
        }
        std::vector<double> o = matvec(w(p + "wo"), att, D);
        for (size_t i = 0; i < D; ++i) x[t][i] += o[i];
      }
      for (size_t t = 0; t < T; ++t) {
        std::vector<double> h = x[t];
        rmsnorm(h, w(p + "ffn_norm").data(), 0, D);
        std::vector<double> logits = matvec(w(p + "router"), h, size_t(c.n_experts));
        const double m = *std::max_element(logits.begin(), logits.end());
        std::vector<double> prob(logits.size());
        double sum = 0;
        for (size_t e = 0; e < prob.size(); ++e) sum += prob[e] = std::exp(logits[e] - m);
        for (double& pr : prob) pr /= sum;
        std::vector<size_t> order(prob.size());
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return prob[a] > prob[b]; });
        double wsum = 0;
        for (int j = 0; j < c.n_experts_per_tok; ++j) wsum += prob[order[size_t(j)]];
        for (int j = 0; j < c.n_experts_per_tok; ++j) {
          const size_t e = order[size_t(j)];
          const double wt = c.norm_topk_prob ? prob[e] / wsum : prob[e];
          const auto& ex = experts[size_t(l)][e];
          std::vector<double> g = matvec(ex[0], h, F), u = matvec(ex[1], h, F);
          for (size_t i = 0; i < F; ++i) g[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
          std::vector<double> y = matvec(ex[2], g, D);
          for (size_t i = 0; i < D; ++i) x[t][i] += wt * y[i];
        }
      }
    }
    std::vector<std::vector<double>> out;
    const auto& head = c.tie_word_embeddings ? w("embed") : w("lm_head");
    for (size_t t = 0; t < T; ++t) {
      std::vector<double> h = x[t];
      rmsnorm(h, w("final_norm").data(), 0, D);
      out.push_back(matvec(head, h, size_t(c.vocab_size)));
    }
    return out;
  }
};

std::vector<int> test_tokens(int n, int vocab, int salt = 0) {
  std::vector<int> t;
  for (int i = 0; i < n; ++i) t.push_back((i * 37 + 11 + salt * 7) % vocab);
  return t;
}

std::vector<float> all_logits(Model& m, const std::vector<int>& toks) {
  std::vector<float> out(toks.size() * size_t(m.config().vocab_size));
  m.reset();
  m.forward(toks, out, true);
  return out;
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, double(std::fabs(x)));
  return m;
}

class ForwardVsReference : public ::testing::TestWithParam<QkNorm> {};

}  // namespace

TEST(ThreadPool, RunsEveryTaskExactlyOnce) {
  ThreadPool pool(3);
  for (size_t n : {size_t(1), size_t(2), size_t(7), size_t(1000)}) {
    std::vector<std::atomic<int>> hits(n);
    pool.parallel_for(n, [&](size_t i) { hits[i].fetch_add(1); });
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "task " << i << " of " << n;
  }
}

TEST(ThreadPool, ManyTinySectionsWithMoreThreadsThanCoresRunEveryTask) {
  // Oversubscribed on purpose (CI runs test binaries in parallel on 2 cores): every section must
  // finish with every task run once. How fast they finish is a benchmark's question, not a test's.
  ThreadPool pool(8);
  std::atomic<long> total{0};
  for (int rep = 0; rep < 5000; ++rep)
    pool.parallel_for(16, [&](size_t i) {
      volatile long x = 0;  // ~1 us of work, so sleeping workers do join in
      for (int k = 0; k < 1000; ++k) x = x + k;
      total.fetch_add(long(i) + 1, std::memory_order_relaxed);
    });
  EXPECT_EQ(total.load(), 5000L * 136);
}

TEST(ThreadPool, RethrowsTheTaskExceptionAfterAllTasksFinish) {
  ThreadPool pool(2);
  std::atomic<int> ran{0};
  EXPECT_THROW(pool.parallel_for(64, [&](size_t i) {
    ran.fetch_add(1);
    if (i == 5) throw std::runtime_error("task 5 failed");
  }), std::runtime_error);
  EXPECT_EQ(ran.load(), 64);
  pool.parallel_for(4, [&](size_t) { ran.fetch_add(1); });  // still usable afterwards
  EXPECT_EQ(ran.load(), 68);
}

TEST_P(ForwardVsReference, LogitsMatchNaiveDoublePrecisionModel) {
  TempDir d("fwd");
  ModelConfig cfg = tiny_config(GetParam());
  write_synthetic_model(d.path(), cfg, 42);
  RefModel ref(d.path());
  ModelOptions o;
  o.n_threads = 2;
  auto m = Model::load(d.path(), o);
  const std::vector<int> toks = test_tokens(11, cfg.vocab_size);
  std::vector<float> got = all_logits(*m, toks);
  auto want = ref.forward(toks);
  double scale = 0, err = 0;
  for (size_t t = 0; t < toks.size(); ++t)
    for (int v = 0; v < cfg.vocab_size; ++v) {
      scale = std::max(scale, std::fabs(want[t][size_t(v)]));
      err = std::max(err, std::fabs(want[t][size_t(v)] - got[t * size_t(cfg.vocab_size) + size_t(v)]));
    }
  EXPECT_GT(scale, 0.5);  // the model produces non-trivial logits
  EXPECT_LE(err, 1e-5 * scale) << "max |dlogit| " << err << " of max |logit| " << scale;
}

INSTANTIATE_TEST_SUITE_P(QkNormKinds, ForwardVsReference,
                         ::testing::Values(QkNorm::kPerHead, QkNorm::kFull, QkNorm::kNone));

// bf16 dense matrices are computed as stored (ggml's BF16 kernel on float inputs): the same
// reference within the same bound, the same logits at any thread count, prefill and decode
// alike; the active bytes per token count the matrices at 2 bytes, norms and routers at 4.
TEST(Forward, Bf16DenseComputedAsStoredMatchesReference) {
  for (QkNorm qk : {QkNorm::kPerHead, QkNorm::kFull, QkNorm::kNone}) {
    TempDir d("fwd");
    ModelConfig cfg = tiny_config(qk);
    cfg.dense_dtype = "bf16";
    write_synthetic_model(d.path(), cfg, 43);
    RefModel ref(d.path());
    ModelOptions one, two;
    one.n_threads = 1;
    two.n_threads = 2;
    auto m = Model::load(d.path(), two);
    const std::vector<int> toks = test_tokens(11, cfg.vocab_size);
    const std::vector<float> got = all_logits(*m, toks);
    const auto want = ref.forward(toks);
    double scale = 0, err = 0;
    for (size_t t = 0; t < toks.size(); ++t)
      for (int v = 0; v < cfg.vocab_size; ++v) {
        scale = std::max(scale, std::fabs(want[t][size_t(v)]));
        err = std::max(err, std::fabs(want[t][size_t(v)] - got[t * size_t(cfg.vocab_size) + size_t(v)]));
      }
    EXPECT_GT(scale, 0.5);
    EXPECT_LE(err, 1e-5 * scale) << "max |dlogit| " << err << " of max |logit| " << scale;
    EXPECT_EQ(all_logits(*Model::load(d.path(), one), toks), got);  // bitwise: fixed work slices

    const size_t D = size_t(cfg.hidden_size);
    size_t dense = 2 * D;  // the token's embedding row
    for (const auto& [name, v] : ref.t) {
      const bool matrix = name == "embed" || name == "lm_head" || name.ends_with(".wq") || name.ends_with(".wk") ||
                          name.ends_with(".wv") || name.ends_with(".wo");
      if (name != "embed" || cfg.tie_word_embeddings) dense += v.size() * (matrix ? 2 : 4);
    }
    size_t experts = 0;
    for (int l = 0; l < cfg.n_layers; ++l) experts += size_t(cfg.n_experts_per_tok) * cfg.expert_layout(l).bytes;
    EXPECT_EQ(m->active_bytes_per_token(), dense + experts);
  }
}

TEST(Forward, IncrementalDecodeMatchesOnePrefill) {
  TempDir d("fwd");
  ModelConfig cfg = tiny_config(QkNorm::kPerHead);
  write_synthetic_model(d.path(), cfg, 7);
  auto m = Model::load(d.path());
  const std::vector<int> toks = test_tokens(9, cfg.vocab_size);
  std::vector<float> full = all_logits(*m, toks);
  m->reset();
  const size_t V = size_t(cfg.vocab_size);
  std::vector<float> step(V);
  m->forward(std::span<const int>(toks.data(), 4), step);  // a 4-token prefill, then steps
  for (size_t v = 0; v < V; ++v) ASSERT_NEAR(step[v], full[3 * V + v], 1e-5f);
  for (size_t t = 4; t < toks.size(); ++t) {
    m->forward(std::span<const int>(&toks[t], 1), step);
    for (size_t v = 0; v < V; ++v) ASSERT_NEAR(step[v], full[t * V + v], 1e-5f) << "position " << t;
  }
  EXPECT_EQ(m->n_past(), 9);
}

TEST(Forward, ThreadCountDoesNotChangeLogits) {
  TempDir d("fwd");
  ModelConfig cfg = tiny_config(QkNorm::kFull, QuantType::kQ8);
  write_synthetic_model(d.path(), cfg, 3);
  const std::vector<int> toks = test_tokens(6, cfg.vocab_size);
  ModelOptions one, two;
  one.n_threads = 1;
  two.n_threads = 2;
  auto a = Model::load(d.path(), one), b = Model::load(d.path(), two);
  EXPECT_EQ(all_logits(*a, toks), all_logits(*b, toks));  // bitwise: fixed work slices
}

TEST(Forward, SmallBatchChunksMatchOneBatch) {
  TempDir d("fwd");
  ModelConfig cfg = tiny_config(QkNorm::kPerHead, QuantType::kQ4);
  write_synthetic_model(d.path(), cfg, 5);
  const std::vector<int> toks = test_tokens(10, cfg.vocab_size);
  ModelOptions small;
  small.max_batch = 3;
  auto a = Model::load(d.path()), b = Model::load(d.path(), small);
  std::vector<float> la = all_logits(*a, toks), lb = all_logits(*b, toks);
  ASSERT_EQ(la.size(), lb.size());
  for (size_t i = 0; i < la.size(); ++i) ASSERT_NEAR(la[i], lb[i], 1e-4f) << "index " << i;
}

TEST(Forward, QuantizedExpertsTrackFloatExperts) {
  TempDir d("fwd");
  const std::vector<int> toks = test_tokens(8, 97);
  std::map<QuantType, std::vector<float>> logits;
  for (QuantType q : {QuantType::kF32, QuantType::kBF16, QuantType::kQ8, QuantType::kQ4}) {
    fs::path dir = d.path() / std::string(quant_name(q));
    write_synthetic_model(dir, tiny_config(QkNorm::kPerHead, q), 11);  // same seed: same weights
    auto m = Model::load(dir);
    logits[q] = all_logits(*m, toks);
  }
  const auto& ref = logits[QuantType::kF32];
  const double scale = max_abs(ref);
  auto rel = [&](QuantType q) {
    double e = 0;
    for (size_t i = 0; i < ref.size(); ++i) e = std::max(e, double(std::fabs(ref[i] - logits[q][i])));
    return e / scale;
  };
  // Each format adds error in proportion to its step size: bf16 < q8 < q4, all small.
  EXPECT_GT(rel(QuantType::kBF16), 0.0);
  EXPECT_LT(rel(QuantType::kBF16), 1e-2);
  EXPECT_LT(rel(QuantType::kQ8), 2e-2);
  EXPECT_LT(rel(QuantType::kQ4), 0.2);
  EXPECT_LT(rel(QuantType::kQ8), rel(QuantType::kQ4));
}

TEST(Forward, RejectsTokenOutsideVocabularyAndFullContext) {
  TempDir d("fwd");
  ModelConfig cfg = tiny_config(QkNorm::kNone);
  write_synthetic_model(d.path(), cfg, 1);
  ModelOptions o;
  o.max_context = 8;
  auto m = Model::load(d.path(), o);
  std::vector<float> logits(size_t(cfg.vocab_size));
  std::vector<int> bad{1, 97};
  const std::string msg = test::error_message<ConfigError>([&] { m->forward(bad, logits); });
  EXPECT_NE(msg.find("97"), std::string::npos) << msg;
  std::vector<int> nine = test_tokens(9, cfg.vocab_size);
  EXPECT_THROW(m->forward(nine, logits), ConfigError);
}

TEST(Forward, CorruptExpertPayloadIsAChecksumErrorNamingTheFile) {
  TempDir d("fwd");
  ModelConfig cfg = tiny_config(QkNorm::kPerHead, QuantType::kQ8);
  write_synthetic_model(d.path(), cfg, 9);
  const fs::path f = expert_file_path(d.path(), 1);
  ExpertFileHeader h = read_expert_header(f);
  for (uint32_t s = 0; s < h.n_experts; ++s)  // every slot: whichever the router picks
    test::overwrite_bytes(f, h.slot_offset(s) + 100, "\x5a");
  auto m = Model::load(d.path());
  std::vector<float> logits(size_t(cfg.vocab_size));
  std::vector<int> toks{1, 2};
  const std::string msg = test::error_message<FormatError>([&] { m->forward(toks, logits); });
  EXPECT_NE(msg.find(f.string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("checksum"), std::string::npos) << msg;
}

// Issue 19: resident first uses are computed while their hashes run on the pool's idle threads
// (ExpertStore::set_deferred_checks); a step returns only once they all passed.
TEST(Forward, FirstUsesHashedBesideTheirComputeGiveTheUncheckedLogitsOrAChecksumError) {
  TempDir d("fwd");
  ModelConfig cfg = tiny_config(QkNorm::kPerHead, QuantType::kQ8);
  write_synthetic_model(d.path(), cfg, 21);
  for (int l = 0; l < cfg.n_layers; ++l) (void)read_file(expert_file_path(d.path(), l));  // resident
  const std::vector<int> toks = test_tokens(7, cfg.vocab_size);
  ModelOptions checked, unchecked;
  checked.n_threads = unchecked.n_threads = 3;
  unchecked.verify_checksums = false;
  auto m = Model::load(d.path(), checked);
  const std::vector<float> got = all_logits(*m, toks);
  if (m->expert_stats().experts_in_place == 0) GTEST_SKIP() << "the expert files are not reported resident";
  EXPECT_GT(m->expert_stats().verified_in_place, 0u);  // hashed where they lie, none read
  EXPECT_EQ(m->expert_stats().experts_read, 0u);
  EXPECT_EQ(got, all_logits(*Model::load(d.path(), unchecked), toks));  // bitwise

  const fs::path f = expert_file_path(d.path(), 1);
  ExpertFileHeader h = read_expert_header(f);
  for (uint32_t s = 0; s < h.n_experts; ++s)  // every slot: whichever the router picks
    test::overwrite_bytes(f, h.slot_offset(s) + 100, "\x5a");
  (void)read_file(f);  // the corrupt bytes are in the page cache
  auto bad = Model::load(d.path(), checked);
  std::vector<float> logits(size_t(cfg.vocab_size), -1.0f);
  const std::string msg = test::error_message<FormatError>([&] { bad->forward(toks, logits); });
  EXPECT_NE(msg.find(f.string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("checksum mismatch"), std::string::npos) << msg;
  EXPECT_EQ(bad->n_past(), 0);  // the step did not complete
}

TEST(Forward, TruncatedExpertFileFailsAtLoadNamingTheFile) {
  TempDir d("fwd");
  ModelConfig cfg = tiny_config(QkNorm::kPerHead, QuantType::kQ4);
  write_synthetic_model(d.path(), cfg, 9);
  const fs::path f = expert_file_path(d.path(), 2);
  fs::resize_file(f, fs::file_size(f) - 4096);
  const std::string msg = test::error_message([&] { Model::load(d.path()); });
  EXPECT_NE(msg.find(f.string()), std::string::npos) << msg;
}

TEST(Router, PicksTopKBySoftmaxAndRenormalisesOnRequest) {
  const float logits[6] = {0.5f, 2.0f, -1.0f, 1.5f, 2.0f, 0.0f};
  float probs[6], w[3];
  int ids[3];
  route_token(logits, 6, 3, false, ids, w, probs);
  EXPECT_EQ(ids[0], 1);  // tie between 1 and 4: the lower id first
  EXPECT_EQ(ids[1], 4);
  EXPECT_EQ(ids[2], 3);
  double z = 0;
  for (float l : logits) z += std::exp(double(l));
  EXPECT_NEAR(w[0], std::exp(2.0) / z, 1e-6);
  EXPECT_NEAR(w[2], std::exp(1.5) / z, 1e-6);
  route_token(logits, 6, 3, true, ids, w, probs);
  EXPECT_NEAR(w[0] + w[1] + w[2], 1.0, 1e-6);
  EXPECT_NEAR(w[2], std::exp(1.5) / (2 * std::exp(2.0) + std::exp(1.5)), 1e-6);
}

TEST(Rope, LinearScalingDividesEveryFrequency) {
  ModelConfig c = tiny_config(QkNorm::kNone);
  c.head_dim = 16;
  std::vector<float> base = Rope(c).inv_freq(10);
  c.rope_scaling = RopeScaling{"linear", 4.0};
  std::vector<float> lin = Rope(c).inv_freq(10);
  for (size_t i = 0; i < base.size(); ++i) EXPECT_FLOAT_EQ(lin[i], base[i] / 4);
}

TEST(Rope, DynamicNtkChangesFrequenciesOnlyPastTheTrainedLength) {
  ModelConfig c = tiny_config(QkNorm::kNone);
  c.head_dim = 16;
  std::vector<float> base = Rope(c).inv_freq(10);
  c.rope_scaling = RopeScaling{"dynamic", 2.0};
  Rope r(c);
  EXPECT_EQ(r.inv_freq(c.max_position_embeddings), base);
  std::vector<float> longer = r.inv_freq(4 * c.max_position_embeddings);
  EXPECT_FLOAT_EQ(longer[0], 1.0f);  // frequency 0 is theta^0 whatever the base
  for (size_t i = 1; i < base.size(); ++i) EXPECT_LT(longer[i], base[i]);
}

TEST(Rope, YarnAndLlama3KeepHighFrequenciesAndScaleLowOnes) {
  ModelConfig c = tiny_config(QkNorm::kNone);
  c.head_dim = 64;
  c.rope_theta = 10000;
  c.max_position_embeddings = 8192;
  std::vector<float> base = Rope(c).inv_freq(1);
  for (const RopeScaling& s : {RopeScaling{"yarn", 4.0}, RopeScaling{"llama3", 8.0}}) {
    SCOPED_TRACE(s.type);
    c.rope_scaling = s;
    c.rope_scaling->original_max_position_embeddings = 2048;
    std::vector<float> scaled = Rope(c).inv_freq(1);
    EXPECT_FLOAT_EQ(scaled.front(), base.front());
    EXPECT_FLOAT_EQ(scaled.back(), base.back() / float(s.factor));
    if (s.type == "yarn") {  // YaRN also scales cos/sin by 0.1 ln(factor) + 1.
      float cs[32], sn[32];
      Rope(c).fill(0, 1, cs, sn);
      EXPECT_NEAR(cs[0], 0.1 * std::log(s.factor) + 1, 1e-6);
    }
  }
}

TEST(Generate, GreedyDecodingEqualsArgmaxOfFreshForwardPasses) {
  TempDir d("fwd");
  ModelConfig cfg = tiny_config(QkNorm::kFull, QuantType::kBF16);
  write_synthetic_model(d.path(), cfg, 21);
  auto m = Model::load(d.path());
  const std::vector<int> prompt = test_tokens(5, cfg.vocab_size);
  Sampler greedy(SamplerParams{0.0f, 0, 1.0f, 0});
  std::vector<int> got;
  GenerateOptions go;
  go.n_new = 6;
  GenerateStats st = generate(*m, prompt, go, greedy, nullptr, &got);
  ASSERT_EQ(got.size(), 6u);
  EXPECT_EQ(st.prefill.tokens, 5);
  EXPECT_EQ(st.decode.tokens, 5);
  EXPECT_GT(st.decode.times.expert_compute_s, 0.0);
  std::vector<int> seq = prompt;
  for (int i = 0; i < 6; ++i) {  // no KV cache reuse: recompute the whole sequence each step
    std::vector<float> l = all_logits(*m, seq);
    const int next = Sampler::argmax(std::span<const float>(l).subspan(
        (seq.size() - 1) * size_t(cfg.vocab_size), size_t(cfg.vocab_size)));
    EXPECT_EQ(got[size_t(i)], next) << "step " << i;
    seq.push_back(next);
  }
  go.stop_token = got[1];
  std::vector<int> stopped;
  generate(*m, prompt, go, greedy, nullptr, &stopped);
  EXPECT_EQ(stopped.size(), 2u);
}

TEST(Generate, ContinuedRunsOnlyTheNewTokensAndSaysWhatAFreshRunSays) {
  TempDir d("fwd");
  ModelConfig cfg = tiny_config(QkNorm::kFull, QuantType::kBF16);
  write_synthetic_model(d.path(), cfg, 23);
  auto m = Model::load(d.path());
  Sampler greedy(SamplerParams{0.0f, 0, 1.0f, 0});
  GenerateOptions go;
  go.n_new = 4;
  std::vector<int> cached, turn1;
  const std::vector<int> prompt1 = test_tokens(6, cfg.vocab_size, 1);
  GenerateStats st = generate_continued(*m, prompt1, cached, go, greedy, nullptr, &turn1);
  EXPECT_EQ(st.prefill.tokens, 6);
  ASSERT_EQ(turn1.size(), 4u);
  // The cache holds the prompt and the three reply tokens fed back (not the last one sampled).
  std::vector<int> expect = prompt1;
  expect.insert(expect.end(), turn1.begin(), turn1.end() - 1);
  EXPECT_EQ(cached, expect);
  EXPECT_EQ(m->n_past(), int(expect.size()));
  // Turn 2 shares the prompt and the first two reply tokens, then differs: 8 tokens reused.
  std::vector<int> prompt2(prompt1);
  prompt2.insert(prompt2.end(), turn1.begin(), turn1.begin() + 2);
  for (int t : test_tokens(3, cfg.vocab_size, 7)) prompt2.push_back(t);
  prompt2[8] = (turn1[2] + 1) % cfg.vocab_size;
  std::vector<int> turn2, fresh;
  st = generate_continued(*m, prompt2, cached, go, greedy, nullptr, &turn2);
  EXPECT_EQ(st.prefill.tokens, int(prompt2.size()) - 8);
  generate(*m, prompt2, go, greedy, nullptr, &fresh);
  EXPECT_EQ(turn2, fresh);
  // A prompt the cache holds whole still runs its last token, for the logits.
  cached = prompt2;
  m->reset();
  m->forward_argmax(prompt2);
  st = generate_continued(*m, prompt2, cached, go, greedy, nullptr, nullptr);
  EXPECT_EQ(st.prefill.tokens, 1);
  // Interrupted before the first token: nothing sampled.
  go.interrupted = [] { return true; };
  std::vector<int> none;
  generate_continued(*m, prompt2, cached, go, greedy, nullptr, &none);
  EXPECT_TRUE(none.empty());
}

TEST(Perplexity, SlidingWindowsScoreEveryTokenOnceWithTheirWindowContext) {
  TempDir d("fwd");
  ModelConfig cfg = tiny_config(QkNorm::kPerHead, QuantType::kQ8);
  write_synthetic_model(d.path(), cfg, 13);
  auto m = Model::load(d.path());
  const std::vector<int> toks = test_tokens(20, cfg.vocab_size, 3);
  const size_t V = size_t(cfg.vocab_size);
  // Direct: NLL of token i+1 from the logits at position i of the window holding the context.
  auto nll_at = [&](size_t begin, size_t end, size_t target) {
    std::vector<int> w(toks.begin() + long(begin), toks.begin() + long(end));
    std::vector<float> l = all_logits(*m, w);
    const float* row = l.data() + (target - 1 - begin) * V;
    double mx = *std::max_element(row, row + V), s = 0;
    for (size_t v = 0; v < V; ++v) s += std::exp(row[v] - mx);
    return mx + std::log(s) - row[size_t(toks[target])];
  };
  // ctx 8, stride 4: windows [0,8) [4,12) [8,16) [12,20); targets 1..7, 8..11, 12..15, 16..19.
  double want = 0;
  for (size_t t = 1; t < 20; ++t) {
    const size_t begin = t < 8 ? 0 : ((t - 8) / 4 + 1) * 4;
    want += nll_at(begin, std::min<size_t>(begin + 8, 20), t);
  }
  want /= 19;
  PerplexityResult r = perplexity(*m, toks, 8, 4);
  EXPECT_EQ(r.n_scored, 19u);
  EXPECT_EQ(r.n_windows, 4);
  EXPECT_NEAR(r.mean_nll, want, 1e-5);
  EXPECT_NEAR(r.perplexity, std::exp(want), 1e-4 * std::exp(want));
  EXPECT_THROW(perplexity(*m, toks, 8, 9), ConfigError);
}
