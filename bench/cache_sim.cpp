// cache_sim: hit rates of the expert caches' policies, the GPU cache's (LFRU, decaying demand heat)
// and the host cache's (LFU with aging), vs LRU and Belady's optimal at several capacities,
// replaying the decode steps of a routing log through cluster/cache_sim.
#include <CLI/CLI.hpp>

#include <cmath>
#include <filesystem>
#include <optional>
#include <cstdio>
#include <string>
#include <vector>

#include "cluster/cache_hints.h"
#include "cluster/cache_sim.h"
#include "common/error.h"
#include "loader/format/expert_prior.h"
#include "loader/format/routing_log.h"
#include "loader/format/safetensors.h"
#include "loader/store/foresight_policy.h"
#include "loader/store/lfu_policy.h"

using namespace moestream;

namespace {

struct ForesightArgs {
  std::string model;  // packed model dir: its routers make the look-ahead's guesses
  int depth = 1, width = 8, self_width = 16;  // tuned on traces other than the reported ones
  std::vector<double> oracle_noise;
  ForesightPolicyOptions options;
  std::vector<double> sweep_exponent, sweep_half_life;
  std::vector<double> prior;  // by key: share of its layer's demand in other traces
};

// The routers of a packed model (dense.safetensors, layers.L.router: n_experts x hidden).
std::vector<std::vector<float>> load_routers(const std::string& dir, const RoutingLogHeader& h) {
  SafetensorsFile f(std::filesystem::path(dir) / "dense.safetensors");
  std::vector<std::vector<float>> routers;
  for (uint32_t l = 0; l < h.n_layers; ++l)
    routers.push_back(f.to_float_checked("layers." + std::to_string(l) + ".router",
                                         {int64_t(h.n_experts), int64_t(h.hidden)}));
  return routers;
}

// The prior file's shares as the policy takes them; its shape must be the trace's.
std::vector<double> prior_shares(const std::string& path, const RoutingLogHeader& h) {
  const ExpertPrior p = read_expert_prior(path);
  if (p.n_layers != h.n_layers || p.n_experts != h.n_experts)
    throw ConfigError("--prior " + path + ": " + std::to_string(p.n_layers) + " x " +
                      std::to_string(p.n_experts) + " experts, the trace has " +
                      std::to_string(h.n_layers) + " x " + std::to_string(h.n_experts));
  return std::vector<double>(p.share.begin(), p.share.end());
}

double foresight_hit(const CacheTrace& t, int cap, const ForesightPolicyOptions& o,
                     const CacheHints* hints, const std::vector<double>& prior = {}) {
  ForesightPolicy p(uint32_t(cap), t.n_layers, t.n_experts, o);
  if (!prior.empty()) p.set_prior(prior);
  return 100 * (hints ? simulate_policy_with_hints(t, p, *hints) : simulate_policy(t, p)).hit_rate();
}

// Issue 23: the policy that uses the future the engine knows, beside every other policy.
void foresight_table(const RoutingLog& log, const CacheTrace& t, bool all_phases,
                     const std::vector<int>& caps, const ForesightArgs& a) {
  const int total = t.n_layers * t.n_experts;
  std::optional<CacheHints> look;
  if (!a.model.empty())
    look = make_lookahead_hints(log, !all_phases, load_routers(a.model, log.header), a.depth, a.width,
                                a.self_width);
  std::vector<CacheHints> oracles;
  for (double n : a.oracle_noise) oracles.push_back(make_oracle_hints(t, a.depth, n, 23));
  std::printf("\nforesight policy (loader/store/foresight_policy.h, half-life %g, exponent %g, "
              "admission %s%s)%s\n\n| capacity (experts) | %% of expert bytes | LRU | LFRU | LFRU + adm "
              "| host LFU | static top-C | Foresight, history only |",
              a.options.heat_half_life_steps, a.options.distance_exponent,
              a.options.admission ? "on" : "off", a.prior.empty() ? "" : ", with the prior",
              look ? (", look-ahead depth " + std::to_string(a.depth) + " width " + std::to_string(a.width)).c_str() : "");
  if (look) std::printf(" Foresight + look-ahead |");
  for (double n : a.oracle_noise) std::printf(" UPPER BOUND: true next ids, noise %g |", n);
  std::printf(" Belady | Belady + bypass | Foresight gap (points) |\n|---|---|---|---|---|---|---|---|");
  for (size_t i = 0; i < size_t(look ? 1 : 0) + oracles.size(); ++i) std::printf("---|");
  std::printf("---|---|---|\n");
  double worst = 0;
  for (int cap : caps) {
    if (cap > total) continue;
    LfruPolicyOptions adm;
    adm.demand_admission = true;
    std::printf("| %d | %.1f | %.2f | %.2f | %.2f | %.2f | %.2f |", cap, 100.0 * cap / total,
                100 * simulate_lru(t, cap).hit_rate(), 100 * simulate_lfru(t, cap).hit_rate(),
                100 * simulate_lfru(t, cap, adm).hit_rate(), 100 * simulate_lfu(t, cap).hit_rate(),
                100 * simulate_static_top(t, cap).hit_rate());
    double best = foresight_hit(t, cap, a.options, nullptr, a.prior);
    std::printf(" %.2f |", best);
    if (look) {
      best = foresight_hit(t, cap, a.options, &*look, a.prior);
      std::printf(" %.2f |", best);
    }
    for (const CacheHints& o : oracles) std::printf(" %.2f |", foresight_hit(t, cap, a.options, &o, a.prior));
    const double opt = 100 * simulate_belady(t, cap).hit_rate();
    worst = std::max(worst, opt - best);
    std::printf(" %.2f | %.2f | %.2f |\n", opt, 100 * simulate_belady(t, cap, true).hit_rate(), opt - best);
  }
  std::printf("largest Foresight%s gap to Belady: %.2f points (goal: within 5)\n",
              look ? " + look-ahead" : "", worst);
  // Tuning sweeps (run on traces other than the reported ones).
  for (double e : a.sweep_exponent)
    for (double hl : a.sweep_half_life.empty() ? std::vector<double>{a.options.heat_half_life_steps}
                                               : a.sweep_half_life) {
      ForesightPolicyOptions o = a.options;
      o.distance_exponent = e, o.heat_half_life_steps = hl;
      std::printf("sweep exponent %g half-life %g:", e, hl);
      for (int cap : caps)
        if (cap <= total) std::printf(" %d:%.2f", cap, foresight_hit(t, cap, o, look ? &*look : nullptr, a.prior));
      std::printf("\n");
    }
}

}  // namespace

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
  ForesightArgs fa;
  app.add_option("--model", fa.model,
                 "packed model of the log (its routers make the look-ahead's guesses; the log "
                 "needs --collect-router-inputs)");
  app.add_option("--lookahead-depth", fa.depth, "layers ahead the look-ahead guesses")->capture_default_str();
  app.add_option("--lookahead-width", fa.width, "experts per guessed layer")->capture_default_str();
  app.add_option("--router-rank-width", fa.self_width,
                 "guess each layer's next step from its own router's scores, this many best (0: no)")
      ->capture_default_str();
  app.add_option("--oracle-noise", fa.oracle_noise,
                 "UPPER BOUND columns: the foresight policy told the true next layers' ids, each "
                 "replaced at random with this probability (not an online policy)");
  app.add_option("--foresight-half-life", fa.options.heat_half_life_steps)->capture_default_str();
  app.add_option("--foresight-exponent", fa.options.distance_exponent)->capture_default_str();
  app.add_flag("!--foresight-no-admission", fa.options.admission, "foresight without admission");
  app.add_option("--sweep-foresight-exponent", fa.sweep_exponent, "tuning: foresight hit rates at these exponents");
  app.add_option("--sweep-foresight-half-life", fa.sweep_half_life, "tuning: and these half-lives");
  std::string prior_path;
  app.add_option("--prior", prior_path,
                 "expert prior learned from routing logs of OTHER text (cluster_experts "
                 "--prior-out): seeds the foresight policy");
  bool foresight_only = false;
  app.add_flag("--foresight-only", foresight_only, "print only the foresight table");
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
    if (!prior_path.empty()) fa.prior = prior_shares(prior_path, log.header);
    if (foresight_only) {
      foresight_table(log, t, all_phases, caps, fa);
      return 0;
    }
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
    foresight_table(log, t, all_phases, caps, fa);
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "cache_sim: %s\n", e.what());
    return 1;
  }
}
