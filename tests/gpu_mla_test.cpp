// The MLA kernels of kernels/cuda/mla_ops.h against plain-loop CPU references (double sums) on
// random data at odd sizes: cache append, absorbed query (wkv_b in f32, bf16 and f16), latent
// attention (decode with key splits, prefill with a causal limit per row, DeepSeek-V3's 576-wide
// rows, the widest row taken) and the value up-projection. Skips without a usable GPU; the
// host-side shape and type errors run everywhere.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/cuda/gpu_ops.h"
#include "kernels/cuda/mla_ops.h"
#include "loader/format/expert_file.h"
#include "tests/gpu_test_util.h"
#include "tests/support/require_gpu.h"

namespace moestream {
namespace {

std::vector<float> uniform(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& f : v) f = d(rng);
  return v;
}

// wkv_b as stored: the bytes of rows x cols weights in type q (f32, bf16 or f16) and their exact
// float values (what the kernels must read).
struct StoredMatrix {
  QuantType type;
  std::vector<uint8_t> bytes;
  std::vector<float> values;
};

float f16_value(uint16_t h) {  // normal numbers only (the generator makes no others)
  const int e = (h >> 10) & 31, m = h & 1023;
  const float v = std::ldexp(1.0f + float(m) / 1024.0f, e - 15);
  return (h & 0x8000) ? -v : v;
}

StoredMatrix stored_matrix(QuantType q, size_t rows, size_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-0.5f, 0.5f);
  StoredMatrix m{q, {}, std::vector<float>(rows * cols)};
  if (q == QuantType::kF32) {
    for (float& v : m.values) v = d(rng);
    m.bytes.resize(m.values.size() * 4);
    std::memcpy(m.bytes.data(), m.values.data(), m.bytes.size());
  } else if (q == ggml_quant(GgmlType::kBF16)) {
    m.bytes.resize(m.values.size() * 2);
    for (size_t i = 0; i < m.values.size(); ++i) {
      uint32_t u;
      const float f = d(rng);
      std::memcpy(&u, &f, 4);
      const uint16_t b = uint16_t(u >> 16);  // truncated: any bf16 value will do
      const uint32_t back = uint32_t(b) << 16;
      std::memcpy(&m.values[i], &back, 4);
      std::memcpy(&m.bytes[2 * i], &b, 2);
    }
  } else {  // f16: sign, exponent 10..14 (|w| in [2^-5, 1)), random mantissa
    m.bytes.resize(m.values.size() * 2);
    std::uniform_int_distribution<int> e(10, 14), man(0, 1023), sign(0, 1);
    for (size_t i = 0; i < m.values.size(); ++i) {
      const uint16_t h = uint16_t((sign(rng) << 15) | (e(rng) << 10) | man(rng));
      m.values[i] = f16_value(h);
      std::memcpy(&m.bytes[2 * i], &h, 2);
    }
  }
  return m;
}

const QuantType kTypes[] = {QuantType::kF32, ggml_quant(GgmlType::kBF16), ggml_quant(GgmlType::kF16)};

// |gpu - ref| <= tol[i] for every element, reporting the first offender and the worst ratio.
void expect_within(const std::vector<float>& gpu, const std::vector<double>& ref, const std::vector<double>& tol,
                   const std::string& what) {
  ASSERT_EQ(gpu.size(), ref.size());
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double err = std::fabs(double(gpu[i]) - ref[i]);
    worst = std::max(worst, err / tol[i]);
    ASSERT_LE(err, tol[i]) << what << " at " << i << ": gpu " << gpu[i] << " ref " << ref[i];
  }
  std::printf("[ %s ] n=%zu worst error / tolerance = %.3f\n", what.c_str(), ref.size(), worst);
}

TEST(GpuMla, CacheAppendNormalisesTheLatentAndRotatesTheSharedKey) {
  REQUIRE_GPU();
  const int T = 5, C = 37, r = 10, lat = C + r, half = r / 2;
  const float eps = 1e-6f;
  const std::vector<float> kv = uniform(size_t(T) * lat, 1, -2, 2), norm = uniform(C, 2, 0.5f, 1.5f);
  const std::vector<float> cos = uniform(size_t(T) * half, 3), sin = uniform(size_t(T) * half, 4);
  DeviceVec<float> kv_d(kv), norm_d(norm), cos_d(cos), sin_d(sin), rows_d(size_t(T) * lat);
  gpu::mla_cache_append(kv_d.get(), norm_d.get(), eps, cos_d.get(), sin_d.get(), T, C, r, rows_d.get(), nullptr);
  std::vector<double> ref(size_t(T) * lat), tol(ref.size());
  for (int t = 0; t < T; ++t) {
    const float* x = &kv[size_t(t) * lat];
    double ss = 0;
    for (int i = 0; i < C; ++i) ss += double(x[i]) * x[i];
    const double inv = 1.0 / std::sqrt(ss / C + eps);
    for (int i = 0; i < C; ++i) ref[size_t(t) * lat + i] = x[i] * inv * norm[size_t(i)];
    for (int i = 0; i < half; ++i) {
      const double a = x[C + i], b = x[C + half + i];
      const double c = cos[size_t(t) * half + i], s = sin[size_t(t) * half + i];
      ref[size_t(t) * lat + C + i] = a * c - b * s;
      ref[size_t(t) * lat + C + half + i] = b * c + a * s;
    }
  }
  for (size_t i = 0; i < ref.size(); ++i) tol[i] = 1e-5 * std::max(1.0, std::fabs(ref[i]));
  expect_within(rows_d.download(), ref, tol, "mla_cache_append");
}

