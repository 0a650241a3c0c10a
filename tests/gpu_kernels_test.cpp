// Each CUDA kernel of kernels/ against a CPU reference on random data at odd sizes, with the
// tolerance stated per test. Skips (with the reason) on a machine without a usable GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "tests/gpu_test_util.h"
#include "kernels/cuda/gpu_ops.h"
#include "loader/format/expert_file.h"
#include "runtime/model/dense_ops.h"
#include "loader/format/model_config.h"
#include "runtime/model/expert_compute.h"  // clamped_swiglu
#include "runtime/model/routing.h"
#include "kernels/cpu/quant.h"
#include "runtime/model/rope.h"
#include "tests/support/router_params.h"

namespace moestream {
namespace {

TEST(GpuKernels, RmsNormMatchesCpuAtOddSizes) {
  SKIP_WITHOUT_GPU();
  const int rows = 5, n = 2047;
  auto x = random_floats(size_t(rows) * n, 1, 3.0f), w = random_floats(n, 2);
  std::vector<float> ref(x.size());
  for (int r = 0; r < rows; ++r) rms_norm(x.data() + r * n, w.data(), n, 1e-6f, ref.data() + r * n);
  DeviceVec<float> dx(x), dw(w), dout(x.size());
  gpu::rms_norm(dx.get(), dw.get(), rows, n, 1e-6f, dout.get(), nullptr);
  // Tolerance: float32 sums in a different order; 1e-5 relative covers 2047 terms.
  expect_close(dout.download(), ref, 1e-6f, 1e-5f, "rms_norm");
}

TEST(GpuKernels, RopeNeoxMatchesCpuRopeApply) {
  SKIP_WITHOUT_GPU();
  ModelConfig cfg;
  cfg.head_dim = 94;  // odd half (47)
  cfg.rope_theta = 1e6;
  cfg.max_position_embeddings = 4096;
  Rope rope(cfg);
  const int n_tokens = 7, n_heads = 3, half = rope.half_dim();
  std::vector<float> cos(size_t(n_tokens) * half), sin(cos.size());
  rope.fill(1000, n_tokens, cos.data(), sin.data());  // large positions: angles far from 0
  auto x = random_floats(size_t(n_tokens) * n_heads * 2 * half, 3);
  std::vector<float> ref = x;
  for (int t = 0; t < n_tokens; ++t)
    for (int h = 0; h < n_heads; ++h)
      Rope::apply(ref.data() + (size_t(t) * n_heads + h) * 2 * half, cos.data() + size_t(t) * half,
                  sin.data() + size_t(t) * half, half);
  DeviceVec<float> dx(x), dc(cos), ds(sin);
  gpu::rope_neox(dx.get(), n_tokens, n_heads, half, dc.get(), ds.get(), nullptr);
  // Same float ops per element; only FMA contraction differs: 1e-6 absolute, 1e-6 relative.
  expect_close(dx.download(), ref, 1e-6f, 1e-6f, "rope_neox");
}

TEST(GpuKernels, PartialRopeRotatesOnlyTheFirstDimsOfEachHead) {
  SKIP_WITHOUT_GPU();
  ModelConfig cfg;
  cfg.head_dim = 38;
  cfg.rotary_dim = 18;  // GLM's partial rotary: 9 pairs of 38 dims, odd half
  cfg.rope_theta = 1e4;
  cfg.max_position_embeddings = 4096;
  Rope rope(cfg);
  const int n_tokens = 5, n_heads = 3, half = rope.half_dim(), hd = cfg.head_dim;
  ASSERT_EQ(half, 9);
  std::vector<float> cos(size_t(n_tokens) * half), sin(cos.size());
  rope.fill(321, n_tokens, cos.data(), sin.data());
  auto x = random_floats(size_t(n_tokens) * n_heads * hd, 5);
  std::vector<float> ref = x;
  for (int t = 0; t < n_tokens; ++t)
    for (int h = 0; h < n_heads; ++h)
      Rope::apply(ref.data() + (size_t(t) * n_heads + h) * hd, cos.data() + size_t(t) * half,
                  sin.data() + size_t(t) * half, half);
  DeviceVec<float> dx(x), dc(cos), ds(sin);
  gpu::rope_neox_partial(dx.get(), n_tokens, n_heads, half, hd, dc.get(), ds.get(), nullptr);
  const std::vector<float> got = dx.download();
  expect_close(got, ref, 1e-6f, 1e-6f, "rope_neox_partial");
  for (size_t i = 0; i < got.size(); ++i) {
    if (int(i % size_t(hd)) >= 2 * half) EXPECT_EQ(got[i], x[i]) << "pass-through dim " << i;  // bitwise
  }
}

TEST(GpuKernels, RouterTopkMatchesRouteToken) {
  SKIP_WITHOUT_GPU();
  const int n_tokens = 9, n_experts = 97, k = 7;
  auto logits = random_floats(size_t(n_tokens) * n_experts, 4, 2.0f);
  for (bool normalize : {false, true}) {
    std::vector<int> ref_ids(size_t(n_tokens) * k);
    std::vector<float> ref_w(ref_ids.size()), probs(n_experts);
    for (int t = 0; t < n_tokens; ++t)
      route_token(logits.data() + size_t(t) * n_experts, n_experts, k, normalize,
                  ref_ids.data() + size_t(t) * k, ref_w.data() + size_t(t) * k, probs.data());
    DeviceVec<float> dl(logits), dw(ref_w.size());
    DeviceVec<int> di(ref_ids.size());
    gpu::router_topk(dl.get(), n_tokens, n_experts, k, normalize, di.get(), dw.get(), nullptr);
    EXPECT_EQ(di.download(), ref_ids) << "normalize=" << normalize;
    // expf vs std::exp differ by <= 2 ulp per term: 1e-5 relative on the weights.
    expect_close(dw.download(), ref_w, 1e-7f, 1e-5f, normalize ? "router_topk norm" : "router_topk");
  }
}

TEST(GpuKernels, RouterTopkBreaksTiesTowardLowerId) {
  SKIP_WITHOUT_GPU();
  const int n_experts = 70, k = 4;
  std::vector<float> logits(n_experts, 0.5f);  // all equal: ids 0..3 expected
  logits[66] = 1.0f;                           // then the unique maximum comes first
  DeviceVec<float> dl(logits), dw(k);
  DeviceVec<int> di(k);
  gpu::router_topk(dl.get(), 1, n_experts, k, false, di.get(), dw.get(), nullptr);
  EXPECT_EQ(di.download(), (std::vector<int>{66, 0, 1, 2}));
}

// A grouped router's shape, as the grouped router tests sweep it.
struct GroupedCase {
  int experts, k, groups, keep;
  bool normalize;
  float scaling;
  // The CPU router's parameters for this shape and `scoring`.
  RouterParams params(RouterScoring scoring) const {
    return test::grouped_router(scoring, experts, k, groups, keep, normalize, scaling);
  }
};

// Against routing.h: DeepSeek-V3's grouping (8 groups, 4 kept, top-8 of 256) and GLM's (one
// group), with a correction bias large enough to change the selection, and the scaling.
TEST(GpuKernels, RouterGroupedMatchesTheCpuRouter) {
  SKIP_WITHOUT_GPU();
  for (const GroupedCase c : {GroupedCase{256, 8, 8, 4, true, 2.5f}, GroupedCase{128, 8, 1, 1, true, 1.0f},
                              GroupedCase{64, 6, 4, 2, false, 1.5f}}) {
    const int n_tokens = 11;
    const RouterParams p = c.params(RouterScoring::kSigmoid);
    auto logits = random_floats(size_t(n_tokens) * c.experts, 5, 2.0f);
    auto bias = random_floats(size_t(c.experts), 6, 0.3f);
    std::vector<int> ref_ids(size_t(n_tokens) * c.k);
    std::vector<float> ref_w(ref_ids.size()), scratch(p.scratch_floats());
    for (int t = 0; t < n_tokens; ++t)
      route_sigmoid_grouped(p, logits.data() + size_t(t) * c.experts, bias.data(),
                            ref_ids.data() + size_t(t) * c.k, ref_w.data() + size_t(t) * c.k, scratch);
    DeviceVec<float> dl(logits), db(bias), dw(ref_w.size());
    DeviceVec<int> di(ref_ids.size());
    gpu::router_grouped(dl.get(), db.get(), n_tokens, c.experts, c.k, c.groups, c.keep, c.normalize,
                        c.scaling, di.get(), dw.get(), nullptr);
    EXPECT_EQ(di.download(), ref_ids) << c.experts << " experts, " << c.groups << " groups";
    expect_close(dw.download(), ref_w, 1e-7f, 1e-5f, "router_grouped");  // expf vs std::exp
  }
  DeviceVec<float> d(std::vector<float>(8, 0.f));
  DeviceVec<int> di(8);
  EXPECT_THROW(gpu::router_grouped(d.get(), nullptr, 1, 8, 2, 3, 1, true, 1.f, di.get(), d.get(), nullptr),
               Error);  // 8 experts do not split into 3 groups
}

// Against routing.h route_softmax_grouped: DeepSeek-V2's grouping (160 experts in 8 groups, 3
// kept, top-6, scaling 16), the fixture's (12 in 4, 2 kept, top-3, 2.5), odd group sizes with
// renormalisation, and one group (the plain softmax top-k, scaled).
TEST(GpuKernels, RouterGroupedSoftmaxMatchesTheCpuRouter) {
  SKIP_WITHOUT_GPU();
  for (const GroupedCase c : {GroupedCase{160, 6, 8, 3, false, 16.0f}, GroupedCase{12, 3, 4, 2, false, 2.5f},
                              GroupedCase{63, 5, 7, 2, true, 1.0f}, GroupedCase{64, 6, 1, 1, false, 2.0f}}) {
    const int n_tokens = 13;
    const RouterParams p = c.params(RouterScoring::kSoftmax);
    auto logits = random_floats(size_t(n_tokens) * c.experts, 7, 3.0f);
    std::vector<int> ref_ids(size_t(n_tokens) * c.k);
    std::vector<float> ref_w(ref_ids.size()), scratch(p.scratch_floats());
    for (int t = 0; t < n_tokens; ++t)
      route_softmax_grouped(p, logits.data() + size_t(t) * c.experts, ref_ids.data() + size_t(t) * c.k,
                            ref_w.data() + size_t(t) * c.k, scratch);
    DeviceVec<float> dl(logits), dw(ref_w.size());
    DeviceVec<int> di(ref_ids.size());
    gpu::router_grouped_softmax(dl.get(), n_tokens, c.experts, c.k, c.groups, c.keep, c.normalize, c.scaling,
                                di.get(), dw.get(), nullptr);
    EXPECT_EQ(di.download(), ref_ids) << c.experts << " experts, " << c.groups << " groups";
    expect_close(dw.download(), ref_w, 1e-7f, 1e-5f, "router_grouped_softmax");  // warp vs sequential sum
  }
  DeviceVec<float> d(std::vector<float>(12, 0.f));
  DeviceVec<int> di(12);
  EXPECT_THROW(gpu::router_grouped_softmax(d.get(), 1, 12, 3, 5, 1, false, 1.f, di.get(), d.get(), nullptr),
               Error);  // 12 experts do not split into 5 groups
  EXPECT_THROW(gpu::router_grouped_softmax(d.get(), 1, 12, 4, 4, 1, false, 1.f, di.get(), d.get(), nullptr),
               Error);  // one kept group of 3 cannot hold 4
}

TEST(GpuKernels, SwigluMatchesCpu) {
  SKIP_WITHOUT_GPU();
  const size_t n = 3 * 1000 + 7;
  auto g = random_floats(n, 5, 4.0f), u = random_floats(n, 6);
  std::vector<float> ref(n);
  for (size_t i = 0; i < n; ++i) ref[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  DeviceVec<float> dg(g), du(u), dout(n);
  gpu::swiglu(dg.get(), du.get(), n, dout.get(), nullptr);
  expect_close(dout.download(), ref, 1e-7f, 1e-5f, "swiglu");  // expf: <= 2 ulp
}

// Reference for the matvec kernels: the matrix decoded by dequantize_matrix, summed in double.
// The GPU keeps activations in float32, so the comparison isolates the kernel's decoding and
// summation from the CPU path's own int8 activation rounding (checked loosely below).
void check_matvec(QuantType q, int rows, int cols, uint32_t seed) {
  auto wf = random_floats(size_t(rows) * cols, seed, 0.05f);
  auto x = random_floats(size_t(cols), seed + 1);
  std::vector<uint8_t> w(quant_matrix_bytes(q, size_t(rows), size_t(cols)));
  quantize_matrix(q, wf.data(), size_t(rows), size_t(cols), w.data());
  std::vector<float> deq(wf.size());
  dequantize_matrix(q, w.data(), size_t(rows), size_t(cols), deq.data());
  std::vector<float> ref(static_cast<size_t>(rows)), cpu(static_cast<size_t>(rows));
  for (int r = 0; r < rows; ++r) {
    double acc = 0;
    for (int c = 0; c < cols; ++c) acc += double(deq[size_t(r) * cols + c]) * x[size_t(c)];
    ref[size_t(r)] = float(acc);
  }
  quant_matvec(q, w.data(), size_t(cols), x.data(), cpu.data(), 0, size_t(rows));
  DeviceVec<uint8_t> dw(w);
  DeviceVec<float> dx(x), dy(static_cast<size_t>(rows));
  gpu::expert_matvec(q, dw.get(), rows, cols, dx.get(), dy.get(), nullptr);
  auto y = dy.download();
  const std::string name = "expert_matvec_" + std::string(quant_name(q));
  // Exact weights, float32 sums of `cols` terms: 1e-4 relative plus 1e-4 * ||row|| ||x|| scale.
  expect_close(y, ref, 2e-4f, 1e-4f, name.c_str());
  // Against the CPU path (int8 activations, ~0.4% per block): a loose, stated 3% + 0.05 bound.
  expect_close(y, cpu, 5e-2f, 3e-2f, (name + " vs quant_matvec").c_str());
}

TEST(GpuKernels, ExpertMatvecQ8MatchesDequantisedReference) {
  SKIP_WITHOUT_GPU();
  check_matvec(QuantType::kQ8, 301, 1000, 10);  // 1000 = 31 blocks + a partial one
  check_matvec(QuantType::kQ8, 7, 33, 11);
}

TEST(GpuKernels, ExpertMatvecQ4MatchesDequantisedReference) {
  SKIP_WITHOUT_GPU();
  check_matvec(QuantType::kQ4, 301, 1000, 12);
  check_matvec(QuantType::kQ4, 9, 17, 13);  // one partial block
}

TEST(GpuKernels, ExpertMatvecBf16MatchesDequantisedReference) {
  SKIP_WITHOUT_GPU();
  check_matvec(QuantType::kBF16, 301, 999, 14);
}

// ---- attention -------------------------------------------------------------------------------

// Causal GQA attention in double over the position-major cache [max_ctx, n_kv, hd], as
// runtime/model/attention.cpp computes it per head (scores * scale, max-subtracted softmax, P V).
std::vector<float> attention_reference(const std::vector<float>& q, const std::vector<float>& k,
                                       const std::vector<float>& v, int n_q, int pos0, int n_heads,
                                       int n_kv, int hd, float scale) {
  const int group = n_heads / n_kv;
  std::vector<float> out(size_t(n_q) * n_heads * hd);
  std::vector<double> s(size_t(pos0 + n_q));
  for (int t = 0; t < n_q; ++t)
    for (int h = 0; h < n_heads; ++h) {
      const int g = h / group, len = pos0 + t + 1;
      const float* qh = q.data() + (size_t(t) * n_heads + h) * hd;
      double mx = -1e300;
      for (int j = 0; j < len; ++j) {
        const float* kj = k.data() + (size_t(j) * n_kv + g) * hd;
        double dot = 0;
        for (int d = 0; d < hd; ++d) dot += double(qh[d]) * kj[d];
        s[size_t(j)] = dot * scale;
        mx = std::max(mx, s[size_t(j)]);
      }
      double sum = 0;
      for (int j = 0; j < len; ++j) sum += (s[size_t(j)] = std::exp(s[size_t(j)] - mx));
      for (int d = 0; d < hd; ++d) {
        double o = 0;
        for (int j = 0; j < len; ++j) o += s[size_t(j)] * v[(size_t(j) * n_kv + g) * hd + d];
        out[(size_t(t) * n_heads + h) * hd + d] = float(o / sum);
      }
    }
  return out;
}

// Random q, K, V (q scaled by 2 so the softmax is peaked, not flat); cache positions past
// pos0 + n_q hold NaN, so reading beyond the causal limit would poison the output.
void check_attention(int n_q, int pos0, int n_heads, int n_kv, int hd, uint32_t seed) {
  const int max_ctx = pos0 + n_q + 37;
  auto q = random_floats(size_t(n_q) * n_heads * hd, seed, 2.0f);
  auto k = random_floats(size_t(max_ctx) * n_kv * hd, seed + 1);
  auto v = random_floats(k.size(), seed + 2);
  for (size_t i = size_t(pos0 + n_q) * n_kv * hd; i < k.size(); ++i) k[i] = v[i] = NAN;
  const float scale = 1.0f / std::sqrt(float(hd));
  auto ref = attention_reference(q, k, v, n_q, pos0, n_heads, n_kv, hd, scale);
  DeviceVec<float> dq(q), dk(k), dv(v), dout(ref.size());
  CUDA_OK(cudaMemset(dout.get(), 0xff, ref.size() * sizeof(float)));  // NaN: unwritten shows
  gpu::attention(dq.get(), dk.get(), dv.get(), n_q, pos0, n_heads, n_kv, hd, scale, dout.get(),
                 nullptr);
  const std::string name = "attention hd=" + std::to_string(hd) + " heads=" +
                           std::to_string(n_heads) + "/" + std::to_string(n_kv) + " n_q=" +
                           std::to_string(n_q) + " ctx=" + std::to_string(pos0 + n_q);
  // float32 dot products of hd terms and sums over up to 5000 keys, one expf per score:
  // 1e-5 absolute (outputs are averages of unit-variance values) plus 2e-4 relative.
  expect_close(dout.download(), ref, 1e-5f, 2e-4f, name.c_str());
}

TEST(GpuKernels, AttentionDecodeMatchesCpuAtModelShapes) {
  SKIP_WITHOUT_GPU();
  for (int ctx : {1, 17, 1000, 5000}) check_attention(1, ctx - 1, 32, 4, 128, 20 + ctx);  // Qwen3
  check_attention(1, 999, 16, 16, 64, 21);   // multi-head (OLMoE-like), head_dim 64
  check_attention(1, 1500, 64, 4, 128, 22);  // a 16-head group in one block
}

TEST(GpuKernels, AttentionPrefillIsCausalAtOddSizes) {
  SKIP_WITHOUT_GPU();
  check_attention(17, 0, 32, 4, 128, 30);   // a prompt from position 0
  check_attention(33, 1000, 16, 16, 64, 31);  // a chunk after 1000 cached positions
  check_attention(5, 17, 6, 2, 72, 32);     // odd head_dim (18 float4s per key row)
  check_attention(3, 40, 8, 1, 256, 33);    // the largest head_dim, MQA
}

// ---- grouped expert GEMM ----------------------------------------------------------------------

// Groups of `sizes` token rows against distinct random experts stored at `offset` inside their
// payloads (junk before it). Reference: the dequantised matrices times x, summed in double.
void check_expert_gemm(QuantType q, int rows, int cols, const std::vector<int>& sizes,
                       uint32_t seed, int max_rows_hint = 0) {
  const int n_groups = int(sizes.size());
  const std::vector<int> row_start = group_row_starts(sizes);
  const int n_rows = row_start.back();
  const size_t offset = 192, mbytes = quant_matrix_bytes(q, size_t(rows), size_t(cols));
  const size_t stride = (offset + mbytes + 255) / 256 * 256;
  std::vector<uint8_t> payloads(stride * size_t(n_groups));
  std::mt19937 rng(seed);
  for (auto& b : payloads) b = uint8_t(rng());
  std::vector<std::vector<float>> deq;
  for (int g = 0; g < n_groups; ++g) {
    auto wf = random_floats(size_t(rows) * cols, seed + 10 + g, 0.05f);
    uint8_t* m = payloads.data() + stride * size_t(g) + offset;
    quantize_matrix(q, wf.data(), size_t(rows), size_t(cols), m);
    deq.emplace_back(wf.size());
    dequantize_matrix(q, m, size_t(rows), size_t(cols), deq.back().data());
  }
  auto x = random_floats(size_t(std::max(n_rows, 1)) * cols, seed + 1);
  std::vector<float> ref(size_t(n_rows) * rows);
  for (int g = 0; g < n_groups; ++g)
    for (int t = row_start[size_t(g)]; t < row_start[size_t(g) + 1]; ++t)
      for (int r = 0; r < rows; ++r) {
        double acc = 0;
        for (int c = 0; c < cols; ++c)
          acc += double(deq[size_t(g)][size_t(r) * cols + c]) * x[size_t(t) * cols + c];
        ref[size_t(t) * rows + r] = float(acc);
      }
  const DeviceGroups groups(payloads, stride, row_start);
  DeviceVec<float> dx(x), dy(ref.size());
  CUDA_OK(cudaMemset(dy.get(), 0xff, ref.size() * sizeof(float)));
  const int max_rows =
      max_rows_hint > 0 ? max_rows_hint : *std::max_element(sizes.begin(), sizes.end());
  gpu::expert_gemm(q, groups.weights(), offset, groups.row_start(), n_groups, max_rows, rows, cols, dx.get(),
                   dy.get(), nullptr);
  std::string name = "expert_gemm_" + std::string(quant_name(q)) + " " + std::to_string(rows) +
                     "x" + std::to_string(cols) + " groups";
  for (int n : sizes) {
    name += ' ';  // not " " + to_string: GCC 12 warns (-Wrestrict, a known false positive)
    name += std::to_string(n);
  }
  if (max_rows_hint > 0) name += " tile " + std::to_string(max_rows_hint);
  // As the matvec: exact weights, float32 sums of `cols` terms.
  expect_close(dy.download(), ref, 2e-4f, 1e-4f, name.c_str());
}

TEST(GpuKernels, ExpertGemmQ8MatchesDequantisedReference) {
  SKIP_WITHOUT_GPU();
  check_expert_gemm(QuantType::kQ8, 67, 96, {1, 3, 0, 17, 64}, 40);  // nb 3: unaligned rows
  check_expert_gemm(QuantType::kQ8, 45, 256, {1, 1, 1, 1, 1, 1, 1, 1}, 41);  // decode
  check_expert_gemm(QuantType::kQ8, 130, 2048, {3, 17}, 42);
}

TEST(GpuKernels, ExpertGemmQ4MatchesDequantisedReference) {
  SKIP_WITHOUT_GPU();
  check_expert_gemm(QuantType::kQ4, 67, 96, {1, 3, 0, 17, 64}, 43);
  check_expert_gemm(QuantType::kQ4, 45, 256, {1, 1, 1, 1, 1, 1, 1, 1}, 44);
  check_expert_gemm(QuantType::kQ4, 130, 800, {3, 17}, 45);  // nb 25, 8-block steps past the row
}

TEST(GpuKernels, ExpertGemmBf16MatchesDequantisedReferenceAtOddCols) {
  SKIP_WITHOUT_GPU();
  check_expert_gemm(QuantType::kBF16, 67, 45, {1, 3, 17, 64}, 46);
  check_expert_gemm(QuantType::kBF16, 45, 67, {1, 1, 1}, 47);
  check_expert_gemm(QuantType::kBF16, 33, 200, {5, 0, 9}, 48);  // cols % 4 == 0: 8-byte loads
}

TEST(GpuKernels, ExpertGemmTileHintOnlyChangesSpeed) {
  SKIP_WITHOUT_GPU();
  // max_rows_per_group picks the token tile; a hint below the largest group is still correct.
  check_expert_gemm(QuantType::kQ8, 40, 128, {5, 20, 2}, 49, 1);
  check_expert_gemm(QuantType::kQ4, 40, 128, {5, 20, 2}, 50, 2);
}

TEST(GpuKernels, ExpertGemmSingleRowGroupsMatchExpertMatvec) {
  SKIP_WITHOUT_GPU();
  for (QuantType q : {QuantType::kQ8, QuantType::kQ4, QuantType::kBF16}) {
    const int rows = 77, cols = 512, n_groups = 3;
    const size_t mbytes = quant_matrix_bytes(q, rows, cols), stride = (mbytes + 255) / 256 * 256;
    std::vector<uint8_t> w(stride * n_groups);
    for (int g = 0; g < n_groups; ++g) {
      auto wf = random_floats(size_t(rows) * cols, 60 + g, 0.05f);
      quantize_matrix(q, wf.data(), rows, cols, w.data() + stride * size_t(g));
    }
    auto x = random_floats(size_t(n_groups) * cols, 63);
    DeviceVec<uint8_t> dw(w);
    DeviceVec<float> dx(x), dy(size_t(n_groups) * rows), dm(size_t(n_groups) * rows);
    std::vector<const uint8_t*> ptrs;
    for (int g = 0; g < n_groups; ++g) {
      ptrs.push_back(dw.get() + stride * size_t(g));
      gpu::expert_matvec(q, ptrs.back(), rows, cols, dx.get() + size_t(g) * cols,
                         dm.get() + size_t(g) * rows, nullptr);
    }
    DeviceVec<const uint8_t*> dptrs(ptrs);
    DeviceVec<int> drs(std::vector<int>{0, 1, 2, 3});
    gpu::expert_gemm(q, dptrs.get(), 0, drs.get(), n_groups, 1, rows, cols, dx.get(), dy.get(),
                     nullptr);
    // Both float32 over the same weights, summed in another order: 1e-5 relative.
    expect_close(dy.download(), dm.download(), 1e-5f, 1e-5f,
                 ("expert_gemm_" + std::string(quant_name(q)) + " vs expert_matvec").c_str());
  }
}

// ---- row glue ---------------------------------------------------------------------------------

TEST(GpuKernels, GatherAndEmbedCopyTheIndexedRows) {
  SKIP_WITHOUT_GPU();
  const int n_src = 50, dim = 129, n = 37;
  auto src = random_floats(size_t(n_src) * dim, 70);
  std::mt19937 rng(71);
  std::vector<int> idx(n);
  for (int& i : idx) i = int(rng() % n_src);  // repeats included
  std::vector<float> ref(size_t(n) * dim);
  for (int i = 0; i < n; ++i)
    std::copy_n(src.begin() + ptrdiff_t(idx[size_t(i)]) * dim, dim,
                ref.begin() + ptrdiff_t(i) * dim);
  DeviceVec<float> ds(src), dout(ref.size()), demb(ref.size());
  DeviceVec<int> di(idx);
  gpu::gather_rows(ds.get(), di.get(), n, dim, dout.get(), nullptr);
  gpu::embed_rows(ds.get(), di.get(), n, dim, demb.get(), nullptr);
  expect_exact(dout.download(), ref, "gather_rows");  // a copy: bit-exact
  expect_exact(demb.download(), ref, "embed_rows");
}

TEST(GpuKernels, MoeCombineSumsInTopkOrder) {
  SKIP_WITHOUT_GPU();
  const int n_tokens = 13, k = 8, dim = 131, n_rows = n_tokens * k;
  auto y = random_floats(size_t(n_rows) * dim, 72);
  auto wts = random_floats(size_t(n_tokens) * k, 73, 0.3f);
  std::vector<int> pair_row(static_cast<size_t>(n_rows));
  for (int i = 0; i < n_rows; ++i) pair_row[size_t(i)] = i;
  std::shuffle(pair_row.begin(), pair_row.end(), std::mt19937(74));  // rows grouped by expert
  std::vector<float> ref(size_t(n_tokens) * dim, 0.f);
  for (int t = 0; t < n_tokens; ++t)  // the CPU's order: from zero, j = 0..k-1
    for (int d = 0; d < dim; ++d) {
      float acc = 0.f;
      for (int j = 0; j < k; ++j)
        acc += wts[size_t(t) * k + j] * y[size_t(pair_row[size_t(t) * k + j]) * dim + d];
      ref[size_t(t) * dim + d] = acc;
    }
  DeviceVec<float> dy(y), dwt(wts), dout(ref.size());
  DeviceVec<int> dpr(pair_row);
  gpu::moe_combine(dy.get(), dpr.get(), dwt.get(), n_tokens, k, dim, dout.get(), nullptr);
  // Same order; only FMA contraction may differ: 1e-6 relative plus 1e-6 absolute.
  expect_close(dout.download(), ref, 1e-6f, 1e-6f, "moe_combine");
  // Into the residual in one launch: the bits of moe_combine then add_inplace.
  const auto x0 = random_floats(ref.size(), 75);
  DeviceVec<float> dx(x0), dx2(x0);
  gpu::moe_combine_add(dy.get(), dpr.get(), dwt.get(), n_tokens, k, dim, dx.get(), nullptr);
  gpu::add_inplace(dx2.get(), dout.get(), ref.size(), nullptr);
  expect_exact(dx.download(), dx2.download(), "moe_combine_add vs moe_combine + add_inplace");
}

TEST(GpuKernels, AddInplaceAddsTheResidual) {
  SKIP_WITHOUT_GPU();
  const size_t n = 1000003;
  auto y = random_floats(n, 75), x = random_floats(n, 76);
  std::vector<float> ref(n);
  for (size_t i = 0; i < n; ++i) ref[i] = y[i] + x[i];
  DeviceVec<float> dy(y), dx(x);
  gpu::add_inplace(dy.get(), dx.get(), n, nullptr);
  expect_exact(dy.download(), ref, "add_inplace");  // one float add per element, as the CPU
}

TEST(GpuKernels, GatedAddScalesEachRowBySigmoidOfItsGate) {
  SKIP_WITHOUT_GPU();
  const int n_tokens = 11, dim = 133;  // odd: partial blocks
  auto y = random_floats(size_t(n_tokens) * dim, 77), x = random_floats(size_t(n_tokens) * dim, 78);
  auto g = random_floats(size_t(n_tokens), 79, 4.0f);  // gates from well below to well above 0
  std::vector<float> ref(y.size());
  for (int t = 0; t < n_tokens; ++t) {
    const float s = 1.0f / (1.0f + std::exp(-g[size_t(t)]));  // the CPU's sigmoid (moe_layer.cpp)
    for (int d = 0; d < dim; ++d) ref[size_t(t) * dim + d] = y[size_t(t) * dim + d] + s * x[size_t(t) * dim + d];
  }
  DeviceVec<float> dy(y), dx(x), dg(g);
  gpu::gated_add(dy.get(), dx.get(), dg.get(), n_tokens, dim, nullptr);
  // expf may differ from std::exp by an ulp or two, and FMA contraction: 1e-6 rel + 1e-6 abs.
  expect_close(dy.download(), ref, 1e-6f, 1e-6f, "gated_add");
  EXPECT_THROW(gpu::gated_add(dy.get(), dx.get(), nullptr, n_tokens, dim, nullptr), Error);
  EXPECT_THROW(gpu::gated_add(dy.get(), dx.get(), dg.get(), 0, dim, nullptr), Error);
}

TEST(GpuKernels, NewOpsRejectBadShapes) {
  SKIP_WITHOUT_GPU();
  DeviceVec<float> d(4096);
  DeviceVec<int> di(8);
  DeviceVec<const uint8_t*> dw(4);
  const float* f = d.get();
  EXPECT_THROW(gpu::attention(f, f, f, 1, 0, 6, 4, 64, 0.1f, d.get(), nullptr), Error);  // 6 % 4
  EXPECT_THROW(gpu::attention(f, f, f, 1, 0, 4, 4, 66, 0.1f, d.get(), nullptr), ConfigError);
  EXPECT_THROW(gpu::attention(f, f, f, 1, 0, 4, 4, 512, 0.1f, d.get(), nullptr), ConfigError);
  EXPECT_THROW(gpu::attention(f, f, f, 0, 0, 4, 4, 64, 0.1f, d.get(), nullptr), Error);
  EXPECT_THROW(gpu::expert_gemm(QuantType::kQ8, dw.get(), 0, di.get(), 1, 1, 8, 45, f, d.get(),
                                nullptr),
               ConfigError);  // q8 needs whole blocks
  EXPECT_THROW(gpu::expert_gemm(QuantType::kF32, dw.get(), 0, di.get(), 1, 1, 8, 64, f, d.get(),
                                nullptr),
               ConfigError);
  EXPECT_THROW(gpu::expert_gemm(QuantType::kQ4, dw.get(), 8, di.get(), 1, 1, 8, 64, f, d.get(),
                                nullptr),
               Error);  // offset not 16-byte aligned
  EXPECT_THROW(gpu::gather_rows(f, di.get(), 0, 4, d.get(), nullptr), Error);
  EXPECT_THROW(gpu::moe_combine(f, di.get(), f, 1, 0, 4, d.get(), nullptr), Error);
  EXPECT_THROW(gpu::add_inplace(d.get(), nullptr, 4, nullptr), Error);
  EXPECT_THROW(gpu::embed_rows(f, di.get(), 2, 0, d.get(), nullptr), Error);
}

TEST(GpuKernels, OpWrappersRejectBadShapes) {
  SKIP_WITHOUT_GPU();
  DeviceVec<float> d(16);
  DeviceVec<int> di(4);
  EXPECT_THROW(gpu::rms_norm(d.get(), d.get(), 0, 16, 1e-6f, d.get(), nullptr), Error);
  EXPECT_THROW(gpu::router_topk(d.get(), 1, 4, 5, false, di.get(), d.get(), nullptr), Error);
  EXPECT_THROW(gpu::expert_matvec(QuantType::kF32, reinterpret_cast<const uint8_t*>(d.get()), 2, 2,
                                  d.get(), d.get(), nullptr),
               ConfigError);
  EXPECT_THROW(gpu::swiglu(nullptr, d.get(), 4, d.get(), nullptr), Error);
}


// ---- gpt-oss ---------------------------------------------------------------------------------

TEST(GpuKernels, RouterTopkSoftmaxMatchesCpu) {
  SKIP_WITHOUT_GPU();
  const int n_tokens = 9, n_experts = 128, k = 4;
  auto logits = random_floats(size_t(n_tokens) * n_experts, 81, 2.0f);
  logits[5] = logits[6] = 9.0f;  // a tie at the top: the lower id first
  std::vector<int> ref_ids(size_t(n_tokens) * k);
  std::vector<float> ref_w(ref_ids.size());
  for (int t = 0; t < n_tokens; ++t)
    route_token_topk_softmax(logits.data() + size_t(t) * n_experts, n_experts, k, ref_ids.data() + size_t(t) * k,
                             ref_w.data() + size_t(t) * k);
  DeviceVec<float> dl(logits), dw(ref_w.size());
  DeviceVec<int> di(ref_ids.size());
  gpu::router_topk_softmax(dl.get(), n_tokens, n_experts, k, di.get(), dw.get(), nullptr);
  EXPECT_EQ(di.download(), ref_ids);
  expect_close(dw.download(), ref_w, 1e-7f, 1e-5f, "router_topk_softmax");  // expf: <= 2 ulp per term
  EXPECT_THROW(gpu::router_topk_softmax(dl.get(), 1, n_experts, 65, di.get(), dw.get(), nullptr), Error);
}

TEST(GpuKernels, SwigluClampedMatchesCpu) {
  SKIP_WITHOUT_GPU();
  const size_t n = 4001;
  auto g = random_floats(n, 82, 6.0f), u = random_floats(n, 83, 6.0f);  // beyond the limit both ways
  std::vector<float> ref = g;
  clamped_swiglu(ref.data(), u.data(), n, 7.0f, 1.702f);
  DeviceVec<float> dg(g), du(u), dout(n);
  gpu::swiglu_clamped(dg.get(), du.get(), n, 7.0f, 1.702f, dout.get(), nullptr);
  expect_close(dout.download(), ref, 1e-6f, 1e-5f, "swiglu_clamped");
}

TEST(GpuKernels, ExpertBiasAddAddsEachGroupsOwnBias) {
  SKIP_WITHOUT_GPU();
  const int dim = 37;
  const std::vector<int> row_start = {0, 3, 3, 7, 8};  // an empty group too
  const size_t offset = 64;
  std::vector<float> y = random_floats(8 * dim, 84);
  std::vector<std::vector<float>> payload(4);
  std::vector<const uint8_t*> ptrs;
  std::vector<std::unique_ptr<DeviceVec<float>>> dev;
  for (int g = 0; g < 4; ++g) {
    payload[size_t(g)] = random_floats(offset / 4 + dim, 85 + g);
    dev.push_back(std::make_unique<DeviceVec<float>>(payload[size_t(g)]));
    ptrs.push_back(reinterpret_cast<const uint8_t*>(dev.back()->get()));
  }
  std::vector<float> ref = y;
  for (int g = 1; g < 4; ++g)  // groups [1, 4): rows [3, 8)
    for (int r = row_start[size_t(g)]; r < row_start[size_t(g) + 1]; ++r)
      for (int c = 0; c < dim; ++c) ref[size_t(r) * dim + c] += payload[size_t(g)][offset / 4 + size_t(c)];
  DeviceVec<float> dy(y);
  DeviceVec<int> drs(row_start);
  DeviceVec<const uint8_t*> dp(ptrs);
  gpu::expert_bias_add(dy.get(), dim, drs.get(), 1, 4, 3, 8, dp.get(), offset, nullptr);
  expect_exact(dy.download(), ref, "expert_bias_add");
}

// attention_reference with gpt-oss's sink logits (one per head, in the denominator) and a window.
std::vector<float> attention_reference_sinks(const std::vector<float>& q, const std::vector<float>& k,
                                             const std::vector<float>& v, int n_q, int pos0, int n_heads, int n_kv,
                                             int hd, float scale, const std::vector<float>& sinks, int window) {
  const int group = n_heads / n_kv;
  std::vector<float> out(size_t(n_q) * n_heads * hd);
  std::vector<double> s(size_t(pos0 + n_q));
  for (int t = 0; t < n_q; ++t)
    for (int h = 0; h < n_heads; ++h) {
      const int g = h / group, end = pos0 + t + 1, first = window > 0 ? std::max(0, end - window) : 0;
      const float* qh = q.data() + (size_t(t) * n_heads + h) * hd;
      double mx = sinks[size_t(h)];
      for (int j = first; j < end; ++j) {
        const float* kj = k.data() + (size_t(j) * n_kv + g) * hd;
        double dot = 0;
        for (int d = 0; d < hd; ++d) dot += double(qh[d]) * kj[d];
        s[size_t(j)] = dot * scale;
        mx = std::max(mx, s[size_t(j)]);
      }
      double sum = std::exp(sinks[size_t(h)] - mx);
      for (int j = first; j < end; ++j) sum += (s[size_t(j)] = std::exp(s[size_t(j)] - mx));
      for (int d = 0; d < hd; ++d) {
        double o = 0;
        for (int j = first; j < end; ++j) o += s[size_t(j)] * v[(size_t(j) * n_kv + g) * hd + d];
        out[(size_t(t) * n_heads + h) * hd + d] = float(o / sum);
      }
    }
  return out;
}

TEST(GpuKernels, AttentionWithSinksAndWindowMatchesReference) {
  SKIP_WITHOUT_GPU();
  struct Shape {
    int n_q, pos0, n_heads, n_kv, hd, window;
  };
  // gpt-oss's heads (64/8 x 64) at decode (split merge) and prefill, windows shorter and longer
  // than the context, and a window of 0 (a full layer with sinks).
  for (const Shape& c : {Shape{1, 999, 64, 8, 64, 128}, Shape{1, 3000, 64, 8, 64, 0}, Shape{17, 200, 16, 2, 64, 6},
                         Shape{9, 0, 4, 2, 16, 6}, Shape{1, 5, 8, 8, 64, 128}}) {
    const int max_ctx = c.pos0 + c.n_q + 11;
    auto q = random_floats(size_t(c.n_q) * c.n_heads * c.hd, 90 + c.pos0, 2.0f);
    auto k = random_floats(size_t(max_ctx) * c.n_kv * c.hd, 91 + c.pos0);
    auto v = random_floats(k.size(), 92 + c.pos0);
    for (size_t i = size_t(c.pos0 + c.n_q) * c.n_kv * c.hd; i < k.size(); ++i) k[i] = v[i] = NAN;
    auto sinks = random_floats(size_t(c.n_heads), 93, 3.0f);
    const float scale = 1.0f / std::sqrt(float(c.hd));
    auto ref = attention_reference_sinks(q, k, v, c.n_q, c.pos0, c.n_heads, c.n_kv, c.hd, scale, sinks, c.window);
    DeviceVec<float> dq(q), dk(k), dv(v), ds(sinks), dout(ref.size());
    gpu::attention(dq.get(), dk.get(), dv.get(), c.n_q, c.pos0, c.n_heads, c.n_kv, c.hd, scale, dout.get(), nullptr,
                   ds.get(), c.window);
    const std::string name = "attention sinks window=" + std::to_string(c.window) + " n_q=" + std::to_string(c.n_q) +
                             " ctx=" + std::to_string(c.pos0 + c.n_q);
    expect_close(dout.download(), ref, 1e-5f, 2e-4f, name.c_str());
  }
}

// A sliding layer's ring cache (position p in row p % ring, rows of positions the chunk cannot
// see left NaN) gives the bits of the full cache: only the key addresses change, not the order.
TEST(GpuKernels, AttentionOnARingCacheEqualsTheFullCacheBitForBit) {
  SKIP_WITHOUT_GPU();
  struct Shape {
    int n_q, pos0, n_heads, n_kv, hd, window, extra;  // ring = window + n_q - 1 + extra
  };
  for (const Shape& c : {Shape{1, 999, 64, 8, 64, 128, 63}, Shape{1, 130, 64, 8, 64, 128, 0},
                         Shape{17, 200, 16, 2, 64, 6, 0}, Shape{5, 23, 4, 2, 16, 6, 3}, Shape{9, 0, 4, 2, 16, 6, 1},
                         Shape{3, 4000, 8, 8, 128, 128, 61}}) {
    const int end = c.pos0 + c.n_q, ring = c.window + c.n_q - 1 + c.extra;
    const size_t row = size_t(c.n_kv) * c.hd;
    auto q = random_floats(size_t(c.n_q) * c.n_heads * c.hd, 94 + c.pos0, 2.0f);
    auto k = random_floats(size_t(end) * row, 95 + c.pos0);
    auto v = random_floats(k.size(), 96 + c.pos0);
    auto sinks = random_floats(size_t(c.n_heads), 97, 3.0f);
    std::vector<float> kr(size_t(ring) * row, NAN), vr(kr.size(), NAN);
    for (int p = std::max(0, end - ring); p < end; ++p) {
      std::copy_n(k.begin() + ptrdiff_t(size_t(p) * row), row, kr.begin() + ptrdiff_t(size_t(p % ring) * row));
      std::copy_n(v.begin() + ptrdiff_t(size_t(p) * row), row, vr.begin() + ptrdiff_t(size_t(p % ring) * row));
    }
    for (int p = 0; p < end - c.window - c.n_q + 1; ++p)  // keys no query sees: never read in the full cache
      std::fill_n(k.begin() + ptrdiff_t(size_t(p) * row), row, NAN);
    const float scale = 1.0f / std::sqrt(float(c.hd));
    const size_t n_out = size_t(c.n_q) * c.n_heads * c.hd;
    DeviceVec<float> dq(q), dk(k), dv(v), dkr(kr), dvr(vr), ds(sinks), dfull(n_out), dring(n_out);
    gpu::attention(dq.get(), dk.get(), dv.get(), c.n_q, c.pos0, c.n_heads, c.n_kv, c.hd, scale, dfull.get(), nullptr,
                   ds.get(), c.window);
    gpu::attention(dq.get(), dkr.get(), dvr.get(), c.n_q, c.pos0, c.n_heads, c.n_kv, c.hd, scale, dring.get(), nullptr,
                   ds.get(), c.window, ring);
    const std::vector<float> full = dfull.download(), got = dring.download();
    for (float f : full) ASSERT_TRUE(std::isfinite(f)) << "the full cache read a key outside the window";
    ASSERT_EQ(std::memcmp(full.data(), got.data(), full.size() * 4), 0)
        << "ring " << ring << " n_q " << c.n_q << " pos0 " << c.pos0;
  }
  // A ring too short for the chunk's keys is refused.
  DeviceVec<float> d(size_t(4) * 64 * 8);
  const float* f = d.get();
  EXPECT_THROW(gpu::attention(f, f, f, 4, 20, 4, 4, 64, 0.1f, d.get(), nullptr, nullptr, 6, 8), Error);
  EXPECT_THROW(gpu::attention(f, f, f, 1, 20, 4, 4, 64, 0.1f, d.get(), nullptr, nullptr, 0, 8), Error);
}

}  // namespace
}  // namespace moestream
