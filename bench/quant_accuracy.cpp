// Where the q8/q4 matvec error comes from: relative L2 error of y = W x against exact float64
// maths, split into weight quantisation and the int8 quantisation of x the kernels do.
//   bench_quant_accuracy [--rows 256] [--cols 2048] [--outlier 20]
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "kernels/cpu/quant.h"

using namespace moestream;

int main(int argc, char** argv) {
  CLI::App app{"Error split of the q8/q4 matvec"};
  size_t rows = 256, cols = 2048;
  float outlier = 20.0f;
  app.add_option("--rows", rows);
  app.add_option("--cols", cols);
  app.add_option("--outlier", outlier, "Scale of every 64th activation (LLM activations have outlier channels)");
  CLI11_PARSE(app, argc, argv);
  std::mt19937 rng(3);
  std::normal_distribution<float> g(0, 1);
  std::vector<float> w(rows * cols), x(cols);
  for (auto& v : w) v = g(rng) * 0.02f;
  for (size_t i = 0; i < cols; ++i) x[i] = g(rng) * (i % 64 == 0 ? outlier : 1.0f);
  std::vector<double> exact(rows);
  double norm = 0;
  for (size_t r = 0; r < rows; ++r) {
    for (size_t c = 0; c < cols; ++c) exact[r] += double(w[r * cols + c]) * x[c];
    norm += exact[r] * exact[r];
  }
  norm = std::sqrt(norm);
  std::printf("%zu x %zu, w ~ N(0, 0.02), x ~ N(0, 1) with every 64th x %.0f; relative L2 error of y\n", rows,
              cols, outlier);
  std::printf("%-5s %14s %14s %14s\n", "quant", "weights only", "x int8 only", "total");
  for (QuantType q : {QuantType::kQ8, QuantType::kQ4}) {
    std::vector<uint8_t> enc(quant_matrix_bytes(q, rows, cols));
    quantize_matrix(q, w.data(), rows, cols, enc.data());
    std::vector<float> deq(rows * cols), y(rows);
    dequantize_matrix(q, enc.data(), rows, cols, deq.data());
    quant_matvec(q, enc.data(), cols, x.data(), y.data(), 0, rows);
    double ew = 0, ex = 0, et = 0;
    for (size_t r = 0; r < rows; ++r) {
      double a = 0;  // dequantised weights, float x: the weight error alone
      for (size_t c = 0; c < cols; ++c) a += double(deq[r * cols + c]) * x[c];
      ew += (a - exact[r]) * (a - exact[r]);
      ex += (y[r] - a) * (y[r] - a);
      et += (y[r] - exact[r]) * (y[r] - exact[r]);
    }
    std::printf("%-5s %14.2e %14.2e %14.2e\n", std::string(quant_name(q)).c_str(), std::sqrt(ew) / norm,
                std::sqrt(ex) / norm, std::sqrt(et) / norm);
  }
  return 0;
}
