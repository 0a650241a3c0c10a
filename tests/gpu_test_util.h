// Helpers of the GPU kernel tests (gpu_kernels_test, gpu_decode_gemv_test, gpu_fused_ops_test,
// gpu_ggml_test, gpu_mla_test, ...): a device vector (its download fails the test when a kernel
// failed), random data, and the comparisons that print each check's worst error / tolerance line.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "kernels/cuda/gpu_ops.h"

namespace moestream {

#define SKIP_WITHOUT_GPU()                                              \
  do {                                                                  \
    const char* why = nullptr;                                          \
    if (gpu::device_count(&why) == 0) GTEST_SKIP() << "no usable CUDA device: " << why; \
  } while (0)

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

// A device copy of a host vector (or n zeros), freed on scope exit.
template <class T>
class DeviceVec {
 public:
  explicit DeviceVec(const std::vector<T>& h) : n_(h.size()) {
    if (cudaMalloc(&p_, std::max<size_t>(n_, 1) * sizeof(T)) != cudaSuccess) p_ = nullptr;
    if (p_ && n_) cudaMemcpy(p_, h.data(), n_ * sizeof(T), cudaMemcpyHostToDevice);
  }
  explicit DeviceVec(size_t n) : DeviceVec(std::vector<T>(n)) {}
  ~DeviceVec() { cudaFree(p_); }
  DeviceVec(const DeviceVec&) = delete;
  DeviceVec& operator=(const DeviceVec&) = delete;
  T* get() const { return p_; }
  std::vector<T> download() const {
    std::vector<T> h(n_);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << "a kernel failed";
    cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

// A grouped expert GEMM's layout (gpu::expert_gemm): group g's token rows start at row g of the
// result, 0 then the running sums of `sizes`.
inline std::vector<int> group_row_starts(const std::vector<int>& sizes) {
  std::vector<int> row_start(1, 0);
  for (int n : sizes) row_start.push_back(row_start.back() + n);
  return row_start;
}

// A grouped expert GEMM's weights and row starts on the device: `payloads` holds one slot of
// `stride` bytes per group; weights() is the array of the slots' addresses the kernel takes.
class DeviceGroups {
 public:
  DeviceGroups(const std::vector<uint8_t>& payloads, size_t stride, const std::vector<int>& row_start)
      : bytes_(payloads), slots_(slot_addresses(bytes_.get(), stride, row_start.size() - 1)), row_start_(row_start) {}
  const uint8_t* const* weights() const { return slots_.get(); }
  const int* row_start() const { return row_start_.get(); }

 private:
  static std::vector<const uint8_t*> slot_addresses(const uint8_t* base, size_t stride, size_t n_groups) {
    std::vector<const uint8_t*> p;
    for (size_t g = 0; g < n_groups; ++g) p.push_back(base + stride * g);
    return p;
  }
  DeviceVec<uint8_t> bytes_;
  DeviceVec<const uint8_t*> slots_;
  DeviceVec<int> row_start_;
};

inline std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& f : v) f = dist(rng);
  return v;
}

// |gpu - ref| <= atol + rtol * |ref| for every element, reporting the first offender.
inline void expect_close(const std::vector<float>& gpu, const std::vector<float>& ref, float atol,
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

// Bit-exact comparison; prints the table line with tolerance 0 (worst absolute error shown).
inline void expect_exact(const std::vector<float>& gpu, const std::vector<float>& ref, const char* what) {
  ASSERT_EQ(gpu.size(), ref.size());
  float worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_EQ(gpu[i], ref[i]) << what << " at " << i;
    worst = std::max(worst, std::fabs(gpu[i] - ref[i]));
  }
  std::printf("[ %s ] n=%zu worst error / tolerance = %.3f\n", what, ref.size(), worst);
}

}  // namespace moestream
