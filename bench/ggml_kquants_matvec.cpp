// Single-thread throughput of the ggml super-block products (Q2_K..Q6_K, IQ4_XS, the lattice
// types IQ1_S..IQ3_S and TQ1_0, TQ2_0): GB/s of weight bytes
// for the AVX2 and scalar matvec, and the AVX2 matmul per input (prefill), on a 4096 x 4096 and a
// 2048 x 768 matrix (rows x cols). Repetitions of the variants are interleaved; medians reported.
// Times are the thread's CPU time (CLOCK_THREAD_CPUTIME_ID): the development machine is shared,
// and wall time would count the intervals this thread spent descheduled.
//   bench_ggml_kquants_matvec [--reps 9] [--sample-ms 20] [--inputs 8] [--types Q4_K,IQ2_XXS,...]
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench/median.h"
#include "kernels/cpu/ggml_kernels.h"
#include "kernels/cpu/ggml_quant.h"
#include "kernels/cpu/quant_kernels.h"
#include "tests/support/random_blocks.h"

using namespace moestream;
using bench::median;

namespace {

struct Shape {
  size_t rows, cols;
};

// Random quant bytes with moderate f16 factors; the speed of these kernels does not depend on the
// values.
std::vector<uint8_t> random_weights(GgmlType t, size_t rows, size_t cols, std::mt19937& rng) {
  std::vector<uint8_t> w(*ggml_row_bytes(t, cols) * rows);
  test::fill_random_blocks(t, w.data(), w.size(), 0.01f, rng);
  return w;
}

double thread_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

// Calls fn() `calls` times; returns the thread CPU seconds per call.
template <typename Fn>
double time_calls(size_t calls, Fn&& fn) {
  const double t0 = thread_seconds();
  for (size_t i = 0; i < calls; ++i) fn();
  return (thread_seconds() - t0) / double(calls);
}

// How many calls fill about `ms` milliseconds (at least one).
template <typename Fn>
size_t calls_for(double ms, Fn&& fn) {
  fn();  // warm up (page faults, caches, the per-thread scratch)
  const double one = time_calls(3, fn);
  return std::max<size_t>(1, size_t(ms / 1e3 / std::max(one, 1e-9)));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Single-thread ggml K-quant matvec/matmul throughput"};
  size_t reps = 9, inputs = 8;
  double sample_ms = 20;
  app.add_option("--reps", reps, "Interleaved repetitions of each variant (median reported)");
  app.add_option("--sample-ms", sample_ms, "Length of one timed sample");
  app.add_option("--inputs", inputs, "Inputs of the matmul (prefill) measurement");
  std::vector<std::string> names = {"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "IQ2_XXS", "IQ2_XS", "IQ2_S",
                                    "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "TQ1_0", "TQ2_0"};
  app.add_option("--types", names, "Types to measure, by ggml name")->delimiter(',');
  CLI11_PARSE(app, argc, argv);
  std::vector<GgmlType> types;
  for (const std::string& n : names) {
    const auto info = ggml_type_info_by_name(n);
    if (!info || detail::ggml_kquant_kernels(info->type) == nullptr) {
      std::fprintf(stderr, "bench_ggml_kquants_matvec: %s is not a super-block type this build computes\n", n.c_str());
      return 2;
    }
    types.push_back(info->type);
  }

  const bool avx2 = detail::avx2_usable();
  std::printf("one thread, AVX2 %s; GB/s of weight bytes per thread CPU second, median of %zu interleaved samples\n",
              avx2 ? "yes" : "no (AVX2 columns repeat the scalar kernel)", reps);
  std::printf("%-7s %-11s %9s %10s %10s %8s %16s\n", "type", "rows x cols", "MiB", "AVX2", "scalar", "x", "matmul/input");
  std::mt19937 rng(1);
  for (GgmlType t : types) {
    const auto& k = *detail::ggml_kquant_kernels(t);
    const auto matvec_fast = avx2 && k.matvec_avx2 ? k.matvec_avx2 : k.matvec_scalar;
    const auto matmul_fast = avx2 && k.matmul_avx2 ? k.matmul_avx2 : k.matmul_scalar;
    for (Shape s : {Shape{4096, 4096}, Shape{2048, 768}}) {
      const auto w = random_weights(t, s.rows, s.cols, rng);
      std::vector<float> x(inputs * s.cols), y(inputs * s.rows);
      std::normal_distribution<float> g(0.0f, 1.0f);
      for (auto& v : x) v = g(rng);
      auto fast = [&] { matvec_fast(w.data(), s.cols, x.data(), y.data(), 0, s.rows); };
      auto scalar = [&] { k.matvec_scalar(w.data(), s.cols, x.data(), y.data(), 0, s.rows); };
      auto batch = [&] { matmul_fast(w.data(), s.cols, x.data(), inputs, y.data(), s.rows, 0, s.rows); };
      const size_t n_fast = calls_for(sample_ms, fast), n_scalar = calls_for(sample_ms, scalar),
                   n_batch = calls_for(sample_ms, batch);
      std::vector<double> t_fast, t_scalar, t_batch;
      for (size_t r = 0; r < reps; ++r) {
        t_fast.push_back(time_calls(n_fast, fast));
        t_scalar.push_back(time_calls(n_scalar, scalar));
        t_batch.push_back(time_calls(n_batch, batch) / double(inputs));
      }
      const double gb = double(w.size()) / 1e9;
      const std::string shape = std::to_string(s.rows) + "x" + std::to_string(s.cols);
      std::printf("%-7s %-11s %9.2f %10.2f %10.2f %8.1f %16.2f\n", std::string(ggml_type_name(t)).c_str(),
                  shape.c_str(), double(w.size()) / (1 << 20), gb / median(t_fast), gb / median(t_scalar),
                  median(t_scalar) / median(t_fast), gb / median(t_batch));
    }
  }
  return 0;
}
