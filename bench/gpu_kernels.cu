// Micro-benchmark of the CUDA tier's bandwidth-bound kernels: decode attention, the grouped
// expert GEMM (pack and ggml types; one row per expert is the decode GEMV), gate+up in one
// launch, q/k/v in one launch and the dense GEMM, as GB/s of the bytes they must read, against a
// measured device-to-device copy. Then the small kernels of a resident decode step (norm,
// router, plan, short-context attention, argmax) as microseconds a launch, back to back on one
// stream with warm caches: what Nsight Compute, which flushes the caches before each kernel,
// overstates. Last, the q8 products over several token rows: the float tile loop against the
// int8 tensor-core product, interleaved.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cuda/gpu_ops.h"
#include "loader/format/expert_file.h"
#include "kernels/cpu/quant.h"

namespace {

#define CHECK(call)                                                                  \
  do {                                                                               \
    cudaError_t e_ = (call);                                                         \
    if (e_ != cudaSuccess) {                                                         \
      std::fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e_));        \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

void* device_alloc(size_t bytes) {
  void* p = nullptr;
  CHECK(cudaMalloc(&p, bytes));
  return p;
}

// A device copy of h (freed by the caller).
template <class T>
T* to_device(const std::vector<T>& h) {
  auto* d = static_cast<T*>(device_alloc(h.size() * sizeof(T)));
  CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

// Device buffer of n random floats (normal, scaled), filled on the host in chunks.
float* random_device_floats(size_t n, uint32_t seed, float scale = 1.0f) {
  auto* d = static_cast<float*>(device_alloc(n * sizeof(float)));
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> h(std::min<size_t>(n, size_t(1) << 24));
  for (size_t off = 0; off < n; off += h.size()) {
    const size_t m = std::min(h.size(), n - off);
    for (size_t i = 0; i < m; ++i) h[i] = dist(rng);
    CHECK(cudaMemcpy(d + off, h.data(), m * sizeof(float), cudaMemcpyHostToDevice));
  }
  return d;
}

// rows x cols of type qt: the pack types quantise N(0, 0.05) floats; ggml's block types are
// random bytes (the kernels' speed does not depend on the values).
void fill_matrix(moestream::QuantType qt, int rows, int cols, std::mt19937& rng, uint8_t* dst) {
  using namespace moestream;
  if (quant_ggml_type(qt)) {
    const size_t n = quant_matrix_bytes(qt, size_t(rows), size_t(cols));
    for (size_t i = 0; i < n; ++i) dst[i] = uint8_t(rng());
    return;
  }
  std::normal_distribution<float> dist(0.0f, 0.05f);
  std::vector<float> wf(size_t(rows) * cols);
  for (float& f : wf) f = dist(rng);
  quantize_matrix(qt, wf.data(), size_t(rows), size_t(cols), dst);
}

// Median over `reps` batches of `per_batch` calls of fn(i), in microseconds per call (CUDA events).
template <class Fn>
double time_us(Fn fn, int per_batch = 50, int reps = 7) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  for (int i = 0; i < per_batch; ++i) fn(i);  // warm-up: module load, pool growth
  CHECK(cudaDeviceSynchronize());
  std::vector<double> t;
  int call = 0;
  for (int r = 0; r < reps; ++r) {
    CHECK(cudaEventRecord(a));
    for (int i = 0; i < per_batch; ++i) fn(call++);
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(1000.0 * ms / per_batch);
  }
  CHECK(cudaGetLastError());
  std::sort(t.begin(), t.end());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return t[t.size() / 2];
}

void row(const std::string& what, double us, double bytes, double copy_gbs) {
  const double gbs = bytes / us / 1e3;
  std::printf("| %s | %.1f | %.1f | %.0f | %.0f%% |\n", what.c_str(), us, bytes / 1e6, gbs,
              100.0 * gbs / copy_gbs);
}

// The small kernels of one resident decode step at Qwen3-30B-A3B's shapes (hidden 2048, 128
// experts top-8, 32/4 heads x 128, vocab 151936).
void decode_glue(double copy_gbs) {
  using namespace moestream;
  const int D = 2048, E = 128, K = 8, V = 151936;
  float* x = random_device_floats(size_t(D), 20);
  float* w = random_device_floats(size_t(D), 21);
  float* h = random_device_floats(size_t(D), 22);
  float* logits = random_device_floats(size_t(V), 23);
  float* rlog = random_device_floats(size_t(E), 24);
  auto* ids = static_cast<int*>(device_alloc(K * sizeof(int)));
  auto* wts = static_cast<float*>(device_alloc(K * sizeof(float)));
  auto* plan = static_cast<int*>(device_alloc((3 * K + 1) * sizeof(int)));
  auto* ptrs = static_cast<const uint8_t**>(device_alloc(K * sizeof(void*)));
  auto* miss = static_cast<int*>(device_alloc(sizeof(int)));
  auto* out = static_cast<gpu::ArgmaxState*>(device_alloc(sizeof(gpu::ArgmaxState)));
  CHECK(cudaMemset(out, 0, sizeof(gpu::ArgmaxState)));
  std::vector<const uint8_t*> table_h(static_cast<size_t>(E));
  for (int e = 0; e < E; ++e) table_h[size_t(e)] = reinterpret_cast<const uint8_t*>(uintptr_t(4096 + 64 * e));
  auto* table = static_cast<const uint8_t**>(device_alloc(E * sizeof(void*)));
  CHECK(cudaMemcpy(table, table_h.data(), E * sizeof(void*), cudaMemcpyHostToDevice));
  std::printf("\n| decode step kernel (back to back, warm) | us/launch |\n|---|---|\n");
  const auto glue = [](const char* what, double us) { std::printf("| %s | %.2f |\n", what, us); };
  glue("rms_norm 1 x 2048", time_us([&](int) { gpu::rms_norm(x, w, 1, D, 1e-6f, h, nullptr); }, 200));
  float* router = random_device_floats(size_t(E) * D, 29);
  glue("router gemv_f32 128 x 2048", time_us([&](int) { gpu::gemv_f32(router, E, D, h, rlog, false, nullptr); }, 200));
  CHECK(cudaFree(router));
  gpu::router_topk(rlog, 1, E, K, true, ids, wts, nullptr);
  glue("router_topk 128 experts, top-8", time_us([&](int) { gpu::router_topk(rlog, 1, E, K, true, ids, wts, nullptr); }, 200));
  glue("moe_plan_decode top-8 (and the 2048-float snapshot)",
       time_us([&](int) {
         gpu::moe_plan_decode(ids, K, table, E, reinterpret_cast<const uint8_t*>(table), plan, plan + K,
                              plan + 2 * K, ptrs, miss, x, h, D, nullptr);
       }, 200));
  float* y = random_device_floats(size_t(K) * D, 28);  // the experts' outputs, plan's pair rows
  glue("moe_combine_add + rms_norm top-8 x 2048 (two launches)", time_us([&](int) {
         gpu::moe_combine_add(y, plan + K, wts, 1, K, D, x, nullptr);
         gpu::rms_norm(x, w, 1, D, 1e-6f, h, nullptr);
       }, 200));
  glue("moe_combine_add_norm top-8 x 2048 (fused)",
       time_us([&](int) { gpu::moe_combine_add_norm(y, plan + K, wts, K, D, x, w, 1e-6f, h, nullptr); }, 200));
  CHECK(cudaFree(y));
  glue("argmax 151936 logits", time_us([&](int) { gpu::argmax(logits, V, out, nullptr); }, 200));
  row("(argmax as bandwidth)", time_us([&](int) { gpu::argmax(logits, V, out, nullptr); }, 200), 4.0 * V, copy_gbs);
  for (int ctx : {32, 512}) {
    const size_t kv = size_t(ctx) * 4 * 128;
    float* k = random_device_floats(kv, 25);
    float* v = random_device_floats(kv, 26);
    float* q = random_device_floats(size_t(32) * 128, 27);
    float* o = static_cast<float*>(device_alloc(size_t(32) * 128 * sizeof(float)));
    const std::string what = "attention decode 32/4 x 128, ctx " + std::to_string(ctx);
    glue(what.c_str(), time_us([&](int) {
           gpu::attention(q, k, v, 1, ctx - 1, 32, 4, 128, 1.0f / std::sqrt(128.0f), o, nullptr);
         }, 200));
    for (float* p : {k, v, q, o}) CHECK(cudaFree(p));
  }
  for (void* p : {static_cast<void*>(x), static_cast<void*>(w), static_cast<void*>(h), static_cast<void*>(logits),
                  static_cast<void*>(rlog), static_cast<void*>(ids), static_cast<void*>(wts), static_cast<void*>(plan),
                  static_cast<void*>(ptrs), static_cast<void*>(miss), static_cast<void*>(out), static_cast<void*>(table)})
    CHECK(cudaFree(p));
}

}  // namespace

