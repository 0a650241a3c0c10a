// Each CUDA kernel of kernels/ against a CPU reference on random data at odd sizes, with the
// tolerance stated per test. Skips (with the reason) on a machine without a usable GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "common/error.h"
#include "kernels/gpu_ops.h"
#include "loader/expert_file.h"
#include "runtime/dense_ops.h"
#include "runtime/model_config.h"
#include "runtime/moe_layer.h"
#include "runtime/quant.h"
#include "runtime/rope.h"

namespace moestream {
namespace {

#define SKIP_WITHOUT_GPU()                                              \
  do {                                                                  \
    const char* why = nullptr;                                          \
    if (gpu::device_count(&why) == 0) GTEST_SKIP() << "no usable CUDA device: " << why; \
  } while (0)

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

// A device copy of a host vector, freed on scope exit.
template <class T>
class DeviceVec {
 public:
  explicit DeviceVec(size_t n) : n_(n) {
    if (cudaMalloc(&p_, std::max<size_t>(n, 1) * sizeof(T)) != cudaSuccess) p_ = nullptr;
  }
  explicit DeviceVec(const std::vector<T>& h) : DeviceVec(h.size()) {
    if (p_) cudaMemcpy(p_, h.data(), n_ * sizeof(T), cudaMemcpyHostToDevice);
  }
  ~DeviceVec() { cudaFree(p_); }
  DeviceVec(const DeviceVec&) = delete;
  DeviceVec& operator=(const DeviceVec&) = delete;
  T* get() const { return p_; }
  std::vector<T> download() const {
    std::vector<T> h(n_);
    cudaDeviceSynchronize();
    cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& f : v) f = dist(rng);
  return v;
}

// |gpu - ref| <= atol + rtol * |ref| for every element, reporting the first offender.
void expect_close(const std::vector<float>& gpu, const std::vector<float>& ref, float atol,
                  float rtol, const char* what) {
  ASSERT_EQ(gpu.size(), ref.size());
  float worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const float err = std::fabs(gpu[i] - ref[i]);
    worst = std::max(worst, err / (atol + rtol * std::fabs(ref[i])));
    ASSERT_LE(err, atol + rtol * std::fabs(ref[i])) << what << " at " << i << ": gpu " << gpu[i]
                                                    << " ref " << ref[i];
  }
  std::printf("[ %s ] n=%zu worst error / tolerance = %.3f\n", what, ref.size(), worst);
}

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

}  // namespace
}  // namespace moestream
