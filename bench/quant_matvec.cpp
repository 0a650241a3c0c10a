// Single-thread expert matvec throughput: GB/s of encoded weights per second for each encoding,
// with the weights hot in cache and streamed from RAM, beside this machine's memcpy bandwidth.
//   bench_quant_matvec [--rows 768] [--cols 2048] [--stream-mib 1024] [--seconds 1]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/timing.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/quant_kernels.h"

using namespace moestream;

namespace {

// Times fn() call by call until `budget` seconds pass. Returns {median, best} calls per second:
// the machine is shared, so the median says what a run sees and the best what the code can do.
template <typename Fn>
std::pair<double, double> rate(double budget, Fn fn) {
  fn();  // warm up (page faults, caches)
  std::vector<double> t;
  auto start = Clock::now();
  do {
    auto t0 = Clock::now();
    fn();
    t.push_back(seconds_since(t0));
  } while (seconds_since(start) < budget);
  std::sort(t.begin(), t.end());
  return {1.0 / t[t.size() / 2], 1.0 / t.front()};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Single-thread expert matvec bandwidth"};
  size_t rows = 768, cols = 2048, stream_mib = 1024;
  double budget = 1.0;
  app.add_option("--rows", rows, "Matrix rows (Qwen3-30B-A3B expert: 768)");
  app.add_option("--cols", cols, "Matrix cols (Qwen3-30B-A3B hidden: 2048)");
  app.add_option("--stream-mib", stream_mib, "Bytes cycled through in the streaming case (>> LLC)");
  app.add_option("--seconds", budget, "Time per measurement");
  CLI11_PARSE(app, argc, argv);

  std::mt19937 rng(1);
  std::normal_distribution<float> g(0.0f, 0.02f);
  std::vector<float> w(rows * cols), x(cols), y(rows);
  for (auto& v : w) v = g(rng);
  for (auto& v : x) v = g(rng) * 50;

  {
    std::vector<char> a(size_t{256} << 20, 1), b(size_t{256} << 20, 2);
    auto [med, best] = rate(budget, [&] { std::memcpy(b.data(), a.data(), a.size()); });
    std::printf("memcpy 256 MiB, one thread: median %.2f GB/s copied (best %.2f)\n", med * a.size() / 1e9,
                best * a.size() / 1e9);
  }
  std::printf("matvec %zu x %zu, one thread, SIMD %s; GB/s of encoded weights, median (best)\n", rows, cols,
              quant_simd_available() ? "AVX2" : "none");
  std::printf("%-5s %8s %18s %18s %18s %14s\n", "quant", "bytes/w", "hot (in cache)", "streamed (RAM)",
              "scalar, hot", "streamed Gw/s");
  for (QuantType q : {QuantType::kF32, QuantType::kBF16, QuantType::kQ8, QuantType::kQ4}) {
    const size_t bytes = quant_matrix_bytes(q, rows, cols);
    std::vector<uint8_t> one(bytes);
    quantize_matrix(q, w.data(), rows, cols, one.data());
    const size_t n_copies = std::max<size_t>(1, (stream_mib << 20) / bytes);
    std::vector<uint8_t> many(n_copies * bytes);
    for (size_t i = 0; i < n_copies; ++i) std::memcpy(many.data() + i * bytes, one.data(), bytes);

    auto [hot, hot_best] = rate(budget, [&] { quant_matvec(q, one.data(), cols, x.data(), y.data(), 0, rows); });
    size_t next = 0;
    auto [stream, stream_best] = rate(budget, [&] {
      quant_matvec(q, many.data() + next * bytes, cols, x.data(), y.data(), 0, rows);
      next = (next + 1) % n_copies;
    });
    const size_t nb = (cols + 31) / 32;
    std::vector<float> xd(nb), xs(nb);
    std::vector<int8_t> xq(nb * 32), xp(nb / 2 * 64);
    std::vector<uint8_t> xa(nb * 32);
    auto [scalar, scalar_best] = rate(budget / 2, [&] {
      detail::quantize_activations(x.data(), cols, xd.data(), xq.data(), xa.data(), xs.data(), xp.data());
      detail::matvec_scalar(q, one.data(), cols, x.data(), {xd.data(), xq.data(), xa.data(), xs.data(), xp.data()},
                            y.data(), 0, rows);
    });
    auto gbs = [&](double r, double best) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.2f (%.2f)", r * bytes / 1e9, best * bytes / 1e9);
      return std::string(buf);
    };
    std::printf("%-5s %8.4f %18s %18s %18s %14.2f\n", std::string(quant_name(q)).c_str(),
                double(bytes) / (rows * cols), gbs(hot, hot_best).c_str(), gbs(stream, stream_best).c_str(),
                gbs(scalar, scalar_best).c_str(), stream * rows * cols / 1e9);
  }
  return 0;
}
