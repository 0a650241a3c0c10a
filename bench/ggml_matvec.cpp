// Single-thread throughput of the ggml legacy-family kernels (kernels/cpu/ggml_quant.h): GB/s of
// weight bytes per second for each type, AVX2 against the scalar reference, with the matrix warm
// in cache and streamed from RAM, and the prefill matmul (n inputs) against n matvecs.
// Variants are timed in interleaved rounds (one call of each per round); medians are printed.
//   bench_ggml_matvec [--shape 4096x4096 --shape 768x2048] [--rounds 15] [--stream-mib 512] [--batch 8]
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench/median.h"
#include "common/half.h"
#include "common/timing.h"
#include "kernels/cpu/ggml_kernels.h"
#include "kernels/cpu/ggml_quant.h"
#include "kernels/cpu/quant_kernels.h"
#include "tests/support/random_blocks.h"

using namespace moestream;
using bench::median;

namespace {

double best(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }

// "median (best)" GB/s for `bytes` per call: the machine may be shared, so the median says what a
// run sees and the best what the code can do.
std::string rate(double bytes, const std::vector<double>& t) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.2f (%.2f)", bytes / median(t) / 1e9, bytes / best(t) / 1e9);
  return buf;
}

// A rows x cols matrix of type t with plausible contents: N(0, 0.02) floats for the plain types;
// random level bytes with small positive float16 scales (E8M0 around 2^-6 for MXFP4) otherwise.
std::vector<uint8_t> random_matrix(GgmlType t, size_t rows, size_t cols, std::mt19937& rng) {
  const GgmlTypeInfo info = *ggml_type_info(static_cast<uint32_t>(t));
  const size_t bytes = *ggml_row_bytes(t, cols) * rows;
  std::vector<uint8_t> m(bytes);
  if (info.block_elems == 1) {
    test::fill_random_floats(t, m.data(), rows * cols, 0.02f, rng);
    return m;
  }
  for (auto& b : m) b = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> scale(0.001f, 0.004f);
  for (size_t off = 0; off < bytes; off += info.block_bytes) {
    if (t == GgmlType::kMXFP4) {
      m[off] = static_cast<uint8_t>(120 + rng() % 4);
      continue;
    }
    const uint16_t d = f32_to_f16(scale(rng)), mn = f32_to_f16(-8 * scale(rng));
    std::memcpy(&m[off], &d, 2);
    if (t == GgmlType::kQ4_1 || t == GgmlType::kQ5_1) std::memcpy(&m[off + 2], &mn, 2);
  }
  return m;
}

struct Shape {
  size_t rows, cols;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Single-thread ggml legacy-family matvec bandwidth"};
  std::vector<std::string> shapes = {"4096x4096", "768x2048"};
  size_t rounds = 15, stream_mib = 512, batch = 8;
  app.add_option("--shape", shapes, "ROWSxCOLS (768x2048: a Qwen3-30B-A3B expert's gate/up)");
  app.add_option("--rounds", rounds, "Interleaved rounds (one call of each variant per round)");
  app.add_option("--stream-mib", stream_mib, "Bytes cycled through in the streamed case (>> LLC)");
  app.add_option("--batch", batch, "Inputs of the matmul column");
  CLI11_PARSE(app, argc, argv);

  const GgmlType types[] = {GgmlType::kF32,  GgmlType::kF16,  GgmlType::kBF16, GgmlType::kQ8_0,   GgmlType::kQ4_0,
                            GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kIQ4_NL, GgmlType::kMXFP4};
  std::mt19937 rng(1);
  if (!detail::avx2_usable()) std::printf("no AVX2/FMA/F16C here: the 'AVX2' columns are the scalar kernels\n");
  {
    std::vector<char> a(size_t{256} << 20, 1), b(size_t{256} << 20, 2);
    std::vector<double> t;
    for (int i = 0; i < 5; ++i) {
      auto t0 = Clock::now();
      std::memcpy(b.data(), a.data(), a.size());
      t.push_back(seconds_since(t0));
    }
    std::printf("memcpy 256 MiB, one thread: median %.2f GB/s copied\n", a.size() / median(t) / 1e9);
  }
  std::vector<uint8_t> stream(stream_mib << 20);
  for (const std::string& s : shapes) {
    Shape sh{};
    if (std::sscanf(s.c_str(), "%zux%zu", &sh.rows, &sh.cols) != 2 || sh.rows == 0 || sh.cols % 32 != 0) {
      std::fprintf(stderr, "bad --shape %s (ROWSxCOLS, cols a multiple of 32)\n", s.c_str());
      return 1;
    }
    std::vector<float> x(batch * sh.cols), y(batch * sh.rows);
    std::normal_distribution<float> g(0.0f, 1.0f);
    for (auto& v : x) v = g(rng);
    ggml_reserve_scratch(sh.cols, batch);
    std::printf("\n%zu x %zu, one thread, %zu rounds; GB/s of weight bytes, median (best); matmul: %zu inputs,\n"
                "GB/s counted per input; ratios of medians\n", sh.rows, sh.cols, rounds, batch);
    std::printf("%-7s %6s %15s %15s %13s %8s %15s %10s\n", "type", "bits/w", "AVX2 warm", "AVX2 streamed",
                "scalar warm", "speedup", "matmul warm", "vs matvec");
    for (GgmlType t : types) {
      const std::vector<uint8_t> one = random_matrix(t, sh.rows, sh.cols, rng);
      const size_t bytes = one.size();
      const size_t copies = std::max<size_t>(1, stream.size() / bytes);
      for (size_t i = 0; i < copies && (i + 1) * bytes <= stream.size(); ++i)
        std::memcpy(stream.data() + i * bytes, one.data(), bytes);
      const bool streamable = bytes <= stream.size();
      const detail::GgmlKernels* k = detail::ggml_legacy_kernels(t);
      std::vector<double> warm, streamed, scalar, mm;
      size_t next = 0;
      for (size_t r = 0; r <= rounds; ++r) {  // round 0 warms up and is not counted
        auto t0 = Clock::now();
        ggml_matvec(t, one.data(), sh.cols, x.data(), y.data(), 0, sh.rows);
        const double a = seconds_since(t0);
        double b = 0;
        if (streamable) {
          t0 = Clock::now();
          ggml_matvec(t, stream.data() + next * bytes, sh.cols, x.data(), y.data(), 0, sh.rows);
          b = seconds_since(t0);
          next = (next + 1) % copies;
        }
        t0 = Clock::now();
        k->matvec_scalar(one.data(), sh.cols, x.data(), y.data(), 0, sh.rows);
        const double c = seconds_since(t0);
        t0 = Clock::now();
        ggml_matmul(t, one.data(), sh.cols, x.data(), batch, y.data(), sh.rows, 0, sh.rows);
        const double d = seconds_since(t0);
        if (r == 0) continue;
        warm.push_back(a);
        streamed.push_back(b);
        scalar.push_back(c);
        mm.push_back(d);
      }
      std::printf("%-7s %6.2f %15s %15s %13s %7.1fx %15s %9.2fx\n", std::string(ggml_type_name(t)).c_str(),
                  8.0 * bytes / (sh.rows * sh.cols), rate(bytes, warm).c_str(),
                  streamable ? rate(bytes, streamed).c_str() : "-", rate(bytes, scalar).c_str(),
                  median(scalar) / median(warm), rate(double(batch) * bytes, mm).c_str(),
                  batch * median(warm) / median(mm));
    }
  }
  return 0;
}
