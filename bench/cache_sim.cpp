// cache_sim: hit rates of the expert caches' policies, the GPU cache's (LFRU, decaying demand heat)
// and the host cache's (LFU with aging), vs LRU and Belady's optimal at several capacities,
// replaying the decode steps of a routing log through cluster/cache_sim.
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "cluster/cache_sim.h"
#include "common/error.h"
#include "loader/store/lfu_policy.h"
#include "loader/format/routing_log.h"

using namespace moestream;

int main(int argc, char** argv) {
  CLI::App app{"cache_sim: the GPU and host expert cache policies vs LRU and Belady on a routing log"};
  std::string log_path;
  std::vector<double> percents{5, 10, 15, 20, 25, 30, 40, 50, 75};
  std::vector<int> experts;
  bool all_phases = false;
  std::vector<double> half_lives{1, 4, 16, 64, 256};
  LfruPolicyOptions policy;  // the runtime's defaults unless overridden
  std::vector<uint32_t> policy_sweep;
  app.add_option("--routing", log_path, "routing log (infer --collect-routing)")->required();
  app.add_option("--percent", percents,
                 "capacities as % of all expert bytes (all experts are one size)")->capture_default_str();
  app.add_option("--experts", experts, "capacities in experts (added to --percent)");
  app.add_flag("--all-phases", all_phases,
               "replay prefill records too, each token a step (e.g. a perplexity log with --batch 1)");
  app.add_option("--half-life", half_lives,
                 "LRFU half-lives in decode steps for the second table (online alternatives)")
      ->capture_default_str();
  app.add_option("--policy-half-life", policy.heat_half_life_steps,
                 "the policy's heat half-life in decode steps (0: no decay)")->capture_default_str();
  app.add_option("--sweep-policy-half-life", policy_sweep,
                 "also print the policy's hit rate at each of these half-lives, with and without "
                 "demand admission (for tuning on traces other than the reported ones)");
  std::vector<uint64_t> host_aging{2, 4, 8, 16};
  app.add_option("--host-aging", host_aging,
                 "the host cache's LfuPolicy at these aging periods, in uses per slot (third table)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    const RoutingLog log = read_routing_log(log_path);
    if (!log.warning.empty()) std::fprintf(stderr, "cache_sim: %s\n", log.warning.c_str());
    const CacheTrace t = make_cache_trace(log, !all_phases);
    const int total = t.n_layers * t.n_experts;
    const int top_k = int(log.header.top_k);
    std::vector<int> caps;
    for (double p : percents) caps.push_back(std::max(top_k, int(std::lround(p / 100.0 * total))));
    caps.insert(caps.end(), experts.begin(), experts.end());
    std::printf("trace: %s, %zu %s, %zu accesses (%d layers x %d experts, top-%d)\n",
                log_path.c_str(), t.n_steps(), all_phases ? "tokens" : "decode steps", t.keys.size(), t.n_layers, t.n_experts, top_k);
    LfruPolicyOptions no_decay = policy, admission = policy;
    no_decay.heat_half_life_steps = 0;
    admission.demand_admission = true;
    const unsigned h = policy.heat_half_life_steps;
    std::printf("LFRU = the policy with heat half-life %u steps; LFRU h=inf = without decay (the "
                "policy before heat decayed); + adm = with demand admission\n", h);
    // Column order kept from before (bench/report.py plots columns 2-4 as LRU, LFRU, Belady).
    std::printf("| capacity (experts) | %% of expert bytes | LRU hit %% | LFRU hit %% | Belady hit %% "
                "| LFRU gap to Belady (points) | LRU gap (points) | LFRU h=inf hit %% | LFRU h=inf gap "
                "| LFRU + adm hit %% | LFRU + adm gap |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
    double worst_gap = 0, worst_gap_adm = 0;
    for (int cap : caps) {
      if (cap > total) continue;
      const double lru = 100 * simulate_lru(t, cap).hit_rate();
      const double before = 100 * simulate_lfru(t, cap, no_decay).hit_rate();
      const double lfru = 100 * simulate_lfru(t, cap, policy).hit_rate();
      const double adm = 100 * simulate_lfru(t, cap, admission).hit_rate();
      const double opt = 100 * simulate_belady(t, cap).hit_rate();
      worst_gap = std::max(worst_gap, opt - lfru);
      worst_gap_adm = std::max(worst_gap_adm, opt - adm);
      std::printf("| %d | %.1f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", cap,
                  100.0 * cap / total, lru, lfru, opt, opt - lfru, opt - lru, before, opt - before,
                  adm, opt - adm);
    }
    std::printf("largest LFRU gap to Belady: %.2f points (goal: within 5)\n", worst_gap);
    std::printf("largest LFRU + admission gap to Belady: %.2f points\n\n", worst_gap_adm);
    // Why: how much of the gap any online policy could close. The static top-C set knows the
    // trace's frequencies (LFU's ideal); LRFU spans LRU (short half-life) to LFU (long).
    if (!policy_sweep.empty()) {
      std::printf("| capacity (experts) |");
      for (uint32_t hs : policy_sweep) std::printf(" LFRU h=%u | + adm |", hs);
      std::printf("\n|---|");
      for (size_t i = 0; i < policy_sweep.size(); ++i) std::printf("---|---|");
      std::printf("\n");
      for (int cap : caps) {
        if (cap > total) continue;
        std::printf("| %d |", cap);
        for (uint32_t hs : policy_sweep) {
          LfruPolicyOptions o = policy;
          o.heat_half_life_steps = hs;
          o.demand_admission = false;
          const double plain = 100 * simulate_lfru(t, cap, o).hit_rate();
          o.demand_admission = true;
          std::printf(" %.2f | %.2f |", plain, 100 * simulate_lfru(t, cap, o).hit_rate());
        }
        std::printf("\n");
      }
      std::printf("\n");
    }
    std::printf("| capacity (experts) | LFRU hit %% | static top-C hit %% |");
    for (double h : half_lives) std::printf(" LRFU h=%g hit %% |", h);
    std::printf(" LRFU h=inf hit %% | LFU + admission hit %% | LRFU h=16 + admission hit %% |"
                " Belady hit %% | Belady with bypass hit %% |\n|---|---|---|");
    for (size_t i = 0; i <= half_lives.size(); ++i) std::printf("---|");
    std::printf("---|---|---|---|\n");
    for (int cap : caps) {
      if (cap > total) continue;
      std::printf("| %d | %.2f | %.2f |", cap, 100 * simulate_lfru(t, cap, policy).hit_rate(),
                  100 * simulate_static_top(t, cap).hit_rate());
      for (double h : half_lives) std::printf(" %.2f |", 100 * simulate_lrfu(t, cap, h).hit_rate());
      std::printf(" %.2f | %.2f | %.2f | %.2f | %.2f |\n", 100 * simulate_lrfu(t, cap, 0).hit_rate(),
                  100 * simulate_lrfu(t, cap, 0, true).hit_rate(),
                  100 * simulate_lrfu(t, cap, 16, true).hit_rate(),
                  100 * simulate_belady(t, cap).hit_rate(),
                  100 * simulate_belady(t, cap, true).hit_rate());
    }
    // The host expert cache (O_DIRECT store) keeps its own policy: its aging period, swept.
    std::printf("\nhost cache LfuPolicy (loader/store/lfu_policy.h) by aging period, uses per slot "
                "(default %llu); LRU beside it\n\n| capacity (experts) | LRU hit %% |",
                static_cast<unsigned long long>(LfuPolicy::kDefaultAgingSlots));
    for (uint64_t a : host_aging) std::printf(" aging %llux hit %% |", static_cast<unsigned long long>(a));
    std::printf("\n|---|---|");
    for (size_t i = 0; i < host_aging.size(); ++i) std::printf("---|");
    std::printf("\n");
    for (int cap : caps) {
      if (cap > total) continue;
      std::printf("| %d | %.2f |", cap, 100 * simulate_lru(t, cap).hit_rate());
      for (uint64_t a : host_aging)
        std::printf(" %.2f |", 100 * simulate_lfu(t, cap, a * uint64_t(cap)).hit_rate());
      std::printf("\n");
    }
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "cache_sim: %s\n", e.what());
    return 1;
  }
}