// The q8 types' products over several token rows: the float tile loop (A, what kAuto takes) against
// the int8 tensor-core product (B, GemmKernel::kInt8Mma); 5 interleaved rounds of 20 calls each,
// medians, and B's speedup. Expert shapes: 128 experts with m rows each (a
// 512-token prefill chunk at top-8 gives 32 on average); dense: q_proj at n tokens.
void prefill_products() {
  using namespace moestream;
  std::printf("\n| q8 product (interleaved, medians of 5) | tile loop us | int8 mma us | speedup |\n"
              "|---|---|---|---|\n");
  const auto compare = [](const std::string& what, auto call) {
    std::vector<double> ta, tb;
    for (int r = 0; r < 5; ++r) {
      ta.push_back(time_us([&](int i) { call(i, gpu::GemmKernel::kAuto); }, 20, 1));
      tb.push_back(time_us([&](int i) { call(i, gpu::GemmKernel::kInt8Mma); }, 20, 1));
    }
    std::sort(ta.begin(), ta.end());
    std::sort(tb.begin(), tb.end());
    std::printf("| %s | %.1f | %.1f | %.2fx |\n", what.c_str(), ta[2], tb[2], ta[2] / tb[2]);
  };
  for (QuantType qt : {QuantType::kQ8, ggml_quant(GgmlType::kQ8_0)}) {
    const std::string tn(quant_name(qt));
    const int n_experts = 128;
    for (const auto& [name, rows, cols] : {std::tuple{"gate 768x2048", 768, 2048}, std::tuple{"down 2048x768", 2048, 768}}) {
      const size_t mbytes = quant_matrix_bytes(qt, size_t(rows), size_t(cols));
      const size_t stride = (mbytes + 4095) / 4096 * 4096;
      std::vector<uint8_t> h(stride * n_experts);
      std::mt19937 rng(7);
      for (int e = 0; e < n_experts; ++e) fill_matrix(qt, rows, cols, rng, h.data() + stride * e);
      auto* w = to_device(h);
      std::vector<const uint8_t*> ptrs;
      for (int e = 0; e < n_experts; ++e) ptrs.push_back(w + stride * size_t(e));
      auto** dptrs = to_device(ptrs);
      for (int m : {2, 4, 8, 16, 32, 64}) {
        std::vector<int> rs(n_experts + 1);
        for (int g = 0; g <= n_experts; ++g) rs[size_t(g)] = g * m;
        int* drs = to_device(rs);
        float* x = random_device_floats(size_t(n_experts) * m * cols, 9);
        auto* y = static_cast<float*>(device_alloc(size_t(n_experts) * m * rows * sizeof(float)));
        compare("expert_gemm " + tn + " " + name + ", 128 experts x " + std::to_string(m) + " rows",
                [&](int, gpu::GemmKernel k) {
                  gpu::expert_gemm(qt, dptrs, 0, drs, n_experts, m, rows, cols, x, y, nullptr, k);
                });
        CHECK(cudaFree(drs));
        CHECK(cudaFree(x));
        CHECK(cudaFree(y));
      }
      CHECK(cudaFree(w));
      CHECK(cudaFree(dptrs));
    }
    const int rows = 4096, cols = 2048;
    const size_t mbytes = quant_matrix_bytes(qt, size_t(rows), size_t(cols));
    std::vector<uint8_t> h(mbytes);
    std::mt19937 rng(11);
    fill_matrix(qt, rows, cols, rng, h.data());
    auto* w = to_device(h);
    for (int n : {8, 32, 128, 512}) {
      float* x = random_device_floats(size_t(n) * cols, 12);
      auto* y = static_cast<float*>(device_alloc(size_t(n) * rows * sizeof(float)));
      compare("dense_gemm " + tn + " q_proj 4096x2048 x " + std::to_string(n) + " tokens",
              [&](int, gpu::GemmKernel k) { gpu::dense_gemm(qt, w, rows, cols, x, n, y, nullptr, k); });
      CHECK(cudaFree(x));
      CHECK(cudaFree(y));
    }
    CHECK(cudaFree(w));
  }
}

