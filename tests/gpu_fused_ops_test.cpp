// The fused glue kernels of the decode step (issue 19): qk_norm_rope against a CPU reference in
// double and against the rms_norm + rope_neox launches it replaces; swiglu_rounded and
// gather_rounded bit for bit against the launches they replace; greedy decoding's argmax against
// its rule (Sampler::argmax's); the resident step's decode plan against the plan written on the
// host, and its combine-add-norm bit for bit against the two launches. Skips without a usable GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "kernels/cuda/gpu_ops.h"
#include "kernels/cuda/round_activations.h"
#include "tests/gpu_test_util.h"
#include "tests/support/argmax_reference.h"

namespace moestream {
namespace {

// Per-head RMSNorm (weights w [hd]) then neox RoPE at token t's cos/sin rows, in double.
std::vector<float> norm_rope_reference(const std::vector<float>& x, const std::vector<float>& w,
                                       int n_tokens, int n_heads, int hd, float eps,
                                       const std::vector<float>& cos, const std::vector<float>& sin) {
  const int half = hd / 2;
  std::vector<float> out(x.size());
  for (int t = 0; t < n_tokens; ++t)
    for (int h = 0; h < n_heads; ++h) {
      const size_t o = (size_t(t) * n_heads + h) * hd;
      double ss = 0;
      for (int i = 0; i < hd; ++i) ss += double(x[o + i]) * x[o + i];
      const double inv = 1.0 / std::sqrt(ss / hd + eps);
      for (int i = 0; i < half; ++i) {
        const double a = x[o + i] * inv * w[size_t(i)], b = x[o + i + half] * inv * w[size_t(i + half)];
        const double c = cos[size_t(t) * half + i], s = sin[size_t(t) * half + i];
        out[o + i] = float(a * c - b * s);
        out[o + i + half] = float(b * c + a * s);
      }
    }
  return out;
}

void check_qk_norm_rope(int n_tokens, int n_q, int n_k, int hd, uint32_t seed) {
  const int half = hd / 2;
  const float eps = 1e-6f;
  const auto q = random_floats(size_t(n_tokens) * n_q * hd, seed, 2.0f);
  const auto k = random_floats(size_t(n_tokens) * n_k * hd, seed + 1, 0.5f);
  auto qw = random_floats(size_t(hd), seed + 2, 0.2f), kw = random_floats(size_t(hd), seed + 3, 0.2f);
  for (float& v : qw) v += 1.0f;
  for (float& v : kw) v += 1.0f;
  std::vector<float> cos(size_t(n_tokens) * half), sin(cos.size());
  for (size_t i = 0; i < cos.size(); ++i) {
    const double a = 0.37 * double(i) + 0.1;  // angles of every size
    cos[i] = float(std::cos(a));
    sin[i] = float(std::sin(a));
  }
  DeviceVec<float> dq(q), dk(k), dqw(qw), dkw(kw), dc(cos), ds(sin), qo(q.size()), ko(k.size()),
      q2(q.size()), k2(k.size());
  gpu::qk_norm_rope(dq.get(), dk.get(), dqw.get(), dkw.get(), n_tokens, n_q, n_k, hd, eps, dc.get(),
                    ds.get(), qo.get(), ko.get(), nullptr);
  const std::string name = "qk_norm_rope hd=" + std::to_string(hd) + " heads=" +
                           std::to_string(n_q) + "/" + std::to_string(n_k) + " tokens=" +
                           std::to_string(n_tokens);
  // float32 sums of hd squares and a rotation: 2e-6 absolute plus 2e-5 relative.
  expect_close(qo.download(), norm_rope_reference(q, qw, n_tokens, n_q, hd, eps, cos, sin), 2e-6f,
               2e-5f, (name + " q").c_str());
  expect_close(ko.download(), norm_rope_reference(k, kw, n_tokens, n_k, hd, eps, cos, sin), 2e-6f,
               2e-5f, (name + " k").c_str());
  // The launches it replaces: the same sums; only FMA contraction may differ (1e-6).
  gpu::rms_norm(dq.get(), dqw.get(), n_tokens * n_q, hd, eps, q2.get(), nullptr);
  gpu::rms_norm(dk.get(), dkw.get(), n_tokens * n_k, hd, eps, k2.get(), nullptr);
  gpu::rope_neox(q2.get(), n_tokens, n_q, half, dc.get(), ds.get(), nullptr);
  gpu::rope_neox(k2.get(), n_tokens, n_k, half, dc.get(), ds.get(), nullptr);
  expect_close(qo.download(), q2.download(), 1e-6f, 1e-6f, (name + " q vs rms_norm + rope").c_str());
  expect_close(ko.download(), k2.download(), 1e-6f, 1e-6f, (name + " k vs rms_norm + rope").c_str());
}

TEST(GpuFusedOps, QkNormRopeMatchesReferenceAndTheLaunchesItReplaces) {
  SKIP_WITHOUT_GPU();
  check_qk_norm_rope(1, 32, 4, 128, 140);  // Qwen3-30B-A3B decode
  check_qk_norm_rope(7, 16, 16, 64, 141);  // a prefill chunk, MHA
  check_qk_norm_rope(3, 6, 2, 18, 142);    // the fixtures' odd-sized heads (one warp, 14 idle)
}

TEST(GpuFusedOps, QkNormRopeRejectsBadShapes) {
  SKIP_WITHOUT_GPU();
  DeviceVec<float> a(4096);
  float* p = a.get();
  EXPECT_THROW(gpu::qk_norm_rope(p, p, p, p, 1, 2, 1, 15, 1e-6f, p, p, p, p, nullptr), Error);
  EXPECT_THROW(gpu::qk_norm_rope(p, p, p, p, 1, 2, 1, 2048, 1e-6f, p, p, p, p, nullptr), Error);
  EXPECT_THROW(gpu::qk_norm_rope(p, nullptr, p, p, 1, 2, 1, 16, 1e-6f, p, p, p, p, nullptr), Error);
}

TEST(GpuFusedOps, SwigluRoundedEqualsSwigluThenRoundingBitForBit) {
  SKIP_WITHOUT_GPU();
  // q8 (one fused launch; 200 = 6 blocks + a short one), q4 (the same rounding) and bf16 (none).
  for (QuantType q : {QuantType::kQ8, QuantType::kQ4, QuantType::kBF16})
    for (auto [rows, cols] : {std::pair{3, 200}, std::pair{8, 768}}) {
      const size_t n = size_t(rows) * cols;
      auto gate = random_floats(n, 150, 3.0f), up = random_floats(n, 151);
      for (size_t i = 0; i < n; i += 97) gate[i] = up[i] = 0.0f;  // zeros and a zero block below
      for (int c = 0; c < 32 && c < cols; ++c) gate[size_t(c)] = 0.0f;
      DeviceVec<float> dg(gate), du(up), fused(n), split(n);
      gpu::swiglu_rounded(q, dg.get(), du.get(), rows, cols, fused.get(), nullptr);
      gpu::swiglu(dg.get(), du.get(), n, split.get(), nullptr);
      gpu::round_activations(q, split.get(), split.get(), rows, cols, nullptr);
      const std::string name = "swiglu_rounded " + std::string(quant_name(q)) + " " +
                               std::to_string(rows) + "x" + std::to_string(cols);
      expect_exact(fused.download(), split.download(), name.c_str());
    }
}

TEST(GpuFusedOps, GatherRoundedEqualsGatherThenRoundingBitForBit) {
  SKIP_WITHOUT_GPU();
  const int n_src = 5, cols = 200;  // 6 blocks and a short one
  const std::vector<int> idx = {4, 0, 0, 2, 4, 1, 3, 3};  // repeats, any order (a decode plan: all 0)
  const int n = int(idx.size());
  auto src = random_floats(size_t(n_src) * cols, 160, 2.0f);
  for (int c = 0; c < 32; ++c) src[size_t(2) * cols + size_t(c)] = 0.0f;  // a zero block
  DeviceVec<float> dsrc(src), fused(size_t(n) * cols), split(size_t(n) * cols);
  DeviceVec<int> didx(idx);
  ASSERT_TRUE(gpu::gather_rounded(QuantType::kQ8, dsrc.get(), didx.get(), n, cols, fused.get(), nullptr));
  gpu::gather_rows(dsrc.get(), didx.get(), n, cols, split.get(), nullptr);
  gpu::round_activations(QuantType::kQ8, split.get(), split.get(), n, cols, nullptr);
  expect_exact(fused.download(), split.download(), "gather_rounded q8 vs gather_rows + round_activations");
  // Types that do not take the pack rounding: nothing launched, false.
  EXPECT_FALSE(gpu::gather_rounded(QuantType::kBF16, dsrc.get(), didx.get(), n, cols, fused.get(), nullptr));
  EXPECT_FALSE(gpu::gather_rounded(ggml_quant(GgmlType::kQ8_0), dsrc.get(), didx.get(), n, cols,
                                   fused.get(), nullptr));
}

// One state for every call, as a stream's owner keeps it: each launch must leave it zeroed.
int gpu_argmax(const std::vector<float>& v) {
  static DeviceVec<gpu::ArgmaxState> state(std::vector<gpu::ArgmaxState>(1, gpu::ArgmaxState{}));
  DeviceVec<float> d(v);
  gpu::argmax(d.get(), int(v.size()), state.get(), nullptr);
  const gpu::ArgmaxState st = state.download()[0];
  EXPECT_EQ(st.best, 0u) << "argmax left its state dirty";
  EXPECT_EQ(st.done, 0u) << "argmax left its state dirty";
  return st.id;
}

TEST(GpuFusedOps, ArgmaxTakesTheFirstOfTheLargestAndSkipsNaN) {
  SKIP_WITHOUT_GPU();
  for (int n : {1, 31, 1024, 1025, 5000, 151936}) {
    SCOPED_TRACE(n);
    const auto v = random_floats(size_t(n), 170 + uint32_t(n), 3.0f);
    const int first = test::argmax_reference(v);
    EXPECT_EQ(gpu_argmax(v), first);
    // Ties with the maximum: before it, later in the same thread's share (1024 on), in the next
    // thread, and at the end.
    for (int at : {first / 2, std::min(n - 1, first + 1024), std::min(n - 1, first + 1), n - 1}) {
      auto t = v;
      t[size_t(at)] = t[size_t(first)];
      EXPECT_EQ(gpu_argmax(t), std::min(at, first)) << "tie at " << at;
    }
    auto nan = v;
    nan[0] = NAN;
    if (n > 1) nan[size_t(first == n - 1 ? n - 2 : first + 1)] = NAN;
    EXPECT_EQ(gpu_argmax(nan), test::argmax_reference(nan));
  }
  const float inf = INFINITY;
  EXPECT_EQ(gpu_argmax({NAN, -inf, -inf}), 1);
  EXPECT_EQ(gpu_argmax({NAN, NAN}), 0);
  EXPECT_EQ(gpu_argmax(std::vector<float>(3000, -inf)), 0);
  std::vector<float> late(3000, -inf);
  late[2500] = inf;
  late[2999] = inf;
  EXPECT_EQ(gpu_argmax(late), 2500);
  // -0 and +0 are equal: the first wins (the keys must not order them). Many blocks: a row of
  // a million values with its maximum in the last block and a tie in the first.
  EXPECT_EQ(gpu_argmax({-1.0f, -0.0f, 0.0f, -2.0f}), 1);
  EXPECT_EQ(gpu_argmax({-1.0f, 0.0f, -0.0f}), 1);
  std::vector<float> big(1 << 20, -5.0f);
  big.back() = 7.0f;
  EXPECT_EQ(gpu_argmax(big), int(big.size()) - 1);
  big[3] = 7.0f;
  EXPECT_EQ(gpu_argmax(big), 3);
  DeviceVec<float> a(4);
  DeviceVec<gpu::ArgmaxState> out(1);
  EXPECT_THROW(gpu::argmax(a.get(), 0, out.get(), nullptr), Error);
  EXPECT_THROW(gpu::argmax(a.get(), 4, nullptr, nullptr), Error);
}

// moe_plan_decode against the plan built here: groups in ascending id (equal ids in their order
// of choice), pair_row the group of each choice, ptrs from the table, fallback and *miss for an
// absent, out-of-range or repeated expert, x copied to x_snap.
TEST(GpuFusedOps, MoePlanDecodeLaysOutTheHostsPlan) {
  SKIP_WITHOUT_GPU();
  const int n_experts = 128, dim = 300;
  std::vector<const uint8_t*> table(static_cast<size_t>(n_experts));
  for (int e = 0; e < n_experts; ++e)
    table[size_t(e)] = e % 9 == 4 ? nullptr : reinterpret_cast<const uint8_t*>(uintptr_t(0x10000 + 64 * e));
  const auto* fallback = reinterpret_cast<const uint8_t*>(uintptr_t(0x999900));
  const auto x = random_floats(size_t(dim), 180);
  DeviceVec<const uint8_t*> dtable(table);
  DeviceVec<float> dx(x);
  struct Case {
    std::vector<int> ids;
    bool miss;
  };
  for (const Case& c : {Case{{77, 3, 120, 5, 64, 0, 9, 100}, false},
                        Case{{77, 3, 120, 5, 64, 0, 9, 22}, true},   // 22 % 9 == 4: absent
                        Case{{77, 3, 77, 5}, true},                  // repeated
                        Case{{7, 128, 2}, true},                     // out of range
                        Case{std::vector<int>(64, 1), true}}) {      // k at its limit
    const int k = int(c.ids.size());
    SCOPED_TRACE(k);
    const size_t n = c.ids.size();
    DeviceVec<int> dids(c.ids), gather(n), pair(n), start(n + 1), miss(1);
    DeviceVec<const uint8_t*> ptrs(n);
    DeviceVec<float> snap(static_cast<size_t>(dim));
    gpu::moe_plan_decode(dids.get(), k, dtable.get(), n_experts, fallback, gather.get(), pair.get(), start.get(),
                         ptrs.get(), miss.get(), dx.get(), snap.get(), dim, nullptr);
    std::vector<int> order(n);
    for (int j = 0; j < k; ++j) order[size_t(j)] = j;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return c.ids[size_t(a)] < c.ids[size_t(b)]; });
    const auto got_pair = pair.download(), got_start = start.download(), got_gather = gather.download();
    const auto got_ptrs = ptrs.download();
    for (int g = 0; g < k; ++g) {
      const int j = order[size_t(g)], e = c.ids[size_t(j)];
      const bool repeated = g > 0 && c.ids[size_t(order[size_t(g - 1)])] == e;
      const uint8_t* want = e < 0 || e >= n_experts || repeated || !table[size_t(e)] ? fallback : table[size_t(e)];
      EXPECT_EQ(got_pair[size_t(j)], g);
      EXPECT_EQ(got_start[size_t(g)], g);
      EXPECT_EQ(got_gather[size_t(g)], 0);
      EXPECT_EQ(got_ptrs[size_t(g)], want) << "group " << g;
    }
    EXPECT_EQ(got_start[size_t(k)], k);
    EXPECT_EQ(miss.download()[0], c.miss ? 1 : 0);
    expect_exact(snap.download(), x, "x_snap");
  }
}

