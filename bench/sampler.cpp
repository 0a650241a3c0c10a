// The sampler's cost a token at a real vocabulary, against the way it worked before: a sort of
// every candidate id by logit (std::sort without top-k, a heap of k with it) and
// std::max_element for greedy. Interleaved rounds, medians, the ratio per setting.
//   bench_sampler [--vocab 151936] [--rounds 5] [--draws 50]
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <span>
#include <vector>

#include "bench/median.h"
#include "runtime/model/sampler.h"

namespace {

using moestream::SamplerParams;
using moestream::bench::median;

// The earlier sampler: candidates sorted by (logit desc, id asc), weights in that order, the
// nucleus as the sorted prefix, the draw walking it.
class SortingSampler {
 public:
  explicit SortingSampler(const SamplerParams& p) : p_(p), rng_(p.seed) {}
  int sample(std::span<const float> l) {
    if (p_.temperature == 0) return int(std::max_element(l.begin(), l.end()) - l.begin());
    const int V = int(l.size());
    order_.resize(size_t(V));
    std::iota(order_.begin(), order_.end(), 0);
    auto by = [&](int a, int b) { return l[size_t(a)] > l[size_t(b)] || (l[size_t(a)] == l[size_t(b)] && a < b); };
    int n = V;
    if (p_.top_k > 0 && p_.top_k < V) {
      n = p_.top_k;
      std::partial_sort(order_.begin(), order_.begin() + n, order_.end(), by);
    } else {
      std::sort(order_.begin(), order_.end(), by);
    }
    probs_.resize(size_t(n));
    const double top = l[size_t(order_[0])];
    double sum = 0;
    for (int i = 0; i < n; ++i) sum += probs_[size_t(i)] = float(std::exp((l[size_t(order_[size_t(i)])] - top) / p_.temperature));
    if (p_.top_p < 1) {
      double cum = 0;
      for (int i = 0; i < n; ++i)
        if ((cum += probs_[size_t(i)] / sum) >= p_.top_p) {
          n = i + 1;
          break;
        }
      sum = 0;
      for (int i = 0; i < n; ++i) sum += probs_[size_t(i)];
    }
    const double u = double(rng_() >> 11) * 0x1.0p-53 * sum;
    double cum = 0;
    for (int i = 0; i < n; ++i)
      if (u < (cum += probs_[size_t(i)])) return order_[size_t(i)];
    return order_[size_t(n - 1)];
  }

 private:
  SamplerParams p_;
  std::mt19937_64 rng_;
  std::vector<int> order_;
  std::vector<float> probs_;
};

// Microseconds a draw over `draws` draws, each on logits nudged so no call repeats the last.
template <class S>
double us_per_draw(S& s, std::vector<float>& logits, int draws) {
  long sink = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < draws; ++i) {
    logits[size_t(i * 7919) % logits.size()] += 1e-3f;
    sink += s.sample(logits);
  }
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  if (sink == -1) std::printf("unreachable\n");  // keeps the draws
  return us / draws;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_sampler: the sampler's cost a token against a sort of the vocabulary"};
  int vocab = 151936, rounds = 5, draws = 50;
  app.add_option("--vocab", vocab, "logits a draw reads")->capture_default_str()->check(CLI::Range(2, 1 << 24));
  app.add_option("--rounds", rounds, "interleaved rounds (median)")->capture_default_str()->check(CLI::Range(1, 1000));
  app.add_option("--draws", draws, "draws a round")->capture_default_str()->check(CLI::Range(1, 100000));
  CLI11_PARSE(app, argc, argv);
  std::vector<float> logits(static_cast<size_t>(vocab));
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (float& x : logits) x = normal(rng);
  std::printf("vocabulary %d, N(0, 3) logits; medians of %d interleaved rounds of %d draws\n\n", vocab, rounds, draws);
  std::printf("| setting | moestream us | sorting us | ratio |\n|---|---|---|---|\n");
  struct Setting {
    const char* name;
    SamplerParams p;
  };
  for (const Setting& s : {Setting{"greedy (temperature 0)", {0.0f, 40, 0.95f, 1}},
                           Setting{"temperature 0.8, top-k 40, top-p 0.95 (infer's default)", {0.8f, 40, 0.95f, 1}},
                           Setting{"temperature 0.8, top-p 0.95, no top-k", {0.8f, 0, 0.95f, 1}},
                           Setting{"temperature 1, no top-k or top-p (the server's default)", {1.0f, 0, 1.0f, 1}}}) {
    moestream::Sampler ours(s.p);
    SortingSampler sorting(s.p);
    std::vector<double> a, b;
    for (int r = 0; r < rounds; ++r) {
      if (r % 2 == 0) {
        a.push_back(us_per_draw(ours, logits, draws));
        b.push_back(us_per_draw(sorting, logits, draws));
      } else {
        b.push_back(us_per_draw(sorting, logits, draws));
        a.push_back(us_per_draw(ours, logits, draws));
      }
    }
    std::printf("| %s | %.1f | %.1f | %.1fx |\n", s.name, median(a), median(b), median(b) / median(a));
  }
  return 0;
}