int main() {
  using namespace moestream;
  const char* why = nullptr;
  if (gpu::device_count(&why) == 0) {
    std::printf("bench_gpu_kernels: no usable CUDA device (%s)\n", why);
    return 0;
  }
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));

  // Ceiling: a 1 GiB device-to-device copy, bytes read plus bytes written.
  const size_t copy_bytes = size_t(1) << 30;
  void* c0 = device_alloc(copy_bytes);
  void* c1 = device_alloc(copy_bytes);
  CHECK(cudaMemset(c0, 1, copy_bytes));
  const double copy_us =
      time_us([&](int) { CHECK(cudaMemcpyAsync(c1, c0, copy_bytes, cudaMemcpyDeviceToDevice)); },
              5, 5);
  const double copy_gbs = 2.0 * copy_bytes / copy_us / 1e3;
  CHECK(cudaFree(c0));
  CHECK(cudaFree(c1));
  std::printf("device: %s, %d SMs, L2 %.0f MB; D2D copy %.0f GB/s (read + write)\n\n", prop.name,
              prop.multiProcessorCount, prop.l2CacheSize / 1e6, copy_gbs);
  std::printf("| kernel | us/call | MB read | GB/s | of copy |\n|---|---|---|---|---|\n");

  // Decode attention: one token against ctx cached positions. Several layers' caches are cycled
  // so the reads come from HBM, not the 60 MB L2.
  struct AttnCase {
    const char* model;
    int n_heads, n_kv, hd, ctx;
  };
  for (const AttnCase c : {AttnCase{"Qwen3-30B-A3B 32/4x128", 32, 4, 128, 4096},
                           AttnCase{"Qwen3-30B-A3B 32/4x128", 32, 4, 128, 32768},
                           AttnCase{"OLMoE 16/16x128", 16, 16, 128, 4096},
                           AttnCase{"Mixtral 32/8x128", 32, 8, 128, 32768}}) {
    const size_t layer_floats = size_t(c.ctx) * c.n_kv * c.hd;
    const int n_layers = int(std::max<size_t>(2, (size_t(512) << 20) / (2 * layer_floats * 4)));
    float* k = random_device_floats(layer_floats * n_layers, 1);
    float* v = random_device_floats(layer_floats * n_layers, 2);
    float* q = random_device_floats(size_t(c.n_heads) * c.hd, 3, 2.0f);
    auto* out = static_cast<float*>(device_alloc(size_t(c.n_heads) * c.hd * sizeof(float)));
    const float scale = 1.0f / std::sqrt(float(c.hd));
    const double us = time_us([&](int i) {
      const size_t l = size_t(i % n_layers) * layer_floats;
      gpu::attention(q, k + l, v + l, 1, c.ctx - 1, c.n_heads, c.n_kv, c.hd, scale, out, nullptr);
    });
    row(std::string("attention decode ") + c.model + " ctx " + std::to_string(c.ctx), us,
        2.0 * layer_floats * 4, copy_gbs);
    CHECK(cudaFree(k));
    CHECK(cudaFree(v));
    CHECK(cudaFree(q));
    CHECK(cudaFree(out));
  }

  // Prefill attention: a 512-token chunk at the start and after 3584 cached positions
  // (compute-bound: float32 FMAs on CUDA cores).
  for (const int pos0 : {0, 3584}) {
    const int n_heads = 32, n_kv = 4, hd = 128, n_q = 512, ctx = pos0 + n_q;
    float* k = random_device_floats(size_t(ctx) * n_kv * hd, 4);
    float* v = random_device_floats(size_t(ctx) * n_kv * hd, 5);
    float* q = random_device_floats(size_t(n_q) * n_heads * hd, 6, 2.0f);
    auto* out = static_cast<float*>(device_alloc(size_t(n_q) * n_heads * hd * sizeof(float)));
    const double us = time_us(
        [&](int) {
          gpu::attention(q, k, v, n_q, pos0, n_heads, n_kv, hd, 1.0f / std::sqrt(float(hd)), out,
                         nullptr);
        },
        10, 5);
    double pairs = 0;  // (query, key) pairs under the causal mask
    for (int t = 0; t < n_q; ++t) pairs += pos0 + t + 1;
    const double flop = 4.0 * pairs * n_heads * hd;  // q.k and p.v, 2 flop per multiply-add
    std::printf(
        "| attention prefill Qwen3-30B-A3B 512 tokens at pos %d | %.1f | %.1f | %.0f GFLOP/s | |\n",
        pos0, us, 2.0 * ctx * n_kv * hd * 4 / 1e6, flop / us / 1e3);
    CHECK(cudaFree(k));
    CHECK(cudaFree(v));
    CHECK(cudaFree(q));
    CHECK(cudaFree(out));
  }

  // Expert GEMM at Qwen3-30B-A3B's shapes: gate/up [768 x 2048] and down [2048 x 768], 8 experts
  // per call (top-8), rows per group 1 (decode) and 64 (prefill). 64 distinct experts cycled.
  struct GemmCase {
    const char* name;
    int rows, cols;
  };
  const int k_active = 8, n_experts = 64;
  const QuantType gemm_types[] = {QuantType::kQ8,
                                  QuantType::kQ4,
                                  QuantType::kBF16,
                                  ggml_quant(GgmlType::kQ8_0),
                                  ggml_quant(GgmlType::kQ4_K),
                                  ggml_quant(GgmlType::kQ6_K),
                                  ggml_quant(GgmlType::kQ2_K),
                                  ggml_quant(GgmlType::kMXFP4),
                                  ggml_quant(GgmlType::kNVFP4),
                                  ggml_quant(GgmlType::kIQ2_XXS),
                                  ggml_quant(GgmlType::kIQ3_XXS),
                                  ggml_quant(GgmlType::kIQ1_M)};
  for (QuantType qt : gemm_types) {
    for (const GemmCase gc : {GemmCase{"gate 768x2048", 768, 2048},
                              GemmCase{"down 2048x768", 2048, 768}}) {
      const size_t mbytes = quant_matrix_bytes(qt, gc.rows, gc.cols);
      const size_t stride = (mbytes + 4095) / 4096 * 4096;
      std::vector<uint8_t> h(stride * n_experts);
      {
        std::mt19937 rng(7);
        for (int e = 0; e < n_experts; ++e)
          fill_matrix(qt, gc.rows, gc.cols, rng, h.data() + stride * e);
      }
      auto* w = to_device(h);
      // Pointer tables for the n_experts / k_active rotations.
      const int n_sets = n_experts / k_active;
      std::vector<const uint8_t*> ptrs;
      for (int s = 0; s < n_sets; ++s)
        for (int g = 0; g < k_active; ++g) ptrs.push_back(w + stride * size_t(s * k_active + g));
      auto** dptrs = to_device(ptrs);
      for (int m : {1, 64}) {
        std::vector<int> rs(k_active + 1);
        for (int g = 0; g <= k_active; ++g) rs[size_t(g)] = g * m;
        int* drs = to_device(rs);
        float* x = random_device_floats(size_t(k_active) * m * gc.cols, 9);
        auto* y = static_cast<float*>(device_alloc(size_t(k_active) * m * gc.rows * sizeof(float)));
        const double us = time_us([&](int i) {
          gpu::expert_gemm(qt, dptrs + size_t(i % n_sets) * k_active, 0, drs, k_active, m, gc.rows,
                           gc.cols, x, y, nullptr);
        });
        const double bytes = double(mbytes) * k_active + 4.0 * k_active * m * (gc.cols + gc.rows);
        row(std::string("expert_gemm ") + std::string(quant_name(qt)) + " " + gc.name + " 8 x " +
                std::to_string(m) + " rows (" +
                std::to_string(int(2.0 * k_active * m * gc.rows * gc.cols / us / 1e3)) +
                " GFLOP/s)",
            us, bytes, copy_gbs);
        if (m == 1) {  // the first slice's matvec, one launch per expert, for comparison
          const double us_mv = time_us([&](int i) {
            const int s = i % n_sets;
            for (int g = 0; g < k_active; ++g)
              gpu::expert_matvec(qt, w + stride * size_t(s * k_active + g), gc.rows, gc.cols,
                                 x + size_t(g) * gc.cols, y + size_t(g) * gc.rows, nullptr);
          });
          row(std::string("8 x expert_matvec ") + std::string(quant_name(qt)) + " " + gc.name,
              us_mv, bytes, copy_gbs);
        }
        CHECK(cudaFree(drs));
        CHECK(cudaFree(x));
        CHECK(cudaFree(y));
      }
      CHECK(cudaFree(dptrs));
      CHECK(cudaFree(w));
    }
  }

  // Gate and up of 8 experts at one row each in one launch (expert_gemm_gate_up, the decode
  // GEMV): payloads of two 768 x 2048 matrices, 64 experts cycled in sets of 8.
  for (QuantType qt : {QuantType::kQ8, QuantType::kQ4, QuantType::kBF16}) {
    const int rows = 768, cols = 2048;
    const size_t mbytes = quant_matrix_bytes(qt, rows, cols);
    const size_t up_off = (mbytes + 4095) / 4096 * 4096, stride = 2 * up_off;
    std::vector<uint8_t> h(stride * n_experts);
    std::mt19937 rng(13);
    for (int e = 0; e < n_experts; ++e) {
      fill_matrix(qt, rows, cols, rng, h.data() + stride * e);
      fill_matrix(qt, rows, cols, rng, h.data() + stride * e + up_off);
    }
    auto* w = to_device(h);
    std::vector<const uint8_t*> ptrs;
    for (int e = 0; e < n_experts; ++e) ptrs.push_back(w + stride * size_t(e));
    auto** dptrs = to_device(ptrs);
    std::vector<int> rs(k_active + 1);
    for (int g = 0; g <= k_active; ++g) rs[size_t(g)] = g;
    int* drs = to_device(rs);
    float* x = random_device_floats(size_t(2) * k_active * cols, 14);
    auto* y = static_cast<float*>(device_alloc(size_t(2) * k_active * rows * sizeof(float)));
    const double us = time_us([&](int i) {
      gpu::expert_gemm_gate_up(qt, dptrs + size_t(i % (n_experts / k_active)) * k_active, 0,
                               up_off, drs, k_active, 1, rows, cols, x, x + size_t(k_active) * cols,
                               y, y + size_t(k_active) * rows, nullptr);
    });
    row(std::string("expert_gemm_gate_up ") + std::string(quant_name(qt)) +
            " 2 x 768x2048, 8 x 1 rows, one launch",
        us, 2.0 * (double(mbytes) * k_active + 4.0 * k_active * (cols + rows)), copy_gbs);
    CHECK(cudaFree(drs));
    CHECK(cudaFree(x));
    CHECK(cudaFree(y));
    CHECK(cudaFree(dptrs));
    CHECK(cudaFree(w));
  }

  // q, k and v of Qwen3-30B-A3B (4096, 512, 512 rows x 2048, bf16) at one token in one launch
  // (dense_gemm_shared_input), 16 layers' copies cycled.
  {
    const int cols = 2048, n_copies = 16;
    const int qkv_rows[3] = {4096, 512, 512};
    size_t total = 0;
    std::vector<uint8_t*> mats;
    std::vector<float*> ys;
    std::mt19937 rng(15);
    for (int c = 0; c < n_copies; ++c)
      for (int r : qkv_rows) {
        const size_t b = quant_matrix_bytes(QuantType::kBF16, size_t(r), cols);
        std::vector<uint8_t> h(b);
        fill_matrix(QuantType::kBF16, r, cols, rng, h.data());
        mats.push_back(static_cast<uint8_t*>(device_alloc(b)));
        CHECK(cudaMemcpy(mats.back(), h.data(), b, cudaMemcpyHostToDevice));
        if (c == 0) {
          total += b;
          ys.push_back(static_cast<float*>(device_alloc(size_t(r) * sizeof(float))));
        }
      }
    float* x = random_device_floats(cols, 16);
    const double us = time_us([&](int i) {
      const size_t c = size_t(i % n_copies) * 3;
      const gpu::DenseOut outs[3] = {{mats[c], qkv_rows[0], ys[0]},
                                     {mats[c + 1], qkv_rows[1], ys[1]},
                                     {mats[c + 2], qkv_rows[2], ys[2]}};
      gpu::dense_gemm_shared_input(QuantType::kBF16, outs, 3, cols, x, 1, nullptr);
    });
    row("dense_gemm_shared_input bf16 q/k/v 4096+512+512 x 2048, 1 token, one launch", us,
        double(total) + 4.0 * (cols + 5120), copy_gbs);
    for (uint8_t* m : mats) CHECK(cudaFree(m));
    for (float* p : ys) CHECK(cudaFree(p));
    CHECK(cudaFree(x));
  }

  // Dense GEMM (attention and output projections in stored precision) at Qwen3-30B-A3B's shapes:
  // q_proj [4096 x 2048] at 1 and 64 tokens, lm_head [151936 x 2048] at 1 token. Several copies
  // of q_proj are cycled so decode reads come from HBM, not L2.
  struct DenseCase {
    const char* name;
    int rows, cols, n_tokens, copies;
  };
  for (QuantType qt : {QuantType::kBF16, ggml_quant(GgmlType::kBF16), ggml_quant(GgmlType::kQ8_0),
                       ggml_quant(GgmlType::kQ4_K), ggml_quant(GgmlType::kQ6_K)}) {
    for (const DenseCase dc : {DenseCase{"q_proj 4096x2048", 4096, 2048, 1, 16},
                               DenseCase{"k_proj 512x2048", 512, 2048, 1, 64},
                               DenseCase{"o_proj 2048x4096", 2048, 4096, 1, 16},
                               DenseCase{"q_proj 4096x2048", 4096, 2048, 64, 16},
                               DenseCase{"lm_head 151936x2048", 151936, 2048, 1, 1}}) {
      const size_t mbytes = quant_matrix_bytes(qt, size_t(dc.rows), size_t(dc.cols));
      const size_t stride = (mbytes + 255) / 256 * 256;
      std::vector<uint8_t> h(stride * dc.copies);
      std::mt19937 rng(11);
      for (int c = 0; c < dc.copies; ++c)
        fill_matrix(qt, dc.rows, dc.cols, rng, h.data() + stride * c);
      auto* w = to_device(h);
      float* x = random_device_floats(size_t(dc.n_tokens) * dc.cols, 12);
      auto* y = static_cast<float*>(device_alloc(size_t(dc.n_tokens) * dc.rows * sizeof(float)));
      const double us = time_us(
          [&](int i) {
            gpu::dense_gemm(qt, w + stride * size_t(i % dc.copies), dc.rows, dc.cols, x,
                            dc.n_tokens, y, nullptr);
          },
          dc.copies > 1 ? 50 : 10, 7);
      const double bytes = double(mbytes) + 4.0 * dc.n_tokens * (dc.cols + dc.rows);
      row(std::string("dense_gemm ") + std::string(quant_name(qt)) + " " + dc.name + " x " +
              std::to_string(dc.n_tokens) + " tokens (" +
              std::to_string(int(2.0 * dc.n_tokens * dc.rows * dc.cols / us / 1e3)) + " GFLOP/s)",
          us, bytes, copy_gbs);
      CHECK(cudaFree(w));
      CHECK(cudaFree(x));
      CHECK(cudaFree(y));
    }
  }
  decode_glue(copy_gbs);
  prefill_products();
  return 0;
}