TEST(GpuMla, AbsorbedQueryFoldsTheKeyRowsOfEachHeadInEveryStoredType) {
  REQUIRE_GPU();
  // 11 tokens cross the 8-token tile, C = 150 the 128-column tile.
  const int T = 11, H = 3, n = 10, r = 6, v = 7, C = 150, qk = n + r, lat = C + r, half = r / 2;
  const std::vector<float> q = uniform(size_t(T) * H * qk, 5);
  const std::vector<float> cos = uniform(size_t(T) * half, 6), sin = uniform(size_t(T) * half, 7);
  for (QuantType wt : kTypes) {
    const StoredMatrix w = stored_matrix(wt, size_t(H) * (n + v), C, 8);
    DeviceVec<float> q_d(q), cos_d(cos), sin_d(sin), out_d(size_t(T) * H * lat);
    DeviceVec<uint8_t> w_d(w.bytes);
    gpu::mla_absorb_q(q_d.get(), wt, w_d.get(), T, H, n, r, v, C, cos_d.get(), sin_d.get(), out_d.get(), nullptr);
    std::vector<double> ref(size_t(T) * H * lat), tol(ref.size());
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < H; ++h) {
        const float* qh = &q[(size_t(t) * H + h) * qk];
        const size_t o = (size_t(t) * H + h) * lat;
        for (int c = 0; c < C; ++c) {
          double acc = 0, mag = 0;
          for (int i = 0; i < n; ++i) {
            const double term = double(qh[i]) * w.values[(size_t(h) * (n + v) + i) * C + c];
            acc += term;
            mag += std::fabs(term);
          }
          ref[o + c] = acc;
          tol[o + c] = 1e-5 * mag + 1e-7;
        }
        for (int i = 0; i < half; ++i) {
          const double a = qh[n + i], b = qh[n + half + i];
          const double cs = cos[size_t(t) * half + i], sn = sin[size_t(t) * half + i];
          ref[o + C + i] = a * cs - b * sn;
          ref[o + C + half + i] = b * cs + a * sn;
          tol[o + C + i] = tol[o + C + half + i] = 1e-6;
        }
      }
    expect_within(out_d.download(), ref, tol, "mla_absorb_q " + std::string(quant_name(wt)));
  }
}

// One attention case: T queries at positions pos0.. over a cache of pos0 + T rows.
void check_attention(int T, int pos0, int H, int C, int r, uint32_t seed) {
  const int lat = C + r, len = pos0 + T;
  const float scale = 0.8f / std::sqrt(float(lat));
  const std::vector<float> cache = uniform(size_t(len) * lat, seed, -2, 2);
  const std::vector<float> q = uniform(size_t(T) * H * lat, seed + 1, -1.5f, 1.5f);
  DeviceVec<float> cache_d(cache), q_d(q), ctx_d(size_t(T) * H * C);
  DeviceVec<float> part_d(gpu::mla_attention_partial_floats(T, H, C));
  gpu::mla_attention(q_d.get(), cache_d.get(), T, pos0, H, C, r, scale, part_d.get(), ctx_d.get(), nullptr);
  std::vector<double> ref(size_t(T) * H * C), tol(ref.size());
  std::vector<double> p;
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) {
      const float* qr = &q[(size_t(t) * H + h) * lat];
      const int keys = pos0 + t + 1;  // causal
      p.assign(size_t(keys), 0.0);
      double mx = -1e300;
      for (int j = 0; j < keys; ++j) {
        double s = 0;
        for (int d = 0; d < lat; ++d) s += double(qr[d]) * cache[size_t(j) * lat + d];
        p[size_t(j)] = s * scale;
        mx = std::max(mx, p[size_t(j)]);
      }
      double sum = 0;
      for (int j = 0; j < keys; ++j) sum += p[size_t(j)] = std::exp(p[size_t(j)] - mx);
      for (int c = 0; c < C; ++c) {
        double acc = 0, mag = 0;
        for (int j = 0; j < keys; ++j) {
          acc += p[size_t(j)] / sum * cache[size_t(j) * lat + c];
          mag += p[size_t(j)] / sum * std::fabs(cache[size_t(j) * lat + c]);
        }
        const size_t o = (size_t(t) * H + h) * C + c;
        ref[o] = acc;
        tol[o] = 2e-5 * mag + 1e-6;
      }
    }
  char what[128];
  std::snprintf(what, sizeof what, "mla_attention T=%d pos0=%d H=%d C=%d r=%d", T, pos0, H, C, r);
  expect_within(ctx_d.download(), ref, tol, what);
}