TEST(GpuFusedOps, CombineAddNormEqualsCombineAddThenRmsNormBitForBit) {
  SKIP_WITHOUT_GPU();
  for (auto [k, dim] : {std::pair{8, 2048}, std::pair{1, 2048}, std::pair{4, 300}, std::pair{8, 7168}}) {
    const std::string name = "combine_add_norm k=" + std::to_string(k) + " dim=" + std::to_string(dim);
    const auto y = random_floats(size_t(k + 2) * dim, 190, 0.5f);  // more rows than groups
    const auto x0 = random_floats(size_t(dim), 191, 2.0f);
    auto w = random_floats(size_t(dim), 192, 0.2f);
    for (float& v : w) v += 1.0f;
    std::vector<int> rows(static_cast<size_t>(k));
    for (int j = 0; j < k; ++j) rows[size_t(j)] = (3 * j + 1) % (k + 2);  // any rows, any order
    auto wts = random_floats(size_t(k), 193, 0.3f);
    const size_t n = static_cast<size_t>(dim);
    DeviceVec<float> dy(y), dw(w), dwts(wts), fused_x(x0), split_x(x0), fused_h(n), split_h(n);
    DeviceVec<int> dpair(rows);
    gpu::moe_combine_add_norm(dy.get(), dpair.get(), dwts.get(), k, dim, fused_x.get(), dw.get(), 1e-6f,
                              fused_h.get(), nullptr);
    gpu::moe_combine_add(dy.get(), dpair.get(), dwts.get(), 1, k, dim, split_x.get(), nullptr);
    gpu::rms_norm(split_x.get(), dw.get(), 1, dim, 1e-6f, split_h.get(), nullptr);
    expect_exact(fused_x.download(), split_x.download(), (name + " x").c_str());
    expect_exact(fused_h.download(), split_h.download(), (name + " h").c_str());
  }
  DeviceVec<float> a(16);
  DeviceVec<int> p(1);
  EXPECT_THROW(gpu::moe_combine_add_norm(a.get(), p.get(), a.get(), 0, 16, a.get(), a.get(), 1e-6f, a.get(), nullptr), Error);
  EXPECT_THROW(gpu::moe_combine_add_norm(a.get(), nullptr, a.get(), 1, 16, a.get(), a.get(), 1e-6f, a.get(), nullptr), Error);
}

}  // namespace
}  // namespace moestream