TEST(GpuMla, LatentAttentionMatchesSoftmaxOverEveryEarlierLatent) {
  REQUIRE_GPU();
  check_attention(1, 0, 3, 20, 8, 10);       // the first token: one key
  check_attention(1, 700, 5, 37, 6, 11);     // decode over 11 key splits
  check_attention(13, 9, 3, 150, 10, 12);    // prefill after a first chunk: a causal limit per row
  check_attention(3, 130, 128, 512, 64, 13); // DeepSeek-V3's rows (576) and heads, 2 splits
  check_attention(2, 67, 2, 1000, 24, 14);   // the widest row the kernel takes (1024)
}

TEST(GpuMla, ValueOutAppliesEachHeadsValueRowsInEveryStoredType) {
  REQUIRE_GPU();
  for (int C : {150, 1024}) {  // 1024: the largest shared-memory tile
    const int T = 11, H = 3, n = 10, v = C == 150 ? 37 : 7;  // 37: three 16-row slices, the last short
    const std::vector<float> ctx = uniform(size_t(T) * H * C, 20);
    for (QuantType wt : kTypes) {
      const StoredMatrix w = stored_matrix(wt, size_t(H) * (n + v), size_t(C), 21);
      DeviceVec<float> ctx_d(ctx), o_d(size_t(T) * H * v);
      DeviceVec<uint8_t> w_d(w.bytes);
      gpu::mla_value_out(ctx_d.get(), wt, w_d.get(), T, H, n, v, C, o_d.get(), nullptr);
      std::vector<double> ref(size_t(T) * H * v), tol(ref.size());
      for (int t = 0; t < T; ++t)
        for (int h = 0; h < H; ++h)
          for (int k = 0; k < v; ++k) {
            double acc = 0, mag = 0;
            for (int c = 0; c < C; ++c) {
              const double term = double(w.values[(size_t(h) * (n + v) + n + k) * C + c]) *
                                  ctx[(size_t(t) * H + h) * C + c];
              acc += term;
              mag += std::fabs(term);
            }
            const size_t o = size_t(t) * H * v + size_t(h) * v + k;
            ref[o] = acc;
            tol[o] = 1e-5 * mag + 1e-7;
          }
      expect_within(o_d.download(), ref, tol,
                    "mla_value_out C=" + std::to_string(C) + " v=" + std::to_string(v) + " " + std::string(quant_name(wt)));
    }
  }
}

// Host-side checks: they throw before any CUDA call, so they run without a GPU too.
TEST(GpuMla, ShapesAndTypesTheKernelsDoNotTakeAreRefused) {
  EXPECT_TRUE(gpu::mla_reads_type(QuantType::kF32));
  EXPECT_TRUE(gpu::mla_reads_type(ggml_quant(GgmlType::kBF16)));
  EXPECT_TRUE(gpu::mla_reads_type(ggml_quant(GgmlType::kF16)));
  EXPECT_FALSE(gpu::mla_reads_type(ggml_quant(GgmlType::kQ8_0)));
  EXPECT_FALSE(gpu::mla_reads_type(QuantType::kQ8));
  float* f = reinterpret_cast<float*>(uintptr_t(256));  // never dereferenced: the checks come first
  const uint8_t* w = reinterpret_cast<const uint8_t*>(f);
  EXPECT_THROW(gpu::mla_absorb_q(f, ggml_quant(GgmlType::kQ8_0), w, 1, 2, 4, 4, 4, 32, f, f, f, nullptr), ConfigError);
  EXPECT_THROW(gpu::mla_value_out(f, QuantType::kQ4, w, 1, 2, 4, 4, 32, f, nullptr), ConfigError);
  EXPECT_THROW(gpu::mla_attention(f, f, 1, 0, 2, 1000, 64, 1.0f, f, f, nullptr), Error);  // row 1064 > 1024
  EXPECT_THROW(gpu::mla_cache_append(f, f, 1e-6f, f, f, 1, 16, 5, f, nullptr), Error);  // odd rope width
  EXPECT_THROW(gpu::mla_absorb_q(f, QuantType::kF32, w, 0, 2, 4, 4, 4, 32, f, f, f, nullptr), Error);
  EXPECT_THROW(gpu::mla_attention(nullptr, f, 1, 0, 2, 16, 4, 1.0f, f, f, nullptr), Error);
}

}  // namespace
}  // namespace moestream
